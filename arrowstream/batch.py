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
predicting it would cross a document boundary or a row start).
"""

from __future__ import annotations

import numpy as np

__all__ = ["BATCH_ARRAYS", "IGNORE_INDEX", "assemble_batch"]

#: The arrays of every packed batch, by name.
BATCH_ARRAYS = ("input_ids", "labels", "position_ids", "segment_ids")

#: Label on positions that carry no loss (PyTorch's ``CrossEntropyLoss`` default ``ignore_index``).
IGNORE_INDEX = -100


def assemble_batch(
    src: np.ndarray,
    seg_src: np.ndarray,
    seg_len: np.ndarray,
    seg_row: np.ndarray,
    *,
    batch_size: int,
    seq_len: int,
    pad_id: int,
) -> dict[str, np.ndarray]:
    """Gather segments of ``src`` into a padded ``[batch_size, seq_len]`` batch.

    Parameters
    ----------
    src
        Flat ``int32`` tokens the segments point into.
    seg_src, seg_len, seg_row
        Per segment: start in ``src``, length, destination row (non-decreasing).
    batch_size, seq_len
        Output shape.
    pad_id
        Token id written on padding.

    Returns
    -------
    dict[str, numpy.ndarray]
        ``input_ids``, ``labels``, ``position_ids`` and ``segment_ids``.

    Examples
    --------
    >>> import numpy as np
    >>> gathered = assemble_batch(np.arange(10, 15, dtype=np.int32), np.array([3, 0]),
    ...                           np.array([2, 3]), np.array([0, 1]),
    ...                           batch_size=2, seq_len=3, pad_id=0)
    >>> gathered["input_ids"].tolist(), gathered["position_ids"].tolist()
    ([[13, 14, 0], [10, 11, 12]], [[0, 1, 2], [0, 1, 2]])
    >>> out = assemble_batch(np.arange(10, 15, dtype=np.int32), np.array([0, 3]),
    ...                      np.array([3, 2]), np.array([0, 0]),
    ...                      batch_size=1, seq_len=6, pad_id=0)
    >>> out["input_ids"].tolist(), out["segment_ids"].tolist(), out["position_ids"].tolist()
    ([[10, 11, 12, 13, 14, 0]], [[1, 1, 1, 2, 2, 0]], [[0, 1, 2, 0, 1, 2]])
    >>> out["labels"].tolist()
    [[-100, 11, 12, -100, 14, -100]]
    """
    seg_src = np.asarray(seg_src, dtype=np.int64)
    seg_len = np.asarray(seg_len, dtype=np.int64)
    seg_row = np.asarray(seg_row, dtype=np.int64)
    size = batch_size * seq_len
    row_fill = np.zeros(batch_size, dtype=np.int64)
    starts = np.zeros(size, dtype=bool)
    input_ids = np.full(size, pad_id, dtype=np.int32)
    if seg_len.size:
        excl = np.cumsum(seg_len) - seg_len
        seg_off = excl - excl[np.searchsorted(seg_row, seg_row, side="left")]
        dst = seg_row * seq_len + seg_off
        last = np.r_[seg_row[1:] != seg_row[:-1], True]
        row_fill[seg_row[last]] = seg_off[last] + seg_len[last]
        starts[dst] = True
        if np.array_equal(dst, excl) and np.array_equal(seg_src, excl):
            # rows filled back to back from a contiguous source: the gather is a copy
            total = int(seg_len.sum())
            input_ids[:total] = src[:total]
        else:
            real = np.flatnonzero(np.arange(seq_len) < row_fill[:, None])
            seg = (np.cumsum(starts) - 1)[real]
            input_ids[real] = src[seg_src[seg] + real - dst[seg]]
    col = np.arange(seq_len, dtype=np.int32)
    starts2d = starts.reshape(batch_size, seq_len)
    position_ids = col - np.maximum.accumulate(np.where(starts2d, col, 0), axis=1)
    segment_ids = np.cumsum(starts2d, axis=1, dtype=np.int32)
    segment_ids[col >= row_fill[:, None]] = 0
    ids2d = input_ids.reshape(batch_size, seq_len)
    labels = ids2d.astype(np.int64)
    labels[starts2d | (segment_ids == 0)] = IGNORE_INDEX
    return {
        "input_ids": ids2d,
        "labels": labels,
        "position_ids": position_ids.astype(np.int32, copy=False),
        "segment_ids": segment_ids,
    }
