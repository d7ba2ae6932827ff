"""A tokenizer's compiled forms (tokie's binary, the tiktoken conversion) are kept beside the verdicts, checked, and loaded by later processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from arrowstream.testing.data import make_texts, sample_tokenizer
from arrowstream.tokenize import compiled, fast, tokie_backend
from arrowstream.tokenize.bytelevel import to_bytelevel_bpe
from arrowstream.tokenize.encoders import Encoder
from arrowstream.tokenize.probes import probe_texts

from .conftest import forked_while_held, run_processes, write_parts

tokie = pytest.importorskip("tokie")
pytestmark = pytest.mark.tokie

TEXTS = [*make_texts(40, seed=4), "it's 1234 tokens\t's", "<|endoftext|> after", ""]


def fresh_tokenizer(tag: str) -> Tokenizer:
    tok = sample_tokenizer(300)
    tok.add_special_tokens([f"<|{tag}|>"])  # its own hash: no other test kept it
    return tok


def ids(built: object, texts: list[str]) -> list[int]:
    flat, lens = built.encode_batch_flat(texts, True)  # type: ignore[attr-defined]
    return np.asarray(flat).tolist() + np.asarray(lens).tolist()


def no_json_build(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make building from the JSON count its calls (it still builds)."""
    calls: list[int] = []
    real = compiled._from_json

    def counted(tokenizer: Tokenizer) -> object:
        calls.append(1)
        return real(tokenizer)

    monkeypatch.setattr(compiled, "_from_json", counted)
    return calls


def test_a_later_load_comes_from_the_kept_file_with_the_same_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = fresh_tokenizer("kept")
    calls = no_json_build(monkeypatch)
    first = compiled.load_tokie(tok, "k1", tmp_path)
    assert calls == [1] and list(tmp_path.iterdir()) == [], "loading wrote before tokie was proven"
    compiled.keep_tokie(first, "k1", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k1.tkz", "k1.tkz.meta"]
    again = compiled.load_tokie(tok, "k1", tmp_path)
    assert calls == [1], "the second load built from the JSON again"
    texts = TEXTS + list(probe_texts()[:200])
    assert ids(again, texts) == ids(first, texts)
    meta = json.loads((tmp_path / "k1.tkz.meta").read_text())
    assert meta["size"] == (tmp_path / "k1.tkz").stat().st_size and meta["key"] == "k1"


def test_no_directory_keeps_nothing_and_builds_every_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = fresh_tokenizer("nodir")
    calls = no_json_build(monkeypatch)
    compiled.keep_tokie(compiled.load_tokie(tok, "k2", None), "k2", None)
    compiled.load_tokie(tok, "k2", None)
    assert calls == [1, 1]


@pytest.mark.parametrize("damage", ["cut", "flipped", "meta-other-key", "meta-garbage", "meta-missing"])
def test_a_damaged_file_is_never_used_it_is_rebuilt_and_kept_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    tok = fresh_tokenizer(f"damaged-{damage}")
    good = compiled.load_tokie(tok, "k3", tmp_path)
    compiled.keep_tokie(good, "k3", tmp_path)
    binary, meta = tmp_path / "k3.tkz", tmp_path / "k3.tkz.meta"
    data = binary.read_bytes()
    if damage == "cut":  # tokie's own loader panics on a cut file: it must never see one
        binary.write_bytes(data[: len(data) // 2])
    elif damage == "flipped":
        binary.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "meta-other-key":
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "key": "another"}))
    elif damage == "meta-garbage":
        meta.write_text("{not json")
    else:
        meta.unlink()
    calls = no_json_build(monkeypatch)
    opened: list[str] = []
    real_from_file = compiled.tokie.Tokenizer.from_file
    monkeypatch.setattr(
        compiled.tokie.Tokenizer, "from_file", staticmethod(lambda path: opened.append(path) or real_from_file(path))
    )
    again = compiled.load_tokie(tok, "k3", tmp_path)
    assert calls == [1], "a damaged file was used instead of the JSON"
    assert str(binary) not in opened, "a damaged file was handed to tokie"
    assert ids(again, TEXTS) == ids(good, TEXTS)
    compiled.keep_tokie(again, "k3", tmp_path)
    assert binary.read_bytes() == data and json.loads(meta.read_text())["key"] == "k3"  # kept anew, whole


def test_a_file_that_loads_back_with_other_ids_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tok, other = fresh_tokenizer("roundtrip"), sample_tokenizer(400)
    stranger = compiled._from_json(other)
    monkeypatch.setattr(compiled.tokie.Tokenizer, "from_file", staticmethod(lambda path: stranger))
    built = compiled.load_tokie(tok, "k4", tmp_path)
    compiled.keep_tokie(built, "k4", tmp_path)
    assert ids(built, TEXTS) != ids(stranger, TEXTS)
    assert list(tmp_path.iterdir()) == [], "a file whose round trip changed the ids was kept"


def test_keeping_hands_back_the_copy_it_loaded_back_to_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[object] = []
    real = compiled._keep_tokie
    monkeypatch.setattr(compiled, "_keep_tokie", lambda *a: events.append("keep") or real(*a))
    monkeypatch.setattr(compiled, "release_freed_memory", lambda **k: events.append(k) or True)
    built = compiled.load_tokie(fresh_tokenizer("keep-hands-back"), "k6", tmp_path)
    assert events == [{"anytime": True}]  # built from the JSON: the build's garbage handed back (test_allocator.py)
    events.clear()
    compiled.keep_tokie(built, "k6", tmp_path)
    # the copy is tens of MB at 128k tokens, freed among the stream's blocks: handed back at once, iterator or not
    assert events == ["keep", {"anytime": True}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k6.tkz", "k6.tkz.meta"]


@pytest.mark.parametrize("verify_first", [False, True])
def test_the_first_process_keeps_tokie_only_once_it_let_go_of_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verify_first: bool
) -> None:
    # the reference, tokie and the copy that keeping loads back, together, were tokie's first process's peak
    path = tmp_path / "tok.json"
    fresh_tokenizer(f"keep-after-let-go-{verify_first}").save(str(path))
    loaded_then: list[bool] = []
    real = tokie_backend.TokieBackend.keep
    monkeypatch.setattr(tokie_backend.TokieBackend, "keep", lambda self: loaded_then.append(enc.source.loaded) or real(self))
    enc = Encoder(str(path), sample_bytes=2000, cache_dir=tmp_path / "cache")
    if verify_first:
        enc.verify()  # proven before the sample ends: the reference still encodes the sample, keeping waits
        assert enc.backend == "tokie" and enc._sample_left and enc.source.loaded
    assert loaded_then == []
    enc.encode(make_texts(40, seed=11))
    assert not enc._sample_left and enc.backend == "tokie"
    assert loaded_then == [False], "tokie was kept while the reference was loaded, or never"
    assert len(list((tmp_path / "cache").glob("*.tkz"))) == 1


@pytest.mark.parametrize("kept", [True, False])
def test_the_first_process_drops_tiktokens_conversion_once_tokie_is_proven(tmp_path: Path, kept: bool) -> None:
    # as a later process: tiktoken's side is read back from its kept form when tokie first routes a text
    path = tmp_path / "tok.json"
    fresh_tokenizer(f"drop-conversion-{kept}").save(str(path))
    enc = Encoder(str(path), sample_bytes=2000, cache_dir=tmp_path / "cache" if kept else None)
    enc.encode(make_texts(40, seed=12))
    assert not enc._sample_left and enc.backend == "tokie"
    # without a kept form the conversion would be made again from the JSON: it stays
    assert (enc._fast.converted is None) is kept and (enc._key() in fast._converted) is not kept
    routed = ["x\t's and\t'em", "plain", "\x0c'd"]
    want = [e.ids for e in Tokenizer.from_file(str(path)).encode_batch(routed)]
    flat, lens = enc.encode(routed)
    assert [a.tolist() for a in np.split(flat, np.cumsum(lens)[:-1])] == want
    assert enc._fast.converted is not None


def test_a_directory_that_cannot_be_made_costs_time_not_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the directory would go")
    built = compiled.load_tokie(fresh_tokenizer("unwritable"), "k5", blocker / "encoders")
    compiled.keep_tokie(built, "k5", blocker / "encoders")
    assert ids(built, ["plain"]) and blocker.read_text().startswith("a file")


def test_an_encoder_in_a_new_process_takes_tokie_from_the_kept_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = fresh_tokenizer("encoder")
    first = Encoder(tok, cache_dir=tmp_path, sample_bytes=0)
    assert first.backend == "tokie", first.reason
    assert len(list(tmp_path.glob("*.tkz"))) == 1
    monkeypatch.setattr(tokie_backend, "_loaded", {})  # as a new process starts
    calls = no_json_build(monkeypatch)
    second = Encoder(tok, cache_dir=tmp_path, sample_bytes=0)
    assert second.backend == "tokie" and calls == []
    assert [a.tolist() for a in second.encode(TEXTS)] == [a.tolist() for a in first.encode(TEXTS)]


def test_real_processes_build_tokie_once(tmp_path: Path) -> None:
    tok = fresh_tokenizer("real-processes")
    tok.save(str(tmp_path / "tok.json"))
    write_parts(tmp_path / "data", [{"text": make_texts(200, seed=5)}], row_group_size=50)
    script = (
        "import json, sys\n"
        "from arrowstream import read_parquet\n"
        "from arrowstream.tokenize import compiled\n"
        "built = []\n"
        "real = compiled._from_json\n"
        "compiled._from_json = lambda tok: built.append(1) or real(tok)\n"
        "from arrowstream.tokenize.encoders import Encoder\n"
        "enc = Encoder(sys.argv[1], sample_bytes=2000)  # a sample the data completes: the first process proves tokie\n"
        "ds = read_parquet(sys.argv[2]).tokenize(enc).pack(seq_len=64, batch_size=4)\n"
        "rows = [b['input_ids'].tolist() for b in ds]\n"
        "print(json.dumps({'built': len(built), 'rows': rows}))\n"
    )
    runs = run_processes(script, [tmp_path / "tok.json", tmp_path / "data"], cache=tmp_path / "cache", times=3)
    assert [r["built"] for r in runs] == [1, 0, 0]
    assert runs[0]["rows"] == runs[1]["rows"] == runs[2]["rows"]
    assert len(list((tmp_path / "cache" / "encoders").glob("*.tkz"))) == 1


def no_conversion(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make converting for tiktoken count its calls (it still converts)."""
    calls: list[int] = []
    real = compiled.to_bytelevel_bpe

    def counted(tokenizer: Tokenizer, **options: bool) -> object:
        calls.append(1)
        return real(tokenizer, **options)

    monkeypatch.setattr(compiled, "to_bytelevel_bpe", counted)
    return calls


def reordered_tokenizer() -> Tokenizer:
    """A tokenizer whose ids do not follow its merge order, so its conversion has an id map."""
    spec = json.loads(sample_tokenizer(300).to_str())
    vocab = spec["model"]["vocab"]
    order = sorted(vocab, key=lambda t: (vocab[t] == 0, -vocab[t]))  # keep id 0 (EOS), reverse the rest
    spec["model"]["vocab"] = {t: (0 if vocab[t] == 0 else i + 1) for i, t in enumerate(order[:-1])} | {order[-1]: 0}
    for added in spec["added_tokens"]:
        added["id"] = spec["model"]["vocab"][added["content"]]
    return Tokenizer.from_str(json.dumps(spec))


@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("kind", ["plain", "id-map"])
def test_a_later_conversion_comes_from_the_kept_file_equal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, add_special_tokens: bool, kind: str
) -> None:
    tok = fresh_tokenizer("conv") if kind == "plain" else reordered_tokenizer()
    reference = to_bytelevel_bpe(tok, add_special_tokens=add_special_tokens)
    assert (reference.rank_to_id is None) == (kind == "plain")
    calls = no_conversion(monkeypatch)
    compiled.load_bytelevel(tok, "c1", tmp_path, add_special_tokens=add_special_tokens)
    again = compiled.load_bytelevel(tok, "c1", tmp_path, add_special_tokens=add_special_tokens)
    assert calls == [1], "the second load converted again"
    assert compiled._same(again, reference) and list(again.ranks) == list(reference.ranks)
    if kind == "id-map":
        assert again.rank_to_id.dtype == reference.rank_to_id.dtype
        assert again.rank_to_id.tolist() == reference.rank_to_id.tolist()


@pytest.mark.parametrize("damage", ["cut", "flipped", "meta-garbage"])
def test_a_damaged_conversion_is_never_read_it_is_converted_and_kept_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    tok = fresh_tokenizer("conv-damaged")
    good = compiled.load_bytelevel(tok, "c2", tmp_path, add_special_tokens=True)
    path = tmp_path / "c2.bpe.npz"
    data = path.read_bytes()
    if damage == "cut":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flipped":
        path.write_bytes(data[:-200] + bytes([data[-200] ^ 0x01]) + data[-199:])
    else:
        (tmp_path / "c2.bpe.npz.meta").write_text("[1, 2")
    calls = no_conversion(monkeypatch)
    again = compiled.load_bytelevel(tok, "c2", tmp_path, add_special_tokens=True)
    assert calls == [1], "a damaged conversion was read instead of converting"
    assert compiled._same(again, good) and path.read_bytes() == data


def test_a_conversion_that_reads_back_different_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = compiled._bytelevel_from
    monkeypatch.setattr(compiled, "_bytelevel_from", lambda data, fields: real(data, {**fields, "dropped": 99}))
    spec = compiled.load_bytelevel(fresh_tokenizer("conv-differs"), "c3", tmp_path, add_special_tokens=True)
    assert list(tmp_path.iterdir()) == []
    assert spec.dropped != 99  # the conversion itself is used, not what read back different


@pytest.mark.parametrize("keep", [True, False])
def test_a_fresh_conversion_is_used_as_read_back_from_its_compact_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: bool
) -> None:
    # the conversion's own objects sit among its garbage in the heap (25 MB more resident at 128k tokens)
    made, events = [], []
    real = compiled.to_bytelevel_bpe
    monkeypatch.setattr(compiled, "to_bytelevel_bpe", lambda *a, **k: events.append("convert") or made.append(real(*a, **k)) or made[-1])
    monkeypatch.setattr(compiled, "release_freed_memory", lambda **k: events.append(k) or True)
    spec = compiled.load_bytelevel(fresh_tokenizer("conv-compact"), "c4", tmp_path if keep else None, add_special_tokens=True)
    assert len(made) == 1 and compiled._same(spec, made[0])
    assert spec is not made[0] and spec.ranks is not made[0].ranks
    # handed back before the conversion (what the stream freed: 95 MB in tokie's first process at 128k) and after
    # it (its own garbage), iterator or not
    assert events == [{"anytime": True}, "convert", {"anytime": True}]


def test_a_refused_conversion_keeps_nothing_and_is_refused_again(tmp_path: Path) -> None:
    from tokenizers import models

    from arrowstream.tokenize.bytelevel import Unconvertible

    word = Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))
    for _ in range(2):
        with pytest.raises(Unconvertible, match="WordLevel"):
            compiled.load_bytelevel(word, "c4", tmp_path, add_special_tokens=True)
    assert list(tmp_path.iterdir()) == []


def test_an_encoder_without_tokie_in_a_new_process_reads_the_kept_conversion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arrowstream.tokenize import fast

    tok = fresh_tokenizer("conv-encoder")
    first = Encoder(tok, backend="tiktoken", cache_dir=tmp_path, sample_bytes=0)
    assert first.backend == "tiktoken" and len(list(tmp_path.glob("*.bpe.npz"))) == 1
    monkeypatch.setattr(fast, "_converted", {})  # as a new process starts
    calls = no_conversion(monkeypatch)
    second = Encoder(tok, backend="tiktoken", cache_dir=tmp_path, sample_bytes=0)
    assert second.backend == "tiktoken" and calls == []
    assert [a.tolist() for a in second.encode(TEXTS)] == [a.tolist() for a in first.encode(TEXTS)]


def test_storage_that_refuses_the_write_costs_time_not_the_run(tmp_path: Path) -> None:
    """A real file-size limit (EFBIG, as a full disk fails a write): nothing kept, no temporary file left, same ids."""
    script = (
        "import json, resource, signal, sys\n"
        "from pathlib import Path\n"
        "from arrowstream.testing.data import sample_tokenizer\n"
        "from arrowstream.tokenize import compiled\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # the limit then fails the write (EFBIG)\n"
        "tok, where = sample_tokenizer(300), Path(sys.argv[1])\n"
        "want = compiled._from_json(tok).encode_batch_flat(['plain words here', 'x\\ty'], True)[0].tolist()\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))   # smaller than either compiled form\n"
        "built = compiled.load_tokie(tok, 'limited', where)\n"
        "compiled.keep_tokie(built, 'limited', where)\n"
        "got = built.encode_batch_flat(['plain words here', 'x\\ty'], True)[0].tolist()\n"
        "spec = compiled.load_bytelevel(tok, 'limited', where, add_special_tokens=True)\n"
        "print(json.dumps({'same': got == want, 'ranks': len(spec.ranks), 'left': sorted(p.name for p in where.iterdir())}))\n"
    )
    (tmp_path / "cache").mkdir()
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "cache")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result == {"same": True, "ranks": len(to_bytelevel_bpe(sample_tokenizer(300)).ranks), "left": []}


def test_processes_starting_together_on_an_empty_directory_keep_one_whole_pair(tmp_path: Path) -> None:
    tok = fresh_tokenizer("together")
    tok.save(str(tmp_path / "tok.json"))
    script = (
        "import json, sys\n"
        "from tokenizers import Tokenizer\n"
        "from pathlib import Path\n"
        "from arrowstream.tokenize import compiled\n"
        "built = []\n"
        "real = compiled._from_json\n"
        "compiled._from_json = lambda tok: built.append(1) or real(tok)\n"
        "tok = Tokenizer.from_file(sys.argv[1])\n"
        "enc = compiled.load_tokie(tok, 'together', Path(sys.argv[2]))\n"
        "compiled.keep_tokie(enc, 'together', Path(sys.argv[2]))\n"
        "ids = enc.encode_batch_flat(sys.argv[3:], True)[0].tolist()\n"
        "print(json.dumps({'built': len(built), 'ids': ids}))\n"
    )
    texts = TEXTS[:20]
    cmd = [sys.executable, "-c", script, str(tmp_path / "tok.json"), str(tmp_path / "cache"), *texts]
    together = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    runs = []
    for proc in together:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        runs.append(json.loads(out))
    later = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout)
    assert later["built"] == 0, "no whole pair was left by the processes that raced"
    assert all(r["ids"] == later["ids"] for r in runs) and later["ids"] == ids(compiled._from_json(tok), texts)[: len(later["ids"])]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["together.tkz", "together.tkz.meta"]


def test_a_tokenizer_tokie_fails_gets_no_kept_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokie_backend, "ROUTED_PAIRS", ())  # no routing: tokie differs on "\t's" among the probes
    enc = Encoder(fresh_tokenizer("tokie-fails"), cache_dir=tmp_path, sample_bytes=0)
    assert enc.backend == "tiktoken" and "tokie not used" in enc.reason
    assert list(tmp_path.glob("*.tkz*")) == [], "a binary was kept for a tokenizer tokie failed"
    assert len(list(tmp_path.glob("*.bpe.npz"))) == 1  # the conversion tiktoken encodes with is kept


def _load_in_child(tok_json: str, where: str, out: object) -> None:
    tok = Tokenizer.from_str(tok_json)
    built = compiled.load_tokie(tok, "forked", Path(where))
    out.send(ids(built, ["forked child"]))  # type: ignore[attr-defined]


def test_a_process_forked_while_the_lock_is_held_loads_without_waiting(tmp_path: Path) -> None:
    tok = fresh_tokenizer("forked")  # another thread of the parent is inside load_tokie as the worker forks
    got = forked_while_held(compiled, _load_in_child, tok.to_str(), str(tmp_path))
    assert got == ids(compiled._from_json(tok), ["forked child"])
