"""Keep freed memory mapped between batches: two glibc ``malloc`` settings, applied once per process.

Every batch is a handful of fresh numpy arrays of a few MB, and most die
before the next batch is made. By default glibc's ``malloc`` hands the
freed memory at the top of a heap back to the kernel once more than
128 KiB of it is free, so the next batch's arrays fault every page in
again. A fault costs a few microseconds in a virtual machine (a cloud
instance, or the 2-core machine these figures come from): assembling eight
``concat`` batches of 8 x 2048 tokens took 1.5-2.3 ms that way against
0.2-0.4 ms with the pages kept, and the token-cache pipeline spent 0.46
instead of 0.66 CPU-seconds on 600 batches.

:func:`keep_freed_memory` asks ``malloc`` to keep 16 MiB at the top of each
heap when it trims (``M_TOP_PAD``) and to serve blocks of up to 32 MiB from
its heaps rather than fresh mappings (``M_MMAP_THRESHOLD``; glibc's own
adaptive threshold rises to the same 32 MiB). The cost: up to 16 MiB of
freed memory stays resident per ``malloc`` arena (one per thread that
allocates, at most eight per core). Iterators apply it when they start, in
processes whose C library is glibc; ``ARROWSTREAM_MALLOC=default`` leaves
``malloc`` as it was.

The cost falls on threads that allocate once and stop: the encoder's
built-in checks (:mod:`arrowstream.tokenize.proof`) leave each arena they
touched holding its pad. The first process of a tokenizer, which runs them,
peaked 43-66 MB above a later process with tokie (32-41 MB with tiktoken;
85 MB corpus, torch loaded, 300 batches). :func:`release_freed_memory`
hands every arena's free pages back (``malloc_trim``); the encoder calls it
before and after the checks, which took 10-15 MB off those peaks. Parsing
a tokenizer and converting it for tiktoken free tens of MB of their own,
scattered through the heap where ``malloc`` never trims on its own, and
usually before any iterator has started: they call it with ``anytime=True``.

Arrow's buffers (the row groups read, the columns sliced) come from
pyarrow's default memory pool, which is mimalloc in pyarrow's Linux wheels.
In a pipeline whose threads read, slice and free those buffers, mimalloc
held 30-40 MB more resident than ``malloc`` did, and was no faster. Where
the settings above apply, :func:`keep_freed_memory` also makes ``malloc``
(:func:`pyarrow.system_memory_pool`) Arrow's default pool, as long as it is
mimalloc and ``ARROW_DEFAULT_MEMORY_POOL`` does not name one: the pool
that the user or the environment chose stays. Buffers keep the pool that
allocated them, so the switch is safe at any point. Measured on the 85 MB
benchmark corpus (``concat`` 8 x 2,048, no workers, a later process, each
run a fresh process, ``ARROW_DEFAULT_MEMORY_POOL=mimalloc`` beside it,
alternated, three rounds), ``malloc`` against mimalloc: peak PSS 335-340
against 372-373 MB with tokie, 301-303 against 330-331 with tiktoken, the
same tokens/s; the token-cache pipeline streamed 64-68 against 64-67 M
tokens/s and peaked at 402-415 against 437-440 MB of RSS.

Tried and not kept: fewer arenas (``M_ARENA_MAX``, one per CPU instead of
glibc's eight per core, set with the others). Each arena keeps its pad, and
``malloc_trim`` does not hand back a thread arena's free top, so a later
process with tokie peaked 115-118 against 136-140 MB above idle at 128k
tokens (40 MB corpus) and 71-74 against 81-88 at 32k (85 MB corpus), but
streamed 2-3 % fewer tokens/s at 32k (medians of 4 alternated rounds,
2026-11-30): throughput comes first here.
"""

from __future__ import annotations

import ctypes
import os
import sys

import pyarrow as pa

__all__ = ["ENV", "TOP_PAD", "MMAP_THRESHOLD", "ARROW_POOL_ENV", "keep_freed_memory", "release_freed_memory"]

#: Set to ``default`` to leave ``malloc``'s settings alone.
ENV = "ARROWSTREAM_MALLOC"
#: Freed memory kept at the top of each heap.
TOP_PAD = 16 << 20
#: Largest block served from the heaps instead of its own mapping.
MMAP_THRESHOLD = 32 << 20
#: pyarrow's own setting of its default pool: when set, the pool it names stays.
ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"

_M_TOP_PAD, _M_MMAP_THRESHOLD = -2, -3  # from glibc's malloc.h
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Apply the settings once per process; return whether they are in force.

    ``False`` where the C library is not glibc, where ``ARROWSTREAM_MALLOC``
    is ``default``, or where ``mallopt`` refuses. Where they are in force,
    Arrow's default pool is ``malloc`` too, unless it was another than
    mimalloc or ``ARROW_DEFAULT_MEMORY_POOL`` named one.

    Examples
    --------
    >>> keep_freed_memory() in (True, False)
    True
    """
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def release_freed_memory(*, anytime: bool = False) -> bool:
    """Hand the free pages of every ``malloc`` arena back to the kernel; return whether it was done.

    Done only where :func:`keep_freed_memory` has applied its settings in
    this process (so never with ``ARROWSTREAM_MALLOC=default``, nor off
    glibc); it does not apply them. Costs about a millisecond in a process
    of a few hundred MB; the next batches fault their pages in again once.

    ``anytime=True`` also hands them back before the settings apply (never
    with ``ARROWSTREAM_MALLOC=default`` nor off glibc): for a one-off step
    that frees tens of MB scattered through the heap, where ``malloc``'s own
    trimming (of the heap's top only) leaves them resident. Parsing a
    ``tokenizer.json`` of 128k tokens left 53 MB so; converting it for
    tiktoken, about 25 MB.

    Examples
    --------
    >>> release_freed_memory() == keep_freed_memory()
    True
    """
    if not (_applied or (anytime and _allowed())):
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def _allowed() -> bool:
    """Whether arrowstream may tune ``malloc`` here: glibc on Linux, and ``ARROWSTREAM_MALLOC`` is not ``default``."""
    if os.environ.get(ENV, "").strip().lower() == "default":
        return False
    return sys.platform.startswith("linux") and _glibc()


def _apply() -> bool:
    if not _allowed():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success
    if not (bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) & bool(mallopt(_M_TOP_PAD, TOP_PAD))):
        return False
    _arrow_pool_to_malloc()
    return True


def _arrow_pool_to_malloc() -> bool:
    """Make ``malloc`` Arrow's default pool where it is mimalloc and nobody chose it; return whether it was done."""
    if os.environ.get(ARROW_POOL_ENV, "").strip():
        return False  # the user's or the environment's choice
    if pa.default_memory_pool().backend_name != "mimalloc":
        return False  # another pool, set by the user or by this build of pyarrow
    pa.set_memory_pool(pa.system_memory_pool())
    return True


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")  # type: ignore[union-attr]
    except (ValueError, OSError, AttributeError):
        return False
