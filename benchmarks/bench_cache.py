#!/usr/bin/env python
"""The token cache: reading tokens back against tokenizing them, side by side.

On one corpus and tokenizer (cached in ``--workdir`` like ``bench_core.py``):

1. ``fill``: ``arrowstream cache``'s work, every row group tokenized (with the
   pipeline's encoder) and kept in a fresh cache directory.
2. Then, alternated, medians of ``--repeats`` full epochs of
   ``read_parquet(...).tokenize(tok[, cache=...]).pack(seq_len, batch_size)``,
   each in a fresh process (so no pass finds the encoder's conversion or
   checks done by an earlier one): ``pipeline, tokenizing`` (the default
   backend, tiktoken here) against ``pipeline, token cache``; and, in this
   process with a fresh encoder per pass, the raw encoders of
   :mod:`contestants` over the same texts in memory: ``tokenizers``
   (``encode_batch_fast``) and ``tiktoken-joined`` (the call the tokenizing
   pipeline's encoder makes).

Reported: tokens/s of each and the ratios ``token cache / tokenizing``,
``token cache / raw tiktoken`` (the encoder the tokenizing pipeline uses) and
``token cache / raw tokenizers``, each against the bar of 10. Check, on whole
streams (an untimed extra epoch of each pipeline hashes its real ids in order):
the cached pipeline gives exactly the tokenizing pipeline's stream, which is
the raw encoder's ids plus one EOS per document. ``--smoke`` uses a tiny
corpus. Exit status 0 when the checks pass, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import (
    Checks,
    corpus_dir,
    fmt_table,
    log,
    median,
    tiktoken_file,
    tokenizer_file,
)
from contestants import (
    StreamDigest,
    raw_count,
    raw_digest,
    raw_encoder,
    read_texts,
    real_ids,
)

import arrowstream
from arrowstream.pipeline.plan import Plan

BAR = 10.0
RESULT = "BENCH_CACHE_RESULT "
RAW = ("tokenizers", "tiktoken-joined")


def epoch(corpus: Path, tok_path: Path, cache: Path | None, digest: StreamDigest | None) -> dict[str, Any]:
    """Build the packed pipeline and run one epoch; time it unless it digests."""
    t0 = time.perf_counter()
    ds = arrowstream.read_parquet(corpus).tokenize(str(tok_path), cache=cache).pack(seq_len=2048, batch_size=8)
    tokens = 0
    for b in ds:
        tokens += b["num_tokens"]
        if digest is not None:
            digest.update(real_ids(b))
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "tok_per_s": tokens / wall, "digest": None if digest is None else digest.result()}


def child(args: argparse.Namespace) -> int:
    digest = StreamDigest(args.vocab) if args.digest else None
    out = epoch(Path(args.corpus), Path(args.tokenizer), Path(args.cache) if args.cache else None, digest)
    print(RESULT + json.dumps(out), flush=True)
    return 0


def run_epoch(corpus: Path, tok_path: Path, cache: Path | None, *, vocab: int = 0) -> dict[str, Any]:
    """Run one epoch in a fresh process (``vocab``: digest its stream, untimed)."""
    cmd = [sys.executable, __file__, "--child", "--corpus", str(corpus), "--tokenizer", str(tok_path)]
    cmd += ["--cache", str(cache)] if cache else []
    cmd += ["--digest", "--vocab", str(vocab)] if vocab else []
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"epoch child failed:\n{proc.stderr[-3000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT))
    return json.loads(line[len(RESULT):])


def fill(corpus: Path, tok_path: Path, cache: Path) -> float:
    """Tokenize every row group into the cache; return the seconds it took."""
    t0 = time.perf_counter()
    ds = arrowstream.read_parquet(corpus, columns=["text"]).tokenize(str(tok_path), cache=cache)
    reader = Plan.of(ds).make_reader()
    for shard in range(ds.manifest.num_shards):
        reader.read(shard)
    reader.close()
    return time.perf_counter() - t0


def raw_pass(method: str, tok_path: Path, tt_path: Path, texts: list[str]) -> float:
    """Time one raw encoder over the texts with a fresh encoder; return tokens/s."""
    encoder = raw_encoder(method, tok_path, tt_path)
    t0 = time.perf_counter()
    n = raw_count(method, encoder, texts)
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/arrowstream-bench"))
    p.add_argument("--mb", type=float, default=None, help="MB of text [85; smoke 2]")
    p.add_argument("--vocab-size", type=int, default=None, help="[32000; smoke 4096]")
    p.add_argument("--repeats", type=int, default=None, help="[3; smoke 1]")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--corpus", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", default=None, help=argparse.SUPPRESS)
    p.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    p.add_argument("--digest", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    mb = args.mb or (2.0 if args.smoke else 85.0)
    vocab = args.vocab_size or (4096 if args.smoke else 32000)
    repeats = args.repeats or (1 if args.smoke else 3)
    checks = Checks()
    corpus, cinfo = corpus_dir(args.workdir, mb, seed=0, rows_per_group=1000, mb_per_file=64.0)
    tok_path, tinfo = tokenizer_file(args.workdir, vocab)
    tt_path = tiktoken_file(args.workdir, tok_path)
    cache = Path(tempfile.mkdtemp(prefix="arrowstream-cache-"))
    try:
        fill_s = fill(corpus, tok_path, cache)
        size_mb = sum(f.stat().st_size for f in cache.rglob("*.ids")) / 1e6
        log(f"{cinfo['key']}: cache filled in {fill_s:.1f} s, {size_mb:.1f} MB on disk")
        texts = read_texts(corpus)
        names = {"raw tokenizers": None, "raw tiktoken-joined": None, "pipeline, tokenizing": None,
                 "pipeline, token cache": cache}
        runs: dict[str, list[float]] = {k: [] for k in names}
        for r in range(repeats):
            for name, where in names.items():
                if name.startswith("raw"):
                    runs[name].append(raw_pass(name[4:], tok_path, tt_path, texts))
                else:
                    runs[name].append(run_epoch(corpus, tok_path, where)["tok_per_s"])
                log(f"  run {r + 1}/{repeats}: {name:<24} {runs[name][-1] / 1e6:.2f} M tok/s")
        # The checks: untimed epochs that hash every real id in order.
        eos, size = tinfo["eos_id"], tinfo["vocab_size"]
        raw = raw_digest("tiktoken-joined", raw_encoder("tiktoken-joined", tok_path, tt_path), texts, eos, size)
        tokenizing = run_epoch(corpus, tok_path, None, vocab=size)["digest"]
        cached = run_epoch(corpus, tok_path, cache, vocab=size)["digest"]
        checks(cached["sha256"] == tokenizing["sha256"] and cached["tokens"] == tokenizing["tokens"],
               "the cached pipeline gives the tokenizing pipeline's whole stream",
               f"{cached['tokens']:,} tokens, sha256 {cached['sha256'][:12]}")
        checks(tokenizing["sha256"] == raw["sha256"] and tokenizing["tokens"] == raw["tokens"],
               "the tokenizing pipeline's stream is the raw encoder's ids plus one EOS per document",
               f"{raw['tokens']:,} tokens")
        med = {k: median(v) for k, v in runs.items()}
        rows = [[k, f"{v / 1e6:.2f}"] for k, v in med.items()]
        log(f"\nM tokens/s, medians of {repeats} (alternated):\n")
        log(fmt_table(["", "M tok/s"], rows))
        ratios = {
            "vs_pipeline": med["pipeline, token cache"] / med["pipeline, tokenizing"],
            "vs_raw_tiktoken": med["pipeline, token cache"] / med["raw tiktoken-joined"],
            "vs_raw": med["pipeline, token cache"] / med["raw tokenizers"],
        }
        words = {"vs_pipeline": "tokenizing pipeline", "vs_raw_tiktoken": "raw tiktoken encoder (the pipeline's)",
                 "vs_raw": "raw tokenizers encoder"}
        log("")
        for key, word in words.items():
            log(f"token cache / {word}: {ratios[key]:.1f} (bar {BAR:g}: {'MET' if ratios[key] >= BAR else 'MISSED'})")
        failed = [c for c in checks.items if not c["passed"]]
        log(f"\ncorrectness checks: {len(checks.items) - len(failed)} passed, {len(failed)} failed")
        if args.json:
            args.json.write_text(json.dumps({
                "corpus": cinfo, "fill_s": fill_s, "cache_mb": size_mb, "runs": runs, "medians": med,
                "ratio_vs_pipeline": ratios["vs_pipeline"], "ratio_vs_raw_tiktoken": ratios["vs_raw_tiktoken"],
                "ratio_vs_raw": ratios["vs_raw"], "stream_sha256": cached["sha256"], "checks": checks.items,
            }, indent=1))
        return 1 if failed else 0
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
