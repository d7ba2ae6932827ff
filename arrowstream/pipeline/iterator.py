"""The stateful side of a pipeline: iteration, ``state_dict`` and ``load_state_dict``.

A :class:`DatasetIterator` rebuilds everything it buffers from its position,
so a fresh start and a resume run the same code (``_reset(state | None)``).
Its state is coordinates only (see :mod:`arrowstream.state`); loading one
reads just the row group the position points at and the ones after it.

Not thread-safe: one iterator belongs to one consumer.
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from arrowstream.core.allocator import keep_freed_memory
from arrowstream.distributed.redeal import own_share
from arrowstream.distributed.topology import Consumer, Deal
from arrowstream.errors import ConfigError, StateError
from arrowstream.io.chunk import Chunk, Ledger
from arrowstream.io.niceness import producer_pool
from arrowstream.io.prefetch import Prefetcher
from arrowstream.io.reader import innermost
from arrowstream.pack import PackRun
from arrowstream.pack.layout import Layout
from arrowstream.pipeline.growth import resume_plan
from arrowstream.pipeline.plan import Plan
from arrowstream.pipeline.reading import iter_chunks
from arrowstream.pipeline.snapshot import IteratorSnapshot, where_of, work_of
from arrowstream.pipeline.targets import counted_targets, epoch_target
from arrowstream.state import Position, State, Work, check_identity, check_state
from arrowstream.state.checksum import verify_checksum
from arrowstream.state.ranks import epoch_of, own_of_rank

__all__ = ["DatasetIterator"]


class DatasetIterator:
    """Run a pipeline's :class:`~arrowstream.pipeline.plan.Plan`, with checkpointable state.

    Made by :meth:`Dataset.iter <arrowstream.Dataset.iter>`.

    Parameters
    ----------
    plan
        The pipeline's read plan (:meth:`Plan.of(dataset) <arrowstream.pipeline.plan.Plan.of>`).
    state
        A state from :meth:`state_dict` to resume from, or ``None``.

    Examples
    --------
    >>> import json
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> ds = read_parquet(example_dir(row_group_size=2))
    >>> it = ds.iter()
    >>> first = next(it)
    >>> saved = json.loads(json.dumps(it.state_dict()))
    >>> rest = [b.column("n").to_pylist() for b in it]
    >>> [b.column("n").to_pylist() for b in ds.iter(saved)] == rest
    True
    """

    def __init__(
        self,
        plan: Plan,
        state: dict[str, Any] | None = None,
        *,
        consumer: Consumer | None = None,
    ) -> None:
        self.plan = self._base = plan
        self.consumer = consumer or Consumer(0, 1)
        # every counter the pipeline can move, so a state has the same keys at every step
        packer_counters = ("batches",) if plan.packer is None else plan.packer.counters
        self._counters = dict.fromkeys(
            ["rows", "docs", *(["unreadable"] if plan.skip_unreadable else []),
             *(c for s in plan.stages for c in s.counters), *packer_counters]
        )
        self._reader = plan.make_reader()
        self._chunks: Prefetcher[Chunk] | _Inline | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._failed: dict[str, Any] | None = None  # after a next() that raised: the state after the last item
        if plan.num_inflight > 1:
            # no finalizer: an executor's idle threads end once it is garbage-collected, and
            # a shutdown run by the garbage collector inside another pool's submit deadlocks
            self._pool = producer_pool(plan.num_inflight, "arrowstream-encode")
        self._reset(state)

    # -- state --------------------------------------------------------------------

    def _reset(self, state: dict[str, Any] | None) -> None:
        keys = ("plan", "_start_epoch", "_deals", "_known_targets", "_parts", "_saved", "_started", "_run")
        saved = {k: getattr(self, k) for k in keys if hasattr(self, k)}
        try:
            self._load(state)
        except BaseException:
            self.__dict__.update(saved)  # a refused state leaves the iterator as it was
            raise

    def _load(self, state: dict[str, Any] | None) -> None:
        if state is not None and not isinstance(state, dict):
            raise StateError(
                f"expected a state dict (from `state_dict()`, or JSON-loaded), got "
                f"{type(state).__name__}: load the file with `json.load` first"
            )
        verify_checksum(state)  # as saved, before anything is read from it
        # the files each epoch is cut over: all, or the old ones where files were added since
        self.plan = self._base if state is None else resume_plan(self._base, state)
        if state is not None and state.get("kind") == "rank":  # a loader's: one state per DataLoader worker
            state = own_of_rank(state, self.consumer.index, self.consumer.count)
        fresh = self.plan.fresh_deal
        # epoch -> this consumer's work (and the layout it refers to) where it is not a fresh share
        self._deals: dict[int, Work] = {}
        # epoch -> every consumer's parts, for epochs re-dealt by this load (their targets)
        self._parts: dict[int, Deal] = {}
        self._known_targets: dict[int, int | None] = {}
        if state is not None:
            identity = self.plan.describe(epoch_of(state))  # a merged state's: its consumers' too
            if state.get("kind") == "global":
                # the data and options first: nothing of another run's state is re-dealt
                check_identity(
                    state,
                    dataset=identity,
                    options=self.plan.options(),
                    options_hash=self.plan.options_hash,
                )
                state, self._parts = own_share(state, self.consumer, fresh, self.plan.recut)
            saved: State | None = check_state(
                state,
                dataset=identity,
                options=self.plan.options(),
                options_hash=self.plan.options_hash,
            )
            assert saved is not None
            self._check_consumer(saved)
            self._start_epoch = saved.position.epoch
            self._deals[self._start_epoch] = saved.work
            ahead = [] if saved.next_work is None else [saved.next_work, *saved.later_work]
            for epoch, nxt in enumerate(ahead, start=self._start_epoch + 1):  # shares a merge dealt
                self._deals[epoch] = nxt
                if nxt.target_known:
                    self._known_targets[epoch] = nxt.target
            for epoch in sorted(self._deals):
                self._check_work(epoch)
            self._check_position(saved)
        else:
            saved = None
            self._start_epoch = 0
        if self._chunks is not None:
            self._chunks.close()
            self._chunks = None
        self._run: PackRun | None = None
        self._saved = saved
        self._started = False
        self._closed = False  # a state loaded after close() starts it again
        if saved is not None:  # what a loaded state implies is checked at the call that loads it
            self._start()
        self._failed = None

    def _start(self) -> None:
        """Set up the packer run and the chunk producer: at the first ``next()`` or ``state_dict()`` of a fresh iterator.

        A fresh share may need the epoch's token-rate sample or its counts
        (even batches), so ``iter()`` itself returns at once. A read that
        fails here leaves the iterator unstarted: the next call starts it again.
        """
        try:
            self._begin()
        except BaseException:
            if self._chunks is not None:
                self._chunks.close()
                self._chunks = None
            self._run = None
            raise
        self._started = True

    def _begin(self) -> None:
        keep_freed_memory()  # batches' arrays reuse pages instead of faulting them in (core/allocator.py)
        saved = self._saved
        if saved is None:
            self._deals[0] = self.plan.fresh_deal(0, self.consumer)
        if self.plan.packer is not None:
            # a plain function, not a bound method: the run must not hold the iterator
            targets = functools.partial(
                epoch_target, self.plan, self.consumer, self._parts, self._known_targets
            )
            for nxt_epoch in sorted(e for e in self._deals if e > self._start_epoch):
                if nxt_epoch not in self._known_targets:
                    # saved with next_work, so an own-state resume needs no other consumer's parts
                    self._known_targets[nxt_epoch] = targets(nxt_epoch)
            origin = None
            if saved is None and self._deals[0].segments:  # a share may begin inside a document
                first = self._deals[0].segments[0]
                origin = Position(0, 0, first[1], first[3])
            self._run = self.plan.packer.start(saved, targets=targets, origin=origin)
            start = self._run.upstream_position()
        elif saved is None:
            start = Position(0, 0, 0, 0)
        else:
            start = saved.position
            if start.token_offset:
                raise StateError(
                    f"state position has token_offset {start.token_offset}, but an unpacked "
                    "pipeline only stops between documents: the state was edited or comes from "
                    "a packed pipeline"
                )
        first_work = self._deals[self._start_epoch].segments
        if saved is None and first_work:
            start = Position(0, 0, first_work[0][1], first_work[0][3])
        self._pos = start
        self._ledger = Ledger(None if saved is None else saved.stats)
        produce = functools.partial(
            iter_chunks,
            self.plan,
            self._reader,
            start,
            dict(self._deals),
            self.consumer,
            self._pool,
        )
        if self.plan.prefetch_depth > 0:
            self._chunks = Prefetcher(produce, depth=self.plan.prefetch_depth)
        else:
            self._chunks = _Inline(produce())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: this consumer's own, or a global one (any topology).

        Raises
        ------
        StateMismatchError
            The state comes from other data or other pipeline options.
        StateError
            The state is malformed, of another format version, or another
            consumer's own state (use :func:`~arrowstream.merge_states`).
        """
        self._reset(state)

    def state_dict(self) -> dict[str, Any]:
        """Return the position after the last item yielded, as a small JSON-able dict.

        After a ``next()`` that raised (a read that failed, an interrupt),
        still the position after the last item yielded, without reading.
        """
        if self._failed is not None:
            return copy.deepcopy(self._failed)
        return self.snapshot().to_dict()

    def snapshot(self) -> IteratorSnapshot:
        """Capture the position after the last item yielded; ``.to_dict()`` builds its state when asked.

        Cheap where building the state is not (a look-ahead window's
        references): what a producer of batches ahead takes after each batch.
        See :mod:`arrowstream.state.snapshot`.
        """
        if self._failed is not None:
            self._go_on()
        if not self._started:
            self._start()
        run = self._run
        return IteratorSnapshot(
            self.plan,
            self.consumer,
            self._counters,
            None if run is None else run.snapshot(),
            self._pos if run is None else None,
            self._ledger.snapshot() if run is None else None,
            dict(self._deals),
            dict(self._known_targets),
            None if self._saved is None else self._saved.earlier,
        )

    @property
    def stats(self) -> dict[str, int]:
        """Counters up to the current position: rows, docs, skips by reason, tokens, padding."""
        return self.state_dict()["stats"]

    @property
    def read_retries(self) -> int:
        """Row-group reads this iterator tried again after a transient storage error (not in any state).

        The storage client's own retries (pyarrow's S3 client) are not seen
        here. See ``docs/storage.md``.
        """
        return int(getattr(innermost(self._reader, "retries"), "retries", 0))

    @property
    def epoch_stats(self) -> dict[int, dict[str, int]]:
        """The packer's counters per epoch begun: tokens, padding, batches, carried and dropped.

        Each is counted for the epoch whose batches it went into (or was
        dropped from): data carried past an estimated target counts in the
        next epoch (``carried_tokens`` there). Empty without a packer.
        """
        return {e.pop("epoch"): e for e in self.state_dict()["epoch_stats"]}

    def _work(self, epoch: int) -> Work:
        """Return the layout's stream count and this consumer's segments for ``epoch``."""
        return work_of(self.plan, self.consumer, self._deals, epoch)

    def _where(self, pos: Position) -> dict[str, Any]:
        return where_of(self.plan, self._work(pos.epoch), pos)

    def _check_consumer(self, state: State) -> None:
        saved, mine = state.consumer, (self.consumer.index, self.consumer.count)
        if saved != mine:
            raise StateError(
                f"the state belongs to consumer {saved[0]} of {saved[1]}, "
                f"this iterator is consumer {mine[0]} of {mine[1]} "
                "(rank x DataLoader worker): load the state saved by this consumer, or merge all "
                "consumers' states with `arrowstream.merge_states` to resume on any topology"
            )
        # counted even batches even out each rank's total over its workers: other ranks, other counts
        if state.num_workers not in (None, self.consumer.per_rank) and counted_targets(self.plan):
            raise StateError(
                f"the state was saved with {state.num_workers} DataLoader workers a rank, this iterator has "
                f"{self.consumer.per_rank}: the same {saved[1]} consumers make other ranks, whose "
                "even-batch counts differ; merge every consumer's state with `arrowstream.merge_states` "
                "and load the merged state"
            )

    def _check_work(self, epoch: int) -> None:
        share = self._work(epoch)
        num_streams, work = share.num_streams, share.segments
        layout = self.plan.layout(epoch, num_streams, share.by)
        bad = [
            seg for seg in work
            if len(seg) != 5 or not 0 <= seg[0] < num_streams
            or not 0 <= seg[1] <= seg[2] <= layout.stream_rows(seg[0]) or min(seg[3:]) < 0
            or (seg[4] and seg[3] >= seg[4] and seg[2] - seg[1] == 1)
        ]
        if bad:
            raise StateError(
                f"state work {list(work)!r} of epoch {epoch} does not fit that epoch's {num_streams} "
                "stream(s): the state was edited or comes from other data"
            )

    def _check_position(self, state: State) -> None:
        position = state.position
        num_epochs = self.plan.num_epochs
        if num_epochs is not None and position.epoch >= num_epochs:
            raise StateError(
                f"the state is in epoch {position.epoch} but this pipeline runs {num_epochs} "
                f"epoch(s): nothing would be left to read; raise `num_epochs` to continue"
            )
        work = self._work(position.epoch).segments
        if position.segment > len(work):
            raise StateError(
                f"state position segment {position.segment} is past its {len(work)} work "
                "segment(s): the state was edited or comes from other data"
            )
        if position.segment < len(work):
            _, lo, hi, _, _ = work[position.segment]
            if not lo <= position.seq <= hi:
                raise StateError(
                    f"state position seq {position.seq} is outside its segment's rows {lo}..{hi}: "
                    "the state was edited or comes from other data"
                )
        where = self._where(position)
        saved = state.where
        if saved and saved != {k: where[k] for k in saved}:
            raise StateError(
                f"state position seq {position.seq} names {saved!r} but that sequence number is "
                f"{where!r} in this dataset: the state was edited or comes from other data"
            )

    # -- iteration ----------------------------------------------------------------

    def __iter__(self) -> DatasetIterator:
        return self

    def __next__(self) -> Any:
        if self._closed:  # as a closed generator: the stream has ended
            raise StopIteration
        if self._failed is not None:
            self._go_on()
        if not self._started:
            self._start()
        try:
            return self._advance()
        except StopIteration:
            raise
        except BaseException:
            # the producer and the packer may hold part of what the failed call read: keep the position
            # after the last item, and go on from it at the next call (the failed read is tried again)
            # (what the failed call read is counted only once whole, so this is the state after the last item)
            self._failed = self.snapshot().to_dict()
            raise

    def _go_on(self) -> None:
        """Continue from the state kept when the last ``next()`` failed: the failed read is tried again."""
        state = self._failed
        assert state is not None
        self._failed = None
        try:
            self._reset(state)
        except BaseException:
            self._failed = state
            raise

    def _advance(self) -> Any:
        assert self._chunks is not None
        if self._run is not None:
            return self._run.next_batch(self._chunks)
        while True:
            # One record batch per source chunk (a cell of the batch_rows grid), however
            # the stages sliced it, so outputs after a resume fall on the same grid.
            pieces = [next(self._chunks)]  # StopIteration ends the stream
            while not pieces[-1].source_end:
                pieces.append(next(self._chunks))
            chunk = Chunk.concat(pieces)
            self._ledger.commit(chunk)
            self._pos = Position(chunk.epoch, chunk.segment, chunk.seq_end, 0)
            if chunk.num_docs:
                self._ledger.add("batches", 1)
                return _to_record_batch(chunk)

    def next_layout(self, rows: int) -> Layout:
        """Return the next packed batch's layout, of ``rows`` rows instead of ``batch_size`` (``concat``, ``best_fit``).

        For a mixture, which takes from each source as many rows as the
        schedule gives it in a batch and gathers the batch once.
        """
        next_layout = getattr(self._started_run(), "next_layout", None)
        if next_layout is None:
            raise ConfigError("`next_layout` needs a pipeline packed with strategy='concat' or 'best_fit'")
        return next_layout(self._chunks, rows)

    def rows_ahead(self, rows: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray] | None:
        """The tokens (in pieces), document starts and ends of the next ``rows`` full rows, if ``concat`` has them in this epoch; else ``None``.

        For a mixture that lays out several batches at once; nothing moves
        until :meth:`skip_rows` (see :meth:`arrowstream.pack.concat._ConcatRun.rows_ahead`).
        """
        rows_ahead = getattr(self._started_run(), "rows_ahead", None)
        return None if rows_ahead is None else rows_ahead(self._chunks, rows)

    def rows_held(self, rows: int) -> int:
        """How many of the next ``rows`` full rows :meth:`rows_ahead` can give (``concat``; 0 otherwise)."""
        rows_held = getattr(self._started_run(), "rows_held", None)
        return 0 if rows_held is None else rows_held(self._chunks, rows)

    def skip_rows(self, rows: int, layouts: int = 1) -> None:
        """Move past the next ``rows`` rows seen by :meth:`rows_ahead`, as ``layouts`` calls of :meth:`next_layout` would."""
        self._started_run().skip_rows(self._chunks, rows, layouts)

    def _started_run(self) -> Any:
        if not self._started:
            self._start()
        assert self._chunks is not None
        return self._run

    def close(self) -> None:
        """Release open files and threads; the stream then ends, as a closed generator's does.

        ``state_dict()`` still gives the position reached; ``load_state_dict``
        starts the iterator again from a state.
        """
        self._closed = True
        if self._chunks is not None:
            self._chunks.close()
            self._chunks = None
        if self._pool is not None:
            if not sys.is_finalizing():  # at exit its threads are joined and its module torn down
                self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._reader.close()


class _Inline:
    """The synchronous stand-in for :class:`Prefetcher` (``prefetch=0``)."""

    def __init__(self, gen: Generator[Chunk, None, None]) -> None:
        self._gen = gen

    def __iter__(self) -> _Inline:
        return self

    def __next__(self) -> Chunk:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()


def _to_record_batch(chunk: Chunk) -> pa.RecordBatch:
    assert chunk.batch is not None
    return chunk.batch
