"""Keep a DataLoader worker's garbage collector off what the worker inherited: ``gc.freeze()`` once per worker.

A DataLoader worker starts with every object of the training process
(torch's modules, the model, the tokenizer), forked or re-imported. Python's
full collections walk every tracked object, and a look-ahead packer makes
them often: each batch allocates thousands of small tuples (pieces of
documents, their keys). In a worker making ``best_fit`` batches of 32 x
8,192 from the 340 MB benchmark corpus, full collections took 60-97 ms
each and found almost nothing; four in 200 batches made the training step
wait 40-76 ms for its batch (one worker, 15 ms steps, 2026-11-29).

:func:`freeze_inherited` moves everything tracked at that point into the
permanent generation (:func:`gc.freeze`, what Python's documentation
advises in a forked child), so later collections walk only what the
worker itself made. With it the same run's longest wait was 4.2 ms. The
objects frozen are never collected in that worker: a cycle of them that
becomes garbage there stays (it stays in the parent too). The dataset calls
it when it starts iterating in a worker, once per worker process;
``ARROWSTREAM_WORKER_GC=default`` leaves the collector as it is.
"""

from __future__ import annotations

import gc
import os

__all__ = ["ENV", "freeze_inherited"]

#: Set to ``default`` to leave a worker's garbage collector alone.
ENV = "ARROWSTREAM_WORKER_GC"

_frozen_in: list[int] = []  # the process that froze (a worker forked from a worker froze in its parent)


def freeze_inherited() -> bool:
    """Freeze every object the garbage collector tracks now, once per process; return whether it is done here.

    ``False`` with ``ARROWSTREAM_WORKER_GC=default``.

    Examples
    --------
    >>> import gc, os
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {ENV: "default"}):
    ...     freeze_inherited()
    False
    """
    if os.environ.get(ENV, "").strip().lower() == "default":
        return False
    if _frozen_in != [os.getpid()]:
        gc.freeze()
        _frozen_in[:] = [os.getpid()]
    return True
