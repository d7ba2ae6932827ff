"""Mixtures with every strategy: bucketing, exactly-once across an elastic change after sources wrap, shared encoders, pad ids.

The sources are those of ``tests/test_mixture.py``: pre-tokenized documents
whose token values name their source, document and place, so every emitted
token says where it came from.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arrowstream import merge_states, mix, read_parquet
from arrowstream.errors import ConfigError
from arrowstream.mixture.schedule import step_rows
from arrowstream.testing import assert_resumes_identically
from arrowstream.testing.data import sample_tokenizer

from .test_mixture import _origin, _run, _source_docs, write_sources

STRATEGIES = ("concat", "best_fit", "bucket")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_sources(tmp_path_factory.mktemp("mix"))


def _build(
    sources: dict[str, Path], strategy: str, weights: Any, *, num_tokens: int | None = None, batch_size: int = 3,
    max_tokens: int = 640, **kw: Any
) -> Any:
    pipes = {n: read_parquet(p).tokenize(None, column="ids", eos_id=0) for n, p in sources.items()}
    m = mix(pipes, weights, **kw)
    if strategy == "bucket":
        return m.bucket(max_tokens=max_tokens, num_tokens=num_tokens)
    return m.pack(seq_len=16, batch_size=batch_size, strategy=strategy, num_tokens=num_tokens)


def _check_rows_name_their_source(batch: dict[str, Any]) -> None:
    for row, source in zip(batch["input_ids"], batch["source_ids"].tolist()):
        origins = set(_origin(row).tolist()) - {-1}
        assert origins <= {source}, f"a row of source {source} holds tokens of {origins}"


# -- bucketing -------------------------------------------------------------------------------


def test_a_bucketed_mixture_gives_each_batch_to_one_source_on_the_schedule(sources: dict[str, Path]) -> None:
    weights = {"web": 0.5, "code": 0.3, "books": 0.2}
    world = 2
    mixture = _build(sources, "bucket", weights)
    batches, _ = _run(mixture, world, 1, 40)
    done = np.zeros(3)
    for t in range(40):
        for r in range(world):
            b = batches[r][t]
            _check_rows_name_their_source(b)
            assert len(set(b["source_ids"].tolist())) == 1, "a bucketed batch mixes sources"
            assert b["input_ids"].shape[0] * b["input_ids"].shape[1] <= 640, "over the token budget"
            done[b["source_ids"][0]] += 1
        # every global step: each source's batches within one of its share
        assert np.abs(done - (t + 1) * world * np.array([0.5, 0.3, 0.2])).max() <= 1.0
    assert set(batches[0][0]) >= {"attention_mask", "source_ids", "num_docs"}


def test_a_bucketed_mixture_resumes_exactly_at_every_step(sources: dict[str, Path]) -> None:
    def build() -> Any:
        return _build(sources, "bucket", [(0, {"web": 0.5, "code": 0.3, "books": 0.2}), (9000, {"books": 1})],
                      num_tokens=30 * 640)

    assert assert_resumes_identically(build) == 30


def test_a_bucketed_mixture_takes_a_token_budget_not_a_row_count(sources: dict[str, Path]) -> None:
    pipes = {n: read_parquet(p).tokenize(None, column="ids", eos_id=0) for n, p in sources.items()}
    with pytest.raises(ConfigError, match="pass `max_tokens`"):
        mix(pipes, {"web": 1}).bucket(max_tokens=64, batch_size=4)
    with pytest.raises(ConfigError, match="even_batches"):
        mix(pipes, {"web": 1}).bucket(max_tokens=64, even_batches=True)


# -- exactly once per source epoch, across an elastic change after a source came round ----------


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("old", "new"), [((2, 1), (3, 1)), ((2, 2), (1, 3))])
def test_every_document_comes_once_per_source_epoch_across_an_elastic_change(
    sources: dict[str, Path], strategy: str, old: tuple[int, int], new: tuple[int, int]
) -> None:
    """Books capped at 3 epochs: drained to the end on both sides of a change, each of its tokens comes exactly 3 times.

    Batches of one row: a batch that finds its source run out after taking
    some of its rows is not emitted (the run stops with an error), and one row
    is one pull, so here nothing is taken from a source that has run out.
    """
    cap = 3
    mixture = _build(sources, strategy, {"web": 1, "books": 2}, max_epochs={"books": cap}, batch_size=1, max_tokens=320)
    before, its = _run(mixture, *old, 5 if strategy == "bucket" else 70)
    epochs = [it.state_dict()["sources"]["books"]["position"]["epoch"] for it in its.values()]
    assert max(epochs) >= 1, "the change should come after books came round"
    merged = json.loads(json.dumps(merge_states([it.state_dict() for it in its.values()])))
    after = []
    later = 0
    for r in range(new[0]):
        for w in range(new[1]):
            topology = {"rank": r, "world_size": new[0], "worker": w, "num_workers": new[1]}
            it = mixture.iter(merged, **topology)
            after.append(next(it))
            saved = json.loads(json.dumps(it.state_dict()))  # and resumed: the shares dealt travel in the state
            later += len(saved["sources"]["books"]["later_work"])
            it = mixture.iter(saved, **topology)
            with pytest.raises(ConfigError, match="'books' ran out"):
                while True:
                    after.append(next(it))
    if max(epochs) - min(epochs) > 1:
        assert later, "consumers epochs apart: the shares of the epochs after the next travel as later_work"
    seen: Counter[int] = Counter()
    for b in [b for part in before for b in part] + after:
        _check_rows_name_their_source(b)
        ids = b["input_ids"]
        seen.update(t for t in ids[ids > 0].tolist() if t // 10**6 == 3)
    docs = _source_docs(2, "books")
    assert seen == Counter({t: cap for doc in docs for t in doc}), "a books token did not come exactly 3 times"


# -- the global schedule by row, for bucketed batches too, across a topology change -------------


def test_a_bucketed_mixture_keeps_the_schedule_across_a_topology_change(sources: dict[str, Path]) -> None:
    weights = {"web": 0.5, "code": 0.3, "books": 0.2}
    mixture = _build(sources, "bucket", weights)
    reference, _ = _run(mixture, 2, 1, 30)
    _, its = _run(mixture, 2, 1, 6)
    merged = merge_states([it.state_dict() for it in its.values()])
    resumed, _ = _run(mixture, 3, 1, 8, merged)

    def by_slot(batches: list[list[dict[str, Any]]], origin: int, world: int) -> dict[int, int]:
        return {
            int(origin + step_rows(t, r, world, 1)[0]): int(b["source_ids"][0])
            for r, part in enumerate(batches) for t, b in enumerate(part)
        }

    want = by_slot(reference, 0, 2)
    got = by_slot(resumed, merged["rows"], 3)
    assert merged["rows"] == 12
    assert got == {slot: want[slot] for slot in got}


# -- text sources: one encoder; sources keep their own padding -----------------------------------


def test_sources_that_tokenize_alike_share_one_encoder(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": ["a b c d", "e f g"] * 20}), tmp_path / "a.parquet")
    tok = tmp_path / "tok.json"
    sample_tokenizer(300).save(str(tok))
    other = tmp_path / "other.json"
    sample_tokenizer(280).save(str(other))
    texts = {
        "x": read_parquet(tmp_path / "a.parquet").tokenize(str(tok)),
        "y": read_parquet(tmp_path / "a.parquet").tokenize(str(tok)),
        "z": read_parquet(tmp_path / "a.parquet").tokenize(str(other)),
    }
    m = mix(texts, {"x": 1, "y": 1, "z": 1}).pack(seq_len=8, batch_size=3)
    encoders = {name: m.pipelines[name]._tokenize_stage().encoder for name in "xyz"}
    assert encoders["x"] is encoders["y"], "one tokenizer, one encoder (its proof runs once)"
    assert encoders["z"] is not encoders["x"]
    assert texts["y"]._tokenize_stage().encoder is not encoders["x"], "the user's pipelines are left as they were"
    batch = next(iter(m))
    assert batch["num_tokens"] > 0


def test_each_source_pads_with_its_own_pad_id(sources: dict[str, Path]) -> None:
    pipes = {
        "web": read_parquet(sources["web"]).tokenize(None, column="ids", eos_id=7),
        "books": read_parquet(sources["books"]).tokenize(None, column="ids", eos_id=9),
    }
    m = mix(pipes, {"web": 1, "books": 1}).pack(seq_len=50, batch_size=4, strategy="best_fit")
    pads = {0: set(), 1: set()}
    for batch in (b for b, _ in zip(m, range(30))):
        for row, seg, source in zip(batch["input_ids"], batch["segment_ids"], batch["source_ids"].tolist()):
            pads[source].update(row[seg == 0].tolist())
    assert pads == {0: {7}, 1: {9}}


# -- a fresh process resumes at random steps ------------------------------------------------------

_RESUME = """
import hashlib, json, sys
from arrowstream import mix, read_parquet
paths, strategy, state_file, n = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
pipes = {k: read_parquet(p).tokenize(None, column="ids", eos_id=0) for k, p in paths.items()}
m = mix(pipes, {"web": 0.5, "code": 0.3, "books": 0.2}, seed=3)
m = m.bucket(max_tokens=640) if strategy == "bucket" else m.pack(seq_len=16, batch_size=3, strategy=strategy)
it = m.iter(json.load(open(state_file)), rank=1, world_size=2)
print(json.dumps([hashlib.sha256(next(it)["input_ids"].tobytes()).hexdigest() for _ in range(n)]))
"""


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_fresh_process_resumes_at_random_steps_byte_for_byte(
    sources: dict[str, Path], strategy: str, tmp_path: Path
) -> None:
    import hashlib
    import subprocess
    import sys

    mixture = _build(sources, strategy, {"web": 0.5, "code": 0.3, "books": 0.2}, seed=3)
    it = mixture.iter(rank=1, world_size=2)
    total, after = 60, 5
    steps = sorted(np.random.default_rng(7).choice(np.arange(1, total - after), size=3, replace=False).tolist())
    digests, states = [], {}
    for t in range(total):
        if t in steps:
            states[t] = json.dumps(it.state_dict())
        digests.append(hashlib.sha256(next(it)["input_ids"].tobytes()).hexdigest())
    paths = json.dumps({k: str(v) for k, v in sources.items()})
    for t, state in states.items():
        (tmp_path / "state.json").write_text(state)
        out = subprocess.run(
            [sys.executable, "-c", _RESUME, paths, strategy, str(tmp_path / "state.json"), str(after)],
            capture_output=True, text=True, check=True,
        ).stdout
        assert json.loads(out) == digests[t : t + after], f"a fresh process resumed at step {t} differs"


def test_a_bucketed_mixture_splitting_long_documents_resumes_exactly_at_every_step(sources: dict[str, Path]) -> None:
    def build() -> Any:
        pipes = {n: read_parquet(p).tokenize(None, column="ids", eos_id=0) for n, p in sources.items()}
        return mix(pipes, {"web": 0.5, "code": 0.3, "books": 0.2}).bucket(max_tokens=64, max_len=6, num_tokens=30 * 64)

    longest = max(
        max(b["num_tokens"] for b in read_parquet(p).tokenize(None, column="ids", eos_id=0).bucket(batch_size=1))
        for p in sources.values()
    )
    assert longest > 6  # some documents are split
    for batch in build():
        _check_rows_name_their_source(batch)
        assert batch["input_ids"].shape[1] <= 6
    assert assert_resumes_identically(build) == 30
