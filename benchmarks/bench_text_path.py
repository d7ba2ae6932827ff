#!/usr/bin/env python
"""The text path against its own encoder: does the pipeline keep up with the fastest backend?

Two kinds of fresh child process, alternated ``--repeats`` times, figures are medians:

- **pipeline**: ``read_parquet(corpus).tokenize(tokenizer_path).pack(seq_len, batch_size)``
  (``backend="auto"``, every other option at its default, no DataLoader
  workers) consuming every batch of one epoch. Timed from the
  ``read_parquet`` call to the last batch: the encoder's set-up, the reads,
  the encoding, packing and assembly are all inside the clock; the
  interpreter's start and the imports are not.
- **raw**: the same encoder the pipeline chose (:class:`arrowstream.tokenize.encoders.Encoder`
  with ``backend="auto"``: for tokie, its routing included) on the same
  documents, read into a list of ``str`` before the clock starts, in slices of
  1000 texts from one thread (tokie and the tokenizers library spread a call
  over the cores themselves). Its set-up is outside the clock.

Both count tokens their own way: the pipeline's include one EOS per document,
the raw encoder's none; the check below ties the two counts together. Each
child also reports the CPU time of its timed part (every thread), and the
table the cores it kept busy on average: where the encoder alone fills the
machine, the rest of the pipeline can only add to the time.

A first, untimed child fills the encoder's verdict cache (the per-user cache
directory), so every timed child is a second process, as in training (the
first process ever pays the proof, see ``bench_start.py``).

Bars (issue 19): the pipeline at least 12 M tokens/s, and at least 0.5 x the raw
encoder. Checks: both children chose the same backend, and the pipeline's
tokens are the raw encoder's plus one EOS per non-empty document.

    python benchmarks/bench_text_path.py                 # 85 MB, 5 repeats: about 1 min with tokie
    python benchmarks/bench_text_path.py --smoke         # 2 MB, vocab 4096, 1 repeat: a few seconds
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import CheckFailed, Checks, bar_word, corpus_dir, fmt_table, loadavg, log, median, tokenizer_file

BAR_TOKENS_PER_SECOND = 12e6
BAR_VS_RAW = 0.5
SLICE = 1000


def child_pipeline(corpus: str, tokenizer: str, seq_len: int, batch_size: int) -> dict[str, Any]:
    """Stream one epoch through the default text pipeline; return its tokens and seconds."""
    import arrowstream

    t0, c0 = time.perf_counter(), time.process_time()
    ds = arrowstream.read_parquet(corpus, num_epochs=1).tokenize(tokenizer).pack(seq_len=seq_len, batch_size=batch_size)
    it = ds.iter()
    first = None
    tokens = batches = 0
    for batch in it:
        if first is None:
            first = time.perf_counter() - t0
        tokens += batch["num_tokens"]
        batches += 1
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    stats = it.stats
    it.close()
    return {"tokens": tokens, "batches": batches, "seconds": seconds, "cpu_s": cpu, "first_batch_s": first,
            "docs": int(stats["docs"]), "backend": ds.stages[-1].backend}


def child_raw(corpus: str, tokenizer: str) -> dict[str, Any]:
    """Encode the corpus's texts, in memory, with the encoder ``auto`` picks; return tokens and seconds."""
    import pyarrow.parquet as pq

    from arrowstream.tokenize.encoders import Encoder

    texts: list[str] = []
    for path in sorted(Path(corpus).glob("*.parquet")):
        texts += [t for t in pq.read_table(path, columns=["text"]).column("text").to_pylist() if t]
    enc = Encoder(tokenizer)
    slices = [texts[i : i + SLICE] for i in range(0, len(texts), SLICE)]
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = sum(int(enc.encode(part)[1].sum()) for part in slices)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"tokens": tokens, "seconds": seconds, "cpu_s": cpu, "docs": len(texts), "backend": enc.backend}


def run_child(kind: str, corpus: Path, tokenizer: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, "--corpus", str(corpus), "--tokenizer", str(tokenizer),
           "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/arrowstream-bench"))
    p.add_argument("--mb", type=float, default=None, help="MB of text [85; smoke 2]")
    p.add_argument("--repeats", type=int, default=None, help="[5; smoke 1]")
    p.add_argument("--vocab-size", type=int, default=None, help="[32000; smoke 4096]")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--child", choices=["pipeline", "raw"], help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child == "pipeline":
        print(json.dumps(child_pipeline(args.corpus, args.tokenizer, args.seq_len, args.batch_size)))
        return 0
    if args.child == "raw":
        print(json.dumps(child_raw(args.corpus, args.tokenizer)))
        return 0
    mb = args.mb if args.mb is not None else (2.0 if args.smoke else 85.0)
    repeats = args.repeats if args.repeats is not None else (1 if args.smoke else 5)
    vocab = args.vocab_size if args.vocab_size is not None else (4096 if args.smoke else 32000)
    corpus, _ = corpus_dir(args.workdir, mb, seed=0, rows_per_group=1000, mb_per_file=64.0)
    tokenizer, _ = tokenizer_file(args.workdir, vocab)
    log(f"corpus {corpus.name}, tokenizer {tokenizer.name}, {repeats} repeats, load {loadavg()}")
    run_child("pipeline", corpus, tokenizer, args)  # fills the verdict cache: the timed children are second processes
    runs: dict[str, list[dict[str, Any]]] = {"pipeline": [], "raw": []}
    for r in range(repeats):
        for kind in ("pipeline", "raw") if r % 2 == 0 else ("raw", "pipeline"):
            got = run_child(kind, corpus, tokenizer, args)
            runs[kind].append(got)
            log(f"  repeat {r + 1} {kind:8} {got['tokens'] / got['seconds'] / 1e6:7.2f} M tok/s  ({got['seconds']:.3f} s)")
    rate = {k: median([g["tokens"] / g["seconds"] for g in v]) for k, v in runs.items()}
    pipe, raw = runs["pipeline"][0], runs["raw"][0]
    ratio = rate["pipeline"] / rate["raw"]
    cores = {k: median([g["cpu_s"] / g["seconds"] for g in v]) for k, v in runs.items()}
    cpu = {k: median([g["cpu_s"] for g in v]) for k, v in runs.items()}
    log("\n" + fmt_table(
        ["", "backend", "M tokens/s (median)", "tokens", "CPU s", "cores busy", "first batch s (median)"],
        [["pipeline, fresh process", pipe["backend"], f"{rate['pipeline'] / 1e6:.2f}", pipe["tokens"],
          f"{cpu['pipeline']:.2f}", f"{cores['pipeline']:.2f}",
          f"{median([g['first_batch_s'] for g in runs['pipeline']]):.3f}"],
         ["raw encoder, texts in memory", raw["backend"], f"{rate['raw'] / 1e6:.2f}", raw["tokens"],
          f"{cpu['raw']:.2f}", f"{cores['raw']:.2f}", ""]],
    ))
    met_abs = rate["pipeline"] >= BAR_TOKENS_PER_SECOND
    met_ratio = ratio >= BAR_VS_RAW
    log(f"\npipeline / raw encoder: {ratio:.2f} (bar {BAR_VS_RAW}: {bar_word(met_ratio)})")
    log(f"pipeline: {rate['pipeline'] / 1e6:.2f} M tokens/s (bar {BAR_TOKENS_PER_SECOND / 1e6:.0f}: {bar_word(met_abs)})")
    checks = Checks()
    try:
        checks(all(g["backend"] == raw["backend"] for v in runs.values() for g in v),
               "pipeline and raw encoder use the same backend", raw["backend"])
        checks(pipe["tokens"] == raw["tokens"] + raw["docs"],
               "pipeline tokens are the raw encoder's plus one EOS per document",
               f"{pipe['tokens']} = {raw['tokens']} + {raw['docs']}")
        status = 0
    except CheckFailed as exc:
        log(f"\nCHECK FAILED: {exc}")
        status = 1
    if args.json:
        args.json.write_text(json.dumps({
            "rates": rate, "ratio": ratio, "cpu_s": cpu, "cores_busy": cores, "bars": {"tokens_per_second": met_abs, "vs_raw": met_ratio},
            "runs": runs, "checks": checks.items, "loadavg_end": loadavg(),
            "args": {k: str(v) for k, v in vars(args).items()},
        }, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
