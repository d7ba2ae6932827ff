"""Batch assembly: from a row layout of token segments to fixed-shape numpy arrays.

Packing strategies decide *where* each piece of each document goes (a layout
of segments: source offset, length, destination row); this module does the
*data movement* in one vectorized gather per batch and derives the
document-aware arrays from the layout. Segments of one row are contiguous from
the row's start and listed in row order; what follows them is padding.

Arrays (all ``[batch_size, seq_len]``): ``input_ids`` (``int32``, ``pad_id`` on
padding), ``position_ids`` (``int32``, restarting at 0 at every segment start;
padding after a row's last segment keeps counting from its last token, so it
never looks like a document start; a row that is all padding counts 0..L-1 and
holds no document), ``segment_ids`` (``int32``, 1..k within a row, 0 on
padding), ``labels`` (``int64``, the Hugging Face convention: unshifted token
ids, ``-100`` on padding and on the first token of every segment, since
predicting it would cross a document boundary or a row start, and on tokens
a loss mask excludes). For variable-length attention kernels (FlashAttention's
``varlen`` functions): ``cu_seqlens``, the ``int32`` cumulative boundaries of
every segment and of every row's padding tail over the flattened
``batch_size * seq_len`` tokens (its length varies from batch to batch), and
``max_seqlen``, the longest span, a Python int. Per-batch counts, as Python
ints: ``num_tokens``, ``num_padding_tokens``, ``num_docs`` (segments) and
``num_cut_docs`` (segments that are only a piece of their document).

Length bucketing (:mod:`arrowstream.pack.bucket`) puts one whole document per row
instead: :func:`assemble_padded_batch` right-pads the rows to the batch's
longest and adds an ``attention_mask`` (see :data:`PADDED_KEYS`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = [
    "BATCH_ARRAYS",
    "BATCH_COUNTS",
    "BATCH_KEYS",
    "IGNORE_INDEX",
    "PADDED_ARRAYS",
    "PADDED_COUNTS",
    "PADDED_KEYS",
    "VARLEN_ARRAYS",
    "assemble_batch",
    "assemble_padded_batch",
]

#: The ``[batch_size, seq_len]`` arrays of every packed batch, by name.
BATCH_ARRAYS = ("input_ids", "labels", "position_ids", "segment_ids")

#: The ragged array for variable-length attention kernels (``int32``, one more than the segments).
VARLEN_ARRAYS = ("cu_seqlens",)

#: The per-batch Python ints.
BATCH_COUNTS = ("max_seqlen", "num_tokens", "num_padding_tokens", "num_docs", "num_cut_docs")

#: Every key of a packed batch.
BATCH_KEYS = BATCH_ARRAYS + VARLEN_ARRAYS + BATCH_COUNTS

#: Label on positions that carry no loss (PyTorch's ``CrossEntropyLoss`` default ``ignore_index``).
IGNORE_INDEX = -100

#: The ``[rows, width]`` arrays of a padded batch (one document per row, see :func:`assemble_padded_batch`).
PADDED_ARRAYS = ("input_ids", "attention_mask", "labels", "position_ids")

#: The per-batch Python ints of a padded batch.
PADDED_COUNTS = ("num_tokens", "num_padding_tokens", "num_docs")

#: Every key of a padded batch.
PADDED_KEYS = PADDED_ARRAYS + PADDED_COUNTS


def assemble_batch(
    src: np.ndarray,
    seg_src: np.ndarray,
    seg_len: np.ndarray,
    seg_row: np.ndarray,
    *,
    batch_size: int,
    seq_len: int,
    pad_id: int,
    seg_whole: np.ndarray | None = None,
    mask: np.ndarray | None = None,
) -> dict[str, Any]:
    """Gather segments of ``src`` into a padded ``[batch_size, seq_len]`` batch.

    Parameters
    ----------
    src
        Flat ``int32`` tokens the segments point into.
    seg_src, seg_len, seg_row
        Per segment: start in ``src``, length (at least 1), destination row
        (non-decreasing).
    batch_size, seq_len
        Output shape.
    pad_id
        Token id written on padding.
    seg_whole
        Per segment, whether it is a whole document (``None``: all are).
        Only counted, in ``num_cut_docs``.
    mask
        Per token of ``src``, whether it carries loss (``None``: all do).
        Tokens without loss get ``-100`` in ``labels``.

    Returns
    -------
    dict
        ``input_ids``, ``labels``, ``position_ids``, ``segment_ids``
        (``[batch_size, seq_len]``), ``cu_seqlens`` (``int32`` boundaries of
        the segments and of each row's padding tail over the flattened
        ``batch_size * seq_len`` tokens), and the ints ``max_seqlen`` (the
        longest of those spans), ``num_tokens``, ``num_padding_tokens``,
        ``num_docs`` (segments) and ``num_cut_docs`` (segments that are a
        piece of a longer document).

    Raises
    ------
    ValueError
        A segment has no token.

    Examples
    --------
    >>> import numpy as np
    >>> gathered = assemble_batch(np.arange(10, 15, dtype=np.int32), np.array([3, 0]),
    ...                           np.array([2, 3]), np.array([0, 1]),
    ...                           batch_size=2, seq_len=3, pad_id=0)
    >>> gathered["input_ids"].tolist(), gathered["position_ids"].tolist()
    ([[13, 14, 0], [10, 11, 12]], [[0, 1, 2], [0, 1, 2]])
    >>> gathered["cu_seqlens"].tolist(), gathered["max_seqlen"]
    ([0, 2, 3, 6], 3)
    >>> out = assemble_batch(np.arange(10, 15, dtype=np.int32), np.array([0, 3]),
    ...                      np.array([3, 2]), np.array([0, 0]),
    ...                      batch_size=1, seq_len=6, pad_id=0,
    ...                      seg_whole=np.array([True, False]))
    >>> out["input_ids"].tolist(), out["segment_ids"].tolist(), out["position_ids"].tolist()
    ([[10, 11, 12, 13, 14, 0]], [[1, 1, 1, 2, 2, 0]], [[0, 1, 2, 0, 1, 2]])
    >>> out["labels"].tolist()
    [[-100, 11, 12, -100, 14, -100]]
    >>> out["cu_seqlens"].tolist(), out["num_docs"], out["num_cut_docs"], out["num_padding_tokens"]
    ([0, 3, 5, 6], 2, 1, 1)
    """
    seg_src = np.asarray(seg_src, dtype=np.int64)
    seg_len = np.asarray(seg_len, dtype=np.int64)
    seg_row = np.asarray(seg_row, dtype=np.int64)
    size = batch_size * seq_len
    S = seg_len.size
    if S and seg_len.min() < 1:
        raise ValueError(f"every segment must hold a token, got a length of {int(seg_len.min())}")
    # Per row: its segments, the first of them, and the tokens they fill.
    counts = np.bincount(seg_row, minlength=batch_size)
    ends = np.cumsum(counts)
    row_first = ends - counts
    cum = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(seg_len, out=cum[1:])
    row_fill = cum[ends] - cum[row_first]
    excl = cum[:-1]
    first = row_first[seg_row]  # per segment: the index of its row's first segment
    dst = seg_row * seq_len + (excl - excl[first])
    rows = np.arange(batch_size, dtype=np.int64) * seq_len
    # The batch as spans, in order: each row's segments, then its padding tail if it has one (a row
    # of padding only is one tail). Their starts are cu_seqlens; each array is one repeat over them.
    tailed = row_fill < seq_len
    tails_before = np.cumsum(tailed) - tailed
    at_seg = np.arange(S) + tails_before[seg_row]
    at_tail = (ends + tails_before)[tailed]
    span = np.empty(S + at_tail.size + 1, dtype=np.int64)
    span[at_seg] = dst
    span[at_tail] = (rows + row_fill)[tailed]
    span[-1] = size
    span_len = span[1:] - span[:-1]
    seg_value = np.zeros(span.size - 1, dtype=np.int32)  # segment 1..k within its row, 0 on padding
    seg_value[at_seg] = np.arange(S) - first + 1
    base = np.empty(span.size - 1, dtype=np.int64)  # padding keeps counting from its row's last segment
    base[at_seg] = dst
    last = np.maximum(ends - 1, 0)[tailed]
    base[at_tail] = np.where(counts[tailed] > 0, dst[last] if S else 0, rows[tailed])
    segment_ids = np.repeat(seg_value, span_len).reshape(batch_size, seq_len)
    position_ids = np.repeat(base.astype(np.int32), span_len)
    np.subtract(_counting(size), position_ids, out=position_ids)
    total = int(cum[-1])
    fills, padded = row_fill.tolist(), np.flatnonzero(tailed).tolist()
    input_ids = np.empty((batch_size, seq_len), dtype=np.int32)  # every token is written below
    keep = None if mask is None else np.ones((batch_size, seq_len), dtype=bool)
    if S and np.array_equal(seg_src, excl):  # from a contiguous source: each row one slice of it
        froms = cum[row_first].tolist()
        for r in range(batch_size):
            a, n = froms[r], fills[r]
            input_ids[r, :n] = src[a : a + n]
            if keep is not None and mask is not None:
                keep[r, :n] = mask[a : a + n]
    elif S:
        real = np.flatnonzero(segment_ids.reshape(-1))
        seg = np.repeat(np.arange(S), seg_len)
        index = seg_src[seg] + real - dst[seg]
        input_ids.reshape(-1)[real] = src[index]
        if keep is not None and mask is not None:
            keep.reshape(-1)[real] = mask[index]
    for r in padded:  # row by row: a packed batch has few rows, and little padding
        input_ids[r, fills[r] :] = pad_id
    labels = input_ids.astype(np.int64)
    for r in padded:
        labels[r, fills[r] :] = IGNORE_INDEX
    labels.reshape(-1)[dst] = IGNORE_INDEX
    if keep is not None:
        labels[~keep] = IGNORE_INDEX
    return {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": position_ids.reshape(batch_size, seq_len),
        "segment_ids": segment_ids,
        "cu_seqlens": span.astype(np.int32),
        "max_seqlen": int(span_len.max()),
        "num_tokens": total,
        "num_padding_tokens": size - total,
        "num_docs": int(S),
        "num_cut_docs": 0 if seg_whole is None else int(S - np.count_nonzero(seg_whole)),
    }


@functools.lru_cache(maxsize=8)
def _counting(size: int) -> np.ndarray:
    """``0..size-1`` as ``int32``, read-only: made once per batch size."""
    out = np.arange(size, dtype=np.int32)
    out.flags.writeable = False
    return out


def assemble_padded_batch(
    src: np.ndarray,
    lengths: np.ndarray,
    *,
    pad_id: int,
    pad_to_multiple_of: int = 1,
    num_rows: int | None = None,
    mask: np.ndarray | None = None,
) -> dict[str, Any]:
    """Gather documents laid end to end in ``src`` into one row each, right-padded.

    The width is the longest document rounded up to ``pad_to_multiple_of``
    (at least ``pad_to_multiple_of``), so it varies from batch to batch.

    Parameters
    ----------
    src
        Flat ``int32`` tokens of the documents, back to back.
    lengths
        Tokens per document, in ``src`` order; document ``i`` goes to row ``i``.
    pad_id
        Token id written on padding.
    pad_to_multiple_of
        The width is a multiple of this.
    num_rows
        Rows of the output (``None``: one per document); rows past the
        documents are padding only.
    mask
        Per token of ``src``, whether it carries loss (``None``: all do).

    Returns
    -------
    dict
        ``input_ids`` (``int32``, ``pad_id`` on padding), ``attention_mask``
        (``int32``, 1 on tokens, 0 on padding), ``labels`` (``int64``, the
        token ids, ``-100`` on padding and on tokens ``mask`` excludes) and
        ``position_ids`` (``int32``, ``0..width-1`` on every row, padding
        included), all ``[rows, width]``; and the ints ``num_tokens``,
        ``num_padding_tokens`` and ``num_docs``.

    Examples
    --------
    >>> import numpy as np
    >>> out = assemble_padded_batch(np.arange(10, 15, dtype=np.int32), np.array([2, 3]),
    ...                             pad_id=0, pad_to_multiple_of=4)
    >>> out["input_ids"].tolist(), out["attention_mask"].tolist()
    ([[10, 11, 0, 0], [12, 13, 14, 0]], [[1, 1, 0, 0], [1, 1, 1, 0]])
    >>> out["labels"].tolist()
    [[10, 11, -100, -100], [12, 13, 14, -100]]
    >>> out["num_tokens"], out["num_padding_tokens"], out["num_docs"]
    (5, 3, 2)
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    rows = int(lengths.size) if num_rows is None else int(num_rows)
    if rows < lengths.size:
        raise ValueError(f"`num_rows` must be at least the {lengths.size} documents, got {rows}")
    multiple = int(pad_to_multiple_of)
    width = max(1, -(-int(lengths.max(initial=0)) // multiple)) * multiple
    fill = np.zeros(rows, dtype=np.int64)
    fill[: lengths.size] = lengths
    col = np.arange(width, dtype=np.int32)
    real = col < fill[:, None]
    total = int(lengths.sum())
    input_ids = np.full((rows, width), pad_id, dtype=np.int32)
    input_ids[real] = src[:total]  # row-major order of the real cells is the order of ``src``
    keep = real
    if mask is not None:
        keep = np.zeros_like(real)
        keep[real] = mask[:total]
    labels = input_ids.astype(np.int64)
    labels[~keep] = IGNORE_INDEX
    return {
        "input_ids": input_ids,
        "attention_mask": real.astype(np.int32),
        "labels": labels,
        "position_ids": np.tile(col, (rows, 1)),
        "num_tokens": total,
        "num_padding_tokens": rows * width - total,
        "num_docs": int(lengths.size),
    }
