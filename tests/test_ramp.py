"""Look-ahead windows that ramp up: the first batch early, the rest of the run as before, exact resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arrowstream import read_parquet
from arrowstream.pack.windows import RAMP_FIRST, window_size
from arrowstream.testing import assert_resumes_identically

from .conftest import heavy_tail, write_named_docs

EOS = 0
WINDOW = 400  # ramps 64, 256, 400


def _pipeline(root: Path, strategy: str, *, num_epochs: int | None = 1, batch_rows: int = 1024, **options: Any) -> Any:
    # read batches of 1,024 rows (the default) are larger than the ramp's windows: they are cut at a document
    ds = read_parquet(root, batch_rows=batch_rows, num_epochs=num_epochs).tokenize(None, column="input_ids", eos_id=EOS)
    if strategy == "bucket":
        return ds.bucket(max_tokens=8 * 64, max_len=64, window=WINDOW, long_docs="truncate", **options)
    return ds.pack(seq_len=64, batch_size=8, strategy="best_fit", window=WINDOW, **options)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ramp")
    return write_named_docs(root, heavy_tail(1200, seed=7, cap=120), files=3, rg=50)


def _bytes(batches: list[dict[str, Any]]) -> list[bytes]:
    return [b["input_ids"].tobytes() for b in batches]


def test_window_sizes_grow_fourfold_from_the_first() -> None:
    assert [window_size(1024, k, ramp=True) for k in range(4)] == [RAMP_FIRST, 4 * RAMP_FIRST, 1024, 1024]
    assert window_size(1024, 0, ramp=False) == 1024
    assert window_size(RAMP_FIRST, 0, ramp=True) == RAMP_FIRST  # small windows never ramp


@pytest.mark.parametrize("strategy", ["best_fit", "bucket"])
def test_the_first_batch_waits_for_the_first_small_window_only(corpus: Path, strategy: str) -> None:
    read = {}
    for ramp in (True, False):
        it = _pipeline(corpus, strategy, ramp=ramp).iter()
        next(it)
        read[ramp] = it.stats["docs"]
    assert read[True] == RAMP_FIRST  # the first window ends at its 64th document, inside a read batch
    assert read[False] >= WINDOW


@pytest.mark.parametrize("strategy", ["best_fit", "bucket"])
def test_only_the_first_epoch_ramps_and_every_token_comes_once(corpus: Path, strategy: str) -> None:
    runs = {}
    for ramp in (True, False):
        it = _pipeline(corpus, strategy, num_epochs=2, ramp=ramp).iter()
        epochs: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
        for batch in it:
            epochs[it.state_dict()["packer"]["epoch"]].append(batch)
        runs[ramp] = epochs
    assert _bytes(runs[True][0]) != _bytes(runs[False][0])  # the ramp changes the first epoch...
    assert _bytes(runs[True][1]) == _bytes(runs[False][1])  # ...and nothing after it
    mask = "attention_mask" if strategy == "bucket" else "segment_ids"
    for ramp in (True, False):  # every epoch holds the same real tokens, each once
        epoch = [np.sort(np.concatenate([b["input_ids"][b[mask] > 0] for b in runs[ramp][e]])) for e in (0, 1)]
        assert np.array_equal(epoch[0], epoch[1])
        assert np.unique(epoch[0][epoch[0] != EOS]).size == np.count_nonzero(epoch[0] != EOS)


@pytest.mark.parametrize("strategy", ["best_fit", "bucket"])
def test_resumes_identically_at_every_step_while_ramping(tmp_path: Path, strategy: str) -> None:
    root = write_named_docs(tmp_path, heavy_tail(700, seed=3, cap=120), files=2, rg=40)
    ds = _pipeline(root, strategy, num_epochs=2)
    assert assert_resumes_identically(ds, min_epochs=2) > 20
    small = _pipeline(root, strategy, num_epochs=2, batch_rows=24)  # ramp windows cut read batches, or not
    assert assert_resumes_identically(small, every=3, min_epochs=2) > 7


@pytest.mark.filterwarnings("ignore::arrowstream.DataLossWarning")  # estimated batch counts may drop
@pytest.mark.parametrize("strategy", ["best_fit", "bucket"])
def test_a_consumer_of_two_resumes_identically_while_ramping(tmp_path: Path, strategy: str) -> None:
    root = write_named_docs(tmp_path, heavy_tail(900, seed=4, cap=120), files=3, rg=30)
    ds = _pipeline(root, strategy, num_epochs=2)
    assert assert_resumes_identically(lambda: ds.iter(rank=1, world_size=2), every=2, min_epochs=2) > 10


@pytest.mark.parametrize("strategy", ["best_fit", "bucket"])
def test_a_state_saved_before_the_ramp_goes_on_without_it(corpus: Path, strategy: str) -> None:
    """A version 6 state has no ``ramp``: its run keeps full windows, as when it was saved."""
    before = _pipeline(corpus, strategy, num_epochs=2, ramp=False)  # what version 6 did
    now = _pipeline(corpus, strategy, num_epochs=2)
    it = before.iter()
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(it.state_dict()))
    rest = list(it)
    reference = now.iter().state_dict()  # the options and their hash as version 6 wrote them
    assert "ramp" not in reference["options"]["pack"]
    old = {**state, "version": 6, "options": reference["options"], "options_hash": reference["options_hash"]}
    del old["checksum"]  # version 6 states had none
    old["packer"] = {k: v for k, v in state["packer"].items() if k not in ("ramp", "windows")}
    assert _bytes(list(now.iter(old))) == _bytes(rest)
    ramped = now.iter()
    for _ in range(3):
        next(ramped)
    assert _bytes(list(ramped)) != _bytes(rest)


@pytest.mark.parametrize("strategy", ["best_fit", "bucket"])
def test_the_ramp_costs_no_padding_to_speak_of(corpus: Path, strategy: str) -> None:
    share = {}
    for ramp in (True, False):
        it = _pipeline(corpus, strategy, ramp=ramp).iter()
        for _ in it:
            pass
        share[ramp] = it.stats["padding_tokens"] / (it.stats["padding_tokens"] + it.stats["tokens"])
    # bucket: a small window emits only its best-filled batch (emitting all of them cost 2 points here)
    assert share[True] <= share[False] + 0.003, share


@pytest.mark.parametrize("strategy", ["best_fit", "bucket"])
def test_skipped_rows_after_a_ramp_window_are_counted_once_across_resumes(tmp_path: Path, strategy: str) -> None:
    """The first ramp window ends at row 63 inside a read chunk; rows 64-65 are empty (skipped): the mark is 66."""
    lengths = heavy_tail(500, seed=5, cap=120)
    lengths[64] = lengths[65] = 0
    root = write_named_docs(tmp_path, lengths, files=1, rg=100)
    ds = _pipeline(root, strategy, num_epochs=2)
    it = ds.iter()
    next(it)
    assert it.state_dict()["packer"]["read"][2] == 66  # the next kept document, after the skipped rows
    assert assert_resumes_identically(ds, every=2, min_epochs=2) > 10
    for _ in it:
        pass
    assert it.stats["empty"] == 2 * 2  # two empty rows, each epoch, counted once
