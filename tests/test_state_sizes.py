"""The state sizes the docs state (docs/state-format.md), measured as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arrowstream import read_parquet
from arrowstream.pytorch import StatefulLoader
from arrowstream.testing.data import sample_tokenizer, write_dataset

#: pipeline -> the largest compact-JSON state over the first 40 batches the docs allow
STATED = {"concat": 1_700, "bucket": 60_000, "best_fit": 60_000, "loader concat": 3_300, "loader best_fit": 120_000}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demo")
    write_dataset(root, num_files=4, docs_per_file=1500, rows_per_group=250, seed=0)
    return root


def _largest(states) -> int:
    return max(len(json.dumps(state)) for state in states)


@pytest.mark.parametrize("name", list(STATED))
def test_states_are_as_large_as_the_docs_say(demo: Path, name: str) -> None:
    base = read_parquet(demo).shuffle(seed=0).tokenize(sample_tokenizer())
    strategy = name.split()[-1]
    ds = base.bucket(batch_size=8) if strategy == "bucket" else base.pack(seq_len=2048, batch_size=8, strategy=strategy)
    if name.startswith("loader"):
        loader = StatefulLoader(ds.to_torch(), num_workers=2)
        states = (loader.state_dict() for _, _ in zip(range(40), loader))
    else:
        it = ds.iter()
        states = (it.state_dict() for _, _ in zip(range(40), it))
    largest = _largest(states)
    assert largest <= STATED[name], f"{name}: {largest:,} bytes; update docs/state-format.md"
    assert largest > STATED[name] / 3, f"{name}: {largest:,} bytes, far below what the docs say"


def test_an_endless_runs_state_stays_as_large_over_many_epochs(tmp_path: Path) -> None:
    # the per-epoch counters kept an entry for every epoch begun: 510 KB after 3,000 epochs of an endless run
    from arrowstream.io.chunk import KEPT_EPOCHS

    write_dataset(tmp_path, num_files=1, docs_per_file=6, rows_per_group=3, seed=0)
    ds = read_parquet(tmp_path, num_epochs=None).tokenize(sample_tokenizer()).pack(seq_len=64, batch_size=1)
    it = ds.iter()
    sizes = {}
    while (epoch := it.state_dict()["position"]["epoch"]) < 3 * KEPT_EPOCHS:
        next(it)
        sizes[epoch] = len(json.dumps(it.state_dict()))
    state = it.state_dict()
    kept = [e["epoch"] for e in state["epoch_stats"]]
    assert kept == list(range(kept[-1] - KEPT_EPOCHS + 1, kept[-1] + 1)) and kept[-1] >= 3 * KEPT_EPOCHS - 1
    assert sizes[3 * KEPT_EPOCHS - 1] <= sizes[KEPT_EPOCHS + 1] + 40  # flat, not an entry an epoch more
    assert state["stats"]["tokens"] > sum(e["tokens"] for e in state["epoch_stats"])  # the totals keep every epoch
    resumed = ds.iter(json.loads(json.dumps(state)))
    for _ in range(12):  # and the state resumes where it was
        a, b = next(it), next(resumed)
        assert all((a[k] == b[k]).all() for k in ("input_ids", "segment_ids"))
    assert resumed.state_dict()["epoch_stats"] == it.state_dict()["epoch_stats"]


def test_merged_per_epoch_counters_leave_out_epochs_a_consumer_let_go(tmp_path: Path) -> None:
    # two endless consumers far apart: the one further on kept only its last 16 epochs, so the merged figures of
    # older epochs held the other's counts alone (half an epoch's tokens, as if half were lost)
    from arrowstream import merge_states
    from arrowstream.io.chunk import KEPT_EPOCHS

    write_dataset(tmp_path, num_files=1, docs_per_file=8, rows_per_group=2, seed=0)
    ds = read_parquet(tmp_path, num_epochs=None).tokenize(sample_tokenizer()).pack(seq_len=64, batch_size=1)
    states = []
    for rank, epochs in ((0, 4), (1, KEPT_EPOCHS + 8)):
        it = ds.iter(rank=rank, world_size=2)
        while it.state_dict()["position"]["epoch"] < epochs:
            next(it)
        states.append(json.loads(json.dumps(it.state_dict())))
    behind, ahead = ([e["epoch"] for e in st["epoch_stats"]] for st in states)
    assert behind[0] == 0 and ahead[0] > behind[-1]  # nothing in common
    merged = merge_states(states, drift=True)["epoch_stats"]
    assert [e["epoch"] for e in merged] == ahead  # the older epochs: one consumer's figures only, left out
    own = {e["epoch"]: e["tokens"] for e in states[1]["epoch_stats"]}
    assert all(e["tokens"] == own[e["epoch"]] for e in merged)
