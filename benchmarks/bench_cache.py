#!/usr/bin/env python
"""The token cache: reading tokens back against tokenizing them, side by side.

On one corpus and tokenizer (cached in ``--workdir`` like ``bench_core.py``):

1. ``fill``: ``arrowstream cache``'s work, every row group tokenized (with the
   pipeline's encoder) and kept in a fresh cache directory.
2. Then, alternated, medians of ``--repeats`` full epochs of
   ``read_parquet(...).tokenize(tok[, cache=...]).pack(seq_len, batch_size)``:
   ``pipeline, tokenizing`` against ``pipeline, token cache``; and the raw
   ``tokenizers`` batch encoder over the same texts in memory (``raw encoder``).

Reported: tokens/s of each and the ratios ``token cache / tokenizing`` and
``token cache / raw encoder``, each against the bar of 10 (the tokenizing
pipeline uses the faster exact ``tiktoken`` encoder when it can, so it is the
harder of the two). Check: the cached pipeline
gives the same batches as the tokenizing one. ``--smoke`` uses a tiny corpus.
Exit status 0 when the check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from tokenizers import Tokenizer

import arrowstream
from bench_core import Checks, corpus_dir, fmt_table, log, median, tokenizer_file

BAR = 10.0


def epoch(ds: Any) -> tuple[float, int, list[bytes]]:
    t0 = time.perf_counter()
    tokens, heads = 0, []
    for b in ds:
        tokens += b["num_tokens"]
        if len(heads) < 5:
            heads.append(b["input_ids"].tobytes())
    return tokens / (time.perf_counter() - t0), tokens, heads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/arrowstream-bench"))
    p.add_argument("--mb", type=float, default=None, help="MB of text [85; smoke 2]")
    p.add_argument("--vocab-size", type=int, default=None, help="[32000; smoke 4096]")
    p.add_argument("--repeats", type=int, default=None, help="[3; smoke 1]")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    mb = args.mb or (2.0 if args.smoke else 85.0)
    vocab = args.vocab_size or (4096 if args.smoke else 32000)
    repeats = args.repeats or (1 if args.smoke else 3)
    checks = Checks()
    corpus, cinfo = corpus_dir(args.workdir, mb, seed=0, rows_per_group=1000, mb_per_file=64.0)
    tok_path, _ = tokenizer_file(args.workdir, vocab)
    cache = Path(tempfile.mkdtemp(prefix="arrowstream-cache-"))
    try:
        t0 = time.perf_counter()
        ds = arrowstream.read_parquet(corpus, columns=["text"]).tokenize(str(tok_path), cache=cache)
        reader = ds.make_reader()
        for shard in range(ds.manifest.num_shards):
            reader.read(shard)
        reader.close()
        fill_s = time.perf_counter() - t0
        size_mb = sum(f.stat().st_size for f in cache.rglob("*.ids")) / 1e6
        log(f"{cinfo['key']}: cache filled in {fill_s:.1f} s, {size_mb:.1f} MB on disk")
        tok = Tokenizer.from_file(str(tok_path))
        texts = [t for f in sorted(corpus.glob("*.parquet")) for t in pq.read_table(f, columns=["text"]).column("text").to_pylist() if t]
        runs: dict[str, list[float]] = {"raw encoder": [], "pipeline, tokenizing": [], "pipeline, token cache": []}
        heads: dict[str, list[bytes]] = {}
        for _ in range(repeats):
            t0 = time.perf_counter()
            n = sum(len(e.ids) for a in range(0, len(texts), 1000) for e in tok.encode_batch_fast(texts[a : a + 1000]))
            runs["raw encoder"].append(n / (time.perf_counter() - t0))
            for name, options in (("pipeline, tokenizing", {}), ("pipeline, token cache", {"cache": cache})):
                ds = arrowstream.read_parquet(corpus).tokenize(str(tok_path), **options).pack(seq_len=2048, batch_size=8)
                rate, _, heads[name] = epoch(ds)
                runs[name].append(rate)
        checks(heads["pipeline, tokenizing"] == heads["pipeline, token cache"], "the cached pipeline gives the same batches")
        med = {k: median(v) for k, v in runs.items()}
        rows = [[k, f"{v / 1e6:.2f}"] for k, v in med.items()]
        log(f"\nM tokens/s, medians of {repeats} (alternated):\n")
        log(fmt_table(["", "M tok/s"], rows))
        vs_pipe = med["pipeline, token cache"] / med["pipeline, tokenizing"]
        vs_raw = med["pipeline, token cache"] / med["raw encoder"]
        log(f"\ntoken cache / raw tokenizers encoder: {vs_raw:.1f} (bar {BAR:g}: {'MET' if vs_raw >= BAR else 'MISSED'}); "
            f"token cache / tokenizing pipeline: {vs_pipe:.1f} (bar {BAR:g}: {'MET' if vs_pipe >= BAR else 'MISSED'})")
        failed = [c for c in checks.items if not c["passed"]]
        log(f"\ncorrectness checks: {len(checks.items) - len(failed)} passed, {len(failed)} failed")
        if args.json:
            args.json.write_text(json.dumps({"corpus": cinfo, "fill_s": fill_s, "cache_mb": size_mb, "runs": runs,
                                             "ratio_vs_pipeline": vs_pipe, "ratio_vs_raw": vs_raw,
                                             "checks": checks.items}, indent=1))
        return 1 if failed else 0
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
