"""Warm start: the encoder's proof is remembered on disk, so only the first process on a machine pays for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from arrowstream import read_parquet
from arrowstream.testing.data import make_texts, sample_tokenizer
from arrowstream.tokenize import verdicts as verdicts_module
from arrowstream.tokenize.encoders import Encoder
from arrowstream.tokenize.tokie_backend import tokie_version
from arrowstream.tokenize.verdicts import default_verdict_dir

from .conftest import EncodedBy, forked_while_held, run_processes, write_parts


def fresh_tokenizer(tag: str) -> Tokenizer:
    """A tokenizer no other test has checked (an added token changes its hash)."""
    tok = sample_tokenizer(300)
    tok.add_special_tokens([f"<|{tag}|>"])
    return tok


def new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget the verdicts this process holds, as a new process would start."""
    monkeypatch.setattr(verdicts_module, "_verdicts", {})


def test_the_default_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path / "mine"))
    assert default_verdict_dir() == tmp_path / "mine" / "encoders"
    assert Encoder(fresh_tokenizer("env")).cache_dir == tmp_path / "mine" / "encoders"
    for off in ("off", "OFF", "", "0", "none"):
        monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", off)
        assert default_verdict_dir() is None and Encoder(fresh_tokenizer("env")).cache_dir is None
    monkeypatch.delenv("ARROWSTREAM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_verdict_dir() == tmp_path / "xdg" / "arrowstream" / "encoders"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_verdict_dir() == tmp_path / "home" / ".cache" / "arrowstream" / "encoders"
    # an explicit directory or None wins over the environment
    assert Encoder(fresh_tokenizer("env"), cache_dir=tmp_path / "x").cache_dir == tmp_path / "x"
    assert Encoder(fresh_tokenizer("env"), cache_dir=None).cache_dir is None


def test_a_second_process_encodes_with_tiktoken_from_the_first_document(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, encoded_by: EncodedBy
) -> None:
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    tok = fresh_tokenizer("second")
    texts = make_texts(80, seed=3)
    write_parts(tmp_path / "data", [{"text": texts}], row_group_size=10)
    want = [b.column("input_ids").to_pylist() for b in read_parquet(tmp_path / "data").tokenize(tok, backend="tokenizers")]

    first = Encoder(tok, sample_bytes=500)
    assert first.describe()["checks_pending"]
    got = [b.column("input_ids").to_pylist() for b in read_parquet(tmp_path / "data").tokenize(first)]
    assert got == want and first.backend == "tiktoken" and encoded_by.tokenizers > 0  # the first process sampled
    [stored] = (tmp_path / "cache" / "encoders").glob("*.json")
    verdict = json.loads(stored.read_text())
    assert verdict["ok"] and verdict["documents"] >= 500 and verdict["checked"]["probe texts"] > 1000

    new_process(monkeypatch)
    encoded_by.tokenizers = encoded_by.tiktoken = 0

    def must_not_run(*args, **kwargs):
        raise AssertionError("the built-in checks ran again")

    monkeypatch.setattr(Encoder, "_check", must_not_run)
    second = Encoder(tok, sample_bytes=500)
    info = second.describe()
    assert not info["checks_pending"] and info["sample_bytes_left"] == 0 and second.backend == "tiktoken"
    assert "checked by an earlier process" in second.reason
    got = [b.column("input_ids").to_pylist() for b in read_parquet(tmp_path / "data").tokenize(second)]
    assert got == want
    assert encoded_by.tokenizers == 0 and encoded_by.tiktoken == len(texts)  # tiktoken from the first document

    # a process asking for a longer sample than was done samples again
    new_process(monkeypatch)
    assert Encoder(tok, sample_bytes=10**7).describe()["sample_bytes_left"] == 10**7


def test_an_encoder_mid_sample_picks_up_a_proof_another_process_stored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, encoded_by: EncodedBy
) -> None:
    tok = fresh_tokenizer("worker")
    texts = make_texts(40, seed=5)
    sample = sum(len(t.encode()) for t in texts[:20])
    waiting = Encoder(tok, sample_bytes=sample, cache_dir=tmp_path)  # a DataLoader worker, say
    waiting.encode(texts[:2])
    assert waiting.describe()["sample_bytes_left"] > 0 and encoded_by.tokenizers == 2

    new_process(monkeypatch)  # another worker, in its own process, finishes its sample first
    other = Encoder(tok, sample_bytes=sample, cache_dir=tmp_path)
    for i in range(0, len(texts), 4):
        other.encode(texts[i : i + 4])
    assert other.describe()["sample_bytes_left"] == 0
    new_process(monkeypatch)  # back in the first worker's process: only the disk tells

    encoded_by.tokenizers = encoded_by.tiktoken = 0
    ids, lens = waiting.encode(texts)
    assert encoded_by.tokenizers == 0 and encoded_by.tiktoken == len(texts)
    assert waiting.describe()["sample_bytes_left"] == 0 and "earlier process" in waiting.reason
    ref_ids, ref_lens = Encoder(tok, backend="tokenizers").encode(texts)
    assert ids.tolist() == ref_ids.tolist() and lens.tolist() == ref_lens.tolist()


def test_a_mismatch_found_by_another_process_ends_the_sample_on_tokenizers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tok = fresh_tokenizer("mismatch")
    texts = make_texts(20, seed=7)
    waiting = Encoder(tok, sample_bytes=10**6, cache_dir=tmp_path)
    waiting.encode(texts[:2])
    new_process(monkeypatch)
    verdicts_module._forget_verdict(waiting._key(), "a document differed (in another process)", tmp_path)
    new_process(monkeypatch)
    with pytest.warns(Warning, match="in another process"):
        ids, _ = waiting.encode(texts)
    assert waiting.backend == "tokenizers"
    assert ids.tolist() == Encoder(tok, backend="tokenizers").encode(texts)[0].tolist()


def test_a_process_writes_its_verdicts_to_disk_in_the_order_it_took_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The checks' thread stores its verdict; the stream, finding it in the process, stores it again with
    # the sample's size. The checks' file write, landing last, took the size back: every later process
    # sampled again (seen as a later process 0.7 s slower and 120 MB larger at 128k, and this file's
    # second test failing once in a full run).
    import os
    import threading

    in_write, go = threading.Event(), threading.Event()
    real = os.replace

    class SlowFirstRename:
        def __getattr__(self, name: str) -> object:
            return getattr(os, name)

        @staticmethod
        def replace(src: object, dst: object) -> None:
            if not in_write.is_set():  # the checks' write: held up until the stream has stored
                in_write.set()
                go.wait(5)
            real(src, dst)

    monkeypatch.setattr(verdicts_module, "os", SlowFirstRename())
    key, where = "ordered", tmp_path / "encoders"
    checks = threading.Thread(target=verdicts_module._store_verdict, args=(key, {"ok": True, "checked": {"probe texts": 9}}, where))
    checks.start()
    assert in_write.wait(5)
    with_sample = {**verdicts_module._cached_verdict(key, where), "documents": 4096, "documents_by": "tiktoken"}
    stream = threading.Thread(target=verdicts_module._store_verdict, args=(key, with_sample, where))
    stream.start()
    stream.join(0.3)  # waits for the checks' write to end (before the change it wrote at once)
    go.set()
    checks.join(5)
    stream.join(5)
    on_disk = json.loads((where / f"{key}.json").read_text())
    assert on_disk["documents"] == 4096, "the checks' write came last and took the sample's size back"
    assert on_disk == verdicts_module._cached_verdict(key, where)


@pytest.mark.parametrize("lock", ["_lock", "_store_lock"])
def test_a_process_forked_while_a_verdict_is_stored_stores_without_waiting(tmp_path: Path, lock: str) -> None:
    # a DataLoader worker forked while the checks' thread of the trainer writes its verdict
    got = forked_while_held(verdicts_module, _store_in_child, str(tmp_path / "encoders"), lock=lock)
    assert got == {"ok": True, "documents": 1}
    assert json.loads((tmp_path / "encoders" / "forked.json").read_text())["documents"] == 1


def _store_in_child(where: str, out: object) -> None:
    verdicts_module._store_verdict("forked", {"ok": True, "documents": 1}, Path(where))
    got = verdicts_module._cached_verdict("forked", Path(where))
    out.send({k: got[k] for k in ("ok", "documents")})  # type: ignore[attr-defined]


@pytest.mark.tokie
def test_real_processes_share_the_proof_through_the_default_directory(tmp_path: Path) -> None:
    tok = fresh_tokenizer("processes")
    tok.save(str(tmp_path / "tok.json"))
    write_parts(tmp_path / "data", [{"text": make_texts(300, seed=9)}], row_group_size=50)
    script = (
        "import json, sys\n"
        "from arrowstream import read_parquet\n"
        "from arrowstream.tokenize.encoders import Encoder\n"
        "enc = Encoder(sys.argv[1], sample_bytes=2000)\n"
        "before = enc.describe()\n"
        "n = sum(b.num_rows for b in read_parquet(sys.argv[2]).tokenize(enc))\n"
        "print(json.dumps({'before': before, 'after': enc.describe(), 'rows': n}))\n"
    )
    first, second = run_processes(script, [tmp_path / "tok.json", tmp_path / "data"], cache=tmp_path / "cache", times=2)
    assert first["before"]["checks_pending"] and first["before"]["sample_bytes_left"] == 2000
    fastest = "tiktoken" if tokie_version() is None else "tokie"  # child processes import tokie when installed
    assert first["after"]["backend"] == fastest and first["after"]["sample_bytes_left"] == 0
    assert not second["before"]["checks_pending"] and second["before"]["sample_bytes_left"] == 0
    assert second["before"]["backend"] == fastest and first["rows"] == second["rows"] == 300
    assert len(list((tmp_path / "cache" / "encoders").glob("*.json"))) == 1


def test_streaming_text_never_imports_pandas(tmp_path: Path, tokenizer_path: Path) -> None:
    # pyarrow imports pandas (about 0.15 s) on its first `pa.array` or non-zero-copy `to_numpy`;
    # the text path from reading to packed batches uses neither.
    pytest.importorskip("pandas")  # installed with the dev extras; without it there is nothing to guard
    write_parts(tmp_path / "data", [{"text": make_texts(200, seed=1) + [None, ""]}], row_group_size=30)
    script = (
        "import sys\n"
        "from arrowstream import read_parquet\n"
        "ds = read_parquet(sys.argv[1]).tokenize(sys.argv[2]).pack(seq_len=64, batch_size=4)\n"
        "n = sum(int(b['num_tokens']) for b in ds.iter())\n"
        "assert n > 0\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "data"), str(tokenizer_path)],
        capture_output=True, text=True, check=True, timeout=120,
    )
    assert out.stdout.strip() == "False"


def test_arrays_made_without_pyarrow_array_equal_its_own() -> None:
    import numpy as np
    import pyarrow as pa

    from arrowstream.io.arrays import bools_to_numpy, from_numpy, numbers_to_numpy

    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 9, 100):
        bools = rng.random(n) < 0.5
        assert from_numpy(bools).equals(pa.array(bools))
        ints = rng.integers(-5, 5, n)
        assert from_numpy(ints).equals(pa.array(ints)) and from_numpy(ints, pa.int32()).equals(pa.array(ints, pa.int32()))
        assert from_numpy(ints[::2]).equals(pa.array(ints[::2]))  # not contiguous
        with_nulls = pa.array([None if b else int(i) for b, i in zip(bools, ints)], pa.int64())
        for a, b in ((0, n), (1, n), (n // 3, n - n // 4)):  # slices: an offset into the buffers
            part = with_nulls.slice(a, max(0, b - a))
            assert numbers_to_numpy(part, null=-9).tolist() == [-9 if v is None else v for v in part.to_pylist()]
            assert bools_to_numpy(part.is_valid()).tolist() == [v is not None for v in part.to_pylist()]
            flags = pa.array([None if x is None else x > 0 for x in part.to_pylist()], pa.bool_())
            assert bools_to_numpy(flags).tolist() == [bool(x) for x in flags.to_pylist()]
    with pytest.raises(TypeError, match="numbers or booleans"):
        from_numpy(np.array(["a"]))
    with pytest.raises(TypeError, match="boolean"):
        bools_to_numpy(pa.array([1]))
