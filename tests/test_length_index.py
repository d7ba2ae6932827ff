"""The length index: every document's tokens counted once, so even batches over text are exact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing

from arrowstream import (
    CacheError,
    CacheWarning,
    build_length_index,
    merge_states,
    read_parquet,
)
from arrowstream.pipeline.plan import Plan
from arrowstream.testing import assert_resumes_identically
from arrowstream.testing.texts import make_texts
from arrowstream.tokenize.lengths import INDEX_DIR

from .conftest import write_parts


def _corpus(root: Path, n: int = 240, files: int = 3, rg: int = 10, seed: int = 0) -> Path:
    # at most 40 words (about 60 tokens): a cut between documents is then off by less than
    # half a batch, and shares of equal tokens differ by one batch at most
    texts: list[str | None] = [" ".join(t.split()[:40]) for t in make_texts(n, seed=seed, mean_log_words=3.0)]
    texts[5], texts[17] = None, ""  # a null and an empty document: no tokens, counted as skipped
    per = n // files
    write_parts(root, [{"text": texts[f * per : (f + 1) * per]} for f in range(files)], row_group_size=rg)
    return root


def _pipeline(root: Path, tokenizer: Tokenizer, *, shuffle: bool = False, epochs: int = 1, **options):
    ds = read_parquet(root, num_epochs=epochs, batch_rows=8)
    if shuffle:
        ds = ds.shuffle(seed=3, window=2)
    even = options.pop("even_batches", True)
    return ds.tokenize(tokenizer, **options).pack(seq_len=32, batch_size=4, even_batches=even)


def _tokens(batches) -> Counter:
    out: Counter = Counter()
    for b in batches:
        out.update(b["input_ids"][b["segment_ids"] > 0].tolist())
    return out


def test_the_index_holds_each_documents_ids(tmp_path: Path, tokenizer: Tokenizer) -> None:
    root = _corpus(tmp_path / "data")
    summary = build_length_index(root, tokenizer)
    texts = pq.read_table(root).column("text").to_pylist()
    ids = [0 if t is None or t == "" else len(tokenizer.encode(t).ids) for t in texts]
    assert summary.num_docs == len(texts) and summary.num_tokens == sum(ids) and summary.num_built == 3
    ds = _pipeline(root, tokenizer)
    known = ds.stages[-1].known_tokens(ds.manifest)
    assert known.source == "a length index"
    per_row = np.concatenate([known.lengths(s) for s in range(ds.manifest.num_shards)])
    assert per_row.tolist() == [n + 1 if n else 0 for n in ids]  # ids plus EOS, 0 when skipped
    assert known.per_shard.sum() == per_row.sum()
    # the pipeline emits exactly what the index counted
    emitted = sum(int(b["num_tokens"]) for b in _pipeline(root, tokenizer, even_batches=False))
    assert emitted == int(known.per_shard.sum())
    assert len(list((root / INDEX_DIR).rglob("*.lengths"))) == 3  # one entry a file


def test_the_index_takes_a_few_bytes_a_document(tmp_path: Path, tokenizer: Tokenizer) -> None:
    root = _corpus(tmp_path / "data", n=4000, files=1, rg=1000)
    build_length_index(root, tokenizer)
    [entry] = (root / INDEX_DIR).rglob("*.lengths")
    assert entry.stat().st_size < 4 * 4000, entry.stat().st_size


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(("world", "workers"), [(1, 1), (1, 2), (2, 1), (3, 2), (4, 1), (4, 2)])
def test_an_index_gives_every_document_once_and_equal_counts(
    tmp_path: Path, tokenizer: Tokenizer, shuffle: bool, world: int, workers: int
) -> None:
    root = _corpus(tmp_path / "data")
    reference = _tokens(_pipeline(root, tokenizer, shuffle=shuffle, even_batches=False))
    assert _pipeline(root, tokenizer).balance.startswith("estimated: text without a length index")
    build_length_index(root, tokenizer)
    ds = _pipeline(root, tokenizer, shuffle=shuffle)
    assert ds.balance == "counted: a length index (whole row groups from the footers)"
    seen: Counter = Counter()
    counts, padding, dropped, rows = [0] * world, [0] * world, 0, 0
    for rank in range(world):
        for worker in range(workers):
            it = ds.iter(rank=rank, world_size=world, worker=worker, num_workers=workers)
            batches = list(it)
            seen += _tokens(batches)
            counts[rank] += len(batches)
            padding[rank] += it.stats["padding_batches"]
            dropped += it.stats["dropped_tokens"]
            rows += it.stats["rows"]
    assert seen == reference and dropped == 0 and rows == 240
    assert len(set(counts)) == 1  # every rank takes the same steps
    assert max(padding) <= 1, padding  # shares of whole batches: a rank pads once at most


def test_two_epochs_with_an_index_resume_exactly(tmp_path: Path, tokenizer: Tokenizer) -> None:
    root = _corpus(tmp_path / "data", n=90)
    build_length_index(root, tokenizer)
    steps = assert_resumes_identically(
        lambda: _pipeline(root, tokenizer, shuffle=True, epochs=2).iter(rank=1, world_size=3), min_epochs=2
    )
    assert steps > 5
    state = _pipeline(root, tokenizer, epochs=2).iter(rank=1, world_size=3).state_dict()
    assert state["work"]["by"] == "batches"


@pytest.mark.parametrize(("before", "after"), [(4, 3), (2, 4), (1, 2)])
def test_elastic_resumes_with_an_index_emit_the_rest_once(
    tmp_path: Path, tokenizer: Tokenizer, before: int, after: int
) -> None:
    root = _corpus(tmp_path / "data")
    reference = _tokens(_pipeline(root, tokenizer, shuffle=True, even_batches=False))
    build_length_index(root, tokenizer)
    ds = _pipeline(root, tokenizer, shuffle=True)
    seen: Counter = Counter()
    states, dropped = [], 0
    for rank in range(before):
        it = ds.iter(rank=rank, world_size=before)
        seen += _tokens([next(it) for _ in range(2 + rank)])
        states.append(json.loads(json.dumps(it.state_dict())))
    merged = json.loads(json.dumps(merge_states(states)))
    counts = []
    for rank in range(after):
        it = ds.iter(merged, rank=rank, world_size=after)
        batches = list(it)
        counts.append(len(batches))
        seen += _tokens(batches)
        dropped += it.stats["dropped_tokens"]
    assert seen == reference and dropped == 0
    assert len(set(counts)) == 1


def test_a_build_does_only_what_is_missing_or_stale(tmp_path: Path, tokenizer: Tokenizer) -> None:
    root = _corpus(tmp_path / "data")
    build_length_index(root, tokenizer)
    entries = sorted((root / INDEX_DIR).rglob("*.lengths"))
    kept = entries[0].stat().st_mtime_ns
    entries[1].unlink()
    assert build_length_index(root, tokenizer).num_built == 1
    assert entries[0].stat().st_mtime_ns == kept and entries[1].is_file()
    # a changed source file: its entry no longer matches and is built again
    table = pq.read_table(root / "part-002.parquet")
    pq.write_table(table.slice(0, 50), root / "part-002.parquet", row_group_size=10)
    with pytest.warns(CacheWarning, match="part-002.parquet.lengths.*does not match the data"):
        assert _pipeline(root, tokenizer).balance.startswith("estimated")  # never counted from stale lengths
    assert build_length_index(root, tokenizer).num_built == 1
    assert _pipeline(root, tokenizer).balance.startswith("counted")


def test_a_build_killed_midway_finishes_on_the_next_run(tmp_path: Path, tokenizer_path: Path) -> None:
    root = _corpus(tmp_path / "data", n=6000, files=6, rg=250, seed=1)
    command = [sys.executable, "-m", "arrowstream", "index", str(root), "--tokenizer", str(tokenizer_path)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list((root / INDEX_DIR).rglob("*.lengths")) and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = list((root / INDEX_DIR).rglob("*.lengths"))
    assert 1 <= len(done) < 6, "the build finished before it could be killed: give it more data"
    assert not list((root / INDEX_DIR).rglob("*.tmp")) or True  # a temporary file may be left; it is ignored
    again = subprocess.run(command, capture_output=True, text=True, check=True)
    assert f"{6 - len(done)} counted now, {len(done)} already there" in again.stdout
    # the same bytes as a build from scratch
    fresh = tmp_path / "fresh"
    summary = build_length_index(root, Tokenizer.from_file(str(tokenizer_path)), length_index=fresh)
    for entry in sorted((root / INDEX_DIR).rglob("*.lengths")):
        twin = Path(summary.dir) / entry.name
        assert pq.read_table(entry).equals(pq.read_table(twin))


def test_an_index_elsewhere_is_named_explicitly(tmp_path: Path, tokenizer: Tokenizer) -> None:
    root = _corpus(tmp_path / "data")
    where = tmp_path / "indexes"
    with pytest.raises(CacheError, match="no length index for this tokenizer and column"):
        _ = _pipeline(root, tokenizer, length_index=where).balance
    build_length_index(root, tokenizer, length_index=where)
    assert not (root / INDEX_DIR).exists()
    assert _pipeline(root, tokenizer, length_index=where).balance.startswith("counted: a length index")
    assert _pipeline(root, tokenizer).balance.startswith("estimated")  # not beside the data
    build_length_index(root, tokenizer)
    assert _pipeline(root, tokenizer, length_index=False).balance.startswith("estimated")
    # another setting keys another index
    assert _pipeline(root, tokenizer, add_special_tokens=False).balance.startswith("estimated")
    # an explicit index that does not match the data is an error, not a guess
    pq.write_table(pq.read_table(root / "part-001.parquet").slice(0, 40), root / "part-001.parquet")
    with pytest.raises(CacheError, match=r"part-001.parquet.lengths.*does not match the data.*arrowstream index"):
        _ = _pipeline(root, tokenizer, length_index=where).balance


def test_length_index_true_is_refused(tmp_path: Path, tokenizer: Tokenizer) -> None:
    from arrowstream import ConfigError

    write_parts(tmp_path, [{"ids": pa.array([[1, 2]], pa.list_(pa.int32()))}])
    with pytest.raises(ConfigError, match="`length_index` is a directory"):
        read_parquet(tmp_path).tokenize(tokenizer, column="ids", length_index=True)
    with pytest.raises(ConfigError, match="`length_index` is a directory"):
        read_parquet(tmp_path).tokenize(None, column="ids", eos_id=0, length_index=True)


def test_an_index_of_token_ids_spares_reading_them_to_weigh_half_row_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # over token ids the footers count whole row groups; `.shuffle`'s half row groups were weighed by
    # reading every row group's ids in every consumer before its first batch
    from arrowstream.io.reader import ShardReader

    lengths = [int(n) for n in np.random.default_rng(0).integers(0, 50, size=120)]
    ids = [list(range(1, n + 1)) if k % 17 else None for k, n in enumerate(lengths)]  # a few null rows
    root = tmp_path / "data"
    write_parts(root, [{"ids": pa.array(ids[a : a + 40], pa.list_(pa.int32()))} for a in (0, 40, 80)], row_group_size=10)
    reads: Counter = Counter()
    read = ShardReader.read

    def counting(self: ShardReader, shard: int, *args: object, **kwargs: object) -> pa.Table:
        reads[shard] += 1
        return read(self, shard, *args, **kwargs)

    monkeypatch.setattr(ShardReader, "read", counting)

    def run() -> tuple[list[bytes], int]:
        reads.clear()
        ds = read_parquet(root).shuffle(seed=1, window=3).tokenize(None, column="ids", eos_id=0).pack(seq_len=16, batch_size=2)
        out = [b["input_ids"].tobytes() for r in range(2) for b in ds.iter(rank=r, world_size=2)]
        return out, sum(reads.values())

    before, read_before = run()
    summary = build_length_index(root, None, column="ids")
    assert (summary.num_files, summary.num_docs) == (3, 120)
    after, read_after = run()
    assert after == before
    assert read_after == read_before - 12  # the 12 row groups were each read once more to weigh their halves
    index = list((root / INDEX_DIR).rglob("part-000.parquet.lengths"))[0]
    assert pq.read_table(index).column("tokens").to_pylist()[:17] == [None if x is None else len(x) for x in ids[:17]]


def test_empty_texts_keep_no_id_in_the_cache_and_the_index(tmp_path: Path, tokenizer: Tokenizer) -> None:
    # a post-processor that adds BOS would give an empty text one id; the stage drops empty texts
    # before encoding, so the cache and the index must count none for them too
    bos = Tokenizer.from_str(tokenizer.to_str())
    bos.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
    root = tmp_path / "data"
    write_parts(root, [{"text": ["a b c", "", "d e", None, "", "f"] * 5}], row_group_size=6)
    plain = list(read_parquet(root).tokenize(bos).pack(seq_len=8, batch_size=2, even_batches=False))
    list(read_parquet(root).tokenize(bos, cache=tmp_path / "c"))
    cached = list(read_parquet(root).tokenize(bos, cache=tmp_path / "c").pack(seq_len=8, batch_size=2, even_batches=False))
    assert [b["input_ids"].tolist() for b in cached] == [b["input_ids"].tolist() for b in plain]
    build_length_index(root, bos)
    ds = read_parquet(root).tokenize(bos).pack(seq_len=8, batch_size=2)
    known = ds.stages[-1].known_tokens(ds.manifest)
    assert int(known.per_shard.sum()) == sum(int(b["num_tokens"]) for b in plain)


def test_the_command_line_builds_and_reports_an_index(tmp_path: Path, tokenizer_path: Path) -> None:
    root = _corpus(tmp_path / "data")
    run = [sys.executable, "-m", "arrowstream"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    before = subprocess.run([*run, "inspect", str(root), "--tokenizer", str(tokenizer_path)], capture_output=True, text=True, env=env)
    assert "even batches (concat) with this tokenizer: estimated: text without a length index" in before.stdout
    out = subprocess.run([*run, "index", str(root), "--tokenizer", str(tokenizer_path)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    tokens = sum(
        int(pc.sum(pq.read_table(p).column("tokens")).as_py()) for p in (root / INDEX_DIR).rglob("*.lengths")
    )
    assert "3 files (3 counted now, 0 already there), 240 documents" in out.stdout
    assert f"{tokens:,} tokens" in out.stdout and "pipelines over this data find it" in out.stdout
    after = subprocess.run([*run, "inspect", str(root), "--tokenizer", str(tokenizer_path)], capture_output=True, text=True, env=env)
    assert "length index: column 'text'" in after.stdout and "covers 3 of 3 files" in after.stdout
    assert "counted: a length index" in after.stdout
    listed = json.loads(subprocess.run([*run, "inspect", str(root), "--json"], capture_output=True, text=True, env=env).stdout)
    assert listed["length_indexes"][0]["files_covered"] == 3
    missing = subprocess.run([*run, "index", str(root), "--tokenizer", str(tmp_path)], capture_output=True, text=True, env=env)
    assert missing.returncode == 2 and "is a directory without a tokenizer.json" in missing.stderr
    # without a tokenizer: a column of token ids, and text is refused naming the column
    write_parts(tmp_path / "ids", [{"ids": pa.array([[1, 2], [3]] * 5, pa.list_(pa.int32()))}], row_group_size=4)
    ids = subprocess.run([*run, "index", str(tmp_path / "ids"), "--column", "ids"], capture_output=True, text=True, env=env)
    assert ids.returncode == 0, ids.stderr
    assert "1 files (1 counted now, 0 already there), 10 documents, 15 tokens" in ids.stdout
    text = subprocess.run([*run, "index", str(root)], capture_output=True, text=True, env=env)
    assert text.returncode != 0 and "text" in text.stderr and "Traceback" not in text.stderr


def test_counted_plans_read_only_the_row_groups_cuts_fall_in(tmp_path: Path, tokenizer: Tokenizer) -> None:
    root = _corpus(tmp_path / "data")
    build_length_index(root, tokenizer)
    ds = _pipeline(root, tokenizer)
    [ds.iter(rank=r, world_size=4).state_dict() for r in range(4)]
    assert Plan.of(ds).token_counts.num_reads <= 3  # 24 row groups weighed by the entries' footers


@pytest.mark.parametrize(
    "strategy",
    [
        {"strategy": "best_fit", "seq_len": 64, "batch_size": 2, "window": 16},
        {"batch_size": 4, "window": 16},
        {"max_tokens": 256, "window": 16},
    ],
    ids=["best_fit", "bucket batch_size", "bucket max_tokens"],
)
@pytest.mark.parametrize(("world", "workers"), [(2, 1), (3, 2)])
def test_an_index_counts_best_fit_and_bucket_by_running_them(
    tmp_path: Path, tokenizer: Tokenizer, strategy: dict, world: int, workers: int
) -> None:
    root = _corpus(tmp_path / "data")
    build_length_index(root, tokenizer)
    ds = read_parquet(root, batch_rows=8).shuffle(seed=2, window=2).tokenize(tokenizer)
    options = dict(strategy)
    ds = ds.pack(**options) if "strategy" in options else ds.bucket(**options)
    assert ds.balance.startswith("counted: a length index") and "batches by running" in ds.balance
    reference = read_parquet(root).tokenize(tokenizer)
    total = sum(int(n) for b in reference for n in pc.list_value_length(b.column("input_ids")).to_pylist())
    steps, tokens, dropped = [], 0, 0
    for rank in range(world):
        steps.append(0)
        for worker in range(workers):
            it = ds.iter(rank=rank, world_size=world, worker=worker, num_workers=workers)
            for batch in it:
                steps[-1] += 1
                tokens += int(batch["num_tokens"])
            dropped += it.stats["dropped_docs"] + it.stats["dropped_tokens"]
    assert dropped == 0 and tokens == total and len(set(steps)) == 1


def test_an_index_that_cannot_be_written_says_where_and_what_to_do(tmp_path: Path, tokenizer: Tokenizer) -> None:
    root = _corpus(tmp_path / "data")
    (root / INDEX_DIR).write_text("a file where the index directory should be")  # the storage refuses
    with pytest.raises(CacheError, match=r"cannot write the length index in .*_arrowstream_index.*--index DIR"):
        build_length_index(root, tokenizer)
    assert _pipeline(root, tokenizer).balance.startswith("estimated")  # the pipeline still runs


def test_ctrl_c_during_a_build_ends_in_one_line(tmp_path: Path, tokenizer_path: Path) -> None:
    root = _corpus(tmp_path / "data", n=6000, files=6, rg=250, seed=1)
    command = [sys.executable, "-m", "arrowstream", "index", str(root), "--tokenizer", str(tokenizer_path)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list((root / INDEX_DIR).rglob("*.lengths")) and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err
    assert "interrupted: the files already counted are kept" in err


def test_a_corrupt_index_entry_is_named_not_trusted(tmp_path: Path, tokenizer: Tokenizer) -> None:
    root = _corpus(tmp_path / "data")
    build_length_index(root, tokenizer)
    for entry in (root / INDEX_DIR).rglob("*.lengths"):  # one byte flipped at the end of every row group's page
        data = bytearray(entry.read_bytes())
        meta = pq.read_metadata(entry)
        for k in range(meta.num_row_groups):
            chunk = meta.row_group(k).column(0)
            start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
            data[start + chunk.total_compressed_size - 2] ^= 0x10
        entry.write_bytes(bytes(data))
    ds = _pipeline(root, tokenizer)
    assert ds.balance.startswith("counted: a length index")  # the footers are intact
    with pytest.raises(CacheError, match=r"\.lengths', row group \d+, column 'tokens' is corrupt.*arrowstream index"):
        for rank in range(3):
            list(ds.iter(rank=rank, world_size=3))
    # a truncated entry (its footer gone) is not used: beside the data, even batches are estimated
    for entry in (root / INDEX_DIR).rglob("*.lengths"):
        entry.write_bytes(entry.read_bytes()[:100])
    with pytest.warns(CacheWarning, match="cannot be read"):
        assert _pipeline(root, tokenizer).balance.startswith("estimated")


def test_an_index_built_in_parts_equals_the_one_process_index(
    tmp_path: Path, tokenizer: Tokenizer, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from arrowstream.cli import main

    data = _corpus(tmp_path / "data", files=3)
    one = build_length_index(data, tokenizer, length_index=tmp_path / "one")
    parts = [build_length_index(data, tokenizer, length_index=tmp_path / "parts", shard=(i, 2)) for i in range(2)]
    assert [p.num_files for p in parts] == [2, 1] and sum(p.num_docs for p in parts) == one.num_docs
    assert main(["index", str(data), "--tokenizer", str(tokenizer_path), "--index", str(tmp_path / "cli"),
                 "--shard", "1/2"]) == 0
    assert "1 files (part 1 of 2) (1 counted now" in capsys.readouterr().out

    def files(d: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in d.rglob("*") if p.is_file()}

    assert files(tmp_path / "parts") == files(tmp_path / "one"), "the union of the parts, byte for byte"
    ds = read_parquet(data).tokenize(tokenizer, length_index=tmp_path / "parts").pack(seq_len=32, batch_size=2)
    assert ds.balance.startswith("counted")
