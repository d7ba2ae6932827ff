"""Reading one shard (a row group) of projected columns, with errors that name it.

:class:`ShardReader` keeps a few files open so consecutive row groups of one
file do not re-read its footer. Every pyarrow error raised while reading is
re-raised as :class:`~arrowstream.errors.ShardError` naming the file, the row
group and the columns. A reader belongs to one iterator (one thread); it is
cheap to create and never pickled.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from arrowstream.errors import SchemaError, ShardError
from arrowstream.io.manifest import Manifest

__all__ = ["IDS_COLUMN", "IdsStore", "ShardReader", "TokenIds"]

_OPEN_FILES = 4

#: The column through which cached ids travel from the reader to the tokenize stage.
IDS_COLUMN = "__arrowstream_ids"


class IdsStore(Protocol):
    """Where a row group's token ids are kept (:class:`~arrowstream.tokenize.cache.TokenCache` is one)."""

    def ids(
        self,
        manifest: Manifest,
        shard: int,
        texts: Callable[[], pa.Array],
        encode: Callable[[pa.Array], pa.Array],
    ) -> pa.Array:
        """Return ``shard``'s ids: kept, or encoded from ``texts()``."""
        ...


@dataclass(frozen=True, slots=True)
class TokenIds:
    """What a reader needs to give every row group its cached ids.

    ``cache`` holds them, ``column`` is the text column, ``encode`` tokenizes
    a text array on a miss (``list<int32>`` ids per text, no EOS), and
    ``keep_text`` says whether a later stage still needs the text (otherwise
    it is read only to fill a miss).
    """

    cache: IdsStore
    column: str
    encode: Callable[[pa.Array], pa.Array]
    keep_text: bool


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
    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> from arrowstream.io.manifest import read_manifest
    >>> d = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"text": ["a", "b", "c"]}), f"{d}/x.parquet", row_group_size=2)
    >>> reader = ShardReader(read_manifest(d), ["text"])
    >>> reader.read(1).column("text").to_pylist()
    ['c']
    """

    def __init__(self, manifest: Manifest, columns: Sequence[str], *, ids: TokenIds | None = None) -> None:
        self.manifest = manifest
        self.ids = ids
        if ids is not None and not ids.keep_text:
            columns = [c for c in columns if c != ids.column]  # read only to fill a cache miss
        self.columns = list(columns)
        self.schema = pa.schema([manifest.schema.field(c) for c in self.columns])
        self._files: OrderedDict[str, pq.ParquetFile] = OrderedDict()
        # A Python-implemented filesystem (fsspec through pyarrow's PyFileSystem) is read in
        # the calling thread: an Arrow pool thread that calls into Python while the interpreter
        # shuts down is killed mid C++ frame, which aborts the process at exit.
        self._native = not isinstance(manifest.filesystem, pafs.PyFileSystem)

    def read(self, shard: int) -> pa.Table:
        """Return every row of shard ``shard`` for the selected columns.

        With a token cache (``ids``), the row group's ids come along as
        :data:`IDS_COLUMN`: from the cache, or tokenized
        now and kept.
        """
        table = self._read(shard, self.columns)
        if self.ids is None:
            return table
        ids = self.ids

        def texts() -> pa.Array:
            if ids.column in table.column_names:
                return table.column(ids.column).combine_chunks()
            return self._read(shard, [ids.column]).column(ids.column).combine_chunks()

        values = ids.cache.ids(self.manifest, shard, texts, ids.encode)
        return table.append_column(IDS_COLUMN, values)

    def _read(self, shard: int, columns: list[str]) -> pa.Table:
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
