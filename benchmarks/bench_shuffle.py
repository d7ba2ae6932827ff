"""Shuffle quality: arrowstream's windowed shuffle vs a shard-order shuffle and a shuffle buffer.

All three hold about the same number of rows in memory: ``window`` row groups.
For each order the script prints, per epoch (medians over epochs):

- position correlation (output index vs input position; 0 is best),
- source imbalance (mean total-variation distance between the file mix of each
  run of ``--run`` consecutive documents and the whole epoch's; 0 is best),
- the state a resume needs (arrowstream: coordinates; a shuffle buffer: every
  buffered row, or it loses them).

Usage: ``python benchmarks/bench_shuffle.py [--files 8] [--groups 10] [--rows 500]
[--window 8] [--epochs 3] [--run 1000] [--json OUT]``. It also asserts one
correctness fact: every arrowstream epoch emits every document exactly once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import arrowstream
from arrowstream.io.layout import permutation
from arrowstream.analysis.quality import shuffle_report


def write_corpus(root: Path, files: int, groups: int, rows: int) -> int:
    n = files * groups * rows
    ids = np.arange(n, dtype=np.int64)
    per_file = groups * rows
    for f in range(files):
        part = ids[f * per_file : (f + 1) * per_file]
        pq.write_table(pa.table({"id": part}), root / f"part-{f:03d}.parquet", row_group_size=rows)
    return n


def arrowstream_orders(
    root: Path, epochs: int, window: int, seed: int, fragments: int
) -> list[np.ndarray]:
    ds = arrowstream.read_parquet(root, num_epochs=epochs).shuffle(
        seed=seed, window=window, fragments=fragments
    )
    it = ds.iter()
    out: dict[int, list[np.ndarray]] = {}
    for batch in it:
        epoch = it.state_dict()["position"]["epoch"]
        out.setdefault(epoch, []).append(batch.column("id").to_numpy())
    return [np.concatenate(out[e]) for e in sorted(out)]


def shard_order(n_groups: int, rows: int, epoch: int, seed: int) -> np.ndarray:
    groups = permutation(n_groups, seed, epoch, 99)
    return (groups[:, None] * rows + np.arange(rows)[None, :]).ravel()


def buffer_shuffle(stream: np.ndarray, capacity: int, epoch: int, seed: int) -> np.ndarray:
    """A classic shuffle buffer: fill it, then emit a random element per incoming one."""
    rng = np.random.default_rng([seed, epoch, 7])
    buf = list(stream[:capacity])
    out = []
    for x in stream[capacity:]:
        i = int(rng.integers(len(buf)))
        out.append(buf[i])
        buf[i] = x
    rng.shuffle(buf)
    out.extend(buf)
    return np.asarray(out, dtype=np.int64)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--groups", type=int, default=10, help="row groups per file")
    p.add_argument("--rows", type=int, default=500, help="rows per row group")
    p.add_argument("--window", type=int, default=8, help="row groups held in memory")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--run", type=int, default=1000, help="documents per run for source imbalance")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        n = write_corpus(root, args.files, args.groups, args.rows)
        per_file = args.groups * args.rows
        n_groups = args.files * args.groups
        ours = {
            m: arrowstream_orders(root, args.epochs, args.window, args.seed, m) for m in (1, 2, 4)
        }
    for per_epoch in ours.values():
        for order in per_epoch:
            assert np.array_equal(np.sort(order), np.arange(n)), "an epoch lost or repeated documents"
    capacity = args.window * args.rows
    orders = {
        "read in order (no shuffle)": [np.arange(n)] * args.epochs,
        "shard-order shuffle": [shard_order(n_groups, args.rows, e, args.seed) for e in range(args.epochs)],
        f"shuffle buffer of {capacity} rows over shard order": [
            buffer_shuffle(shard_order(n_groups, args.rows, e, args.seed), capacity, e, args.seed)
            for e in range(args.epochs)
        ],
        **{
            f"arrowstream .shuffle(window={args.window}, fragments={m})": ours[m]
            for m in (1, 2, 4)
        },
        "uniform permutation (reference)": [
            np.random.default_rng([args.seed, e]).permutation(n) for e in range(args.epochs)
        ],
    }
    results = {}
    print(f"corpus: {args.files} files x {args.groups} row groups x {args.rows} rows = {n} documents;"
          f" memory for every shuffle: {args.window} row groups ({capacity} rows); {args.epochs} epochs")
    print(f"{'order':<56} {'position corr.':>15} {'source imbalance':>17}")
    for name, per_epoch in orders.items():
        reports = [shuffle_report(o, o // per_file, window=args.run) for o in per_epoch]
        corr = statistics.median(r["position_correlation"] for r in reports)
        imb = statistics.median(r["source_imbalance"] for r in reports)
        results[name] = {"position_correlation": corr, "source_imbalance": imb}
        print(f"{name:<56} {corr:>15.3f} {imb:>17.3f}")
    print("correctness: every arrowstream epoch emitted every document exactly once")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
