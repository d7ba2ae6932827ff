"""The malloc settings that keep freed memory mapped: applied when an iterator starts, unless the user says not to."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from arrowstream.core import allocator
from arrowstream.testing.data import sample_tokenizer

from .conftest import write_parts

#: A child's set-up: the library, and glibc's ``mallinfo2`` to read what malloc holds.
_MALLINFO = """
import ctypes, sys
import numpy as np
from arrowstream import read_parquet
from arrowstream.core import allocator

class Info(ctypes.Structure):  # glibc's struct mallinfo2, the fields up to keepcost
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
"""

_CHILD = _MALLINFO + """
before = allocator._applied
it = read_parquet(sys.argv[1]).tokenize(None, column="ids", eos_id=0).pack(seq_len=8, batch_size=2).iter()
next(it)
# an 8 MiB array: from a mapping of its own by default (above the 128 KiB threshold), from the heap when set
base = libc.mallinfo2().hblkhd
a = np.ones(8 << 20, np.uint8)
print(before, allocator._applied, libc.mallinfo2().hblkhd - base)
"""


glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux") or not allocator._glibc(), reason="glibc only")


def run_child(code: str, tmp_path: Path, setting: str, arrow_pool: str = "") -> list[str]:
    """Run ``code`` over a small id dataset in a fresh process with ``ARROWSTREAM_MALLOC=setting``; return its words.

    ``arrow_pool``, when given, is the child's ``ARROW_DEFAULT_MEMORY_POOL``;
    otherwise the child has none.
    """
    write_parts(tmp_path / "data", [{"ids": [[1, 2, 3]] * 20}], row_group_size=5)
    env = {k: v for k, v in __import__("os").environ.items() if k != allocator.ARROW_POOL_ENV}
    env[allocator.ENV] = setting
    if arrow_pool:
        env[allocator.ARROW_POOL_ENV] = arrow_pool
    return subprocess.run([sys.executable, "-c", code, str(tmp_path / "data")], capture_output=True, text=True,
                          env=env, check=True, timeout=120).stdout.split()


@glibc_only
@pytest.mark.parametrize("setting", ["", "default"])
def test_an_iterator_start_keeps_freed_memory_unless_told_not_to(tmp_path: Path, setting: str) -> None:
    out = run_child(_CHILD, tmp_path, setting)
    before, after, mapped = out[0], out[1], int(out[2])
    assert before == "None"  # nothing at import: only an iterator's start applies it
    if setting == "default":
        assert after == "False"
        assert mapped >= 8 << 20  # glibc's default: a mapping of its own, handed back when freed
    else:
        assert after == "True"
        assert mapped == 0  # from the heap, whose pages stay mapped for the next batch


def test_the_setting_applies_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator, "_apply", lambda: calls.append(1) or True)
    assert allocator.keep_freed_memory() and allocator.keep_freed_memory()
    assert calls == [1]


_TRIM_CHILD = _MALLINFO + """
print(allocator.release_freed_memory())  # before any iterator: settings not applied, nothing done
it = read_parquet(sys.argv[1]).tokenize(None, column="ids", eos_id=0).pack(seq_len=8, batch_size=2).iter()
next(it)
a = np.ones(8 << 20, np.uint8)  # from the heap's top once the settings apply
del a
kept = libc.mallinfo2().keepcost  # the free memory at the top that malloc keeps
print(allocator.release_freed_memory(), kept, libc.mallinfo2().keepcost)
"""


@glibc_only
@pytest.mark.parametrize("setting", ["", "default"])
def test_release_hands_the_kept_pages_back_only_where_the_settings_apply(tmp_path: Path, setting: str) -> None:
    out = run_child(_TRIM_CHILD, tmp_path, setting)
    assert out[0] == "False"  # it never applies the settings itself
    released, kept, left = out[1] == "True", int(out[2]), int(out[3])
    if setting == "default":
        assert not released and kept < 1 << 20  # glibc's own trimming, nothing to hand back
    else:
        assert released
        assert kept >= 8 << 20  # the freed array stayed at the top of the heap, under the 16 MiB pad
        assert left < 1 << 20  # handed back


def wide_tokenizer_json(size: int) -> str:
    """A byte-level BPE of about ``size`` merges, each a random token joined to a byte symbol: a big tokenizer in 0.5 s."""
    spec = json.loads(sample_tokenizer(300).to_str())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    symbols = [t for t in vocab if len(t) == 1]
    tokens, rng = list(symbols), random.Random(0)
    while len(merges) < size:
        a, b = rng.choice(tokens), rng.choice(symbols)
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
            tokens.append(a + b)
            merges.append([a, b])
    return json.dumps(spec)


_PARSE_CHILD = """
import sys
from pathlib import Path
from arrowstream.tokenize import source

def pss_mb():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:")) / 1024

path = str(Path(sys.argv[1]).parent / "wide.json")
data = open(path, "rb").read()
before = pss_mb()
tokenizer = source._parse(path, data)
print(pss_mb() - before, tokenizer.get_vocab_size())
"""


def grown_by_setting(child: str, tmp_path: Path, merges: int) -> dict[str, float]:
    """MB the step of ``child`` grew a fresh process by, on a tokenizer of ``merges`` merges, tuned and with ``ARROWSTREAM_MALLOC=default``."""
    (tmp_path / "wide.json").write_text(wide_tokenizer_json(merges), encoding="utf-8")
    grown = {}
    for setting in ("", "default"):
        out = run_child(child, tmp_path, setting)
        assert int(out[1]) > merges  # the child's tokenizer has them all
        grown[setting] = float(out[0])
    return grown


@glibc_only
def test_parsing_a_tokenizer_hands_its_garbage_back_before_any_iterator(tmp_path: Path) -> None:
    grown = grown_by_setting(_PARSE_CHILD, tmp_path, 60_000)
    # measured: 21 against 52 MB (the parse's JSON and its garbage, scattered through the heap)
    assert grown["default"] > 30
    assert grown[""] < 0.6 * grown["default"]


def test_release_anytime_needs_only_glibc_and_no_opt_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "_applied", False)
    monkeypatch.delenv(allocator.ENV, raising=False)
    assert not allocator.release_freed_memory()
    assert allocator.release_freed_memory(anytime=True) == allocator._glibc()
    monkeypatch.setenv(allocator.ENV, "default")
    assert not allocator.release_freed_memory(anytime=True)


_POOL_CHILD = """
import sys
import pyarrow as pa
from arrowstream import read_parquet
before = pa.default_memory_pool().backend_name
it = read_parquet(sys.argv[1]).tokenize(None, column="ids", eos_id=0).pack(seq_len=8, batch_size=2).iter()
batch = next(it)
print(before, pa.default_memory_pool().backend_name, pa.table({"x": [1, 2]}).column("x").chunk(0).buffers()[1].size)
"""


@glibc_only
@pytest.mark.parametrize(
    ("setting", "arrow_pool", "after"),
    [("", "", "system"), ("default", "", "mimalloc"), ("", "mimalloc", "mimalloc"), ("", "jemalloc", "jemalloc")],
)
def test_an_iterator_start_makes_malloc_arrows_pool_unless_a_pool_was_chosen(
    tmp_path: Path, setting: str, arrow_pool: str, after: str
) -> None:
    out = run_child(_POOL_CHILD, tmp_path, setting, arrow_pool)
    # pyarrow's Linux wheels default to mimalloc, which held 30-40 MB more than malloc (core/allocator.py)
    assert out[0] == (arrow_pool or "mimalloc")
    assert out[1] == after
    assert int(out[2]) == 16  # Arrow allocates as before, from whichever pool


_TOKIE_BUILD_CHILD = """
import sys
from pathlib import Path
from arrowstream.tokenize import compiled, source

def pss_mb():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:")) / 1024

path = str(Path(sys.argv[1]).parent / "wide.json")
tokenizer = source._parse(path, open(path, "rb").read())
before = pss_mb()
built = compiled.load_tokie(tokenizer, "wide", None)  # no kept form: built from the JSON
print(pss_mb() - before, built.vocab_size)
"""


@glibc_only
@pytest.mark.tokie
def test_building_tokie_from_the_json_hands_its_garbage_back(tmp_path: Path) -> None:
    grown = grown_by_setting(_TOKIE_BUILD_CHILD, tmp_path, 120_000)
    # measured: 28 against 46 MB (tokie's encoder itself, and the build's garbage scattered through the heap)
    assert grown["default"] > 35
    assert grown["default"] - grown[""] > 10
