#!/usr/bin/env python
"""What saving the loader's state costs with DataLoader workers: a plain DataLoader, StatefulLoader, StatefulDataLoader.

The same packed stream (``ds.to_torch()`` over the benchmark corpus, the
library's defaults) goes through ``--workers`` DataLoader workers behind
each loader, alternated, for ``--repeats`` rounds:

- ``DataLoader``: torch's own, no state (the reference);
- ``StatefulLoader``: ``arrowstream.pytorch.StatefulLoader``, whose workers
  send a snapshot of their state with every batch (sealed: it crosses as
  bytes and is unpickled only when ``state_dict()`` asks);
- ``StatefulDataLoader``: torchdata's, which asks each worker for its
  dataset's finished state after every batch (``snapshot_every_n_steps=1``,
  its default), and, with ``--every N``, after every N-th.

With ``--mixture`` the stream mixes two sources by token weight
(``arrowstream.mix``: the corpus in row groups of 1,000 and of 2,000 rows,
0.7 and 0.3). ``--loaders`` picks among them; ``--sharing pipe,file_system``
adds a plain ``DataLoader`` over ``to_torch(sharing=...)`` for each (the
default, ``"auto"``, hands batches over in slots of shared memory). Each run pulls ``--batches`` batches (or the stream's end) and, at the end,
asks the loader for its state (the stateful ones), which must survive JSON.
Reported per strategy: batches per second (medians), the ratio to the plain
``DataLoader``, the share of the run the main process's thread was on a CPU
(unpickling what workers send is its work), and the time ``state_dict()``
took. Checks: every loader hands over the same batches as the plain
``DataLoader``, in the same order. ``--smoke`` runs a tiny corpus once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from harness import (
    CheckFailed,
    Checks,
    add_corpus_options,
    corpus_and_tokenizer,
    fmt_table,
    log,
    machine_facts,
    median,
)


def _stream(args: argparse.Namespace, strategy: str, kind: str) -> Any:
    from arrowstream import mix, read_parquet

    sharing = {"sharing": kind.split("sharing=")[1]} if "sharing=" in kind else {}
    ds = read_parquet(args.corpus).tokenize(args.tokenizer)
    if args.mixture:  # two sources by token weight: the same text in row groups of 1,000 and 2,000 rows
        other = read_parquet(args.corpus2).tokenize(args.tokenizer)
        ds = mix({"web": ds, "books": other}, {"web": 0.7, "books": 0.3})
    if strategy == "bucket":
        return ds.bucket(max_tokens=args.batch_size * args.seq_len, max_len=args.seq_len, long_docs="truncate").to_torch(**sharing)
    return ds.pack(seq_len=args.seq_len, batch_size=args.batch_size, strategy=strategy).to_torch(**sharing)


def _loader(kind: str, stream: Any, workers: int) -> Any:
    from torch.utils.data import DataLoader

    from arrowstream.pytorch import StatefulLoader

    options: dict[str, Any] = {"batch_size": None, "num_workers": workers}
    if kind.startswith("DataLoader"):
        return DataLoader(stream, **options)
    if kind == "StatefulLoader":
        return StatefulLoader(stream, **options)
    from torchdata.stateful_dataloader import StatefulDataLoader

    every = int(kind.rsplit(" ", 1)[1]) if kind.startswith("StatefulDataLoader, every") else 1
    return StatefulDataLoader(stream, snapshot_every_n_steps=every, **options)


def run(args: argparse.Namespace, kind: str, strategy: str) -> dict[str, Any]:
    """Pull up to ``args.batches`` batches through ``kind``; return rate, main thread's CPU share, state time, digest."""
    import hashlib

    loader = _loader(kind, _stream(args, strategy, kind), args.workers)
    digest = hashlib.sha256()
    start, cpu = time.perf_counter(), time.thread_time()
    n = 0
    for batch in loader:
        digest.update(batch["input_ids"].numpy().tobytes())
        n += 1
        if n == args.batches:
            break
    wall = time.perf_counter() - start
    busy = (time.thread_time() - cpu) / wall
    state_s = float("nan")
    if not kind.startswith("DataLoader"):
        t = time.perf_counter()
        state = loader.state_dict()
        state_s = time.perf_counter() - t
        json.dumps(state)
    del loader
    return {"batches": n, "rate": n / wall, "main_busy": busy, "state_s": state_s, "digest": digest.hexdigest()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_corpus_options(p)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--strategies", default="concat,best_fit,bucket")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=1400, help="batches per run (fewer if the stream ends)")
    p.add_argument("--every", type=int, default=None, help="also StatefulDataLoader(snapshot_every_n_steps=EVERY)")
    p.add_argument("--loaders", default="DataLoader,StatefulLoader,StatefulDataLoader", help="comma-separated")
    p.add_argument("--sharing", default="",
                   help="comma-separated: also a plain DataLoader over to_torch(sharing=...) for each (pipe, file_system)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mixture", action="store_true", help="a mixture of two sources (0.7 / 0.3 by tokens)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: run the checks in seconds")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.smoke:
        args.mb, args.vocab, args.batches, args.repeats, args.seq_len = 1, 2000, 40, 1, 256
    args.corpus, args.tokenizer = corpus_and_tokenizer(args)
    if args.mixture:
        args.corpus2, _ = corpus_and_tokenizer(args, rows_per_group=2000)
    kinds = ["DataLoader", *(k for k in args.loaders.split(",") if k and k != "DataLoader")]
    kinds += [f"DataLoader, sharing={x}" for x in args.sharing.split(",") if x]
    if args.every:
        kinds.append(f"StatefulDataLoader, every {args.every}")
    results: dict[str, Any] = {"machine": machine_facts(), "args": vars(args), "runs": {}}
    checks, rows = Checks(), []
    try:
        for strategy in args.strategies.split(","):
            runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
            for r in range(args.repeats):
                for kind in kinds if r % 2 == 0 else kinds[::-1]:  # alternated, so all see the same machine
                    runs[kind].append(run(args, kind, strategy))
                    last = runs[kind][-1]
                    log(f"  {strategy}, round {r + 1}: {kind}: {last['rate']:.0f} batches/s, "
                        f"main thread {100 * last['main_busy']:.0f} % busy")
            results["runs"][strategy] = runs
            plain = median([x["rate"] for x in runs["DataLoader"]])
            for kind in kinds:
                rate = median([x["rate"] for x in runs[kind]])
                state_ms = median([1e3 * x["state_s"] for x in runs[kind]])
                rows.append([strategy, kind, f"{rate:.0f}", f"{rate / plain:.2f}",
                             f"{100 * median([x['main_busy'] for x in runs[kind]]):.0f}",
                             "-" if kind.startswith("DataLoader") else f"{state_ms:.0f}"])
                same = {x["digest"] for x in runs[kind]} == {runs["DataLoader"][0]["digest"]}
                checks(same, f"{strategy}: {kind} hands over the DataLoader's batches", kind)
    except CheckFailed:
        return 1
    finally:
        results["checks"] = checks.items
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    log()
    log(fmt_table(["strategy", "loader", "batches/s", "x DataLoader", "main thread busy %", "state_dict() ms"], rows))
    source = "a mixture of two sources" if args.mixture else "one source"
    log(f"({source}, {args.batch_size} x {args.seq_len}, {args.workers} workers, {args.batches} batches a run, "
        f"medians of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
