"""Rows waiting to go out, with a split document's full rows kept as one entry, and their references in a state.

``best_fit`` splits a document longer than ``seq_len`` into full rows of
``seq_len`` tokens, each a row of its own. A document of 300 MB makes tens
of thousands of them at once; listed one by one, every snapshot, every
difference sent from a DataLoader worker and every state would carry them
all, so a long document made each batch cost in proportion to what was left
of it. Here a row queue is a list whose entries are either a row (a list of
pieces) or :class:`FullRows`, ``count`` one-piece rows of one document in
order; the queue is expanded only where rows leave it, a few at a time.

Entries never change once made (a run split by a take leaves a new run for
its rest), so snapshots can share them as they share rows.

A piece is ``(key, start, length, whole)``, as in :mod:`arrowstream.pack.bestfit`.
A state names a piece by reference (:data:`~arrowstream.state.SegmentRef`):
``[range, seq]`` for a whole document, ``[range, seq, start, length]`` for a
cut one, and full rows as one row of ``[range, seq, start, length, rows]``
(:func:`row_refs`, :func:`entry_from_refs`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from arrowstream.state import SegmentRef

__all__ = [
    "FullRows",
    "count_rows",
    "entry_from_refs",
    "first_pieces",
    "iter_rows",
    "piece_counts",
    "pieces_from_refs",
    "push_rows",
    "row_refs",
    "shuffled_rows",
    "take_rows",
]

Piece = tuple[Any, int, int, bool]
_PAST_ANY = 1 << 62  # past any token offset
Row = list[Piece]


@dataclass(frozen=True, slots=True)
class FullRows:
    """``count`` rows of one piece each: tokens ``start + k * length`` onward of document ``key``, ``length`` of them.

    Examples
    --------
    >>> rows = FullRows((0, 7), 0, 4, 3)
    >>> rows.row(2)
    [((0, 7), 8, 4, False)]
    >>> rows.after(1)
    FullRows(key=(0, 7), start=4, length=4, count=2)
    """

    key: Any
    start: int
    length: int
    count: int

    def row(self, k: int) -> Row:
        """Return the ``k``-th row (a list of one cut piece)."""
        return [(self.key, self.start + k * self.length, self.length, False)]

    def after(self, k: int) -> FullRows:
        """Return the rows after the first ``k``."""
        return FullRows(self.key, self.start + k * self.length, self.length, self.count - k)

    def ends_at(self) -> int:
        """Return the token just past the last row."""
        return self.start + self.count * self.length


Entry = Row | FullRows


def count_rows(entries: Iterable[Entry]) -> int:
    """Return how many rows ``entries`` hold.

    Examples
    --------
    >>> count_rows([[((0, 1), 0, 5, True)], FullRows((0, 2), 0, 8, 10)])
    11
    """
    return sum(e.count if type(e) is FullRows else 1 for e in entries)


def iter_rows(entries: Iterable[Entry]) -> Iterator[Row]:
    """Yield every row of ``entries``, runs expanded (for rare paths: a run may be long)."""
    for e in entries:
        if type(e) is FullRows:
            yield from (e.row(k) for k in range(e.count))
        else:
            yield e  # type: ignore[misc]


def take_rows(entries: list[Entry], n: int) -> tuple[list[Row], list[Entry]]:
    """Return the first ``n`` rows of ``entries`` (fewer if it holds fewer), and the entries after them.

    Examples
    --------
    >>> head, rest = take_rows([FullRows((0, 2), 0, 8, 3), [((0, 3), 0, 5, True)]], 2)
    >>> head
    [[((0, 2), 0, 8, False)], [((0, 2), 8, 8, False)]]
    >>> rest
    [FullRows(key=(0, 2), start=16, length=8, count=1), [((0, 3), 0, 5, True)]]
    """
    taken: list[Row] = []
    for i, e in enumerate(entries):
        want = n - len(taken)
        if want == 0:
            return taken, entries[i:]
        if type(e) is FullRows:
            k = min(e.count, want)
            taken.extend(e.row(j) for j in range(k))
            if k < e.count:
                return taken, [e.after(k), *entries[i + 1 :]]
        else:
            taken.append(e)  # type: ignore[arg-type]
    return taken, []


def first_pieces(entries: Iterable[Entry]) -> dict[Any, int]:
    """Return every document that ``entries`` hold a piece of, with the first token of its first piece there.

    Examples
    --------
    >>> first_pieces([[((0, 1), 4, 2, False), ((0, 3), 0, 5, True)], FullRows((0, 1), 6, 8, 2)])
    {(0, 1): 4, (0, 3): 0}
    """
    first: dict[Any, int] = {}
    get = first.get
    for e in entries:
        if type(e) is FullRows:
            if e.start < get(e.key, _PAST_ANY):
                first[e.key] = e.start
            continue
        for key, start, _, _ in e:  # type: ignore[union-attr]
            if start < get(key, _PAST_ANY):
                first[key] = start
    return first


def piece_counts(entries: Iterable[Entry]) -> dict[Any, int]:
    """Return every document that ``entries`` hold a piece of, with how many pieces (a full row is one).

    Examples
    --------
    >>> piece_counts([[((0, 1), 4, 2, False), ((0, 3), 0, 5, True)], FullRows((0, 1), 6, 8, 2)])
    {(0, 1): 3, (0, 3): 1}
    """
    counts: dict[Any, int] = {}
    get = counts.get
    for e in entries:
        if type(e) is FullRows:
            counts[e.key] = get(e.key, 0) + e.count
            continue
        for key, _, _, _ in e:  # type: ignore[union-attr]
            counts[key] = get(key, 0) + 1
    return counts


def shuffled_rows(rows: list[Row], rng: np.random.Generator) -> list[Row]:
    """Return ``rows`` in a random order from ``rng``, the rows that hold a cut document's piece in their own order.

    A cut document's pieces then go out first to last, so what is left of it
    is always a suffix. The order is ``rng.permutation(len(rows))`` with the
    places that fall to such rows given back to them in turn.

    Examples
    --------
    >>> rows = [[((0, 1), 0, 4, False)], [((0, 2), 0, 2, True)], [((0, 1), 4, 4, False)], [((0, 3), 0, 3, True)]]
    >>> out = shuffled_rows(rows, np.random.default_rng(3))
    >>> [r for r in out if not r[0][3]] == [rows[0], rows[2]], sorted(map(str, out)) == sorted(map(str, rows))
    (True, True)
    """
    order = rng.permutation(len(rows))
    cut = [i for i, row in enumerate(rows) if not all(whole for _, _, _, whole in row)]
    if cut:
        cuts = set(cut)
        order[[k for k, i in enumerate(order) if i in cuts]] = cut
    return [rows[int(i)] for i in order]


def push_rows(entries: list[Entry], rows: Iterable[Entry]) -> None:
    """Append ``rows`` (rows or runs) to ``entries``, a one-piece row that goes on from the run or row before joined to it.

    Examples
    --------
    >>> q = []
    >>> push_rows(q, [[((0, 2), 0, 8, False)], [((0, 2), 8, 8, False)], [((0, 5), 0, 3, True)]])
    >>> q
    [FullRows(key=(0, 2), start=0, length=8, count=2), [((0, 5), 0, 3, True)]]
    """
    for row in rows:
        last = entries[-1] if entries else None
        if last is not None and (joined := _join(last, row)) is not None:
            entries[-1] = joined
        else:
            entries.append(row)


def _join(a: Entry, b: Entry) -> FullRows | None:
    """Return ``a`` and ``b`` as one run when ``b``'s rows go on from ``a``'s (same document, length, next token)."""
    first, second = _as_run(a), _as_run(b)
    if first is None or second is None:
        return None
    if first.key != second.key or first.length != second.length or first.ends_at() != second.start:
        return None
    return FullRows(first.key, first.start, first.length, first.count + second.count)


def _as_run(e: Entry) -> FullRows | None:
    if type(e) is FullRows:
        return e
    if len(e) == 1:  # type: ignore[arg-type]
        key, start, length, whole = e[0]  # type: ignore[index]
        if not whole and length > 0:
            return FullRows(key, start, length, 1)
    return None


def row_refs(entry: Entry) -> tuple[SegmentRef, ...]:
    """Return a row's pieces as a state names them; full rows as one reference with their count.

    Examples
    --------
    >>> row_refs([((0, 1), 0, 5, True), ((0, 2), 8, 3, False)])
    ((0, 1), (0, 2, 8, 3))
    >>> row_refs(FullRows((0, 2), 0, 8, 4))
    ((0, 2, 0, 8, 4),)
    """
    if type(entry) is FullRows:
        return ((entry.key[0], entry.key[1], entry.start, entry.length, entry.count),)
    return tuple([key if whole else (key[0], key[1], start, n) for key, start, n, whole in entry])  # type: ignore[misc]


def pieces_from_refs(refs: tuple[SegmentRef, ...]) -> Row:
    """Return a row's pieces from their references; a whole document's length (-1) is known once it is re-read."""
    return [
        ((ref[0], ref[1]), 0, -1, True) if len(ref) == 2 else ((ref[0], ref[1]), ref[2], ref[3], False)
        for ref in refs
    ]


def entry_from_refs(refs: tuple[SegmentRef, ...]) -> Entry:
    """Return a ready or outgoing row from its references, or full rows from one reference of five numbers.

    Examples
    --------
    >>> entry_from_refs(((0, 2, 0, 8, 4),))
    FullRows(key=(0, 2), start=0, length=8, count=4)
    """
    if len(refs) == 1 and len(refs[0]) == 5:
        segment, seq, start, length, count = refs[0]
        return FullRows((segment, seq), start, length, count)
    return pieces_from_refs(refs)
