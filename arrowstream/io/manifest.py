"""Discovery: turn a path, glob, list or URI into a manifest of row-group shards.

A :class:`Manifest` lists every non-empty row group of every Parquet file as one
shard, in a deterministic order (files sorted by their path relative to the
source root, row groups in file order). Only footers are read, in parallel
threads. The manifest's :attr:`~Manifest.fingerprint` identifies the data
(relative paths, file sizes, row counts per row group), so a
saved position can never be applied to other data by mistake.

Invariants: the same files give the same manifest and fingerprint, wherever the
dataset root lives (paths in the fingerprint are relative to the root). A
manifest is immutable and picklable (it travels to DataLoader workers).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from arrowstream.errors import ConfigError, ShardError
from arrowstream.io.discover import discover, resolve_filesystem
from arrowstream.io.forksafe import PerProcess, for_a_process_here
from arrowstream.io.footer import FileInfo, FilePin, entity_tag, read_footer, reread_footer, reread_info
from arrowstream.io.footerfile import keep_pickled, records_from, records_gone
from arrowstream.io.schema import check_schemas, normalize_type
from arrowstream.io.statistics import matching_row_groups

__all__ = ["Manifest", "Shard", "normalize_type", "read_manifest", "resolve_filesystem"]

_MAX_FOOTER_THREADS = 16


@dataclass(frozen=True, slots=True)
class Shard:
    """One row group of one file: the unit of reading, shuffling and assignment.

    Attributes
    ----------
    index : int
        Position of the shard in the manifest.
    path : str
        File path as the filesystem understands it.
    row_group : int
        Row-group index inside the file.
    num_rows : int
        Rows in the row group.
    num_bytes : int
        Uncompressed size of the row group as the footer states it.
    """

    index: int
    path: str
    row_group: int
    num_rows: int
    num_bytes: int


class Manifest:
    """The row-group shards of a Parquet dataset and the fingerprint of its data.

    Build one with :func:`read_manifest`; the library's entry point
    :func:`arrowstream.read_parquet` does so for you.

    Attributes
    ----------
    filesystem : pyarrow.fs.FileSystem
        Where the files live.
    root : str
        The directory the relative paths are taken from.
    paths : tuple[str, ...]
        Every file holding at least one non-empty row group, in order.
    schema : pyarrow.Schema
        The selected columns that agree across files, with string and list
        types normalised (``large_string`` reads as ``string``, ``large_list``
        as ``list``).
    drift : dict[str, str]
        With ``columns=None``: columns that are missing from some file or
        change type, with a message naming the files. Using one is an error.
    fingerprint : str
        Hash of relative paths, file sizes and row counts per row group.

    Examples
    --------
    >>> from arrowstream.testing import example_dir
    >>> m = read_manifest(example_dir(row_group_size=5))
    >>> m.num_shards, m.num_rows, [s.num_rows for s in m.shards]
    (3, 12, [5, 5, 2])
    """

    def __init__(
        self,
        *,
        filesystem: pafs.FileSystem,
        root: str,
        files: Sequence[FileInfo],
        schema: pa.Schema,
        drift: dict[str, str] | None = None,
        num_empty_files: int,
        num_empty_row_groups: int,
    ) -> None:
        self._filesystem = PerProcess(filesystem)
        self.root = root
        self.schema = schema
        self.drift = dict(drift or {})
        self.num_empty_files = num_empty_files
        self.num_empty_row_groups = num_empty_row_groups
        self._files = tuple(files)
        self._origin: str | None = None  # the manifest file it was read from, if any
        self._index_files()
        self.fingerprint = _fingerprint(self._files)
        self.contents = _contents(self._files)
        self._identity = {
            "fingerprint": self.fingerprint,
            "contents": self.contents,
            "num_files": len(self._files),
            "num_shards": int(self.shard_rows.size),
            "num_rows": int(self.shard_rows.sum()),
        }

    def _index_files(self) -> None:
        """The files' paths, and the non-empty row groups' file, row group, rows and bytes as arrays (made again when unpickled)."""
        self.paths = tuple(f.path for f in self._files)
        self._by_path = {f.path: i for i, f in enumerate(self._files)}
        self.relpaths = tuple(f.relpath for f in self._files)
        counts = [np.asarray(f.row_counts, dtype=np.int64) for f in self._files]
        keep = [c > 0 for c in counts]
        self.shard_file = np.concatenate([np.full(int(k.sum()), i, np.int64) for i, k in enumerate(keep)] or [np.empty(0, np.int64)])
        self.shard_row_group = np.concatenate([np.flatnonzero(k) for k in keep] or [np.empty(0, np.int64)]).astype(np.int64)
        self.shard_rows = np.concatenate([c[k] for c, k in zip(counts, keep)] or [np.empty(0, np.int64)])
        self.shard_bytes = np.concatenate(
            [np.asarray(f.row_bytes, dtype=np.int64)[k] for f, k in zip(self._files, keep)] or [np.empty(0, np.int64)]
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        kept = state.pop("_kept_files", None)
        self.__dict__.update(state)
        if kept is not None:  # the records are in a local file; the pickle has the files' pins, the manifest file or none
            self._files = records_from(kept) or self._reread(self._files, kept)
        self._index_files()

    def _reread(self, packed: bytes | None, kept: tuple[str, str]) -> tuple[FileInfo, ...]:
        """The files' records made again (the local file is gone or changed): from each file's footer, else the manifest file."""
        if packed is not None:
            pins: tuple[FilePin, ...] = pickle.loads(zlib.decompress(packed))  # from this pickle's own state
            with ThreadPoolExecutor(max_workers=min(_MAX_FOOTER_THREADS, len(pins))) as pool:
                return tuple(pool.map(lambda pin: reread_info(self.filesystem, pin), pins))
        if self._origin is None:  # pickled to start a process on this machine, which found the file gone
            raise records_gone(kept, self._identity["num_files"])
        from arrowstream.io.manifest_file import load_manifest_files

        files = tuple(f for f in load_manifest_files(self._origin, self.root, self.filesystem) if any(f.row_counts))
        if _fingerprint(files) != self.fingerprint or _contents(files) != self.contents:
            raise ShardError(
                f"manifest file {self._origin!r} changed since the dataset was opened: it describes other files "
                "(paths, sizes, row counts or footers); open the dataset again"
            )
        return files

    @property
    def num_shards(self) -> int:
        """Number of non-empty row groups."""
        return int(self.shard_rows.size)

    @property
    def num_rows(self) -> int:
        """Rows over all shards."""
        return int(self.shard_rows.sum())

    @property
    def num_files(self) -> int:
        """Files holding at least one non-empty row group."""
        return len(self._files)

    def column_bytes(self, columns: Sequence[str]) -> np.ndarray:
        """Return, per shard, the uncompressed bytes of ``columns`` as the footers state them (no read).

        Examples
        --------
        >>> from arrowstream.testing import example_dir
        >>> m = read_manifest(example_dir())
        >>> (m.column_bytes(["n", "text"]) == m.column_bytes(["n"]) + m.column_bytes(["text"])).all()
        np.True_
        """
        wanted = set(columns)
        per_file = [
            [sum(n for name, n in rg.items() if name in wanted) for rg in f.column_bytes] for f in self._files
        ]
        return np.array(
            [per_file[int(f)][int(rg)] for f, rg in zip(self.shard_file, self.shard_row_group)],
            dtype=np.float64,
        )

    def list_values(self, column: str) -> np.ndarray | None:
        """Return, per shard, the elements of list column ``column`` as the footers count them (no read).

        For a column of token ids, the tokens of each row group. ``None`` when
        ``column`` is not a list of primitive values, or a footer lacks the
        null count the figure needs (a null or empty list takes one leaf slot,
        counted as a null).

        Examples
        --------
        >>> from arrowstream.testing import example_dir
        >>> read_manifest(example_dir()).list_values("ids").tolist()   # lengths 3, 1, 2, 4 repeating
        [10, 10, 10]
        """
        counts = self._list_counts(column)
        return None if counts is None else counts[:, 0].copy()

    def list_empty_rows(self, column: str) -> np.ndarray | None:
        """Return, per shard, the rows of list column ``column`` holding a null or empty list (no read).

        Exact when no list holds a null element (token ids never do: a null id
        is an error when read). ``None`` as for :meth:`list_values`.
        """
        counts = self._list_counts(column)
        return None if counts is None else counts[:, 1].copy()

    def _list_counts(self, column: str) -> np.ndarray | None:
        per_file = [[rg.get(column) for rg in f.list_values] for f in self._files]
        counts = [per_file[int(f)][int(rg)] for f, rg in zip(self.shard_file, self.shard_row_group)]
        if any(c is None for c in counts):
            return None
        return np.array(counts, dtype=np.int64).reshape(-1, 2)

    def matching_shards(self, expr: pc.Expression) -> np.ndarray:
        """Return a mask over shards, false where the footers' statistics prove ``expr`` true in no row.

        Nothing is read: the statistics were kept when the footers were (see
        :mod:`arrowstream.io.statistics`).

        Examples
        --------
        >>> import pyarrow.compute as pc
        >>> from arrowstream.testing import example_dir
        >>> read_manifest(example_dir()).matching_shards(pc.field("n") < 4).tolist()  # n: 0-3, 4-7, 8-11
        [True, False, False]
        """
        keep = [matching_row_groups(self._parsed(i).statistics, expr) for i in range(len(self._files))]
        return np.array(
            [int(rg) in keep[int(f)] for f, rg in zip(self.shard_file, self.shard_row_group)], dtype=bool
        )

    @property
    def file_sizes(self) -> tuple[int, ...]:
        """Size in bytes of each file, in order."""
        return tuple(f.size for f in self._files)

    def file_identity(self, index: int) -> dict[str, Any]:
        """Return what identifies file ``index``'s data: relative path, size, rows per row group, footer.

        ``footer`` is a digest of the file's Parquet footer, which records the
        sizes, offsets and statistics of every column chunk: a file rewritten
        with the same size and row counts almost always changes it. A rewrite
        that leaves every chunk's sizes and statistics the same (say, one
        letter changed inside a document, without compression) still goes
        unseen; only reading the data could tell.
        """
        f = self._files[index]
        return {"relpath": f.relpath, "size": f.size, "row_counts": list(f.row_counts), "footer": f.footer}

    def footer(self, path: str) -> pq.FileMetaData | None:
        """Return file ``path``'s parsed footer, kept from discovery or a manifest file (``None`` if not kept)."""
        return self._parsed(self._by_path[path]).meta

    def _parsed(self, index: int) -> FileInfo:
        """File ``index``'s record with its parsed footer, read again where a pickle left it out (checked against its digest)."""
        f = self._files[index]
        if f.meta is None:
            object.__setattr__(f, "meta", reread_footer(self.filesystem, f))
        return f

    def __getstate__(self) -> dict[str, Any]:
        # Small, for spawned DataLoader workers (docs/storage.md): a local footer is read again when
        # needed; records past 32 KB go through a local file (io/footerfile.py).
        derived = ("paths", "relpaths", "_by_path", "shard_file", "shard_row_group", "shard_rows", "shard_bytes")
        state = {name: value for name, value in self.__dict__.items() if name not in derived}
        files = self._files
        if isinstance(self._filesystem.get(), pafs.LocalFileSystem):
            files = tuple(f.without_footer() for f in files)
        kept = keep_pickled(files)
        if kept is not None:  # the files' pins (compressed, 35-55 bytes a file) unless the manifest file or a process here reads them
            pins = None if self._origin is not None or for_a_process_here() else tuple(f.pin() for f in files)
            files = None if pins is None else zlib.compress(pickle.dumps(pins, protocol=pickle.HIGHEST_PROTOCOL))
            state["_kept_files"] = kept
        state["_files"] = files
        return state

    @property
    def filesystem(self) -> pafs.FileSystem:
        """The dataset's filesystem; in a process forked since, a remote one made again (:class:`~arrowstream.io.forksafe.PerProcess`)."""
        return self._filesystem.get()

    def check_pin(self, path: str, handle: Any) -> None:
        """Raise :class:`~arrowstream.errors.ShardError` when the open file ``handle`` is not the one discovered.

        Its size must be the recorded one, and so must its ETag (object
        stores that state one) or, on a local disk, its modification time:
        a file replaced, rewritten or cut since the dataset was opened (or
        since its manifest file was written) is refused, never read with
        the old footer.
        """
        f = self._files[self._by_path[path]]
        changes = []
        size = handle.size()
        if size != f.size:
            changes.append(f"its size was {f.size:,} bytes, now {size:,}")
        etag = entity_tag(handle, self.filesystem, path) if f.etag is not None else None
        if etag is not None and etag != f.etag:
            changes.append(f"its ETag was {f.etag}, now {etag}")
        if f.etag is None and f.mtime_ns is not None and isinstance(self.filesystem, pafs.LocalFileSystem):
            try:
                mtime = os.stat(path).st_mtime_ns
            except OSError:
                mtime = None
            if mtime != f.mtime_ns:
                changes.append("its modification time changed")
        if changes:
            raise ShardError(
                f"{path!r} changed since the dataset was opened: {'; '.join(changes)}. Reading it would mix "
                "its new bytes with what was recorded of the old ones: open the dataset again (and rebuild "
                "its manifest file, if it has one), or restore the file"
            )

    def shard(self, index: int) -> Shard:
        """Return shard ``index`` as a :class:`Shard`."""
        fi = int(self.shard_file[index])
        return Shard(
            index=int(index),
            path=self._files[fi].path,
            row_group=int(self.shard_row_group[index]),
            num_rows=int(self.shard_rows[index]),
            num_bytes=int(self.shard_bytes[index]),
        )

    @property
    def shards(self) -> list[Shard]:
        """Every shard, in manifest order."""
        return [self.shard(i) for i in range(self.num_shards)]

    def describe(self) -> dict[str, Any]:
        """Return the short identity used in states and error messages."""
        return dict(self._identity)

    def head(self, num_files: int) -> Manifest:
        """Return the manifest of the first ``num_files`` files (a corpus before files were added).

        Files are in path order, so the first ``num_files`` are the ones a
        corpus held before files whose paths sort after them were added; their
        shards keep their indices.

        Examples
        --------
        >>> from arrowstream.testing import example_dir
        >>> m = read_manifest(example_dir())
        >>> m.head(1).fingerprint == m.fingerprint, m.head(1).num_shards
        (True, 3)
        """
        if not 1 <= num_files <= self.num_files:
            raise ValueError(f"num_files should be 1..{self.num_files}, got {num_files}")
        if num_files == self.num_files:
            return self
        return Manifest(
            filesystem=self.filesystem,
            root=self.root,
            files=self._files[:num_files],
            schema=self.schema,
            drift=self.drift,
            num_empty_files=0,
            num_empty_row_groups=0,
        )

    def __repr__(self) -> str:
        return f"Manifest(root={self.root!r}, num_files={self.num_files}, num_shards={self.num_shards}, num_rows={self.num_rows})"


def read_manifest(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    columns: Sequence[str] | None = None,
    filesystem: Any = None,
    manifest: str | os.PathLike[str] | None = None,
) -> Manifest:
    """Discover Parquet files and read their footers into a :class:`Manifest`.

    Parameters
    ----------
    source
        A directory (searched recursively for ``*.parquet``), a glob such as
        ``data/*/part-*.parquet``, one file, a list of files, or a URI such as
        ``s3://bucket/prefix/`` that ``pyarrow.fs`` resolves.
    columns
        Columns that will be read; only their schema must agree across files.
        ``None`` selects every column of the first file.
    filesystem
        A ``pyarrow.fs.FileSystem`` or fsspec filesystem; ``None`` infers it.
    manifest
        A manifest file :func:`~arrowstream.io.manifest_file.write_manifest`
        wrote for ``source`` (a directory or URI prefix; the file local or
        remote): nothing is listed and no footer read.

    Returns
    -------
    Manifest

    Raises
    ------
    ShardError
        A path does not exist, matches no Parquet file, or a file is not
        readable Parquet (the message names the file).
    SchemaError
        A selected column is missing from a file, or its type differs between
        two files (the message names both files and the column).

    Examples
    --------
    >>> from arrowstream.testing import example_dir
    >>> d = example_dir()
    >>> read_manifest(f"{d}/*.parquet").relpaths
    ('a.parquet',)
    """
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not sources:
        raise ShardError("`source` is an empty list: pass at least one Parquet file or directory")
    if manifest is not None:
        from arrowstream.io.manifest_file import load_manifest_files

        if len(sources) != 1 or any(c in os.fspath(sources[0]) for c in "*?["):
            raise ConfigError(
                f"with `manifest=`, `source` is the directory or URI prefix the manifest was written for, "
                f"got {source!r}"
            )
        fs, root = resolve_filesystem(sources[0], filesystem)
        described = _build(fs, root.rstrip("/") or "/", load_manifest_files(manifest, root, filesystem), columns)
        described._origin = os.fspath(manifest)
        return described
    fs, root, pairs = discover(sources, filesystem)
    if not pairs:
        raise ShardError(
            f"no Parquet files found under {os.fspath(sources[0])!r}: expected `*.parquet` files "
            "in the directory, matching the glob, or listed explicitly"
        )
    with ThreadPoolExecutor(max_workers=min(_MAX_FOOTER_THREADS, len(pairs))) as pool:
        infos = list(pool.map(lambda p: read_footer(fs, root, *p), pairs))
    return _build(fs, root, infos, columns)


def _build(fs: pafs.FileSystem, root: str, infos: list[FileInfo], columns: Sequence[str] | None) -> Manifest:
    """Return the manifest of ``infos`` (every file found, empty ones included)."""
    non_empty = [f for f in infos if any(n > 0 for n in f.row_counts)]
    num_empty_files = len(infos) - len(non_empty)
    num_empty_rgs = sum(sum(1 for n in f.row_counts if n == 0) for f in non_empty)
    if not non_empty:
        raise ShardError(
            f"all {len(infos)} Parquet file(s) under {root!r} are empty: there are no rows to read"
        )
    schema, drift = check_schemas(non_empty, columns)
    return Manifest(
        filesystem=fs,
        root=root,
        files=non_empty,
        schema=schema,
        drift=drift,
        num_empty_files=num_empty_files,
        num_empty_row_groups=num_empty_rgs,
    )


def _contents(files: Sequence[FileInfo]) -> str:
    """A digest of every file's Parquet footer (statistics, sizes and offsets of every column chunk).

    Beside the fingerprint (paths, sizes, row counts): a file rewritten with
    other data of the same size and row counts almost always changes it, and
    the same bytes anywhere (another directory, bucket or store) keep it.
    """
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.footer.encode())
    return digest.hexdigest()[:32]


def _fingerprint(files: Sequence[FileInfo]) -> str:
    digest = hashlib.sha256()
    for f in files:
        digest.update(json.dumps([f.relpath, f.size, f.row_counts]).encode())
    return digest.hexdigest()[:32]
