"""What is read: a resume reads from the row group of its position on, a consumer only its own share.

A spy on :meth:`ShardReader.read` records every row group read (the prefetch
thread included), so these tests fail when a resume re-reads the data before
its position or a consumer reads and discards other consumers' rows, even
though the batches stay right.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from arrowstream import Dataset, read_parquet
from arrowstream.io.reader import ShardReader

from .conftest import write_parts

ROWS_PER_GROUP = 6


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, int]]:
    """Every row group of this test's files read from now on, as (file name, row group), in order.

    Only files under the test's ``tmp_path``: a thread left behind by an
    earlier test in the same process (an iterator dropped mid-stream, its
    prefetch thread winding down) reads files of the same names elsewhere.
    """
    seen: list[tuple[str, int]] = []
    read = ShardReader.read
    mine = str(tmp_path)

    def spy(self: ShardReader, shard: int):
        info = self.manifest.shard(shard)
        if str(info.path).startswith(mine):
            seen.append((Path(info.path).name, info.row_group))
        return read(self, shard)

    monkeypatch.setattr(ShardReader, "read", spy)
    return seen


def _corpus(root: Path, *, num_files: int = 3, docs_per_file: int = 24) -> Path:
    parts = [
        {
            "id": list(range(f * docs_per_file, (f + 1) * docs_per_file)),
            "text": [f"document {f * docs_per_file + i} " + "word " * (1 + i % 9) for i in range(docs_per_file)],
        }
        for f in range(num_files)
    ]
    write_parts(root, parts, row_group_size=ROWS_PER_GROUP)
    return root


def _order(ds: Dataset) -> list[tuple[str, int]]:
    """Row groups in manifest order."""
    return [(Path(s.path).name, s.row_group) for s in ds.manifest.shards]


def _drain(it: Iterator) -> int:
    return sum(1 for _ in it)


def _pipelines(root: Path, tokenizer: Tokenizer) -> dict[str, Callable[[], Dataset]]:
    return {
        "source": lambda: read_parquet(root, batch_rows=4),
        "tokenize": lambda: read_parquet(root, batch_rows=4).tokenize(tokenizer),
        "concat": lambda: read_parquet(root, batch_rows=4).tokenize(tokenizer).pack(seq_len=16, batch_size=2),
    }


@pytest.mark.parametrize("kind", ["source", "tokenize", "concat"])
def test_a_resume_reads_from_the_row_group_of_its_position_and_nothing_before(
    tmp_path: Path, tokenizer: Tokenizer, reads: list, kind: str
) -> None:
    root = _corpus(tmp_path)
    ds = _pipelines(root, tokenizer)[kind]()
    order = _order(ds)
    it = ds.iter()
    states = [json.loads(json.dumps(it.state_dict()))]
    for _ in it:
        states.append(json.loads(json.dumps(it.state_dict())))
    assert len(states) > 8
    for step, state in enumerate(states[1:-1], start=1):
        where = state["position"]
        reads.clear()
        _drain(ds.iter(state))
        # the position's row group first, then each later one once: none before, none twice
        first = order.index((where["file"], where["row_group"]))
        assert reads == order[first:], f"step {step}: resumed at {where}, read {reads}"


def test_a_shuffled_resume_reads_only_the_window_of_its_position_and_after(
    tmp_path: Path, tokenizer: Tokenizer, reads: list
) -> None:
    root = _corpus(tmp_path)
    ds = read_parquet(root, batch_rows=4).shuffle(seed=3, window=2, fragments=1).tokenize(tokenizer)
    reads.clear()
    full = [json.loads(json.dumps(s)) for s in _states(ds)]
    everything = list(reads)
    assert sorted(everything) == sorted(_order(ds))  # each row group read once in the epoch
    for state in full[1:-1]:
        where = state["position"]
        reads.clear()
        _drain(ds.iter(state))
        # windows of 2 row groups, read whole (their rows are interleaved): from the position's on
        first = everything.index((where["file"], where["row_group"])) // 2 * 2
        assert reads == everything[first:], f"resumed at {where}, read {reads}"


def _states(ds: Dataset) -> list[dict]:
    it = ds.iter()
    out = [it.state_dict()]
    for _ in it:
        out.append(it.state_dict())
    return out


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(("world_size", "num_workers"), [(2, 1), (2, 2), (3, 2)])
def test_each_consumer_reads_only_its_own_share(
    tmp_path: Path, tokenizer: Tokenizer, reads: list, shuffle: bool, world_size: int, num_workers: int
) -> None:
    root = _corpus(tmp_path, num_files=4)
    ds = read_parquet(root, batch_rows=4)
    if shuffle:
        ds = ds.shuffle(seed=1, window=1, fragments=1)
    ds = ds.tokenize(tokenizer).pack(seq_len=16, batch_size=2, even_batches=False)
    consumers = world_size * num_workers
    total = Counter()
    for rank in range(world_size):
        for worker in range(num_workers):
            reads.clear()
            _drain(ds.iter(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers))
            assert len(set(reads)) == len(reads), f"consumer {rank}/{worker} read a row group twice"
            # an equal share of the rows: at most the row groups its rows span
            share = ds.manifest.num_rows / consumers
            assert len(reads) <= share / ROWS_PER_GROUP + 2, f"consumer {rank}/{worker} read {reads}"
            total.update(reads)
    # all together read each row group once, or twice where two consumers' shares meet in it
    assert set(total) == set(_order(ds))
    assert sum(total.values()) <= len(total) + consumers - 1
