"""The order of an epoch: shard permutation, streams, shuffle windows.

An epoch's rows are laid out as follows, all derived from ``(seed, epoch)``
and never stored:

1. The epoch's shards (row groups) are put in order: manifest order, or, when
   shuffling, each shard is cut into ``fragments`` equal row ranges (the
   option keeps its first name) and the row ranges of all shards are permuted.
2. Their rows, concatenated in that order, are cut into ``num_streams``
   contiguous ranges of (nearly) equal row counts: the streams.
3. Inside a stream, row ranges are grouped into shuffle windows of
   ``window * fragments`` consecutive ranges (about ``window`` row groups'
   worth of rows); when shuffling, a window's rows are emitted in a permuted
   order, so rows of several row groups mix. More ranges per row group mix
   more row groups in the same memory, at the cost of reading each row group
   ``fragments`` times.

A stream position ``seq`` counts rows in the stream's order; :meth:`Layout.locate`
maps it back to (shard, row). Permutations come from a counter-based hash
(splitmix64) computed with numpy's unsigned integer arithmetic, so the same
seed gives the same order on every platform and every numpy version.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = ["Layout", "ShuffleWindow", "hash_keys", "permutation"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def hash_keys(*words: int, count: int) -> np.ndarray:
    """Return ``count`` pseudo-random uint64 keys determined by ``words``.

    Examples
    --------
    >>> hash_keys(1, 2, count=3).tolist() == hash_keys(1, 2, count=3).tolist()
    True
    >>> bool(hash_keys(1, 2, count=1)[0] != hash_keys(2, 1, count=1)[0])
    True
    """
    state = np.array([0], dtype=np.uint64)
    for w in words:
        state = _mix(state ^ np.uint64(w & 0xFFFFFFFFFFFFFFFF))
    return _mix(state + np.arange(count, dtype=np.uint64))


def permutation(n: int, *words: int) -> np.ndarray:
    """Return a permutation of ``range(n)`` determined by ``words``.

    Examples
    --------
    >>> sorted(permutation(5, 7, 0).tolist())
    [0, 1, 2, 3, 4]
    >>> permutation(5, 7, 0).tolist() == permutation(5, 7, 0).tolist()
    True
    """
    return np.argsort(hash_keys(*words, count=n), kind="stable").astype(np.int64)


@dataclass(frozen=True, slots=True)
class ShuffleWindow:
    """A run of shard pieces whose rows are emitted together.

    Attributes
    ----------
    shards, row_lo, row_hi : numpy.ndarray
        Per piece: manifest shard index and the row range taken from it.
    start : int
        Stream position of the window's first row.
    order : numpy.ndarray or None
        Emission order of the window's rows (indices into the pieces'
        concatenated rows), or ``None`` for natural order.
    """

    shards: np.ndarray
    row_lo: np.ndarray
    row_hi: np.ndarray
    start: int
    order: np.ndarray | None

    @property
    def num_rows(self) -> int:
        """Rows in the window."""
        return int((self.row_hi - self.row_lo).sum())

    def locate(self, offset: int) -> tuple[int, int]:
        """Return (manifest shard, row) of the window's ``offset``-th emitted row."""
        idx = int(self.order[offset]) if self.order is not None else offset
        cum = np.cumsum(self.row_hi - self.row_lo)
        k = int(np.searchsorted(cum, idx, side="right"))
        before = int(cum[k - 1]) if k else 0
        return int(self.shards[k]), int(self.row_lo[k]) + idx - before


class Layout:
    """One epoch's order over the planned shards, cut into streams and windows.

    Parameters
    ----------
    shards
        Manifest indices of the epoch's shards (after statistics pruning).
    shard_rows
        Rows of every manifest shard.
    epoch
        The epoch.
    seed
        Shuffle seed; ``None`` keeps manifest order and natural row order.
    window
        Row groups' worth of rows mixed together when shuffling.
    num_streams
        Contiguous, equal-row ranges the epoch is cut into.
    fragments
        When shuffling, the row ranges each shard is cut into before permuting.
    cut
        Where the streams start and end, as row positions in the order of the
        row ranges (``num_streams + 1`` of them, from 0 to the epoch's rows);
        ``None`` cuts equal rows. See :func:`arrowstream.distributed.tokens.token_cut`.

    Examples
    --------
    >>> import numpy as np
    >>> lay = Layout(np.arange(3), np.array([4, 4, 4]), epoch=0, seed=None, window=2, num_streams=2)
    >>> [lay.stream_rows(s) for s in range(2)], lay.locate(1, 0)
    ([6, 6], (1, 2))
    """

    def __init__(
        self,
        shards: np.ndarray,
        shard_rows: np.ndarray,
        *,
        epoch: int,
        seed: int | None,
        window: int,
        num_streams: int,
        fragments: int = 1,
        cut: np.ndarray | None = None,
    ) -> None:
        self.epoch = epoch
        self.seed = seed
        self.num_streams = num_streams
        shards = np.asarray(shards, dtype=np.int64)
        m = fragments if seed is not None else 1
        rows = np.asarray(shard_rows, dtype=np.int64)[shards]
        parts = np.arange(m, dtype=np.int64)
        lo = (rows[:, None] * parts[None, :]) // m
        hi = (rows[:, None] * (parts[None, :] + 1)) // m
        keep = (hi > lo).ravel()
        self.unit_shard = np.repeat(shards, m)[keep]
        self.unit_lo = lo.ravel()[keep]
        self.unit_hi = hi.ravel()[keep]
        if seed is not None and self.unit_shard.size > 1:
            perm = permutation(self.unit_shard.size, seed, epoch, 0)
            self.unit_shard = self.unit_shard[perm]
            self.unit_lo = self.unit_lo[perm]
            self.unit_hi = self.unit_hi[perm]
        self.window = window * m if seed is not None else 1
        self.cum = np.zeros(self.unit_shard.size + 1, dtype=np.int64)
        np.cumsum(self.unit_hi - self.unit_lo, out=self.cum[1:])
        total = int(self.cum[-1])
        if cut is None:
            cut = np.array([total * s // num_streams for s in range(num_streams + 1)], dtype=np.int64)
        self.bounds = np.asarray(cut, dtype=np.int64)
        if self.bounds.size != num_streams + 1 or self.bounds[0] != 0 or self.bounds[-1] != total:
            raise ValueError(f"a cut into {num_streams} streams of {total} rows, got {self.bounds.tolist()}")

    @property
    def num_rows(self) -> int:
        """Rows in the epoch."""
        return int(self.cum[-1])

    def stream_rows(self, stream: int) -> int:
        """Rows in ``stream``."""
        return int(self.bounds[stream + 1] - self.bounds[stream])

    def windows(self, stream: int) -> list[ShuffleWindow]:
        """Return the windows of ``stream``, in order (cached)."""
        return self._windows[stream]

    @cached_property
    def _windows(self) -> list[list[ShuffleWindow]]:
        return [self._make_windows(s) for s in range(self.num_streams)]

    def _make_windows(self, stream: int) -> list[ShuffleWindow]:
        lo, hi = int(self.bounds[stream]), int(self.bounds[stream + 1])
        if lo == hi:
            return []
        first = int(np.searchsorted(self.cum, lo, side="right")) - 1
        last = int(np.searchsorted(self.cum, hi, side="left"))
        ks = np.arange(first, last)
        row_lo = self.unit_lo[ks] + np.maximum(self.cum[ks], lo) - self.cum[ks]
        row_hi = self.unit_lo[ks] + np.minimum(self.cum[ks + 1], hi) - self.cum[ks]
        out, start = [], 0
        for w, a in enumerate(range(0, ks.size, self.window)):
            b = min(a + self.window, ks.size)
            n = int((row_hi[a:b] - row_lo[a:b]).sum())
            order = None
            if self.seed is not None and n > 1:
                order = permutation(n, self.seed, self.epoch, 1, stream, w)
            out.append(ShuffleWindow(self.unit_shard[ks[a:b]], row_lo[a:b], row_hi[a:b], start, order))
            start += n
        return out

    def range_bytes(self, stream: int, start: int, end: int, row_bytes: np.ndarray) -> float:
        """Estimate the bytes of rows ``start..end-1`` of ``stream`` from per-shard row sizes.

        A window's rows are taken as equally large (its rows are interleaved
        when shuffled), so this is exact at window boundaries.
        """
        total = 0.0
        for w in self.windows(stream):
            n = w.num_rows
            overlap = min(end, w.start + n) - max(start, w.start)
            if overlap > 0:
                size = float(((w.row_hi - w.row_lo) * row_bytes[w.shards]).sum())
                total += overlap * size / n
        return total

    def find_window(self, stream: int, seq: int) -> int:
        """Return the index of the window of ``stream`` holding position ``seq``."""
        starts = [w.start for w in self.windows(stream)]
        return max(0, int(np.searchsorted(starts, seq, side="right")) - 1)

    def locate(self, stream: int, seq: int) -> tuple[int, int]:
        """Return (manifest shard, row) of position ``seq`` of ``stream``."""
        windows = self.windows(stream)
        w = windows[self.find_window(stream, seq)]
        return w.locate(seq - w.start)
