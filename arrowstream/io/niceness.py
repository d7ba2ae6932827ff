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

A lower priority does not keep the producers off a core the training loop
wakes on: on 2 cores, with the producers 5 steps nicer, the consumer of
``bench_stall.py`` still spent a third of its wait runnable without a CPU.
``ARROWSTREAM_SPARE_CPUS=k`` (default 0) keeps the producers off the first
``k`` of the CPUs the process may run on (:func:`producer_cpus`), so the
training loop always finds one of them free; they run on the others (at
least one), set the same way as the priority (:class:`Placement`).

``ARROWSTREAM_THREAD_NICE=idle`` puts the producers in Linux's
``SCHED_IDLE`` policy instead (:func:`idle_thread`): they run only where no
ordinary thread wants the CPU, and a training loop that wakes takes a CPU
from them at once. On the same machine (32 x 8,192, 1.25x headroom, six
rounds alternated with the default) the consumer waited 1.9-2.4 % of wall
time, 0.0-0.1 points of it without a CPU, against 2.0-2.4 % and 0.4-1.1
points at nice 5: the part without a CPU goes, the interpreter lock's
handover stays. It is not the default: where ordinary threads keep every CPU
busy (other processes, a training loop that spins while the GPU works, more
DataLoader workers than cores), idle producers can get almost no CPU time
and the loader falls behind, where at nice 5 the kernel's weights still
give them about a quarter of a contended CPU (see training.md for what one
such run here measured).
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from arrowstream.errors import ConfigError

__all__ = [
    "DEFAULT_THREAD_NICE", "IDLE", "SPARE_CPUS_ENV", "THREAD_NICE_ENV", "Placement", "idle_thread",
    "lower_thread_priority", "producer_cpus", "producer_placement", "producer_pool", "producer_priority", "spare_cpus",
    "take_placement", "thread_nice",
]

#: The environment variable setting how much nicer producer threads run (0 to 19; 0: unchanged; or ``idle``).
THREAD_NICE_ENV = "ARROWSTREAM_THREAD_NICE"
#: The value of :data:`THREAD_NICE_ENV` that puts producer threads in Linux's ``SCHED_IDLE`` policy.
IDLE = "idle"
#: Steps of niceness producer threads add to their own by default.
DEFAULT_THREAD_NICE = 5
#: The environment variable setting how many of the process's CPUs the producer threads leave free.
SPARE_CPUS_ENV = "ARROWSTREAM_SPARE_CPUS"


class Placement(NamedTuple):
    """Where a producer thread runs: its niceness (``None``: unchanged), its CPUs (``None``: unchanged), whether idle."""

    nice: int | None
    cpus: frozenset[int] | None
    idle: bool = False


def thread_nice() -> int | str:
    """Return the niceness producer threads add, from :data:`THREAD_NICE_ENV` or the default; or :data:`IDLE`.

    Raises
    ------
    ConfigError
        The variable is neither an integer from 0 to 19 nor ``idle``.

    Examples
    --------
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"ARROWSTREAM_THREAD_NICE": "0"}):
    ...     thread_nice()
    0
    >>> with mock.patch.dict(os.environ, {"ARROWSTREAM_THREAD_NICE": " Idle "}):
    ...     thread_nice()
    'idle'
    >>> with mock.patch.dict(os.environ, {"ARROWSTREAM_THREAD_NICE": "high"}):
    ...     thread_nice()
    Traceback (most recent call last):
    ...
    arrowstream.errors.ConfigError: ARROWSTREAM_THREAD_NICE='high': expected an integer from 0 (leave the loader's threads' priority alone) to 19 (the lowest), or 'idle' (Linux's SCHED_IDLE: run only on CPUs no other thread wants)
    """
    if os.environ.get(THREAD_NICE_ENV, "").strip().lower() == IDLE:
        return IDLE
    return _whole_number(
        THREAD_NICE_ENV, DEFAULT_THREAD_NICE, 19,
        "an integer from 0 (leave the loader's threads' priority alone) to 19 (the lowest), "
        "or 'idle' (Linux's SCHED_IDLE: run only on CPUs no other thread wants)",
    )


def _whole_number(name: str, default: int, most: int | None, expected: str) -> int:
    """The integer from 0 to ``most`` (``None``: no bound) in environment variable ``name``, or ``default`` when unset."""
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0 or (most is not None and value > most):
        raise ConfigError(f"{name}={text!r}: expected {expected}")
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


def idle_thread() -> bool:
    """Put the calling thread in Linux's ``SCHED_IDLE`` policy; return whether it changed.

    Threads it starts afterwards inherit it. Where the policy does not
    exist or the system refuses, the thread runs as before.

    Examples
    --------
    >>> import threading
    >>> seen = []
    >>> thread = threading.Thread(target=lambda: seen.append(idle_thread() in (True, False)))
    >>> thread.start(); thread.join(); seen
    [True]
    """
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is None:
        return False
    try:
        if os.sched_getscheduler(0) == policy:  # 0: the calling thread
            return False
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:
        return False
    return True


def spare_cpus() -> int:
    """Return how many of the process's CPUs producer threads leave free, from :data:`SPARE_CPUS_ENV` (default 0).

    Raises
    ------
    ConfigError
        The variable is not a non-negative integer.

    Examples
    --------
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"ARROWSTREAM_SPARE_CPUS": "1"}):
    ...     spare_cpus()
    1
    >>> with mock.patch.dict(os.environ, {"ARROWSTREAM_SPARE_CPUS": "one"}):
    ...     spare_cpus()
    Traceback (most recent call last):
    ...
    arrowstream.errors.ConfigError: ARROWSTREAM_SPARE_CPUS='one': expected a whole number of CPUs to keep free of the loader's threads (0: none, the default; 1: one for the training loop)
    """
    return _whole_number(
        SPARE_CPUS_ENV, 0, None,
        "a whole number of CPUs to keep free of the loader's threads (0: none, the default; 1: one for the training loop)",
    )


def producer_cpus(spare: int) -> frozenset[int] | None:
    """Return the CPUs a producer thread runs on: the process's main thread's, but the first ``spare`` (Linux), or ``None``.

    Counted from the main thread's CPUs, as the priority is, so a producer
    inside a producer takes the same set. At least one CPU is always left to
    the producers (the last one), however many are to be spared.

    Examples
    --------
    >>> producer_cpus(0) is None
    True
    >>> cpus = producer_cpus(1)
    >>> cpus is None or len(cpus) >= 1
    True
    """
    if spare <= 0 or not hasattr(os, "sched_getaffinity"):
        return None
    try:
        allowed = sorted(os.sched_getaffinity(os.getpid()))  # the main thread's (its id is the process's)
    except OSError:
        return None
    return frozenset(allowed[min(spare, len(allowed) - 1):])


def producer_placement() -> Placement:
    """Return the placement a producer thread takes now, from ``ARROWSTREAM_THREAD_NICE`` and ``ARROWSTREAM_SPARE_CPUS``.

    Read in the thread that sets the producer up, so a bad value is a
    :class:`~arrowstream.errors.ConfigError` there.

    Examples
    --------
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"ARROWSTREAM_THREAD_NICE": "0", "ARROWSTREAM_SPARE_CPUS": "0"}):
    ...     producer_placement()
    Placement(nice=None, cpus=None, idle=False)
    """
    nice, cpus = thread_nice(), producer_cpus(spare_cpus())
    if nice == IDLE:
        return Placement(None, cpus, idle=True)
    return Placement(producer_priority(int(nice)), cpus)


def take_placement(placement: Placement) -> None:
    """Move the calling thread to ``placement`` (its niceness or idle policy, then its CPUs); threads it starts inherit them.

    Failing (a sandbox that refuses, CPUs taken away since) is not an error:
    the thread runs as before.

    Examples
    --------
    >>> take_placement(Placement(None, None))
    """
    if placement.idle:
        idle_thread()
    else:
        lower_thread_priority(placement.nice)
    if placement.cpus is not None:
        try:
            os.sched_setaffinity(0, placement.cpus)  # 0: the calling thread
        except OSError:
            pass


def producer_pool(workers: int, name: str) -> ThreadPoolExecutor:
    """Return a thread pool whose threads run as producers do (:func:`producer_placement`), whoever starts them.

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
        workers, thread_name_prefix=name, initializer=take_placement, initargs=(producer_placement(),)
    )
