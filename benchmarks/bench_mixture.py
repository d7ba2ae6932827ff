#!/usr/bin/env python
"""What mixing costs: a mixture of three sources against the same tokens as one source.

Three corpora (the harness's seeded text, three seeds) are read either as one
pipeline over all three directories or as ``arrowstream.mix`` of the three,
weighted by their sizes, both packed with ``concat`` into the same batches
shape. Each run pulls the same number of batches from a fresh iterator in
this process (imports, tokenizer and encoder warm on both sides); the two
alternate, and the medians of ``--repeats`` runs give the ratio, twice: timed
from the iterator's creation (its start included: a mixture opens a pipeline
per source) and from the first batch on (the steady rate). Each repeat's
two runs, side by side, also give a ratio of their own: their median and
range show how far the machine's noise moves one comparison.

Two modes: ``text`` tokenizes as it reads (the tokenizer bounds both), and
``ids`` reads a token cache filled beforehand (the loader itself is measured).
Then, per strategy (``concat``, ``best_fit``), each source's share of the
real tokens after ``--batches`` batches, against its weight: the schedule
shares out rows, and padding is what separates rows from tokens.

Usage::

    python benchmarks/bench_mixture.py                 # 3 x 10 MB, 7 x 2 runs of 2,000 batches of 8 x 2048
    python benchmarks/bench_mixture.py --smoke         # seconds: checks only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import Checks, CheckFailed, corpus_dir, fmt_table, log, machine_facts, median, tokenizer_file

from arrowstream import mix, read_parquet


def _single(dirs: list[Path], tok: str, cache: Path | None, write: bool = False) -> Any:
    opts = {} if cache is None else {"cache": str(cache / "all"), "cache_write": write}
    return read_parquet([str(d) for d in dirs], num_epochs=None if not write else 1).tokenize(tok, **opts)


def _source(d: Path, i: int, tok: str, cache: Path | None, write: bool = False) -> Any:
    opts = {} if cache is None else {"cache": str(cache / f"s{i}"), "cache_write": write}  # one per source
    return read_parquet(str(d)).tokenize(tok, **opts)


def _mixture(dirs: list[Path], tok: str, cache: Path | None, weights: list[float]) -> Any:
    sources = {f"s{i}": _source(d, i, tok, cache) for i, d in enumerate(dirs)}
    return mix(sources, {f"s{i}": w for i, w in enumerate(weights)}, shuffle=False)


def _rate(it: Any, batches: int) -> tuple[tuple[float, float], list[Any]]:
    """Tokens per second over ``batches`` batches: the first one included, and from the first one on; the source ids."""
    start = time.perf_counter()
    tokens, kept = 0, []
    first_tokens = first_at = 0.0
    for k in range(batches):
        b = next(it)
        tokens += int(b["num_tokens"])
        kept.append(b.get("source_ids"))
        if k == 0:
            first_tokens, first_at = tokens, time.perf_counter()
    end = time.perf_counter()
    return (tokens / (end - start), (tokens - first_tokens) / (end - first_at)), kept


def _shares(dirs: list[Path], tok: str, weights: list[float], args: argparse.Namespace) -> dict[str, Any]:
    """Per strategy: each source's share of the real (unpadded) tokens minus its weight, after ``--batches`` batches."""
    out: dict[str, Any] = {}
    table = []
    for strategy in ("concat", "best_fit"):
        m = _mixture(dirs, tok, None, weights).pack(seq_len=args.seq_len, batch_size=args.batch_size, strategy=strategy)
        it = m.iter()
        for _ in range(args.batches):
            next(it)
        stats = it.stats
        real = sum(stats[f"s{i}.tokens"] for i in range(3))
        gaps = [stats[f"s{i}.tokens"] / real - w for i, w in enumerate(weights)]
        padding = stats["padding_tokens"] / (stats["tokens"] + stats["padding_tokens"])
        out[strategy] = {"share_minus_weight": gaps, "padding": padding}
        table.append([strategy, *(f"{100 * g:+.3f}" for g in gaps), f"{100 * padding:.2f}"])
        it.close()
    log()
    log(fmt_table(["strategy", "s0 share - weight (pp)", "s1", "s2", "padding %"], table))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="/tmp/arrowstream-bench", help="cache of corpora and tokenizers")
    p.add_argument("--mb", type=float, default=10.0, help="MB of text per source")
    p.add_argument("--batches", type=int, default=2000, help="batches per run")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--modes", default="text,ids", help="comma-separated: text, ids")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: run the checks in seconds")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if args.smoke:
        args.mb, args.batches, args.repeats, args.vocab, args.seq_len = 0.5, 20, 1, 2000, 256
    work = Path(args.workdir)
    checks = Checks()
    tok, _ = tokenizer_file(work, args.vocab)
    dirs = []
    for seed in (11, 12, 13):
        d, info = corpus_dir(work, args.mb, seed=seed, rows_per_group=500, mb_per_file=max(args.mb / 2, 0.25))
        dirs.append(d)
    sizes = [sum(f.stat().st_size for f in d.glob("*.parquet")) for d in dirs]
    weights = [s / sum(sizes) for s in sizes]
    results: dict[str, Any] = {"machine": machine_facts(), "args": vars(args), "weights": weights}
    rows = []
    for mode in args.modes.split(","):
        cache = None
        if mode == "ids":
            cache = work / "mixture-cache"
            fill = [_source(d, i, str(tok), cache, write=True) for i, d in enumerate(dirs)]
            for ds in [*fill, _single(dirs, str(tok), cache, write=True)]:  # fill the caches, outside the clock
                for _ in ds.pack(seq_len=args.seq_len, batch_size=64).iter():
                    pass
        single, mixed = [], []
        for r in range(args.repeats):
            order = ("single", "mixture") if r % 2 == 0 else ("mixture", "single")
            for name in order:
                if name == "single":
                    it = _single(dirs, str(tok), cache).pack(seq_len=args.seq_len, batch_size=args.batch_size).iter()
                    rate, _ = _rate(it, args.batches)
                    single.append(rate)
                else:
                    m = _mixture(dirs, str(tok), cache, weights).pack(seq_len=args.seq_len, batch_size=args.batch_size)
                    it = m.iter()
                    rate, ids = _rate(it, args.batches)
                    mixed.append(rate)
                    done = np.zeros(3)
                    worst = 0.0
                    for t, step in enumerate(ids):
                        done += np.bincount(step, minlength=3)
                        worst = max(worst, float(np.abs(done - (t + 1) * args.batch_size * np.array(weights)).max()))
                    results.setdefault("worst_share_error_rows", {})[mode] = worst
                it.close()
        for k, when in enumerate(("with the start", "from the first batch on")):
            one, mixture = median([r[k] for r in single]), median([r[k] for r in mixed])
            paired = sorted(m[k] / o[k] for m, o in zip(mixed, single))  # each repeat's two runs, side by side
            rows.append([mode, when, f"{one / 1e6:.2f}", f"{mixture / 1e6:.2f}", f"{mixture / one:.2f}",
                         f"{median(paired):.2f} ({paired[0]:.2f}-{paired[-1]:.2f})"])
            log(f"{mode}, {when}: one source {one / 1e6:.2f} M tok/s, mixture {mixture / 1e6:.2f} M tok/s, "
                f"ratio {mixture / one:.2f}, per repeat {median(paired):.2f} ({paired[0]:.2f}-{paired[-1]:.2f})")
            results.setdefault(mode, {})["paired_ratios" if k == 0 else "paired_steady_ratios"] = paired
        results[mode] = {
            **results.get(mode, {}),
            "single_tok_s": [r[0] for r in single], "mixture_tok_s": [r[0] for r in mixed],
            "ratio": median([r[0] for r in mixed]) / median([r[0] for r in single]),
            "single_steady_tok_s": [r[1] for r in single], "mixture_steady_tok_s": [r[1] for r in mixed],
            "steady_ratio": median([r[1] for r in mixed]) / median([r[1] for r in single]),
        }
    results["shares"] = _shares(dirs, str(tok), weights, args)
    log()
    log(fmt_table(["mode", "timed", "one source (M tok/s)", "mixture of 3 (M tok/s)", "mixture / one",
                   "per repeat: median (range)"], rows))
    log("(medians of runs alternating in one process; per repeat: the mixture's run over the one-source run beside it;"
        " weights by source size; concat)")
    try:
        for mode, worst in results.get("worst_share_error_rows", {}).items():
            # weights by size are not exact fractions: the schedule rounds them to its period
            checks(worst <= 1.5, f"{mode}: every step within a row or so of each share", f"worst {worst:.2f} rows")
    except CheckFailed:
        return 1
    finally:
        results["checks"] = checks.items
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    log("correctness checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
