"""The tiktoken backend gives exactly the ids of `tokenizers`, or is not used."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import unicodedata
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from arrowstream import ConfigError, read_parquet
from arrowstream.errors import EncoderFallbackWarning
from arrowstream.testing import assert_resumes_identically
from arrowstream.testing.data import make_texts, train_tokenizer, write_dataset
from arrowstream.tokenize import Tokenize
from arrowstream.tokenize import fast as fast_module
from arrowstream.tokenize import verdicts as verdicts_module
from arrowstream.tokenize.bytelevel import GPT2_PATTERN, byte_symbols, to_bytelevel_bpe
from arrowstream.tokenize.encoders import Encoder, load_tokenizer, probe_texts

from .conftest import EncodedBy, write_parts

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
WORDS = [
    "the", "river", "Straße", "naïve", "Köln", "мягких", "булок", "ψυχοφθόρα", "مرحبا", "שלום", "नमस्ते",
    "中文", "日本語", "한국어", "ภาษาไทย", "😀", "👍🏽", "e\u0301", "x²", "½", "don't", "I'LL", "3.14", "2024",
    "12345678", "!!!", "...", "--", "\t", "\n", "\r\n", "  ", "\u3000", "\xa0",
]


def mixed_texts(n: int, seed: int) -> list[str]:
    """English-like text with many scripts, digits, punctuation and whitespace mixed in."""
    rng = np.random.default_rng(seed)
    english = make_texts(n, seed=seed, mean_log_words=3.0)
    out = []
    for text in english:
        words = text.split(" ")
        for _ in range(int(rng.integers(0, 8))):
            words.insert(int(rng.integers(0, len(words) + 1)), WORDS[int(rng.integers(0, len(WORDS)))])
        out.append(" ".join(words))
    return out


def train(texts: list[str], vocab_size: int, *, llama: bool = False) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    if llama:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if llama:
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single="<|begin_of_text|> $A",
                    pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                    special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))],
                ),
            ]
        )
    return tok


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return mixed_texts(1500, seed=11)


@pytest.fixture(scope="module")
def tok_small(corpus: list[str]) -> Tokenizer:
    return train(corpus[:500], 400)


@pytest.fixture(scope="module")
def tok_large(corpus: list[str]) -> Tokenizer:
    return train(corpus, 3000)


@pytest.fixture(scope="module")
def tok_llama(corpus: list[str]) -> Tokenizer:
    return train(corpus, 1500, llama=True)


def hand_made(merges: list[tuple[str, str]], *, ignore_merges: bool) -> Tokenizer:
    """A byte-level BPE with exactly these merges (ids in merge order after the 256 bytes)."""
    vocab = {"<|endoftext|>": 0}
    for sym in byte_symbols().values():
        vocab[sym] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def reference(tok: Tokenizer, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=add_special_tokens)]


def fast(enc: Encoder, texts: list[str]) -> list[list[int]]:
    # past the document sample, or `encode` would return `tokenizers`' ids
    assert enc.backend == "tiktoken" and enc.describe()["sample_bytes_left"] == 0
    flat, lens = enc.encode(texts)
    return [a.tolist() for a in np.split(flat, np.cumsum(lens)[:-1])] if len(texts) else []


def cases(specials: list[str]) -> dict[str, list[str]]:
    categories: dict[str, list[str]] = {}
    for c in range(0x30000):
        if not 0xD800 <= c < 0xE000:
            categories.setdefault(unicodedata.category(chr(c)), []).append(chr(c))
    every_category = ["".join(chars[:: max(1, len(chars) // 40)]) for chars in categories.values()]
    every_byte = [chr(c) for c in range(128)] + [
        bytes([lead, cont] + [0x80] * extra).decode("utf-8", "ignore")
        for lead, extra in [(0xC2, 0), (0xDF, 0), (0xE1, 1), (0xEF, 1), (0xF0, 2), (0xF4, 2)]
        for cont in range(0x90 if lead == 0xF0 else 0x80, 0x90 if lead == 0xF4 else 0xC0)
    ]
    assert {b for t in every_byte for b in t.encode()} == set(range(0x80)) | set(range(0x80, 0xC0)) | {
        0xC2, 0xDF, 0xE1, 0xEF, 0xF0, 0xF4
    }
    return {
        "english": make_texts(300, seed=5),
        "categories": every_category + [" ".join(every_category)],
        "bytes": every_byte + ["".join(every_byte), " ".join(every_byte)],
        "whitespace": [
            ws * n + tail for ws in (" ", "\n", "\t", "\r\n", " \n", "\u3000", "\xa0") for n in (1, 2, 5, 40, 3000)
            for tail in ("", "x", " y", "1")
        ],
        "digits": ["1234567890" * n for n in (1, 3, 100)] + ["a" + "7" * 999 + "b", "1 2 33 444 5555 66666"],
        "specials": [s for sp in specials for s in (sp, f"a{sp}b", sp * 3, f" {sp} ", sp[:-1], f"x{sp}\n{sp}y")],
        "empty": ["", "", " ", ""],
        # U+FDD0 joins a batch's texts for tiktoken: a text holding it must not be cut there
        "separator": ["a\ufdd0b", "\ufdd0", "", "x \ufdd0\ufdd0 y", "plain"],
    }


@pytest.mark.parametrize("name", ["tok_small", "tok_large", "tok_llama"])
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_tiktoken_gives_the_ids_of_tokenizers(
    name: str, add_special_tokens: bool, corpus: list[str], request: pytest.FixtureRequest
) -> None:
    tok = request.getfixturevalue(name)
    enc = Encoder(tok, add_special_tokens=add_special_tokens, sample_bytes=0)
    assert enc.backend == "tiktoken", enc.reason
    specials = ["<|endoftext|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>"]
    for kind, texts in {"corpus": corpus, **cases(specials)}.items():
        want = reference(tok, texts, add_special_tokens=add_special_tokens)
        assert fast(enc, texts) == want, kind
    if name == "tok_llama" and add_special_tokens:
        assert fast(enc, [""]) == [[tok.token_to_id("<|begin_of_text|>")]]  # the BOS, as tokenizers adds it


def test_the_two_trained_tokenizers_differ_and_take_the_expected_shapes(
    tok_small: Tokenizer, tok_large: Tokenizer, tok_llama: Tokenizer
) -> None:
    assert tok_small.get_vocab_size() == 400 and tok_large.get_vocab_size() == 3000
    assert to_bytelevel_bpe(tok_small).pattern == GPT2_PATTERN
    llama = to_bytelevel_bpe(tok_llama)
    assert llama.pattern == LLAMA3_PATTERN and llama.prefix == (tok_llama.token_to_id("<|begin_of_text|>"),)
    assert to_bytelevel_bpe(tok_llama, add_special_tokens=False).prefix == ()


def test_ids_out_of_merge_order_are_mapped_back(tok_large: Tokenizer, corpus: list[str]) -> None:
    spec = json.loads(tok_large.to_str())
    vocab = spec["model"]["vocab"]
    merged = sorted((i for s, i in vocab.items() if i >= 256 + 4), reverse=True)
    order = {old: new for old, new in zip(sorted(merged), merged)}  # reverse the merged tokens' ids
    spec["model"]["vocab"] = {s: order.get(i, i) for s, i in vocab.items()}
    tok = Tokenizer.from_str(json.dumps(spec))
    assert to_bytelevel_bpe(tok).rank_to_id is not None
    enc = Encoder(tok, sample_bytes=0)
    texts = corpus[:300] + cases(["<|endoftext|>"])["specials"]
    assert fast(enc, texts) == reference(tok, texts)


def test_ignore_merges_is_converted(tok_small: Tokenizer, corpus: list[str]) -> None:
    spec = json.loads(tok_small.to_str())
    spec["model"]["ignore_merges"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    enc = Encoder(tok, sample_bytes=0)
    assert fast(enc, corpus[:300]) == reference(tok, corpus[:300])


def test_very_long_whitespace_runs_go_to_tokenizers_and_keep_their_ids(
    tok_small: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    enc = Encoder(tok_small, sample_bytes=0)
    texts = ["a" + " " * 200_000 + "b", "word " * 10, "\n" * 140_000]
    assert fast(enc, texts) == reference(tok_small, texts)
    # past the check, tiktoken's regex engine panics on a run of a million: the text goes to tokenizers
    monkeypatch.setattr(fast_module, "_LONG_RUN", 10**9)
    texts = ["x", " " * 1_000_000 + "y", "z"]
    assert fast(enc, texts) == reference(tok_small, texts)


def test_auto_refuses_a_normalizer_with_a_warning_and_keeps_the_ids(tok_small: Tokenizer) -> None:
    tok = Tokenizer.from_str(tok_small.to_str())
    tok.normalizer = normalizers.NFKC()
    with pytest.warns(EncoderFallbackWarning, match="`NFKC` normalizer"):
        enc = Encoder(tok)
    assert enc.backend == "tokenizers" and "normalizer" in enc.reason
    texts = ["ﬁne ½ Ⅻ", "plain"]
    flat, _ = enc.encode(texts)
    assert flat.tolist() == [i for ids in reference(tok, texts) for i in ids]
    with pytest.raises(ConfigError, match="normalizer"):
        Encoder(tok, backend="tiktoken")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)), "add_prefix_space"),
        (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Sequence([pre_tokenizers.Digits(), pre_tokenizers.ByteLevel()])), "pre-tokenizer"),
        (lambda t: setattr(t.model, "dropout", 0.1), "dropout"),
        (lambda t: setattr(t, "post_processor", processors.BertProcessing(("</s>", 0), ("<s>", 0))), None),
    ],
)
def test_byte_level_settings_tiktoken_cannot_reproduce_are_refused(tok_small: Tokenizer, change, match: str | None) -> None:
    tok = Tokenizer.from_str(tok_small.to_str())
    change(tok)
    if match is None:  # a post-processor that adds tokens is reproduced
        enc = Encoder(tok, sample_bytes=0)
        assert fast(enc, ["a b", ""]) == reference(tok, ["a b", ""])
        return
    with pytest.warns(EncoderFallbackWarning, match=match):
        assert Encoder(tok).backend == "tokenizers"


def test_other_kinds_of_tokenizer_keep_tokenizers_quietly() -> None:
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], unk_id=0))
    sentencepiece_bpe = Tokenizer(models.BPE({"▁a": 0, "<unk>": 1}, [], unk_token="<unk>", byte_fallback=True))
    sentencepiece_bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    for tok in (wordpiece, unigram, sentencepiece_bpe):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            enc = Encoder(tok)
        assert enc.backend == "tokenizers" and "not" in enc.reason
        with pytest.raises(ConfigError, match="backend='tiktoken'"):
            Encoder(tok, backend="tiktoken")


def test_the_checks_hand_back_the_memory_they_and_the_sample_left(monkeypatch: pytest.MonkeyPatch) -> None:
    # The checks' threads allocate once and stop: malloc's kept pad is trimmed before and after them.
    from arrowstream.tokenize import encoders as encoders_module

    events: list[str] = []
    checks = encoders_module.check_backends
    monkeypatch.setattr(encoders_module, "release_freed_memory", lambda: events.append("release") or True)
    monkeypatch.setattr(encoders_module, "check_backends", lambda *a, **k: events.append("checks") or checks(*a, **k))
    tok = hand_made([("h", "e"), ("t", "h"), ("th", "e")], ignore_merges=False)
    tok.add_special_tokens(["<|trim|>"])  # a tokenizer no other test checked
    enc = Encoder(tok, cache_dir=None)
    assert events == []  # deferred: nothing yet
    enc.verify()
    assert events == ["release", "checks", "release"]


def test_a_mismatch_on_the_probes_keeps_tokenizers_with_a_warning() -> None:
    # With `ignore_merges`, tiktoken builds "the" from "t" + "he" inside " there";
    # tokenizers has no such merge. The probe set holds " there".
    tok = hand_made([("h", "e"), ("t", "h"), ("th", "e")], ignore_merges=True)
    enc = Encoder(tok)  # the checks wait for the end of the document sample (or verify())
    assert enc.describe()["checks_pending"] and "pending" in enc.reason
    with pytest.warns(EncoderFallbackWarning, match="probe text .* `tokenizers` gives"):
        enc.verify()
    assert enc.backend == "tokenizers" and "failed the equivalence check" in enc.reason
    with pytest.raises(ConfigError, match="probe text"):
        Encoder(tok, backend="tiktoken")


def test_deferred_checks_run_when_the_sample_ends_and_no_fast_id_leaves_before(
    tok_small: Tokenizer, tmp_path: Path
) -> None:
    tok = hand_made([("h", "e"), ("t", "h"), ("th", "e")], ignore_merges=True)
    tok.add_special_tokens(["<|deferred|>"])  # a tokenizer no other test checked: no cached verdict
    enc = Encoder(tok, sample_bytes=40)
    texts = [f"doc {i} he th" for i in range(60)]  # no " there": the sample alone cannot catch it
    write_parts(tmp_path, [{"text": texts}], row_group_size=10)
    ds = read_parquet(tmp_path).tokenize(enc, first_slice_bytes=16, slice_bytes=16, num_inflight=1)
    with pytest.warns(EncoderFallbackWarning, match="probe text"):
        got = [ids for b in ds for ids in b.column("input_ids").to_pylist()]
    assert got == [ids + [0] for ids in reference(tok, texts)]
    assert enc.backend == "tokenizers" and not enc.describe()["checks_pending"]
    assert enc._sampled >= 40  # the checks ran once the sample was done, not before

    fresh = Tokenizer.from_str(tok_small.to_str())
    fresh.add_special_tokens(["<|deferred|>"])  # not checked by another test
    good = Encoder(fresh, sample_bytes=40)
    assert good.describe()["checks_pending"]
    got = [ids for b in read_parquet(tmp_path).tokenize(good) for ids in b.column("input_ids").to_pylist()]
    assert got == [ids + [0] for ids in reference(fresh, texts)]
    info = good.describe()
    assert not info["checks_pending"] and info["backend"] == "tiktoken" and info["sample_bytes_left"] == 0
    assert info["checked"]["probe texts"] > 1000 and "identical ids on" in info["reason"]


def test_a_huge_document_during_the_sample_joins_it_by_its_head_and_the_backend_encodes_it(
    tok_small: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the reference holds ~25 bytes a byte of a document: a 20 MB one took the first process to 2.6 GB
    from arrowstream.tokenize.encoders import SAMPLE_DOC_CHARS

    longest: list[int] = []
    checks = Encoder._reference_checks

    def spy(self: Encoder, texts: list[str]):
        longest.append(max((len(t) for t in texts), default=0))
        return checks(self, texts)

    monkeypatch.setattr(Encoder, "_reference_checks", spy)
    words = make_texts(400, seed=5)
    huge = " ".join(words) * (3 * SAMPLE_DOC_CHARS // len(" ".join(words)) + 1)
    texts = ["a first document", huge, "and a last one"]
    fresh = Tokenizer.from_str(tok_small.to_str())
    fresh.add_special_tokens(["<|huge-sample|>"])  # a tokenizer no other test checked: no cached verdict
    enc = Encoder(fresh, sample_bytes=1 << 20, cache_dir=tmp_path)
    flat, lens = enc.encode(texts)
    got = [ids.tolist() for ids in np.split(flat, np.cumsum(lens)[:-1])]
    assert got == reference(fresh, texts)
    assert max(longest) <= SAMPLE_DOC_CHARS  # never the whole document through the reference
    info = enc.describe()
    assert not info["checks_pending"] and info["backend"] in ("tokie", "tiktoken")
    assert 0 < enc._sampled <= SAMPLE_DOC_CHARS + 64  # the head only, and the short ones

    bad = hand_made([("Q", "X"), ("Z", "Q"), ("ZQ", "X")], ignore_merges=True)  # tiktoken differs on " ZQX"
    bad.add_special_tokens(["<|huge-sample-bad|>"])
    texts = ["doc", "doc ZQX " + "doc " * SAMPLE_DOC_CHARS]
    with pytest.warns(EncoderFallbackWarning):
        flat, lens = Encoder(bad, cache_dir=tmp_path).encode(texts)
    assert [ids.tolist() for ids in np.split(flat, np.cumsum(lens)[:-1])] == reference(bad, texts)


def test_a_mismatch_on_the_first_documents_falls_back_before_any_fast_id_leaves(tmp_path: Path) -> None:
    # Inside " ZQX" tiktoken builds "ZQX" from "Z" + "QX"; tokenizers has no such merge (and
    # finds "ZQX" itself only as a whole piece, as in the vocabulary check). No probe has it.
    tok = hand_made([("Q", "X"), ("Z", "Q"), ("ZQ", "X")], ignore_merges=True)
    enc = Encoder(tok)
    assert enc.backend == "tiktoken"
    texts = [f"doc {i}" + (" ZQX" if i == 7 else "") for i in range(30)]
    write_parts(tmp_path, [{"text": texts}], row_group_size=10)
    with pytest.warns(EncoderFallbackWarning, match=r"on a document: #7 'doc 7 ZQX'"):
        got = [ids for b in read_parquet(tmp_path).tokenize(enc) for ids in b.column("input_ids").to_pylist()]
    assert enc.backend == "tokenizers"
    assert got == [ids + [0] for ids in reference(tok, texts)]
    with pytest.warns(EncoderFallbackWarning, match="on a document"):  # the verdict is remembered
        assert Encoder(tok).backend == "tokenizers"


def test_the_verdict_is_cached_by_tokenizer_hash_on_disk(
    tok_small: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = Tokenizer.from_str(tok_small.to_str())
    tok.add_special_tokens(["<|cached|>"])  # a tokenizer no other test checked
    assert not list(tmp_path.glob("*.json"))
    Encoder(tok, cache_dir=tmp_path).verify()
    [path] = tmp_path.glob("*.json")
    verdict = json.loads(path.read_text())
    assert verdict["ok"] and verdict["checked"]["probe texts"] > 1000
    monkeypatch.setattr(verdicts_module, "_verdicts", {})  # a new process, say

    def must_not_run(*args, **kwargs):
        raise AssertionError("the checks ran again")

    monkeypatch.setattr(Encoder, "_check", must_not_run)
    cached = Encoder(tok, cache_dir=tmp_path)
    assert cached.backend == "tiktoken" and not cached.describe()["checks_pending"]
    monkeypatch.setattr(verdicts_module, "_verdicts", {})
    with pytest.raises(AssertionError, match="ran again"):
        Encoder(tok).verify()  # no cache_dir, no in-process verdict: checks again


def test_the_pipeline_reports_its_backend_and_keeps_its_options_hash(tok_small: Tokenizer, tmp_path: Path) -> None:
    write_parts(tmp_path, [{"text": ["a b c", "d e"]}])
    fast_ds = read_parquet(tmp_path).tokenize(tok_small)
    slow_ds = read_parquet(tmp_path).tokenize(Encoder(tok_small, backend="tokenizers"))
    assert fast_ds.stages[-1].backend == "tiktoken" and slow_ds.stages[-1].backend == "tokenizers"
    assert "backend='tiktoken'" in repr(fast_ds.stages[-1])
    assert fast_ds.iter().state_dict() == slow_ds.iter().state_dict()
    with pytest.raises(ConfigError, match="backend"):
        Tokenize(tok_small, backend="fast")
    with pytest.raises(ConfigError, match="contradicts"):
        Tokenize(Encoder(tok_small, backend="tokenizers"), backend="tiktoken")


def test_pipelines_naming_one_tokenizer_file_share_one_parse_until_the_file_changes(
    tok_small: Tokenizer, tmp_path: Path
) -> None:
    path = tmp_path / "tokenizer.json"
    tok_small.save(str(path))
    write_parts(tmp_path / "data", [{"text": ["a b c", "d e"]}])
    first, second = (read_parquet(tmp_path / "data").tokenize(str(path)).stages[-1] for _ in range(2))
    assert first.tokenizer is second.tokenizer  # the sources of a mixture parse their tokenizer once
    assert load_tokenizer(str(path)) is not first.tokenizer  # the public loader gives a fresh object
    changed = Tokenizer.from_str(tok_small.to_str())
    changed.add_special_tokens(["<|new|>"])
    changed.save(str(path))
    os.utime(path, ns=(1, 1))  # a different modification time even on a coarse clock
    third = read_parquet(tmp_path / "data").tokenize(str(path)).stages[-1]
    assert third.tokenizer is not first.tokenizer and third.tokenizer.token_to_id("<|new|>") is not None
    assert third.encoder.hash != first.encoder.hash


def pipeline(path: Path, tok: Tokenizer | Encoder, **kw):
    return read_parquet(path, num_epochs=2, batch_rows=7).tokenize(tok, slice_bytes=3000, **kw)


@pytest.mark.parametrize("backend", ["tiktoken", "tokenizers"])
def test_resume_contract_and_packing_hold_with_either_backend(
    tmp_path: Path, tok_large: Tokenizer, backend: str, encoded_by: EncodedBy
) -> None:
    write_dataset(tmp_path, num_files=2, docs_per_file=12, rows_per_group=5, seed=3)
    ds = pipeline(tmp_path, Encoder(tok_large, backend=backend)).pack(seq_len=48, batch_size=2)
    assert ds.stages[-1].backend == backend
    assert assert_resumes_identically(ds, min_epochs=2, every=2, horizon=8) > 10
    if backend == "tiktoken":  # forced: no document sample, every id is tiktoken's
        assert encoded_by.tiktoken > 0 and encoded_by.tokenizers == 0
    else:
        assert encoded_by.tiktoken == 0 and encoded_by.tokenizers > 0
    tokens = 0
    for batch in ds:
        assert batch["input_ids"].shape == (2, 48)
        tokens += int(np.count_nonzero(batch["segment_ids"]))
    texts = [t for t in pq.read_table(tmp_path, columns=["text"]).column("text").to_pylist() if t]
    assert tokens == 2 * sum(len(ids) + 1 for ids in reference(tok_large, texts))  # 2 epochs, one EOS each


def test_both_backends_give_byte_identical_streams(tmp_path: Path, tok_large: Tokenizer, tok_llama: Tokenizer) -> None:
    write_dataset(tmp_path, num_files=2, docs_per_file=40, rows_per_group=9, seed=8)
    for tok in (tok_large, tok_llama):
        streams = set()
        for backend, inflight in (("tokenizers", 1), ("tiktoken", 1), ("tiktoken", 4), ("auto", 2)):
            # auto: a sample of 2,000 bytes, so that most documents come out as tiktoken's ids
            enc = Encoder(tok, backend=backend, sample_bytes=2000)
            ds = pipeline(tmp_path, enc, num_inflight=inflight).pack(seq_len=64, batch_size=3)
            streams.add(b"".join(b["input_ids"].tobytes() + b["segment_ids"].tobytes() for b in ds))
            if backend == "auto":
                assert enc.describe()["sample_bytes_left"] == 0 and enc.backend == "tiktoken"
        assert len(streams) == 1


@pytest.mark.parametrize("sample_bytes", [0, 1500])
def test_packing_loses_and_adds_no_token_with_the_fast_backend(
    tmp_path: Path, tok_large: Tokenizer, sample_bytes: int, encoded_by: EncodedBy, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = mixed_texts(60, seed=2)
    write_parts(tmp_path, [{"text": texts}], row_group_size=11)
    want = np.concatenate([np.array(ids + [0]) for ids in reference(tok_large, texts)])
    monkeypatch.setattr(verdicts_module, "_verdicts", {})  # a first process: no sample done before
    enc = Encoder(tok_large, sample_bytes=sample_bytes, cache_dir=None)
    ds = read_parquet(tmp_path).tokenize(enc).pack(seq_len=37, batch_size=3)
    assert ds.stages[-1].backend == "tiktoken"
    got = np.concatenate([b["input_ids"][b["segment_ids"] > 0] for b in ds])
    assert np.array_equal(got, want)
    # tiktoken's ids really came out: every text (no sample), or most of them (past the sample)
    if sample_bytes == 0:
        assert encoded_by.tiktoken == len(texts) and encoded_by.tokenizers == 0
    else:
        assert 0 < encoded_by.tokenizers < len(texts) // 2 and encoded_by.emitted_by_tiktoken > len(texts) // 2


def test_an_encoder_pickles_and_encodes_the_same(tok_llama: Tokenizer, corpus: list[str]) -> None:
    enc = Encoder(tok_llama, sample_bytes=0)
    clone = pickle.loads(pickle.dumps(enc))
    assert clone.backend == "tiktoken"
    assert fast(clone, corpus[:50]) == fast(enc, corpus[:50])


def test_probe_set_covers_every_byte_utf8_can_hold() -> None:
    seen = set("".join(probe_texts()).encode("utf-8"))
    assert seen == set(range(256)) - {0xC0, 0xC1, *range(0xF5, 0x100)}


def test_probe_set_is_the_one_stored_verdicts_were_proven_on() -> None:
    """The probe texts are part of every stored verdict's proof: they change only with ``_CHECKS_VERSION``."""
    import hashlib

    digest = hashlib.sha256("\x00".join(probe_texts()).encode("utf-8")).hexdigest()
    assert (verdicts_module._CHECKS_VERSION, len(probe_texts()), digest) == (
        2, 3515, "18f12d91abb654bf8ec643aced5dce6b44e4ce23c3b4f32e071e018a61cd0fbf"
    ), "the probe set changed: raise _CHECKS_VERSION in arrowstream/tokenize/verdicts.py and update this digest"


def test_building_a_pipeline_leaves_tokenizers_thread_pool_unstarted(tmp_path: Path, tok_small: Tokenizer) -> None:
    """Regression: the checks used the batch encoder, and forked DataLoader workers hung."""
    path = tmp_path / "tokenizer.json"
    tok_small.save(str(path))
    write_parts(tmp_path / "data", [{"text": ["a b", "c d"]}])
    script = f"""
import os
from arrowstream import read_parquet
from tokenizers import Tokenizer
ds = read_parquet({str(tmp_path / "data")!r}).tokenize({str(path)!r})
assert ds.stages[-1].backend in ("tiktoken", "tokie")  # tokie when installed: it must not hang a fork either
pid = os.fork()
if pid == 0:
    Tokenizer.from_file({str(path)!r}).encode_batch(["some text"] * 1000)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child exit", status)
"""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "true"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 0 and "child exit 0" in proc.stdout, proc.stderr[-2000:]
    assert "forked" not in proc.stderr


def test_the_stage_rebuilds_an_encoder_for_its_own_add_special_tokens(tok_llama: Tokenizer) -> None:
    enc = Encoder(tok_llama, add_special_tokens=False, sample_bytes=0)
    stage = Tokenize(enc, add_special_tokens=True, add_eos=False)
    assert stage.encoder is not enc and stage.encoder.add_special_tokens and stage.backend == "tiktoken"
    assert Tokenize(enc, add_special_tokens=False, add_eos=False).encoder is enc
    assert stage.encoder.describe()["backend"] == "tiktoken"


def test_the_tokenizer_arrowstream_trains_converts(corpus: list[str]) -> None:
    tok = train_tokenizer(make_texts(200, seed=9), vocab_size=700)
    enc = Encoder(tok, sample_bytes=0)
    for kind, texts in {"corpus": corpus[:200], **cases(["<|endoftext|>"])}.items():
        assert fast(enc, texts) == reference(tok, texts), kind


def test_a_transformers_fast_tokenizer_is_used_through_its_backend(tokenizer: Tokenizer, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    from arrowstream import read_parquet

    core = Tokenizer.from_str(tokenizer.to_str())
    bos = core.token_to_id("<|endoftext|>")
    core.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    hf = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    texts = ["the first text here", "and a second, longer one with more words in it"]
    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet")
    [batch] = list(read_parquet(tmp_path).tokenize(hf))
    got = batch.column("input_ids").to_pylist()
    want = [ids + [hf.eos_token_id] for ids in hf(texts)["input_ids"]]  # its BOS, its EOS
    assert got == want


def test_a_tokenizer_loaded_by_transformers_is_the_same_pipeline(tokenizer: Tokenizer, tmp_path: Path) -> None:
    """transformers adds a post-processor that adds nothing: states, caches and indexes carry over."""
    from transformers import PreTrainedTokenizerFast

    from arrowstream import read_parquet
    from arrowstream.tokenize import tokenizer_hash

    tokenizer.save(str(tmp_path / "tokenizer.json"))
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert hf.backend_tokenizer.to_str() != tokenizer.to_str()
    assert tokenizer_hash(hf.backend_tokenizer) == tokenizer_hash(tokenizer)
    write_parts(tmp_path / "data", [{"text": ["one text", "and another one"] * 5}])
    plain = read_parquet(tmp_path / "data").tokenize(tokenizer).pack(seq_len=8, batch_size=1).iter()
    next(plain)
    via_hf = read_parquet(tmp_path / "data").tokenize(hf).pack(seq_len=8, batch_size=1)
    rest = [b["input_ids"].tolist() for b in via_hf.iter(plain.state_dict())]
    assert rest == [b["input_ids"].tolist() for b in plain]
    bos = Tokenizer.from_str(tokenizer.to_str())
    from tokenizers.processors import TemplateProcessing

    eos = tokenizer.token_to_id("<|endoftext|>")
    bos.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", eos)])
    assert tokenizer_hash(bos) != tokenizer_hash(tokenizer)  # one that adds a token is another tokenizer


def test_a_slow_transformers_tokenizer_is_refused_with_the_fast_way(tmp_path: Path) -> None:
    from transformers import PythonBackend

    from arrowstream import read_parquet
    from arrowstream.errors import ConfigError

    class CharTokenizer(PythonBackend):  # a pure-Python ("slow") tokenizer: no `tokenizers` core
        def __init__(self) -> None:
            self.vocab = {"a": 0, "<unk>": 1}
            super().__init__(unk_token="<unk>")

        @property
        def vocab_size(self) -> int:
            return len(self.vocab)

        def get_vocab(self) -> dict[str, int]:
            return dict(self.vocab)

        def _tokenize(self, text: str) -> list[str]:
            return list(text)

        def _convert_token_to_id(self, token: str) -> int:
            return self.vocab.get(token, 1)

    write_parts(tmp_path, [{"text": ["aa"]}])
    with pytest.raises(ConfigError, match=r"CharTokenizer is a slow transformers tokenizer.*use_fast=True"):
        read_parquet(tmp_path).tokenize(CharTokenizer())


def test_the_reference_encodes_in_bounded_calls_with_the_same_ids(
    tok_small: Tokenizer, corpus: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tokenizers`` gets at most REFERENCE_CALL_BYTES of text a call: a 2 MiB call kept 50 MB of the C heap for good."""
    import arrowstream.tokenize.encoders as encoders

    monkeypatch.setattr(encoders, "REFERENCE_CALL_BYTES", 2_000)
    enc = Encoder(tok_small, backend="tokenizers")
    sizes: list[int] = []
    real = enc.tokenizer.encode_batch_fast

    class Spy:  # a tokenizers.Tokenizer's attributes cannot be set: wrap it
        def __getattr__(self, name: str) -> object:
            return getattr(real.__self__, name)

        def encode_batch_fast(self, texts: list[str], **kw: object) -> object:
            sizes.append(sum(map(len, texts)) if len(texts) > 1 else 0)
            return real(texts, **kw)

    enc.source._tokenizer = Spy()  # what the encoder encodes with
    texts = corpus[:300]
    flat, lens = enc.encode(texts)
    assert len(sizes) > 5 and max(sizes) <= 2_000
    want = reference(tok_small, texts)
    assert lens.tolist() == [len(w) for w in want]
    assert flat.tolist() == [i for w in want for i in w]


def test_the_built_in_checks_run_in_bounded_calls_and_still_find_a_late_difference(
    tok_small: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each backend gets at most CHECK_CALL_CHARS of the checks' texts a call (one call each kept 50 MB more)."""
    from arrowstream.tokenize import proof
    from arrowstream.tokenize.fast import _convert, _flatten

    monkeypatch.setattr(proof, "CHECK_CALL_CHARS", 1_000)
    spec, encoding = _convert("bounded-checks", tok_small, True)
    probes = list(probe_texts())
    last = probes[-1]
    sizes: list[int] = []

    def reference(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:  # wrong on the last probe only
        if len(texts) > 1:
            sizes.append(sum(map(len, texts)))
        ids = [np.array(e.ids, np.int32) for e in tok_small.encode_batch(list(texts))]
        return _flatten([a + 1 if t == last else a for t, a in zip(texts, ids)])

    verdict = proof.check_backends(spec, encoding, reference, tokie=None)
    assert max(sizes) <= 1_000 and len(sizes) > 100
    assert not verdict["ok"] and verdict["reason"].startswith(f"probe text #{len(probes) - 1} ")
    assert last[:40] in verdict["reason"]  # the numbers count all probes, not the call's


_SYMBOLS = "".join(byte_symbols().values())


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(_SYMBOLS + "\x00 \x7f\xad\u0150\u2603\U0001f600"), max_size=12))
def test_a_token_becomes_its_bytes_or_none_as_a_lookup_per_symbol_would(symbols: str) -> None:
    from arrowstream.tokenize.bytelevel import _to_bytes

    back = {sym: b for b, sym in byte_symbols().items()}
    expected = bytes(back[c] for c in symbols) if all(c in back for c in symbols) else None
    assert _to_bytes(symbols) == expected
