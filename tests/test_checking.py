"""The built-in checks run beside the stream, by one process of a machine at a time (tokenize/checking.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from arrowstream import read_parquet
from arrowstream.core.urgency import before_first_batch
from arrowstream.errors import EncoderFallbackWarning
from arrowstream.testing.data import make_texts, sample_tokenizer
from arrowstream.tokenize import checking, encoders, sampling
from arrowstream.tokenize import verdicts as verdicts_module
from arrowstream.tokenize.encoders import Encoder

from .conftest import forked_while_held, run_processes, write_parts

pytestmark = pytest.mark.tokie  # as in the real processes some tests start: one key for the encoder


def fresh(tag: str) -> Tokenizer:
    """A tokenizer no other test has checked (an added token changes its hash)."""
    tok = sample_tokenizer(300)
    tok.add_special_tokens([f"<|{tag}|>"])
    return tok


def saved(where: Path, tag: str) -> tuple[Tokenizer, Path]:
    """A fresh tokenizer and the ``tokenizer.json`` it is saved as in ``where``."""
    tok = fresh(tag)
    tok.save(str(where / "tokenizer.json"))
    return tok, where / "tokenizer.json"


def reference(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(texts)]


def split(flat: np.ndarray, lens: np.ndarray) -> list[list[int]]:
    return [ids.tolist() for ids in np.split(flat, np.cumsum(lens)[:-1])]


@pytest.fixture(autouse=True)
def as_a_new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no verdict and no run of the checks in this process."""
    monkeypatch.setattr(verdicts_module, "_verdicts", {})
    monkeypatch.setattr(checking, "_runs", {})
    monkeypatch.setattr(checking, "_waiting_since", {})


class Gate:
    """Holds the built-in checks until :meth:`open`, and counts them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opened = threading.Event()
        self.started = threading.Event()
        self.runs = 0
        real = encoders.check_backends

        def gated(*args: Any, **kwargs: Any) -> dict[str, Any]:
            self.runs += 1
            self.started.set()
            assert self.opened.wait(60), "the gate was never opened"
            return real(*args, **kwargs)

        monkeypatch.setattr(encoders, "check_backends", gated)

    def open(self) -> None:
        self.opened.set()


def texts_of(nbytes: int, seed: int = 1) -> list[str]:
    texts = list(make_texts(200, seed=seed))
    while sum(len(t.encode()) for t in texts) < nbytes:
        texts += texts
    return texts


def encode_in_thread(enc: Encoder, texts: list[str]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(enc.encode(texts))
        except BaseException as exc:  # shown by the test that looks at `out`
            out.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker, out


def checks_held(monkeypatch: pytest.MonkeyPatch, cache: Path, tag: str) -> tuple[Gate, Encoder]:
    """An encoder whose document sample ended before its first batch, its built-in checks held by a gate."""
    gate = Gate(monkeypatch)
    enc = Encoder(fresh(tag), sample_bytes=2000, cache_dir=cache)
    with before_first_batch():  # as the plan's token sample of a DataLoader worker
        texts = texts_of(2000, seed=1)
        assert split(*enc.encode(texts)) == reference(enc.tokenizer, texts)  # the sample ends: the checks start
    assert gate.started.wait(30)
    return gate, enc


def test_before_the_first_batch_the_reference_goes_on_beside_the_checks_then_the_stream_waits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gate, enc = checks_held(monkeypatch, tmp_path, "beside")
    tok, more = enc.tokenizer, texts_of(1000, seed=2)
    info = enc.describe()
    assert info["checks_pending"] and info["checks_running"] == "here" and "beside the stream" in enc.reason
    got = split(*enc.encode(more))  # the checks still held: the reference's ids, at once
    assert got == reference(tok, more) and enc.describe()["checks_pending"]
    worker, out = encode_in_thread(enc, texts_of(sampling.GRACE_BYTES, seed=3))  # past the grace: it waits
    worker.join(0.5)
    assert worker.is_alive() and not out
    gate.open()
    worker.join(60)
    assert out and not enc.describe()["checks_pending"] and enc.backend in ("tokie", "tiktoken")
    verdict = json.loads((tmp_path / f"{enc._key()}.json").read_text())
    assert verdict["ok"] and verdict["checked"]["probe texts"] > 1000 and verdict["documents"] >= 2000
    assert gate.runs == 1


def test_elsewhere_the_call_that_ends_the_sample_returns_after_the_checks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gate = Gate(monkeypatch)
    enc = Encoder(fresh("ends"), sample_bytes=2000, cache_dir=tmp_path)
    worker, out = encode_in_thread(enc, texts_of(2000))
    assert gate.started.wait(30)
    worker.join(0.3)
    assert worker.is_alive() and not out  # no grace: the cores go to the checks
    gate.open()
    worker.join(60)
    assert out and not enc.describe()["checks_pending"] and enc.describe()["checks_running"] is None


@contextmanager
def lock_held_elsewhere(path: Path) -> Iterator[subprocess.Popen[str]]:
    """A real process that holds the record lock on ``path`` until the block ends (or it is killed)."""
    script = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    with subprocess.Popen([sys.executable, "-c", script, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
            yield proc
        finally:
            proc.kill()


def test_while_another_process_holds_the_lock_this_one_waits_for_its_verdict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tok, path = saved(tmp_path, "elsewhere")
    cache = tmp_path / "cache"
    enc = Encoder(path, sample_bytes=2000, cache_dir=cache)
    with lock_held_elsewhere(checking.lock_path(enc._key(), cache)):
        def must_not_run(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("the checks ran in a second process")

        monkeypatch.setattr(encoders, "check_backends", must_not_run)
        texts = texts_of(2000)
        with before_first_batch():
            assert split(*enc.encode(texts)) == reference(tok, texts)
        assert enc.describe()["checks_running"] == "another process" and "another process" in enc.reason
        worker, out = encode_in_thread(enc, texts_of(sampling.GRACE_BYTES, seed=4))
        worker.join(0.5)
        assert worker.is_alive()  # past the grace: waiting, the cores left to the other process
        # the other process's verdict arrives (as it stores it: in the directory)
        other = subprocess.run(
            [sys.executable, "-c", "import sys; from arrowstream.tokenize.encoders import Encoder; "
             "Encoder(sys.argv[1], sample_bytes=0, cache_dir=sys.argv[2])", str(path), str(cache)],
            capture_output=True, text=True, check=True, timeout=120,
        )
        assert other.returncode == 0
        worker.join(60)
        assert out and not isinstance(out[0], BaseException), out
        assert not enc.describe()["checks_pending"] and enc.backend in ("tokie", "tiktoken")
        assert split(*enc.encode(texts)) == reference(tok, texts)


def test_a_lock_left_by_a_killed_process_is_taken_over(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tok = fresh("killed")
    enc = Encoder(tok, sample_bytes=2000, cache_dir=tmp_path)
    with lock_held_elsewhere(checking.lock_path(enc._key(), tmp_path)) as holder:
        with before_first_batch():
            enc.encode(texts_of(2000))
        assert enc.describe()["checks_running"] == "another process"
        holder.kill()  # mid-check, say: the system releases its lock
        holder.wait()
    enc.encode(texts_of(sampling.GRACE_BYTES, seed=5))  # waits, finds the lock free, runs them here
    assert not enc.describe()["checks_pending"] and enc.checked["probe texts"] > 1000
    assert json.loads((tmp_path / f"{enc._key()}.json").read_text())["ok"]


def test_a_process_waits_at_most_wait_s_for_another_ones_checks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(checking, "WAIT_S", 0.3)
    enc = Encoder(fresh("stuck"), sample_bytes=2000, cache_dir=tmp_path)
    with lock_held_elsewhere(checking.lock_path(enc._key(), tmp_path)):  # never lets go (stopped, say)
        started = time.monotonic()
        worker, out = encode_in_thread(enc, texts_of(2000))
        worker.join(60)
        assert out and not isinstance(out[0], BaseException), out
        assert not enc.describe()["checks_pending"] and enc.backend in ("tokie", "tiktoken")
        assert time.monotonic() - started >= 0.3


def test_a_mismatch_on_a_document_while_the_checks_run_is_not_overwritten(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gate, enc = checks_held(monkeypatch, tmp_path, "race")
    real = sampling.sample_differences

    def tiktoken_differs(texts: Any, ref: Any, fast: Any, tokie: Any, reference: Any) -> tuple[str | None, str | None]:
        return "#0 'made up'", None

    run = enc._run
    monkeypatch.setattr(sampling, "sample_differences", tiktoken_differs)
    with pytest.warns(EncoderFallbackWarning, match="made up"):
        enc.encode(["a document the fast backends get wrong"])
    monkeypatch.setattr(sampling, "sample_differences", real)
    assert enc.describe()["checks_running"] is None  # the encoder no longer waits for them
    gate.open()
    assert run is not None and run.wait(60)
    verdict = json.loads((tmp_path / f"{enc._key()}.json").read_text())
    assert not verdict["ok"] and "made up" in verdict["reason"]  # the checks passed, yet the failure stands
    assert enc.backend == "tokenizers"


def test_a_mismatch_another_process_stored_while_the_checks_ran_stands(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gate, enc = checks_held(monkeypatch, tmp_path, "race-elsewhere")
    failure = {"key": enc._key(), "ok": False, "reason": "#3 'another process saw this'", "checked": {}}
    (tmp_path / f"{enc._key()}.json").write_text(json.dumps(failure))  # as that process stores it
    run = enc._run
    gate.open()
    assert run is not None and run.wait(60)
    assert not json.loads((tmp_path / f"{enc._key()}.json").read_text())["ok"]
    enc.encode(["one more document"])
    assert "another process saw this" in enc.reason and enc._fast is None  # tiktoken dropped
    assert enc.describe()["checks_running"] is None


def test_a_tokie_mismatch_while_the_checks_run_is_kept_in_their_verdict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gate, enc = checks_held(monkeypatch, tmp_path, "race-tokie")
    assert enc.backend == "tokie"
    monkeypatch.setattr(sampling, "sample_differences", lambda *a: (None, "#0 'tokie made up'"))
    with pytest.warns(EncoderFallbackWarning, match="tokie made up"):
        enc.encode(["a document tokie gets wrong"])
    run = enc._run
    gate.open()
    assert run is not None and run.wait(60)
    verdict = json.loads((tmp_path / f"{enc._key()}.json").read_text())
    assert verdict["ok"] and not verdict["tokie"]["ok"] and "tokie made up" in verdict["tokie"]["reason"]


def test_an_error_of_the_checks_reaches_the_stream(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise MemoryError("no room for the checks")

    monkeypatch.setattr(encoders, "check_backends", broken)
    enc = Encoder(fresh("broken"), sample_bytes=2000, cache_dir=tmp_path)
    worker, out = encode_in_thread(enc, texts_of(2000))
    worker.join(60)
    assert out and isinstance(out[0], MemoryError) and "no room" in str(out[0])


def test_a_cache_that_cannot_be_written_runs_the_checks_and_the_stream_warns(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the directory would go")
    enc = Encoder(fresh("unwritable"), sample_bytes=2000, cache_dir=blocked / "encoders")
    with pytest.warns(EncoderFallbackWarning, match="cannot write the encoder check cache"):
        enc.encode(texts_of(2000))
    assert not enc.describe()["checks_pending"] and enc.backend in ("tokie", "tiktoken")


def test_one_process_runs_the_checks_of_a_key_once_whichever_encoder_asks(tmp_path: Path) -> None:
    release = threading.Event()
    first = checking.checks_beside("k" * 32, tmp_path, lambda: release.wait(30))
    second = checking.checks_beside("k" * 32, tmp_path, lambda: pytest.fail("ran twice"))
    assert first is second and first.here
    release.set()
    assert first.wait(30)


def _look_in_child(key: str, where: str, pipe: Any) -> None:
    run = checking.checks_beside(key, Path(where), lambda: None)  # the parent holds the lock: wait
    pipe.send(run.here)


def test_a_forked_child_waits_for_the_parents_checks_and_never_for_its_module_lock(tmp_path: Path) -> None:
    release = threading.Event()
    key = "f" * 32
    parent = checking.checks_beside(key, tmp_path, lambda: release.wait(60))
    try:
        assert forked_while_held(checking, _look_in_child, key, str(tmp_path)) is False
    finally:
        release.set()
    assert parent.wait(30)


def test_a_process_that_ends_while_its_checks_run_stores_their_verdict(tmp_path: Path) -> None:
    _, path = saved(tmp_path, "at-exit")
    script = (
        "import json, sys\n"
        "from arrowstream.core.urgency import before_first_batch\n"
        "from arrowstream.tokenize.encoders import Encoder\n"
        "enc = Encoder(sys.argv[1], sample_bytes=2000)\n"
        "with before_first_batch():\n"
        "    enc.encode(['a few words of a document'] * 200)\n"
        "print(json.dumps(enc.describe()['checks_running']))\n"
    )
    assert run_processes(script, [path], cache=tmp_path / "cache", times=1) == ["here"]  # it ended while they ran
    [verdict] = (tmp_path / "cache" / "encoders").glob("*.json")
    assert json.loads(verdict.read_text())["checked"]["probe texts"] > 1000


def test_dataloader_workers_of_a_first_process_run_the_checks_once(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    texts = list(make_texts(3000, seed=8))
    write_parts(tmp_path / "data", [{"text": texts}], row_group_size=100)
    _, path = saved(tmp_path, "workers")
    script = (
        "import json, os, sys\n"
        "from torch.utils.data import DataLoader\n"
        "from arrowstream import read_parquet\n"
        "from arrowstream.tokenize import encoders\n"
        "real, log = encoders.check_backends, sys.argv[3]\n"
        "def counted(*a, **k):\n"
        "    with open(log, 'a') as f: f.write(f'{os.getpid()}\\n')\n"
        "    return real(*a, **k)\n"
        "encoders.check_backends = counted\n"
        "from arrowstream.tokenize.encoders import Encoder\n"
        "def batches(backend):\n"
        "    enc = Encoder(sys.argv[2], backend=backend, sample_bytes=20000)\n"
        "    ds = read_parquet(sys.argv[1]).tokenize(enc).pack(seq_len=64, batch_size=4)\n"
        "    loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=2, multiprocessing_context='fork')\n"
        "    return [b['input_ids'].tolist() for b in loader]\n"
        "print(json.dumps({'auto': batches('auto'), 'reference': batches('tokenizers')}))\n"
    )
    env = dict(os.environ, ARROWSTREAM_CACHE_DIR=str(tmp_path / "cache"))
    log = tmp_path / "checks.log"
    got = json.loads(subprocess.run([sys.executable, "-c", script, str(tmp_path / "data"), str(path), str(log)],
                                    env=env, capture_output=True, text=True, check=True, timeout=300).stdout)
    assert got["auto"] == got["reference"] and len(got["auto"]) > 10
    assert len(log.read_text().split()) == 1  # one of the two workers checked; the other waited
