"""Shared harness of the arrowstream benchmark scripts.

Every script in ``benchmarks/`` (``bench_core.py``, ``bench_peers.py``,
``bench_cache.py`` ...) imports its common pieces from here, so they print,
check and describe the machine the same way and share one cache of inputs:

- output: :func:`log`, :func:`fmt_table` / :func:`md_table`, :func:`mtok`,
  :func:`bar_word`;
- figures: :func:`median`, peak resident set (:func:`peak_rss_kib`,
  :func:`peak_kib`), :func:`loadavg`;
- correctness: :class:`Checks`, whose failed check raises :class:`CheckFailed`
  (exit status 1 in every script);
- provenance: :func:`machine_facts` (versions, CPUs, memory, git commit);
- fair process starts: :func:`ensure_bytecode` (arrowstream's modules
  compiled, as an install from a wheel leaves them);
- inputs cached in a ``--workdir`` and keyed by everything that shapes them:
  :func:`corpus_dir` (a seeded Parquet corpus), :func:`tokenizer_file` (a
  trained BPE tokenizer) and :func:`tiktoken_file` (its tiktoken conversion).

Determinism: a corpus or tokenizer depends only on its key (size, seed,
layout, vocabulary, :data:`CORPUS_FORMAT`), so scripts and runs that ask for
the same key read the same bytes. Writers build under a per-process temporary
name and rename it into place, so an interrupted run never leaves a
half-written input under its key. Importing this module has no side effects.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tokenizers
from contestants import write_tiktoken
from tokenizers import Tokenizer

import arrowstream
from arrowstream.tokenize.bytelevel import to_bytelevel_bpe

# -- constants ----------------------------------------------------------------------

BYTES_PER_MB = 1_000_000  # corpus sizes are MB of (uncompressed UTF-8) text
CORPUS_FORMAT = 1  # bump to invalidate cached corpora when their layout changes
TOKENIZER_DOCS = 3000  # texts the tokenizer is trained on
TOKENIZER_SEED = 1234
EOS_TOKEN = "<|endoftext|>"


class CheckFailed(AssertionError):
    """A correctness check failed (exit status 1 in every benchmark script)."""


# -- output, figures and checks -----------------------------------------------------


def log(msg: str = "") -> None:
    """Print one line of the report at once (flushed, so a piped or ``nohup`` log keeps up).

    Parameters
    ----------
    msg
        The line to print; empty for a blank line.
    """
    print(msg, flush=True)


def median(values: list[float]) -> float:
    """Return the median of ``values`` as a float, NaN if there are none.

    Parameters
    ----------
    values
        Figures of the repeats of one measurement.

    Returns
    -------
    float
        Their median; ``nan`` for an empty list rather than an error, so a report
        still prints when a measurement produced no run.
    """
    return float(statistics.median(values)) if values else float("nan")


def peak_rss_kib() -> dict[str, int | None]:
    """Return this process's peak RSS in KiB, two ways.

    ``vmhwm`` is ``VmHWM`` from ``/proc/self/status`` (the high-water mark of
    this process image, reset by ``exec``). ``ru_maxrss`` is
    ``getrusage(RUSAGE_SELF).ru_maxrss``; on Linux the kernel folds the
    *parent's* peak into it when a child is spawned with (v)fork + exec, so a
    child started by a big parent reports at least the parent's peak. We
    therefore trust ``vmhwm`` when it exists.

    Returns
    -------
    dict
        ``ru_maxrss`` (always), ``vmhwm`` and ``vmrss`` (current RSS), the last
        two ``None`` where ``/proc`` is missing.
    """
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if sys.platform == "darwin":  # bytes there, KiB on Linux
        ru //= 1024
    out: dict[str, int | None] = {"ru_maxrss": int(ru), "vmhwm": None, "vmrss": None}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    out["vmhwm"] = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    out["vmrss"] = int(line.split()[1])
    except OSError:
        pass
    return out


def peak_kib(rss: dict[str, int | None]) -> int:
    """Return the trusted peak of a :func:`peak_rss_kib` result: ``vmhwm``, else ``ru_maxrss``.

    Parameters
    ----------
    rss
        A result of :func:`peak_rss_kib`, possibly read back from a child's JSON.

    Returns
    -------
    int
        Peak resident set in KiB.
    """
    return int(rss["vmhwm"] if rss["vmhwm"] is not None else rss["ru_maxrss"])


def loadavg() -> list[float] | None:
    """Return the 1, 5 and 15 minute load averages rounded to 0.01, ``None`` where unavailable.

    Reports print it next to timings so a busy machine explains noisy figures.
    """
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def fmt_table(headers: list[str], rows: list[list[Any]]) -> str:
    """Format rows as an aligned plain-text table for the console report.

    Parameters
    ----------
    headers
        Column titles.
    rows
        One list of cells per row (any values; printed with ``str``).

    Returns
    -------
    str
        The table indented by two spaces, a rule under the header, the first
        column left-aligned and the others right-aligned.
    """
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join("  " + line for line in lines)


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    """Format rows as a Markdown table, to paste into the docs.

    Parameters
    ----------
    headers
        Column titles.
    rows
        One list of cells per row (any values; printed with ``str``).

    Returns
    -------
    str
        The table with its header separator line.
    """
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def mtok(x: float) -> str:
    """Format a count or rate of tokens in millions with three decimals (``1234567`` -> ``"1.235"``)."""
    return f"{x / 1e6:.3f}"


def bar_word(met: bool) -> str:
    """Return the word a report prints for a bar: ``"MET"`` or ``"MISSED"``."""
    return "MET" if met else "MISSED"


class Checks:
    """Record correctness checks; a failed one raises :class:`CheckFailed`.

    Calling the instance runs one check: it appends ``{"name", "passed",
    "detail"}`` to :attr:`items` (which scripts write to their JSON), logs an
    ``ok`` or ``FAIL`` line, and raises on failure.

    Examples
    --------
    >>> checks = Checks()
    >>> checks(1 + 1 == 2, "arithmetic", "1 + 1")
      check ok   arithmetic (1 + 1)
    >>> checks.items[0]["passed"]
    True
    """

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def __call__(self, cond: bool, name: str, detail: str = "") -> None:
        self.items.append({"name": name, "passed": bool(cond), "detail": detail})
        log(f"  check {'ok  ' if cond else 'FAIL'} {name}" + (f" ({detail})" if detail else ""))
        if not cond:
            raise CheckFailed(f"{name}: {detail}")


def git_facts() -> dict[str, Any]:
    """Return the commit and local changes of the checkout arrowstream is imported from.

    Only read-only git calls; a missing git or a non-checkout gives ``None`` figures.

    Returns
    -------
    dict
        ``root`` (the checkout), ``commit`` (short hash or ``None``) and
        ``arrowstream_dirty`` (whether ``arrowstream/`` has uncommitted changes).
    """
    root = Path(arrowstream.__file__).resolve().parent.parent
    out: dict[str, Any] = {"root": str(root)}
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "arrowstream"],
                               capture_output=True, text=True, timeout=10)
        out["commit"] = head.stdout.strip() or None
        out["arrowstream_dirty"] = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        out["commit"] = None
    return out


def machine_facts() -> dict[str, Any]:
    """Describe the machine and versions a benchmark ran on, for its JSON report.

    Returns
    -------
    dict
        CPU count and affinity, total memory in MiB, platform and Python, the
        versions of arrowstream, pyarrow, tokenizers and numpy,
        :func:`git_facts`, the threading environment variables and the load
        average at start.
    """
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    mem_total = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_total = int(line.split()[1]) // 1024
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "mem_total_mib": mem_total,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "python_impl": platform.python_implementation(),
        "arrowstream": getattr(arrowstream, "__version__", "?"),
        "pyarrow": pa.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
        "git": git_facts(),
        "env": {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS", "OMP_NUM_THREADS")},
        "loadavg_start": loadavg(),
    }


def ensure_bytecode() -> dict[str, Any]:
    """Compile arrowstream's modules to bytecode where it is imported from, as ``pip install`` of a wheel does.

    A benchmark that times fresh processes from their start must not time
    Python compiling arrowstream's source: the peers, installed from wheels,
    have their bytecode, while an editable install (or an exported commit on
    ``PYTHONPATH``) under ``PYTHONDONTWRITEBYTECODE=1``, as on the machine of
    these figures, compiles about 90 modules in every process (0.09 s of the
    0.27 s ``import arrowstream`` took after ``import torch``). Called once by
    ``bench_start.py`` and ``bench_peers.py`` before their first child.

    Returns
    -------
    dict
        ``compiled`` (whether every module compiled or was up to date),
        ``package`` (the directory) and ``dont_write_bytecode`` (the
        environment's setting), for the JSON report.
    """
    import compileall

    package = Path(arrowstream.__file__).parent
    compiled = bool(compileall.compile_dir(str(package), quiet=1))
    return {"compiled": compiled, "package": str(package),
            "dont_write_bytecode": os.environ.get("PYTHONDONTWRITEBYTECODE")}


# -- corpora and tokenizer (cached in workdir) --------------------------------------


def corpus_dir(
    workdir: Path, size_mb: float, *, seed: int, rows_per_group: int, mb_per_file: float
) -> tuple[Path, dict[str, Any]]:
    """Return the directory of a cached corpus of ``size_mb`` MB of text, writing it if missing.

    The corpus is :func:`arrowstream.testing.data.write_dataset` output, keyed
    in ``workdir / "corpora"`` by its text bytes, seed, number of files, row
    group size and :data:`CORPUS_FORMAT`.

    Parameters
    ----------
    workdir
        The cache directory shared by the benchmark scripts.
    size_mb
        MB (10**6 bytes) of uncompressed UTF-8 text.
    seed
        Seed of the generated texts.
    rows_per_group
        Rows per Parquet row group.
    mb_per_file
        MB of text per Parquet file (at least 2 files are written).

    Returns
    -------
    tuple[Path, dict]
        The corpus directory and its description (rows, row groups, files,
        Parquet bytes, write time, and ``cached``: whether it already existed).
    """
    from arrowstream.testing import data as sample  # lazy: it imports polars, which children do not need

    num_files = max(2, math.ceil(size_mb / mb_per_file))
    target = int(round(size_mb * BYTES_PER_MB))
    key = f"text{target}B-seed{seed}-files{num_files}-rg{rows_per_group}-v{CORPUS_FORMAT}"
    out = workdir / "corpora" / key
    marker = out / "_bench_corpus.json"  # leading "_": hidden from read_parquet
    if marker.is_file():
        info = json.loads(marker.read_text())
        info["cached"] = True
        return out, info
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"  writing corpus {key} ({size_mb:g} MB of text, {num_files} files) ...")
    t0 = time.perf_counter()
    paths = sample.write_dataset(
        tmp,
        num_files=num_files,
        rows_per_group=rows_per_group,
        seed=seed,
        writer="pyarrow",
        target_bytes=target,
    )
    elapsed = time.perf_counter() - t0
    rows = groups = 0
    for p in paths:
        meta = pq.read_metadata(p)
        rows += meta.num_rows
        groups += meta.num_row_groups
    info = {
        "key": key,
        "size_mb": size_mb,
        "target_text_bytes": target,
        "seed": seed,
        "num_files": num_files,
        "rows_per_group": rows_per_group,
        "rows": rows,
        "row_groups": groups,
        "parquet_bytes": sum(p.stat().st_size for p in paths),
        "write_seconds": round(elapsed, 3),
    }
    (tmp / marker.name).write_text(json.dumps(info, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log(f"    done in {elapsed:.1f} s: {rows} rows, {groups} row groups, {info['parquet_bytes'] / 2**20:.1f} MiB on disk")
    info["cached"] = False
    return out, info


def tokenizer_file(workdir: Path, vocab_size: int) -> tuple[Path, dict[str, Any]]:
    """Return the path of the cached tokenizer JSON, training it if missing.

    A byte-level BPE trained on :data:`TOKENIZER_DOCS` texts of seed
    :data:`TOKENIZER_SEED`, with :data:`EOS_TOKEN`, kept in ``workdir / "tokenizers"``.

    Parameters
    ----------
    workdir
        The cache directory shared by the benchmark scripts.
    vocab_size
        Vocabulary size asked of the trainer (the result may be smaller).

    Returns
    -------
    tuple[Path, dict]
        The tokenizer JSON and its description (``vocab_size`` obtained,
        ``eos_id``, ``cached``, and ``train_seconds`` when it was trained now).
    """
    path = workdir / "tokenizers" / f"bpe-vocab{vocab_size}-docs{TOKENIZER_DOCS}-seed{TOKENIZER_SEED}.json"
    info: dict[str, Any] = {"path": str(path), "requested_vocab_size": vocab_size}
    if path.is_file():
        info["cached"] = True
    else:
        from arrowstream.testing import data as sample

        log(f"  training tokenizer (vocab {vocab_size}, {TOKENIZER_DOCS} texts) ...")
        t0 = time.perf_counter()
        tok = sample.train_tokenizer(
            sample.make_texts(TOKENIZER_DOCS, seed=TOKENIZER_SEED), vocab_size=vocab_size, eos_token=EOS_TOKEN
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
        tok.save(str(tmp))
        tmp.rename(path)
        info["cached"] = False
        info["train_seconds"] = round(time.perf_counter() - t0, 3)
    tok = Tokenizer.from_file(str(path))
    info["vocab_size"] = tok.get_vocab_size()
    info["eos_id"] = tok.token_to_id(EOS_TOKEN)
    return path, info


def add_corpus_options(p: argparse.ArgumentParser) -> None:
    """Add ``--workdir``, ``--mb`` and ``--vocab``: the cached corpus and tokenizer :func:`corpus_and_tokenizer` gives."""
    p.add_argument("--workdir", default="/tmp/arrowstream-bench", help="cache of corpora and tokenizers")
    p.add_argument("--mb", type=float, default=85.0, help="MB of text in the corpus")
    p.add_argument("--vocab", type=int, default=32000)


def corpus_and_tokenizer(args: argparse.Namespace, *, rows_per_group: int = 1000) -> tuple[str, str]:
    """Return the paths of the benchmark corpus (two files, ``rows_per_group``) and tokenizer of ``args``.

    ``args`` has the options of :func:`add_corpus_options`; both are made
    in ``args.workdir`` if missing (:func:`corpus_dir`, :func:`tokenizer_file`).
    """
    work = Path(args.workdir)
    tok, _ = tokenizer_file(work, args.vocab)
    corpus, _ = corpus_dir(work, args.mb, seed=0, rows_per_group=rows_per_group, mb_per_file=max(args.mb / 2, 0.25))
    return str(corpus), str(tok)


def tiktoken_file(workdir: Path, tok_path: Path) -> Path:
    """Return the path of the tokenizer converted to tiktoken (by arrowstream's conversion), writing it if missing.

    The raw tiktoken passes and the ``datasets`` pipeline with tiktoken load
    it with :func:`contestants.load_tiktoken`.

    Parameters
    ----------
    workdir
        The cache directory shared by the benchmark scripts (unused: the file
        sits next to ``tok_path``).
    tok_path
        A tokenizer JSON from :func:`tokenizer_file`.

    Returns
    -------
    Path
        ``<tok_path stem>.tiktoken.json`` next to ``tok_path``.
    """
    path = tok_path.with_name(tok_path.stem + ".tiktoken.json")
    if not path.is_file():
        write_tiktoken(to_bytelevel_bpe(Tokenizer.from_file(str(tok_path))), path)
    return path
