#!/usr/bin/env python
"""Encoder backends: tiktoken against `tokenizers`, raw and in the whole pipeline, same run.

For each tokenizer and its corpus (``--mb`` MB of text, read once into memory
for the raw passes):

- **raw tokenizers**: ``encode_batch`` and ``encode_batch_fast`` in slices of
  1000 texts (the tokenizer's own thread pool, both cores); the faster of the
  two is the *tokenizers ceiling*;
- **raw tiktoken**: :meth:`arrowstream.tokenize.encoders.Encoder.encode` (the tiktoken
  backend, ids mapped to the tokenizer's and flattened into numpy) on slices
  of 1000 texts, from one thread and from two threads;
- **pipeline**: ``read_parquet(dir).tokenize(...).pack(seq_len, batch_size)``
  consuming every batch, once with the default (``backend="auto"``) and once
  with ``Encoder(tok, backend="tokenizers")``.

Runs alternate (every method once per repeat) and the figures are medians.
Bars: raw tiktoken (two threads) >= 2.5 x the tokenizers ceiling, and the
auto pipeline >= 2 x the tokenizers ceiling. Checks: tiktoken's ids equal
``tokenizers``' on every document (zero differences), the auto pipeline
chose tiktoken, and both pipelines yield byte-identical batches.

Tokenizers: the 32k byte-level BPE of ``bench_core.py`` on its English-like
corpus (its text has few distinct words, so its real vocabulary is ~6,300),
and a 32k BPE trained on a generated corpus of ~200,000 distinct pseudo-words
(a full 32,000 vocabulary), on another corpus of the same generator.

    python benchmarks/bench_encoders.py --json encoders.json   # ~10 min on 2 cores
    python benchmarks/bench_encoders.py --smoke                # ~20 s
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tiktoken
from harness import (
    EOS_TOKEN,
    CheckFailed,
    Checks,
    corpus_dir,
    fmt_table,
    loadavg,
    log,
    median,
    mtok,
    tokenizer_file,
)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import arrowstream
from arrowstream.tokenize import tokie_backend
from arrowstream.tokenize.encoders import Encoder
from arrowstream.tokenize.tokie_backend import tokie_version

BAR_RAW = 2.5  # raw tiktoken (2 threads) / tokenizers ceiling
BAR_PIPELINE = 2.0  # auto pipeline / tokenizers ceiling
SLICE = 1000


def machine() -> dict[str, Any]:
    """The machine and versions (``harness.machine_facts`` without its git calls)."""
    import os
    import platform

    import tokenizers

    return {
        "cpu_count": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
        "arrowstream": arrowstream.__version__, "pyarrow": pa.__version__, "tokenizers": tokenizers.__version__,
        "tiktoken": tiktoken.__version__, "numpy": np.__version__, "loadavg_start": loadavg(),
    }


# -- a corpus with many distinct words ----------------------------------------------


def wordy_texts(num_docs: int, seed: int, *, num_words: int = 200_000) -> list[str]:
    """Generate documents over ``num_words`` pseudo-words with Zipf frequencies (seeded)."""
    lex_rng = np.random.default_rng(12345)  # one lexicon for every seed
    onsets = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
              "br", "cr", "dr", "fl", "gr", "pl", "pr", "sh", "st", "str", "th", "tr", "ch", "sp", "sk", "qu",
              "bl", "cl", "gl", "sl", "sm", "sn", "sw", "wh", "ph", "kn", "wr"]
    vowels = ["a", "e", "i", "o", "u", "y", "ai", "ea", "ee", "ie", "oo", "ou", "oa", "au", "ei"]
    codas = ["", "", "", "n", "r", "s", "t", "l", "m", "d", "ck", "ng", "nd", "st", "rt", "nt", "sh", "th", "x"]
    sizes = lex_rng.choice([1, 2, 3, 4], p=[0.3, 0.4, 0.22, 0.08], size=num_words)
    lexicon = sorted({
        "".join(onsets[lex_rng.integers(len(onsets))] + vowels[lex_rng.integers(len(vowels))]
                + codas[lex_rng.integers(len(codas))] for _ in range(k))
        for k in sizes
    })
    lex_rng.shuffle(lexicon)
    words = np.array(lexicon, dtype=object)
    p = 1.0 / (np.arange(words.size) + 2.7) ** 1.05
    p /= p.sum()
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(5.2, 0.9, size=num_docs).astype(int), 3, 20_000)
    picks = rng.choice(words.size, p=p, size=int(lengths.sum()))
    out = []
    start = 0
    for n in lengths:
        w = words[picks[start : start + n]].tolist()
        start += n
        for i in range(0, len(w), 14):
            w[i] = w[i].capitalize()
            if i:
                w[i - 1] += "." if i % 3 else ","
        if n > 20:
            w[int(n // 2)] += f" {int(rng.integers(1, 3000))}"
        out.append(" ".join(w) + ".")
    return out


def wordy_corpus(workdir: Path, mb: float, seed: int) -> Path:
    out = workdir / "corpora" / f"wordy{int(mb * 1e6)}B-seed{seed}"
    if (out / "_done.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    log(f"  writing the wordy corpus ({mb:g} MB) ...")
    texts: list[str] = []
    size = 0
    part = 0
    while size < mb * 1e6:
        batch = wordy_texts(500, seed * 1000 + part)
        texts += batch
        size += sum(len(t) for t in batch)
        part += 1
    pq.write_table(pa.table({"text": texts}), out / "part-0.parquet", row_group_size=1000)
    (out / "_done.json").write_text(json.dumps({"docs": len(texts), "bytes": size}))
    return out


def wordy_tokenizer(workdir: Path, vocab_size: int, mb: float) -> Path:
    path = workdir / "tokenizers" / f"wordy-bpe-vocab{vocab_size}-mb{mb:g}.json"
    if path.is_file():
        return path
    log(f"  training the wordy tokenizer (vocab {vocab_size}, {mb:g} MB) ...")
    texts: list[str] = []
    part = 0
    while sum(map(len, texts)) < mb * 1e6:
        texts += wordy_texts(500, 99_000 + part)
        part += 1
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


# -- measurements ----------------------------------------------------------------------


def read_texts(corpus: Path) -> list[str]:
    texts: list[str] = []
    for path in sorted(corpus.glob("*.parquet")):
        texts += [t for t in pq.read_table(path, columns=["text"]).column("text").to_pylist() if t]
    return texts


def timed(fn: Any) -> tuple[float, float, Any]:
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def raw_tokenizers(tok: Tokenizer, texts: list[str], method: str) -> int:
    encode = getattr(tok, method)
    return sum(sum(len(e) for e in encode(texts[i : i + SLICE])) for i in range(0, len(texts), SLICE))


def raw_tiktoken(enc: Encoder, texts: list[str], threads: int) -> int:
    slices = [texts[i : i + SLICE] for i in range(0, len(texts), SLICE)]
    if threads == 1:
        return sum(int(enc.encode(s)[1].sum()) for s in slices)
    with ThreadPoolExecutor(threads) as pool:
        return sum(int(lens.sum()) for _, lens in pool.map(enc.encode, slices))


def pipeline(corpus: Path, enc: Encoder, seq_len: int, batch_size: int, digest: bool) -> dict[str, Any]:
    ds = arrowstream.read_parquet(corpus).tokenize(enc).pack(seq_len=seq_len, batch_size=batch_size)
    h = hashlib.sha256()
    it = ds.iter()
    for batch in it:
        if digest:
            h.update(batch["input_ids"].tobytes())
            h.update(batch["segment_ids"].tobytes())
    stats = it.stats
    it.close()
    return {"tokens": int(stats["tokens"]), "docs": int(stats["docs"]), "digest": h.hexdigest() if digest else None,
            "backend": ds.stages[-1].backend}


def differences(tok: Tokenizer, enc: Encoder, texts: list[str]) -> int:
    """Count documents whose tiktoken ids differ from tokenizers' (every document)."""
    bad = 0
    for i in range(0, len(texts), SLICE):
        part = texts[i : i + SLICE]
        flat, lens = enc.encode(part)
        want = tok.encode_batch_fast(part)
        got = np.split(flat, np.cumsum(lens)[:-1])
        bad += sum(1 for g, w in zip(got, want) if not np.array_equal(g, np.asarray(w.ids, dtype=np.int32)))
    return bad


def measure(name: str, corpus: Path, tok_path: Path, args: argparse.Namespace, checks: Checks) -> dict[str, Any]:
    tok = Tokenizer.from_file(str(tok_path))
    texts = read_texts(corpus)
    text_bytes = sum(len(t.encode()) for t in texts)
    fast = Encoder(tok, backend="tiktoken", sample_bytes=0)
    checks(fast.backend == "tiktoken", f"{name}: the tokenizer converts and passes the built-in checks", fast.reason)
    quick = Encoder(tok, sample_bytes=0)  # auto: tokie (texts it splits differently routed to tiktoken) when installed
    expected = "tokie" if tokie_version() is not None else "tiktoken"
    slow = Encoder(tok, backend="tokenizers")
    log(f"\n[{name}] {len(texts)} docs, {text_bytes / 1e6:.1f} MB of text, vocabulary {tok.get_vocab_size()}")
    log(f"  encoder: {fast.reason}")
    log(f"  auto encoder: {quick.backend}: {quick.reason}")
    bad = differences(tok, fast, texts)
    checks(bad == 0, f"{name}: tiktoken ids == tokenizers ids on every document", f"{bad} of {len(texts)} differ")
    bad_auto = differences(tok, quick, texts)
    checks(bad_auto == 0, f"{name}: {quick.backend} ids == tokenizers ids on every document", f"{bad_auto} of {len(texts)} differ")
    routed = len(tokie_backend.routed(texts))
    log(f"  documents routed away from tokie: {routed} of {len(texts)}")

    # Warm-up (not timed): thread pools, caches, imports.
    tok.encode_batch_fast(texts[:SLICE])
    fast.encode(texts[:SLICE])
    quick.encode(texts[:SLICE])
    next(iter(arrowstream.read_parquet(corpus).tokenize(fast).pack(seq_len=args.seq_len, batch_size=args.batch_size)))

    methods = {
        "tokenizers encode_batch": lambda: raw_tokenizers(tok, texts, "encode_batch"),
        "tokenizers encode_batch_fast": lambda: raw_tokenizers(tok, texts, "encode_batch_fast"),
        "tiktoken Encoder.encode, 1 thread": lambda: raw_tiktoken(fast, texts, 1),
        "tiktoken Encoder.encode, 2 threads": lambda: raw_tiktoken(fast, texts, 2),
        f"{quick.backend} Encoder.encode (auto), 1 thread": lambda: raw_tiktoken(quick, texts, 1),
        "pipeline, backend auto": lambda: pipeline(corpus, Encoder(tok), args.seq_len, args.batch_size, digest=True),
        "pipeline, backend tokenizers": lambda: pipeline(corpus, slow, args.seq_len, args.batch_size, digest=True),
    }
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for r in range(args.repeats):
        order = list(methods)
        order = order[r % len(order):] + order[: r % len(order)]
        for method in order:
            wall, cpu, out = timed(methods[method])
            tokens = out["tokens"] if isinstance(out, dict) else out
            runs[method].append({"wall_s": wall, "cpu_s": cpu, "tokens": tokens, "tok_per_s": tokens / wall,
                                 "loadavg": loadavg(), **(out if isinstance(out, dict) else {})})
            log(f"  repeat {r + 1}/{args.repeats}  {method:<36} {mtok(tokens / wall)} M tok/s  ({wall:.2f} s)")

    raw_counts = {runs[m][0]["tokens"] for m in list(methods)[:5]}
    checks(len(raw_counts) == 1, f"{name}: every raw method counts the same tokens", str(raw_counts))
    auto, slow_runs = runs["pipeline, backend auto"], runs["pipeline, backend tokenizers"]
    checks(all(r["backend"] == expected for r in auto), f"{name}: the auto pipeline uses {expected}")
    checks({r["digest"] for r in auto} == {r["digest"] for r in slow_runs} and len({r["digest"] for r in auto}) == 1,
           f"{name}: both backends yield byte-identical batches")
    checks(auto[0]["tokens"] == raw_counts.copy().pop() + auto[0]["docs"],
           f"{name}: pipeline tokens == raw tokens + one EOS per document")
    med = {m: median([r["tok_per_s"] for r in rs]) for m, rs in runs.items()}
    ceiling = max(med["tokenizers encode_batch"], med["tokenizers encode_batch_fast"])
    raw_ratio = med["tiktoken Encoder.encode, 2 threads"] / ceiling
    pipe_ratio = med["pipeline, backend auto"] / ceiling
    rows = [[m, mtok(med[m]), f"{med[m] / ceiling:.2f}", " ".join(mtok(r["tok_per_s"]) for r in runs[m])] for m in methods]
    log(fmt_table(["method", "median M tok/s", "x ceiling", "per run"], rows))
    log(f"  raw tiktoken (2 threads) / tokenizers ceiling = {raw_ratio:.2f}  (bar {BAR_RAW}: {'MET' if raw_ratio >= BAR_RAW else 'MISSED'})")
    log(f"  auto pipeline / tokenizers ceiling = {pipe_ratio:.2f}  (bar {BAR_PIPELINE}: {'MET' if pipe_ratio >= BAR_PIPELINE else 'MISSED'})")
    return {
        "corpus": str(corpus), "tokenizer": str(tok_path), "vocab_size": tok.get_vocab_size(), "docs": len(texts),
        "text_bytes": text_bytes, "encoder": fast.describe(), "auto_encoder": quick.describe(),
        "id_differences": bad, "auto_id_differences": bad_auto, "routed_docs": routed, "runs": runs,
        "median_tok_per_s": med, "tokenizers_ceiling": ceiling, "raw_ratio": raw_ratio, "pipeline_ratio": pipe_ratio,
        "bars_met": {"raw": raw_ratio >= BAR_RAW, "pipeline": pipe_ratio >= BAR_PIPELINE},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/arrowstream-bench"))
    p.add_argument("--mb", type=float, default=None, help="MB of text per corpus [85; smoke 2]")
    p.add_argument("--repeats", type=int, default=None, help="[3; smoke 1]")
    p.add_argument("--vocab-size", type=int, default=None, help="[32000; smoke 4096]")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--only", default="sample,wordy", help="comma list: sample (bench_core's), wordy")
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    mb = args.mb if args.mb is not None else (2.0 if args.smoke else 85.0)
    args.repeats = args.repeats if args.repeats is not None else (1 if args.smoke else 3)
    vocab = args.vocab_size if args.vocab_size is not None else (4096 if args.smoke else 32000)
    checks = Checks()
    facts = machine()
    log("machine: " + json.dumps(facts))
    results: dict[str, Any] = {}
    try:
        if "sample" in args.only:
            corpus, _ = corpus_dir(args.workdir, mb, seed=0, rows_per_group=1000, mb_per_file=64.0)
            tok_path, _ = tokenizer_file(args.workdir, vocab)
            results["sample"] = measure("sample", corpus, tok_path, args, checks)
        if "wordy" in args.only:
            wordy_mb = min(mb, 40.0)
            tok_path = wordy_tokenizer(args.workdir, vocab, 1.0 if args.smoke else 15.0)
            results["wordy"] = measure("wordy", wordy_corpus(args.workdir, wordy_mb, seed=1), tok_path, args, checks)
    except CheckFailed as exc:
        log(f"\nCHECK FAILED: {exc}")
        status = 1
    else:
        status = 0
    passed = sum(c["passed"] for c in checks.items)
    log(f"\ncorrectness checks: {passed} passed, {len(checks.items) - passed} failed")
    if args.json:
        args.json.write_text(json.dumps({"machine": facts, "args": {k: str(v) for k, v in vars(args).items()},
                                         "results": results, "checks": checks.items, "loadavg_end": loadavg()},
                                        indent=1, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main())
