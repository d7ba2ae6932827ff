"""A pickled dataset's file records, kept in a local file for the processes that unpickle it.

A dataset keeps a record of every file (:class:`~arrowstream.io.footer.FileInfo`:
rows, bytes and column sizes per row group, and on an object store the parsed
Parquet footer, so that opening a file there makes no request for it). A
DataLoader worker started by ``spawn`` or ``forkserver`` (the default on Linux
from Python 3.14) receives the dataset through a pipe, and the parent's
``start()`` of each worker waits until that worker, its imports done, has read
all of it once it outgrows the pipe's 64 KB: with a few KB of records a file
(tens of KB with the footers), workers started one after another. So records
that pickle past :data:`INLINE_BYTES` go to a file under the cache directory
(``footers/<sha256>.pickle``, :mod:`arrowstream.io.cachedir`) and the pickle
carries only its name and each file's pin (path, size, footer digest, mtime or
ETag, compressed: some 35-55 bytes a file), or, pickled to start a process on
this machine (:func:`~arrowstream.io.forksafe.for_a_process_here`), only its name.

Invariants: the file is named by the SHA-256 of its bytes, and a reader
checks it before unpickling, so it loads exactly the records the parent
pickled (a file replaced by anyone else's bytes is never unpickled); a file
missing, cut or changed counts as none (the manifest then makes the
records again from its manifest file or the files' footers, checked against
what discovery found; a process started here with the name alone stops with
:func:`records_gone`); a directory that cannot be written keeps the
records in the pickle; a kept file neither written nor reused for a week
(:data:`KEEP_S`) is removed when another is written.

Examples
--------
>>> import tempfile
>>> from pathlib import Path
>>> where = Path(tempfile.mkdtemp())
>>> name = keep_bytes(b"the pickled records", where)
>>> load_bytes(name, where)
b'the pickled records'
>>> (where / name).write_bytes(b"other bytes") and load_bytes(name, where) is None
True
"""

from __future__ import annotations

import hashlib
import os
import pickle
import threading
import time
from pathlib import Path
from typing import Any

from arrowstream.errors import ShardError
from arrowstream.io.cachedir import CACHE_ENV, default_cache_root

__all__ = ["INLINE_BYTES", "KEEP_S", "keep_bytes", "keep_pickled", "load_bytes", "records_dir", "records_from", "records_gone"]

#: Pickled records up to this size travel in the pickle itself (they fit a pipe's buffer with the rest).
INLINE_BYTES = 32 << 10

#: A kept file neither written nor reused for this long (a week) is removed when another is written.
KEEP_S = 7 * 24 * 3600


def records_dir() -> Path | None:
    """Where pickled records are kept: ``footers/`` under the cache directory (``None`` when it is off)."""
    root = default_cache_root()
    return None if root is None else root / "footers"


def keep_bytes(data: bytes, where: Path) -> str | None:
    """Write ``data`` (pickled records) to ``where`` under its SHA-256; return the file's name, ``None`` if it cannot be."""
    name = f"{hashlib.sha256(data).hexdigest()}.pickle"
    path = where / name
    try:
        if path.is_file() and load_bytes(name, where) is not None:
            os.utime(path)  # reused: it stays another KEEP_S
            return name  # kept before, whole (for this dataset's earlier workers, say)
        where.mkdir(parents=True, exist_ok=True)
        tmp = where / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        return None
    _prune(where)
    return name


def _prune(where: Path) -> None:
    """Remove the kept files (and a crashed writer's temporary files) not written or reused for :data:`KEEP_S`.

    A file removed while a process still needed it costs that process time,
    never correctness: its records are made again from the files.
    """
    old = time.time() - KEEP_S
    try:
        entries = list(os.scandir(where))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.name.endswith((".pickle", ".tmp")) and entry.stat().st_mtime < old:
                os.unlink(entry.path)
        except OSError:
            pass  # gone already (another process pruned it), or not ours to remove


def load_bytes(name: str, where: Path) -> bytes | None:
    """Return the bytes kept as ``name`` in ``where`` if their SHA-256 is in the name, else ``None``."""
    try:
        data = (where / name).read_bytes()
    except OSError:
        return None
    return data if f"{hashlib.sha256(data).hexdigest()}.pickle" == name else None


def keep_pickled(records: tuple[Any, ...]) -> tuple[str, str] | None:
    """Keep a dataset's file records in a local file if pickled they pass :data:`INLINE_BYTES`.

    Returns the file's name and directory, for the pickle to carry, or
    ``None``: the records travel in the pickle (they are few, or there is no
    writable cache directory).
    """
    where = records_dir()
    if where is None:
        return None
    data = pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) <= INLINE_BYTES:
        return None
    name = keep_bytes(data, where)
    return None if name is None else (name, str(where))


def records_gone(kept: tuple[str, str], num_files: int) -> ShardError:
    """The error of a process started here that found the records it was sent for gone or changed."""
    return ShardError(
        f"the records of the dataset's {num_files:,} files, kept for this process in "
        f"{os.path.join(kept[1], kept[0])!r} by the one that started it, are gone or changed: the pickle "
        "that started this process names that file instead of every file. Keep the cache directory "
        f"({CACHE_ENV}) while the processes it starts run, or read the dataset from a manifest file (`manifest=`)"
    )


def records_from(kept: tuple[str, str]) -> tuple[Any, ...] | None:
    """The records :func:`keep_pickled` kept as ``kept``; ``None`` if the file is gone or not those bytes."""
    data = load_bytes(kept[0], Path(kept[1]))
    records = None if data is None else pickle.loads(data)  # its SHA-256 is the one the pickle named
    return records if isinstance(records, tuple) else None
