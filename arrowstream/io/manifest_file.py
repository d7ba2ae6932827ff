"""A manifest in one file: what discovery learns, written once, so any number of consumers start without listing or reading footers.

Discovery lists the source and reads every file's footer; with thousands of
files and ranks that is millions of requests at every launch.
:func:`write_manifest` does it once and writes the result to one Parquet
file, one row per data file: ``relpath`` (from the source root), ``size``,
``mtime_ns`` and ``etag`` (what pins its bytes, when known) and ``footer``
(the file's Parquet footer, as a metadata file holds it: row groups, rows,
column sizes, statistics, schema). ``read_parquet(SOURCE, manifest=FILE)``
rebuilds the same :class:`~arrowstream.io.manifest.Manifest` from it: no
LIST, no HEAD per file, no footer read, and the same fingerprint, so states
taken with and without a manifest file are interchangeable.

A large corpus is described by many processes: each writes the part of its
files ``shard=(i, n)`` takes (every ``n``-th file from the ``i``-th, in path
order), and :func:`merge_manifests` joins the parts, checking that they are
the ``n`` parts of one source. Files are written whole: locally to a
temporary name then renamed, on object stores by one upload.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from arrowstream.errors import ConfigError, ShardError
from arrowstream.io.discover import discover, resolve_filesystem
from arrowstream.io.footer import FileInfo, file_info, read_footer
from arrowstream.io.forksafe import fsspec_of
from arrowstream.io.manifest import _MAX_FOOTER_THREADS

__all__ = ["MANIFEST_FORMAT", "load_manifest_files", "merge_manifests", "write_manifest"]

#: The key of the file's metadata that holds its header (JSON); bump ``version`` on any change.
MANIFEST_FORMAT = "arrowstream.manifest"
_VERSION = 1

_SCHEMA = pa.schema([
    ("relpath", pa.string()),
    ("size", pa.int64()),
    ("mtime_ns", pa.int64()),
    ("etag", pa.string()),
    ("footer", pa.binary()),
])


def write_manifest(
    source: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    filesystem: Any = None,
    shard: tuple[int, int] | None = None,
) -> int:
    """Discover ``source`` (a directory or URI prefix) and write its manifest to ``path``; return the files written.

    Parameters
    ----------
    source
        The corpus, as given to :func:`arrowstream.read_parquet`: a directory
        or a URI prefix (``s3://bucket/corpus/``).
    path
        The manifest file to write: a local path or a URI. With
        ``filesystem``, a path whose directory is not on the local disk (or a
        URI of that filesystem's scheme) is written through it.
    filesystem
        A ``pyarrow.fs.FileSystem`` or fsspec filesystem for ``source``.
    shard
        ``(i, n)``: describe only every ``n``-th file from the ``i``-th (in
        path order), a part for :func:`merge_manifests`.

    Examples
    --------
    >>> import tempfile
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> d = example_dir()
    >>> out = f"{tempfile.mkdtemp()}/manifest.parquet"
    >>> write_manifest(d, out)
    1
    >>> read_parquet(d, manifest=out).manifest.fingerprint == read_parquet(d).manifest.fingerprint
    True
    """
    i, n = _check_shard(shard)
    fs, root, found = discover([source], filesystem)
    mine = found[i::n]
    if not mine and n == 1:
        raise ShardError(f"no Parquet files found under {os.fspath(source)!r}: nothing to describe")
    infos: list[FileInfo] = []
    if mine:
        with ThreadPoolExecutor(max_workers=min(_MAX_FOOTER_THREADS, len(mine))) as pool:
            infos = list(pool.map(lambda p: read_footer(fs, root, *p), mine))
    header = {"version": _VERSION, "source": os.fspath(source), "shard": [i, n], "num_files": len(found)}
    _write(path, _table(infos, header), filesystem)
    return len(infos)


def merge_manifests(parts: Sequence[str | os.PathLike[str]], path: str | os.PathLike[str]) -> int:
    """Join the ``n`` parts of a sharded build into one manifest file at ``path``; return its files.

    Raises
    ------
    ShardError
        A part is missing or given twice, or the parts describe different
        sources or were built with different ``n``.
    """
    if not parts:
        raise ConfigError("`merge_manifests` needs the parts to join, got none")
    tables, headers = zip(*(_read(p) for p in parts))
    if any(h["shard"] is None for h in headers):
        raise ShardError("a part given to merge is itself a merged manifest: pass the parts `--shard I/N` wrote")
    ns = {h["shard"][1] for h in headers}
    sources = {h["source"] for h in headers}
    if len(ns) != 1 or len(sources) != 1:
        raise ShardError(
            f"the parts are not of one build: shards of {sorted(ns)} parts, sources {sorted(sources)}; "
            "merge the parts written with one --shard I/N count over one source"
        )
    n = ns.pop()
    seen = sorted(h["shard"][0] for h in headers)
    if seen != list(range(n)):
        raise ShardError(f"a sharded manifest needs parts 0..{n - 1} once each, got parts {seen}: build the missing ones")
    total = {h["num_files"] for h in headers}
    table = pa.concat_tables(tables).sort_by("relpath")
    if len(total) != 1 or table.num_rows != total.pop():
        raise ShardError(
            "the parts describe a different number of files than the source held when each was built: "
            "the source changed during the build; build every part again"
        )
    header = {"version": _VERSION, "source": sources.pop(), "shard": None, "num_files": table.num_rows}
    _write(path, table.replace_schema_metadata({MANIFEST_FORMAT: json.dumps(header)}))
    return table.num_rows


def load_manifest_files(path: str | os.PathLike[str], root: str, filesystem: Any = None) -> list[FileInfo]:
    """Return what the manifest file ``path`` records of every file, with paths under ``root`` (the source given).

    With ``filesystem`` (the data's), a path that is not a local file (or a
    URI of that filesystem's scheme) is read through it.
    """
    table, header = _read(path, filesystem)
    if header.get("shard") is not None and header["shard"][1] != 1:
        i, n = header["shard"]
        raise ShardError(
            f"manifest file {os.fspath(path)!r} is part {i} of {n} of a sharded build: join the parts with "
            "`arrowstream manifest --merge` first"
        )
    out = []
    base = root.rstrip("/")
    for row in table.to_pylist():
        try:
            meta = pq.read_metadata(pa.BufferReader(row["footer"]))
        except (pa.ArrowInvalid, OSError) as exc:
            raise ShardError(f"manifest file {os.fspath(path)!r}: the footer of {row['relpath']!r} is unreadable ({exc}): rebuild it") from exc
        out.append(file_info(
            f"{base}/{row['relpath']}", row["relpath"], row["size"], meta, mtime_ns=row["mtime_ns"], etag=row["etag"],
        ))
    return out


def _table(infos: list[FileInfo], header: dict[str, Any]) -> pa.Table:
    footers = []
    for f in infos:
        sink = pa.BufferOutputStream()
        assert f.meta is not None
        f.meta.write_metadata_file(sink)
        footers.append(sink.getvalue().to_pybytes())
    table = pa.table(
        {
            "relpath": [f.relpath for f in infos],
            "size": [f.size for f in infos],
            "mtime_ns": [f.mtime_ns for f in infos],
            "etag": [f.etag for f in infos],
            "footer": footers,
        },
        schema=_SCHEMA,
    )
    return table.replace_schema_metadata({MANIFEST_FORMAT: json.dumps(header)})


def _where(path: str | os.PathLike[str], filesystem: Any, *, writing: bool) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a manifest file: the data's ``filesystem`` unless the path is local (or another URI)."""
    text = os.fspath(path)
    if filesystem is None:
        return resolve_filesystem(text, None)
    if "://" in text:
        scheme, rest = text.split("://", 1)
        fs, _ = resolve_filesystem(rest, filesystem)
        if scheme in _schemes(fs):  # the data's store, reached with the filesystem the user set up for it
            return fs, rest.split("?", 1)[0]
        return resolve_filesystem(text, None)
    local = os.path.dirname(os.path.abspath(text)) if writing else text
    if os.path.exists(local):
        return resolve_filesystem(text, None)
    return resolve_filesystem(text, filesystem)


def _schemes(fs: pafs.FileSystem) -> set[str]:
    """URI schemes that name ``fs``'s store."""
    names = {fs.type_name, {"gcs": "gs"}.get(fs.type_name, fs.type_name)}
    inner = fsspec_of(fs)  # the fsspec filesystem, if any
    if inner is not None:
        protocol = inner.protocol
        names |= set(protocol if isinstance(protocol, (tuple, list)) else [protocol])
    return names


def _write(path: str | os.PathLike[str], table: pa.Table, filesystem: Any = None) -> None:
    fs, target = _where(path, filesystem, writing=True)
    if isinstance(fs, pafs.LocalFileSystem):
        final = Path(target)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        try:
            pq.write_table(table, tmp)
            os.replace(tmp, final)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise ShardError(f"cannot write the manifest file {os.fspath(path)!r}: {exc.strerror or exc}") from exc
        return
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    try:
        with fs.open_output_stream(target) as out:  # an object store stores the object whole, at close
            out.write(sink.getvalue())
    except OSError as exc:
        raise ShardError(f"cannot write the manifest file {os.fspath(path)!r}: {exc}") from exc


def _read(path: str | os.PathLike[str], filesystem: Any = None) -> tuple[pa.Table, dict[str, Any]]:
    fs, target = _where(path, filesystem, writing=False)
    try:
        with fs.open_input_file(target) as handle:
            table = pq.read_table(handle)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ShardError(
            f"cannot read the manifest file {os.fspath(path)!r}: {exc}; pass a file `arrowstream manifest` wrote"
        ) from exc
    raw = (table.schema.metadata or {}).get(MANIFEST_FORMAT.encode())
    try:
        header = json.loads(raw) if raw else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("version") != _VERSION or table.schema.remove_metadata() != _SCHEMA:
        raise ShardError(
            f"{os.fspath(path)!r} is not a manifest file of this version (expected `{MANIFEST_FORMAT}` version "
            f"{_VERSION}): write it again with `arrowstream manifest`"
        )
    return table, header


def _check_shard(shard: tuple[int, int] | None) -> tuple[int, int]:
    if shard is None:
        return 0, 1
    try:
        i, n = (int(x) for x in shard)
    except (TypeError, ValueError):
        raise ConfigError(f"`shard` should be (i, n), got {shard!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise ConfigError(f"`shard` should be (i, n) with 0 <= i < n, got {shard!r}")
    return i, n
