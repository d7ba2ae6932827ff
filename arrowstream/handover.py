"""How a DataLoader worker hands a batch to the main process: one buffer, copied into a slot or sent another way.

A worker's batch crosses to the main process once per batch, so two costs are
ours to choose:

- **how many pieces**: :func:`one_storage` copies a batch's arrays into one
  buffer the tensors view, so a packed batch (five arrays) crosses as one
  piece instead of five;
- **how that buffer crosses** (``to_torch(sharing=...)``, :func:`handed`):

  - ``"auto"`` (the default): into a free slot of the worker's ring of shared
    memory (:mod:`arrowstream.slots`), which the main process's tensors then
    view: no segment made per batch, no bytes through a pipe. When every slot
    is held (the trainer keeps its batches) or there is no ring, a batch
    that fits in the DataLoader's result pipe crosses it as bytes
    (:class:`ByValue`, the pipe widened to 1 MiB by :func:`widen_result_pipe`),
    and a larger one as one segment opened by name (``file_system``);
  - ``"pipe"``: always as bytes through the pipe;
  - one of torch's strategies: as a shared-memory segment per batch. With
    torch's Linux default (``file_descriptor``) the main process connects to
    a thread of the worker for every batch to receive a file descriptor, and
    waits while that worker's threads are busy making the next batches; with
    ``file_system`` it opens the segment by name (torch's
    ``torch_shm_manager``, one process per worker, about 56 MB of private
    memory each, removes segments left behind by processes that died).
    :func:`use_sharing` sets the strategy in the worker process only.

``benchmarks/bench_transfer.py`` measures them side by side.

Beside a batch, a worker of :class:`~arrowstream.pytorch.StatefulLoader`
sends the snapshot of its state after it, sealed (:func:`state_tag`): the
main process keeps it as bytes and unpickles only the one a checkpoint needs,
and most cross as a difference from an earlier one
(:mod:`arrowstream.state.sealed`; ``benchmarks/bench_loaders.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from arrowstream import slots
from arrowstream.errors import ConfigError
from arrowstream.state.sealed import Sealed, SealStream
from arrowstream.state.snapshot import Taken, take_snapshot

__all__ = [
    "AUTO", "PIPE", "ByValue", "by_value_limit", "check_sharing", "handed", "one_storage", "state_tag", "use_sharing",
    "widen_result_pipe",
]

#: The ``sharing`` that sends each batch through the DataLoader's pipe as bytes (:class:`ByValue`).
PIPE = "pipe"
#: The default ``sharing``: through the pipe when the batch fits in it, else by name (``file_system``).
AUTO = "auto"

_ALIGN = 64


def one_storage(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Copy ``arrays`` into one buffer and return tensors that view it.

    A DataLoader worker sends each tensor storage to the main process as its
    own shared-memory segment; the five arrays of a packed batch in one
    storage travel as one (``benchmarks/bench_transfer.py``: 2,789 against
    9,760 microseconds per batch with busy workers, the first by name, the
    second one segment per array by descriptor).

    Examples
    --------
    >>> import numpy as np
    >>> out = one_storage({"a": np.arange(6, dtype=np.int32).reshape(2, 3), "b": np.array([True, False])})
    >>> out["a"].tolist(), out["b"].tolist(), out["a"].untyped_storage().data_ptr() == out["b"].untyped_storage().data_ptr()
    ([[0, 1, 2], [3, 4, 5]], [True, False], True)
    """
    starts, end = {}, 0
    for key, value in arrays.items():
        starts[key] = end
        end += -(-value.nbytes // _ALIGN) * _ALIGN
    buffer = torch.empty(end, dtype=torch.uint8)
    flat = buffer.numpy()
    out = {}
    for key, value in arrays.items():
        start, size = starts[key], value.nbytes
        np.copyto(flat[start : start + size].view(value.dtype).reshape(value.shape), value)
        dtype = torch.from_numpy(value[:0]).dtype
        out[key] = buffer[start : start + size].view(dtype).view(value.shape)
    return out


def check_sharing(sharing: str | None) -> str | None:
    """Return ``sharing`` if it is :data:`AUTO`, :data:`PIPE`, one of torch's sharing strategies, or ``None``.

    Examples
    --------
    >>> check_sharing("auto"), check_sharing("pipe"), check_sharing("file_system"), check_sharing(None)
    ('auto', 'pipe', 'file_system', None)
    >>> check_sharing("pipes")
    Traceback (most recent call last):
    ...
    arrowstream.errors.ConfigError: `sharing` must be one of ['auto', 'file_descriptor', 'file_system', 'pipe'] or None (leave torch's setting), got 'pipes'
    """
    choices = sorted({*torch.multiprocessing.get_all_sharing_strategies(), PIPE, AUTO})
    if sharing is not None and sharing not in choices:
        raise ConfigError(f"`sharing` must be one of {choices} or None (leave torch's setting), got {sharing!r}")
    return sharing


def use_sharing(sharing: str | None) -> None:
    """Make this process send tensors by ``sharing`` (:data:`AUTO`: ``file_system``; ``None`` or :data:`PIPE`: leave it).

    Call it in a worker only.
    """
    if sharing == AUTO:
        sharing = "file_system"
    if sharing not in (None, PIPE) and torch.multiprocessing.get_sharing_strategy() != sharing:
        torch.multiprocessing.set_sharing_strategy(sharing)


class ByValue(dict):  # type: ignore[type-arg]
    """A dict whose tensors that view one buffer cross to the main process as a copy of that buffer, once.

    What a DataLoader worker sends (``sharing="auto"`` or ``"pipe"``, see
    :func:`handed`). When pickled, the buffer goes, in the first way that works:

    1. with :attr:`in_slots`, into a free slot of the worker's ring of shared
       memory (:mod:`arrowstream.slots`), and the main process's tensors view
       the slot;
    2. up to :attr:`pipe_at_most` bytes, as bytes in the pickle (through the
       DataLoader's result pipe), rebuilt in one writable buffer;
    3. else as the tensors themselves, shared by the worker's sharing strategy.

    The main process receives a :attr:`received_as` (a plain ``dict`` here).
    Values that do not view the buffer pickle as usual.

    Examples
    --------
    >>> import pickle
    >>> import numpy as np
    >>> batch = ByValue(one_storage({"a": np.arange(4, dtype=np.int32).reshape(2, 2), "b": np.array([True])}), n=3)
    >>> back = pickle.loads(pickle.dumps(batch))
    >>> type(back).__name__, list(back), back["a"].tolist(), back["b"].tolist(), back["n"]
    ('dict', ['a', 'b', 'n'], [[0, 1], [2, 3]], [True], 3)
    >>> back["a"].untyped_storage().data_ptr() == back["b"].untyped_storage().data_ptr()
    True
    """

    #: The type the main process receives (a subclass may name its own).
    received_as: type = dict
    #: Try a slot of the worker's ring first.
    in_slots: bool = False
    #: Bytes of buffer up to which it crosses as bytes in the pickle (larger: as tensors).
    pipe_at_most: float = float("inf")

    def __copy__(self) -> ByValue:
        return self._like(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> ByValue:  # a copy in the worker never takes a slot
        return self._like((key, copy.deepcopy(value, memo)) for key, value in self.items())

    def _like(self, items: Any) -> ByValue:
        out = type(self)(items)
        out.in_slots, out.pipe_at_most = self.in_slots, self.pipe_at_most
        return out

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        storage = next((v.untyped_storage() for v in self.values() if isinstance(v, torch.Tensor)), None)
        items: list[tuple[str, bool, Any]] = []
        for key, value in self.items():
            if storage is not None and isinstance(value, torch.Tensor) and value.is_contiguous() \
                    and value.untyped_storage().data_ptr() == storage.data_ptr():
                start, size = value.storage_offset() * value.element_size(), value.numel() * value.element_size()
                items.append((key, True, (value.dtype, tuple(value.shape), start, size)))
            else:
                items.append((key, False, value))
        if storage is None:
            return _rebuild, (self.received_as, items, b"")
        flat = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
        if self.in_slots:
            where = slots.place(flat)
            if where is not None:
                return _rebuild_from_slot, (self.received_as, items, where)
        if flat.nbytes > self.pipe_at_most:
            return _as_tensors, (self.received_as, list(self.items()))
        return _rebuild, (self.received_as, items, flat.tobytes())


def handed(values: dict[str, Any], *, sharing: str | None, pipe_at_most: float, cls: type[ByValue] = ByValue) -> dict[str, Any]:
    """Return ``values`` (arrays viewing one buffer: :func:`one_storage`) as a worker sends them by ``sharing``.

    :data:`AUTO`: a :class:`ByValue` that tries a slot first, then the pipe up to
    ``pipe_at_most`` bytes (:func:`by_value_limit`), then by name;
    :data:`PIPE`: a :class:`ByValue` through the pipe; else the plain dict,
    its tensors shared by torch's strategy.

    Examples
    --------
    >>> import numpy as np
    >>> arrays = one_storage({"a": np.zeros(3, dtype=np.int32)})
    >>> type(handed(arrays, sharing="file_system", pipe_at_most=0)).__name__
    'dict'
    >>> out = handed(arrays, sharing="auto", pipe_at_most=1 << 20)
    >>> type(out).__name__, out.in_slots == slots.available(), out.pipe_at_most
    ('ByValue', True, 1048576)
    """
    if sharing not in (AUTO, PIPE):
        return values
    out = cls(values)
    out.in_slots = sharing == AUTO and slots.available()
    out.pipe_at_most = pipe_at_most
    return out


def _rebuild(cls: type, items: list[tuple[str, bool, Any]], payload: bytes) -> Any:
    """Return ``cls`` of the values :meth:`ByValue.__reduce__` listed, the views over one writable copy of ``payload``."""
    buffer = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)
    return _views(cls, items, buffer)


def _rebuild_from_slot(cls: type, items: list[tuple[str, bool, Any]], where: slots.Where) -> Any:
    """Return ``cls`` of the values :meth:`ByValue.__reduce__` listed, the views over the slot ``where``."""
    return _views(cls, items, torch.from_numpy(slots.take_out(where)))


def _as_tensors(cls: type, pairs: list[tuple[str, Any]]) -> Any:
    return cls(pairs)


def _views(cls: type, items: list[tuple[str, bool, Any]], buffer: torch.Tensor) -> Any:
    out = cls()
    for key, is_view, value in items:
        if is_view:
            dtype, shape, start, size = value
            value = buffer[start : start + size].view(dtype).view(shape)
        out[key] = value
    return out


def widen_result_pipe(frame: Any, *, depth: int = 4) -> int | None:
    """Let the DataLoader's result pipe hold a whole batch; return its new capacity (``None``: not found or not Linux).

    A pipe holds 64 KiB by default, so a batch of 300 KB crossing by value
    goes over in five turns of the worker writing and the main process
    reading. Called from a worker's ``__iter__`` with its frame:
    the ``data_queue`` of torch's worker loop, a few frames up, is the pipe
    every worker writes to; its capacity is raised to the most an
    unprivileged process may ask for (``/proc/sys/fs/pipe-max-size``, 1 MiB
    by default). Kernel memory is taken only as bytes wait in it.
    """
    import fcntl

    setter = getattr(fcntl, "F_SETPIPE_SZ", None)
    for _ in range(depth):
        frame = frame.f_back if frame is not None else None
        if frame is None or setter is None:
            return None
        writer = getattr(frame.f_locals.get("data_queue"), "_writer", None)
        if writer is None:
            continue
        try:
            with open("/proc/sys/fs/pipe-max-size") as f:
                most = int(f.read())
            return int(fcntl.fcntl(writer.fileno(), setter, most))
        except (OSError, ValueError):
            return None
    return None


#: Bytes of a pickled batch beside its arrays (keys, dtypes, shapes, counts), kept free in the pipe.
PICKLE_SLACK = 4096


def by_value_limit(sharing: str | None, frame: Any) -> float:
    """Return the bytes of arrays up to which a worker sends a batch through the pipe (0: never).

    :data:`PIPE`: always; :data:`AUTO`: when it fits in the result pipe,
    widened by :func:`widen_result_pipe` (never if the pipe is not found);
    anything else: never. Called once in a worker, with its ``__iter__``'s frame.

    Examples
    --------
    >>> import sys
    >>> by_value_limit("file_system", sys._getframe()), by_value_limit("pipe", sys._getframe())
    (0, inf)
    >>> by_value_limit("auto", sys._getframe())  # not in a DataLoader worker: no result pipe
    0
    """
    if sharing not in (AUTO, PIPE):
        return 0
    capacity = widen_result_pipe(frame)
    if sharing == PIPE:
        return float("inf")
    return 0 if capacity is None else capacity - PICKLE_SLACK


def state_tag(it: Any, *, last: bool, stream: SealStream | None = None) -> dict[str, Any]:
    """What a batch carries for :class:`~arrowstream.pytorch.StatefulLoader`: its worker's state after it, sealed.

    The snapshot of the state after the batch (:class:`~arrowstream.state.snapshot.Sealed`:
    it crosses as bytes and is unpickled only if a checkpoint asks for it),
    the consumer, and whether the batch is its worker's last. A pipeline's
    or mixture snapshot travels without its plans (the loader puts them back
    when a state is asked for); any other iterator's state is built here.
    With the ``stream`` of the worker's iterator, most snapshots cross as a
    difference from an earlier one (:class:`~arrowstream.state.sealed.SealStream`).

    Examples
    --------
    >>> import pickle
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> it = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0).pack(seq_len=4, batch_size=2).iter()
    >>> first = next(it)
    >>> tag = pickle.loads(pickle.dumps(state_tag(it, last=False)))
    >>> tag["consumer"], tag["last"], tag["snapshot"].is_open
    (0, False, False)
    >>> tag["snapshot"].open().with_plan(it.plan).to_dict() == it.state_dict()
    True
    """
    snap = take_snapshot(it)
    if not hasattr(snap, "with_plan"):  # it cannot leave its plan behind
        snap = Taken(snap.to_dict())
    return {"snapshot": Sealed(snap, stream), "consumer": it.consumer.index, "last": last}
