"""The typed parts of the checkpoint: read in one place, validated, named when malformed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arrowstream import StateError, merge_states, read_parquet
from arrowstream.distributed.redeal import own_share
from arrowstream.distributed.topology import Consumer
from arrowstream.pipeline.plan import Plan
from arrowstream.state import (
    BestFitState,
    BucketState,
    Held,
    Position,
    Progress,
    State,
    Work,
)

from .conftest import heavy_tail, write_named_docs


def test_parts_round_trip() -> None:
    pos = Position(2, 1, 40, 7)
    assert Position.from_dict({**pos.to_dict(), "file": "a.parquet", "row": 3}) == pos
    work = Work(3, ((0, 0, 10, 0, 0), (2, 4, 9, 5, 7)), target=12)
    assert Work.from_dict(work.to_dict(with_target=True), field="next_work") == work
    assert "target" not in work.to_dict()
    assert work.to_dict()["segments"] == [[0, 0, 10, 0], [2, 4, 9, 5, 7]]  # `take` only when not 0
    held = Held((0, 9), ((0, 4, 0, 12), (1, 7, 3, -1)))
    assert Held.from_dict(held.to_dict()) == held


@pytest.mark.parametrize(
    ("part", "data", "match"),
    [
        (Position, {"epoch": 0, "segment": 0, "seq": -1, "token_offset": 0}, "position.seq"),
        (Position, {"epoch": True, "segment": 0, "seq": 0, "token_offset": 0}, "position.epoch"),
        (Position, {"epoch": 0, "segment": 0, "seq": 0}, "position.token_offset"),
        (Position, [0, 0, 0, 0], "position` should be a dict"),
        (Work, {"num_streams": 0, "segments": []}, "work.num_streams"),
        (Work, {"num_streams": 1, "segments": [[0, 0, 5]]}, "work.segments"),
        (Work, {"num_streams": 1, "segments": [[0, -2, 5, 0]]}, "work.segments"),
        (Work, {"segments": []}, "work` is malformed"),
        (Work, {"num_streams": 1, "segments": [], "target": -1}, "work.target"),
        (Held, {"read": [0], "docs": []}, "held` is malformed"),
        (Held, {"read": [0, 1], "docs": [[0, 1]]}, "held` is malformed"),
        (Progress, {"epoch": 0, "epoch_batches": -1}, "packer.epoch_batches"),
        (BestFitState, {"epoch": 0, "epoch_batches": 0, "read": [0, 0], "block": 0, "flushed": False,
                        "open": [], "ready": [], "out": []}, "packer.read"),
        (BestFitState, {"epoch": 0, "epoch_batches": 0, "read": [0, 0, 0], "block": 0, "flushed": False,
                        "open": [], "ready": [[[0, 1, 2]]], "out": []}, "packer` is malformed"),
        # full rows of a split document: none of them, a five-number reference beside others, or in an open row
        (BestFitState, {"epoch": 0, "epoch_batches": 0, "read": [0, 0, 0], "block": 0, "flushed": False,
                        "open": [], "ready": [], "out": [[[0, 1, 0, 8, 0]]]}, "packer` is malformed"),
        (BestFitState, {"epoch": 0, "epoch_batches": 0, "read": [0, 0, 0], "block": 0, "flushed": False,
                        "open": [], "ready": [[[0, 1, 0, 8, 3], [0, 2]]], "out": []}, "packer` is malformed"),
        (BestFitState, {"epoch": 0, "epoch_batches": 0, "read": [0, 0, 0], "block": 0, "flushed": False,
                        "open": [[1, [[0, 1, 0, 8, 3]]]], "ready": [], "out": []}, "packer` is malformed"),
        (BucketState, {"epoch": 0, "epoch_batches": 0, "read": [0, 0, 0], "window": 0, "flushed": False,
                       "carry": [[0]], "out": []}, "packer` is malformed"),
    ],
)
def test_a_malformed_part_is_refused_by_name(part: type, data: object, match: str) -> None:
    with pytest.raises(StateError, match=match):
        part.from_dict(data)


@pytest.mark.filterwarnings("ignore::arrowstream.DataLossWarning")  # estimated batch counts: drops are the point
@pytest.mark.parametrize("strategy", ["concat", "best_fit", "bucket"])
def test_every_state_reads_into_its_types_and_back_unchanged(tmp_path: Path, strategy: str) -> None:
    root = write_named_docs(tmp_path, heavy_tail(120, cap=40))
    ds = read_parquet(root, num_epochs=2).tokenize(None, column="input_ids", add_eos=False)
    ds = ds.bucket(batch_size=4) if strategy == "bucket" else ds.pack(seq_len=32, batch_size=2, strategy=strategy)
    it = ds.iter(rank=0, world_size=2)
    seen = {"held": False, "packer": False}
    for _ in range(12):
        state = json.loads(json.dumps(it.state_dict()))
        typed = State.from_dict(state)
        assert {**typed.to_dict(), "checksum": state["checksum"]} == state  # the checksum seals the typed parts
        seen["held"] |= typed.held is not None
        seen["packer"] |= bool(typed.packer)
        next(it)
    assert seen["packer"] and (seen["held"] or strategy == "concat")
    # a merged state's shares: next_work and a re-dealt (empty) packer part round-trip too
    merged = merge_states([it.state_dict(), ds.iter(rank=1, world_size=2).state_dict()])
    for consumer in range(3):
        own, _ = own_share(merged, Consumer(consumer, 3), Plan.of(ds).fresh_deal)
        assert State.from_dict(own).packer == {}  # a re-dealt share: nothing held
        resumed = ds.iter(merged, rank=consumer, world_size=3).state_dict()
        assert {**State.from_dict(resumed).to_dict(), "checksum": resumed["checksum"]} == resumed


def test_a_malformed_envelope_names_the_field() -> None:
    good = State(dataset={"fingerprint": "f"}, options_hash="h", options={}, position=Position(0, 0, 0),
                 work=Work(1, ((0, 0, 4, 0, 0),)), consumer=(0, 1), stats={"rows": 0}).to_dict()
    for key, value, match in [
        ("consumer", {"index": -1, "count": 1}, "consumer.index"),
        ("stats", {"rows": 1.5}, "int counters"),
        ("work", [], "work` should be a dict"),
        ("packer", [1], "packer` should be a dict"),
        ("next_work", {"num_streams": 0, "segments": []}, "next_work.num_streams"),
        ("version", 1, "version 1 is not supported"),
        ("earlier", {"stats": {"rows": 1}}, "earlier` should be"),
        ("earlier", {"stats": {"rows": "1"}, "epoch_stats": []}, "earlier.stats` should hold int counters"),
        ("earlier", {"stats": {}, "epoch_stats": [{"tokens": 1}]}, "earlier.epoch_stats"),
    ]:
        with pytest.raises(StateError, match=match):
            State.from_dict({**good, key: value})


def test_a_closed_iterator_ends_keeps_its_position_and_starts_again_from_a_state() -> None:
    from arrowstream.testing import example_dir

    ds = read_parquet(example_dir(), num_epochs=2).tokenize(None, column="ids", eos_id=0).pack(seq_len=4, batch_size=2)
    reference = [b["input_ids"].tobytes() for b in ds.iter()]
    it = ds.iter()
    next(it)
    state = json.loads(json.dumps(it.state_dict()))
    it.close()
    assert list(it) == [] and it.state_dict()["position"] == state["position"]  # ended, as a closed generator
    it.close()  # twice is fine
    it.load_state_dict(state)
    assert [b["input_ids"].tobytes() for b in it] == reference[1:]


def test_a_state_changed_after_it_was_saved_is_refused_whatever_its_kind(tmp_path: Path) -> None:
    """A checksum seals every kind of state: an edit that keeps it well-formed would lose or repeat data silently."""
    from arrowstream import mix
    from arrowstream.pytorch import StatefulLoader
    from arrowstream.state.checksum import with_checksum

    root = write_named_docs(tmp_path, heavy_tail(120, cap=40))
    ids = read_parquet(root, num_epochs=2).tokenize(None, column="input_ids", eos_id=0)
    ds = ids.pack(seq_len=32, batch_size=2, strategy="best_fit", window=32)
    its = [ds.iter(rank=r, world_size=2) for r in range(2)]
    for it in its:
        for _ in range(3):
            next(it)
    own = its[0].state_dict()
    merged = merge_states([it.state_dict() for it in its])
    loader = StatefulLoader(ds.to_torch())
    for _, _ in zip(range(2), loader):
        pass
    mixed = mix({"a": ids, "b": ids}, {"a": 1, "b": 1}).pack(seq_len=32, batch_size=2)
    mits = [mixed.iter(rank=r, world_size=2) for r in range(2)]
    for it in mits:
        next(it)
    cases = [  # (a state as saved, an edit, how it is loaded)
        (own, lambda s: s["packer"]["out"].pop(0), lambda s: ds.iter(s, rank=0, world_size=2)),  # a held document gone
        (merged, lambda s: s["consumers"][1]["stats"].update(rows=0), lambda s: ds.iter(s)),
        (loader.state_dict(), lambda s: s.update(next_worker=1), lambda s: StatefulLoader(ds.to_torch()).load_state_dict(s)),
        (mits[0].state_dict(), lambda s: s["position"].update(batches=0), lambda s: mixed.iter(s, rank=0, world_size=2)),
        (merge_states([it.state_dict() for it in mits]), lambda s: s.update(rows=0), lambda s: mixed.iter(s)),
        (own, lambda s: s["stats"].update(rows=1), lambda s: merge_states([s, its[1].state_dict()])),
    ]
    for state, edit, load in cases:
        assert "checksum" in state
        again = json.loads(json.dumps(state, indent=3, sort_keys=True))  # formatting and key order: as saved
        load(again)
        edited = json.loads(json.dumps(state))
        edit(edited)
        with pytest.raises(StateError, match="the state was changed after it was saved: its checksum"):
            load(edited)
        load(with_checksum(json.loads(json.dumps(state))))  # sealed again, as a tool that edits on purpose does
        edit(edited)
        del edited["checksum"]  # and the seal taken off with the edit: refused too (a state as saved has one)
        with pytest.raises(StateError, match="the state has no `checksum`, which every state of format version 8"):
            load(edited)
