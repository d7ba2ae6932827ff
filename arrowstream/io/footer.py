"""What one Parquet footer tells: a file's row groups, sizes, statistics and identity, read once.

:func:`read_footer` opens a file once (the object store's ETag comes with it)
and :func:`file_info` turns its parsed footer into the :class:`FileInfo` a
manifest keeps: rows and bytes per row group, uncompressed bytes per column,
elements of list columns, statistics for pruning, a digest of the footer, and
what pins the file's bytes (size, mtime, ETag). The parsed footer is kept too,
so opening the file later to read row groups reads no footer again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from arrowstream.errors import ShardError
from arrowstream.io.discover import relpath
from arrowstream.io.failures import error_text, refused, retried
from arrowstream.io.forksafe import fsspec_of
from arrowstream.io.statistics import FileStatistics

__all__ = ["FileInfo", "FilePin", "entity_tag", "file_info", "read_footer", "reread_footer", "reread_info"]


@dataclass(frozen=True, slots=True)
class FileInfo:
    """What a manifest keeps of one file (see the module's docstring)."""

    path: str
    relpath: str
    size: int
    row_counts: tuple[int, ...]
    row_bytes: tuple[int, ...]
    schema: pa.Schema
    column_bytes: tuple[dict[str, int], ...]  # per row group: uncompressed bytes per top-level column
    # per row group and list column: (elements, rows holding a null or empty list), None if unknown
    list_values: tuple[dict[str, tuple[int, int] | None], ...]
    footer: str  # digest of the Parquet footer (sizes, offsets, statistics of every column chunk)
    # what pins the file's bytes: a read refuses the file when they changed (see `check_pin`)
    mtime_ns: int | None = None  # on a local disk (object stores: the ETag says more)
    etag: str | None = None  # an object store's entity tag, when it gives one
    meta: pq.FileMetaData | None = field(default=None, compare=False, repr=False)  # the footer, parsed
    _statistics: list[FileStatistics] = field(default_factory=list, compare=False, repr=False)  # once built

    @property
    def statistics(self) -> FileStatistics:
        """Per row group: bounds and null counts of the top-level columns, for pruning.

        Built from the parsed footer the first time a filter asks (only
        pruning needs them; building them costs a fresh process the import
        of pandas, through ``pyarrow.array``).
        """
        if not self._statistics:
            if self.meta is None:
                raise ValueError(f"no parsed footer kept for {self.path!r}: its statistics are unknown")
            self._statistics.append(FileStatistics.of(self.meta, self.schema))
        return self._statistics[0]

    def without_footer(self) -> FileInfo:
        """This record without its parsed footer (:func:`reread_footer` reads it again, checked by :attr:`footer`)."""
        return replace(self, meta=None, _statistics=[])

    def pin(self) -> FilePin:
        """What names and pins this file, without what its footer tells (:func:`reread_info` makes the record again)."""
        return FilePin(self.path, self.relpath, self.size, self.footer, self.mtime_ns, self.etag)

    def __getstate__(self) -> list[Any]:
        # without the statistics built on demand: a description pickles to the same bytes before and after use
        return [[] if f.name == "_statistics" else getattr(self, f.name) for f in fields(self)]

    def __setstate__(self, state: list[Any]) -> None:
        for f, value in zip(fields(self), state):
            object.__setattr__(self, f.name, value)


class FilePin(NamedTuple):
    """A file's name, size, footer digest and what pins its bytes: a :class:`FileInfo` without what its footer tells."""

    path: str
    relpath: str
    size: int
    footer: str
    mtime_ns: int | None
    etag: str | None


def reread_info(fs: pafs.FileSystem, pin: FilePin) -> FileInfo:
    """Make ``pin``'s record again from its file's footer, read again; it must be the one read at discovery.

    Raises
    ------
    ShardError
        As :func:`reread_footer`.
    """
    meta = reread_footer(fs, pin)
    return file_info(pin.path, pin.relpath, pin.size, meta, mtime_ns=pin.mtime_ns, etag=pin.etag)


def reread_footer(fs: pafs.FileSystem, info: FileInfo | FilePin) -> pq.FileMetaData:
    """Read the footer of ``info``'s file again, for a description pickled without it; it must be the one read at discovery.

    Raises
    ------
    ShardError
        The footer cannot be read, or its digest is not ``info.footer``
        (the file was rewritten since the dataset was opened).
    """
    _, meta = _read_meta(fs, info.path, info.size)
    if _footer_digest(meta) != info.footer:
        raise ShardError(
            f"file {info.path!r} changed since the dataset was opened: its Parquet footer is not the one read "
            "then (other row groups, sizes or statistics); open the dataset again"
        )
    return meta


def read_footer(fs: pafs.FileSystem, root: str, path: str, size: int, mtime_ns: int | None = None) -> FileInfo:
    """Read the footer of ``path``; a transient storage error is tried again as a row group's read is.

    Up to ``ARROWSTREAM_READ_ATTEMPTS`` attempts with backoff (see
    :func:`~arrowstream.io.failures.retried`), on top of the storage client's
    own retries; any other error, or the last, is a ``ShardError`` naming the
    file.
    """
    etag, meta = _read_meta(fs, path, size)
    return file_info(path, relpath(path, root), size, meta, mtime_ns=mtime_ns, etag=etag)


def _read_meta(fs: pafs.FileSystem, path: str, size: int) -> tuple[str | None, pq.FileMetaData]:
    """The file's ETag (object stores) and parsed footer, read with :func:`read_footer`'s retries and errors."""
    def read() -> tuple[str | None, pq.FileMetaData]:
        with fs.open_input_file(path) as handle:
            return entity_tag(handle, fs, path), pq.ParquetFile(handle).metadata

    try:
        return retried(read)
    except Exception as exc:  # a Python filesystem's client raises classes of its own (aiohttp's, say)
        if isinstance(exc, MemoryError):
            raise
        advice = (
            "the storage refused it: check the credentials and that the object exists" if refused(exc)
            else "the file is not Parquet or is truncated or corrupt, or the storage unreachable: "
            "remove or rewrite it, or check the storage"
        )
        raise ShardError(f"cannot read the Parquet footer of {path!r} ({size} bytes): {error_text(exc)}; {advice}") from exc


def file_info(
    path: str, rel: str, size: int, meta: pq.FileMetaData, *, mtime_ns: int | None = None, etag: str | None = None
) -> FileInfo:
    """Return what the manifest keeps of one file, from its parsed footer (read now, or from a manifest file)."""
    schema = meta.schema.to_arrow_schema()
    counts = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    nbytes = tuple(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    by_column = tuple(_column_bytes(meta.row_group(i)) for i in range(meta.num_row_groups))
    lists = _list_values(meta, schema)
    return FileInfo(
        path=path, relpath=rel, size=size, row_counts=counts, row_bytes=nbytes,
        schema=schema, column_bytes=by_column, list_values=lists, footer=_footer_digest(meta),
        mtime_ns=mtime_ns, etag=etag, meta=meta,
    )


def entity_tag(handle: Any, fs: pafs.FileSystem | None = None, path: str | None = None) -> str | None:
    """Return the ETag an open object-store file states (``None`` for a local file or a store without one).

    pyarrow's own clients give it in the file's metadata (S3 as ``ETag``,
    GCS as ``etag``). An fsspec filesystem (``fs``, wrapped in pyarrow's
    ``PyFileSystem``) does not: it is taken from its ``info(path)`` (s3fs
    ``ETag``, gcsfs and adlfs ``etag``; s3fs answers from the listing it
    keeps, with no request).
    """
    try:
        meta = handle.metadata() or {}
        value = meta.get("ETag") or meta.get("etag")
    except (AttributeError, NotImplementedError, OSError):
        value = None
    inner = fsspec_of(fs)  # the fsspec filesystem, if any
    if not value and inner is not None and path is not None:
        try:
            info = inner.info(path)
        except Exception:  # noqa: BLE001 - no ETag known: the size alone pins the file
            return None
        value = info.get("ETag") or info.get("etag")
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value) if value else None


def _list_values(meta: pq.FileMetaData, schema: pa.Schema) -> tuple[dict[str, tuple[int, int] | None], ...]:
    """Per row group, (elements, null or empty lists) of each top-level list column of primitive values.

    A leaf's value count less its nulls: a null or empty list takes one leaf
    slot, counted as a null.
    """
    lists = {
        j: name
        for j in range(meta.num_columns)
        if (name := meta.schema.column(j).path.split(".")[0]) in schema.names
        and (pa.types.is_list(dtype := schema.field(name).type) or pa.types.is_large_list(dtype))
        and not pa.types.is_nested(dtype.value_type)
    }
    out = []
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        counts: dict[str, tuple[int, int] | None] = {}
        for j, name in lists.items():
            chunk = group.column(j)
            st = chunk.statistics
            known = st is not None and st.has_null_count
            counts[name] = (chunk.num_values - st.null_count, st.null_count) if known else None
        out.append(counts)
    return tuple(out)


def _column_bytes(rg: pq.RowGroupMetaData) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in range(rg.num_columns):
        chunk = rg.column(j)
        name = chunk.path_in_schema.split(".")[0]  # a nested column's leaves add up
        out[name] = out.get(name, 0) + chunk.total_uncompressed_size
    return out


def _footer_digest(meta: pq.FileMetaData) -> str:
    # The footer serialized again from what was parsed (no second read): about 0.3 ms for
    # a footer of 1,000 row groups.
    sink = pa.BufferOutputStream()
    meta.write_metadata_file(sink)
    return hashlib.sha256(sink.getvalue()).hexdigest()[:32]
