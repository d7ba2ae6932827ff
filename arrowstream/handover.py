"""How a DataLoader worker hands a batch to the main process: one storage, shared by file name.

torch sends each tensor storage a worker yields to the main process as a
shared-memory segment. Two costs per batch are ours to choose:

- **how many segments**: :func:`one_storage` copies a batch's arrays into one
  buffer the tensors view, so a packed batch (five arrays) crosses as one
  segment instead of five;
- **how the main process opens it**: with torch's default strategy on Linux
  (``file_descriptor``) the main process connects to a thread of the worker
  for every batch to receive a file descriptor, and waits while that worker's
  threads are busy making the next batches; with ``file_system`` it opens the
  segment by name (torch's ``torch_shm_manager`` removes segments left behind
  by processes that died). :func:`use_sharing` sets the strategy in the worker
  process only, where it decides how that worker's batches are sent.

``benchmarks/bench_transfer.py`` measures both.
"""

from __future__ import annotations

import numpy as np
import torch

from arrowstream.errors import ConfigError

__all__ = ["check_sharing", "one_storage", "use_sharing"]

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
    """Return ``sharing`` if it is one of torch's sharing strategies or ``None``.

    Examples
    --------
    >>> check_sharing("file_system"), check_sharing(None)
    ('file_system', None)
    >>> check_sharing("pipes")
    Traceback (most recent call last):
    ...
    arrowstream.errors.ConfigError: `sharing` must be one of ['file_descriptor', 'file_system'] or None (leave torch's setting), got 'pipes'
    """
    strategies = sorted(torch.multiprocessing.get_all_sharing_strategies())
    if sharing is not None and sharing not in strategies:
        raise ConfigError(f"`sharing` must be one of {strategies} or None (leave torch's setting), got {sharing!r}")
    return sharing


def use_sharing(sharing: str | None) -> None:
    """Make this process send tensors by ``sharing`` (``None``: leave it); call it in a worker only."""
    if sharing is not None and torch.multiprocessing.get_sharing_strategy() != sharing:
        torch.multiprocessing.set_sharing_strategy(sharing)
