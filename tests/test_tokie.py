"""The tokie backend gives exactly the ids of `tokenizers` (with its routing), or is not used."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from arrowstream import ConfigError, read_parquet
from arrowstream.errors import EncoderFallbackWarning
from arrowstream.testing import assert_resumes_identically
from arrowstream.testing.data import sample_tokenizer, write_dataset
from arrowstream.tokenize import tokie_backend
from arrowstream.tokenize import verdicts as verdicts_module
from arrowstream.tokenize.encoders import Encoder
from arrowstream.tokenize.fast import _Deferred, _Fast

from .conftest import write_parts
from .test_encoders import cases, mixed_texts, reference, train

pytest.importorskip("tokie")
pytestmark = pytest.mark.tokie

ROUTED = ["a\t's b", "x\x0b'll", "\x0c'd", "tab\tthen\t'very' odd", "\t" + "'s\t" * 20]


def split(flat: np.ndarray, lens: np.ndarray) -> list[list[int]]:
    return [a.tolist() for a in np.split(flat, np.cumsum(lens)[:-1])] if len(lens) else []


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    tok = sample_tokenizer()
    tok.add_special_tokens(["<|tokie-tests|>"])  # a tokenizer other test modules did not check
    return tok


@pytest.fixture(scope="module")
def tok_large() -> Tokenizer:
    return train(mixed_texts(1500, seed=11), 3000)


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_tokie_gives_the_ids_of_tokenizers(tok: Tokenizer, add_special_tokens: bool) -> None:
    enc = Encoder(tok, add_special_tokens=add_special_tokens, sample_bytes=0)
    assert enc.backend == "tokie", enc.reason
    assert "tab, vertical tab or form feed before an apostrophe" in enc.reason
    for kind, texts in {"corpus": mixed_texts(500, seed=3), "routed": ROUTED, **cases(["<|endoftext|>"])}.items():
        assert split(*enc.encode(texts)) == reference(tok, texts, add_special_tokens=add_special_tokens), kind


def test_routed_texts_get_the_reference_ids_from_the_next_backend(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    enc = Encoder(tok, sample_bytes=0)
    assert enc.backend == "tokie"
    texts = ["plain words"] + ROUTED + ["more plain words, it's fine"]
    want = reference(tok, texts)
    raw = tokie_backend.TokieBackend(tok, add_special_tokens=True, key="raw")._tokie(texts)
    assert split(*raw) != want  # tokie alone differs on them: the routing is what makes it exact
    seen: list[str] = []
    fast_encode = type(enc._fast).encode

    def spy(self, texts, ref):
        seen.extend(texts)
        return fast_encode(self, texts, ref)

    monkeypatch.setattr(type(enc._fast), "encode", spy)
    assert split(*enc.encode(texts)) == want
    assert seen == ROUTED  # tiktoken encoded exactly the routed texts, in order
    enc._fast = None  # tiktoken gone: the routed texts go to `tokenizers`
    assert split(*enc.encode(texts)) == want
    assert tokie_backend.routed(texts) == [1, 2, 3, 4, 5]


def test_tokie_calls_from_several_threads_run_one_at_a_time(tok: Tokenizer) -> None:
    """Each call already uses every core: calls side by side only crowd them (slices in flight, a mixture)."""
    import threading
    import time

    backend = tokie_backend.TokieBackend(tok, add_special_tokens=True, key="one-call")
    inner = backend.tokenizer
    active, most = [0], [0]
    count = threading.Lock()

    class Watched:
        def encode_batch_flat(self, texts, add_special_tokens):
            with count:
                active[0] += 1
                most[0] = max(most[0], active[0])
            time.sleep(0.01)  # long enough for the other threads to arrive
            try:
                return inner.encode_batch_flat(texts, add_special_tokens)
            finally:
                with count:
                    active[0] -= 1

    backend.tokenizer = Watched()
    texts = mixed_texts(40, seed=5)
    results: list[list[list[int]]] = [[] for _ in range(4)]

    def work(i: int) -> None:
        results[i] = split(*backend._tokie(texts))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    assert all(r == reference(tok, texts) for r in results)


def test_tokie_is_refused_where_it_differs_and_no_routing_covers_it(tok_large: Tokenizer) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # tiktoken stays: no warning
        enc = Encoder(tok_large, sample_bytes=0)
    assert enc.backend == "tiktoken" and "tokie not used, it gave other ids on probe text" in enc.reason
    later = Encoder(tok_large, sample_bytes=0)  # from the stored verdict: tokie stays refused
    assert later.backend == "tiktoken" and "tokie not used" in later.reason
    assert isinstance(later._fast, _Fast)  # tiktoken encodes everything: nothing to defer
    with pytest.raises(ConfigError, match=r"`backend='tokie'` cannot be used: probe text .* and tokie "):
        Encoder(tok_large, backend="tokie")


def test_a_tokie_mismatch_on_the_first_documents_keeps_tiktoken(
    tok: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokie_backend, "ROUTED_PAIRS", ())  # no routing: tokie differs on "\t's"
    fresh = Tokenizer.from_str(tok.to_str())
    fresh.add_special_tokens(["<|tokie-sample|>"])
    enc = Encoder(fresh, sample_bytes=10_000, cache_dir=tmp_path)
    assert enc.backend == "tokie" and enc.describe()["checks_pending"]
    texts = [f"doc {i}" + ("\t's" if i == 5 else "") for i in range(40)]
    write_parts(tmp_path / "data", [{"text": texts}], row_group_size=10)
    with pytest.warns(EncoderFallbackWarning, match=r"tokie gave other ids .* on a document: #5"):
        got = [ids for b in read_parquet(tmp_path / "data").tokenize(enc) for ids in b.column("input_ids").to_pylist()]
    assert got == [ids + [0] for ids in reference(fresh, texts)]
    enc.verify()
    assert enc.backend == "tiktoken" and "tokie gave other ids" in enc.reason
    again = Encoder(fresh, sample_bytes=10_000, cache_dir=tmp_path)
    again.verify()  # the failure is in the stored verdict: no tokie in a later encoder either
    assert again.backend == "tiktoken"


def _fresh(tok: Tokenizer, name: str) -> Tokenizer:
    fresh = Tokenizer.from_str(tok.to_str())
    fresh.add_special_tokens([f"<|{name}|>"])  # no verdict for it in this process
    return fresh


def _tiktoken_texts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every text tiktoken is asked to encode from now on."""
    seen: list[str] = []
    real = _Fast.encode

    def spy(self, texts, ref):
        seen.extend(texts)
        return real(self, texts, ref)

    monkeypatch.setattr(_Fast, "encode", spy)
    return seen


def test_during_the_first_sample_tiktoken_encodes_only_the_texts_tokie_routes(
    tok: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first process's proof costs reference + tokie per document, not reference + tokie + tiktoken."""
    fresh = _fresh(tok, "tokie-routed-sample")
    plain = mixed_texts(60, seed=9)
    texts = plain[:30] + ROUTED + plain[30:]
    sample = 2 * sum(len(t.encode()) for t in texts)
    enc = Encoder(fresh, sample_bytes=sample, cache_dir=tmp_path)
    seen = _tiktoken_texts(monkeypatch)
    assert split(*enc.encode(texts)) == reference(fresh, texts)  # the reference's ids, during the sample
    assert seen == ROUTED and enc.describe()["sample_bytes_left"] == sample // 2
    while enc.describe()["sample_bytes_left"]:  # the built-in checks run at its end
        assert split(*enc.encode(plain)) == reference(fresh, plain)
    assert enc.backend == "tokie"
    stored = verdicts_module._cached_verdict(enc._key(), tmp_path)
    assert stored["documents"] >= sample and stored["documents_by"] == "tokie"
    assert verdicts_module.documents_vouched(stored, tokie=False) == 0  # vouches for tiktoken alone on no document


def test_when_tokie_fails_on_a_document_tiktoken_is_sampled_on_documents_of_its_own(
    tok: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokie_backend, "ROUTED_PAIRS", ())  # no routing: tokie differs on "\t's"
    fresh = _fresh(tok, "tokie-own-sample")
    plain = mixed_texts(6, seed=4)
    size = sum(len(t.encode()) for t in plain)
    enc = Encoder(fresh, sample_bytes=3 * size, cache_dir=tmp_path)
    enc.encode(plain)
    assert enc.describe()["sample_bytes_left"] == 2 * size
    with pytest.warns(EncoderFallbackWarning, match="tokie gave other ids"):
        assert split(*enc.encode(["a\t's b"])) == reference(fresh, ["a\t's b"])
    assert enc.backend == "tiktoken"
    assert enc.describe()["sample_bytes_left"] == 3 * size  # tiktoken saw none of the earlier documents: a new sample
    seen = _tiktoken_texts(monkeypatch)
    while enc.describe()["sample_bytes_left"]:
        assert split(*enc.encode(plain)) == reference(fresh, plain)
    assert seen[: 3 * len(plain)] == plain * 3  # every document goes through tiktoken (then the built-in checks)
    assert verdicts_module._cached_verdict(enc._key(), tmp_path)["documents_by"] == "tiktoken"


def test_when_tokie_fails_the_checks_at_the_sample_end_tiktoken_is_sampled_on_its_own(
    tok_large: Tokenizer, tmp_path: Path
) -> None:
    fresh = _fresh(tok_large, "tokie-checks-sample")
    plain = mixed_texts(6, seed=6)
    size = sum(len(t.encode()) for t in plain)
    enc = Encoder(fresh, sample_bytes=2 * size, cache_dir=tmp_path)
    assert enc.backend == "tokie" and enc.describe()["checks_pending"]
    while enc.backend == "tokie":
        assert split(*enc.encode(plain)) == reference(fresh, plain)
    assert "tokie not used" in enc.reason
    assert enc.describe()["sample_bytes_left"] == 2 * size  # tiktoken's own sample begins
    while enc.describe()["sample_bytes_left"]:
        assert split(*enc.encode(plain)) == reference(fresh, plain)
    assert verdicts_module._cached_verdict(enc._key(), tmp_path)["documents_by"] == "tiktoken"


def test_a_proven_tokie_converts_tiktoken_only_when_a_routed_text_comes(tok: Tokenizer, tmp_path: Path) -> None:
    import pickle

    tok = Tokenizer.from_str(tok.to_str())
    tok.add_special_tokens(["<|tokie-deferred|>"])  # no verdict for it in this process yet
    first = Encoder(tok, sample_bytes=0, cache_dir=tmp_path)  # no verdict yet: converts, checks, stores
    assert isinstance(first._fast, _Fast) and first.backend == "tokie"
    later = Encoder(tok, sample_bytes=0, cache_dir=tmp_path)  # as in a later process
    assert isinstance(later._fast, _Deferred) and later._fast.converted is None
    assert later.backend == "tokie" and later.reason.startswith(first.reason)
    plain = mixed_texts(200, seed=5)
    assert not tokie_backend.routed(plain)
    assert split(*later.encode(plain)) == reference(tok, plain)
    assert later._fast.converted is None  # nothing routed: tiktoken never built
    clone = pickle.loads(pickle.dumps(later))  # a DataLoader worker's copy defers too
    assert isinstance(clone._fast, _Deferred) and clone._fast.converted is None
    texts = plain[:3] + ROUTED
    assert split(*later.encode(texts)) == reference(tok, texts)
    assert later._fast.converted is not None
    assert split(*clone.encode(texts)) == reference(tok, texts)
    assert isinstance(pickle.loads(pickle.dumps(later))._fast, _Fast)  # once converted, the spec travels


def test_the_verdict_key_holds_tokies_version(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    enc = Encoder(tok, sample_bytes=0)
    key = enc._key()
    monkeypatch.setattr(tokie_backend.importlib.metadata, "version", lambda name: "99.0")
    tokie_backend._installed_version.cache_clear()  # as in a process where tokie 99.0 is installed
    try:
        assert enc._key() != key
        assert Encoder(tok, backend="tiktoken", sample_bytes=0)._key() != key  # forced tiktoken: no tokie in it
    finally:
        tokie_backend._installed_version.cache_clear()


def test_tokies_version_is_looked_up_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    real = tokie_backend.importlib.metadata.version
    calls: list[str] = []
    monkeypatch.setattr(tokie_backend.importlib.metadata, "version", lambda name: calls.append(name) or real(name))
    tokie_backend._installed_version.cache_clear()
    try:
        assert [tokie_backend.tokie_version() for _ in range(3)] == [real("tokie")] * 3
        assert calls == ["tokie"]  # a metadata lookup costs about a millisecond; every encoder asks
    finally:
        tokie_backend._installed_version.cache_clear()


def test_every_backend_gives_byte_identical_streams_and_resumes(tmp_path: Path, tok: Tokenizer) -> None:
    write_dataset(tmp_path, num_files=2, docs_per_file=30, rows_per_group=7, seed=4)
    streams = set()
    for backend in ("tokenizers", "tiktoken", "tokie", "auto"):
        enc = Encoder(tok, backend=backend, sample_bytes=500)
        ds = read_parquet(tmp_path, num_epochs=2, batch_rows=5).tokenize(enc, slice_bytes=2000).pack(seq_len=40, batch_size=3)
        streams.add(b"".join(b["input_ids"].tobytes() + b["segment_ids"].tobytes() for b in ds))
        assert enc.backend == ("tokie" if backend == "auto" else backend)
        if backend == "tokie":
            assert assert_resumes_identically(ds, min_epochs=2, every=3, horizon=6) > 5
    assert len(streams) == 1


def test_without_tokie_everything_is_as_before(tmp_path: Path) -> None:
    script = """
import sys
sys.modules["tokie"] = None  # an import of tokie now fails, as where it is not installed
from arrowstream import ConfigError
from arrowstream.testing.data import sample_tokenizer
from arrowstream.tokenize.encoders import Encoder
from arrowstream.tokenize.fast import _Deferred, _Fast
from arrowstream.tokenize.tokie_backend import tokie_version
enc = Encoder(sample_tokenizer(), sample_bytes=0)
print(tokie_version(), enc.backend, enc.describe()["versions"]["tokie"])
try:
    Encoder(sample_tokenizer(), backend="tokie")
except ConfigError as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    lines = out.stdout.splitlines()
    assert lines[0] == "None tiktoken None"
    assert "tokie is not installed; `pip install arrowstream[fast]`" in lines[1]


def test_a_pickled_encoder_keeps_tokie(tok: Tokenizer) -> None:
    import pickle

    enc = Encoder(tok, sample_bytes=0)
    clone = pickle.loads(pickle.dumps(enc))
    assert clone.backend == "tokie"
    texts = mixed_texts(30, seed=1) + ROUTED
    assert split(*clone.encode(texts)) == reference(tok, texts)


def test_the_cache_the_length_index_and_the_analysis_encode_with_tokie(
    tmp_path: Path, tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arrowstream import analyze, build_length_index

    from arrowstream.testing.texts import make_texts

    write_dataset(tmp_path / "data", num_files=2, docs_per_file=30, rows_per_group=7, seed=5)
    texts = list(make_texts(400, seed=9))
    while sum(map(len, texts)) < 1 << 20:
        texts += texts
    proof = Encoder(tok)
    proof.encode(texts)  # the whole sample checked and stored: later encoders use tokie from the first document
    assert proof.backend == "tokie" and not proof.describe()["checks_pending"]
    encoded: list[int] = []
    real = tokie_backend.TokieBackend._tokie

    def spy(self: tokie_backend.TokieBackend, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encoded.append(len(texts))
        return real(self, texts)

    def refuse(self: Encoder, texts: list[str]) -> None:
        raise AssertionError("the reference encoder ran: the proven tokie backend was not used")

    monkeypatch.setattr(tokie_backend.TokieBackend, "_tokie", spy)
    monkeypatch.setattr(Encoder, "_reference", refuse)
    counts = []
    list(read_parquet(tmp_path / "data").tokenize(tok, cache=tmp_path / "cache"))  # fills the token cache
    counts.append(sum(encoded))
    build_length_index(tmp_path / "data", tok, length_index=tmp_path / "index")
    counts.append(sum(encoded) - counts[-1])
    analyze(tmp_path / "data", tokenizer=tok)
    counts.append(sum(encoded) - sum(counts))
    assert all(n >= 50 for n in counts), counts  # each encoded (nearly) all 60 documents with tokie


def test_a_fork_waits_for_a_tokie_call_in_another_thread_and_the_child_encodes(tok: Tokenizer) -> None:
    """A DataLoader worker must not be forked mid-call: it would inherit tokie's state (locks included) half-way."""
    import os
    import signal
    import threading
    import time

    backend = tokie_backend.TokieBackend(tok, add_special_tokens=True, key="fork")
    inside, leave = threading.Event(), [0.0]

    def call() -> None:  # as an encode thread inside tokie for half a second
        with tokie_backend._one_call:
            inside.set()
            time.sleep(0.5)
            leave[0] = time.monotonic()

    thread = threading.Thread(target=call)
    thread.start()
    inside.wait()
    pid = os.fork()
    if pid == 0:  # the child: encode, then leave without running the parent's cleanup
        try:
            ok = split(*backend._tokie(["forked child text"])) == reference(tok, ["forked child text"])
        finally:
            os._exit(0 if ok else 3)
    forked = time.monotonic()
    thread.join()
    assert leave[0] and forked >= leave[0]  # the fork waited for the call to end
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_first_process_converts_for_tiktoken_only_when_the_checks_run(tok: Tokenizer, tmp_path: Path) -> None:
    # at 128k tokens the conversion is about 1.5 s of the first process's start-up: not before its first batch
    fresh = Tokenizer.from_str(tok.to_str())
    fresh.add_special_tokens(["<|tokie-first-deferred|>"])
    texts = mixed_texts(40, seed=11)
    enc = Encoder(fresh, sample_bytes=sum(len(t.encode()) for t in texts[:20]), cache_dir=tmp_path)
    assert isinstance(enc._fast, _Deferred) and enc._fast.converted is None and enc.backend == "tokie"
    assert split(*enc.encode(texts[:5])) == reference(fresh, texts[:5])
    assert enc._fast.converted is None  # the sample compares tokie; tiktoken waits
    for i in range(5, 40, 5):
        assert split(*enc.encode(texts[i : i + 5])) == reference(fresh, texts[i : i + 5])
    info = enc.describe()
    assert not info["checks_pending"] and info["backend"] == "tokie"
    # the checks converted it, kept its compact form, and it was dropped once tokie was proven (test_compiled.py)
    assert len(list(tmp_path.glob("*.bpe.npz"))) == 1 and enc._fast.converted is None
    assert info["checked"]["vocabulary tokens"] > 100 and verdicts_module._cached_verdict(enc._key(), tmp_path)["ok"]


def test_a_tokenizer_whose_merges_tiktoken_refuses_falls_back_when_the_checks_convert(tmp_path: Path) -> None:
    from .test_encoders import hand_made

    odd = hand_made([("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")], ignore_merges=False)  # 'abc' made twice
    odd.add_special_tokens(["<|tokie-merges-refused|>"])
    enc = Encoder(odd, sample_bytes=40, cache_dir=tmp_path)
    assert enc.backend == "tokie" and enc.describe()["checks_pending"]  # its settings pass; its merges wait
    texts = [f"abc {i} abcd bc ab" for i in range(20)]
    with pytest.warns(EncoderFallbackWarning, match="made by two merges"):
        got = split(*enc.encode(texts))
    assert got == reference(odd, texts) and enc.backend == "tokenizers"
    assert "not converted to tiktoken" in enc.reason and not enc.describe()["checks_pending"]
    assert split(*enc.encode(texts)) == reference(odd, texts)
    assert not list(tmp_path.glob("*.json"))  # a refusal is not a verdict: the next process looks again


def test_a_tokenizer_refused_for_its_settings_keeps_tokenizers_from_the_start(tok: Tokenizer, tmp_path: Path) -> None:
    from tokenizers import normalizers

    odd = Tokenizer.from_str(tok.to_str())
    odd.normalizer = normalizers.NFKC()  # tiktoken encodes the text as it is: never tokie either
    with pytest.warns(EncoderFallbackWarning, match="NFKC"):
        enc = Encoder(odd, cache_dir=tmp_path)
    assert enc.backend == "tokenizers" and enc._tokie is None and not enc.describe()["checks_pending"]
