"""The typed parts of the checkpoint: read in one place, validated, named when malformed."""

from __future__ import annotations

import pytest

from arrowstream import StateError
from arrowstream.state import Held, Position, Work


def test_parts_round_trip() -> None:
    pos = Position(2, 1, 40, 7)
    assert Position.from_dict({**pos.to_dict(), "file": "a.parquet", "row": 3}) == pos
    work = Work(3, ((0, 0, 10, 0), (2, 4, 9, 5)), target=12)
    assert Work.from_dict(work.to_dict(with_target=True), field="next_work") == work
    assert "target" not in work.to_dict()
    held = Held((0, 9), ((0, 4, 0), (1, 7, 3)))
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
    ],
)
def test_a_malformed_part_is_refused_by_name(part: type, data: object, match: str) -> None:
    with pytest.raises(StateError, match=match):
        part.from_dict(data)
