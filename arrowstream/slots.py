"""Batches handed over in slots of shared memory that a DataLoader worker reuses.

Without this, a worker's batch crosses to the main process as bytes through
the DataLoader's result pipe (copied into the pipe, out of it, and into a new
buffer), or as a new shared-memory segment (created, sent by name, opened and
mapped, its pages faulted in on both sides), for every batch. Here each worker
process keeps one ring of slots in anonymous shared memory
(``os.memfd_create``), reserved up front (``os.posix_fallocate``: short of
memory, the ring is refused at once instead of a bus error later) and sent
once, as a file descriptor, with the first batch placed in it. After that a
batch crosses as a slot number: :func:`place` copies it into a free slot in
the worker, and :func:`take_out` gives the main process an array that views
the slot (no copy) and frees the slot when that array is gone, that is when
the last tensor viewing it is (``weakref.finalize``).

Invariants:

- a slot holds one batch from the moment a worker fills it until nothing in
  the main process views it any more; a worker never writes a slot that is not
  free, so a batch the trainer keeps (in a list, say) is never overwritten;
- when no slot is free, or the ring cannot be made, :func:`place` returns
  ``None`` and the caller sends the batch another way: slots change how fast
  a batch arrives, never what arrives;
- a worker's batches reach the main process in the order it sent them (one
  result queue, one feeder thread), so the batch carrying a ring's descriptor
  is taken out before any other that uses the ring.

Ordering: a worker fills a slot and marks it held before the batch's message
goes into the pipe (a system call between them), and the main process marks
it free only after the last view is gone, so the reads of a batch and the
writes of the next batch into its slot never overlap.

Thread safety: a lock guards each side's rings. In a worker the slots are
filled by the thread that pickles the results (the result queue's feeder);
in the main process a slot is freed by whichever thread drops its last view.

Linux only (``memfd_create``); elsewhere :func:`available` is false.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
import time
import weakref
from multiprocessing import reduction
from typing import Any, NamedTuple

import numpy as np

from arrowstream.errors import ArrowStreamError

__all__ = ["RING_MOST", "SLOTS_MOST", "Where", "available", "counts", "place", "take_out"]

#: Slots in a worker's ring at most (fewer when the batches are large: see :data:`RING_MOST`).
SLOTS_MOST = 8
#: Bytes of slots in one worker's ring at most; batches too large for two slots go another way.
RING_MOST = 64 << 20
_SLOT_LEAST = 64 << 10
_HEADER = 4096  # one flag byte per slot (1: a batch holds it), then the slots

#: What happened in this process: batches placed in a slot, or not (ring full, too large, no ring),
#: rings made, and batches taken out of a slot (main process).
counts: dict[str, int] = {"placed": 0, "full": 0, "too_large": 0, "no_ring": 0, "rings": 0, "taken_out": 0}


def available() -> bool:
    """Return whether this platform has what slots need (``memfd_create`` and ``posix_fallocate``: Linux)."""
    return hasattr(os, "memfd_create") and hasattr(os, "posix_fallocate")


class Where(NamedTuple):
    """Where a batch waits for the main process: slot ``slot`` of a worker's ring, its first ``nbytes``.

    ``handle`` (the ring's file descriptor, sent through ``multiprocessing``'s
    resource sharer) comes with the first batch placed in a ring only. A
    tuple: it pickles small and fast, with every batch.
    """

    ring: tuple[int, int, int]  # (worker pid, worker nonce, ring serial)
    size: int
    slot_bytes: int
    slots: int
    slot: int
    nbytes: int
    handle: Any = None


class _Ring:
    """``slots`` slots of ``slot_bytes`` each in one mapping, after a flag byte per slot."""

    def __init__(self, fd: int, slot_bytes: int, slots: int, *, populate: bool = False) -> None:
        self.size = _HEADER + slot_bytes * slots
        self.slot_bytes, self.slots = slot_bytes, slots
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        memory = mmap.mmap(fd, self.size, flags=flags)
        self.flags = np.frombuffer(memory, dtype=np.uint8, count=slots)
        self.data = np.frombuffer(memory, dtype=np.uint8, count=slot_bytes * slots, offset=_HEADER).reshape(
            slots, slot_bytes
        )


class _OwnRing(_Ring):
    """The calling worker's ring: made, filled, and sent once."""

    def __init__(self, slot_bytes: int, slots: int, key: tuple[int, int, int]) -> None:
        fd = os.memfd_create("arrowstream-slots", os.MFD_CLOEXEC)
        try:
            os.posix_fallocate(fd, 0, _HEADER + slot_bytes * slots)  # ENOSPC/ENOMEM now, not SIGBUS later
            super().__init__(fd, slot_bytes, slots)
            self.handle: Any = reduction.DupFd(fd)  # a duplicate, fetched by the main process once; None once sent
        finally:
            os.close(fd)
        self.key = key
        self._next = 0

    def take(self) -> int | None:
        """Mark the first free slot from the last one taken on as held and return it (``None``: all are held)."""
        for i in range(self.slots):
            slot = (self._next + i) % self.slots
            if not self.flags[slot]:
                self.flags[slot] = 1
                self._next = slot + 1
                return slot
        return None


_lock = threading.Lock()
_own: _OwnRing | None = None
_own_pid = -1
_no_ring_pid = -1  # a process where a ring could not be made: it does not try again
_nonce = 0
_serials = itertools.count()


def _slot_size(nbytes: int) -> tuple[int, int] | None:
    """Return ``(slot_bytes, slots)`` for batches of ``nbytes`` (the next power of two), or ``None``: too large."""
    slot_bytes = max(_SLOT_LEAST, 1 << max(0, nbytes - 1).bit_length())
    slots = min(SLOTS_MOST, RING_MOST // slot_bytes)
    return (slot_bytes, slots) if slots >= 2 else None


def _ring_for(nbytes: int) -> _OwnRing | None:
    """This process's ring with slots of at least ``nbytes``: made, or made larger, as needed (``None``: not possible)."""
    global _own, _own_pid, _no_ring_pid, _nonce
    pid = os.getpid()
    if _no_ring_pid == pid:
        return None
    if _own_pid != pid:  # a new process (a worker forked from one that had a ring has its own)
        _own, _own_pid, _nonce = None, pid, int.from_bytes(os.urandom(4), "little")
    if _own is not None and nbytes <= _own.slot_bytes:
        return _own
    sized = _slot_size(nbytes)
    if sized is None:
        counts["too_large"] += 1
        return None
    try:
        _own = _OwnRing(*sized, key=(pid, _nonce, next(_serials)))
    except OSError:  # no memory to reserve, or no memfd in this kernel: the other ways still work
        _no_ring_pid, _own = pid, None
        counts["no_ring"] += 1
        return None
    counts["rings"] += 1
    return _own


def place(buffer: np.ndarray) -> Where | None:
    """Copy ``buffer`` (a flat ``uint8`` array) into a free slot of this worker's ring; return where it waits.

    ``None`` when it cannot (every slot held, the batch too large for a ring,
    or no ring on this machine): send the batch another way.

    Examples
    --------
    On Linux (here the worker and the main process are one):

    >>> import numpy as np
    >>> where = place(np.arange(10, dtype=np.uint8))
    >>> where.nbytes, where.slot_bytes >= 65536, where.slot < where.slots
    (10, True, True)
    >>> view = take_out(where)
    >>> view.tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    >>> del view  # the slot is free again
    """
    if not available():
        return None
    with _lock:
        ring = _ring_for(buffer.nbytes)
        if ring is None:
            return None
        slot = ring.take()
        if slot is None:
            counts["full"] += 1
            return None
        np.copyto(ring.data[slot, : buffer.nbytes], buffer)
        handle, ring.handle = ring.handle, None  # with the first batch placed in this ring only
        counts["placed"] += 1
        return Where(ring.key, ring.size, ring.slot_bytes, ring.slots, slot, buffer.nbytes, handle)


class SlotError(ArrowStreamError):
    """A batch names a slot of a ring this process never received."""


_received: dict[tuple[int, int, int], _Ring] = {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited: a child of this process once it can be waited for, any other once gone.

    (A killed worker's main thread is a zombie before its other threads are
    gone; only then does the DataLoader, which waits for it, see it dead.)
    """
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # not this process's child, or reaped already
        return not _alive(pid)


def _receive(where: Where) -> None:
    """Map the ring ``where`` brings and keep it; forget rings of exited workers and rings a worker replaced.

    Raises
    ------
    SlotError
        The worker could not hand the ring's descriptor over: it was killed
        (or exited) after sending the batch. Raised once the worker is seen
        gone (up to 5 s), so the DataLoader, which checks its workers when
        receiving fails, reports the dead worker.
    """
    pid = where.ring[0]
    try:
        fd = where.handle.detach()
    except (OSError, EOFError) as exc:  # its resource sharer went with it
        deadline = time.monotonic() + 5.0
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        raise SlotError(
            f"could not fetch the shared memory of DataLoader worker pid {pid} that a batch waits in "
            f"({exc!r}): the worker exited after sending it"
        ) from exc
    try:
        ring = _Ring(fd, where.slot_bytes, where.slots, populate=True)
    finally:
        os.close(fd)
    nonce, serial = where.ring[1:]
    for key in list(_received):
        if (key[:2] == (pid, nonce) and key[2] < serial) or not _alive(key[0]):
            del _received[key]  # batches still viewing its slots keep the mapping
    _received[where.ring] = ring


def _free(flags: np.ndarray, slot: int, pid: int) -> None:
    if os.getpid() == pid:  # not in a process forked from this one, where the batch still lives
        flags[slot] = 0


def take_out(where: Where) -> np.ndarray:
    """Return the ``uint8`` array that views the batch waiting ``where``; its slot is freed when the array is gone.

    Raises
    ------
    SlotError
        ``where`` names a ring whose descriptor never reached this process
        (a batch unpickled twice, or in another process than the DataLoader's).
    """
    with _lock:
        if where.handle is not None:
            _receive(where)
        ring = _received.get(where.ring)
        counts["taken_out"] += 1
    if ring is None:
        raise SlotError(
            f"a batch waits in slot {where.slot} of the ring {where.ring} (worker pid, nonce, serial), "
            "which this process never received: such a batch is taken out once, by the process "
            "that iterates the DataLoader. Pass `sharing=\"pipe\"` to `to_torch` to send batches as bytes"
        )
    view = ring.data[where.slot, : where.nbytes]
    weakref.finalize(view, _free, ring.flags, where.slot, os.getpid())
    return view
