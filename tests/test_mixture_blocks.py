"""A concat mixture's batches laid out several at a time equal those laid out one at a time, states included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

from arrowstream.mixture import iterator as mixture_iterator
from arrowstream.mixture.blocks import assemble_mixture_block
from arrowstream.mixture.rows import place_rows
from arrowstream.pack import blocks
from arrowstream.pack.layout import Layout
from arrowstream.testing import assert_items_equal, assert_resumes_identically

from .test_mixture import _mixture, write_sources


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_sources(tmp_path_factory.mktemp("mixblocks"))


def _consumer_runs(build: Any, block: int, world: int, workers: int, steps: int) -> list[list[tuple[Any, str]]]:
    """Every consumer's first ``steps`` batches, each with the consumer's state after it (blocks of at most ``block``)."""
    out = []
    with mock.patch.object(mixture_iterator, "_BLOCK_BATCHES", block):
        for r in range(world):
            for w in range(workers):
                it = build().iter(rank=r, world_size=world, worker=w, num_workers=workers)
                got = []
                for batch in it:
                    got.append((batch, json.dumps(it.state_dict(), sort_keys=True), dict(it.stats)))
                    if len(got) == steps:
                        break
                it.close()
                out.append(got)
    return out


CASES = [
    # weights (or stages), seq_len, batch_size, world, workers, num_tokens
    ({"web": 0.6, "code": 0.3, "books": 0.1}, 16, 4, 1, 1, None),
    ({"web": 0.5, "code": 0.5}, 8, 3, 2, 2, None),
    ([(0, {"web": 0.5, "code": 0.3, "books": 0.2}), (200, {"web": 0.1, "books": 0.9})], 16, 3, 1, 1, 60 * 3 * 16),
    ({"web": 0.001, "books": 0.999}, 32, 2, 3, 1, None),
    ({"books": 1}, 5, 7, 1, 2, None),
]


@pytest.mark.parametrize(("weights", "seq_len", "batch_size", "world", "workers", "num_tokens"), CASES)
@pytest.mark.parametrize("block", [1, 3, 8, 32])
def test_blocks_give_the_batches_states_and_counts_of_one_batch_at_a_time(
    sources: dict[str, Path], weights: Any, seq_len: int, batch_size: int, world: int, workers: int,
    num_tokens: int | None, block: int,
) -> None:
    def build() -> Any:
        return _mixture(sources, weights, seq_len=seq_len, batch_size=batch_size, num_tokens=num_tokens, seed=3)

    steps = 70  # across source epoch ends (every source's epoch is a few hundred to a thousand tokens)
    fast = _consumer_runs(build, block, world, workers, steps)
    slow = _consumer_runs(build, 0, world, workers, steps)
    assert [len(r) for r in fast] == [len(r) for r in slow] and all(fast)
    for c, (a, b) in enumerate(zip(fast, slow)):
        for k, ((batch_a, state_a, stats_a), (batch_b, state_b, stats_b)) in enumerate(zip(a, b)):
            assert_items_equal(batch_a, batch_b, where=f"consumer {c} batch {k}")
            assert state_a == state_b, f"consumer {c}: state after batch {k}"
            assert stats_a == stats_b, f"consumer {c}: stats after batch {k}"


def test_blocks_are_made_where_sources_have_full_rows(sources: dict[str, Path]) -> None:
    """The block path is taken (not only the fallback), growing 1, 2, 4, 8 batches."""
    made: list[int] = []
    real = mixture_iterator.assemble_mixture_block

    def spy(steps, rows, *, seq_len):
        made.append(len(steps))
        return real(steps, rows, seq_len=seq_len)

    mixture = _mixture(sources, {"books": 1}, seq_len=4, batch_size=2)
    with mock.patch.object(mixture_iterator, "assemble_mixture_block", spy):
        it = mixture.iter()
        for _ in range(30):
            next(it)
    assert made[:4] == [1, 2, 4, 8], made


@pytest.mark.parametrize(("cap", "sizes"), [(64, [1, 2, 4, 8, 8]), (16, [1, 2, 2, 2]), (5, [1, 1, 1, 1])])
def test_blocks_hold_no_more_tokens_than_the_cap(sources: dict[str, Path], cap: int, sizes: list[int]) -> None:
    """Large batches come in smaller blocks (8 tokens a batch here), the same batches, states and counts."""
    made: list[int] = []
    real = mixture_iterator.assemble_mixture_block

    def spy(steps, rows, *, seq_len):
        made.append(len(steps))
        return real(steps, rows, seq_len=seq_len)

    def build() -> Any:
        return _mixture(sources, {"web": 0.5, "code": 0.3, "books": 0.2}, seq_len=4, batch_size=2, seed=1)

    with mock.patch.object(blocks, "BLOCK_TOKENS", cap), mock.patch.object(mixture_iterator, "assemble_mixture_block", spy):
        (fast,) = _consumer_runs(build, 32, 1, 1, 40)
    (slow,) = _consumer_runs(build, 0, 1, 1, 40)
    assert made[:len(sizes)] == sizes and max(made) == sizes[-1], made
    assert len(fast) == len(slow) == 40
    for k, ((batch_a, state_a, stats_a), (batch_b, state_b, stats_b)) in enumerate(zip(fast, slow)):
        assert_items_equal(batch_a, batch_b, where=f"batch {k}")
        assert (state_a, stats_a) == (state_b, stats_b), f"state after batch {k}"


def test_states_and_source_counters_asked_now_and_then_equal_one_batch_at_a_time(sources: dict[str, Path]) -> None:
    """Sources move past the batches handed out when next looked at: asked after many batches, the same as after each."""
    def build() -> Any:
        return _mixture(sources, {"web": 0.6, "code": 0.3, "books": 0.1}, seq_len=8, batch_size=3, seed=5)

    seen = {}
    for block in (32, 0):
        with mock.patch.object(mixture_iterator, "_BLOCK_BATCHES", block):
            it = build().iter()
            got = []
            for k in range(1, 121):
                next(it)
                if k % 17 == 0:  # several batches of a block handed out since the last look
                    got.append((json.dumps(it.state_dict(), sort_keys=True), it.source_stats()))
            got.append((json.dumps(it.state_dict(), sort_keys=True), it.source_stats(), it.report().rows()))
            it.close()
            seen[block] = got
    assert len(seen[32]) == 8
    assert seen[32] == seen[0]


def test_a_block_shrinks_near_a_source_epoch_end_instead_of_falling_back(sources: dict[str, Path]) -> None:
    """Near a source's epoch end the block holds the batches whose rows the sources have: few go one at a time."""
    slow: list[int] = []
    real = mixture_iterator.place_rows

    def spy(taken, ids, **kw):
        slow.append(1)
        return real(taken, ids, **kw)

    mixture = _mixture(sources, {"web": 0.6, "code": 0.3, "books": 0.1}, seq_len=16, batch_size=4, seed=3)
    with mock.patch.object(mixture_iterator, "place_rows", spy):
        it = mixture.iter()
        for _ in range(200):
            next(it)
        ends = sum(it.report()["epoch"].to_list())  # source epoch ends crossed
        it.close()
    assert ends >= 8
    assert len(slow) <= ends, (len(slow), ends)  # at most the batch that straddles each (23 without shrinking)


def test_blocks_resume_exactly_at_every_step(sources: dict[str, Path]) -> None:
    def build() -> Any:
        return _mixture(sources, {"web": 0.5, "code": 0.3, "books": 0.2}, seq_len=8, batch_size=3,
                        num_tokens=90 * 3 * 8)

    assert assert_resumes_identically(build) == 90


def test_a_block_equals_the_placed_layouts_of_its_rows() -> None:
    """``assemble_mixture_block`` against ``place_rows`` on random rows, documents, slot orders and pieces."""
    rng = np.random.default_rng(7)
    for trial in range(60):
        seq_len, slots, count = int(rng.integers(1, 9)), int(rng.integers(1, 6)), int(rng.integers(1, 5))
        steps = [rng.integers(0, 3, slots).astype(np.int16) for _ in range(count)]
        need = np.bincount(np.concatenate(steps), minlength=3)
        data = {}
        for s in range(3):
            if not need[s]:
                continue
            size = int(need[s]) * seq_len
            cuts = np.unique(rng.integers(0, size, int(rng.integers(0, size + 1))))
            starts = cuts if rng.random() < 0.5 else cuts[cuts > 0]  # a document continued from before, or not
            ends = np.unique(np.append(cuts[cuts > 0], size)) if rng.random() < 0.5 else cuts[cuts > 0]
            data[s] = (np.arange(size, dtype=np.int32) + 1000 * (s + 1), starts.astype(np.int64), ends.astype(np.int64))
        given = {  # the tokens in one array, or in pieces laid end to end (rows cut between pieces too)
            s: (np.split(t, np.sort(rng.integers(0, t.size + 1, int(rng.integers(1, 5))))) if trial % 2 else t, a, b)
            for s, (t, a, b) in data.items()
        }
        got = assemble_mixture_block(steps, given, seq_len=seq_len)
        used = dict.fromkeys(data, 0)
        for j, ids in enumerate(steps):
            taken = {}
            for s in sorted(data):
                n = int((ids == s).sum())
                if n:
                    taken[s] = [_layout(*data[s], used[s], n, seq_len)]
                    used[s] += n
            want, counts = place_rows(taken, ids, unit=seq_len, pad_ids=[0, 0, 0])
            assert_items_equal(got[j][0], want, where=f"trial {trial} batch {j}")
            assert got[j][1] == counts
            assert got[j][2] == [(s, int((ids == s).sum())) for s in sorted(data) if (ids == s).any()]


def _layout(tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, row: int, n: int, seq_len: int) -> Layout:
    """The layout of rows ``row .. row + n`` of a source's full rows (as concat's ``next_layout`` makes it)."""
    lo, hi = row * seq_len, (row + n) * seq_len
    s = starts[(starts >= lo) & (starts < hi)] - lo
    e = ends[(ends > lo) & (ends <= hi)] - lo
    bounds = np.union1d(np.arange(0, hi - lo, seq_len), s).astype(np.int64)
    seg_len = np.diff(bounds, append=hi - lo)
    whole = np.isin(bounds, s) & np.isin(bounds + seg_len, e)
    return Layout(tokens[lo:hi], bounds, seg_len, bounds // seq_len, whole, None, n)
