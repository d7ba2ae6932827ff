"""A ``DataLoader`` without workers, iterated without its per-batch profiler range.

With ``num_workers=0`` a ``DataLoader`` over an iterable dataset takes each
batch in its own thread: it opens a profiler range (``record_function``),
asks the dataset for the next item, passes it to ``collate_fn`` and, with
``pin_memory``, pins it. Opening and closing the range are two calls into
torch's operator dispatcher, and each gives the interpreter lock up and
takes it back. When nothing else runs that costs microseconds; while the
dataset's own thread makes batches ahead (``to_torch()`` without workers)
and wants the lock too, each of those hand-backs can wait for that thread's
next pause. On this project's 2-core machine (``bench_stall.py``, 32 x
8,192, 1.25x headroom, no workers) the training loop waited 2.1-2.8 % of
wall time through a ``DataLoader``, 1.2-1.3 % with the range made a no-op,
and 0.6-0.7 % iterating ``ds.to_torch()`` directly (median waits 0.14-0.17,
0.07-0.08 and 0.03 ms).

:func:`single_process_batches` does what the ``DataLoader``'s own iterator
does per batch (it calls that iterator's fetch, so the dataset, collation
and pinning are torch's), and opens the range only while a profiler
records, so traces show the same ranges. :class:`~arrowstream.pytorch.StatefulLoader`
iterates this way when it has no workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.autograd import _profiler_enabled
from torch.utils.data import DataLoader

__all__ = ["single_process_batches"]


def single_process_batches(loader: DataLoader) -> Iterator[Any]:
    """Yield the batches of ``loader`` (no workers) as iterating it would, opening its profiler range only while profiling.

    Raises
    ------
    ValueError
        ``loader`` has workers: their batches come through its iterator's
        queues, iterate it as it is.

    Examples
    --------
    >>> from torch.utils.data import DataLoader
    >>> list(single_process_batches(DataLoader(range(3), batch_size=2)))
    [tensor([0, 1]), tensor([2])]
    """
    if loader.num_workers:
        raise ValueError(
            f"single_process_batches takes a DataLoader without workers, got num_workers={loader.num_workers}: "
            "iterate a loader with workers as it is"
        )
    it = iter(loader)
    fetch = getattr(it, "_next_data", None)
    if fetch is None:  # a torch whose iterator this does not know: its own way
        yield from it
        return
    name = getattr(it, "_profile_name", f"enumerate(DataLoader)#{type(it).__name__}.__next__")
    while True:
        try:
            if _profiler_enabled():
                with torch.autograd.profiler.record_function(name):
                    batch = fetch()
            else:
                batch = fetch()
        except StopIteration:
            return
        yield batch
