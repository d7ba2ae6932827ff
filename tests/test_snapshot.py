"""Snapshots: a state captured after a batch and built later equals the state ``state_dict()`` gave at that moment."""

from __future__ import annotations

import itertools
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from arrowstream import ConfigError, mix, read_parquet
from arrowstream.state.snapshot import Taken, take_snapshot

from .conftest import named_docs, write_parts

KINDS = ["unpacked", "concat", "best_fit", "bucket", "mixture-concat", "mixture-best_fit"]


def _ids(tmp_path: Path, seed: int = 7, epochs: int = 2):
    rng = np.random.default_rng(seed)
    docs = named_docs([int(n) for n in rng.integers(1, 14, size=120)])
    parts = [{"input_ids": pa.array(docs[a : a + 40], pa.list_(pa.int32()))} for a in range(0, 120, 40)]
    write_parts(tmp_path, parts, row_group_size=9)
    ds = read_parquet(tmp_path, batch_rows=6, num_epochs=epochs).shuffle(seed=seed, window=2)
    return ds.tokenize(None, column="input_ids", eos_id=0)


def _pipeline(tmp_path: Path, kind: str) -> Any:
    if kind == "unpacked":
        return _ids(tmp_path)
    if kind == "bucket":
        return _ids(tmp_path).bucket(max_tokens=30, max_len=10, window=40, long_docs="truncate")
    if kind in ("concat", "best_fit"):
        return _ids(tmp_path).pack(seq_len=10, batch_size=2, strategy=kind, **({"window": 40} if kind == "best_fit" else {}))
    strategy = kind.split("-")[1]
    sources = {"a": _ids(tmp_path / "a", seed=1), "b": _ids(tmp_path / "b", seed=2)}
    return mix(sources, {"a": 2, "b": 1}).pack(seq_len=10, batch_size=3, strategy=strategy)


def _text(state: dict[str, Any]) -> str:
    return json.dumps(state, sort_keys=True)


def _walk(it: Any, steps: int) -> tuple[list[Any], list[str]]:
    """Take a snapshot and a state before each of ``steps`` steps (fewer at the stream's end)."""
    snaps, states = [], []
    for _ in range(steps):
        snaps.append(it.snapshot())
        states.append(_text(it.state_dict()))
        try:
            next(it)
        except StopIteration:
            break
    return snaps, states


@pytest.mark.parametrize("kind", KINDS)
def test_a_snapshot_built_later_is_the_state_of_its_moment(tmp_path: Path, kind: str) -> None:
    ds = _pipeline(tmp_path, kind)
    snaps, states = _walk(ds.iter(), 400)  # both epochs of a finite pipeline; a mixture is endless
    assert len(states) > 30
    assert len(set(states)) == len(states)  # every step moved the state
    # built only now, long after the iterator moved on (and past the epoch end)
    assert [_text(s.to_dict()) for s in snaps] == states


@pytest.mark.parametrize("kind", KINDS)
def test_snapshots_after_a_resume_and_on_a_second_consumer(tmp_path: Path, kind: str) -> None:
    ds = _pipeline(tmp_path, kind)
    _, states = _walk(ds.iter(), 25)
    # right after a load, a look-ahead run echoes the loaded position until it re-reads its held documents
    resumed = ds.iter(json.loads(states[-1]))
    snaps, again = _walk(resumed, 40)
    assert again[0] == states[-1]
    assert [_text(s.to_dict()) for s in snaps] == again
    second = ds.iter(rank=1, world_size=2)
    snaps, states = _walk(second, 60)
    assert len(states) > 10
    assert [_text(s.to_dict()) for s in snaps] == states


@pytest.mark.parametrize("kind", ["concat", "best_fit", "bucket", "mixture-best_fit"])
def test_each_build_is_a_new_dict(tmp_path: Path, kind: str) -> None:
    it = _pipeline(tmp_path, kind).iter()
    for _ in range(5):
        next(it)
    snap, want = it.snapshot(), _text(it.state_dict())
    first = snap.to_dict()
    first["stats"]["batches"] = -1
    if "packer" in first and first["packer"]:
        first["packer"]["epoch_batches"] = -1
    assert _text(snap.to_dict()) == want


def test_an_iterator_without_snapshots_is_taken_at_once() -> None:
    class Counter:
        def __init__(self) -> None:
            self.n = 0

        def state_dict(self) -> dict[str, Any]:
            return {"n": self.n}

    c = Counter()
    snap = take_snapshot(c)
    c.n = 3
    assert isinstance(snap, Taken) and snap.to_dict() == {"n": 0}


def test_a_look_ahead_snapshot_does_not_build_the_window_references(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The point of a snapshot: a best_fit window's references are listed only when the state is built."""
    from arrowstream.pack.lookahead import LookaheadRun

    built: list[int] = []
    real = LookaheadRun.state_dict
    monkeypatch.setattr(LookaheadRun, "state_dict", lambda self: built.append(1) or real(self))
    it = _pipeline(tmp_path, "best_fit").iter()
    snaps = [it.snapshot() for _ in itertools.islice(it, 12)]
    assert len(snaps) == 12 and not built
    snaps[3].to_dict()
    assert len(built) == 1


@pytest.mark.parametrize("kind", ["unpacked", "concat", "best_fit", "bucket"])
def test_a_pickled_snapshot_leaves_its_plan_behind_and_builds_with_it_given_back(tmp_path: Path, kind: str) -> None:
    it = _pipeline(tmp_path, kind).iter()
    for _ in range(7):
        next(it)
    snap = it.snapshot()
    want = _text(it.state_dict())
    sent = pickle.loads(pickle.dumps(snap))
    assert sent.plan is None
    with pytest.raises(ConfigError, match="with_plan"):
        sent.to_dict()
    assert _text(sent.with_plan(it.plan).to_dict()) == want


@pytest.mark.parametrize("strategy", ["best_fit", "bucket"])
def test_a_look_ahead_snapshot_holds_no_tokens(tmp_path: Path, strategy: str) -> None:
    """A worker pickles a snapshot with every batch: the window's documents go by reference, not by their tokens."""
    rng = np.random.default_rng(3)
    docs = [rng.integers(1, 30_000, size=int(n)).astype(np.int32) for n in rng.integers(200, 900, size=60)]
    write_parts(tmp_path, [{"input_ids": pa.array(docs, pa.list_(pa.int32()))}], row_group_size=20)
    ids = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0)
    ds = ids.bucket(max_tokens=2048, max_len=1024, long_docs="truncate") if strategy == "bucket" else ids.pack(seq_len=1024, batch_size=2, strategy=strategy)
    it = ds.iter()
    next(it)
    held = sum(d.tokens.nbytes for d in it._run.store.values())
    assert held > 40_000  # the run holds tens of documents of hundreds of tokens ...
    assert strategy == "bucket" or it._run.ahead  # (best_fit: and batches assembled ahead, left out too)
    assert len(pickle.dumps(it.snapshot())) < held / 10  # ... and its snapshot names them


@pytest.mark.parametrize("kind", ["best_fit", "bucket"])
def test_snapshots_sent_as_differences_open_as_the_states_of_their_moments(tmp_path: Path, kind: str) -> None:
    # a worker's stream sends most snapshots as differences from an earlier one, naming what they share with it
    # (formed rows, the windows' sizes) by place: a shared object changed after it was sent would open wrong
    from arrowstream.state.sealed import Sealed, SealStream

    ds = _pipeline(tmp_path, kind)
    it, stream, sent, states = ds.iter(), SealStream(), [], []
    for _ in it:
        sent.append(pickle.dumps(Sealed(it.snapshot(), stream)))
        states.append(_text(it.state_dict()))
    received = [pickle.loads(b) for b in sent]  # in order, as a DataLoader delivers them
    assert sum(r.is_difference for r in received) > len(received) / 2
    assert [_text(r.open().with_plan(it.plan).to_dict()) for r in received] == states


@pytest.mark.parametrize("kind", ["best_fit", "bucket"])
def test_snapshots_after_an_elastic_re_deal_keep_the_skips_of_their_moment(tmp_path: Path, kind: str) -> None:
    # after a re-deal, held documents come back with a `skip` (their head went out elsewhere): a snapshot must keep
    # the skips of its moment, not read the run's, which empty as those documents go out
    from arrowstream import merge_states

    ds = _pipeline(tmp_path, kind) if kind == "best_fit" else _ids(tmp_path).bucket(max_tokens=30, max_len=5, window=40)
    states = []
    for rank in range(2):
        it = ds.iter(rank=rank, world_size=2)
        for _ in range(12):
            next(it)
        states.append(json.loads(json.dumps(it.state_dict())))
    assert any(d[2] > 0 for st in states for d in (st["held"] or {"docs": []})["docs"])
    snaps, later = _walk(ds.iter(merge_states(states)), 60)
    assert [_text(s.to_dict()) for s in snaps] == later
