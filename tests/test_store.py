"""A look-ahead run's held documents: holding and letting go in bulk equals doing it one document at a time."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowstream.pack.store import HeldStore, size_in
from arrowstream.pack.windows import Doc

_TOKENS = np.arange(100, dtype=np.int32)


def _doc(n: int, skip: int) -> Doc:
    return Doc(_TOKENS[:n], None, skip)


def _seen(store: HeldStore) -> tuple:
    """Everything a state or a snapshot reads of a store, orders included."""
    return (list(store.items()), [list(w.items()) for w in store.windows], list(store.skips.items()), store.cap)


# steps: ("hold", [(key, size, skip)...]) | ("let_go", [indices into held keys]) | ("seal",)
_step = st.one_of(
    st.tuples(st.just("hold"), st.lists(st.tuples(st.integers(0, 30), st.integers(1, 40), st.sampled_from([0, 0, 3])), max_size=6)),
    st.tuples(st.just("let_go"), st.lists(st.integers(0, 100), max_size=5)),
    st.tuples(st.just("seal")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_step, max_size=25), st.sampled_from([None, 8]))
def test_bulk_equals_one_at_a_time(steps: list, cap: int | None) -> None:
    bulk, single = HeldStore(cap=cap), HeldStore(cap=cap)
    for step in steps:
        if step[0] == "hold":  # keys may repeat, or be held already: the bulk call falls back to assignment
            keys = [(0, k) for k, _, _ in step[1]]
            docs = [_doc(n, skip) for _, n, skip in step[1]]
            bulk.hold(keys, docs, [d.tokens.size for d in docs] if len(keys) % 2 else None)  # sizes given or not
            for key, doc in zip(keys, docs):
                single[key] = doc
        elif step[0] == "let_go":
            held = list(single)
            gone = list(dict.fromkeys(held[i % len(held)] for i in step[1])) if held else []
            bulk.let_go(gone)
            for key in gone:
                del single[key]
        else:
            bulk.seal()
            single.seal()
        assert _seen(bulk) == _seen(single)
        assert all(w for w in bulk.windows)  # a window's dict goes once none of its documents is held
        for key in bulk:
            assert size_in(bulk.windows, key) == min(bulk[key].tokens.size, cap or 10**9)


def test_one_window_holds_a_bulk_call_and_goes_when_its_last_document_does() -> None:
    store = HeldStore()
    store.hold([(0, 1), (0, 2)], [_doc(5, 0), _doc(3, 2)])
    store.seal()
    store.hold([(0, 3)], [_doc(4, 0)])
    assert store.windows == [{(0, 1): 5, (0, 2): 3}, {(0, 3): 4}] and store.skips == {(0, 2): 2}
    store.let_go([(0, 2), (0, 1)])
    assert store.windows == [{(0, 3): 4}] and store.skips == {} and list(store) == [(0, 3)]


def test_letting_go_of_a_document_not_held_is_an_error() -> None:
    store = HeldStore()
    store.hold([(0, 1)], [_doc(5, 0)])
    with pytest.raises(KeyError):
        store.let_go([(0, 9)])
