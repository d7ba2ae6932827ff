"""Background threads that yield the CPU to the training loop: a lower scheduling priority for producers.

On a machine with few cores per process, the loader's producer threads
(reading, decoding, tokenizing, packing ahead) can hold every core at the
moment the training loop's thread wakes up to take its next batch; that
thread then waits for a CPU, not for data. Measured on this project's 2-core
machine (``benchmarks/bench_stall.py --thread-nice 0,5``, ``concat``
8 x 2048, no DataLoader workers, medians of 5 paired runs): with the loader
1.25x faster than the step the consumer waited 12.5 % of wall time, 7.6
points of it runnable without a CPU; with the producer threads 5 steps
nicer, 8.5 % and 2.6 (p99 wait 1.17 -> 0.38 ms); at 2x, 17.8 -> 5.2 %. They
lose no throughput a step needs: they give way only while another thread is
runnable. With DataLoader workers it made no difference beyond the noise.

Linux schedules every thread on its own, so raising a thread's niceness
(:func:`lower_thread_priority`) touches that thread and the threads it
starts afterwards (its encoder and read-ahead pools), never the training
loop. The niceness is counted from the process's main thread
(:func:`producer_priority`), so producers inside producers are no nicer;
the encoder's and read-ahead's pools start nice (:func:`producer_pool`)
whichever thread starts them. Elsewhere nothing changes. ``ARROWSTREAM_THREAD_NICE`` sets how many
steps (0 to 19; 0 leaves priorities alone); the default is
:data:`DEFAULT_THREAD_NICE`.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from arrowstream.errors import ConfigError

__all__ = [
    "DEFAULT_THREAD_NICE", "THREAD_NICE_ENV", "lower_thread_priority", "producer_pool", "producer_priority", "thread_nice",
]

#: The environment variable setting how much nicer producer threads run (0 to 19; 0: unchanged).
THREAD_NICE_ENV = "ARROWSTREAM_THREAD_NICE"
#: Steps of niceness producer threads add to their own by default.
DEFAULT_THREAD_NICE = 5


def thread_nice() -> int:
    """Return the niceness producer threads add, from :data:`THREAD_NICE_ENV` or the default.

    Raises
    ------
    ConfigError
        The variable is not an integer from 0 to 19.

    Examples
    --------
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"ARROWSTREAM_THREAD_NICE": "0"}):
    ...     thread_nice()
    0
    >>> with mock.patch.dict(os.environ, {"ARROWSTREAM_THREAD_NICE": "high"}):
    ...     thread_nice()
    Traceback (most recent call last):
    ...
    arrowstream.errors.ConfigError: ARROWSTREAM_THREAD_NICE='high': expected an integer from 0 (leave the loader's threads' priority alone) to 19 (the lowest)
    """
    text = os.environ.get(THREAD_NICE_ENV)
    if text is None or not text.strip():
        return DEFAULT_THREAD_NICE
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise ConfigError(
            f"{THREAD_NICE_ENV}={text!r}: expected an integer from 0 (leave the loader's threads' priority alone) "
            "to 19 (the lowest)"
        )
    return value


def producer_priority(by: int) -> int | None:
    """Return the niceness a producer thread takes: ``by`` more than the process's main thread (Linux), or ``None``.

    Relative to the main thread, not to the thread that starts the
    producer: a producer started by another producer (an iterator's chunk
    producer inside ``to_torch()``'s) is no nicer than its parent.

    Examples
    --------
    >>> producer_priority(0) is None
    True
    """
    if by <= 0 or not sys.platform.startswith("linux"):
        return None
    try:
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())  # the main thread's (its id is the process's)
    except OSError:
        return None
    return min(19, base + by)


def lower_thread_priority(to: int | None) -> bool:
    """Make the calling thread as nice as ``to`` if it is less (Linux); return whether it changed.

    Threads it starts afterwards inherit the new value. Failing to change
    it (a sandbox that refuses) is not an error: the thread runs as before.

    Examples
    --------
    >>> lower_thread_priority(None)
    False
    """
    if to is None:
        return False
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) >= to:
            return False
        os.setpriority(os.PRIO_PROCESS, tid, to)
    except OSError:
        return False
    return True


def producer_pool(workers: int, name: str) -> ThreadPoolExecutor:
    """Return a thread pool whose threads run as nice as producers (:func:`producer_priority`), whoever starts them.

    The encoder's and the read-ahead's pools: started by the thread that
    iterates when no prefetch thread runs (a text pipeline's ``ds.iter()``),
    their threads would otherwise compete with the training loop as equals.

    Examples
    --------
    >>> with producer_pool(1, "example") as pool:
    ...     pool.submit(sum, [1, 2]).result()
    3
    """
    return ThreadPoolExecutor(
        workers, thread_name_prefix=name, initializer=lower_thread_priority, initargs=(producer_priority(thread_nice()),)
    )
