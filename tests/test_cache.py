"""The token cache: same output, no re-tokenizing, stale and foreign entries never used silently."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from tokenizers import Tokenizer

from arrowstream import CacheError, CacheWarning, ConfigError, read_parquet
from arrowstream.testing import assert_resumes_identically
from arrowstream.testing.data import make_texts, sample_tokenizer
from arrowstream.tokenize.encoders import Encoder

from .conftest import write_parts


def _data(root: Path, seed: int = 0, n: int = 120) -> Path:
    texts: list[str | None] = list(make_texts(n, seed=seed))
    texts[3], texts[7] = None, ""
    write_parts(root, [{"text": pa.array(texts[: n // 2])}, {"text": pa.array(texts[n // 2 :])}], row_group_size=25)
    return root


def _batches(ds) -> list[bytes]:  # noqa: ANN001
    return [b["input_ids"].tobytes() + b["labels"].tobytes() for b in ds]


def test_cached_output_is_identical_and_skips_the_encoder(
    tmp_path: Path, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _data(tmp_path / "data")
    plain = read_parquet(root).tokenize(tokenizer).pack(seq_len=64, batch_size=8)
    cached = read_parquet(root).tokenize(tokenizer, cache=tmp_path / "cache").pack(seq_len=64, batch_size=8)
    expected = _batches(plain)
    assert _batches(cached) == expected  # first pass: tokenized and kept
    it = plain.iter()
    list(it)
    first_stats = it.stats

    def refuse(self, texts):  # noqa: ANN001, ANN202
        raise AssertionError("the encoder ran although every row group is cached")

    monkeypatch.setattr(Encoder, "encode", refuse)
    again = read_parquet(root).tokenize(tokenizer, cache=tmp_path / "cache").pack(seq_len=64, batch_size=8)
    assert _batches(again) == expected
    it = again.iter()
    list(it)
    assert it.stats == first_stats  # null and empty rows counted the same way
    assert assert_resumes_identically(again) > 40  # resumed at every one of the steps


def test_unpacked_pipelines_keep_the_text_and_hide_the_cache_column(tmp_path: Path, tokenizer: Tokenizer) -> None:
    root = _data(tmp_path / "data")
    ds = read_parquet(root).tokenize(tokenizer, cache=tmp_path / "cache")
    for _ in range(2):  # fill, then read
        batch = next(iter(ds))
        assert batch.schema.names == ["text", "input_ids"]


def test_stale_entries_are_rebuilt_with_a_warning_or_refused(tmp_path: Path, tokenizer: Tokenizer) -> None:
    root = _data(tmp_path / "data")
    cache = tmp_path / "cache"
    list(read_parquet(root).tokenize(tokenizer, cache=cache).pack(seq_len=64, batch_size=2))
    _data(root, seed=1, n=130)  # the files change under the cache
    fresh = _batches(read_parquet(root).tokenize(tokenizer).pack(seq_len=64, batch_size=2))
    with pytest.raises(CacheError, match="does not match the data"):
        list(read_parquet(root).tokenize(tokenizer, cache=cache, cache_write=False).pack(seq_len=64, batch_size=2))
    with pytest.warns(CacheWarning, match="stale"):
        got = _batches(read_parquet(root).tokenize(tokenizer, cache=cache).pack(seq_len=64, batch_size=2))
    assert got == fresh


def test_a_damaged_entry_is_named_as_the_caches_not_blamed_on_the_data(tmp_path: Path, tokenizer: Tokenizer) -> None:
    # flipped bytes in an entry came out as "in 'p.parquet' ... column `text` holds token id -100662784"
    import pyarrow.parquet as pq

    root = _data(tmp_path / "data")
    cache = tmp_path / "cache"
    pack = {"seq_len": 64, "batch_size": 2}
    fresh = _batches(read_parquet(root).tokenize(tokenizer, cache=cache).pack(**pack))
    entries = sorted(cache.rglob("*.ids"))
    raw = entries[1].read_bytes()
    entries[1].write_bytes(raw[:100] + bytes(b ^ 0x55 for b in raw[100:200]) + raw[200:])  # inside a data page
    with pytest.raises(CacheError, match=rf"token cache entry '.*{entries[1].name}' .*CRC checksum"):
        list(read_parquet(root).tokenize(tokenizer, cache=cache, cache_write=False).pack(**pack))
    with pytest.warns(CacheWarning, match="stale"):
        assert _batches(read_parquet(root).tokenize(tokenizer, cache=cache).pack(**pack)) == fresh
    # an entry written before page checksums: its ids are checked as read
    table = pq.read_table(entries[2])
    ids = table.column("input_ids").combine_chunks()
    bad = pa.ListArray.from_arrays(ids.offsets, pa.array([-7] * len(ids.values), pa.int32()))
    pq.write_table(pa.table({"input_ids": bad}).replace_schema_metadata(table.schema.metadata), entries[2])
    with pytest.raises(CacheError, match=rf"'.*{entries[2].name}' .*null or negative token ids: the entry is damaged"):
        list(read_parquet(root).tokenize(tokenizer, cache=cache, cache_write=False).pack(**pack))


def _rewrite(path: Path, texts: list[str]) -> None:
    """Write ``texts`` to ``path`` in one uncompressed row group (same lengths: same file size)."""
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": texts}), path, compression="none")


def test_a_file_rewritten_with_the_same_size_and_rows_is_not_served_stale(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    texts = ["alpha beta gamma", "delta epsilon", "zeta eta theta iota"]
    _rewrite(root / "a.parquet", texts)
    size = (root / "a.parquet").stat().st_size
    cache = tmp_path / "cache"
    list(read_parquet(root).tokenize(tokenizer, cache=cache))
    # the longest text (the column's max) changes, with the same length: same size, same rows
    _rewrite(root / "a.parquet", [*texts[:2], "zeta eta theta iotb"])
    assert (root / "a.parquet").stat().st_size == size
    fresh = [b.column("input_ids").to_pylist() for b in read_parquet(root).tokenize(tokenizer)]
    with pytest.warns(CacheWarning, match="stale"):
        got = [b.column("input_ids").to_pylist() for b in read_parquet(root).tokenize(tokenizer, cache=cache)]
    assert got == fresh


def test_the_one_rewrite_the_cache_cannot_see_is_pinned(tmp_path: Path, tokenizer: Tokenizer) -> None:
    """The documented limit: a rewrite that keeps every column chunk's sizes and statistics.

    One letter changed inside a text that is neither the column's minimum nor
    its maximum, without compression: the footer is byte-identical, so the
    entry is served (the old ids). Only reading the text could tell.
    """
    root = tmp_path / "data"
    root.mkdir()
    texts = ["alpha beta gamma", "delta epsilon", "zeta eta theta iota"]
    _rewrite(root / "a.parquet", texts)
    cache = tmp_path / "cache"
    before = [b.column("input_ids").to_pylist() for b in read_parquet(root).tokenize(tokenizer, cache=cache)]
    _rewrite(root / "a.parquet", [texts[0], "delta epsilom", texts[2]])
    got = [b.column("input_ids").to_pylist() for b in read_parquet(root).tokenize(tokenizer, cache=cache)]
    fresh = [b.column("input_ids").to_pylist() for b in read_parquet(root).tokenize(tokenizer)]
    assert got == before != fresh


def test_another_tokenizer_never_reads_the_entries(tmp_path: Path, tokenizer: Tokenizer) -> None:
    root = _data(tmp_path / "data")
    cache = tmp_path / "cache"
    list(read_parquet(root).tokenize(tokenizer, cache=cache).pack(seq_len=64, batch_size=2))
    other = sample_tokenizer(300)
    expected = _batches(read_parquet(root).tokenize(other).pack(seq_len=64, batch_size=2))
    assert _batches(read_parquet(root).tokenize(other, cache=cache).pack(seq_len=64, batch_size=2)) == expected
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 2  # one directory per setting
    setting = next(p for p in cache.iterdir() if p.is_dir()) / "cache.json"
    setting.write_text(json.dumps({"tokenizer": "edited"}))
    with pytest.raises(CacheError, match="states the setting"):
        for tok in (tokenizer, other):
            list(read_parquet(root).tokenize(tok, cache=cache).pack(seq_len=64, batch_size=2))


def test_token_ids_need_no_cache(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"ids": pa.array([[1, 2]], pa.list_(pa.int32()))}])
    with pytest.raises(ConfigError, match="drop `cache=`"):
        read_parquet(tmp_path).tokenize(None, column="ids", eos_id=0, cache=tmp_path / "c")


def test_cli_builds_the_cache_ahead_of_time(tmp_path: Path, tokenizer_path: Path, tokenizer: Tokenizer) -> None:
    root = _data(tmp_path / "data")
    cache = tmp_path / "cache"
    proc = subprocess.run(
        [sys.executable, "-m", "arrowstream", "cache", str(root), "--tokenizer", str(tokenizer_path),
         "--cache", str(cache)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "6 row groups (6 tokenized now, 0 already there)" in proc.stdout
    assert "tokenizing" in proc.stderr  # the progress bar
    read_only = read_parquet(root).tokenize(tokenizer_path, cache=cache, cache_write=False)
    plain = read_parquet(root).tokenize(tokenizer_path)
    assert _batches(read_only.pack(seq_len=64, batch_size=2)) == _batches(plain.pack(seq_len=64, batch_size=2))


def test_a_cache_the_storage_refuses_to_write_warns_and_the_run_goes_on(tmp_path: Path, tokenizer_path: Path) -> None:
    import subprocess
    import sys
    import textwrap

    write_parts(tmp_path / "data", [{"text": ["some words to tokenize here, many of them"] * 400}], row_group_size=50)
    script = textwrap.dedent(f"""
        import resource, signal, warnings
        from arrowstream import read_parquet
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # the limit then fails the write (EFBIG)
        base = read_parquet({str(tmp_path / "data")!r}).tokenize({str(tokenizer_path)!r})
        want = [b["input_ids"].tobytes() for b in base.pack(seq_len=32, batch_size=2)]
        resource.setrlimit(resource.RLIMIT_FSIZE, (600, 600))   # bytes a file may hold
        cached = read_parquet({str(tmp_path / "data")!r}).tokenize({str(tokenizer_path)!r}, cache={str(tmp_path / "cache")!r})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = [b["input_ids"].tobytes() for b in cached.pack(seq_len=32, batch_size=2)]
        print(got == want, sum("cannot write to the token cache" in str(w.message) for w in caught))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "1"]  # the same batches; one warning, not one per row group
