"""The built-in checks of an encoder, run beside the stream, by one process of a machine at a time.

When an encoder's document sample ends with no verdict stored, its built-in
checks (:mod:`arrowstream.tokenize.proof`: every vocabulary token and the
probe set through every backend) must run before tokie or tiktoken may
encode. At a 128k vocabulary they take 2-3 s; run inline they held up the
stream that ended the sample. In a process with several consumers that is
every DataLoader worker's, and before its first batch, since the plan's
token sample (:func:`~arrowstream.distributed.balance.measure_sample`) is
the first megabyte each consumer encodes; and each worker ran the same
checks at once, on the same cores.

So :func:`checks_beside` runs them in a thread of their own while the
encoder goes on returning the reference's ids, and takes a lock file,
``<key>.lock`` in the verdicts' directory, for as long as they run: another
process that ends its sample meanwhile (the other DataLoader workers, the
other ranks of a node) finds the lock held and keeps the reference's ids
until the verdict appears in the directory, instead of running the same
checks beside them.

Invariants:

- the lock is a POSIX record lock (``fcntl.lockf``): the operating system
  releases it when its process ends, however it ends, so a process killed
  mid-check never blocks the others: the next one to look takes the lock and
  runs the checks itself; a process waits at most :data:`WAIT_S` for
  another's verdict before running its own;
- a process runs the checks of one key once at a time, whichever of its
  encoders asked (a mixture's sources sharing a tokenizer); a forked child
  (a DataLoader worker) inherits neither the parent's thread nor its lock,
  and waits for the verdict the parent stores like any other process;
- a directory where the lock file cannot be made (read-only, or
  ``cache_dir=None``) leaves each process to run its own checks, as before;
- a process that ends while its checks run waits for them, at most
  :data:`EXIT_WAIT_S`, so that the verdict is stored for the next one.

Thread safety: the runs of the process are kept under a module lock, made
anew in a forked child.

Examples
--------
>>> import tempfile, threading
>>> from pathlib import Path
>>> where = Path(tempfile.mkdtemp())
>>> ran = threading.Event()
>>> run = checks_beside("0123abcd", where, ran.set)
>>> run.here, run.wait(), ran.is_set(), (where / "0123abcd.lock").exists()
(True, True, True, True)
>>> checks_beside("0123abcd", where, ran.set).here   # done: a new run, the lock free again
True
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from arrowstream.io.forksafe import new_locks_in_forked_children

__all__ = ["EXIT_WAIT_S", "WAIT_S", "ChecksRun", "checks_beside", "lock_path"]

#: Longest a process keeps the reference's ids while another process holds the checks' lock;
#: then it runs the checks itself (at 128k tokens they take 2-3 s).
WAIT_S = 60.0
#: Longest a process that ends waits for the checks it is running, so their verdict is stored.
EXIT_WAIT_S = 30.0


class ChecksRun:
    """The checks of one key: running in a thread of this process (:attr:`here`), or in another process.

    Examples
    --------
    >>> elsewhere = ChecksRun("k", here=False)
    >>> elsewhere.here, elsewhere.done()
    (False, False)
    """

    def __init__(self, key: str, *, here: bool, lock_fd: int | None = None) -> None:
        self.key = key
        self.here = here
        self.pid = os.getpid()
        self.error: BaseException | None = None  # what the checks raised, raised again in the stream
        self._fd = lock_fd
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, work: Callable[[], object]) -> None:
        """Run ``work`` in a daemon thread; the lock is released when it returns or raises."""
        self._thread = threading.Thread(target=self._run, args=(work,), name="arrowstream-checks", daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], object]) -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - kept for the stream, which raises it
            self.error = exc
        finally:
            self._release()
            self._finished.set()

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the record lock
            self._fd = None

    def live(self) -> bool:
        """Whether this run belongs to this process (a forked child's copy is not running)."""
        return self.pid == os.getpid()

    def done(self) -> bool:
        """Whether the checks have finished here (always ``False`` for another process's)."""
        return self.here and self.live() and self._finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the checks running here; return whether they finished (``False`` for another process's)."""
        return self.here and self.live() and self._finished.wait(timeout)


_lock = threading.Lock()
_runs: dict[str, ChecksRun] = {}  # this process's runs, by key
_waiting_since: dict[str, tuple[int, float]] = {}  # key: (pid, when this process first found the lock held)
_exit_hook = False


new_locks_in_forked_children(globals(), "_lock")


def checks_beside(key: str, cache_dir: Path | None, work: Callable[[], object]) -> ChecksRun:
    """Make sure the checks of ``key`` run: join this process's run, find another process's, or start ``work``.

    ``work`` computes the verdict and stores it (in the process and in
    ``cache_dir``); it runs in a thread of its own, holding ``<key>.lock``.

    Returns
    -------
    ChecksRun
        This process's run (``here``), or a handle on another process's,
        which holds the lock (``here`` is ``False``): wait for its verdict
        in ``cache_dir`` and call again, which runs the checks here once
        the lock is free, or :data:`WAIT_S` after the lock was first found
        held.
    """
    global _exit_hook
    pid = os.getpid()
    with _lock:
        run = _runs.get(key)
        if run is not None and run.live() and not run._finished.is_set():
            return run
        fd = _try_lock(key, cache_dir)
        if fd == -1:  # held by another process
            since = _waiting_since.get(key)
            if since is None or since[0] != pid:
                since = _waiting_since[key] = (pid, time.monotonic())
            if time.monotonic() - since[1] < WAIT_S:
                return ChecksRun(key, here=False)
            fd = None  # waited long enough: run them here too
        _waiting_since.pop(key, None)
        run = _runs[key] = ChecksRun(key, here=True, lock_fd=fd)
        if not _exit_hook:
            atexit.register(_wait_at_exit)
            _exit_hook = True
    run.start(work)
    return run


def _try_lock(key: str, cache_dir: Path | None) -> int | None:
    """Take ``<key>.lock``: its descriptor, ``-1`` if another process holds it, ``None`` if no lock can be made."""
    if cache_dir is None:
        return None
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path(key, cache_dir), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None  # a directory that cannot be written: every process runs its own checks
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        return -1 if exc.errno in (errno.EACCES, errno.EAGAIN) else None
    return fd


def _wait_at_exit() -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    for run in list(_runs.values()):
        run.wait(max(0.0, deadline - time.monotonic()))


def lock_path(key: str, cache_dir: Path) -> Path:
    """Where the checks of ``key`` take their lock.

    Examples
    --------
    >>> lock_path("0123abcd", Path("/cache/encoders")).name
    '0123abcd.lock'
    """
    return Path(cache_dir) / f"{key}.lock"
