"""Whether the work of this thread comes before its consumer's first batch.

Some one-off costs can wait until a consumer has its first batches: an
encoder's built-in checks (:mod:`arrowstream.tokenize.checking`) run beside
the stream and let the reference encode a little more first, rather than
hold up the batch. Most streams reach such a cost well after their first
batch; the work a consumer does before its first batch on purpose (the
plan's token sample, :func:`~arrowstream.distributed.balance.measure_sample`)
says so with :func:`before_first_batch`. The mark is per thread.

Examples
--------
>>> with before_first_batch():
...     print(is_before_first_batch())
True
>>> is_before_first_batch()
False
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["before_first_batch", "is_before_first_batch"]

_local = threading.local()


@contextmanager
def before_first_batch() -> Iterator[None]:
    """Mark the work of this thread, inside the block, as coming before its consumer's first batch."""
    was = getattr(_local, "before", False)
    _local.before = True
    try:
        yield
    finally:
        _local.before = was


def is_before_first_batch() -> bool:
    """Whether this thread's work is marked as before its consumer's first batch (:func:`before_first_batch`)."""
    return bool(getattr(_local, "before", False))
