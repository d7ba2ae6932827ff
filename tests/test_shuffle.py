"""Shuffle: a fresh, seeded order every epoch, rows mixed across row groups, exact resume."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from arrowstream import ConfigError, read_parquet
from arrowstream.io.layout import Layout, permutation
from arrowstream.testing import assert_resumes_identically

from .conftest import write_parts


def _ids(ds) -> list[list[int]]:
    """Ids per epoch, in output order."""
    it = ds.iter()
    epochs: list[list[int]] = []
    for batch in it:
        epoch = it.state_dict()["position"]["epoch"]
        while len(epochs) <= epoch:
            epochs.append([])
        epochs[epoch] += batch.column("id").to_pylist()
    return epochs


def test_every_epoch_is_a_permutation_and_epochs_differ(text_dir: Callable[..., Path]) -> None:
    ds = read_parquet(text_dir(num_files=3, docs_per_file=20, row_group_size=6), num_epochs=3)
    epochs = _ids(ds.shuffle(seed=1, window=3))
    assert len(epochs) == 3
    for ids in epochs:
        assert sorted(ids) == list(range(60))
    assert epochs[0] != epochs[1] != epochs[2]
    assert epochs[0] != list(range(60))


def test_same_seed_same_order_other_seed_other_order(text_dir: Callable[..., Path]) -> None:
    ds = read_parquet(text_dir(), num_epochs=2)
    assert _ids(ds.shuffle(seed=5)) == _ids(ds.shuffle(seed=5))
    assert _ids(ds.shuffle(seed=5)) != _ids(ds.shuffle(seed=6))


def test_rows_of_several_row_groups_mix(text_dir: Callable[..., Path]) -> None:
    ds = read_parquet(text_dir(num_files=2, docs_per_file=24, row_group_size=6), batch_rows=12)
    first = next(iter(ds.shuffle(seed=0, window=4)))
    groups = {i // 6 for i in first.column("id").to_pylist()}
    assert len(groups) >= 3  # 12 rows drawn from at least 3 of the 4 row groups of the window


@pytest.mark.parametrize("fragments", [1, 3])
def test_shuffle_resumes_across_epochs(
    text_dir: Callable[..., Path], tokenizer: Tokenizer, fragments: int
) -> None:
    base = read_parquet(text_dir(), num_epochs=2, batch_rows=5).shuffle(
        seed=3, window=2, fragments=fragments
    )
    assert assert_resumes_identically(base, min_epochs=2) > 10
    packed = base.tokenize(tokenizer).pack(seq_len=24, batch_size=2)
    assert assert_resumes_identically(packed, min_epochs=2) > 10


def test_state_records_the_shuffle_and_refuses_another_seed(text_dir: Callable[..., Path]) -> None:
    ds = read_parquet(text_dir())
    it = ds.shuffle(seed=1).iter()
    next(it)
    state = it.state_dict()
    assert state["options"]["source"]["shuffle"] == {"seed": 1, "window": 8, "fragments": 2}
    from arrowstream import StateMismatchError

    with pytest.raises(StateMismatchError, match="shuffle.seed"):
        ds.shuffle(seed=2).iter(state)
    with pytest.raises(StateMismatchError, match="shuffle"):
        ds.iter(state)


def test_shuffle_options_are_checked(text_dir: Callable[..., Path], tokenizer: Tokenizer) -> None:
    ds = read_parquet(text_dir())
    with pytest.raises(ConfigError, match="seed"):
        ds.shuffle(seed=-1)
    with pytest.raises(ConfigError, match="window"):
        ds.shuffle(seed=0, window=0)
    with pytest.raises(ConfigError, match="once"):
        ds.shuffle(seed=0).shuffle(seed=1)
    with pytest.raises(ConfigError, match="right after"):
        ds.tokenize(tokenizer).shuffle(seed=0)


def test_permutations_are_stable_across_versions() -> None:
    """Regression guard: a saved state assumes this exact order; it must never change."""
    assert permutation(8, 1, 0, 0).tolist() == [6, 7, 2, 4, 1, 5, 0, 3]


@pytest.mark.parametrize("fragments", [1, 2, 3])
def test_layout_streams_split_rows_evenly(fragments: int) -> None:
    lay = Layout(
        np.arange(5), np.array([10, 3, 7, 0, 9]), epoch=2, seed=4, window=2, num_streams=3,
        fragments=fragments,
    )
    sizes = [lay.stream_rows(s) for s in range(3)]
    assert sum(sizes) == 29 and max(sizes) - min(sizes) <= 1
    seen = sorted(lay.locate(s, q) for s in range(3) for q in range(lay.stream_rows(s)))
    expected = sorted((sh, r) for sh, n in enumerate([10, 3, 7, 0, 9]) for r in range(n))
    assert seen == expected


def test_the_shard_order_differs_every_epoch_and_is_pinned(tmp_path: Path) -> None:
    """The permutation of row groups is a function of (seed, epoch), fixed across releases.

    Pinned so that a change of the permutation, which would change every
    user's data order and make saved states resume elsewhere, fails here.
    """
    docs = 10 * 6
    write_parts(tmp_path, [{"id": list(range(docs))}], row_group_size=6)
    ds = read_parquet(tmp_path, num_epochs=3, batch_rows=6).shuffle(seed=1, window=1, fragments=1)
    it = ds.iter()
    groups: dict[int, list[int]] = {}
    for batch in it:
        epoch = it.state_dict()["position"]["epoch"]
        for i in batch.column("id").to_pylist():
            order = groups.setdefault(epoch, [])
            if not order or order[-1] != i // 6:
                order.append(i // 6)
    assert [sorted(groups[e]) for e in range(3)] == [list(range(10))] * 3
    assert groups[0] != groups[1] and groups[1] != groups[2] and groups[0] != groups[2]
    assert groups == {
        0: [6, 7, 2, 4, 1, 8, 9, 5, 0, 3],
        1: [5, 2, 6, 8, 7, 3, 4, 0, 1, 9],
        2: [4, 6, 2, 9, 0, 7, 3, 8, 1, 5],
    }
