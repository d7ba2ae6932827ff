#!/usr/bin/env python
"""Even batches on a text corpus: what the estimate drops and pads, and what counting costs.

Every rank of a run emits the same number of batches per epoch (with
DataLoader workers, estimated: every worker the same; counted: the rank's
total, its workers ending when their data does). Over text the number is estimated, and a consumer with data
beyond it drops the rest (counted, with a warning); a length index or a
complete read-only token cache lets it be counted instead (nothing dropped,
at most one padding batch per rank: ``concat``'s shares are whole batches of
tokens). This script runs all consumers of one epoch, one after the other in
this process (each reads only its share, so together they make one pass),
the three ways, and prints per epoch:

- the share of the corpus's tokens dropped and the padding, against the
  tokens emitted;
- the padding batches, most of one consumer and most of one rank (its
  workers together);
- the time to build the length index and to fill the token cache (what
  counting costs up front) against one tokenizing pass, all measured here;
- the same for ``best_fit`` over the index, whose batch counts come from
  running the packer over every share's document lengths, and the time one
  process spends on that at the start of an epoch.

Run: ``python benchmarks/bench_balance.py`` (about 1 GB: several minutes on 2
cores); ``--size-mb 100`` for a quicker look; ``--smoke`` for a tiny corpus.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from harness import (
    CheckFailed,
    Checks,
    corpus_dir,
    fmt_table,
    log,
    machine_facts,
    tokenizer_file,
)


def run_epoch(ds: Any, world: int, workers: int) -> dict[str, Any]:
    """Run every consumer's share of one epoch; return the totals and per-consumer counts."""
    from arrowstream import DataLossWarning

    totals = dict.fromkeys(
        ("tokens", "padding_tokens", "dropped_tokens", "dropped_docs", "carried_tokens", "carried_docs", "docs", "rows"), 0
    )
    counts, padding_batches = [], []
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataLossWarning)  # counted below
        for rank in range(world):
            for worker in range(workers):
                it = ds.iter(rank=rank, world_size=world, worker=worker, num_workers=workers)
                counts.append(sum(1 for _ in it))
                stats = it.stats
                for key in totals:
                    totals[key] += int(stats.get(key, 0))
                padding_batches.append(int(stats.get("padding_batches", 0)))
                it.close()
    per_rank = [sum(padding_batches[r * workers : (r + 1) * workers]) for r in range(world)]
    rank_batches = [sum(counts[r * workers : (r + 1) * workers]) for r in range(world)]
    return {
        **totals,
        "seconds": time.perf_counter() - t0,
        "batches_per_consumer": sorted(set(counts)),
        "batches_per_rank": sorted(set(rank_batches)),
        "padding_batches": padding_batches,
        "padding_batches_per_rank": per_rank,
        "balance": ds.balance,
    }


def parse_args(argv: list[str] | None, doc: str, size_mb: float, smoke_mb: float) -> argparse.Namespace:
    """Return the options both even-batches benchmarks take (``--smoke``: a tiny corpus, small batches)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "arrowstream-bench")
    parser.add_argument("--size-mb", type=float, default=size_mb, help=f"MB of text [{size_mb:g}; smoke {smoke_mb:g}]")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--smoke", action="store_true", help="a tiny corpus, small batches")
    args = parser.parse_args(argv)
    if args.smoke:
        args.size_mb, args.seq_len, args.batch_size, args.vocab_size = smoke_mb, 512, 4, 4000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, 1000.0, 5.0)
    from arrowstream import build_length_index, read_parquet
    from arrowstream.pipeline.plan import Plan

    checks = Checks()
    corpus, info = corpus_dir(args.workdir, args.size_mb, seed=0, rows_per_group=1000, mb_per_file=125)
    tok_path, _ = tokenizer_file(args.workdir, args.vocab_size)
    log(f"corpus {corpus} ({info['rows']:,} rows, {info['row_groups']} row groups); "
        f"{args.ranks} ranks x {args.workers} workers, concat {args.seq_len} x {args.batch_size}")
    cache = Path(tempfile.mkdtemp(prefix="arrowstream-balance-cache-"))
    index = Path(tempfile.mkdtemp(prefix="arrowstream-balance-index-"))
    pack = {"seq_len": args.seq_len, "batch_size": args.batch_size}
    try:
        # one tokenizing pass, all consumers: the estimated mode (no index: it is kept elsewhere)
        estimated = run_epoch(read_parquet(corpus).tokenize(str(tok_path)).pack(**pack), args.ranks, args.workers)
        # building the length index, then a tokenizing pass split by exact counts
        t0 = time.perf_counter()
        build_length_index(corpus, str(tok_path), length_index=index)
        index_s = time.perf_counter() - t0
        indexed_ds = read_parquet(corpus).tokenize(str(tok_path), length_index=index).pack(**pack)
        indexed = run_epoch(indexed_ds, args.ranks, args.workers)
        # best_fit over the same index: batch counts from running the packer over every share's lengths
        best_fit_ds = read_parquet(corpus).tokenize(str(tok_path), length_index=index).pack(
            strategy="best_fit", **pack
        )
        t0 = time.perf_counter()
        best_fit_ds.iter(rank=0, world_size=args.ranks, worker=0, num_workers=args.workers).close()
        count_s = time.perf_counter() - t0  # what one process spends counting every share's batches
        best_fit = run_epoch(best_fit_ds, args.ranks, args.workers)
        # filling the token cache (what counting needs first), then the counted mode
        t0 = time.perf_counter()
        for _ in read_parquet(corpus).tokenize(str(tok_path), cache=cache):
            pass
        fill_s = time.perf_counter() - t0
        counted_ds = read_parquet(corpus).tokenize(str(tok_path), cache=cache, cache_write=False).pack(**pack)
        counted = run_epoch(counted_ds, args.ranks, args.workers)
        counts = Plan.of(counted_ds).token_counts
        assert counts is not None
        longest = max(int(counts.lengths(shard).max(initial=0)) for shard in range(counted_ds.manifest.num_shards))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(index, ignore_errors=True)

    corpus_tokens = estimated["tokens"] + estimated["dropped_tokens"]
    rows = []
    modes = (
        ("estimated (text)", estimated),
        ("counted (length index)", indexed),
        ("counted (read-only token cache)", counted),
        ("counted (length index), best_fit", best_fit),
    )
    for name, res in modes:
        rows.append([
            name,
            f"{res['dropped_tokens'] / corpus_tokens:.3%}",
            f"{res['dropped_docs']:,}",
            f"{res['padding_tokens'] / max(res['tokens'], 1):.3%}",
            f"{max(res['padding_batches'])}",
            f"{max(res['padding_batches_per_rank'])}",
            ",".join(map(str, res["batches_per_rank"])),
            ",".join(map(str, res["batches_per_consumer"])),
        ])
    print()
    print(fmt_table(
        ["mode", "tokens dropped", "documents dropped", "padding / tokens emitted", "padding batches (max per consumer)",
         "padding batches (max per rank)", "batches per rank", "batches per consumer"],
        rows,
    ))
    one_pass = estimated["seconds"]
    print(f"\ncorpus: {corpus_tokens:,} tokens with EOS; one tokenizing pass (all consumers) {one_pass:.1f} s; "
          f"building the length index {index_s:.1f} s ({index_s / one_pass:.2f} x the pass); "
          f"filling the token cache {fill_s:.1f} s ({fill_s / one_pass:.2f} x the pass)")
    print(f"best_fit: counting every share's batches (the packer run over the lengths) took {count_s:.1f} s "
          f"in one process, once per epoch ({count_s / one_pass:.2f} x the pass)")
    for name, res in modes:
        print(f"{name}: balance {res['balance']!r}")
    failed = None
    try:
        checks(len(estimated["batches_per_rank"]) == 1, "estimated: every rank emits the same batches",
               str(estimated["batches_per_rank"]))
        # counted concat deals shares of whole batches: a rank pads one batch at most, whatever the lengths
        for name, res in modes[1:]:
            checks(len(res["batches_per_rank"]) == 1, f"{name}: every rank emits the same batches",
                   str(res["batches_per_rank"]))
            checks(res["dropped_tokens"] == 0, f"{name}: nothing dropped", str(res["dropped_tokens"]))
            if res is best_fit:  # its batch counts follow the packing, not the tokens: no padding bound
                continue
            checks(max(res["padding_batches_per_rank"]) <= 1,
                   f"{name}: at most 1 padding batch per rank (longest document {longest:,} tokens)",
                   str(res["padding_batches_per_rank"]))
            checks(res["tokens"] == corpus_tokens, f"{name}: every token of the corpus emitted",
                   f"{res['tokens']} vs {corpus_tokens}")
    except CheckFailed as exc:
        failed = exc
    if args.json:
        args.json.write_text(json.dumps({
            "args": {k: str(v) for k, v in vars(args).items()}, "machine": machine_facts(), "corpus": info,
            "estimated": estimated, "indexed": indexed, "counted": counted, "best_fit": best_fit,
            "fill_s": fill_s, "index_s": index_s, "count_s": count_s,
            "longest_document": longest,
            "checks": checks.items,
        }, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
