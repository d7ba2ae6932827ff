"""A mixture's batch: packed rows of several sources placed in their slots, with the source of each row.

Each source's pipeline packs its own rows; for one batch, :func:`place_rows`
puts the rows taken from each source (their layouts: which tokens go where)
into the slots the schedule gave that source, and gathers the whole batch
once, so a batch has the usual keys (see :mod:`arrowstream.pack.assemble`)
plus ``source_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from arrowstream.pack.assemble import BATCH_KEYS
from arrowstream.pack.layout import Layout, place_layouts

__all__ = ["MIXTURE_KEYS", "Taken", "place_rows"]

#: Every key of a mixture's batch: a packed batch's, and ``source_ids`` (``int32``, one per row).
MIXTURE_KEYS = (*BATCH_KEYS, "source_ids")

#: Rows taken from a source in one pull: a layout (its rows that hold a token are taken, in order).
Taken = Layout


def place_rows(
    taken: dict[int, Sequence[Taken]], source_ids: np.ndarray, *, unit: int, pad_ids: Sequence[int]
) -> tuple[dict[str, Any], dict[int, dict[str, int]]]:
    """Return the batch whose row ``i`` comes from source ``source_ids[i]``, and each source's counts in it.

    Each source's rows fill its slots in order; rows are ``unit`` tokens
    long, and a source's padding is its own ``pad_ids[source]``. The counts
    per source are ``rows``, ``tokens``, ``padding_tokens`` and ``segments``
    (pieces of documents).

    Examples
    --------
    >>> import numpy as np
    >>> def rows(tokens, whole=True):
    ...     n = len(tokens)
    ...     return Layout(np.array(tokens, np.int32), np.array([0]), np.array([n]), np.array([0]),
    ...                   np.array([whole]), None, num_rows=1)
    >>> out, counts = place_rows({0: [rows([8, 9, 10, 11], whole=False)], 1: [rows([5, 6, 7])]},
    ...                          np.array([1, 0]), unit=4, pad_ids=[0, 9])
    >>> out["input_ids"].tolist(), out["cu_seqlens"].tolist(), out["source_ids"].tolist()
    ([[5, 6, 7, 9], [8, 9, 10, 11]], [0, 3, 4, 8], [1, 0])
    >>> out["num_tokens"], out["num_padding_tokens"], out["num_docs"], out["num_cut_docs"], out["max_seqlen"]
    (7, 1, 2, 1, 4)
    >>> counts[1]
    {'rows': 1, 'tokens': 3, 'padding_tokens': 1, 'segments': 1}
    """
    source_ids = np.asarray(source_ids, dtype=np.int32)
    parts = []
    counts = {}
    for source, pieces in taken.items():
        slots = np.flatnonzero(source_ids == source)
        at = tokens = segments = 0
        for layout in pieces:
            rows = layout.real_rows.size
            parts.append((layout, slots[at : at + rows]))
            at += rows
            tokens += layout.num_tokens
            segments += layout.seg_len.size
        assert at == slots.size, "every slot of a source is filled"
        counts[source] = {
            "rows": at, "tokens": tokens, "padding_tokens": at * unit - tokens, "segments": segments,
        }
    pad = pad_ids[int(source_ids[0])]
    batch = place_layouts(parts, source_ids.size).assemble(seq_len=unit, pad_id=pad)
    for source in taken:
        if pad_ids[source] != pad:  # sources whose tokenizers name another EOS keep their own padding
            slots = source_ids == source
            ids = batch["input_ids"]
            ids[slots] = np.where(batch["segment_ids"][slots] == 0, pad_ids[source], ids[slots])
    batch["source_ids"] = source_ids
    return batch, counts
