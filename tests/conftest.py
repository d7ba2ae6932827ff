"""Shared fixtures: small Parquet datasets written per test, one trained tokenizer per session."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from arrowstream.testing.data import make_texts, sample_tokenizer

# The per-user cache (encoder verdicts) of this test session, and of the processes it starts: never the
# user's own, so a run starts cold and leaves nothing behind. Tests of the default location set their own.
_SESSION_CACHE = tempfile.mkdtemp(prefix="arrowstream-test-cache-")
os.environ["ARROWSTREAM_CACHE_DIR"] = _SESSION_CACHE


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tokie: the test runs with the tokie backend importable (if installed)")


@pytest.fixture(autouse=True)
def _tokie_only_where_asked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide tokie from tests not marked ``tokie``: they check tiktoken and `tokenizers` as when tokie is absent."""
    if request.node.get_closest_marker("tokie") is None:
        from arrowstream.tokenize import tokie_backend

        monkeypatch.setattr(tokie_backend, "tokie", None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return sample_tokenizer(vocab_size=1024)


@pytest.fixture(scope="session")
def tokenizer_path(tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def write_parts(
    directory: Path,
    parts: Sequence[dict[str, Any]],
    *,
    row_group_size: int = 4,
    schema: pa.Schema | None = None,
) -> list[Path]:
    """Write one Parquet file per dict of columns; return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, cols in enumerate(parts):
        path = directory / f"part-{i:03d}.parquet"
        pq.write_table(pa.table(cols, schema=schema), path, row_group_size=row_group_size)
        paths.append(path)
    return paths


#: Token ids of the named documents: (doc + 1) * BASE + position, so every token names its
#: document and its place in it.
BASE = 1000


def named_docs(lengths: Sequence[int]) -> list[list[int]]:
    """Return documents of the given lengths whose tokens name their document and place."""
    return [[(i + 1) * BASE + j for j in range(n)] for i, n in enumerate(lengths)]


def write_named_docs(root: Path, lengths: Sequence[int], *, files: int = 2, rg: int = 7) -> Path:
    """Write :func:`named_docs` as an ``input_ids`` column over ``files`` files; return ``root``."""
    docs = named_docs(lengths)
    per = -(-len(docs) // files)
    parts = [
        {"input_ids": pa.array(docs[f * per : (f + 1) * per], pa.list_(pa.int32()))}
        for f in range(files)
        if docs[f * per : (f + 1) * per]
    ]
    write_parts(root, parts, row_group_size=rg)
    return root


def block_sizes(batches: Sequence[dict[str, Any]]) -> list[int]:
    """How many batches each block gave, in order: a block's batches are views of one ``input_ids`` array."""
    owners = [b["input_ids"] if b["input_ids"].base is None else b["input_ids"].base for b in batches]
    return [len(list(group)) for _, group in itertools.groupby(map(id, owners))]


def heavy_tail(n: int, seed: int = 0, cap: int = 90) -> list[int]:
    """Return ``n`` document lengths from a capped Pareto tail (many short, a few long)."""
    rng = np.random.default_rng(seed)
    return [int(x) for x in np.minimum(rng.pareto(1.3, n) * 6 + 1, cap)]


def stop_merge_resume(ds: Any, before: int, after: int) -> list[dict[str, Any]]:
    """Stop ``before`` ranks after 2, 3, ... batches, merge their states, finish the epoch on ``after`` ranks.

    Return every batch emitted, in order; the states go through JSON, and some
    must hold documents (``held``), so the merge has carried work to re-deal.
    """
    from arrowstream import merge_states

    seen: list[dict[str, Any]] = []
    states = []
    for rank in range(before):
        it = ds.iter(rank=rank, world_size=before)
        seen += [next(it) for _ in range(2 + rank)]
        states.append(json.loads(json.dumps(it.state_dict())))
    assert any(s["held"] is not None for s in states)
    merged = json.loads(json.dumps(merge_states(states)))
    for rank in range(after):
        seen += list(ds.iter(merged, rank=rank, world_size=after))
    return seen


def counts_through_a_merge(ds: Any, before: int, after: int, keys: Sequence[str]) -> tuple[dict, dict]:
    """Return ``keys``' counts of one uninterrupted pass, and of the same epoch stopped on ``before`` ranks and finished on ``after``.

    The second adds the merged state's counts (the stopped consumers') to
    those the new consumers counted after it, so a document counted by both
    sides of the merge shows up twice.
    """
    from arrowstream import merge_states

    whole = ds.iter()
    for _ in whole:
        pass
    states = []
    for rank in range(before):
        it = ds.iter(rank=rank, world_size=before)
        for _ in range(2 + rank):
            next(it)
        states.append(json.loads(json.dumps(it.state_dict())))
    assert any(s["held"] is not None for s in states)
    merged = json.loads(json.dumps(merge_states(states)))
    got = {key: merged["stats"].get(key, 0) for key in keys}
    for rank in range(after):
        it = ds.iter(merged, rank=rank, world_size=after)
        for _ in it:
            pass
        for key in keys:
            got[key] += it.stats.get(key, 0)
    return {key: whole.stats.get(key, 0) for key in keys}, got


@pytest.fixture
def text_dir(tmp_path: Path) -> Callable[..., Path]:
    """Return a factory writing ``num_files`` files of sample texts with unique ids."""

    def make(
        num_files: int = 3, docs_per_file: int = 20, row_group_size: int = 6, seed: int = 0
    ) -> Path:
        texts = make_texts(num_files * docs_per_file, seed=seed, mean_log_words=3.0)
        parts = [
            {
                "id": list(range(f * docs_per_file, (f + 1) * docs_per_file)),
                "text": texts[f * docs_per_file : (f + 1) * docs_per_file],
            }
            for f in range(num_files)
        ]
        out = tmp_path / f"texts-{seed}-{num_files}-{docs_per_file}-{row_group_size}"
        write_parts(out, parts, row_group_size=row_group_size)
        return out

    return make


class EncodedBy:
    """Texts each backend encoded while a pipeline ran (see :func:`encoded_by`).

    ``tiktoken`` counts texts tiktoken encoded for the pipeline (the built-in
    checks are left out), ``tokenizers`` texts `tokenizers` encoded. While the
    first documents are checked both encode them and `tokenizers`' ids are
    emitted, so ``tiktoken - tokenizers`` texts at least came out as tiktoken's ids.
    """

    def __init__(self) -> None:
        self.tiktoken = 0
        self.tokenizers = 0

    @property
    def emitted_by_tiktoken(self) -> int:
        return self.tiktoken - self.tokenizers


@pytest.fixture
def encoded_by(monkeypatch: pytest.MonkeyPatch) -> EncodedBy:
    """Count the texts each backend encodes for pipelines (not for the built-in checks)."""
    from arrowstream.tokenize import encoders

    counts = EncodedBy()
    fast_encode, reference = encoders._Fast.encode, encoders.Encoder._reference

    def spy_fast(self, texts, ref):  # the checks pass `_reference_serial`, pipelines `_reference`
        if getattr(ref, "__name__", "") == "_reference":
            counts.tiktoken += len(texts)
        return fast_encode(self, texts, ref)

    def _reference(self, texts):
        counts.tokenizers += len(texts)
        return reference(self, texts)

    monkeypatch.setattr(encoders._Fast, "encode", spy_fast)
    monkeypatch.setattr(encoders.Encoder, "_reference", _reference)
    return counts


def forked_while_held(module: Any, target: Callable[..., None], *args: Any, lock: str = "_lock") -> Any:
    """Fork a child running ``target(*args, pipe)`` while this process holds ``module``'s ``lock``; return what it sends.

    As a DataLoader worker forked while another thread of the trainer held the lock: the child
    must not wait for it. A child that does not answer within a minute is killed (not left for the
    interpreter's exit to wait on) and the test fails.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    with getattr(module, lock):
        proc = ctx.Process(target=target, args=(*args, there), daemon=True)
        proc.start()
        answered = False
        try:
            answered = here.poll(60)
        finally:
            if not answered:
                proc.kill()
    assert answered, "the forked process waited for a lock no thread of its own held"
    got = here.recv()
    proc.join(30)
    return got


def run_processes(script: str, args: Sequence[str | Path], *, cache: Path, times: int) -> list[Any]:
    """Run ``script`` (Python printing one JSON document) in ``times`` fresh processes one after another, with ``cache`` as their arrowstream cache; return what each printed."""
    import subprocess
    import sys

    env = dict(os.environ, ARROWSTREAM_CACHE_DIR=str(cache))
    return [
        json.loads(subprocess.run(
            [sys.executable, "-c", script, *map(str, args)], env=env, capture_output=True, text=True, check=True, timeout=120
        ).stdout)
        for _ in range(times)
    ]
