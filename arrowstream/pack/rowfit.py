"""Best-fit decreasing: pieces of documents placed into open rows, the longest first, each where it fits tightest.

:func:`fit_pieces` is the placement step of ``best_fit`` packing
(:mod:`arrowstream.pack.bestfit`): it works on lengths only and moves no
tokens. The free rows are kept sorted by room left; a row with room ``r``
at index ``i`` is the int ``r << 32 | i``, so the search compares ints, not
tuples, in the order ``(r, i)`` would sort.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

__all__ = ["OpenRow", "fit_pieces"]

#: The low bits of a free row's entry: the row's index (the high bits: its room).
_ROW_INDEX = (1 << 32) - 1

Piece = tuple[Any, int, int, bool]


@dataclass(slots=True)
class OpenRow:
    """A row still taking pieces: its pieces ``(key, start, length, whole)``, tokens filled and windows open."""

    pieces: list[Piece] = field(default_factory=list)
    fill: int = 0
    age: int = 0


def fit_pieces(rows: list[OpenRow], pieces: list[Piece], seq_len: int) -> None:
    """Place ``pieces`` into ``rows``, longest first, each into the row with the least room that fits it.

    A piece no open row fits opens a new row at the end of ``rows``. Pieces
    of equal length keep their order (a stable sort), and of rows with equal
    room the first takes the piece, so the placement depends only on the
    inputs.

    Examples
    --------
    >>> rows = [OpenRow([("a", 0, 5, True)], 5)]
    >>> fit_pieces(rows, [("b", 0, 2, True), ("c", 0, 6, True), ("d", 0, 3, True)], 8)
    >>> [[key for key, _, _, _ in row.pieces] for row in rows], [row.fill for row in rows]
    ([['a', 'd'], ['c', 'b']], [8, 8])
    """
    free = sorted(((seq_len - row.fill) << 32) | i for i, row in enumerate(rows) if row.fill < seq_len)
    for piece in sorted(pieces, key=itemgetter(2), reverse=True):  # stable: ties keep their order
        n = piece[2]
        at = bisect_left(free, n << 32)
        if at < len(free):
            entry = free.pop(at)
            room, i = entry >> 32, entry & _ROW_INDEX
        else:
            i, room = len(rows), seq_len
            rows.append(OpenRow())
        row = rows[i]
        row.pieces.append(piece)
        row.fill += n
        if room > n:
            insort(free, ((room - n) << 32) | i)
