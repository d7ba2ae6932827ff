"""Exact token counts of consumers' shares, when the pipeline can tell them before an epoch.

Over a column of token ids (:meth:`~arrowstream.core.stage.Stage.known_tokens`),
the tokens a share of an epoch gives the packer are known before reading it:
whole row groups from the Parquet footers, parts of row groups from their
per-row counts, read once per process and kept. :func:`range_tokens` adds up
the tokens of a consumer's row range in the order the layout emits it, so the
even-batches target can be the exact largest batch count of all consumers:
no consumer then has a document beyond it (nothing is dropped) and the others
pad up to it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from arrowstream.core.stage import KnownTokens
from arrowstream.io.chunk import Chunk
from arrowstream.io.layout import Layout, ShuffleWindow
from arrowstream.io.manifest import Manifest
from arrowstream.state import RowRange

__all__ = [
    "KEPT_SHARDS",
    "BatchCut",
    "TokenCounts",
    "batch_cut",
    "batch_recut",
    "batch_share",
    "emitted_lengths",
    "part_chunks",
    "part_tokens",
    "range_tokens",
    "rank_targets",
    "token_cut",
]

#: Row groups whose per-row token counts a :class:`TokenCounts` keeps at once.
KEPT_SHARDS = 64


class TokenCounts:
    """Tokens per row of every shard, read only where the footers do not tell.

    Parameters
    ----------
    manifest
        The dataset's manifest.
    known
        What the tokenize stage tells: how to read a shard's tokens per row,
        and tokens per shard from footers.

    Examples
    --------
    >>> from arrowstream.io.manifest import read_manifest
    >>> from arrowstream.testing import example_dir
    >>> from arrowstream.tokenize import Tokenize
    >>> m = read_manifest(example_dir())
    >>> counts = TokenCounts(m, Tokenize(None, column="ids", eos_id=0).known_tokens(m))
    >>> counts.total(0), counts.rows(0, 1, 3), counts.num_reads   # ids of lengths 3, 1, 2, 4 (+ EOS)
    (14, 5, 1)
    """

    def __init__(self, manifest: Manifest, known: KnownTokens) -> None:
        self.manifest = manifest
        self.known = known
        # a few row groups' per-row counts (memory stays flat whatever the corpus), and the
        # sums asked of row ranges (two integers a range)
        self._lengths: OrderedDict[int, np.ndarray] = OrderedDict()
        self._sums: dict[tuple[int, int, int], int] = {}
        self.num_reads = 0

    def lengths(self, shard: int) -> np.ndarray:
        """Return the tokens of every row of ``shard`` (the last :data:`KEPT_SHARDS` read are kept)."""
        hit = self._lengths.pop(shard, None)
        if hit is None:
            hit = self.known.lengths(shard)
            self.num_reads += 1
            while len(self._lengths) >= KEPT_SHARDS:
                self._lengths.popitem(last=False)
        self._lengths[shard] = hit
        return hit

    def total(self, shard: int) -> int:
        """Return the tokens of ``shard``: from the footers when they tell, else read."""
        if self.known.per_shard is not None:
            return int(self.known.per_shard[shard])
        return int(self.lengths(shard).sum())

    def rows(self, shard: int, lo: int, hi: int) -> int:
        """Return the tokens of rows ``lo..hi-1`` of ``shard``."""
        if lo == 0 and hi == int(self.manifest.shard_rows[shard]):
            return self.total(shard)
        key = (shard, lo, hi)
        if key not in self._sums:
            self._sums[key] = int(self.lengths(shard)[lo:hi].sum())
        return self._sums[key]


def _pieces(window: ShuffleWindow) -> list[tuple[int, int, int]]:
    """The window's ``(shard, first row, end row)`` pieces."""
    return list(zip(window.shards.tolist(), window.row_lo.tolist(), window.row_hi.tolist()))


def emitted_lengths(window: ShuffleWindow, counts: TokenCounts) -> np.ndarray:
    """Return the tokens of the window's rows, in the order it emits them."""
    rows = np.concatenate([counts.lengths(s)[a:b] for s, a, b in _pieces(window)])
    return rows[window.order] if window.order is not None else rows


def _unit_tokens(layout: Layout, counts: TokenCounts) -> tuple[list[tuple[int, int, int]], np.ndarray]:
    """Return the layout's row ranges and the tokens before each (and after the last), in their order."""
    units = list(zip(layout.unit_shard.tolist(), layout.unit_lo.tolist(), layout.unit_hi.tolist()))
    tokens = np.zeros(len(units) + 1, dtype=np.int64)
    if units:
        np.cumsum([counts.rows(s, a, b) for s, a, b in units], out=tokens[1:])
    return units, tokens


def range_tokens(layout: Layout, counts: TokenCounts, stream: int, start: int, end: int) -> int:
    """Return the tokens of positions ``start..end-1`` of ``stream``, in the layout's emission order.

    Whole shuffle windows add up their row ranges (whole row groups from the
    footers); a window cut by ``start`` or ``end`` reads its rows' counts and
    takes those of the positions inside.
    """
    total = 0
    for window in layout.windows(stream):
        n = window.num_rows
        lo, hi = max(start, window.start), min(end, window.start + n)
        if lo >= hi:
            continue
        if lo == window.start and hi == window.start + n:
            total += sum(counts.rows(s, a, b) for s, a, b in _pieces(window))
            continue
        total += int(emitted_lengths(window, counts)[lo - window.start : hi - window.start].sum())
    return total


def part_tokens(layout: Layout, counts: TokenCounts, part: Sequence[RowRange]) -> int:
    """Return the tokens of a consumer's share: its row ranges, less the tokens emitted elsewhere.

    A range's ``skip`` tokens of its first row went out before (or to another
    consumer), and with a ``take`` only that many tokens of its last row are
    this share's.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.io.manifest import read_manifest
    >>> from arrowstream.testing import example_dir
    >>> from arrowstream.tokenize import Tokenize
    >>> m = read_manifest(example_dir())
    >>> counts = TokenCounts(m, Tokenize(None, column="ids", add_eos=False).known_tokens(m))
    >>> lay = Layout(np.arange(3), m.shard_rows, epoch=0, seed=None, window=1, num_streams=2)
    >>> part_tokens(lay, counts, [(0, 0, 6, 0, 0)]), part_tokens(lay, counts, [(1, 0, 6, 2, 0)])
    (14, 14)
    >>> part_tokens(lay, counts, [(0, 0, 5, 0, 1)])   # 3 + 1 + 2 + 4, and 1 of the last row's 3
    11
    """
    total = 0
    for s, a, b, skip, take in part:
        total += range_tokens(layout, counts, s, a, b) - skip
        if take and b > a:
            shard, row = layout.locate(s, b - 1)
            total -= int(counts.lengths(shard)[row]) - take
    return total


def part_chunks(
    layout: Layout, counts: TokenCounts, part: Sequence[RowRange], batch_rows: int
) -> Iterator[Chunk]:
    """Yield stand-ins for the chunks a consumer's share gives its packer: the documents' lengths, no tokens.

    The chunks are cut where the pipeline cuts them (a grid of
    ``batch_rows`` rows from each shuffle window's start, and the segments'
    ends), hold the documents in the order they are emitted, leave out those
    without tokens (as the tokenize stage does) and take off the tokens a
    segment's first document already gave. Their tokens are views of one
    zero array, so a packer run over them (:meth:`~arrowstream.pack.base.Packer.count_batches`)
    makes exactly the pipeline's decisions with memory that does not grow
    with the share.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.io.manifest import read_manifest
    >>> from arrowstream.testing import example_dir
    >>> from arrowstream.tokenize import Tokenize
    >>> m = read_manifest(example_dir())   # ids of lengths 3, 1, 2, 4 repeating
    >>> counts = TokenCounts(m, Tokenize(None, column="ids", add_eos=False).known_tokens(m))
    >>> lay = Layout(np.arange(3), m.shard_rows, epoch=0, seed=None, window=1, num_streams=1)
    >>> [np.diff(c.offsets).tolist() for c in part_chunks(lay, counts, [(0, 1, 6, 0, 0)], batch_rows=3)]  # grid of 3 rows from each row group
    [[1, 2], [4], [3, 1]]
    """
    zeros = np.zeros(0, dtype=np.int32)
    for k, (stream, lo, hi, skip, take) in enumerate(part):
        for window in layout.windows(stream):
            offset, n = max(0, lo - window.start), min(window.num_rows, hi - window.start)
            if offset >= n:
                continue
            rows = emitted_lengths(window, counts)
            a = offset
            while a < n:
                b = min((a // batch_rows + 1) * batch_rows, n)
                lengths = rows[a:b].copy()
                if skip and window.start + a == lo:
                    lengths[0] -= skip  # tokens the first document already gave
                if take and window.start + b == hi:
                    lengths[-1] -= rows[b - 1] - take  # tokens another consumer gives
                keep = lengths > 0
                kept = lengths[keep]
                offsets = np.zeros(kept.size + 1, dtype=np.int64)
                np.cumsum(kept, out=offsets[1:])
                if zeros.size < offsets[-1]:
                    zeros = np.zeros(int(offsets[-1]) * 2, dtype=np.int32)
                yield Chunk(
                    epoch=layout.epoch,
                    shard=int(window.shards[0]),
                    seq_start=window.start + a,
                    seq_end=window.start + b,
                    row_start=a,
                    seq=np.arange(window.start + a, window.start + b, dtype=np.int64)[keep],
                    tokens=zeros[: int(offsets[-1])],
                    offsets=offsets,
                    segment=k,
                )
                a = b


def token_cut(layout: Layout, counts: TokenCounts) -> np.ndarray:
    """Return where ``layout``'s streams should start and end for equal tokens, as row positions.

    The positions follow the layout's row ranges (before any shuffle window
    permutes rows inside a stream). Each cut falls on the row whose tokens
    bring the running total nearest to its share; only the row groups a cut
    falls in are read (with ``.shuffle``'s half row groups, every row group,
    to weigh its halves).

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.io.manifest import read_manifest
    >>> from arrowstream.testing import example_dir
    >>> from arrowstream.tokenize import Tokenize
    >>> m = read_manifest(example_dir())   # ids of lengths 3, 1, 2, 4 repeating: 30 tokens
    >>> counts = TokenCounts(m, Tokenize(None, column="ids", add_eos=False).known_tokens(m))
    >>> lay = Layout(np.arange(3), m.shard_rows, epoch=0, seed=None, window=1, num_streams=2)
    >>> cut = token_cut(lay, counts)
    >>> cut.tolist(), [int(counts.lengths(0)[:4].sum() + counts.lengths(1)[:2].sum())]
    ([0, 6, 12], [14])
    """
    n = layout.num_streams
    units, tokens = _unit_tokens(layout, counts)
    if not units:
        return np.zeros(n + 1, dtype=np.int64)
    total = int(tokens[-1])
    cut = [0]
    for k in range(1, n):
        want = total * k / n
        u = min(int(np.searchsorted(tokens, want, side="right")) - 1, len(units) - 1)
        s, a, b = units[u]
        before = int(tokens[u]) + np.concatenate([[0], np.cumsum(counts.lengths(s)[a:b])])
        r = int(np.argmin(np.abs(before - want)))  # rows of the unit before the cut
        cut.append(max(cut[-1], int(layout.cum[u]) + r))
    cut.append(layout.num_rows)
    return np.array(cut, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class BatchCut:
    """An epoch cut into streams of whole batches of tokens (for a packer that counts batches by tokens).

    Consumer ``i`` emits the epoch's tokens ``ends[i]..ends[i+1]-1``:
    ``floor(i * N / n)`` batches of ``per_batch`` tokens come before it (``N``
    batches in all, ``n`` consumers), so every consumer's share, and every
    rank's (any number of consecutive consumers), is a whole number of
    batches within one of the others', and only the last holds a partial
    batch. Stream ``k`` holds the rows ``rows[k]..rows[k+1]-1`` (in the
    order of the layout's row ranges) and the epoch's tokens
    ``starts[k]..starts[k+1]-1``, taken in the stream's emission order: its
    first row is the one holding token ``ends[k]``, so a share is the rest of
    its own stream and the head of the next, and the document at a cut is
    split between two consumers where a batch ends (:func:`batch_share`).
    """

    rows: np.ndarray  # n + 1 row positions
    starts: np.ndarray  # n + 1 token positions: where each stream's tokens start
    ends: np.ndarray  # n + 1 token positions: where each consumer's tokens start


def batch_cut(layout: Layout, counts: TokenCounts, per_batch: int) -> BatchCut:
    """Cut ``layout``'s rows into streams whose consumers get whole batches of ``per_batch`` tokens.

    ``layout`` gives the order of the row ranges and the stream count (its
    own cut does not matter); build the epoch's layout with ``cut=rows``.

    Only the row groups a cut falls in are read (with ``.shuffle``'s half
    row groups, every row group, to weigh its halves).

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.io.manifest import read_manifest
    >>> from arrowstream.testing import example_dir
    >>> from arrowstream.tokenize import Tokenize
    >>> m = read_manifest(example_dir())   # ids of lengths 3, 1, 2, 4 repeating: 30 tokens
    >>> counts = TokenCounts(m, Tokenize(None, column="ids", add_eos=False).known_tokens(m))
    >>> lay = Layout(np.arange(3), m.shard_rows, epoch=0, seed=None, window=1, num_streams=3)
    >>> cut = batch_cut(lay, counts, per_batch=4)   # 8 batches: 2, 3 and 3 (the last one partial)
    >>> cut.ends.tolist(), cut.rows.tolist(), cut.starts.tolist()   # token 8 is in row 3 (tokens 6..9)
    ([0, 8, 20, 30], [0, 3, 8, 12], [0, 6, 20, 30])
    """
    n = layout.num_streams
    units, tokens = _unit_tokens(layout, counts)
    total = int(tokens[-1])
    num_batches = -(-total // per_batch)
    ends = np.array([min(i * num_batches // n * per_batch, total) for i in range(n + 1)], dtype=np.int64)
    ends[-1] = total
    rows, starts = [0], [0]
    for k in range(1, n):
        at = int(ends[k])
        if at >= total:
            rows.append(layout.num_rows)
            starts.append(total)
            continue
        u = int(np.searchsorted(tokens, at, side="right")) - 1  # the unit holding token `at`
        s, a, b = units[u]
        row_ends = int(tokens[u]) + np.cumsum(counts.lengths(s)[a:b])
        r = int(np.searchsorted(row_ends, at, side="right"))  # the row holding it
        rows.append(int(layout.cum[u]) + r)
        starts.append(int(row_ends[r - 1]) if r else int(tokens[u]))
    rows.append(layout.num_rows)
    starts.append(total)
    return BatchCut(np.array(rows, dtype=np.int64), np.array(starts, dtype=np.int64), ends)


def _stream_offset(layout: Layout, counts: TokenCounts, stream: int, offset: int) -> tuple[int, int]:
    """Return ``(position, tokens before it)``: the row of ``stream`` holding its ``offset``-th token in emission order."""
    before = 0
    for window in layout.windows(stream):
        size = sum(counts.rows(s, a, b) for s, a, b in _pieces(window))
        if offset >= before + size:
            before += size
            continue
        row_ends = before + np.cumsum(emitted_lengths(window, counts))
        r = int(np.searchsorted(row_ends, offset, side="right"))
        return window.start + r, offset - (int(row_ends[r - 1]) if r else before)
    raise ValueError(f"token {offset} is past stream {stream}'s {before} tokens")


def batch_share(layout: Layout, counts: TokenCounts, cut: BatchCut, consumer: int) -> list[RowRange]:
    """Return ``consumer``'s work in an epoch cut by :func:`batch_cut`: its token range, as row ranges.

    Each stream's tokens are taken in its emission order, so a share is a
    suffix of its own stream (after the tokens that went to the consumers
    before) and a prefix of the next non-empty one; a document longer than a
    share spans several, each taking a part of it.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.io.manifest import read_manifest
    >>> from arrowstream.testing import example_dir
    >>> from arrowstream.tokenize import Tokenize
    >>> m = read_manifest(example_dir())   # ids of lengths 3, 1, 2, 4 repeating
    >>> counts = TokenCounts(m, Tokenize(None, column="ids", add_eos=False).known_tokens(m))
    >>> lay = Layout(np.arange(3), m.shard_rows, epoch=0, seed=None, window=1, num_streams=3)
    >>> cut = batch_cut(lay, counts, per_batch=4)
    >>> lay = Layout(np.arange(3), m.shard_rows, epoch=0, seed=None, window=1, num_streams=3, cut=cut.rows)
    >>> [batch_share(lay, counts, cut, i) for i in range(3)]   # 8 tokens, 12 and 10: 2, 3 and 3 batches
    [[(0, 0, 3, 0, 0), (1, 0, 1, 0, 2)], [(1, 0, 5, 2, 0)], [(2, 0, 4, 0, 0)]]
    """
    lo, hi = int(cut.ends[consumer]), int(cut.ends[consumer + 1])
    if int(cut.ends[-1]) == 0 and consumer == 0:  # no token at all (every row empty, null or unreadable):
        # the first consumer still reads every row, so its counters say what became of them
        return [(k, 0, layout.stream_rows(k), 0, 0) for k in range(layout.num_streams)]
    if hi <= lo:  # fewer batches than consumers: this one has no token (it pads to the others' count)
        return [(consumer, 0, 0, 0, 0)]
    out: list[RowRange] = []
    for k in range(consumer, layout.num_streams):
        a, b = int(cut.starts[k]), int(cut.starts[k + 1])
        if a >= hi:
            break
        if b <= lo or a == b:
            continue
        first, skip = _stream_offset(layout, counts, k, lo - a) if lo > a else (0, 0)
        if hi >= b:
            out.append((k, first, layout.stream_rows(k), skip, 0))
            continue
        last, take = _stream_offset(layout, counts, k, hi - a)
        if take:
            out.append((k, first, last + 1, skip, take))
        elif last > first:
            out.append((k, first, last, skip, 0))
    return out or [(consumer, 0, 0, 0, 0)]


def batch_recut(
    layout: Layout, counts: TokenCounts, pool: Sequence[RowRange], per_batch: int, parts: int
) -> list[list[RowRange]]:
    """Cut pooled row ranges of ``layout`` (the rows a merged state has left), in order, into ``parts`` shares of whole batches.

    The re-deal of an elastic resume for a packer whose batches the tokens
    decide (``concat``): the pool's tokens are dealt like a fresh epoch's
    (:class:`BatchCut`), share ``i`` from batch ``floor(i * N / parts)`` on,
    so every new rank's count for the rest of the epoch is within one of
    the others'. Each range keeps its ``skip`` on its first row and its
    ``take`` on its last; a cut inside a document splits it.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.io.manifest import read_manifest
    >>> from arrowstream.testing import example_dir
    >>> from arrowstream.tokenize import Tokenize
    >>> m = read_manifest(example_dir())   # ids of lengths 3, 1, 2, 4 repeating
    >>> counts = TokenCounts(m, Tokenize(None, column="ids", add_eos=False).known_tokens(m))
    >>> lay = Layout(np.arange(3), m.shard_rows, epoch=0, seed=None, window=1, num_streams=2)
    >>> pool = [(0, 2, 6, 1, 0), (1, 0, 3, 0, 0)]   # 2 + 4 + 3 + 1 less 1, and 2 + 4 + 3 tokens
    >>> batch_recut(lay, counts, pool, per_batch=5, parts=2)   # 4 batches: 2 each (10 tokens, 8)
    [[(0, 2, 6, 1, 0), (1, 0, 1, 0, 1)], [(1, 0, 3, 1, 0)]]
    """
    spans = []  # (range, first token, end token) in the stream's emission order
    for rng in pool:
        stream, start, end, skip, take = rng
        if end <= start:
            continue
        a = range_tokens(layout, counts, stream, 0, start) + skip
        b = range_tokens(layout, counts, stream, 0, end - 1 if take else end) + take
        if b > a:
            spans.append((rng, a, b))
    total = sum(b - a for _, a, b in spans)
    num_batches = -(-total // per_batch)
    ends = [min(i * num_batches // parts * per_batch, total) for i in range(parts + 1)]
    ends[-1] = total
    out: list[list[RowRange]] = [[] for _ in range(parts)]
    offset = 0
    for (stream, start, end, skip, take), a, b in spans:
        for i in range(parts):
            lo, hi = max(ends[i], offset), min(ends[i + 1], offset + b - a)
            if lo >= hi:
                continue
            x, y = a + lo - offset, a + hi - offset  # tokens of the stream, in emission order
            first, head = (start, skip) if x == a else _stream_offset(layout, counts, stream, x)
            if y == b:
                out[i].append((stream, first, end, head, take))
                continue
            last, tail = _stream_offset(layout, counts, stream, y)
            out[i].append((stream, first, last + 1, head, tail) if tail else (stream, first, last, head, 0))
        offset += b - a
    return out


def rank_targets(natural: Sequence[int], per_rank: int) -> list[int]:
    """Return each consumer's target when every rank's total must be equal, from their own batch counts.

    ``natural`` holds every consumer's exact batch count, rank-major
    (``per_rank`` DataLoader workers a rank). DDP needs every rank to take
    the same number of steps, not every worker: a rank's workers may end at
    different times (the DataLoader goes on with the others). So the rank
    total is the largest rank's, and each rank's padding goes to its workers
    with the fewest batches first, so they end as close together as they can.
    No target is below its consumer's own count (nothing is dropped).

    Examples
    --------
    >>> rank_targets([5, 4, 4, 4], per_rank=2)   # rank 0 has 9 batches, rank 1 has 8
    [5, 4, 5, 4]
    >>> rank_targets([5, 4, 4, 4], per_rank=1)   # every consumer is a rank
    [5, 5, 5, 5]
    """
    counts = [int(n) for n in natural]
    if per_rank <= 1 or len(counts) % per_rank:
        return [max(counts, default=0)] * len(counts)
    ranks = [counts[r : r + per_rank] for r in range(0, len(counts), per_rank)]
    total = max(sum(rank) for rank in ranks)
    out: list[int] = []
    for rank in ranks:
        targets = list(rank)
        for _ in range(total - sum(rank)):  # a few batches: one at a time to the lowest, first wins ties
            targets[targets.index(min(targets))] += 1
        out += targets
    return out
