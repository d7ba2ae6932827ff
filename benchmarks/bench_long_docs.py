#!/usr/bin/env python
"""Does one very long document slow the stream, or swell its state?

Two corpora of token ids (so the tokenizer's time is left out and what is
measured is the loader's): ``--docs`` documents of heavy-tailed lengths, and
the same with one document of ``--long-tokens`` tokens in the middle. Each
strategy (``best_fit``, ``bucket`` with ``long_docs="split"``, ``concat``)
streams both corpora through ``StatefulLoader`` with ``--workers``
DataLoader workers (every batch crosses with the snapshot of its state) and
without workers, alternating, ``--repeats`` times. Reported: microseconds
per batch (medians) on each corpus and their ratio (1: the long document
costs no more per batch than any other), and the largest state seen while the
long document went out, in JSON bytes, and its ratio to the largest state on
the corpus without it.

Checks: every batch is the same with and without workers; each run's tokens
and padding add up to its rows times ``seq_len``; with the long document,
the tokens emitted grow by its tokens (plus its end-of-document token).
``--smoke`` runs a small case once. Exit status 0 when the checks pass.

Usage::

    python benchmarks/bench_long_docs.py                  # 4 M-token document, rows of 256
    python benchmarks/bench_long_docs.py --smoke
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from harness import Checks, fmt_table, log, machine_facts, median

STRATEGIES = ("best_fit", "bucket", "concat")


def write_corpus(root: Path, lengths: list[int], rows_per_group: int) -> None:
    """Write documents of ``lengths`` token ids (document ``i`` holds ``i + 1`` repeated) to ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    values = np.repeat(np.arange(1, len(lengths) + 1, dtype=np.int32), lengths)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    ids = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    pq.write_table(pa.table({"input_ids": ids}), root / "part-0.parquet", row_group_size=rows_per_group)


def pipeline(root: Path, strategy: str, args: argparse.Namespace) -> Any:
    from arrowstream import read_parquet

    ds = read_parquet(root).tokenize(None, column="input_ids", eos_id=0)
    if strategy == "bucket":
        return ds.bucket(max_tokens=args.batch_size * args.seq_len, max_len=args.seq_len, long_docs="split")
    return ds.pack(seq_len=args.seq_len, batch_size=args.batch_size, strategy=strategy)


def run(root: Path, strategy: str, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    """Stream once; return microseconds per batch, the largest state seen, the batches' digest and counts."""
    from arrowstream.pytorch import StatefulLoader

    loader = StatefulLoader(pipeline(root, strategy, args).to_torch(), num_workers=workers)
    import hashlib

    h = hashlib.sha256()
    n = tokens = slots = 0
    largest = 0
    start = time.perf_counter()
    for i, batch in enumerate(loader):
        n += 1
        ids = batch["input_ids"].numpy()
        h.update(ids.tobytes())
        tokens += int(batch["num_tokens"])
        slots += ids.size
        if i % args.state_every == 0:  # the state at checkpoints: its size, off the clock of the batches
            paused = time.perf_counter()
            largest = max(largest, len(json.dumps(loader.state_dict())))
            start += time.perf_counter() - paused
    seconds = time.perf_counter() - start
    return {"us": seconds / max(n, 1) * 1e6, "state": largest, "digest": h.hexdigest(), "batches": n,
            "tokens": tokens, "slots": slots}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=None, help="documents besides the long one [20000; smoke 2000]")
    p.add_argument("--long-tokens", type=int, default=None, help="the long document's tokens [4000000; smoke 200000]")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--state-every", type=int, default=50, help="take the state every this many batches [50]")
    p.add_argument("--repeats", type=int, default=None, help="[3; smoke 1]")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    docs = args.docs or (2000 if args.smoke else 20000)
    long_tokens = args.long_tokens or (200_000 if args.smoke else 4_000_000)
    repeats = args.repeats or (1 if args.smoke else 3)
    strategies = [s for s in args.strategies.split(",") if s]
    checks = Checks()

    rng = np.random.default_rng(0)
    lengths = [int(x) for x in np.minimum(rng.pareto(1.3, docs) * 60 + 1, 4 * args.seq_len)]
    with tempfile.TemporaryDirectory(prefix="arrowstream-long-docs-") as tmp:
        plain, long = Path(tmp) / "plain", Path(tmp) / "long"
        write_corpus(plain, lengths, rows_per_group=1000)
        write_corpus(long, lengths[: docs // 2] + [long_tokens] + lengths[docs // 2 :], rows_per_group=1000)
        log(f"{docs:,} documents ({sum(lengths):,} tokens), and the same with one of {long_tokens:,}; "
            f"rows of {args.seq_len}, batches of {args.batch_size}")
        rows, results = [], {}
        for strategy in strategies:
            got: dict[tuple[str, int], list[dict[str, Any]]] = {}
            for r in range(repeats):
                for corpus, root in ((("plain", plain), ("long", long)) if r % 2 == 0 else (("long", long), ("plain", plain))):
                    for workers in (args.workers, 0):
                        res = run(root, strategy, workers, args)
                        got.setdefault((corpus, workers), []).append(res)
                        log(f"  {strategy} {corpus} {workers} worker(s): {res['us']:.0f} us/batch, "
                            f"state up to {res['state']:,} bytes, {res['batches']} batches")
            for corpus in ("plain", "long"):
                a, b = got[(corpus, args.workers)][0], got[(corpus, 0)][0]
                checks(a["digest"] == b["digest"], f"{strategy} {corpus}: the same batches with and without workers")
                checks(a["tokens"] <= a["slots"], f"{strategy} {corpus}: tokens fit the rows")
            more = got[("long", 0)][0]["tokens"] - got[("plain", 0)][0]["tokens"]
            checks(more == long_tokens + 1, f"{strategy}: the long document's tokens all come out",
                   f"{more} more tokens, expected {long_tokens + 1}")
            for workers in (args.workers, 0):
                us = {c: median([x["us"] for x in got[(c, workers)]]) for c in ("plain", "long")}
                state = {c: max(x["state"] for x in got[(c, workers)]) for c in ("plain", "long")}
                results[f"{strategy}/{workers}"] = {"us": us, "state": state}
                rows.append([strategy, workers, f"{us['plain']:.0f}", f"{us['long']:.0f}",
                             f"{us['long'] / us['plain']:.2f}", f"{state['plain']:,}", f"{state['long']:,}",
                             f"{state['long'] / state['plain']:.2f}"])
    log()
    log(fmt_table(["strategy", "workers", "us/batch", "with the long doc", "ratio", "largest state, bytes",
                   "with the long doc", "ratio"], rows))
    log(f"\n(medians of {repeats}; the state taken every {args.state_every} batches)")
    failed = [c for c in checks.items if not c["passed"]]
    log(f"\ncorrectness checks: {len(checks.items) - len(failed)} passed, {len(failed)} failed")
    for c in failed:
        log(f"  FAILED {c['name']}: {c.get('detail', '')}")
    ok = not failed
    if args.json:
        args.json.write_text(json.dumps({"results": results, "docs": docs, "long_tokens": long_tokens,
                                         "seq_len": args.seq_len, "batch_size": args.batch_size,
                                         "machine": machine_facts(), "checks_passed": ok}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
