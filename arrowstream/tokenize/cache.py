"""The token cache: tokens of every row group kept as Parquet, so later epochs and runs skip tokenizing.

A cache lives in a directory. Each tokenization setting (tokenizer hash,
text column, ``add_special_tokens``) gets its own sub-directory, named by a
hash of that setting, with a ``cache.json`` that states it. Inside, every
source row group has one small Parquet file,
``<relative path of the source file>.rg<row group>.ids`` (Parquet, with its
own suffix so that a cache kept beside the data is not taken for data), holding one
``list<int32>`` row of token ids per source row (EOS not included; null for
a null text), and, in its metadata, the identity of the source file it came
from: relative path, size and rows per row group (the dataset fingerprint's
terms) and a digest of its Parquet footer (see
:meth:`~arrowstream.io.manifest.Manifest.file_identity` for the one kind of
rewrite it cannot see).

Reading an entry checks that identity against the dataset being read. A
stale entry (the source file changed) or a foreign one (another setting) is
never used: it is rebuilt with a :class:`~arrowstream.errors.CacheWarning`
when the cache is writable, and raises :class:`~arrowstream.errors.CacheError`
when it is read-only. Entries are written to a temporary file and renamed,
so a crash never leaves half an entry; readers and writers on several ranks
can share a cache directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from arrowstream.errors import CacheError, CacheWarning, warn_user
from arrowstream.io.manifest import Manifest
from arrowstream.io.reader import ShardReader

__all__ = ["CACHE_FORMAT", "IDS_COLUMN", "CachedReader", "TokenCache"]

#: Version of the cache layout; a change makes older caches foreign. 2: entries name
#: their source file's footer digest too. 3: an empty text keeps no id (as when it is
#: not cached), even where the tokenizer's post-processor adds some.
CACHE_FORMAT = 3

_META = b"arrowstream.token_cache"

#: The column through which cached ids travel from :class:`CachedReader` to the tokenize stage.
IDS_COLUMN = "__arrowstream_ids"

#: ``encode(texts)`` -> ``list<int32>`` ids per text (null for a null text), no EOS.
Encode = Callable[[pa.Array], pa.Array]


class TokenCache:
    """Token ids of a dataset's row groups for one tokenization setting.

    Parameters
    ----------
    root
        The cache directory (created when writing).
    setting
        What defines the ids: the tokenizer's hash, the text column and
        ``add_special_tokens`` (JSON-able).
    writable
        Write missing and stale entries (``False``: a stale entry is an error,
        a missing one is tokenized without being kept).

    Examples
    --------
    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> from arrowstream.io.manifest import read_manifest
    >>> d = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"text": ["ab", None, "c"]}), f"{d}/x.parquet")
    >>> cache = TokenCache(f"{d}/_cache", {"tokenizer": "demo", "column": "text"})
    >>> encode = lambda texts: pa.array([None if t is None else [len(t)] for t in texts.to_pylist()], pa.list_(pa.int32()))
    >>> cache.ids(read_manifest(d), 0, lambda: pa.array(["ab", None, "c"]), encode).to_pylist()
    [[2], None, [1]]
    >>> cache.read(read_manifest(d), 0).to_pylist()   # now kept
    [[2], None, [1]]
    """

    def __init__(self, root: str | os.PathLike[str], setting: dict[str, Any], *, writable: bool = True) -> None:
        self.root = Path(root)
        self.setting = {"format": CACHE_FORMAT, **setting}
        text = json.dumps(self.setting, sort_keys=True)
        self.key = hashlib.sha256(text.encode()).hexdigest()[:16]
        self.dir = self.root / self.key
        self.writable = bool(writable)
        self._checked = False

    def _check_dir(self, *, create: bool) -> bool:
        """Return whether the setting's directory exists (creating it if asked), checking ``cache.json``."""
        if self._checked:
            return True
        info = self.dir / "cache.json"
        if info.is_file():
            try:
                saved = json.loads(info.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise CacheError(f"cannot read {str(info)!r}: {exc}; delete {str(self.dir)!r}") from exc
            if saved != self.setting:
                raise CacheError(
                    f"token cache {str(self.dir)!r} states the setting {saved!r}, not {self.setting!r}: "
                    "it was edited or copied from elsewhere; delete that directory"
                )
            self._checked = True
            return True
        if not create:
            return False
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(info, json.dumps(self.setting, sort_keys=True, indent=1).encode())
        self._checked = True
        return True

    def entry_path(self, manifest: Manifest, shard: int) -> Path:
        """Return the file holding ``shard``'s ids."""
        identity = manifest.file_identity(int(manifest.shard_file[shard]))
        return self.dir / f"{identity['relpath']}.rg{int(manifest.shard_row_group[shard]):05d}.ids"

    def read(self, manifest: Manifest, shard: int) -> pa.Array | None:
        """Return ``shard``'s cached ids, or ``None`` when there is no entry.

        Raises
        ------
        CacheError
            The entry is stale or foreign and the cache is read-only.
        """
        if not self._check_dir(create=False):
            return None
        path = self.entry_path(manifest, shard)
        if not path.is_file():
            return None
        expected = self._identity(manifest, shard)
        try:
            # page checksums (written since 2026-11-27) catch flipped bytes in an entry
            with pq.ParquetFile(path, page_checksum_verification=True) as entry:  # lighter than read_table
                table = entry.read()
            saved = json.loads((table.schema.metadata or {}).get(_META, b"null"))
        except (pa.ArrowInvalid, OSError, ValueError) as exc:
            return self._stale(path, f"it cannot be read ({exc})")
        if saved != expected:
            return self._stale(path, f"it was built from {saved!r}, the data is now {expected!r}")
        column = table.column("input_ids")
        ids = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()  # no copy for one chunk
        if len(ids) != int(manifest.shard_rows[shard]):
            return self._stale(path, f"it has {len(ids)} rows, the row group {int(manifest.shard_rows[shard])}")
        values = ids.values
        low = pc.min(values).as_py() if len(values) else 0
        if values.null_count or (low is not None and low < 0):  # damaged (an entry from before page checksums)
            return self._stale(path, "it holds null or negative token ids: the entry is damaged")
        return ids

    def counts(self, manifest: Manifest) -> np.ndarray | None:
        """Return, per shard, ``(ids, rows with no id)`` from the entries' footers, or ``None`` if one is missing.

        Only footers are read: a leaf's value count less its nulls is the ids
        (a null or empty list takes one null slot).

        Raises
        ------
        CacheError
            An entry is stale or foreign and the cache is read-only.
        """
        if not self._check_dir(create=False):
            return None
        out = np.zeros((manifest.num_shards, 2), dtype=np.int64)
        for shard in range(manifest.num_shards):
            path = self.entry_path(manifest, shard)
            if not path.is_file():
                return None
            try:
                meta = pq.read_metadata(path)
                saved = json.loads((meta.metadata or {}).get(_META, b"null"))
            except (pa.ArrowInvalid, OSError, ValueError) as exc:
                self._stale(path, f"it cannot be read ({exc})")
                return None
            rows = int(manifest.shard_rows[shard])
            if saved != self._identity(manifest, shard) or meta.num_rows != rows:
                self._stale(path, f"it was built from {saved!r} ({meta.num_rows} rows)")
                return None
            values = nulls = 0
            for g in range(meta.num_row_groups):
                chunk = meta.row_group(g).column(0)
                st = chunk.statistics
                if st is None or not st.has_null_count:
                    return None
                values, nulls = values + chunk.num_values - st.null_count, nulls + st.null_count
            out[shard] = values, nulls
        return out

    def _stale(self, path: Path, why: str) -> None:
        if not self.writable:
            raise CacheError(
                f"token cache entry {str(path)!r} does not match the data: {why}; rebuild the cache "
                "(`arrowstream cache ...`) or delete the entry"
            )
        warn_user(
            CacheWarning(f"token cache entry {str(path)!r} is stale ({why}): tokenizing again"),
        )
        return None

    def write(self, manifest: Manifest, shard: int, ids: pa.Array) -> Path:
        """Keep ``shard``'s ids (one list per source row) and return the entry's path."""
        self._check_dir(create=True)
        path = self.entry_path(manifest, shard)
        meta = {_META: json.dumps(self._identity(manifest, shard)).encode()}
        table = pa.table({"input_ids": ids.cast(pa.list_(pa.int32()))}).replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd", write_page_checksum=True)
        _write_atomic(path, sink.getvalue().to_pybytes())
        return path

    def ids(self, manifest: Manifest, shard: int, texts: Callable[[], pa.Array], encode: Encode) -> pa.Array:
        """Return ``shard``'s ids: cached, or encoded from ``texts()`` (and kept when writable)."""
        cached = self.read(manifest, shard)
        if cached is not None:
            return cached
        ids = encode(texts())
        if self.writable:
            try:
                self.write(manifest, shard, ids)
            except OSError as exc:  # a full disk, a file-size limit, no permission: train on, uncached
                self.writable = False
                warn_user(
                    CacheWarning(
                        f"cannot write to the token cache {str(self.dir)!r} ({exc.strerror or exc}): "
                        "tokenizing without keeping the ids from now on (the output is the same); "
                        "free space or fix the permissions, or pass cache_write=False"
                    ),
                )
        return ids

    def _identity(self, manifest: Manifest, shard: int) -> dict[str, Any]:
        fi = int(manifest.shard_file[shard])
        return {**manifest.file_identity(fi), "row_group": int(manifest.shard_row_group[shard])}



class CachedReader:
    """A reader that brings every row group's token ids along, from a :class:`TokenCache`.

    It wraps a :class:`~arrowstream.io.reader.ShardReader` (the cache sits on
    top of reading; reading knows nothing of tokens). Each table it returns
    has the cached ids as column :data:`IDS_COLUMN`; on a miss the text column
    is read and encoded, and the ids are kept when the cache is writable.

    Parameters
    ----------
    reader
        The reader of the columns the pipeline needs.
    cache
        Where the ids are kept.
    column
        The text column the ids come from.
    encode
        Tokenizes a text array on a miss (``list<int32>`` per text, no EOS).
    keep_text
        Whether a later stage or the output still needs the text. When not,
        the text is read only to fill a miss.

    Examples
    --------
    >>> import pyarrow as pa
    >>> from arrowstream.io.manifest import read_manifest
    >>> from arrowstream.testing import example_dir
    >>> d = example_dir()
    >>> m = read_manifest(d)
    >>> encode = lambda texts: pa.array([[len(t)] for t in texts.to_pylist()], pa.list_(pa.int32()))
    >>> reader = CachedReader(ShardReader(m, ["text", "n"]), TokenCache(f"{d}/_c", {"t": 1}),
    ...                       "text", encode, keep_text=False)
    >>> reader.read(0).to_pydict()  # no text: the ids stand in for it
    {'n': [0, 1, 2, 3], '__arrowstream_ids': [[4], [3], [3], [5]]}
    """

    def __init__(
        self, reader: ShardReader, cache: TokenCache, column: str, encode: Encode, *, keep_text: bool
    ) -> None:
        self.inner = reader if keep_text else reader.without(column)
        self.manifest = reader.manifest
        self.cache, self.column, self.encode = cache, column, encode

    def read(self, shard: int) -> pa.Table:
        """Return shard ``shard``'s rows with their ids as :data:`IDS_COLUMN`."""
        table = self.inner.read(shard)

        def texts() -> pa.Array:
            if self.column in table.column_names:
                return table.column(self.column).combine_chunks()
            return self.inner.read_columns(shard, [self.column]).column(self.column).combine_chunks()

        return table.append_column(IDS_COLUMN, self.cache.ids(self.manifest, shard, texts, self.encode))

    def close(self) -> None:
        """Close the open files."""
        self.inner.close()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
