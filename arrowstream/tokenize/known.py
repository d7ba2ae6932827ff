"""What a tokenize stage can tell of its tokens before an epoch is read.

Three sources know every row's tokens ahead: a column of token ids (its
Parquet footers count the ids of each row group, its offsets those of each
row), a read-only token cache that holds every row group (the entries'
footers and offsets, the same way), and a length index that covers the data
(see :mod:`~arrowstream.tokenize.lengths`). Text without one of them cannot
be counted before it is tokenized. A writable cache does not count either: it
fills while consumers run, so they could disagree on what it holds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowstream.core.stage import KnownTokens
from arrowstream.io.manifest import Manifest
from arrowstream.io.reader import ShardReader
from arrowstream.tokenize.cache import TokenCache
from arrowstream.tokenize.lengths import LengthIndex

__all__ = ["known_tokens"]


def known_tokens(
    manifest: Manifest,
    column: str,
    *,
    eos: int,
    ids: bool,
    cache: TokenCache | None,
    index: LengthIndex | None,
) -> KnownTokens | None:
    """Return how to tell each row's tokens (ids plus ``eos``, 0 for a null or empty row), or ``None``.

    Parameters
    ----------
    manifest
        The dataset.
    column
        The text column, or the column of token ids when ``ids``.
    eos
        Tokens added to every document that has ids (1 with an EOS, else 0).
    ids
        Whether ``column`` holds token ids.
    cache, index
        The stage's token cache and the length index to look for (either may
        be ``None``). A complete read-only cache comes first. Over token ids,
        an index gives the rows' counts, file by file, in place of
        reading the ids (the footers give whole row groups' either way).

    Examples
    --------
    >>> from arrowstream.testing import example_dir
    >>> from arrowstream.io.manifest import read_manifest
    >>> m = read_manifest(example_dir())
    >>> known = known_tokens(m, "ids", eos=1, ids=True, cache=None, index=None)
    >>> known.per_shard.tolist(), known.lengths(0).tolist(), known.source
    ([14, 14, 14], [4, 2, 3, 5], 'token ids')
    """

    def per_row(values: pa.Array) -> np.ndarray:
        lengths = pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False)
        return np.where(lengths > 0, lengths.astype(np.int64) + eos, 0)

    if ids:

        def from_column(shard: int) -> np.ndarray:
            # a row group that cannot be read raises here, naming it: counted as no token, it could fall
            # outside every share and never be read (a whole dataset behind a refusal gave no batch and
            # no error). Under on_error="skip" the plan counts one that does not decode as no token.
            reader = ShardReader(manifest, [column], warn=False)
            try:
                return per_row(reader.read(shard).column(column).combine_chunks())
            finally:
                reader.close()

        elements, empty = manifest.list_values(column), manifest.list_empty_rows(column)
        per_shard = None if elements is None or empty is None else elements + eos * (manifest.shard_rows - empty)
        if index is None:
            return KnownTokens(from_column, per_shard)
        return KnownTokens(_index_first(index, from_column, eos), per_shard, rows_from=INDEX_FIRST)
    counts = None if cache is None or cache.writable else cache.counts(manifest)
    if cache is not None and counts is not None:

        def from_cache(shard: int) -> np.ndarray:
            ids = cache.read(manifest, shard)
            assert ids is not None  # every entry was there
            return per_row(ids)

        per_shard = counts[:, 0] + eos * (manifest.shard_rows - counts[:, 1])
        return KnownTokens(from_cache, per_shard, source="a read-only token cache")
    totals = None if index is None else index.totals()
    if index is None or totals is None:
        return None

    def from_index(shard: int) -> np.ndarray:
        lengths = index.lengths(shard)
        return np.where(lengths > 0, lengths + eos, 0)

    return KnownTokens(from_index, totals[:, 0] + eos * totals[:, 1], source="a length index")


#: How :attr:`KnownTokens.rows_from` says a column of ids's row lengths come from an index when there is one.
INDEX_FIRST = ", from a length index where there is one, else read"


def _index_first(index: LengthIndex, read: Callable[[int], np.ndarray], eos: int) -> Callable[[int], np.ndarray]:
    """Return a shard's tokens per row from ``index`` where its file has an entry, else from ``read`` (the ids themselves).

    The index is looked for at the first call, so a plan that needs no
    row's count (whole row groups come from the footers) asks nothing of
    the storage; then only the entries of the files asked for are read,
    since without a shuffle a plan weighs only the few row groups its cuts
    fall in.
    """
    found: list[bool] = []
    manifest = index.manifest

    def lengths(shard: int) -> np.ndarray:
        if not found:
            found.append(index.exists())
        # an explicit index's stale entry is an error, as for text; beside the data it is passed over
        if found[0] and index.entry(int(manifest.shard_file[shard]), quiet=not index.explicit) is not None:
            counts = index.lengths(shard)
            return np.where(counts > 0, counts + eos, 0)
        return read(shard)

    return lengths
