"""The parsed footers of a pickled remote dataset, kept in a local file for the processes that unpickle it.

A dataset keeps every file's parsed Parquet footer, so that opening a file
reads no footer: on an object store, no request. A DataLoader worker started
by ``spawn`` or ``forkserver`` (the default on Linux from Python 3.14)
receives the dataset through a pipe, and the parent's ``start()`` of each
worker waits until that worker, its imports done, has read all of it once
it outgrows the pipe's 64 KB: with footers of tens of KB a file, workers
started one after another. A local dataset leaves its footers out of the
pickle and reads them again (a millisecond each); on an object store that
would be a request per file and worker. So a remote dataset's footers,
past :data:`INLINE_BYTES`, go to a file under the cache directory
(``footers/<sha256>.pickle``, :mod:`arrowstream.io.cachedir`) and the pickle
names it.

Invariants: the file is named by the SHA-256 of its bytes, and a reader
checks it before unpickling, so it loads exactly the footers the parent
pickled (a file replaced by anyone else's bytes is never unpickled); a file
missing, cut or changed counts as none (the footers are read again from the
store, each checked against the digest taken at discovery); a directory that
cannot be written keeps the footers in the pickle, as before.

Examples
--------
>>> import tempfile
>>> from pathlib import Path
>>> where = Path(tempfile.mkdtemp())
>>> name = keep_footers(b"the pickled footers", where)
>>> load_footers(name, where)
b'the pickled footers'
>>> (where / name).write_bytes(b"other bytes") and load_footers(name, where) is None
True
"""

from __future__ import annotations

import hashlib
import os
import pickle
import threading
from pathlib import Path
from typing import Any

from arrowstream.io.cachedir import default_cache_root

__all__ = ["INLINE_BYTES", "footer_dir", "footer_lock", "footers_from", "keep_footers", "keep_pickled_footers", "load_footers"]

#: Pickled footers up to this size travel in the pickle itself (they fit a pipe's buffer with the rest).
INLINE_BYTES = 32 << 10


def footer_dir() -> Path | None:
    """Where pickled footers are kept: ``footers/`` under the cache directory (``None`` when it is off)."""
    root = default_cache_root()
    return None if root is None else root / "footers"


def keep_footers(data: bytes, where: Path) -> str | None:
    """Write ``data`` (pickled footers) to ``where`` under its SHA-256; return the file's name, ``None`` if it cannot be."""
    name = f"{hashlib.sha256(data).hexdigest()}.pickle"
    path = where / name
    try:
        if path.is_file() and load_footers(name, where) is not None:
            return name  # kept before, whole (for this dataset's earlier workers, say)
        where.mkdir(parents=True, exist_ok=True)
        tmp = where / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        return None
    return name


def load_footers(name: str, where: Path) -> bytes | None:
    """Return the bytes kept as ``name`` in ``where`` if their SHA-256 is in the name, else ``None``."""
    try:
        data = (where / name).read_bytes()
    except OSError:
        return None
    return data if f"{hashlib.sha256(data).hexdigest()}.pickle" == name else None


def keep_pickled_footers(metas: list[Any]) -> tuple[str, str] | None:
    """Keep a dataset's parsed footers (one per file) in a local file if pickled they pass :data:`INLINE_BYTES`.

    Returns the file's name and directory, for the pickle to carry, or
    ``None``: the footers travel in the pickle (few, none parsed, or no
    writable cache directory).
    """
    where = footer_dir()
    if where is None or all(meta is None for meta in metas):
        return None
    data = pickle.dumps(metas, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) <= INLINE_BYTES:
        return None
    name = keep_footers(data, where)
    return None if name is None else (name, str(where))


def footers_from(kept: tuple[str, str] | None, count: int) -> list[Any]:
    """The ``count`` footers :func:`keep_pickled_footers` kept as ``kept``; ``[]`` if there are none, or not those."""
    data = None if kept is None else load_footers(kept[0], Path(kept[1]))
    metas = [] if data is None else pickle.loads(data)  # its SHA-256 is the one the pickle named
    return metas if isinstance(metas, list) and len(metas) == count else []


_lock = threading.Lock()


def footer_lock() -> threading.Lock:
    """The lock under which a dataset takes its kept footers (one thread reads the file; the others wait for it)."""
    return _lock


def _fresh_lock_after_fork() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_after_fork)
