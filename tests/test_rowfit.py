"""Best-fit decreasing placement: the same rows as a plain reference, and the rule it follows."""

from __future__ import annotations

from bisect import bisect_left, insort

from hypothesis import given, settings
from hypothesis import strategies as st

from arrowstream.pack.rowfit import OpenRow, fit_pieces


def _reference(rows: list[OpenRow], pieces: list, seq_len: int) -> None:
    """Best-fit decreasing over ``(room, index)`` tuples, as the packer did it first."""
    free = sorted((seq_len - row.fill, i) for i, row in enumerate(rows) if row.fill < seq_len)
    for piece in sorted(pieces, key=lambda p: p[2], reverse=True):
        n = piece[2]
        at = bisect_left(free, (n, -1))
        if at < len(free):
            room, i = free.pop(at)
        else:
            i, room = len(rows), seq_len
            rows.append(OpenRow())
        rows[i].pieces.append(piece)
        rows[i].fill += n
        if room > n:
            insort(free, (room - n, i))


def _rows(fills: list[int]) -> list[OpenRow]:
    return [OpenRow([(("open", k), 0, f, True)] if f else [], f, 1) for k, f in enumerate(fills)]


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 64).flatmap(
        lambda L: st.tuples(st.just(L), st.lists(st.integers(0, L), max_size=12), st.lists(st.integers(1, L), max_size=60))
    )
)
def test_same_rows_as_the_tuple_reference(case: tuple) -> None:
    L, fills, lengths = case
    pieces = [((0, k), 0, n, k % 3 != 0) for k, n in enumerate(lengths)]
    got, want = _rows(fills), _rows(fills)
    fit_pieces(got, pieces, L)
    _reference(want, pieces, L)
    assert [(r.pieces, r.fill, r.age) for r in got] == [(r.pieces, r.fill, r.age) for r in want]
    assert all(r.fill <= L for r in got)


def test_a_piece_goes_where_it_fits_tightest_and_ties_to_the_first_row() -> None:
    rows = _rows([3, 5, 5, 0])  # rooms 7, 5, 5, 10
    fit_pieces(rows, [("x", 0, 4, True)], 10)  # rooms 5 and 5 fit it; 5 is tighter than 7, the first of the two wins
    assert [len(r.pieces) for r in rows] == [1, 2, 1, 0]
    fit_pieces(rows, [("y", 0, 8, True)], 10)  # only the empty row fits it
    assert rows[3].pieces == [("y", 0, 8, True)] and rows[3].fill == 8


def test_longest_first_and_a_new_row_when_none_fits() -> None:
    rows: list[OpenRow] = []
    fit_pieces(rows, [("a", 0, 3, True), ("b", 0, 6, True), ("c", 0, 4, True), ("d", 0, 1, True)], 7)
    assert [[p[0] for p in r.pieces] for r in rows] == [["b", "d"], ["c", "a"]]
