"""The length index: every document's token count, kept so that even batches can be exact on text.

A text corpus's tokens are unknown until it is tokenized, so the work of an
epoch can only be split by an estimate. An index made once (by
:func:`build_length_index` or ``arrowstream index``) records how many ids
each document encodes to, a few bytes a document, and a pipeline that finds
one splits the epoch by exact token counts (see ``docs/training.md``).

Over a column of token ids the counts are the lists' lengths, which the
Parquet footers give only per row group: an index of them lets a plan weigh
parts of row groups (``.shuffle``'s half row groups) without reading the ids
(:func:`~arrowstream.tokenize.known.known_tokens`).

Layout: one directory per tokenization setting (tokenizer hash, text column,
``add_special_tokens``; no tokenizer for token ids), named by a hash of it,
with an ``index.json`` that states it. Inside, each source file has one small Parquet file,
``<relative path of the source file>.lengths``, with one row group per
non-empty source row group and one ``int32`` row per document: the ids it
encodes to (EOS not included), 0 for an empty text, null for a null one.
Its metadata holds the source file's identity (relative path, size, rows per
row group, footer digest; see
:meth:`~arrowstream.io.manifest.Manifest.file_identity`) and, per row group,
the ids and the documents with at least one id, so planning reads footers
only. Entries are written whole (to a temporary name, then renamed on a local
disk; one upload on object storage), so an interrupted build leaves finished
files usable and the next build does only the rest.

By default the index lives beside the data, in ``<root>/_arrowstream_index``
(discovery skips names starting with ``_``), where every pipeline over the
same root finds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from arrowstream.errors import CacheError, CacheWarning, warn_user
from arrowstream.io.forksafe import PerProcess
from arrowstream.io.manifest import Manifest, resolve_filesystem
from arrowstream.io.reader import ShardReader

__all__ = ["INDEX_DIR", "INDEX_FORMAT", "IndexSummary", "LengthIndex", "encode_lengths"]

#: Version of the index layout; a change makes older indexes foreign.
INDEX_FORMAT = 1

#: Where an index lives by default, under the dataset's root.
INDEX_DIR = "_arrowstream_index"

_META = b"arrowstream.length_index"

#: ``encode(texts)`` -> (flat ids, ids per text), as :meth:`~arrowstream.tokenize.encoders.Encoder.encode`.
Encode = Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class IndexSummary:
    """What a build of a length index did.

    Attributes
    ----------
    dir
        The index directory of the setting (pass it as ``length_index=``, or
        leave the default when it lives beside the data).
    num_files, num_built
        Source files covered, and those tokenized by this build (the others
        were already there).
    num_docs, num_tokens
        Documents (rows) and ids (EOS not included) of the whole dataset.
    seconds
        Wall time of the build.
    """

    dir: str
    num_files: int
    num_built: int
    num_docs: int
    num_tokens: int
    seconds: float


class LengthIndex:
    """The token counts of a dataset's documents for one tokenization setting.

    Parameters
    ----------
    manifest
        The dataset the index covers.
    setting
        What defines the counts: tokenizer hash, text column,
        ``add_special_tokens`` (JSON-able).
    location
        The index's parent directory (the setting's own directory is made
        inside it); ``None``: ``<root>/_arrowstream_index`` beside the data,
        on the data's filesystem.
    spare
        The caller counts exactly without the index (token ids): an index
        beside the data that cannot be looked for, or an entry that does not
        match the data, is passed over without a warning.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> from arrowstream.io.manifest import read_manifest
    >>> from arrowstream.testing import example_dir
    >>> m = read_manifest(example_dir())
    >>> index = LengthIndex(m, {"tokenizer": "letters", "column": "text"}, tempfile.mkdtemp())
    >>> letters = lambda texts: (np.zeros(0, np.int32), np.array([len(t) for t in texts]))
    >>> index.build(letters).num_tokens, index.totals().tolist()   # per shard: ids, documents with ids
    (49, [[15, 4], [16, 4], [18, 4]])
    >>> index.lengths(0).tolist()   # zero, one, two, three
    [4, 3, 3, 5]
    """

    def __init__(
        self,
        manifest: Manifest,
        setting: dict[str, Any],
        location: str | os.PathLike[str] | None = None,
        *,
        spare: bool = False,
    ) -> None:
        self.manifest = manifest
        self.setting = {"format": INDEX_FORMAT, **setting}
        key = hashlib.sha256(json.dumps(self.setting, sort_keys=True).encode()).hexdigest()[:16]
        self._fs: PerProcess | None = None  # None: the data's, asked of the manifest each time (fork-safe)
        if location is None:
            parent = f"{manifest.root.rstrip('/')}/{INDEX_DIR}"
        else:
            fs, parent = resolve_filesystem(location)
            self._fs = PerProcess(fs)
        self.dir = f"{parent.rstrip('/')}/{key}"
        self.explicit = location is not None
        # `spare`: the caller counts exactly without it (token ids), so an index beside the data that
        # cannot be asked for or does not match is no news worth a warning
        self.spare = spare
        # per file: (source row groups, ids per row group, documents with ids per row group)
        self._entries: dict[int, tuple[list[int], np.ndarray, np.ndarray]] = {}
        self._open: tuple[int, pq.ParquetFile] | None = None
        self._lock = threading.Lock()

    @property
    def fs(self) -> pafs.FileSystem:
        """The index's filesystem: the data's beside it, else its own; either made again in a forked process."""
        return self.manifest.filesystem if self._fs is None else self._fs.get()

    def entry_path(self, file: int) -> str:
        """Return the path of source file ``file``'s entry."""
        return f"{self.dir}/{self.manifest.relpaths[file]}.lengths"

    def exists(self) -> bool:
        """Return whether the setting's directory holds an ``index.json``.

        Raises
        ------
        CacheError
            The storage cannot be asked (for an index named explicitly;
            beside the data, a warning says so and there is no index).
        """
        path = f"{self.dir}/index.json"
        if self.spare and not self.explicit:
            # opened rather than looked up: on object storage a lookup of a missing key also lists its
            # prefix, and every process over token ids asks (with a manifest, nothing else lists)
            try:
                with self.fs.open_input_stream(path):
                    return True
            except OSError:  # missing, or not to be asked: the ids are counted without it
                return False
        try:
            return self.fs.get_file_info(path).type == pafs.FileType.File
        except OSError as exc:
            message = f"cannot look for a length index in {self.dir!r}: {exc}"
            if self.explicit:
                raise CacheError(f"{message}; check the path and the storage's credentials") from exc
            warn_user(CacheWarning(f"{message}: even batches are estimated"))
            return False

    # -- reading ------------------------------------------------------------------------

    def _is_file(self, path: str) -> bool:
        """Return whether ``path`` is a file, or raise :class:`CacheError` naming it when the storage cannot say."""
        try:
            return self.fs.get_file_info(path).type == pafs.FileType.File
        except OSError as exc:
            raise CacheError(
                f"cannot look up the length index entry {path!r}: {exc}; check the storage and its "
                "credentials, or pass length_index=False"
            ) from exc

    def entry(self, file: int, *, quiet: bool = False) -> tuple[list[int], np.ndarray, np.ndarray] | None:
        """Return ``file``'s (row groups, ids, documents with ids) from its entry's footer; ``None`` when missing or stale.

        A stale entry raises for an explicit index and warns otherwise (see :meth:`_stale`).

        ``quiet``: a stale entry is only ``None`` (a build makes it again).
        """
        hit = self._entries.get(file)
        if hit is not None:
            return hit
        path = self.entry_path(file)
        if not self._is_file(path):
            return None
        try:
            with self.fs.open_input_file(path) as f:
                meta = json.loads((pq.read_metadata(f).metadata or {}).get(_META, b"null"))
            identity, groups = meta["identity"], meta["row_groups"]
            ids, docs = np.array(meta["ids"], np.int64), np.array(meta["docs"], np.int64)
        except (pa.ArrowInvalid, OSError, ValueError, KeyError, TypeError) as exc:
            return None if quiet else self._stale(path, f"it cannot be read ({exc})")
        expected = self.manifest.file_identity(file)
        if identity != expected:
            return None if quiet else self._stale(path, f"built from {identity!r}, the data is now {expected!r}")
        self._entries[file] = hit = (list(groups), ids, docs)
        return hit

    def _stale(self, path: str, why: str) -> None:
        message = f"length index entry {path!r} does not match the data: {why}"
        if self.explicit:
            raise CacheError(f"{message}; rebuild it with `arrowstream index` or delete the entry")
        if not self.spare:
            warn_user(
                CacheWarning(f"{message}: even batches are estimated; rebuild it with `arrowstream index`"),
            )
        return None

    def totals(self) -> np.ndarray | None:
        """Return, per shard, ``(ids, documents with at least one id)``, or ``None`` when a file is not covered.

        Only the entries' footers are read.

        Raises
        ------
        CacheError
            An explicit index (``location`` given) is missing, does not cover
            a file, or has an entry that does not match the data.
        """
        m = self.manifest
        if not self.exists():
            if self.explicit:
                raise CacheError(
                    f"no length index for this tokenizer and column in {self.dir.rsplit('/', 1)[0]!r}: "
                    "build one with `arrowstream index PATH --tokenizer T` (same column and "
                    "special-tokens setting)"
                )
            return None
        self._check_setting()
        out = np.zeros((m.num_shards, 2), dtype=np.int64)
        for file in np.unique(m.shard_file).tolist():
            entry = self.entry(file)
            if entry is None:
                if self.explicit and not self._is_file(self.entry_path(file)):
                    raise CacheError(
                        f"length index {self.dir!r} does not cover {m.paths[file]!r}: run "
                        "`arrowstream index` again (it builds only what is missing)"
                    )
                return None
            groups, ids, docs = entry
            for shard in np.flatnonzero(m.shard_file == file).tolist():
                k = groups.index(int(m.shard_row_group[shard]))
                out[shard] = ids[k], docs[k]
        return out

    def lengths(self, shard: int) -> np.ndarray:
        """Return the ids of every document of ``shard`` (0 for an empty or null one); reads one row group."""
        m = self.manifest
        file = int(m.shard_file[shard])
        entry = self.entry(file)
        if entry is None:
            raise CacheError(f"length index {self.dir!r} has no usable entry for {m.paths[file]!r}")
        k = entry[0].index(int(m.shard_row_group[shard]))
        path = self.entry_path(file)
        try:
            with self._lock:  # plans are shared by the threads of a process
                if self._open is None or self._open[0] != file:
                    self.close()
                    # pages written by this release carry checksums: a flipped bit is an error, not a count
                    self._open = (file, pq.ParquetFile(self.fs.open_input_file(path), page_checksum_verification=True))
                column = self._open[1].read_row_group(k).column("tokens")
            out = pc.fill_null(column, 0).to_numpy().astype(np.int64)
        except (pa.ArrowException, OSError) as exc:
            self.close()
            raise self._corrupt(path, k, f"it cannot be read ({exc})") from exc
        if int(out.sum()) != int(entry[1][k]) or out.size != int(m.shard_rows[shard]):
            raise self._corrupt(
                path, k, f"{out.size} counts summing to {int(out.sum())}, its footer says "
                f"{int(m.shard_rows[shard])} rows and {int(entry[1][k])} ids"
            )
        return out

    def _corrupt(self, path: str, row_group: int, why: str) -> CacheError:
        return CacheError(
            f"length index entry {path!r}, row group {row_group}, column 'tokens' is corrupt: {why}. "
            "Delete that entry and run `arrowstream index` again (it rebuilds only what is missing), "
            "or pass length_index=False to estimate even batches without it"
        )

    def _check_setting(self) -> None:
        with self.fs.open_input_stream(f"{self.dir}/index.json") as f:
            saved = json.loads(f.read())
        if saved != self.setting:
            raise CacheError(
                f"length index {self.dir!r} states the setting {saved!r}, not {self.setting!r}: it "
                "was edited or copied from elsewhere; delete that directory"
            )

    # -- building -------------------------------------------------------------------------

    def build(
        self,
        encode: Encode | None,
        *,
        column: str = "text",
        slice_bytes: int = 1 << 18,
        num_threads: int = 3,
        progress: Callable[[int], None] | None = None,
        shard: tuple[int, int] = (0, 1),
    ) -> IndexSummary:
        """Count every document's ids with ``encode`` and write the entries missing or stale.

        ``encode`` ``None``: ``column`` holds token ids, and a document's
        count is its list's length (null for a null list). ``progress`` is called with the row groups done after each one.
        Files whose entry matches the data are kept as they are. ``shard``
        ``(i, n)``: only every ``n``-th file from the ``i``-th (one process
        of ``n``; entries are per file, written whole).
        """
        t0 = time.perf_counter()
        m = self.manifest
        info = f"{self.dir}/index.json"
        try:
            self.fs.create_dir(self.dir, recursive=True)
            if self.exists():
                self._check_setting()
            else:
                _write_whole(self.fs, info, json.dumps(self.setting, sort_keys=True, indent=1).encode())
        except OSError as exc:
            raise CacheError(
                f"cannot write the length index in {self.dir!r}: {exc}; keep it elsewhere with "
                "`--index DIR` (`length_index=DIR` in Python), and pass the same directory to the "
                "pipeline (`--length-index`, or `.tokenize(..., length_index=DIR)`)"
            ) from exc
        built = num_tokens = 0
        files = range(shard[0], m.num_files, shard[1])
        reader = ShardReader(m, [column])
        try:
            with ThreadPoolExecutor(max(1, num_threads), thread_name_prefix="arrowstream-index") as pool:
                for file in files:
                    shards = np.flatnonzero(m.shard_file == file).tolist()
                    entry = self.entry(file, quiet=True)  # a stale entry is simply built again
                    if entry is None:
                        per_group = []
                        for shard in shards:
                            values = reader.read(shard).column(column).combine_chunks()
                            per_group.append(
                                pc.cast(pc.list_value_length(values), pa.int32())
                                if encode is None
                                else encode_lengths(encode, values, pool, slice_bytes)
                            )
                            if progress is not None:
                                progress(1)
                        try:
                            self._write(file, [int(m.shard_row_group[s]) for s in shards], per_group)
                        except OSError as exc:
                            raise CacheError(
                                f"cannot write length index entry {self.entry_path(file)!r}: {exc}; free "
                                "space or keep the index elsewhere (`--index DIR`), then run again: "
                                "the files already counted are kept"
                            ) from exc
                        built += 1
                        entry = self.entry(file)
                        assert entry is not None
                    elif progress is not None:
                        progress(len(shards))
                    num_tokens += int(entry[1].sum())
        finally:
            reader.close()
        rows = int(m.shard_rows[np.isin(m.shard_file, list(files))].sum())
        return IndexSummary(self.dir, len(files), built, rows, num_tokens, time.perf_counter() - t0)

    def _write(self, file: int, groups: list[int], per_group: list[pa.Array]) -> None:
        ids = [int(pc.sum(a).as_py() or 0) for a in per_group]
        docs = [int(pc.sum(pc.greater(a, 0)).as_py() or 0) for a in per_group]
        meta = {"identity": self.manifest.file_identity(file), "row_groups": groups, "ids": ids, "docs": docs}
        schema = pa.schema([("tokens", pa.int32())], metadata={_META: json.dumps(meta).encode()})
        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(sink, schema, compression="zstd", write_page_checksum=True) as writer:
            for a in per_group:  # one Parquet row group per source row group
                writer.write_table(pa.table({"tokens": a}, schema=schema), row_group_size=max(1, len(a)))
        _write_whole(self.fs, self.entry_path(file), sink.getvalue().to_pybytes())
        self._entries.pop(file, None)

    def close(self) -> None:
        """Close the entry kept open by :meth:`lengths`."""
        if self._open is not None:
            self._open[1].close()
            self._open = None


def encode_lengths(encode: Encode, texts: pa.Array, pool: ThreadPoolExecutor, slice_bytes: int) -> pa.Array:
    """Return the ids each text encodes to (``int32``; 0 for an empty text, null for a null one).

    Texts are encoded in slices of about ``slice_bytes``, several at once on
    ``pool`` (the encoders release the GIL); empty texts are not encoded, as
    the tokenize stage drops them before encoding.
    """
    size = pc.fill_null(pc.binary_length(texts), 0).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(size > 0)
    out = np.zeros(len(texts), dtype=np.int32)
    cuts = _slices(np.cumsum(size[rows]), slice_bytes)
    parts = [rows[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    for part, lens in zip(parts, pool.map(lambda p: encode(texts.take(p).to_pylist())[1], parts)):
        out[part] = lens
    return pa.array(out, mask=~texts.is_valid().to_numpy(zero_copy_only=False))


def _slices(cum: np.ndarray, budget: int) -> list[int]:
    """Return cut points of rows whose running bytes are ``cum`` into runs of about ``budget`` bytes."""
    if cum.size == 0:
        return [0]
    ends = np.searchsorted(cum, np.arange(budget, int(cum[-1]) + budget, budget), side="left") + 1
    return [0, *sorted(set(np.minimum(ends, cum.size).tolist()))]


def _write_whole(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``path`` so that no reader ever sees part of it."""
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    if not isinstance(fs, pafs.LocalFileSystem):  # object storage: one upload appears whole
        with fs.open_output_stream(path) as f:
            f.write(data)
        return
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with fs.open_output_stream(tmp) as f:
            f.write(data)
        fs.move(tmp, path)
    except BaseException:
        fs.delete_file(tmp) if fs.get_file_info(tmp).type == pafs.FileType.File else None
        raise

