"""A batch's layout: which tokens go to which row, before anything is gathered.

A packing strategy decides where each piece of each document goes; a
:class:`Layout` holds that decision (the tokens it points into and, per
segment, its start, length, destination row and whether it is a whole
document). :meth:`Layout.assemble` does the data movement
(:func:`~arrowstream.pack.assemble.assemble_batch`). Keeping the two apart
lets a mixture take rows from several sources' layouts and gather the whole
batch once (:func:`place_layouts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import Any

import numpy as np

from arrowstream.pack.assemble import assemble_batch

__all__ = ["Layout", "layout_of_rows", "place_layouts"]


@dataclass(frozen=True)
class Layout:
    """Segments of ``src`` laid into ``num_rows`` rows (rows in non-decreasing order, each filled from its start).

    Examples
    --------
    >>> import numpy as np
    >>> lay = Layout(np.arange(10, 15, dtype=np.int32), np.array([0, 3]), np.array([3, 2]),
    ...              np.array([0, 1]), np.array([True, False]), None, num_rows=3)
    >>> lay.num_tokens, lay.real_rows.tolist()
    (5, [0, 1])
    >>> lay.assemble(seq_len=4, pad_id=0)["input_ids"].tolist()
    [[10, 11, 12, 0], [13, 14, 0, 0], [0, 0, 0, 0]]
    """

    src: np.ndarray
    seg_src: np.ndarray
    seg_len: np.ndarray
    seg_row: np.ndarray
    seg_whole: np.ndarray
    mask: np.ndarray | None
    num_rows: int

    @property
    def num_tokens(self) -> int:
        """Tokens laid out (padding excluded)."""
        return int(self.seg_len.sum())

    @cached_property
    def real_rows(self) -> np.ndarray:
        """The rows that hold a token, in order (an epoch's end leaves whole rows of padding)."""
        rows = self.seg_row
        return rows[np.r_[True, rows[1:] != rows[:-1]]] if rows.size else rows

    def assemble(self, *, seq_len: int, pad_id: int) -> dict[str, Any]:
        """Gather the batch (see :func:`~arrowstream.pack.assemble.assemble_batch`)."""
        return assemble_batch(
            self.src,
            self.seg_src,
            self.seg_len,
            self.seg_row,
            batch_size=self.num_rows,
            seq_len=seq_len,
            pad_id=pad_id,
            seg_whole=self.seg_whole,
            mask=self.mask,
        )


def place_layouts(parts: Sequence[tuple[Layout, np.ndarray]], num_rows: int) -> Layout:
    """Return one layout of ``num_rows`` rows: for each ``(layout, slots)``, the layout's rows that hold tokens moved to ``slots``.

    ``slots`` are the destination rows, one per row of the layout that holds
    a token (:attr:`Layout.real_rows`), in order. Destination rows not named
    stay padding. The tokens are laid out in destination order, so a batch
    of full rows is gathered with one copy. Tokens without a loss mask carry
    loss when another part has one.

    Examples
    --------
    >>> import numpy as np
    >>> a = Layout(np.array([5, 6, 7], np.int32), np.array([0]), np.array([3]), np.array([0]),
    ...            np.array([True]), None, num_rows=1)
    >>> b = Layout(np.array([8, 9, 10, 11, 12], np.int32), np.array([0, 4]), np.array([4, 1]),
    ...            np.array([0, 1]), np.array([False, False]), None, num_rows=2)
    >>> out = place_layouts([(a, np.array([1])), (b, np.array([0, 2]))], 3)
    >>> out.assemble(seq_len=4, pad_id=0)["input_ids"].tolist()
    [[8, 9, 10, 11], [5, 6, 7, 0], [12, 0, 0, 0]]
    """
    masked = any(layout.mask is not None for layout, _ in parts)
    dests, lens, wholes, part_of, starts = [], [], [], [], []
    for i, (layout, slots) in enumerate(parts):
        rows = layout.seg_row
        dests.append(np.asarray(slots, dtype=np.int64)[np.searchsorted(layout.real_rows, rows)])
        lens.append(layout.seg_len)
        wholes.append(layout.seg_whole)
        starts.append(layout.seg_src)
        part_of.append(np.full(rows.size, i))
    dest = np.concatenate(dests)
    order = np.argsort(dest, kind="stable")  # by destination row, each row's segments in their order
    seg_len = np.concatenate(lens)[order]
    seg_src = np.concatenate(starts)[order]
    part = np.concatenate(part_of)[order]
    # each run of segments from one part is contiguous in that part's tokens: one slice per run
    edges = np.flatnonzero(np.r_[True, (part[1:] != part[:-1]) | (seg_src[1:] != seg_src[:-1] + seg_len[:-1])])
    run_len = np.add.reduceat(seg_len, edges) if part.size else seg_len
    runs = list(zip(part[edges].tolist(), seg_src[edges].tolist(), run_len.tolist()))
    pieces = [parts[p][0].src[a : a + n] for p, a, n in runs]
    masks = [_mask_of(parts[p][0], a, n) for p, a, n in runs] if masked else []
    empty = np.empty(0, np.int32)
    return Layout(
        np.concatenate(pieces) if pieces else empty,
        np.cumsum(seg_len) - seg_len,
        seg_len,
        dest[order],
        np.concatenate(wholes)[order],
        (np.concatenate(masks) if masks else np.empty(0, bool)) if masked else None,
        num_rows,
    )


def layout_of_rows(rows: Sequence[Sequence[tuple[Any, int, int, bool]]], docs: Any, num_rows: int) -> Layout:
    """Return the layout of ``rows`` of pieces ``(key, start, length, whole)``, tokens from ``docs[key]``, in ``num_rows`` rows.

    A piece is tokens ``start..start+length`` of document ``key`` (a
    ``whole`` one is all of them, taken without a slice);
    ``docs[key]`` has its ``tokens`` and ``mask`` (``None``: all tokens carry
    loss), as a look-ahead packer holds them. The tokens are gathered in row
    order, one slice per piece, so the layout's source is contiguous. Rows
    after those given stay padding.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.pack.windows import Doc
    >>> docs = {"a": Doc(np.array([1, 2, 3], np.int32), None, 0), "b": Doc(np.array([4, 5], np.int32), None, 0)}
    >>> lay = layout_of_rows([[("a", 0, 3, True)], [("b", 0, 2, True), ("a", 1, 1, False)]], docs, 3)
    >>> lay.assemble(seq_len=3, pad_id=0)["input_ids"].tolist()
    [[1, 2, 3], [4, 5, 2], [0, 0, 0]]
    """
    flat = [piece for row in rows for piece in row]
    held = list(map(docs.__getitem__, map(itemgetter(0), flat)))
    # a whole document's piece is all of its tokens: no slice to make
    parts = [d.tokens if whole else d.tokens[a : a + n] for d, (_, a, n, whole) in zip(held, flat)]
    masks = [d.mask if whole else d.mask[a : a + n] for d, (_, a, n, whole) in zip(held, flat) if d.mask is not None]
    seg_len = np.fromiter(map(itemgetter(2), flat), dtype=np.int64, count=len(flat))
    return Layout(
        np.concatenate(parts) if parts else np.empty(0, np.int32),
        np.cumsum(seg_len) - seg_len,
        seg_len,
        np.repeat(np.arange(len(rows), dtype=np.int64), [len(row) for row in rows]),
        np.fromiter(map(itemgetter(3), flat), dtype=bool, count=len(flat)),
        np.concatenate(masks) if masks and len(masks) == len(parts) else None,
        num_rows,
    )


def _mask_of(layout: Layout, start: int, n: int) -> np.ndarray:
    return np.ones(n, bool) if layout.mask is None else layout.mask[start : start + n]
