"""Re-dealing an elastic resume's rows in shares of equal tokens, counted or estimated.

A merged state loaded on another topology pools the rows its consumers had
left of the epoch (:func:`~arrowstream.distributed.topology.pools`). Cut by
rows, the new consumers' shares can hold very different tokens: a look-ahead
packer's held documents come back as one row each, most of their tokens
already emitted (``skip``), so a share of such rows is light and a share of
fresh rows heavy, and even batches pad the light ones for the rest of the
epoch. :func:`weighted_recut` cuts the pool between documents where the
running tokens (each row's, less what went out before, or what a held
document's state recorded it has left) come nearest to equal shares; :func:`counted_lengths` gives exact per-row tokens (token ids, a
length index, a read-only cache) and :func:`estimated_lengths` the
even-batches estimate spread over a window's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from arrowstream.distributed.tokens import TokenCounts, emitted_lengths
from arrowstream.distributed.topology import cut_at, held_left
from arrowstream.io.layout import Layout
from arrowstream.state import RowRange

__all__ = ["counted_lengths", "estimated_lengths", "weighted_recut"]

#: ``lengths(stream, start, end)``: the tokens of each of those positions, in emission order.
Lengths = Callable[[int, int, int], np.ndarray]


def counted_lengths(layout: Layout, counts: TokenCounts) -> Lengths:
    """Return the exact tokens of each position of a stream range (as :func:`weighted_recut` asks).

    Examples
    --------
    >>> from arrowstream.io.manifest import read_manifest
    >>> from arrowstream.testing import example_dir
    >>> from arrowstream.tokenize import Tokenize
    >>> m = read_manifest(example_dir())   # ids of lengths 3, 1, 2, 4 repeating
    >>> counts = TokenCounts(m, Tokenize(None, column="ids", add_eos=False).known_tokens(m))
    >>> lay = Layout(np.arange(3), m.shard_rows, epoch=0, seed=None, window=1, num_streams=1)
    >>> counted_lengths(lay, counts)(0, 2, 7).tolist()
    [2, 4, 3, 1, 2]
    """

    def lengths(stream: int, start: int, end: int) -> np.ndarray:
        out = []
        for window in layout.windows(stream):
            lo, hi = max(start, window.start), min(end, window.start + window.num_rows)
            if lo < hi:
                out.append(emitted_lengths(window, counts)[lo - window.start : hi - window.start])
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    return lengths


def estimated_lengths(layout: Layout, shard_rows: np.ndarray, shard_tokens: np.ndarray) -> Lengths:
    """Return each position's share of its window's estimated tokens (``shard_tokens`` per row group).

    A window's rows are taken as equally long, as the even-batches estimate
    takes them (:meth:`~arrowstream.io.layout.Layout.range_bytes`).

    Examples
    --------
    >>> rows = np.array([4, 2])
    >>> lay = Layout(np.arange(2), rows, epoch=0, seed=None, window=1, num_streams=1)
    >>> estimated_lengths(lay, rows, np.array([40.0, 60.0]))(0, 2, 6).tolist()
    [10.0, 10.0, 30.0, 30.0]
    """
    per_row = shard_tokens / np.maximum(shard_rows, 1)

    def lengths(stream: int, start: int, end: int) -> np.ndarray:
        out = []
        for window in layout.windows(stream):
            lo, hi = max(start, window.start), min(end, window.start + window.num_rows)
            if lo < hi:
                size = float(((window.row_hi - window.row_lo) * per_row[window.shards]).sum())
                out.append(np.full(hi - lo, size / window.num_rows))
        return np.concatenate(out) if out else np.zeros(0)

    return lengths


def weighted_recut(
    pool: Sequence[RowRange],
    lengths: Lengths,
    parts: int,
    *,
    left: Mapping[tuple[int, int], int] | None = None,
    counted: bool = True,
) -> list[list[RowRange]]:
    """Cut pooled row ranges, in order, into ``parts`` shares of nearly equal tokens, between rows.

    Each row weighs its tokens, and a range's last row with a ``take`` that
    many; a held document (a range of one row) weighs the tokens ``left``
    records for it, by ``(stream, seq)``, or else, ``counted``, its tokens
    less the ``skip`` it already gave (an estimate's row, whose document
    may be far longer, weighs its estimate whole). A range keeps its
    ``skip`` on its first row and its ``take`` on its last. Each cut falls
    on the row boundary that brings the running total nearest to its share
    (a share can be empty when one document outweighs it).

    Examples
    --------
    >>> rows = {0: np.array([5.0, 5.0, 5.0, 5.0]), 1: np.array([10.0, 10.0])}
    >>> lengths = lambda s, a, b: rows[s][a:b]
    >>> weighted_recut([(0, 0, 4, 0, 0), (1, 0, 2, 0, 0)], lengths, 2)   # 20 and 20 tokens
    [[(0, 0, 4, 0, 0)], [(1, 0, 2, 0, 0)]]
    >>> weighted_recut([(1, 0, 1, 8, 0), (0, 0, 4, 0, 0), (1, 1, 2, 0, 0)], lengths, 2)   # 2 + 20 + 10
    [[(1, 0, 1, 8, 0), (0, 0, 3, 0, 0)], [(0, 3, 4, 0, 0), (1, 1, 2, 0, 0)]]
    >>> weighted_recut([(1, 0, 1, 8, 0), (0, 0, 4, 0, 0), (1, 1, 2, 0, 0)], lengths, 2, left={(1, 0): 30})
    [[(1, 0, 1, 8, 0)], [(0, 0, 4, 0, 0), (1, 1, 2, 0, 0)]]
    """
    known = left or {}
    spans, weights = [], []
    for rng in pool:
        stream, start, end, skip, take = rng
        if end <= start:
            continue
        w = np.array(lengths(stream, start, end), dtype=np.float64)
        if take:
            w[-1] = take
        held = held_left(known, rng)
        if held is not None:
            w[0] = held
        elif counted:
            w[0] = max(w[0] - skip, 0.0)
        spans.append(rng)
        weights.append(w)
    flat = np.concatenate(weights) if weights else np.zeros(0)
    before = np.concatenate([[0.0], np.cumsum(flat)])
    cuts = [0]
    for k in range(1, parts):
        want = before[-1] * k / parts
        i = int(np.searchsorted(before, want))
        if i > 0 and (i == len(before) or want - before[i - 1] <= before[i] - want):
            i -= 1
        cuts.append(max(cuts[-1], i))
    cuts.append(len(flat))
    return cut_at(spans, cuts)
