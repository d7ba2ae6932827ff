"""Estimated even batches: what a consumer holds beyond the target is carried into the next epoch, not dropped."""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from arrowstream import ConfigError, DataLossWarning, read_parquet
from arrowstream.testing import assert_resumes_identically

from .conftest import BASE, heavy_tail, named_docs, write_parts

NUM_DOCS = 240


def _corpus(tmp_path: Path) -> tuple[Path, Counter]:
    """Named documents beside a column of filler whose bytes say nothing of their tokens.

    A filter on the filler makes the pipeline read it, so shares of equal
    Parquet bytes hold unequal tokens and the estimated target is off: some
    consumers have data beyond it.
    """
    docs = named_docs(heavy_tail(NUM_DOCS, seed=11, cap=60))
    rng = np.random.default_rng(4)
    filler = ["x" * int(n) for n in rng.integers(1, 400, NUM_DOCS)]
    parts = [
        {"input_ids": pa.array(docs[a : a + 60], pa.list_(pa.int32())), "filler": filler[a : a + 60]}
        for a in range(0, NUM_DOCS, 60)
    ]
    write_parts(tmp_path, parts, row_group_size=10)
    return tmp_path, Counter(t for doc in docs for t in doc)


STRATEGIES = {
    "concat": lambda ds, even: ds.pack(seq_len=16, batch_size=2, even_batches=even),
    "best_fit": lambda ds, even: ds.pack(seq_len=16, batch_size=2, strategy="best_fit", window=12, even_batches=even),
    "bucket": lambda ds, even: ds.bucket(max_tokens=64, window=12, even_batches=even),
}


def _pipeline(root: Path, strategy: str, *, epochs: int = 2, even: bool | str = True):
    ds = read_parquet(root, num_epochs=epochs, batch_rows=8).shuffle(seed=3, window=2)
    ds = ds.filter(pc.field("filler") != "")
    return STRATEGIES[strategy](ds.tokenize(None, column="input_ids", eos_id=0), even)


def _ids(batch) -> list[int]:
    real = batch["segment_ids"] > 0 if "segment_ids" in batch else batch["attention_mask"] > 0
    ids = batch["input_ids"]
    return ids[real & (ids > 0)].tolist()


def _run(ds, world: int) -> tuple[Counter, list[Counter], list[dict], list[str]]:
    """Every consumer's tokens, batches per counted epoch, final stats, and the loss warnings."""
    seen: Counter = Counter()
    per_epoch, stats = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DataLossWarning)
        for rank in range(world):
            it = ds.iter(rank=rank, world_size=world)
            epochs: Counter = Counter()
            for batch in it:
                seen.update(_ids(batch))
                epochs[it.state_dict()["packer"]["epoch"]] += 1
            per_epoch.append(epochs)
            stats.append(it.stats)
    return seen, per_epoch, stats, [str(w.message) for w in caught if issubclass(w.category, DataLossWarning)]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_the_excess_is_carried_into_the_next_epoch_and_appears_there_once(tmp_path: Path, strategy: str) -> None:
    root, corpus = _corpus(tmp_path)
    ds = _pipeline(root, strategy)
    assert ds.balance.startswith("estimated")
    seen, per_epoch, stats, warned = _run(ds, 3)
    assert all(e == per_epoch[0] for e in per_epoch) and set(per_epoch[0]) == {0, 1}  # equal steps, each epoch
    carried = sum(s["carried_tokens"] for s in stats)
    dropped = sum(s["dropped_tokens"] for s in stats)
    assert carried > 0  # some consumer had data beyond epoch 0's target
    # every document of both epochs appears at most once an epoch; what is missing is exactly what
    # the last epoch dropped, and only the last epoch dropped anything
    assert all(seen[t] <= 2 for t in seen) and set(seen) <= set(corpus)
    missing = sum(2 * n - seen[t] for t, n in corpus.items())
    eos_dropped = dropped - missing  # the EOS of dropped documents (id 0 is left out of `seen`)
    short = {t // BASE for t in corpus if seen[t] < 2}  # documents the last epoch did not give whole
    assert 0 <= eos_dropped <= len(short)
    assert all("epoch 1" in w for w in warned) and (dropped > 0) == bool(warned)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_drop_trims_every_epoch_as_before(tmp_path: Path, strategy: str) -> None:
    root, corpus = _corpus(tmp_path)
    seen, per_epoch, stats, warned = _run(_pipeline(root, strategy, even="drop"), 3)
    assert all(e == per_epoch[0] for e in per_epoch)
    assert sum(s["carried_tokens"] for s in stats) == 0
    assert any("epoch 0" in w for w in warned)  # the first epoch drops too
    carried, _, carried_stats, _ = _run(_pipeline(root, strategy), 3)
    # with concat, carrying never loses more: epoch 0's excess is emitted in epoch 1, where a consumer
    # short of its share (the shares change with each epoch's order) emits it instead of padding.
    # (The look-ahead packers pack carried documents differently, so a few tokens can go either way.)
    if strategy == "concat":
        assert sum(s["dropped_tokens"] for s in carried_stats) <= sum(s["dropped_tokens"] for s in stats)


def test_one_epoch_drops_with_a_warning_that_names_the_way_out(tmp_path: Path) -> None:
    root, _ = _corpus(tmp_path)
    _, _, stats, warned = _run(_pipeline(root, "best_fit", epochs=1), 3)
    assert sum(s["carried_tokens"] for s in stats) == 0  # no next epoch to carry into
    assert warned and all("arrowstream index" in w and "epoch 0" in w for w in warned)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_resume_while_carrying_continues_exactly(tmp_path: Path, strategy: str) -> None:
    root, _ = _corpus(tmp_path)

    def carrying(rank: int) -> bool:
        it = _pipeline(root, strategy).iter(rank=rank, world_size=3)
        for _ in it:
            state = it.state_dict()
            if "data_epoch" in state["packer"] or (
                strategy == "concat" and state["packer"]["epoch"] > state["position"]["epoch"]
            ):  # concat's position is the data's: a count ahead of it is a carry
                return True
        return False

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataLossWarning)
        rank = next((r for r in range(3) if carrying(r)), None)
        assert rank is not None, "no consumer carries: the corpus no longer makes the estimate miss"
        steps = assert_resumes_identically(
            lambda: _pipeline(root, strategy).iter(rank=rank, world_size=3), min_epochs=2
        )
    assert steps > 10


def test_even_batches_takes_true_drop_or_false(tmp_path: Path) -> None:
    root, _ = _corpus(tmp_path)
    ds = read_parquet(root).tokenize(None, column="input_ids", eos_id=0)
    with pytest.raises(ConfigError, match="`even_batches` must be True .* 'drop' .* or False"):
        ds.pack(seq_len=16, batch_size=2, even_batches="carry")
    assert ds.pack(seq_len=16, batch_size=2, even_batches="drop").packer.spec()["even_batches"] == "drop"
    # the default keeps the options (and so the states) of earlier releases
    assert ds.pack(seq_len=16, batch_size=2).packer.spec()["even_batches"] is True


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("counted", [True, False])
def test_every_epoch_accounts_for_its_tokens(tmp_path: Path, strategy: str, counted: bool) -> None:
    import json

    from arrowstream import merge_states

    root, corpus = _corpus(tmp_path)
    ds = read_parquet(root, num_epochs=2, batch_rows=8).shuffle(seed=3, window=2)
    if not counted:
        ds = ds.filter(pc.field("filler") != "")
    ds = STRATEGIES[strategy](ds.tokenize(None, column="input_ids", eos_id=0), True)
    total = sum(corpus.values()) + NUM_DOCS  # with one EOS a document
    per_epoch: dict[int, Counter] = {0: Counter(), 1: Counter()}
    batches: dict[int, list[int]] = {0: [], 1: []}
    states = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataLossWarning)
        for rank in range(3):
            it = ds.iter(rank=rank, world_size=3)
            list(it)
            for epoch, counts in it.epoch_stats.items():
                per_epoch[epoch].update(counts)
                batches[epoch].append(counts["batches"])
            states.append(json.loads(json.dumps(it.state_dict())))
    assert all(len(set(b)) == 1 for b in batches.values())  # every rank the same steps in each epoch
    assert per_epoch[0]["dropped_tokens"] == 0  # nothing is lost before the last epoch
    if counted:
        for epoch in (0, 1):  # each epoch emits the corpus, exactly
            assert per_epoch[epoch]["tokens"] == total and per_epoch[epoch]["carried_tokens"] == 0
        assert per_epoch[1]["dropped_tokens"] == 0
    else:
        # an epoch's batches hold its own data less what it carries on, plus what it was carried
        carried_in = per_epoch[1]["carried_tokens"]
        assert per_epoch[0]["carried_tokens"] == 0 and carried_in > 0
        assert per_epoch[0]["tokens"] == total - carried_in
        assert per_epoch[1]["tokens"] + per_epoch[1]["dropped_tokens"] == total + carried_in
    merged = merge_states(states)  # the global state sums every consumer's epochs
    assert {e["epoch"]: e["tokens"] for e in merged["epoch_stats"]} == {e: c["tokens"] for e, c in per_epoch.items()}


def test_epoch_counters_survive_a_resume(tmp_path: Path) -> None:
    root, _ = _corpus(tmp_path)
    ds = _pipeline(root, "concat")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataLossWarning)
        whole = ds.iter(rank=1, world_size=3)
        list(whole)
        it = ds.iter(rank=1, world_size=3)
        for _ in range(25):
            next(it)
        again = ds.iter(it.state_dict(), rank=1, world_size=3)
        list(again)
    assert again.epoch_stats == whole.epoch_stats and set(whole.epoch_stats) == {0, 1}
