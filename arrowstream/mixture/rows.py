"""A mixture's batch: packed rows of several sources placed in their slots, with the source of each row.

Each source's pipeline packs its own rows; for one batch, :func:`place_rows`
puts the rows taken from each source into the slots the schedule gave that
source and derives the batch's ``cu_seqlens`` and counts from the placed
arrays, so a batch has the usual keys (see :mod:`arrowstream.pack.assemble`)
plus ``source_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from arrowstream.pack.assemble import BATCH_ARRAYS, BATCH_KEYS

__all__ = ["MIXTURE_KEYS", "Taken", "place_rows", "real_rows"]

#: Every key of a mixture's batch: a packed batch's, and ``source_ids`` (``int32``, one per row).
MIXTURE_KEYS = (*BATCH_KEYS, "source_ids")

#: Rows taken from one packed batch of a source: the batch, and which of its rows (in order).
Taken = tuple[dict[str, Any], np.ndarray]


def real_rows(batch: dict[str, Any]) -> np.ndarray:
    """Return the indices of ``batch``'s rows that hold tokens (a source's epoch end pads whole rows)."""
    return np.flatnonzero(batch["segment_ids"].any(axis=1))


def place_rows(taken: dict[int, Sequence[Taken]], source_ids: np.ndarray) -> dict[str, Any]:
    """Return the batch whose row ``i`` comes from source ``source_ids[i]``, from the rows ``taken`` of each source.

    Each source's rows fill its slots in order. ``cu_seqlens`` (segment and
    padding-tail boundaries over the flattened batch), ``max_seqlen`` and the
    counts are derived from the placed arrays; ``num_cut_docs`` sums those of
    the batches taken from (a row dropped for holding no token holds no piece).

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.pack.assemble import assemble_batch
    >>> def rows(tokens, whole=True):
    ...     return assemble_batch(np.array(tokens, np.int32), [0], [len(tokens)], [0], batch_size=1,
    ...                           seq_len=4, pad_id=0, seg_whole=np.array([whole]))
    >>> out = place_rows({0: [(rows([8, 9, 10, 11], whole=False), np.array([0]))],
    ...                   1: [(rows([5, 6, 7]), np.array([0]))]}, np.array([1, 0]))
    >>> out["input_ids"].tolist(), out["cu_seqlens"].tolist(), out["source_ids"].tolist()
    ([[5, 6, 7, 0], [8, 9, 10, 11]], [0, 3, 4, 8], [1, 0])
    >>> out["num_tokens"], out["num_padding_tokens"], out["num_docs"], out["num_cut_docs"], out["max_seqlen"]
    (7, 1, 2, 1, 4)
    """
    source_ids = np.asarray(source_ids, dtype=np.int32)
    first = next(iter(taken.values()))[0][0]
    width = first["input_ids"].shape[1]
    out: dict[str, Any] = {
        key: np.empty((source_ids.size, width), dtype=first[key].dtype) for key in BATCH_ARRAYS
    }
    cut = 0
    for source, parts in taken.items():
        slots = np.flatnonzero(source_ids == source)
        at = 0
        for batch, rows in parts:
            dst = slots[at : at + rows.size]
            for key in BATCH_ARRAYS:
                out[key][dst] = batch[key][rows]
            cut += int(batch["num_cut_docs"])
            at += rows.size
        assert at == slots.size, "every slot of a source is filled"
    seg = out["segment_ids"]
    size = seg.size
    flat = seg.reshape(-1)
    changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    starts = np.arange(0, size, width)
    cu = np.unique(np.concatenate([starts, changes, [size]])).astype(np.int32)
    tokens = int(np.count_nonzero(seg))
    out["cu_seqlens"] = cu
    out["max_seqlen"] = int(np.diff(cu).max()) if cu.size > 1 else 0
    out["num_tokens"] = tokens
    out["num_padding_tokens"] = size - tokens
    out["num_docs"] = int(seg.max(axis=1).sum())
    out["num_cut_docs"] = cut
    out["source_ids"] = source_ids
    return out
