"""Full concatenation batches made several at a time, in one vectorized pass.

Away from an epoch's end, :class:`~arrowstream.pack.concat.ConcatPacker`
fills rows with the token stream as it comes: the rows of the next several
batches are consecutive slices of the chunks it holds, full to the last token.
Their arrays follow from the tokens and the document starts and ends alone,
so :func:`assemble_full_batches` computes them for several batches at once
(:func:`block_batches` says how many: no more than :data:`BLOCK_TOKENS`
tokens) and hands out one ``[batch_size, seq_len]`` slice per batch. Each
per-batch numpy call costs tens of microseconds whatever its size, so this
divides the packer's per-batch cost by the number of batches done together,
which matters once the encoder runs at tens of millions of tokens a second.

The batches are exactly those :func:`~arrowstream.pack.assemble.assemble_batch`
makes from :class:`~arrowstream.pack.concat.ConcatPacker`'s layouts, byte for
byte (same keys, dtypes and values). The block only computes ahead: the packer
still advances its cursor and counts one batch at a time, so a state saved
between two batches of a block is the same as without blocks. The arrays of
one block's batches are views into shared block arrays (slices along the
first axis, each C-contiguous).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from arrowstream.pack.assemble import IGNORE_INDEX

__all__ = ["BLOCK_TOKENS", "assemble_full_batches", "block_batches", "in_sorted", "segment_starts"]

#: The most tokens one block holds. Larger blocks leave the CPU's caches: ``concat`` streamed
#: 38-44 M tokens/s at 32 x 8,192 in blocks of 8 batches (2 M tokens) against 47-48 in blocks of
#: 2 and 48-51 in blocks of 1, and 45-46 at 64 x 2,048 in blocks of 8 against 49-50 in blocks of
#: 4 or 1; at 8 and 16 x 2,048 blocks of up to 262,144 tokens were as fast as any (tokie, 340 MB
#: corpus, 2026-11-29). Blocks of 2 rather than 1 at 32 x 8,192: a step of 7.8 ms waited 2.1-2.5 %
#: of the time for them, 2.3-2.9 % for blocks of 1 (1.7-3.3 % for blocks of 8). A ``concat``
#: mixture's blocks (:mod:`arrowstream.mixture.blocks`) keep within it too: from token caches, three
#: sources mixed streamed 0.66-0.67 of one source's speed at 32 x 8,192 in blocks of 32 batches and
#: 1.00-1.04 in blocks of 2 (0.75 against 1.03 at 64 x 2,048).
BLOCK_TOKENS = 1 << 19


def block_batches(most: int, batch_tokens: int) -> int:
    """Return how many batches of ``batch_tokens`` tokens one block holds: ``most``, fewer past :data:`BLOCK_TOKENS`, at least 1 (0 if ``most`` is).

    Examples
    --------
    >>> block_batches(8, 8 * 2048), block_batches(8, 64 * 2048), block_batches(8, 32 * 8192)
    (8, 4, 2)
    >>> block_batches(8, 128 * 8192), block_batches(0, 2048)
    (1, 0)
    """
    return min(most, max(1, BLOCK_TOKENS // max(1, batch_tokens)))


def assemble_full_batches(
    tokens: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    *,
    batch_size: int,
    seq_len: int,
    mask: np.ndarray | None = None,
) -> list[dict[str, Any]]:
    """Cut ``tokens`` into full batches of rows laid end to end.

    Parameters
    ----------
    tokens
        Flat ``int32`` tokens, a whole number of batches (``k * batch_size * seq_len``).
        The batches' ``input_ids`` are views of it, not copies: pass an array
        nothing else writes to (the packer passes a fresh concatenation).
    starts
        Increasing indices into ``tokens`` where a document starts (a piece
        of a document that began earlier does not start there).
    ends
        Increasing indices into ``tokens`` just past a document's last token
        (``len(tokens)`` included when a document ends there; a document that
        goes on later does not end there).
    batch_size, seq_len
        Shape of each batch.
    mask
        Per token, whether it carries loss (``None``: all do).

    Returns
    -------
    list of dict
        ``k`` batches with the keys and dtypes of
        :func:`~arrowstream.pack.assemble.assemble_batch` (no padding: every
        row is full). A segment is a whole document when it both starts one
        and ends one.

    Examples
    --------
    >>> import numpy as np
    >>> batches = assemble_full_batches(np.arange(10, 22, dtype=np.int32), np.array([0, 5]),
    ...                                 np.array([5]), batch_size=2, seq_len=3)
    >>> [b["input_ids"].tolist() for b in batches]
    [[[10, 11, 12], [13, 14, 15]], [[16, 17, 18], [19, 20, 21]]]
    >>> batches[0]["segment_ids"].tolist(), batches[0]["position_ids"].tolist()
    ([[1, 1, 1], [1, 1, 2]], [[0, 1, 2], [0, 1, 0]])
    >>> batches[0]["cu_seqlens"].tolist(), batches[0]["num_docs"], batches[0]["num_cut_docs"]
    ([0, 3, 5, 6], 3, 3)
    """
    need = batch_size * seq_len
    size = int(tokens.size)
    count, left = divmod(size, need)
    if left or not count:
        raise ValueError(f"full batches of {batch_size} x {seq_len} tokens need a positive multiple of "
                         f"{need} tokens, got {size}")
    starts = np.asarray(starts, dtype=np.int64)
    bounds = segment_starts(size, seq_len, starts)
    seg_len = np.diff(bounds, append=size)
    whole = in_sorted(bounds, starts) & in_sorted(bounds + seg_len, np.asarray(ends, dtype=np.int64))
    rows = count * batch_size
    input_ids = tokens.reshape(rows, seq_len)
    # a segment's number in its row: its index less the index of its row's first segment, plus 1
    row_first = np.searchsorted(bounds, bounds - bounds % seq_len)
    segment_ids = np.repeat((np.arange(1, bounds.size + 1) - row_first).astype(np.int32), seg_len)
    position_ids = np.arange(size, dtype=np.int32)
    position_ids -= np.repeat(bounds.astype(np.int32), seg_len)
    segment_ids, position_ids = segment_ids.reshape(rows, seq_len), position_ids.reshape(rows, seq_len)
    labels = input_ids.astype(np.int64)
    labels.reshape(-1)[bounds] = IGNORE_INDEX
    if mask is not None:
        labels[~mask.reshape(rows, seq_len)] = IGNORE_INDEX
    # per batch: its segments are bounds[edges[j]:edges[j + 1]] (every batch starts one)
    edges = np.searchsorted(bounds, np.arange(count + 1, dtype=np.int64) * need).tolist()
    firsts = edges[:-1]
    max_seqlen = np.maximum.reduceat(seg_len, firsts).tolist()
    num_cut = np.add.reduceat((~whole).astype(np.int64), firsts).tolist()
    cu_all = bounds.astype(np.int32)
    batches = []
    for j in range(count):
        lo, hi = edges[j], edges[j + 1]
        cu = np.empty(hi - lo + 1, dtype=np.int32)
        np.subtract(cu_all[lo:hi], j * need, out=cu[:-1])
        cu[-1] = need
        r = slice(j * batch_size, (j + 1) * batch_size)
        batches.append({
            "input_ids": input_ids[r],
            "labels": labels[r],
            "position_ids": position_ids[r],
            "segment_ids": segment_ids[r],
            "cu_seqlens": cu,
            "max_seqlen": max_seqlen[j],
            "num_tokens": need,
            "num_padding_tokens": 0,
            "num_docs": hi - lo,
            "num_cut_docs": num_cut[j],
        })
    return batches


def segment_starts(size: int, seq_len: int, starts: np.ndarray) -> np.ndarray:
    """Return where segments start in ``size`` tokens cut into rows of ``seq_len``: every row start and document start, once.

    ``starts`` are increasing document starts (``int64``); the result is
    increasing ``int64``. Both inputs are sets of distinct values, so this is
    ``np.union1d`` without its hashing (and without the import of
    ``numpy.ma`` its first call makes).

    Examples
    --------
    >>> import numpy as np
    >>> segment_starts(10, 4, np.array([0, 3, 4, 9])).tolist()
    [0, 3, 4, 8, 9]
    """
    inner = starts[starts % seq_len != 0]
    out = np.concatenate([np.arange(0, size, seq_len, dtype=np.int64), inner])
    out.sort()
    return out


def in_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """Return, per value, whether it is in ``sorted_set`` (increasing): ``np.isin`` without sorting.

    Examples
    --------
    >>> import numpy as np
    >>> in_sorted(np.array([3, 4, 9]), np.array([1, 3, 9])).tolist()
    [True, False, True]
    """
    if not sorted_set.size:
        return np.zeros(values.shape, dtype=bool)
    at = np.minimum(np.searchsorted(sorted_set, values), sorted_set.size - 1)
    return sorted_set[at] == values
