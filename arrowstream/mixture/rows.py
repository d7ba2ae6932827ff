"""A mixture's batch: packed rows of several sources stacked, with the source of each row.

Each source's pipeline packs its own rows (one-row batches, so every count
is per row); :func:`stack_rows` joins the rows the schedule picked into one
batch of the usual keys (see :mod:`arrowstream.pack.assemble`) plus
``source_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from arrowstream.pack.assemble import BATCH_ARRAYS, BATCH_KEYS

__all__ = ["MIXTURE_KEYS", "stack_rows"]

#: Every key of a mixture's batch: a packed batch's, and ``source_ids`` (``int32``, one per row).
MIXTURE_KEYS = (*BATCH_KEYS, "source_ids")

_SUMMED = ("num_tokens", "num_padding_tokens", "num_docs", "num_cut_docs")


def stack_rows(rows: Sequence[dict[str, Any]], source_ids: np.ndarray) -> dict[str, Any]:
    """Stack one-row packed batches into one batch; ``source_ids[i]`` is row ``i``'s source.

    ``cu_seqlens`` is rebuilt over the flattened batch; ``max_seqlen`` is the
    longest span; the counts are summed.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.pack.assemble import assemble_batch
    >>> def row(tokens, whole=True):
    ...     return assemble_batch(np.array(tokens, np.int32), [0], [len(tokens)], [0], batch_size=1,
    ...                           seq_len=4, pad_id=0, seg_whole=np.array([whole]))
    >>> out = stack_rows([row([5, 6, 7]), row([8, 9, 10, 11], whole=False)], np.array([1, 0]))
    >>> out["input_ids"].tolist(), out["cu_seqlens"].tolist(), out["source_ids"].tolist()
    ([[5, 6, 7, 0], [8, 9, 10, 11]], [0, 3, 4, 8], [1, 0])
    >>> out["num_tokens"], out["num_padding_tokens"], out["num_cut_docs"], out["max_seqlen"]
    (7, 1, 1, 4)
    """
    out: dict[str, Any] = {key: np.concatenate([r[key] for r in rows]) for key in BATCH_ARRAYS}
    width = out["input_ids"].shape[1]
    cu = [rows[0]["cu_seqlens"]]
    cu += [r["cu_seqlens"][1:] + i * width for i, r in enumerate(rows) if i]
    out["cu_seqlens"] = np.concatenate(cu).astype(np.int32)
    out["max_seqlen"] = max(int(r["max_seqlen"]) for r in rows)
    for key in _SUMMED:
        out[key] = sum(int(r[key]) for r in rows)
    out["source_ids"] = np.asarray(source_ids, dtype=np.int32)
    return out
