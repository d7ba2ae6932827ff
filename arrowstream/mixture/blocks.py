"""Several batches of a ``concat`` mixture laid out at once, in one vectorized pass.

Away from its epoch's end, a ``concat`` source's rows are consecutive
``seq_len`` slices of its token stream, full to the last token. So the rows
that the next few batches take from each source can be read in one piece
(:meth:`~arrowstream.pipeline.iterator.DatasetIterator.rows_ahead`), put into
the slots the schedule gives the source, and every array of those batches
computed together (:func:`~arrowstream.pack.blocks.assemble_full_batches`).
Per batch that replaces one layout per source, one placement and one
assembly, which cost tens of microseconds each whatever their size.

The batches, their ``source_ids`` and the per-source counts are those of the
one-batch-at-a-time path (:func:`~arrowstream.mixture.rows.place_rows`), byte
for byte. Nothing of the sources moves while a block is made: the batches
handed out move each source past their rows in it, one layout counted per
batch, when the source is next read or its state asked for
(:meth:`~arrowstream.pipeline.iterator.DatasetIterator.skip_rows`), so a state
saved between two batches of a block is the same. Its rows may lie in several
chunks of a source: they are copied into their slots piece by piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from arrowstream.pack.blocks import assemble_full_batches

__all__ = ["Block", "assemble_mixture_block"]

#: One batch of a block: the batch, its counts per source (as ``place_rows`` gives them), and
#: the rows it takes from each source, in source order.
Block = tuple[dict[str, Any], dict[int, dict[str, int]], list[tuple[int, int]]]


def assemble_mixture_block(
    steps: Sequence[np.ndarray],
    rows: dict[int, tuple[np.ndarray | list[np.ndarray], np.ndarray, np.ndarray]],
    *,
    seq_len: int,
) -> list[Block]:
    """Return the batches whose slots take the given sources' rows in order.

    Parameters
    ----------
    steps
        Per batch, the source of each of its slots (the same number of slots
        in every batch): one row per batch.
    rows
        Per source, the tokens of the full rows it gives the whole block
        (``rows * seq_len`` of them, each source's rows in the order they fill
        its slots, batch after batch; one array, or pieces laid end to end)
        with its document starts and ends, as
        :func:`~arrowstream.pack.blocks.assemble_full_batches` takes them.
    seq_len
        Tokens per row.

    Returns
    -------
    list of Block
        Per batch: the batch (a packed batch's keys and ``source_ids``), its
        counts per source (``rows``, ``tokens``, ``padding_tokens``,
        ``segments``) and the rows it takes from each source.

    Examples
    --------
    >>> import numpy as np
    >>> web = (np.arange(10, 16, dtype=np.int32), np.array([0, 4]), np.array([4]))
    >>> code = (np.arange(20, 22, dtype=np.int32), np.array([0]), np.array([2]))
    >>> [(b["input_ids"].tolist(), b["source_ids"].tolist(), pulls) for b, _, pulls in
    ...  assemble_mixture_block([np.array([1, 0]), np.array([0, 0])], {0: web, 1: code}, seq_len=2)]
    [([[20, 21], [10, 11]], [1, 0], [(0, 1), (1, 1)]), ([[12, 13], [14, 15]], [0, 0], [(0, 2)])]
    """
    ids = np.asarray(steps, dtype=np.int32).reshape(-1)
    count, slots = len(steps), ids.size // len(steps)
    tokens = np.empty((ids.size, seq_len), dtype=np.int32)
    starts, ends = [], []
    for source, (flat, first, last) in rows.items():
        dest = np.flatnonzero(ids == source)  # the source's rows fill its slots in order
        _scatter(tokens, dest, [flat] if isinstance(flat, np.ndarray) else flat)
        first, last = np.asarray(first, dtype=np.int64), np.asarray(last, dtype=np.int64) - 1
        starts.append(dest[first // seq_len] * seq_len + first % seq_len)
        ends.append(dest[last // seq_len] * seq_len + last % seq_len + 1)
    starts_all = np.sort(np.concatenate(starts))
    batches = assemble_full_batches(
        tokens.reshape(-1), starts_all, np.sort(np.concatenate(ends)), batch_size=slots, seq_len=seq_len
    )
    # segments per row: the row's start, and every document start inside it
    inner = starts_all[starts_all % seq_len != 0] // seq_len
    segments = 1 + np.bincount(inner, minlength=ids.size)
    num_sources = int(ids.max()) + 1
    key = np.repeat(np.arange(count), slots) * num_sources + ids
    per_rows = np.bincount(key, minlength=count * num_sources).reshape(count, num_sources).tolist()
    per_segments = np.bincount(key, weights=segments, minlength=count * num_sources)
    per_segments = per_segments.astype(np.int64).reshape(count, num_sources).tolist()
    out = []
    for j, batch in enumerate(batches):
        batch["source_ids"] = ids[j * slots : (j + 1) * slots]
        counts = {
            s: {"rows": n, "tokens": n * seq_len, "padding_tokens": 0, "segments": per_segments[j][s]}
            for s, n in enumerate(per_rows[j]) if n
        }
        out.append((batch, counts, [(s, n) for s, n in enumerate(per_rows[j]) if n]))
    return out


def _scatter(tokens: np.ndarray, dest: np.ndarray, pieces: Sequence[np.ndarray]) -> None:
    """Copy a source's rows, given as ``pieces`` of its token stream laid end to end, into rows ``dest`` of ``tokens``.

    Whole rows inside a piece go in one copy; a row cut between two pieces
    goes in two.

    Examples
    --------
    >>> out = np.zeros((3, 2), dtype=np.int32)
    >>> _scatter(out, np.array([2, 0]), [np.array([1, 2, 3]), np.array([4])])
    >>> out.tolist()
    [[3, 4], [0, 0], [1, 2]]
    """
    seq_len = tokens.shape[1]
    at = 0  # where the piece starts in the source's stream
    for piece in pieces:
        p, n = 0, piece.size
        while p < n:
            row, col = divmod(at + p, seq_len)
            if col or n - p < seq_len:  # a row cut between pieces
                k = min(seq_len - col, n - p)
                tokens[dest[row], col : col + k] = piece[p : p + k]
            else:
                whole = (n - p) // seq_len
                k = whole * seq_len
                tokens[dest[row : row + whole]] = piece[p : p + k].reshape(whole, seq_len)
            p += k
        at += n
