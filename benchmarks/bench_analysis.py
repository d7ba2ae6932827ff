#!/usr/bin/env python
"""Length analysis speed: characters of a large corpus, and tokens against the raw encoder.

1. Character and byte analysis (``arrowstream.analyze(path)``, no tokenizer)
   of a ``--chars-mb`` MB text corpus (1 GB by default), in a fresh child
   process each run: wall time (median of ``--repeats``) and the child's peak
   RSS. Bars: at most 10 s and under 1 GB.
2. Token analysis (``analyze(path, tokenizer=...)``) of a ``--tokens-mb`` MB
   corpus against the raw ``tokenizers`` batch encoder (``encode_batch_fast``
   over the same texts, fed from memory, slices of 1,000 texts), alternated,
   medians of ``--repeats``: the ratio of tokens/s shows the analysis is bound
   by the tokenizer. Check: both count the same tokens.

Corpora and tokenizers are cached in ``--workdir`` like ``bench_core.py``.
``--smoke`` uses tiny sizes. Exit status 0 when the checks pass, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from tokenizers import Tokenizer

from harness import Checks, corpus_dir, log, machine_facts, median, tokenizer_file

BAR_SECONDS = 10.0
BAR_RSS_MB = 1024.0


def child(path: str) -> None:
    import resource

    import arrowstream

    t0 = time.perf_counter()
    a = arrowstream.analyze(path)
    wall = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                peak_kib = int(line.split()[1])
    print(json.dumps({"wall_s": wall, "peak_mb": peak_kib / 1024, "num_docs": a.info["num_docs"]}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/arrowstream-bench"))
    p.add_argument("--chars-mb", type=float, default=None, help="[1000; smoke 5]")
    p.add_argument("--tokens-mb", type=float, default=None, help="[20; smoke 2]")
    p.add_argument("--vocab-size", type=int, default=None, help="[32000; smoke 4096]")
    p.add_argument("--repeats", type=int, default=None, help="[3; smoke 1]")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    chars_mb = args.chars_mb or (5.0 if args.smoke else 1000.0)
    tokens_mb = args.tokens_mb or (2.0 if args.smoke else 20.0)
    vocab = args.vocab_size or (4096 if args.smoke else 32000)
    repeats = args.repeats or (1 if args.smoke else 3)
    checks = Checks()
    log("machine: " + json.dumps(machine_facts()))
    big, big_info = corpus_dir(args.workdir, chars_mb, seed=0, rows_per_group=1000,
                               mb_per_file=64.0 if chars_mb > 100 else max(chars_mb / 2, 0.5))
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, __file__, "--child", str(big)], capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    checks(all(r["num_docs"] == big_info["rows"] for r in runs), "every document measured",
           f"{runs[0]['num_docs']} of {big_info['rows']}")
    wall = median([r["wall_s"] for r in runs])
    peak = max(r["peak_mb"] for r in runs)
    log(f"\ncharacter analysis of {chars_mb:g} MB of text ({big_info['rows']:,} documents): "
        f"{wall:.2f} s (bar {BAR_SECONDS:g} s: {'MET' if wall <= BAR_SECONDS else 'MISSED'}), "
        f"peak RSS {peak:.0f} MB (bar {BAR_RSS_MB:g} MB: {'MET' if peak < BAR_RSS_MB else 'MISSED'})")

    import arrowstream

    small, _ = corpus_dir(args.workdir, tokens_mb, seed=0, rows_per_group=1000, mb_per_file=64.0)
    tok_path, _ = tokenizer_file(args.workdir, vocab)
    tok = Tokenizer.from_file(str(tok_path))
    texts = [t for f in sorted(small.glob("*.parquet"))
             for t in pq.read_table(f, columns=["text"]).column("text").to_pylist() if t]
    raw, ours = [], []
    raw_tokens = ours_tokens = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        raw_tokens = sum(len(e.ids) for a in range(0, len(texts), 1000)
                         for e in tok.encode_batch_fast(texts[a : a + 1000]))
        raw.append(raw_tokens / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        a = arrowstream.analyze(small, tokenizer=tok, add_eos=False)
        ours_tokens = int(a.summary.filter(a.summary["measure"] == "tokens")["total"].item())
        ours.append(ours_tokens / (time.perf_counter() - t0))
    checks(raw_tokens == ours_tokens, "analysis counts the raw encoder's tokens", f"{ours_tokens} vs {raw_tokens}")
    ratio = median(ours) / median(raw)
    log(f"token analysis of {tokens_mb:g} MB: {median(ours) / 1e6:.3f} M tok/s, raw batch encoder "
        f"{median(raw) / 1e6:.3f} M tok/s, ratio {ratio:.2f} (medians of {repeats}, alternated)")
    failed = [c for c in checks.items if not c["passed"]]
    log(f"\ncorrectness checks: {len(checks.items) - len(failed)} passed, {len(failed)} failed")
    if args.json:
        result: dict[str, Any] = {
            "machine": machine_facts(), "chars": {"mb": chars_mb, "runs": runs, "wall_s": wall, "peak_mb": peak},
            "tokens": {"mb": tokens_mb, "ours_tok_per_s": ours, "raw_tok_per_s": raw, "ratio": ratio},
            "checks": checks.items,
        }
        args.json.write_text(json.dumps(result, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
