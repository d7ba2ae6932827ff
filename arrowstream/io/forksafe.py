"""A filesystem that each process uses its own of: made again, from the same options, in a process forked since.

DataLoader workers are forked from the training process by default, with
every object the dataset holds. An async fsspec filesystem (s3fs, gcsfs,
adlfs...) refuses to be used there ("This class is not fork-safe"). A
pyarrow one (S3, GCS...) goes on working but keeps the connections it had
opened, which every forked worker then shares: two workers' requests on one
connection get each other's answers (an object's size, ETag or bytes for
another read). :class:`PerProcess` hands out the filesystem it was given in
the process that gave it, and in any other process one made again from the
same options, once: an fsspec one from its arguments (``storage_args``,
``storage_options``; attributes set on the object afterwards are not carried
over), a pyarrow one by pickling it (its options, not its connections). A
local filesystem holds no connection and is handed out as it is.

:func:`for_a_process_here` tells whether a pickle being made starts a
process on this machine. :func:`new_locks_in_forked_children` gives a
module's locks back free in every forked child.
"""

from __future__ import annotations

import multiprocessing.context
import os
import pickle
import threading
from typing import Any

import pyarrow.fs as pafs

__all__ = ["PerProcess", "for_a_process_here", "new_locks_in_forked_children"]


class PerProcess:
    """Holds a filesystem and hands each process its own (see the module's docstring).

    Examples
    --------
    >>> local = pafs.LocalFileSystem()
    >>> held = PerProcess(local)
    >>> held.get() is local
    True
    """

    __slots__ = ("_fs", "_pid")

    def __init__(self, fs: pafs.FileSystem) -> None:
        self._fs = fs
        self._pid = os.getpid()

    def get(self) -> pafs.FileSystem:
        """Return this process's filesystem, made again once if this process is not the one that was given it."""
        fs = self._fs
        inner = fsspec_of(fs)
        if inner is not None and getattr(inner, "_pid", None) not in (None, os.getpid()):
            fresh = type(inner)(*inner.storage_args, **inner.storage_options)
            self._fs = fs = pafs.PyFileSystem(pafs.FSSpecHandler(fresh))
        elif self._pid != os.getpid() and inner is None and not isinstance(fs, pafs.LocalFileSystem):
            self._fs = fs = _remade(fs)
        self._pid = os.getpid()
        return fs


def fsspec_of(fs: pafs.FileSystem) -> Any:
    """The fsspec filesystem inside ``fs`` (pyarrow's wrapper of one), or ``None``."""
    return getattr(getattr(fs, "handler", None), "fs", None)


def _remade(fs: pafs.FileSystem) -> pafs.FileSystem:
    """A new ``fs`` from the same options, so this process opens connections of its own (``fs`` if it cannot be)."""
    try:
        return pickle.loads(pickle.dumps(fs))  # noqa: S301 - our own object, in this process
    except Exception:  # noqa: BLE001 - a filesystem pyarrow cannot pickle: used as it is, as before
        return fs


def for_a_process_here() -> bool:
    """Whether this pickle starts a process on this machine (``spawn`` or ``forkserver``: a DataLoader worker).

    ``multiprocessing`` pickles a new process's arguments while it knows that
    process (``get_spawning_popen``). Such a pickle is read moments later on
    the same machine: a pickled dataset then names its local records file
    alone (:mod:`arrowstream.io.footerfile`), and the PyTorch adapter sends
    its shared flag along. Any other pickle may be read on another machine,
    or a week later.

    Examples
    --------
    >>> for_a_process_here()
    False
    """
    spawning = getattr(multiprocessing.context, "get_spawning_popen", None)
    return spawning is not None and spawning() is not None


def new_locks_in_forked_children(namespace: dict[str, Any], *names: str) -> None:
    """Make the globals ``names`` of a module (its ``globals()``, ``namespace``) new, free locks in every child forked from now on.

    A child forked while another thread held one (a DataLoader worker forked
    while a thread of the trainer stores a verdict or loads a tokenizer)
    would wait forever for a release no thread of its own will make.

    Examples
    --------
    >>> import threading
    >>> space = {"_lock": threading.Lock()}
    >>> new_locks_in_forked_children(space, "_lock")   # a fork now leaves the child's lock free
    """

    def fresh() -> None:
        for name in names:
            namespace[name] = threading.Lock()

    os.register_at_fork(after_in_child=fresh)
