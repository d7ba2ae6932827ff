"""Reading one shard (a row group) of projected columns, with errors that name it.

:class:`ShardReader` keeps a few files open so consecutive row groups of one
file do not re-read its footer. Every pyarrow error raised while reading is
re-raised as :class:`~arrowstream.errors.ShardError` naming the file, the row
group and the columns. A reader belongs to one iterator (one thread); it is
cheap to create and never pickled.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from arrowstream.errors import DataLossWarning, SchemaError, ShardError, warn_user
from arrowstream.io.failures import (
    changed_under,
    error_text,
    pause,
    refused,
    retry_settings,
    skippable,
    transient,
)
from arrowstream.io.manifest import Manifest
from arrowstream.io.schema import check_batch_size, unview

__all__ = ["Reader", "ShardReader", "innermost", "transient", "warn_skipped"]

_OPEN_FILES = 4

def warn_skipped(manifest: Manifest, shard: int, unreadable: dict[int, str], warned: set[int]) -> None:
    """Warn (once per shard, in the calling thread) that ``shard`` was skipped as unreadable."""
    if shard in unreadable and shard not in warned:
        warned.add(shard)
        info = manifest.shard(shard)
        warn_user(
            f"skipped the unreadable row group {info.row_group} of {info.path!r} ({info.num_rows:,} rows, "
            f"counted as `unreadable`), as on_error='skip' asks: {unreadable[shard]}",
            DataLossWarning,
        )


def innermost(reader: Any, attribute: str) -> Any:
    """Return the reader, or the one it wraps (a stage may wrap it, see ``Stage.wrap_reader``), that has ``attribute``."""
    while not hasattr(reader, attribute) and hasattr(reader, "inner"):
        reader = reader.inner
    return reader


class Reader(Protocol):
    """What the iterator reads row groups through: a :class:`ShardReader`, or a wrapper around one.

    A stage may wrap the reader (:meth:`arrowstream.core.stage.Stage.wrap_reader`);
    the token cache does, to attach each row group's cached ids.
    """

    manifest: Manifest

    def read(self, shard: int) -> pa.Table:
        """Return every row of shard ``shard``."""
        ...

    def close(self) -> None:
        """Release open files."""
        ...


class ShardReader:
    """Read row groups of a manifest's files, casting columns to the manifest schema.

    Parameters
    ----------
    manifest
        The dataset's manifest.
    columns
        Columns to read, all present in ``manifest.schema``.

    Examples
    --------
    >>> from arrowstream.io.manifest import read_manifest
    >>> from arrowstream.testing import example_dir
    >>> reader = ShardReader(read_manifest(example_dir()), ["text"])
    >>> reader.read(1).column("text").to_pylist()
    ['four', 'five', 'six', 'seven']
    """

    def __init__(
        self, manifest: Manifest, columns: Sequence[str], *, skip_unreadable: bool = False, warn: bool = True
    ) -> None:
        self.manifest = manifest
        self.skip_unreadable = skip_unreadable
        self._warn = warn
        #: Shards found unreadable and skipped (``skip_unreadable``): shard -> the error.
        self.unreadable: dict[int, str] = {}
        self._warned: set[int] = set()
        self.columns = list(columns)
        self.schema = pa.schema([manifest.schema.field(c) for c in self.columns])
        self._files: OrderedDict[str, pq.ParquetFile] = OrderedDict()
        # A Python-implemented filesystem (fsspec through pyarrow's PyFileSystem) is read in
        # the calling thread: an Arrow pool thread that calls into Python while the interpreter
        # shuts down is killed mid C++ frame, which aborts the process at exit.
        self._native = not isinstance(manifest.filesystem, pafs.PyFileSystem)
        # Pre-buffering fetches a row group's column chunks in one request: it pays on object
        # storage, but on a local disk it only adds a copy (the 85 MB corpus read 0.33 against
        # 0.25 s of CPU).
        self._pre_buffer = self._native and not isinstance(manifest.filesystem, pafs.LocalFileSystem)
        #: Reads retried after a transient storage error (not part of any state: it varies run to run).
        self.retries = 0

    def read(self, shard: int) -> pa.Table:
        """Return every row of shard ``shard`` for the selected columns."""
        return self.read_columns(shard, self.columns)

    def without(self, column: str) -> ShardReader:
        """Return a reader of the same manifest that does not read ``column``."""
        return ShardReader(
            self.manifest, [c for c in self.columns if c != column], skip_unreadable=self.skip_unreadable
        )

    def read_columns(self, shard: int, columns: list[str]) -> pa.Table:
        """Return every row of shard ``shard`` for ``columns`` (any of the manifest's).

        A transient storage error (throttling, a server error, a connection
        reset or timeout) is retried on a freshly opened file, up to
        ``ARROWSTREAM_READ_ATTEMPTS`` attempts in all (default 3) with
        exponential backoff from ``ARROWSTREAM_READ_BACKOFF`` seconds (default
        0.5), on top of the storage client's own retries; :attr:`retries`
        counts them. Any other error, or the last attempt's, is a
        :class:`~arrowstream.errors.ShardError` naming the file and row group.
        """
        info = self.manifest.shard(shard)
        where = f"{info.path!r}, row group {info.row_group}, columns {columns!r}"
        attempts, backoff = retry_settings()
        for attempt in range(1, attempts + 1):
            try:
                table = self._open(info.path).read_row_group(
                    info.row_group, columns=columns, use_threads=self._native and len(columns) > 1
                )
                break
            except Exception as exc:  # a Python filesystem's client raises classes of its own (aiohttp's, say)
                if isinstance(exc, MemoryError):
                    raise
                # a file that would not open is a ShardError (see `_open`): its cause says whether to try again
                cause = exc.__cause__ if isinstance(exc, ShardError) else exc
                if attempt < attempts and cause is not None and transient(cause):
                    self._forget(info.path)  # a fresh connection, and the file's identity checked again
                    self.retries += 1
                    pause(backoff, attempt)
                    continue
                self._forget(info.path)  # a handle whose read failed may keep the failure: the next read opens anew
                if isinstance(exc, ShardError):
                    raise
                changed = self._changed(info.path, exc)
                if changed is not None:  # a file replaced while read: never skipped as bad bytes
                    raise changed from exc
                if self.skip_unreadable and skippable(exc):
                    return self._skip(shard, info, columns, exc)  # bytes that do not decode: skipped as asked
                tried = f" (after {attempt} attempts)" if attempt > 1 else ""
                if refused(exc):
                    advice = "the storage refused it: check the credentials and that the object still exists"
                elif transient(exc):
                    advice = (
                        "the storage kept failing (throttled, unavailable or unreachable): resume from the last "
                        "state once it answers, or allow more attempts (ARROWSTREAM_READ_ATTEMPTS, "
                        "ARROWSTREAM_READ_BACKOFF, the storage client's retries)"
                    )
                else:
                    advice = (
                        "the file may be truncated, corrupt or changed since the manifest was built, or the "
                        "storage unreachable: rebuild the dataset, remove the file, or check the storage"
                    )
                raise ShardError(f"cannot read {where}{tried}: {error_text(exc)}; {advice}") from exc
        if table.num_rows != info.num_rows:
            raise ShardError(
                f"{where} has {table.num_rows} rows but its footer said {info.num_rows} when the "
                "dataset was opened: the file changed; rebuild the dataset"
            )
        check_batch_size(table, info.path, info.row_group)
        schema = self.schema if columns is self.columns else pa.schema(
            [self.manifest.schema.field(c) for c in columns]
        )
        if table.schema != schema:
            try:
                table = unview(table).cast(schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaError(
                    f"cannot read {where} as {schema}: {exc}; the file's schema changed"
                ) from exc
        return table

    def _skip(self, shard: int, info: Any, columns: list[str], exc: BaseException) -> pa.Table:
        """Record shard ``shard`` as unreadable, warn once, and return its rows as nulls (dropped downstream)."""
        if shard not in self.unreadable:
            self.unreadable[shard] = str(exc)
        if self._warn:
            warn_skipped(self.manifest, shard, self.unreadable, self._warned)
        schema = pa.schema([self.manifest.schema.field(c) for c in columns])
        return pa.table([pa.nulls(info.num_rows, f.type) for f in schema], schema=schema)

    def _open(self, path: str) -> pq.ParquetFile:
        handle = self._files.pop(path, None)
        if handle is None:
            fs = self.manifest.filesystem
            try:
                raw = fs.open_input_file(path)
            except Exception as exc:  # a Python filesystem's client raises classes of its own (aiohttp's, say)
                if isinstance(exc, MemoryError):
                    raise
                raise ShardError(
                    f"cannot open {path!r}: {error_text(exc)}; it was readable when the dataset was opened: "
                    "check that it still exists and is complete"
                ) from exc
            try:
                self.manifest.check_pin(path, raw)
                # the footer kept at discovery: opening the file reads no footer again
                handle = pq.ParquetFile(raw, pre_buffer=self._pre_buffer, metadata=self.manifest.footer(path))
            except Exception as exc:
                raw.close()
                if isinstance(exc, (ShardError, MemoryError)):
                    raise
                raise ShardError(
                    f"cannot open {path!r}: {error_text(exc)}; it was readable when the dataset was opened: "
                    "check that it still exists and is complete"
                ) from exc
            while len(self._files) >= _OPEN_FILES:
                self._release(*self._files.popitem(last=False))
        self._files[path] = handle
        return handle

    def _changed(self, path: str, exc: BaseException) -> ShardError | None:
        """The error saying ``path`` changed since the dataset was opened, when a failed read of it is that."""
        if changed_under(exc):  # fsspec: the ETag moved under the open file
            return ShardError(
                f"{path!r} changed while it was read ({error_text(exc)}): open the dataset again (and rebuild "
                "its manifest file, if it has one), or restore the file"
            )
        return self._pin_broken(path)

    def _release(self, path: str, handle: pq.ParquetFile) -> None:
        """Close ``handle``, then check ``path`` is still the file discovered: reads through a handle see no change."""
        handle.close()
        self._check_still(path)

    def _check_still(self, path: str) -> None:
        """Raise :class:`ShardError` when ``path``, open for reading until now, is no longer the file discovered."""
        changed = self._pin_broken(path)
        if changed is not None:
            raise ShardError(
                f"{changed} (while it was open for reading: batches read from it since it was opened may hold "
                "its new bytes)"
            )

    def recheck(self) -> None:
        """Check every open file is still the one discovered (at an epoch's end), leaving them open.

        Raises
        ------
        ShardError
            A file changed while it was open: its reads may have mixed new
            bytes with the old footer.
        """
        for path in list(self._files):
            self._check_still(path)

    def _pin_broken(self, path: str) -> ShardError | None:
        """The error saying ``path`` is no longer the file discovered (size, ETag, mtime), or ``None``."""
        try:
            raw = self.manifest.filesystem.open_input_file(path)
        except Exception as exc:  # gone, or refused: no longer the file discovered; else the read's error says more
            if not refused(exc):
                return None
            return ShardError(
                f"{path!r} cannot be opened any more ({error_text(exc)}): it was deleted or the storage refuses it "
                "since the dataset was opened; restore it, or open the dataset again"
            )
        try:
            self.manifest.check_pin(path, raw)
        except ShardError as changed:
            return changed
        except Exception:
            return None
        finally:
            raw.close()
        return None

    def _forget(self, path: str) -> None:
        handle = self._files.pop(path, None)
        if handle is not None:
            handle.close()

    def close(self) -> None:
        """Close the open files."""
        while self._files:
            _, handle = self._files.popitem()
            handle.close()
