"""Run an iterator in a background thread, a bounded number of items ahead.

The tokenizer's batch encoder and Parquet decoding release the GIL, so
producing the next chunks (read, filter, tokenize) in a thread while the
consumer packs the current ones keeps the tokenizer busy. Order is preserved
(one producer), so output and state are the same as without prefetching; the
consumer's position, not the producer's, is what a state records.

The producer thread runs a few steps nicer than the consumer
(:mod:`~arrowstream.io.niceness`), so a training loop waking for its next
batch gets a CPU at once. Memory is bounded by ``depth`` items. Once it has
filled them, the producer rests until the consumer has taken half
(:class:`RefillQueue`): a consumer that takes an item does not wake the
producer each time, in the middle of its own ``next()``, where the two
would contend for the interpreter lock. An exception in the producer is raised
in the consumer as the same exception object, with its original traceback.

At interpreter exit, producer threads still running, including those of
prefetchers already garbage-collected, are stopped and joined before Python
finalizes: a daemon thread that is still releasing pyarrow objects (closing a
Parquet file drops and retakes the GIL) during finalization aborts the process.
"""

from __future__ import annotations

import atexit
import gc
import queue
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from arrowstream.errors import forward_warnings, warn_user
from arrowstream.io.niceness import Placement, producer_placement, take_placement

__all__ = ["AHEAD_BYTES", "AHEAD_MOST", "Prefetcher", "RefillQueue", "close_all", "collecting_here", "depth_for"]

T = TypeVar("T")

#: Items held ahead by default (``to_torch(prefetch=None)``): at most this many ...
AHEAD_MOST = 16
#: ... and no more than this many bytes of them, at least 2 (see :func:`depth_for`).
AHEAD_BYTES = 64 << 20

_DONE = object()
_POLL_SECONDS = 0.1


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class RefillQueue(queue.Queue):  # type: ignore[type-arg]
    """A bounded FIFO queue whose producer, once it has filled it, waits until it is down to half.

    ``queue.Queue`` wakes a producer waiting for room at every ``get``. Here
    the ``get`` that leaves ``maxsize // 2`` items or fewer wakes it, and the
    producer then fills the queue again: it works in runs of about half the
    queue while the consumer is away, instead of starting one item each time
    the consumer is in the middle of taking one. Order, bounds and the rest of
    ``queue.Queue``'s interface are unchanged; with ``maxsize`` 1 or 2 it
    behaves as ``queue.Queue``.

    Examples
    --------
    >>> q = RefillQueue(4)
    >>> for i in range(4):
    ...     q.put(i)
    >>> q.get(), q.full(), q.resting
    (0, False, True)
    >>> q.put(9, timeout=0.01)  # 3 left: more than half, so the producer still rests
    Traceback (most recent call last):
    ...
    queue.Full
    >>> q.get(), q.resting  # 2 left: half, the producer is woken
    (1, False)
    >>> q.put(4); [q.get() for _ in range(3)]
    [2, 3, 4]
    """

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        #: The producer filled the queue and waits for it to be down to half.
        self.resting = False

    def put(self, item: object, block: bool = True, timeout: float | None = None) -> None:
        """Put ``item`` at the end; after a put that filled the queue, wait until it is down to half (``queue.Full`` at ``timeout``)."""
        with self.not_full:
            if self.maxsize > 0 and self._qsize() >= self.maxsize:
                self.resting = True
            if self.resting and not block:
                raise queue.Full
            deadline = None if timeout is None else time.monotonic() + timeout
            while self.resting:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise queue.Full
                self.not_full.wait(left)
            self._put(item)
            self.unfinished_tasks += 1
            self.resting = 0 < self.maxsize <= self._qsize()  # filled: the next put waits for half
            self.not_empty.notify()

    def get(self, block: bool = True, timeout: float | None = None) -> object:
        """Take the first item (``queue.Empty`` when none comes by ``timeout``, or at once when not ``block``)."""
        with self.not_empty:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._qsize():
                left = None if deadline is None else deadline - time.monotonic()
                if not block or (left is not None and left <= 0):
                    raise queue.Empty
                self.not_empty.wait(left)
            item = self._get()
            if self.resting and self._qsize() <= self.maxsize // 2:
                self.resting = False
                self.not_full.notify()
            return item

    def resize(self, maxsize: int) -> None:
        """Hold up to ``maxsize`` items from now on; a producer resting on a queue now short of it goes on at once."""
        with self.mutex:
            self.maxsize = maxsize
            if self.resting and self._qsize() < maxsize:
                self.resting = False
            self.not_full.notify_all()


def _put(q: queue.Queue[object], stop: threading.Event, item: object) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=_POLL_SECONDS)
            return True
        except queue.Full:
            continue
    return False


def _produce(
    make: Callable[[], Iterator[T]], q: queue.Queue[object], stop: threading.Event, outbox: deque[Any],
    placement: Placement, discarded: deque[Any],
) -> None:
    forward_warnings(outbox.append)  # warned again by the consumer, at the user's line
    take_placement(placement)  # the consumer's thread (the training loop) takes a CPU first
    try:
        try:
            for item in make():
                if not _put(q, stop, item):
                    return
                # the consumer's leftovers, mostly their last reference: freed in this thread. The newest
                # waits for the next, as the consumer may still hold it for an instant, and would free it
                while len(discarded) > 1:
                    discarded.popleft()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, never swallowed
            _put(q, stop, _Failure(exc))
            return
        _put(q, stop, _DONE)
    finally:
        del make  # drop the producer's objects (open Parquet files) in this thread, now


# Weak keys: a thread stays listed while its Thread object lives (at least until it has
# finished), so the exit hook also joins producers whose prefetcher is already gone.
_RUNNING: weakref.WeakKeyDictionary[threading.Thread, threading.Event] = weakref.WeakKeyDictionary()
_RUNNING_LOCK = threading.Lock()
_EXIT_HOOK: list[bool] = []
_EXIT_JOIN_SECONDS = 30.0
#: The thread running a garbage collection now, if any (one at a time in a process).
_COLLECTOR: list[int | None] = [None]


def _track_collections(phase: str, info: dict[str, Any]) -> None:
    """A ``gc.callbacks`` hook: note which thread collects, from start to stop."""
    _COLLECTOR[0] = threading.get_ident() if phase == "start" else None


def collecting_here() -> bool:
    """Return whether a garbage collection runs in this thread now (finalizers run inside it).

    Examples
    --------
    >>> collecting_here()
    False
    """
    return _COLLECTOR[0] == threading.get_ident()


def _stop_all() -> None:
    """Stop every running producer thread and wait for it (registered with ``atexit``)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING.items())
    for _, stop in running:
        stop.set()
    for thread, _ in running:
        thread.join(timeout=_EXIT_JOIN_SECONDS)


class Prefetcher(Generic[T]):
    """Iterate ``make()`` in a daemon thread, at most ``depth`` items ahead.

    The thread starts at the first ``next()``, so creating and closing a
    prefetcher without using it costs nothing.

    Examples
    --------
    >>> p = Prefetcher(lambda: iter(range(5)), depth=2)
    >>> list(p)
    [0, 1, 2, 3, 4]
    >>> def boom():
    ...     yield 1
    ...     raise KeyError("bad")
    >>> p = Prefetcher(boom)
    >>> next(p), next(p)
    Traceback (most recent call last):
    ...
    KeyError: 'bad'
    """

    def __init__(self, make: Callable[[], Iterator[T]], *, depth: int = 2) -> None:
        self._queue = RefillQueue(max(1, depth))
        self._warnings: deque[Any] = deque()  # the producer's, warned in the consumer's thread
        self._discarded: deque[Any] = deque()  # the consumer's, dropped in the producer's thread
        self._stop = threading.Event()
        self._finished = False
        # The thread must not reference ``self``: an abandoned prefetcher is then
        # collected, and the finalizer stops its thread.
        self._thread = threading.Thread(
            target=_produce,
            args=(make, self._queue, self._stop, self._warnings, producer_placement(), self._discarded),
            name="arrowstream-prefetch",
            daemon=True,
        )
        weakref.finalize(self, self._stop.set)
        self._started = False  # started on first use: a reset before that reads nothing
        self._finalizing = sys.is_finalizing  # still bound while the interpreter exits

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        if not self._started:
            with _RUNNING_LOCK:
                if not _EXIT_HOOK:  # once, on first use rather than at import
                    atexit.register(_stop_all)
                    gc.callbacks.append(_track_collections)
                    _EXIT_HOOK.append(True)
                _RUNNING[self._thread] = self._stop
            self._started = True
            self._thread.start()
        item = self._queue.get()
        while self._warnings:
            warn_user(*self._warnings.popleft())
        if item is _DONE:
            self._finished = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._finished = True
            raise item.exc
        return item  # type: ignore[return-value]

    def resize(self, depth: int) -> None:
        """Hold up to ``depth`` items ahead from now on (a producer waiting for room sees it at once).

        Examples
        --------
        >>> p = Prefetcher(lambda: iter(range(10)), depth=1)
        >>> p.resize(4)
        >>> list(p)
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        """
        self._queue.resize(max(1, depth))

    def discard(self, item: object) -> None:
        """Hand ``item``, which the consumer is done with, to the producer thread to drop after its next item.

        Freeing a large structure of Python objects (a look-ahead packer's
        state snapshot holds thousands) takes the thread that drops its last
        reference 0.1 ms or more; dropped here, in the consumer's ``next()``,
        a training step would wait for it. The newest item waits for the next
        one (the caller may still hold it for an instant, and would then free
        it); what is left when the producer ends goes with the prefetcher.

        Examples
        --------
        >>> p = Prefetcher(lambda: iter(range(3)))
        >>> first = next(p)
        >>> p.discard(["done with"])
        >>> list(p)
        [1, 2]
        """
        self._discarded.append(item)

    def close(self) -> None:
        """Stop the producer and wait for its thread to end (at most the item in progress)."""
        self._stop.set()
        self._finished = True
        if not self._started or self._finalizing() or threading.current_thread() is self._thread:
            # (the second: the exit hook has joined the producer already; the third: a garbage
            # collection that ran in the producer thread finalized the consumer, and the producer
            # sees the stop flag at its next item)
            return
        while self._thread.is_alive():
            try:
                while True:  # make room so a blocked put returns and sees the stop flag
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.005)


def close_all(
    *closers: Callable[[], None],
    wait: bool,
    _finalizing: Callable[[], bool] = sys.is_finalizing,  # bound now: module globals are gone at exit
    _thread: type[threading.Thread] = threading.Thread,
    _collecting: Callable[[], bool] = collecting_here,
) -> None:
    """Call ``closers`` in order: here when ``wait``, else in a thread of their own.

    A generator's ``finally`` runs in whatever thread lets go of it last, a
    garbage collection in an encoder thread for one. Closing a prefetcher
    there waits for its producer, which may be waiting for that very thread:
    pass ``wait=False`` from any thread but the consumer's, so the thread that
    finalizes never blocks. In the consumer's thread too, a garbage
    collection can finalize an abandoned generator at any allocation, inside
    a lock the producer needs (``concurrent.futures`` holds one while it
    starts a pool's thread, and the producer submits encoder calls): inside
    a collection the closers always run in a thread of their own. While the
    interpreter exits the closers run here (the exit hook has already
    stopped every producer).

    Examples
    --------
    >>> closed = []
    >>> close_all(lambda: closed.append("producer"), lambda: closed.append("files"), wait=True)
    >>> closed
    ['producer', 'files']
    """
    if _finalizing() or (wait and not _collecting()):
        for close in closers:
            close()
        return

    def run() -> None:
        for close in closers:
            close()

    _thread(target=run, name="arrowstream-close", daemon=True).start()


def depth_for(item_bytes: int, *, budget: int = AHEAD_BYTES, most: int = AHEAD_MOST, least: int = 2) -> int:
    """Return how many items of ``item_bytes`` bytes to hold ahead: what ``budget`` holds, within ``[least, most]``.

    Examples
    --------
    >>> depth_for(8 * 2048 * 20)  # a packed 8 x 2,048 batch, every array: 320 KiB
    16
    >>> depth_for(64 * 8192 * 20)  # 64 x 8,192: 10 MiB
    6
    >>> depth_for(1 << 30)
    2
    """
    return max(least, min(most, budget // max(1, item_bytes)))
