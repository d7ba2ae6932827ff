#!/usr/bin/env python
"""Handing packed batches from DataLoader workers to the main process: in slots, through the pipe, or how many segments.

A real packed batch (``seq_len`` x ``batch_size`` from the built-in sample
corpus, every key of the batch) is made once; then a ``DataLoader`` with
``--workers`` workers hands ``--batches`` copies of it over, alternating, for
``--repeats`` rounds:

- ``one storage, in slots``: the arrays copied into one buffer that every
  tensor views (``arrowstream.handover.one_storage``), copied when sent into
  a free slot of the worker's ring of shared memory, which the main process's
  tensors view (``arrowstream.slots``, what ``TorchDataset`` sends by default);
- ``one storage, by name``: the same buffer, sent with torch's
  ``file_system`` sharing strategy (the main process opens the segment by
  name), what ``TorchDataset`` does in a worker for a batch larger than the
  pipe;
- ``one storage, by descriptor``: the same buffer with torch's Linux default,
  ``file_descriptor`` (the main process asks the worker for a descriptor);
- ``one storage, through the pipe``: the same buffer pickled as bytes into the
  DataLoader's result pipe (``arrowstream.handover.ByValue``, what
  ``TorchDataset`` sends by default when no slot is free and the batch fits
  in the pipe, the pipe widened to 1 MiB first): no shared memory;
- ``tensor per array``: ``torch.from_numpy`` on each array, by descriptor, so
  each array crosses as its own segment.

With ``--busy`` (the default) each worker also runs a thread that holds the
GIL for a millisecond, then releases it for one, as a worker's producer
thread making the next batches does (Python between tokenizer calls);
``--idle`` leaves the workers idle between batches. Reported: microseconds
per batch (medians) and the ratios to the first. Check: the batches received equal the batch
sent, key by key. ``--smoke`` runs few batches once. Exit status 0 when the
checks pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from arrowstream.handover import AUTO, PIPE, by_value_limit, handed, one_storage, use_sharing
from arrowstream.testing.data import sample_tokenizer, write_dataset
from harness import Checks, fmt_table, log, machine_facts, median


class Copies(IterableDataset):  # type: ignore[type-arg]
    """Yield ``n`` copies of ``batch`` across the workers, converted by ``how``."""

    def __init__(self, batch: dict[str, Any], n: int, how: str, busy: bool) -> None:
        self.batch, self.n, self.how, self.busy = batch, n, how, busy

    def __iter__(self):
        sharing = {"in slots": AUTO, "through the pipe": PIPE, "by name": "file_system"}.get(
            self.how.split(", ")[-1], "file_descriptor"
        )
        use_sharing(sharing)
        limit = by_value_limit(sharing, sys._getframe())
        if self.busy:
            threading.Thread(target=_spin, daemon=True).start()
        info = get_worker_info()
        share = self.n // info.num_workers if info is not None else self.n
        arrays = {k: v for k, v in self.batch.items() if isinstance(v, np.ndarray)}
        counts = {k: v for k, v in self.batch.items() if not isinstance(v, np.ndarray)}
        for _ in range(share):
            if self.how.startswith("one storage"):
                yield handed({**counts, **one_storage(arrays)}, sharing=sharing, pipe_at_most=limit)
            else:
                yield {**counts, **{k: torch.from_numpy(v.copy()) for k, v in arrays.items()}}


def _spin() -> None:
    """Python work half the time, as a worker's producer thread does between tokenizer calls (GIL released)."""
    total = 0
    while True:
        end = time.perf_counter() + 0.001
        while time.perf_counter() < end:
            total += 1
        time.sleep(0.001)


def packed_batch(seq_len: int, batch_size: int) -> dict[str, Any]:
    import tempfile

    import arrowstream

    with tempfile.TemporaryDirectory() as d:
        write_dataset(d, num_files=1, docs_per_file=400, rows_per_group=100)
        ds = arrowstream.read_parquet(d).tokenize(sample_tokenizer()).pack(seq_len=seq_len, batch_size=batch_size)
        return next(iter(ds.iter()))


def run(batch: dict[str, Any], n: int, how: str, workers: int, busy: bool, checks: Checks) -> float:
    t0 = time.perf_counter()
    got = 0
    for i, b in enumerate(DataLoader(Copies(batch, n, how, busy), batch_size=None, num_workers=workers)):
        got += 1
        if i == 0:
            same = all(
                np.array_equal(b[k].numpy(), v) if isinstance(v, np.ndarray) else b[k] == v for k, v in batch.items()
            )
            checks(same, f"{how}: the received batch equals the batch sent")
    checks(got == n // workers * workers, f"{how}: every batch arrived")
    return (time.perf_counter() - t0) / got * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=None, help="[2000; smoke 40]")
    p.add_argument("--repeats", type=int, default=None, help="[5; smoke 1]")
    p.add_argument("--idle", dest="busy", action="store_false", help="no busy thread in the workers")
    p.add_argument("--busy", dest="busy", action="store_true", help="a busy Python thread in each worker [default]")
    p.set_defaults(busy=True)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    n = args.batches or (40 if args.smoke else 2000)
    repeats = args.repeats or (1 if args.smoke else 5)
    checks = Checks()
    batch = packed_batch(args.seq_len, args.batch_size)
    arrays = sorted(k for k, v in batch.items() if isinstance(v, np.ndarray))
    log(f"batch: {args.batch_size} x {args.seq_len}, arrays {arrays}, {sum(batch[k].nbytes for k in arrays):,} bytes")
    hows = ("one storage, in slots", "one storage, through the pipe", "one storage, by name", "one storage, by descriptor",
            "tensor per array")
    times: dict[str, list[float]] = {h: [] for h in hows}
    for r in range(repeats):
        for how in hows if r % 2 == 0 else hows[::-1]:
            times[how].append(run(batch, n, how, args.workers, args.busy, checks))
            log(f"  round {r + 1}: {how}: {times[how][-1]:.0f} us/batch")
    med = {h: median(v) for h, v in times.items()}
    first = hows[0]
    ratios = {h: med[h] / med[first] for h in hows}
    log()
    log(fmt_table(["handover", "us per batch (median)", f"x {first}"],
                  [[h, f"{med[h]:.0f}", f"{ratios[h]:.2f}"] for h in hows]))
    workers = f"{args.workers} {'busy' if args.busy else 'idle'} workers"
    log(f"\n({workers}, {n} batches, medians of {repeats})")
    failed = [c for c in checks.items if not c["passed"]]
    log(f"\ncorrectness checks: {len(checks.items) - len(failed)} passed, {len(failed)} failed")
    ok = not failed
    if args.json:
        args.json.write_text(json.dumps({
            "us_per_batch": med, "ratios": ratios, "runs": times, "workers": args.workers, "busy": args.busy,
            "batches": n,
            "arrays": arrays, "machine": machine_facts(), "checks_passed": ok,
        }, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
