"""The PyTorch adapter: an ``IterableDataset`` with exact state, and a loader that tracks it.

:class:`TorchDataset` (from :meth:`Dataset.to_torch <arrowstream.Dataset.to_torch>`)
turns each packed batch into a dict of ``torch`` tensors that share memory with
the numpy arrays (``torch.from_numpy``: no copy). Every DataLoader worker of
every rank is one consumer (rank-major numbering); rank and world size come
from ``torch.distributed`` when it is initialised. It implements
``state_dict``/``load_state_dict``, so torchdata's ``StatefulDataLoader`` can
checkpoint it per worker.

Without torchdata, :class:`StatefulLoader` wraps a plain ``DataLoader``: each
batch carries its worker's state, recorded when the trainer receives the
batch, so ``state_dict()`` describes exactly the batches consumed; after a
resume it restores the workers' round-robin order (a ``DataLoader`` always
starts with worker 0), so the trainer sees the batches of no interruption.

Forked workers: the main process never tokenizes, so each worker's tokenizer
keeps its own thread pool and no fork warning is printed. In a worker, a
batch's arrays are copied into one buffer (the tensors are views of it).
By default that buffer crosses in a slot of the worker's ring of shared
memory, which the main process's tensors view until they are dropped
(:mod:`arrowstream.slots`); when no slot is free, through the DataLoader's
result pipe (widened to 1 MiB), or, larger, as one shared-memory segment
opened by name: no round trip to the busy worker either way (see ``sharing``).

Requires ``pip install arrowstream[torch]``.
"""

from __future__ import annotations

import copy
import multiprocessing
import sys
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "the PyTorch adapter needs torch: pip install 'arrowstream[torch]'"
    ) from exc

from arrowstream.checks import check_int
from arrowstream.collation import COLLATING, Batch, no_collate
from arrowstream.core.workergc import freeze_inherited
from arrowstream.distributed.topology import WHOLE_RUN_COUNTERS
from arrowstream.errors import ConfigError, StateError
from arrowstream.handover import AUTO, ByValue, by_value_limit, check_sharing, handed, one_storage, state_tag, use_sharing
from arrowstream.io.forksafe import for_a_process_here
from arrowstream.io.prefetch import AHEAD_MOST, Prefetcher, close_all, depth_for
from arrowstream.single_process import single_process_batches
from arrowstream.state import STATE_FORMAT, STATE_VERSION
from arrowstream.state.checksum import verify_checksum, with_checksum
from arrowstream.state.ranks import next_worker, pick_consumer, whole_rank
from arrowstream.state.sealed import SealStream, opened
from arrowstream.state.snapshot import Snapshot, take_snapshot

if TYPE_CHECKING:
    from arrowstream.pipeline.dataset import Dataset
    from arrowstream.pipeline.iterator import DatasetIterator

__all__ = ["DEFAULT_PREFETCH", "STATE_KEY", "Batch", "StatefulLoader", "TorchDataset", "no_collate", "one_storage"]

#: Key under which a batch carries a snapshot of its worker's state (``attach_state=True``; see :func:`~arrowstream.handover.state_tag`).
STATE_KEY = "arrowstream_state"


class _HandedBatch(ByValue, Batch):
    """A :class:`Batch` a worker sends by value: in a slot or through the pipe (:class:`~arrowstream.handover.ByValue`)."""

    received_as = Batch


#: Batches ``to_torch()`` makes ahead at most unless told (``prefetch=None``; fewer past 64 MiB).
DEFAULT_PREFETCH = AHEAD_MOST


class TorchDataset(IterableDataset):  # type: ignore[type-arg]
    """A ``torch.utils.data.IterableDataset`` over a packed or bucketed arrowstream pipeline.

    A bucketed pipeline gives tensors whose shape varies from batch to batch.

    Parameters
    ----------
    dataset
        A packed :class:`~arrowstream.Dataset`.
    rank, world_size
        This process's rank; ``None`` takes them from ``torch.distributed``
        when it is initialised, else 0 and 1.
    attach_state
        Add to each batch, under :data:`STATE_KEY`, a snapshot of the state
        after it (used by :class:`StatefulLoader`, which builds the state
        of the last batch handed over only when asked).
    columns
        The keys to keep in each batch (``None``: all of
        :data:`~arrowstream.pack.assemble.BATCH_KEYS`, or of
        :data:`~arrowstream.pack.assemble.PADDED_KEYS` after ``.bucket``). Arrays
        become tensors; ``max_seqlen`` and the counts stay Python ints.
    prefetch
        Batches made ahead in a background thread of the process that
        iterates (the main process, or each DataLoader worker), so the next
        batch is being made while the training step runs; ``0`` makes each
        batch when it is asked for. The batches, their order and the states
        are the same either way: a state describes the batches handed out,
        not the ones made ahead: the producer keeps a snapshot after each
        batch (:mod:`arrowstream.state.snapshot`), built into a state only
        when one is asked for. ``None`` (the default): 2 until the first
        batch is made, then as many as 64 MiB holds, at most 16
        (:data:`DEFAULT_PREFETCH`; :func:`~arrowstream.io.prefetch.depth_for`).
    sharing
        How a DataLoader worker iterating this dataset hands its batches to
        the main process. ``"auto"`` (the default): each worker keeps a ring
        of up to 8 slots of shared memory (64 MiB at most, reserved when its
        first batch is sent) and copies each batch into a free one; the main
        process's tensors view the slot, which is free again once they are
        all dropped, so a batch the trainer keeps is never overwritten. When
        every slot is held, a batch that fits in the DataLoader's result pipe
        (its capacity raised to ``/proc/sys/fs/pipe-max-size``, 1 MiB by
        default) is pickled into it as bytes, and a larger one goes as one
        shared-memory segment opened by name (torch's ``file_system``
        strategy, set in the worker only; torch then starts a
        ``torch_shm_manager`` process in the worker, about 56 MB). ``"pipe"``:
        every batch through the pipe. ``"file_system"``: every batch by name.
        torch's default on Linux, ``"file_descriptor"``, makes the main
        process fetch a file descriptor from the worker for every batch,
        waiting on the worker's busy threads. ``None`` leaves the worker's
        strategy as it is. See ``docs/training.md``.

    Examples
    --------
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> ds = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0).pack(seq_len=8, batch_size=2)
    >>> batch = next(iter(ds.to_torch()))
    >>> batch["input_ids"].dtype, tuple(batch["input_ids"].shape)
    (torch.int32, (2, 8))
    >>> sorted(next(iter(ds.to_torch(columns=["input_ids", "labels"]))))
    ['input_ids', 'labels']
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        attach_state: bool = False,
        columns: Sequence[str] | None = None,
        prefetch: int | None = None,
        sharing: str | None = AUTO,
    ) -> None:
        if dataset.packer is None:
            raise ConfigError(
                "`to_torch` needs batches of token ids: call `.pack(...)` (fixed-shape rows) or `.bucket(...)` "
                "(whole documents, padded per batch) first"
            )
        if isinstance(columns, str):
            columns = [columns]
        if columns is not None:
            keys = dataset.packer.batch_keys
            unknown = [c for c in columns if c not in keys]
            if unknown or not columns:
                raise ConfigError(
                    f"`columns` must name some of the batch keys {list(keys)!r}, "
                    f"got {list(columns)!r}"
                )
        self.columns = None if columns is None else tuple(columns)
        self.prefetch = None if prefetch is None else check_int("prefetch", prefetch, low=0)
        self.sharing = check_sharing(sharing)
        self._by_value_at_most = 0  # in a worker: the largest batch sent through the pipe, in bytes
        self._handed: Snapshot | None = None  # with prefetch: the state after the last batch handed out
        self.dataset = dataset
        self.rank = rank
        self.world_size = world_size
        self.attach_state = attach_state
        self._pending: dict[str, Any] | None = None
        self._it: DatasetIterator | None = None
        # set by a DataLoader worker that iterates this dataset; shared with the main process
        self._worker_ran: Any = multiprocessing.RawValue("b", 0)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if not for_a_process_here():  # pickled, not sent to a worker: the flag stays here
            state["_worker_ran"] = None
        return state

    def topology(self) -> tuple[int, int, int, int]:
        """Return ``(rank, world_size, worker, num_workers)`` of the calling process."""
        rank, world = self.rank, self.world_size
        if rank is None or world is None:
            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank() if rank is None else rank
                world = dist.get_world_size() if world is None else world
            else:
                rank = 0 if rank is None else rank
                world = 1 if world is None else world
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank, world, worker, num_workers

    def iterator(self) -> DatasetIterator:
        """Return a new arrowstream iterator for the calling consumer, from the loaded state."""
        rank, world, worker, num_workers = self.topology()
        state = whole_rank(self._pending, pick_consumer(self._pending, rank * num_workers + worker, world * num_workers))
        return self.dataset.iter(
            state, rank=rank, world_size=world, worker=worker, num_workers=num_workers
        )

    def _tensors(self, batch: dict[str, Any]) -> dict[str, Any]:
        keys = batch if self.columns is None else self.columns
        out = Batch((key, batch[key]) for key in keys)
        arrays = {key: value for key, value in out.items() if isinstance(value, np.ndarray)}
        if get_worker_info() is not None and arrays:  # one buffer, sent as `sharing` says
            out.update(one_storage(arrays))
            return handed(out, sharing=self.sharing, pipe_at_most=self._by_value_at_most, cls=_HandedBatch)
        out.update((key, torch.from_numpy(value)) for key, value in arrays.items())
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # a DataLoader with a batch size would stack our batches, whatever its collate_fn (HF Trainer's too)
        fetcher = sys._getframe(1).f_locals.get("self")
        if getattr(fetcher, "auto_collation", False) is True and hasattr(fetcher, "dataset_iter"):
            raise ConfigError(COLLATING)
        if get_worker_info() is not None:
            if self._worker_ran is not None:
                self._worker_ran.value = 1
            freeze_inherited()  # full collections walk only what the worker makes (core/workergc.py)
            use_sharing(self.sharing)
            self._by_value_at_most = by_value_limit(self.sharing, sys._getframe())
        self._it = it = self.iterator()
        self._pending = self._pending if get_worker_info() else None  # here: a loaded state starts this pass only
        self._handed = None
        if self.prefetch == 0:
            yield from self._batches(it)
            return
        self._handed = take_snapshot(it)  # before the producer thread owns the iterator
        ahead = Prefetcher(lambda: self._batches(it, with_state=True), depth=self.prefetch or 2)
        ident, closing = threading.get_ident, close_all  # still bound while the interpreter exits
        consumer, sized = ident(), self.prefetch is not None
        recent: deque[Snapshot] = deque()
        try:
            for out, state in ahead:
                if not sized:  # the first batch says how many fit in the budget
                    ahead.resize(depth_for(sum(v.nbytes for v in out.values() if hasattr(v, "nbytes"))))
                    sized = True
                self._handed = state
                recent.append(state)
                if len(recent) > 2:  # StatefulLoader keeps the last one: two back, this is the last reference
                    ahead.discard(recent.popleft())  # freed by the producer thread, not in the training step
                yield out
        finally:  # then its files and threads (the state to go on from is `_handed`), never blocking another thread
            closing(ahead.close, it.close, wait=ident() == consumer)

    def _batches(self, it: Any, *, with_state: bool = False) -> Iterator[Any]:
        """Yield tensor batches (``with_state``: with the state after each), the state attached if asked."""
        if not self.attach_state:
            for batch in it:
                out = self._tensors(batch)
                yield (out, take_snapshot(it)) if with_state else out
            return
        # one batch of look-ahead, so the last batch can say it is the last
        held: dict[str, Any] | None = None
        stream = SealStream()  # the snapshots cross to the loader in order: most as differences
        for batch in it:
            out: dict[str, Any] = self._tensors(batch)
            out[STATE_KEY] = state_tag(it, last=False, stream=stream)
            if held is not None:
                yield (held, held[STATE_KEY]["snapshot"]) if with_state else held
            held = out
        held = {} if held is None else held  # no batch (a target of 0): the end state alone, for the loader
        held[STATE_KEY] = state_tag(it, last=True, stream=stream)
        yield (held, held[STATE_KEY]["snapshot"]) if with_state else held

    def state_dict(self) -> dict[str, Any]:
        """Return the state of this process's consumer after the last batch it produced.

        Raises
        ------
        ConfigError
            Called in the main process of a DataLoader whose workers iterate
            this dataset: their positions are theirs (a state from here would
            start the stream again).
        """
        if get_worker_info() is None and self._worker_ran is not None and self._worker_ran.value:
            raise ConfigError(
                "`state_dict()` of a dataset that DataLoader workers iterate, called in the main "
                "process: the workers' positions are not here, and a state taken here would start "
                "the stream again. Save the loader's state instead: "
                "`loader = arrowstream.pytorch.StatefulLoader(ds.to_torch(), num_workers=N)` and "
                "`loader.state_dict()`, or torchdata's `StatefulDataLoader(..., batch_size=None)` "
                "and its `state_dict()`"
            )
        if self._handed is not None:  # batches are made ahead: the state of those handed out
            return self._handed.to_dict()
        if self._it is not None:
            return self._it.state_dict()
        return self.iterator().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start the next iteration from ``state``: a consumer's own, a loader's, or a global one."""
        self._pending = copy.deepcopy(state)
        self._it = None
        self._handed = None


class StatefulLoader:
    """A ``DataLoader`` over a :class:`TorchDataset` whose state is exact with workers.

    Each batch carries its worker's state; the loader records it when it hands
    the batch over, so :meth:`state_dict` covers exactly the batches the
    trainer received, whatever the workers prefetched. Extra keyword arguments
    go to ``torch.utils.data.DataLoader`` (``batch_size`` is always ``None``;
    ``collate_fn`` is :func:`~arrowstream.collation.no_collate` unless given:
    batches are handed over as they are). Without workers it takes each batch
    as the ``DataLoader`` would, but opens its profiler range only while a
    profiler records (:mod:`arrowstream.single_process`): the training loop
    then waits less for the thread that makes batches ahead.

    Examples
    --------
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> ds = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0).pack(seq_len=4, batch_size=2)
    >>> loader = StatefulLoader(ds.to_torch())
    >>> first = next(iter(loader))
    >>> state = loader.state_dict()
    >>> resumed = StatefulLoader(ds.to_torch())
    >>> resumed.load_state_dict(state)
    >>> len(list(resumed))  # the 5 batches (of 6) the first loader had not handed out yet
    5
    """

    def __init__(self, dataset: TorchDataset, **dataloader_kwargs: Any) -> None:
        if "batch_size" in dataloader_kwargs and dataloader_kwargs["batch_size"] is not None:
            raise ConfigError("batches are already formed by `.pack`: leave `batch_size` unset")
        dataloader_kwargs["batch_size"] = None
        dataloader_kwargs.setdefault("collate_fn", no_collate)  # the batches are tensors already
        self.dataset = dataset
        self.kwargs = dataloader_kwargs
        self._latest: dict[int, Snapshot] = {}  # the snapshot of each worker's last batch handed over
        self._plans: dict[int, Any] = {}  # each worker's plan, made here for its snapshots' states
        self._loaded: dict[str, Any] | None = None  # the state the next pass starts from
        self._start: dict[str, Any] | None = None  # the state this pass started from
        self._next = self._first = 0  # the worker whose batch comes next (first, in the next pass)

    def _consumers(self) -> tuple[list[int], int]:
        rank, world, _, _ = self.dataset.topology()
        n = max(1, int(self.kwargs.get("num_workers", 0)))
        return [rank * n + w for w in range(n)], world * n

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.dataset.attach_state = True
        # a loaded state starts the next pass only: a later one starts afresh, as a DataLoader's does
        self._start, self._loaded, self._next, self._first = self._loaded, None, self._first, 0
        self.dataset.load_state_dict(self._start)
        self._latest = {}
        consumers, _ = self._consumers()
        n = len(consumers)
        waiting: list[deque[tuple[dict[str, Any], dict[str, Any]]]] = [deque() for _ in range(n)]
        done = [False] * n
        loader = DataLoader(self.dataset, **self.kwargs)
        batches = iter(loader) if loader.num_workers else single_process_batches(loader)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except (ConnectionError, EOFError) as exc:  # a worker died handing a batch over
                dead = [w.pid for w in getattr(batches, "_workers", []) if not w.is_alive()]
                if not dead:
                    raise
                raise RuntimeError(
                    f"DataLoader worker (pid(s) {dead}) exited unexpectedly while handing over a batch "
                    f"({type(exc).__name__}: {exc}); resume from the last saved state"
                ) from exc
            tag = batch.pop(STATE_KEY)
            worker = tag["consumer"] - consumers[0]
            waiting[worker].append((batch, tag))
            yield from self._release(waiting, done, flush=False)
        yield from self._release(waiting, done, flush=True)

    def _release(
        self,
        waiting: list[deque[tuple[dict[str, Any], dict[str, Any]]]],
        done: list[bool],
        *,
        flush: bool,
    ) -> Iterator[dict[str, Any]]:
        """Yield held batches in the workers' round-robin order, from ``self._next``."""
        n = len(waiting)
        while True:
            if all(done):
                return
            while done[self._next]:
                self._next = (self._next + 1) % n
            queue = waiting[self._next]
            if not queue:
                if not flush:
                    return
                done[self._next] = True  # the loader ended: that worker has nothing more
                continue
            batch, tag = queue.popleft()
            self._latest[tag["consumer"]] = tag["snapshot"]
            if tag["last"]:
                done[self._next] = True
            if not batch:  # a worker that made no batch: its state alone, not a turn
                continue
            self._next = (self._next + 1) % n
            yield batch

    @property
    def stats(self) -> dict[str, int]:
        """This rank's counters as of the batches received, summed over its DataLoader workers.

        The same counters as :attr:`DatasetIterator.stats <arrowstream.pipeline.iterator.DatasetIterator.stats>`
        (``padding_batches``, ``dropped_tokens``, ...); a worker's drop at
        an estimated target counts from its last batch on. ``pruned_rows``,
        which every worker reports for the whole run, counts once.
        """
        total: dict[str, int] = {}
        for own in self.state_dict()["states"]:
            for key, value in own["stats"].items():
                merge = max if key in WHOLE_RUN_COUNTERS else int.__add__
                total[key] = merge(total.get(key, 0), int(value))
        return total

    def state_dict(self) -> dict[str, Any]:
        """Return this rank's state: one state per DataLoader worker, as of the batches received."""
        consumers, count = self._consumers()
        rank, world, _, _ = self.dataset.topology()
        states = []
        for index in consumers:
            snap = opened(self._latest.get(index))  # a worker's snapshot crosses as bytes until now
            if snap is not None and getattr(snap, "plan", True) is not None:
                states.append(snap.to_dict())
                continue
            if snap is not None and index in self._plans:  # it crossed from a worker without its plan
                states.append(snap.with_plan(self._plans[index]).to_dict())
                continue
            # no batch from that worker yet, or its plan not made here yet (made once per load)
            worker = index - consumers[0]
            begun = self._loaded if self._loaded is not None else self._start
            start = whole_rank(begun, pick_consumer(begun, index, count))
            it = self.dataset.dataset.iter(
                start, rank=rank, world_size=world, worker=worker, num_workers=len(consumers)
            )
            if snap is not None:
                self._plans[index] = it.plan
            states.append(it.state_dict() if snap is None else snap.with_plan(it.plan).to_dict())
        return with_checksum({
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "kind": "rank",
            "states": states,
            "next_worker": self._first if self._loaded is not None else self._next,
        })

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a rank state (same topology) or a global state (any topology).

        Raises
        ------
        StateError
            A rank state saved with another number of DataLoader workers, or
            by another rank (checked here, not later in a worker), or changed
            after it was saved (its checksum).
        """
        verify_checksum(state)
        if isinstance(state, dict) and state.get("kind") == "rank":
            consumers, count = self._consumers()
            saved = [own.get("consumer") for own in state.get("states", []) if isinstance(own, dict)]
            if saved != [{"index": i, "count": count} for i in consumers]:
                workers = len(saved)
                raise StateError(
                    f"this rank state holds consumers {saved} ({workers} DataLoader worker(s) a rank), "
                    f"and this loader's are {consumers} of {count} ({len(consumers)} worker(s)): load "
                    "it with the num_workers and rank it was saved with, or merge every rank's "
                    "state with `arrowstream.merge_states` to resume on any topology"
                )
        self._loaded = copy.deepcopy(state)
        self._latest, self._plans = {}, {}
        self._first = next_worker(state, *self._consumers())
