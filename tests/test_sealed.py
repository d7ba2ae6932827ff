"""Sealed snapshots: sent in order through a stream, most as differences, each opens to the state taken at its batch."""

from __future__ import annotations

import itertools
import pickle
import random
from pathlib import Path

import pytest

from arrowstream import StateError
from arrowstream.state.sealed import SealStream, Sealed

from .test_snapshot import KINDS, _pipeline

LOOK_AHEAD = {"best_fit", "bucket", "mixture-best_fit"}


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_of_sealed_snapshots_opens_in_any_order_to_the_states_taken(tmp_path: Path, kind: str) -> None:
    it = _pipeline(tmp_path, kind).iter()
    stream, sent, states = SealStream(), [], []
    for _ in itertools.islice(it, 150):  # two epochs, or 150 batches of a mixture (whose sources repeat)
        sent.append(pickle.dumps(Sealed(it.snapshot(), stream)))
        states.append(it.state_dict())
    received = [pickle.loads(b) for b in sent]  # in the order sent, as a DataLoader delivers a worker's batches
    differences = sum(r.is_difference for r in received)
    if kind in LOOK_AHEAD:  # formed rows are shared from one snapshot to the next
        assert differences > len(received) // 2, f"{differences} of {len(received)} crossed as differences"
    else:
        assert differences == 0
    order = list(range(len(received)))
    random.Random(0).shuffle(order)  # opened lazily, whenever a checkpoint asks
    for i in order:
        assert received[i].open().with_plan(it.plan).to_dict() == states[i], i
    assert not any(r.is_difference for r in received)  # an opened one lets go of its base


@pytest.mark.parametrize("kind", ["best_fit", "mixture-best_fit"])
def test_differences_opened_as_they_arrive_leave_the_base_for_the_next(tmp_path: Path, kind: str) -> None:
    """A checkpoint at every step opens each snapshot at once: the ones after it still find their base."""
    it = _pipeline(tmp_path, kind).iter()
    stream = SealStream()
    for _ in itertools.islice(it, 60):
        crossed = pickle.loads(pickle.dumps(Sealed(it.snapshot(), stream)))
        assert crossed.open().with_plan(it.plan).to_dict() == it.state_dict()


def test_a_difference_without_its_base_is_refused(tmp_path: Path) -> None:
    it = _pipeline(tmp_path, "best_fit").iter()
    stream = SealStream()
    sent = []
    for _ in range(3):
        next(it)
        sent.append(pickle.dumps(Sealed(it.snapshot(), stream)))
    with pytest.raises(StateError, match="in the order sent"):
        pickle.loads(sent[1])  # its base, sent[0], never arrived here
