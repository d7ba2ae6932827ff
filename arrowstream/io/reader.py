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
from typing import Protocol

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from arrowstream.errors import SchemaError, ShardError
from arrowstream.io.manifest import Manifest

__all__ = ["Reader", "ShardReader"]

_OPEN_FILES = 4


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

    def __init__(self, manifest: Manifest, columns: Sequence[str]) -> None:
        self.manifest = manifest
        self.columns = list(columns)
        self.schema = pa.schema([manifest.schema.field(c) for c in self.columns])
        self._files: OrderedDict[str, pq.ParquetFile] = OrderedDict()
        # A Python-implemented filesystem (fsspec through pyarrow's PyFileSystem) is read in
        # the calling thread: an Arrow pool thread that calls into Python while the interpreter
        # shuts down is killed mid C++ frame, which aborts the process at exit.
        self._native = not isinstance(manifest.filesystem, pafs.PyFileSystem)

    def read(self, shard: int) -> pa.Table:
        """Return every row of shard ``shard`` for the selected columns."""
        return self.read_columns(shard, self.columns)

    def without(self, column: str) -> ShardReader:
        """Return a reader of the same manifest that does not read ``column``."""
        return ShardReader(self.manifest, [c for c in self.columns if c != column])

    def read_columns(self, shard: int, columns: list[str]) -> pa.Table:
        """Return every row of shard ``shard`` for ``columns`` (any of the manifest's)."""
        info = self.manifest.shard(shard)
        where = f"{info.path!r}, row group {info.row_group}, columns {columns!r}"
        try:
            table = self._open(info.path).read_row_group(
                info.row_group, columns=columns, use_threads=self._native
            )
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError, IndexError) as exc:
            raise ShardError(
                f"cannot read {where}: {exc}; the file may be truncated, corrupt or changed "
                "since the manifest was built: rebuild the dataset or remove the file"
            ) from exc
        if table.num_rows != info.num_rows:
            raise ShardError(
                f"{where} has {table.num_rows} rows but its footer said {info.num_rows} when the "
                "dataset was opened: the file changed; rebuild the dataset"
            )
        schema = self.schema if columns is self.columns else pa.schema(
            [self.manifest.schema.field(c) for c in columns]
        )
        if table.schema != schema:
            try:
                table = table.cast(schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaError(
                    f"cannot read {where} as {schema}: {exc}; the file's schema changed"
                ) from exc
        return table

    def _open(self, path: str) -> pq.ParquetFile:
        handle = self._files.pop(path, None)
        if handle is None:
            fs = self.manifest.filesystem
            try:
                handle = pq.ParquetFile(fs.open_input_file(path), pre_buffer=self._native)
            except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
                raise ShardError(
                    f"cannot open {path!r}: {exc}; it was readable when the dataset was opened: "
                    "check that it still exists and is complete"
                ) from exc
            while len(self._files) >= _OPEN_FILES:
                _, old = self._files.popitem(last=False)
                old.close()
        self._files[path] = handle
        return handle

    def close(self) -> None:
        """Close the open files."""
        while self._files:
            _, handle = self._files.popitem()
            handle.close()
