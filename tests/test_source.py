"""A tokenizer file's facts are kept beside the verdicts, so a later process loads the tokenizer only if it encodes with it."""

from __future__ import annotations

import gc
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers

from arrowstream import read_parquet
from arrowstream.errors import ConfigError, EncoderFallbackWarning
from arrowstream.testing import assert_resumes_identically
from arrowstream.testing.data import make_texts, sample_tokenizer
from arrowstream.tokenize import Tokenize, source
from arrowstream.tokenize.encoders import Encoder
from arrowstream.tokenize.source import TokenizerFacts, TokenizerSource

from .conftest import forked_while_held, run_processes, write_parts


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count the tokenizer files parsed (they still are)."""
    seen: list[str] = []
    real = source._parse

    def counted(path: str, data: bytes, **kw: str) -> Tokenizer:
        seen.append(path)
        return real(path, data, **kw)

    monkeypatch.setattr(source, "_parse", counted)
    return seen


def saved(tok: Tokenizer, where: Path, name: str = "tokenizer.json") -> Path:
    where.mkdir(parents=True, exist_ok=True)
    tok.save(str(where / name))
    return where / name


def gapped() -> Tokenizer:
    """A tokenizer whose ids have a gap: 3 entries, largest id 5."""
    tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 5}, unk_token="[UNK]"))
    tok.add_special_tokens(["</s>"])
    return tok


def with_padding() -> Tokenizer:
    tok = sample_tokenizer(300)
    tok.enable_padding(length=16)
    return tok


def with_truncation() -> Tokenizer:
    tok = sample_tokenizer(300)
    tok.enable_truncation(max_length=12)
    return tok


def many_specials() -> Tokenizer:
    tok = sample_tokenizer(300)
    tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(40)])
    tok.add_tokens(["not-special"])
    return tok


TOKENIZERS = {
    "bpe": lambda: sample_tokenizer(300),
    "gapped": gapped,
    "padding": with_padding,
    "truncation": with_truncation,
    "specials": many_specials,
}


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_the_kept_facts_are_the_loaded_tokenizers_and_a_later_source_does_not_load_it(
    kind: str, tmp_path: Path, parses: list[str]
) -> None:
    tok = TOKENIZERS[kind]()
    path = saved(tok, tmp_path / "tok")
    first = TokenizerSource.of(path, tmp_path / "cache")
    assert first.loaded and parses == [str(path)]
    assert first.facts == TokenizerFacts.of(tok)
    assert len(list((tmp_path / "cache").glob("*.facts"))) == 1
    source._forget_sources()  # as a new process starts
    later = TokenizerSource.of(path, tmp_path / "cache")
    assert not later.loaded and parses == [str(path)], "a later source parsed the tokenizer file"
    assert later.facts == first.facts and later.facts.specials == first.facts.specials
    assert later.get().to_str() == tok.to_str() and later.loaded


@pytest.mark.parametrize(("kind", "message"), [("padding", "padding enabled"), ("truncation", "truncates to 12 tokens")])
def test_a_refused_setting_is_refused_from_the_kept_facts_too(
    kind: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    path = saved(TOKENIZERS[kind](), tmp_path / "tok")
    for _ in range(2):  # the first process reads the tokenizer, the second its kept facts
        source._forget_sources()
        with pytest.raises(ConfigError, match=message):
            Tokenize(str(path))
    assert len(list((tmp_path / "cache").glob("encoders/*.facts"))) == 1


def test_an_eos_id_past_the_entries_is_checked_against_the_largest_id_by_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parses: list[str]
) -> None:
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    path = saved(gapped(), tmp_path / "tok")
    Tokenize(str(path), eos_id=0)
    source._forget_sources()
    parses.clear()
    # `backend="tokenizers"`: the reference encodes (a WordLevel tokenizer has no faster backend), and
    # only when a text comes
    stage = Tokenize(str(path), backend="tokenizers")  # `</s>` is found among the kept special tokens
    assert stage.eos_id == gapped().token_to_id("</s>") and parses == []
    assert Tokenize(str(path), eos_id=5, backend="tokenizers").eos_id == 5  # past the 3 entries: the file is read to know
    assert parses == [str(path)]
    with pytest.raises(ConfigError, match="past the tokenizer's largest id, 5"):
        Tokenize(str(path), eos_id=6, backend="tokenizers")


def test_no_eos_is_reported_with_the_kept_special_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.add_special_tokens(["<|stop|>"])
    path = saved(tok, tmp_path / "tok")
    for _ in range(2):
        source._forget_sources()
        with pytest.raises(ConfigError, match=r"none was found among the tokenizer's special tokens \['<\|stop\|>'\]"):
            Tokenize(str(path))


def other_facts(tmp_path: Path) -> dict:
    """A whole facts record, but another tokenizer's."""
    other = many_specials()
    TokenizerSource.of(saved(other, tmp_path / "other"), tmp_path / "other-cache")
    (kept,) = (tmp_path / "other-cache").glob("*.facts")
    return json.loads(kept.read_text())


DAMAGE = {
    "garbage": lambda record, tmp: "{not json",
    "empty": lambda record, tmp: "",
    "another key": lambda record, tmp: json.dumps(other_facts(tmp)),
    "another format": lambda record, tmp: json.dumps({**record, "format": 0}),
    "hash not a string": lambda record, tmp: json.dumps({**record, "facts": {**record["facts"], "hash": 7}}),
    "short hash": lambda record, tmp: json.dumps({**record, "facts": {**record["facts"], "hash": "ab"}}),
    "field missing": lambda record, tmp: json.dumps({**record, "facts": {k: v for k, v in record["facts"].items() if k != "size"}}),
    "field added": lambda record, tmp: json.dumps({**record, "facts": {**record["facts"], "top": 3}}),
    "special id a bool": lambda record, tmp: json.dumps({**record, "facts": {**record["facts"], "specials": {"<|endoftext|>": True}}}),
    "size a float": lambda record, tmp: json.dumps({**record, "facts": {**record["facts"], "size": 300.0}}),
    "padding a string": lambda record, tmp: json.dumps({**record, "facts": {**record["facts"], "padding": "no"}}),
    "facts a list": lambda record, tmp: json.dumps({**record, "facts": [1, 2]}),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_facts_are_never_used_the_file_is_read_and_they_are_kept_again(
    damage: str, tmp_path: Path, parses: list[str]
) -> None:
    tok = sample_tokenizer(300)
    path = saved(tok, tmp_path / "tok")
    TokenizerSource.of(path, tmp_path / "cache")
    (kept,) = (tmp_path / "cache").glob("*.facts")
    record = json.loads(kept.read_text())
    kept.write_text(DAMAGE[damage](record, tmp_path))
    source._forget_sources()
    parses.clear()
    again = TokenizerSource.of(path, tmp_path / "cache")
    assert again.loaded and parses == [str(path)], "damaged facts were used"
    assert again.facts == TokenizerFacts.of(tok)
    assert json.loads(kept.read_text()) == record  # kept again, whole
    source._forget_sources()
    assert not TokenizerSource.of(path, tmp_path / "cache").loaded


def test_a_file_changed_after_the_pipeline_was_built_is_refused_not_used(tmp_path: Path) -> None:
    path = saved(sample_tokenizer(300), tmp_path / "tok")
    TokenizerSource.of(path, tmp_path / "cache")
    source._forget_sources()
    enc = Encoder(str(path), backend="tokenizers", cache_dir=tmp_path / "cache")
    assert not enc.source.loaded
    changed = sample_tokenizer(300)
    changed.add_special_tokens(["<|new|>"])
    changed.save(str(path))
    with pytest.raises(ConfigError, match=rf"tokenizer file '{path}' changed after this pipeline was built"):
        enc.encode(["a b c"])
    source._forget_sources()
    fresh = Encoder(str(path), backend="tokenizers", cache_dir=tmp_path / "cache")  # built anew: the new file
    assert fresh.hash != enc.hash and fresh.encode(["<|new|>"])[0].tolist() == [changed.token_to_id("<|new|>")]


def test_a_pickled_file_source_carries_no_tokenizer_and_loads_the_same_one(tmp_path: Path) -> None:
    tok = many_specials()
    path = saved(tok, tmp_path / "tok")
    loaded = TokenizerSource.of(path, tmp_path / "cache")
    assert loaded.loaded
    data = pickle.dumps(loaded)
    assert len(data) < 4_000 < len(tok.to_str()), "the pickled source carries the tokenizer"
    back = pickle.loads(data)
    assert not back.loaded and back.facts == loaded.facts
    assert back.get().to_str() == tok.to_str()
    given = TokenizerSource.of(tok, None)  # an object has no file to load again: it travels with its source
    assert pickle.loads(pickle.dumps(given)).get().to_str() == tok.to_str()


def test_without_a_cache_the_tokenizer_is_loaded_and_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", "off")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = saved(sample_tokenizer(300), tmp_path / "tok")
    stage = Tokenize(str(path))
    assert stage.source.loaded
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["tok", "tokenizer.json"]


def test_a_cache_that_cannot_be_written_costs_time_not_the_run(tmp_path: Path) -> None:
    path = saved(sample_tokenizer(300), tmp_path / "tok")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for _ in range(2):
        source._forget_sources()
        got = TokenizerSource.of(path, blocked / "cache")
        assert got.loaded and got.facts == TokenizerFacts.of(sample_tokenizer(300))


def _load_in_child(path: str, where: str, out: object) -> None:
    got = TokenizerSource.of(path, Path(where))
    out.send(got.get().encode("forked child").ids)  # type: ignore[attr-defined]


def test_a_process_forked_while_the_lock_is_held_loads_without_waiting(tmp_path: Path) -> None:
    tok = sample_tokenizer(300)  # another thread of the parent is loading a tokenizer as the worker forks
    path = saved(tok, tmp_path / "tok")
    got = forked_while_held(source, _load_in_child, str(path), str(tmp_path / "cache"))
    assert got == tok.encode("forked child").ids


def test_a_pipeline_on_a_file_whose_facts_are_kept_resumes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    path = saved(sample_tokenizer(300), tmp_path / "tok")
    write_parts(tmp_path / "data", [{"text": make_texts(9, seed=8)}, {"text": make_texts(6, seed=9)}], row_group_size=4)

    def build():  # every resume builds anew, as a restarted process whose source has not loaded the tokenizer
        source._forget_sources()
        enc = Encoder(str(path), sample_bytes=2000)  # a sample the first run completes: later ones trust the verdict
        return read_parquet(tmp_path / "data", num_epochs=2).shuffle(seed=3, window=2).tokenize(enc).pack(seq_len=128, batch_size=2)

    list(build())  # the first process: proves the encoder
    ds = build()
    list(ds)
    assert not next(s for s in ds.stages if isinstance(s, Tokenize)).source.loaded
    assert assert_resumes_identically(build, every=3, horizon=20, min_epochs=2) > 10


def test_real_processes_read_the_tokenizer_file_only_in_the_first(tmp_path: Path) -> None:
    tok = sample_tokenizer(300)
    tok.add_special_tokens(["<|real-processes|>"])  # its own hash: no other test proved it
    path = saved(tok, tmp_path / "tok")
    write_parts(tmp_path / "data", [{"text": make_texts(200, seed=5)}], row_group_size=50)
    script = (
        "import json, sys\n"
        "from arrowstream import read_parquet\n"
        "from arrowstream.tokenize import Tokenize, source\n"
        "from arrowstream.tokenize.encoders import Encoder\n"
        "parses, parse = [], source._parse\n"
        "source._parse = lambda *a, **k: parses.append(1) or parse(*a, **k)\n"
        "enc = Encoder(sys.argv[1], sample_bytes=2000)  # a sample the data completes: the first process proves the encoder\n"
        "ds = read_parquet(sys.argv[2]).tokenize(enc).pack(seq_len=64, batch_size=4)\n"
        "rows = [b['input_ids'].tolist() for b in ds]\n"
        "stage = next(s for s in ds.stages if isinstance(s, Tokenize))\n"
        "print(json.dumps({'parses': len(parses), 'loaded': stage.source.loaded, 'backend': stage.backend, 'rows': rows}))\n"
    )
    runs = run_processes(script, [path, tmp_path / "data"], cache=tmp_path / "cache", times=3)
    assert [r["parses"] for r in runs] == [1, 0, 0]
    assert [r["loaded"] for r in runs] == [False, False, False]  # the first let it go once the encoder was proven
    assert runs[1]["backend"] in ("tokie", "tiktoken")
    assert runs[0]["rows"] == runs[1]["rows"] == runs[2]["rows"]


def test_encoders_sharing_a_file_let_it_go_once_the_last_is_proven(tmp_path: Path, parses: list[str]) -> None:
    tok = sample_tokenizer(300)
    tok.add_special_tokens(["<|let-go|>"])  # its own hash: no other test proved it
    path = saved(tok, tmp_path / "tok")
    cache = tmp_path / "cache"
    first, second = (Encoder(str(path), sample_bytes=2000, cache_dir=cache) for _ in range(2))
    plain = Encoder(str(path), backend="tokenizers", cache_dir=cache)
    assert first.source is second.source is plain.source and first.source.loaded
    texts = make_texts(40, seed=8)
    expected = plain.encode(texts)
    assert first._sample_left and second._sample_left
    for enc in (first, second):
        got = enc.encode(texts)  # past its sample: proven
        assert not enc._sample_left and enc.backend in ("tokie", "tiktoken")
        assert all(np.array_equal(a, b) for a, b in zip(got, expected))
        assert first.source.loaded  # the `tokenizers` encoder still holds it
    del plain
    gc.collect()
    third = Encoder(str(path), sample_bytes=2000, cache_dir=cache)  # proven at once: no live holder is left
    assert not third.source.loaded
    assert all(np.array_equal(a, b) for a, b in zip(third.encode(texts), expected))
    assert parses == [str(path)]
    assert third.source.get().token_to_id("<|let-go|>") is not None and len(parses) == 2  # loaded again when asked


def test_an_encoder_on_its_own_lets_the_file_go_when_proven_and_keeps_it_when_it_falls_back(
    tmp_path: Path, parses: list[str]
) -> None:
    tok = sample_tokenizer(300)
    tok.add_special_tokens(["<|let-go-alone|>"])
    enc = Encoder(str(saved(tok, tmp_path / "tok")), sample_bytes=2000, cache_dir=tmp_path / "cache")
    assert enc.source.loaded
    enc.encode(make_texts(40, seed=9))
    assert not enc._sample_left and not enc.source.loaded
    tok.normalizer = normalizers.Lowercase()  # not convertible: `tokenizers` encodes, and keeps it
    fallback = saved(tok, tmp_path / "tok2")
    with pytest.warns(EncoderFallbackWarning):
        kept = Encoder(str(fallback), sample_bytes=2000, cache_dir=tmp_path / "cache")
    kept.encode(make_texts(40, seed=9))
    kept.encode(make_texts(40, seed=10))
    assert kept.backend == "tokenizers" and kept.source.loaded
    assert parses.count(str(fallback)) == 1  # never unloaded, so never parsed again
