"""Several packed batches gathered in one pass, then cut apart.

:func:`~arrowstream.pack.assemble.assemble_batch` costs tens of
microseconds a call whatever the batch's size (a few dozen numpy calls), so
a packer that knows its next batches (``best_fit``, whose rows are formed a
window ahead) gathers them together: one :class:`~arrowstream.pack.layout.Layout`
of ``parts x batch_size`` rows, assembled once and cut into ``parts``
batches of ``batch_size`` rows by :func:`assemble_split`. Each batch equals,
byte for byte, what ``assemble_batch`` makes of its rows alone (same keys,
dtypes and values); its arrays are views into the block's (slices along the
first axis, each C-contiguous), its ``cu_seqlens`` and counts its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from arrowstream.pack.layout import Layout

__all__ = ["assemble_split"]


def assemble_split(layout: Layout, parts: int, *, seq_len: int, pad_id: int) -> list[dict[str, Any]]:
    """Assemble ``layout`` (``parts`` batches' rows, in order) once; return the ``parts`` batches.

    Parameters
    ----------
    layout
        The rows of ``parts`` consecutive batches of equal size
        (``layout.num_rows`` a multiple of ``parts``).
    parts
        How many batches the rows make.
    seq_len, pad_id
        As for :func:`~arrowstream.pack.assemble.assemble_batch`.

    Returns
    -------
    list of dict
        One batch per part, each what ``assemble_batch`` gives for its rows.

    Raises
    ------
    ValueError
        ``layout.num_rows`` is not a positive multiple of ``parts``.

    Examples
    --------
    >>> import numpy as np
    >>> lay = Layout(np.arange(1, 8, dtype=np.int32), np.array([0, 3, 5]), np.array([3, 2, 2]),
    ...              np.array([0, 0, 1]), np.array([True, True, False]), None, num_rows=2)
    >>> first, second = assemble_split(lay, 2, seq_len=6, pad_id=0)
    >>> first["input_ids"].tolist(), first["cu_seqlens"].tolist(), first["num_docs"]
    ([[1, 2, 3, 4, 5, 0]], [0, 3, 5, 6], 2)
    >>> second["input_ids"].tolist(), second["cu_seqlens"].tolist(), second["num_cut_docs"]
    ([[6, 7, 0, 0, 0, 0]], [0, 2, 6], 1)
    """
    rows = layout.num_rows
    if parts < 1 or rows < parts or rows % parts:
        raise ValueError(f"`parts` must divide the layout's {rows} rows into equal batches, got {parts}")
    batch = layout.assemble(seq_len=seq_len, pad_id=pad_id)
    if parts == 1:
        return [batch]
    B = rows // parts
    size = B * seq_len
    part_of = layout.seg_row // B  # each segment's batch
    docs = np.bincount(part_of, minlength=parts).tolist()
    tokens = np.bincount(part_of, weights=layout.seg_len, minlength=parts).astype(np.int64).tolist()
    whole = layout.seg_whole
    cut = np.bincount(part_of[~whole], minlength=parts).tolist() if whole.size else [0] * parts
    cu = batch["cu_seqlens"]
    # every batch starts at a row start, a boundary of cu_seqlens
    at = np.searchsorted(cu, np.arange(parts + 1, dtype=np.int64) * size).tolist()
    spans = cu[1:] - cu[:-1]
    longest = np.maximum.reduceat(spans, at[:-1]).tolist()
    arrays = [(name, value) for name, value in batch.items() if isinstance(value, np.ndarray) and value.ndim == 2]
    out = []
    for k in range(parts):
        part: dict[str, Any] = {name: value[k * B : (k + 1) * B] for name, value in arrays}
        part["cu_seqlens"] = cu[at[k] : at[k + 1] + 1] - np.int32(k * size)
        part["max_seqlen"] = int(longest[k])
        part["num_tokens"] = int(tokens[k])
        part["num_padding_tokens"] = size - int(tokens[k])
        part["num_docs"] = int(docs[k])
        part["num_cut_docs"] = int(cut[k])
        out.append({key: part[key] for key in batch})  # the keys in assemble_batch's order
    return out
