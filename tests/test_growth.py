"""Growing corpora: a state saved before files were added continues with ``added_files="next_epoch"``.

The contract: the epochs the state had begun finish over the old files exactly
as the uninterrupted run on the old files would have; the added files join
from the next epoch, every document of the grown corpus once in it; the
grown run resumes exactly itself; without the opt-in the state is refused
with the way out; files that are not appended are other data.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arrowstream import Dataset, merge_states, read_parquet
from arrowstream.errors import ConfigError, StateMismatchError
from arrowstream.pipeline.growth import resume_plan
from arrowstream.pipeline.plan import Plan
from arrowstream.testing import assert_resumes_identically

from .conftest import named_docs

DOCS = named_docs([(i * 7) % 13 + 1 for i in range(100)])  # 20 documents per file, 5 files
OLD, ALL = range(3), range(5)


def _write(directory: Path, files: range) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for i in files:
        ids = pa.array(DOCS[i * 20 : (i + 1) * 20], pa.list_(pa.int32()))
        pq.write_table(pa.table({"ids": ids}), directory / f"part-{i:03d}.parquet", row_group_size=5)
    return directory


def _pipe(directory: Path, added: str = "next_epoch", strategy: str = "concat") -> Dataset:
    return (
        read_parquet(directory, num_epochs=2, added_files=added)
        .shuffle(seed=3)
        .tokenize(None, column="ids", eos_id=0)
        .pack(seq_len=8, batch_size=2, strategy=strategy)
    )


def _tokens(batches: list[Any]) -> list[int]:
    """The tokens of ``batches`` in order, without padding and end-of-document ids (0)."""
    return [t for b in batches for t in np.asarray(b["input_ids"]).ravel().tolist() if t]


def _corpus(files: range) -> Counter[int]:
    return Counter(t for i in files for doc in DOCS[i * 20 : (i + 1) * 20] for t in doc)


def _state(it: Any) -> dict[str, Any]:
    return json.loads(json.dumps(it.state_dict()))


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_the_begun_epoch_finishes_over_the_old_files_and_the_added_join_next(
    tmp_path: Path, strategy: str
) -> None:
    old, grown = _write(tmp_path / "old", OLD), _write(tmp_path / "grown", ALL)
    untouched = list(_pipe(old, strategy=strategy).iter())
    epoch0 = sum(_corpus(OLD).values())  # the old run's first epoch: its first tokens
    old_tokens = _tokens(untouched)
    it = _pipe(old, strategy=strategy).iter()
    for step in range(len(untouched) + 1):
        saved = _state(it)
        done = len(_tokens(untouched[:step]))
        rest = _tokens(list(_pipe(grown, strategy=strategy).iter(saved)))
        if saved["position"]["epoch"] == 0:
            left = epoch0 - done
            assert rest[:left] == old_tokens[done:epoch0], f"step {step}: the begun epoch changed"
            assert Counter(rest[left:]) == _corpus(ALL), f"step {step}: the next epoch is not the grown corpus once"
        else:  # the last epoch was begun over the old files: it ends there
            assert rest == old_tokens[done:], f"step {step}: the begun last epoch changed"
        next(it, None)


def test_the_grown_run_resumes_exactly_itself(tmp_path: Path) -> None:
    old, grown = _write(tmp_path / "old", OLD), _write(tmp_path / "grown", ALL)
    it = _pipe(old).iter()
    for _ in range(4):
        next(it)
    saved = _state(it)
    steps = assert_resumes_identically(lambda: _pipe(grown).iter(saved), min_epochs=2)
    assert steps > 10
    # a state saved inside the old files' epoch names them and where the added files join
    grown_it = _pipe(grown).iter(saved)
    assert grown_it.state_dict()["dataset"]["num_files"] == 3
    assert grown_it.state_dict()["dataset"]["until_epoch"] == 1
    for batch in grown_it:
        pass
    assert grown_it.state_dict()["dataset"] == read_parquet(grown).manifest.describe()


def test_ranks_keep_even_batches_and_every_document_once(tmp_path: Path) -> None:
    old, grown = _write(tmp_path / "old", OLD), _write(tmp_path / "grown", ALL)
    its = [_pipe(old).iter(rank=r, world_size=2) for r in range(2)]
    before = [[next(it) for _ in range(3)] for it in its]
    saved = [_state(it) for it in its]
    resumed = [list(_pipe(grown).iter(saved[r], rank=r, world_size=2)) for r in range(2)]
    assert len(resumed[0]) == len(resumed[1]), "ranks got uneven batch counts (a DDP hang)"
    seen = Counter(_tokens([b for part in before + resumed for b in part]))
    assert seen == _corpus(OLD) + _corpus(ALL)
    # elastic too: merged, the rest continues on three ranks
    merged = json.loads(json.dumps(merge_states(saved)))
    three = [list(_pipe(grown).iter(merged, rank=r, world_size=3)) for r in range(3)]
    assert len({len(part) for part in three}) == 1
    assert Counter(_tokens([b for part in before + three for b in part])) == _corpus(OLD) + _corpus(ALL)


def test_consumers_on_both_sides_of_the_join_merge_and_resume(tmp_path: Path) -> None:
    old, grown = _write(tmp_path / "old", OLD), _write(tmp_path / "grown", ALL)
    its = [_pipe(old).iter(rank=r, world_size=2) for r in range(2)]
    for it in its:
        next(it)
    saved = [_state(it) for it in its]
    runs = [_pipe(grown).iter(saved[r], rank=r, world_size=2) for r in range(2)]
    # rank 0 steps into the epoch of the grown corpus; rank 1 stays in the old files' epoch
    while runs[0].state_dict()["position"]["epoch"] == 0:
        next(runs[0])
    states = [_state(run) for run in runs]
    assert states[0]["dataset"]["num_files"] == 5 and states[1]["dataset"]["num_files"] == 3
    merged = json.loads(json.dumps(merge_states(states)))
    assert merged["dataset"]["until_epoch"] == 1
    for r in range(2):
        expect = [b["input_ids"].tolist() for b in runs[r]]
        got = [b["input_ids"].tolist() for b in _pipe(grown).iter(merged, rank=r, world_size=2)]
        assert got == expect, f"rank {r} continued differently from the merged state"


def test_the_join_is_one_past_the_last_epoch_any_worker_of_a_rank_began(tmp_path: Path) -> None:
    old, grown = _write(tmp_path / "old", OLD), _write(tmp_path / "grown", ALL)
    workers = [_pipe(old).iter(worker=w, num_workers=2) for w in range(2)]
    while workers[0].state_dict()["position"]["epoch"] == 0:
        next(workers[0])
    rank_state = {"kind": "rank", "states": [_state(w) for w in workers]}
    plan = resume_plan(Plan.of(_pipe(grown)), rank_state)
    assert plan.at(1).manifest.num_files == 3, "worker 0 began epoch 1 over the old files"
    assert plan.at(2).manifest.num_files == 5
    alone = resume_plan(Plan.of(_pipe(grown)), rank_state["states"][1])
    assert alone.at(1).manifest.num_files == 5


def test_without_the_opt_in_the_state_is_refused_with_the_way_out(tmp_path: Path) -> None:
    old, grown = _write(tmp_path / "old", OLD), _write(tmp_path / "grown", ALL)
    it = _pipe(old, added="refuse").iter()
    next(it)
    saved = _state(it)
    with pytest.raises(StateMismatchError, match=r"first 3 of these 5 files.*'part-003.parquet'.*added_files"):
        _pipe(grown, added="refuse").iter(saved)
    with pytest.raises(ConfigError, match="`added_files` should be 'refuse' or 'next_epoch'"):
        read_parquet(old, added_files="yes")


def test_files_changed_or_added_before_the_old_ones_are_other_data(tmp_path: Path) -> None:
    old = _write(tmp_path / "old", range(1, 4))
    it = _pipe(old).iter()
    next(it)
    saved = _state(it)
    before = _write(tmp_path / "before", range(0, 4))  # part-000 sorts first: not appended
    with pytest.raises(StateMismatchError, match="other data"):
        _pipe(before, added="refuse").iter(saved)
    with pytest.raises(StateMismatchError, match=r"first 3 in path order are not the files.*sort last"):
        _pipe(before).iter(saved)
    changed = tmp_path / "changed"
    shutil.copytree(old, changed)
    _write(changed, range(4, 5))
    ids = pa.array(DOCS[:19], pa.list_(pa.int32()))  # an old file rewritten
    pq.write_table(pa.table({"ids": ids}), changed / "part-002.parquet", row_group_size=5)
    with pytest.raises(StateMismatchError, match="none was renamed, rewritten or removed"):
        _pipe(changed).iter(saved)


def test_dataloader_workers_agree_where_the_added_files_join(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from arrowstream.pytorch import StatefulLoader

    old, grown = _write(tmp_path / "old", OLD), _write(tmp_path / "grown", ALL)
    loader = StatefulLoader(_pipe(old).to_torch(), num_workers=2)
    it = iter(loader)
    taken = []
    while True:  # until one worker has begun epoch 1 and the other has not
        taken.append(next(it))
        epochs = [s["position"]["epoch"] for s in loader.state_dict()["states"]]
        if sorted(epochs) == [0, 1]:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    untouched = _tokens(list(StatefulLoader(_pipe(old).to_torch(), num_workers=2)))
    resumed = StatefulLoader(_pipe(grown).to_torch(), num_workers=2)
    resumed.load_state_dict(state)
    rest = _tokens(list(resumed))
    # epoch 1 was begun over the old files, so both workers finish it there: the run ends as it would have
    assert Counter(_tokens(taken) + rest) == Counter(untouched)
