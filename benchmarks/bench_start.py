#!/usr/bin/env python
"""How fast a fresh process gets to full speed: the first tokens against the steady state.

Each figure comes from a fresh child process (this file with ``--child``):
``read_parquet(corpus).tokenize(tokenizer.json path).pack(strategy)``, no
workers unless ``--workers``, tokenizer given by path, nothing in the token cache. The clock starts
in the parent just before the child is spawned (so imports, loading the
tokenizer, converting it and proving the encoder are all inside it) and the
child reports, on the same system-wide monotonic clock, when its first batch
came and when it had emitted ``--tokens`` real tokens; it then goes on for
``--steady-tokens`` more and reports that stretch's rate (the steady state).
arrowstream's modules are compiled to bytecode before the first child, as a
wheel install leaves them (``harness.ensure_bytecode``), so no child times
Python compiling them.

Two kinds of process, alternating, medians of ``--repeats``:

- ``first``: a new, empty encoder verdict directory (``ARROWSTREAM_CACHE_DIR``):
  the very first process on a machine, which pays for the encoder's proof
  and builds the tokenizer's compiled forms from its JSON;
- ``second``: the same directory again, as every later process, DataLoader
  worker or restart (verdict and compiled forms read back).

``--encoder`` picks what encodes: ``tokie`` (the default, ``backend="auto"``
with the ``fast`` extra installed), ``tiktoken`` (``backend="auto"`` with tokie
hidden, as where the extra is not installed; the encoder the issue's figures
were taken with) or ``tokenizers`` (forced, nothing to prove).

The bar (issue 18): over the first 4 M tokens, at least 0.8x the steady speed
on a second process and 0.5x on the first; first batch within 0.5 s.
``imports s`` is the time from process start until the child's imports are
done (the interpreter and ``import arrowstream``, which any training script
pays before building a pipeline); ``after imports / steady`` is the first
tokens' rate timed from there, the pipeline's own start-up.
``peak MB`` is the largest resident set size of the child or of any of its
DataLoader workers (``--workers N``, started by ``--start-method``: ``spawn``
and ``forkserver`` unpickle the pipeline in every worker; the imports then
include torch's). ``padding %`` is the share of padding in every batch the child emitted
(``best_fit`` and ``bucket``: ``--no-ramp`` gives the same figures with full
look-ahead windows from the start, for comparison).

Usage::

    python benchmarks/bench_start.py                  # 85 MB corpus, 4 M tokens
    python benchmarks/bench_start.py --encoder tiktoken   # the default without the fast extra
    python benchmarks/bench_start.py --wide-vocab 128000  # a tokenizer of Llama 3's size
    python benchmarks/bench_start.py --workers 2 --start-method spawn   # through a DataLoader
    python benchmarks/bench_start.py --smoke          # seconds: checks only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The child imports arrowstream after its clock started (in the parent), as any training script does.


def child(args: argparse.Namespace) -> None:
    import resource

    if args.workers:
        from torch.utils.data import DataLoader
    from arrowstream import read_parquet
    from contestants import arrowstream_backend, encoded_with

    imported = time.monotonic()  # a training script's own imports done: the pipeline's part starts here
    backend = arrowstream_backend(args.encoder)  # as bench_peers.py's rows of the same name
    ramp = {} if args.strategy == "concat" else {"ramp": not args.no_ramp}
    tokens_ds = read_parquet(args.corpus).tokenize(args.tokenizer, backend=backend)
    if args.strategy == "bucket":
        ds = tokens_ds.bucket(
            max_tokens=args.seq_len * args.batch_size, max_len=args.seq_len, long_docs="truncate", **ramp
        )
    else:
        ds = tokens_ds.pack(
            seq_len=args.seq_len, batch_size=args.batch_size, strategy=args.strategy, **ramp
        )
    if args.workers:  # as a training script reads it: through a DataLoader whose workers each run a share
        it = iter(DataLoader(ds.to_torch(), batch_size=None, num_workers=args.workers,
                             multiprocessing_context=args.start_method))
    else:
        it = ds.iter()
    tokens = 0
    first = None
    for batch in it:
        if first is None:
            first = time.monotonic()
        tokens += int(batch["num_tokens"])
        if tokens >= args.tokens:
            break
    reached, start_tokens = time.monotonic(), tokens
    for batch in it:
        tokens += int(batch["num_tokens"])
        if tokens - start_tokens >= args.steady_tokens:
            break
    done = time.monotonic()
    stats = it.stats if not args.workers else {"padding_tokens": 0, "tokens": 1}  # workers' stats stay in them
    del it  # the workers end, so their peak memory is counted
    own_mb, workers_mb = (resource.getrusage(who).ru_maxrss / 1024 for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    print(json.dumps({
        "backend": encoded_with(ds),
        "imported": imported, "first_batch": first, "reached": reached, "tokens": start_tokens, "done": done,
        "steady_tokens": tokens - start_tokens,
        "padding": stats["padding_tokens"] / max(1, stats["padding_tokens"] + stats["tokens"]),
        "peak_mb": max(own_mb, workers_mb), "workers_peak_mb": workers_mb,
    }))


def run_child(args: argparse.Namespace, cache_dir: str) -> dict[str, Any]:
    cmd = [
        sys.executable, __file__, "--child", "--corpus", args.corpus, "--tokenizer", args.tokenizer,
        "--tokens", str(args.tokens), "--steady-tokens", str(args.steady_tokens), "--strategy", args.strategy,
        "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--encoder", args.encoder,
        *(["--no-ramp"] if args.no_ramp else []), "--workers", str(args.workers), "--start-method", args.start_method,
    ]
    env = dict(os.environ, ARROWSTREAM_CACHE_DIR=cache_dir)
    start = time.monotonic()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"child failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "first_batch_s": res["first_batch"] - start,
        "start_tok_s": res["tokens"] / (res["reached"] - start),
        "imports_s": res["imported"] - start,
        "after_imports_tok_s": res["tokens"] / (res["reached"] - res["imported"]),
        "steady_tok_s": res["steady_tokens"] / (res["done"] - res["reached"]),
        "tokens": res["tokens"],
        "padding": res["padding"],
        "peak_mb": res["peak_mb"],
        "workers_peak_mb": res["workers_peak_mb"],
        "backend": res["backend"],
    }


def main() -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from harness import (
        CheckFailed,
        Checks,
        add_corpus_options,
        corpus_and_tokenizer,
        ensure_bytecode,
        fmt_table,
        log,
        machine_facts,
        median,
    )

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", help=argparse.SUPPRESS)
    add_corpus_options(p)
    p.add_argument("--tokens", type=int, default=4_000_000, help="the start: tokens timed from process start")
    p.add_argument("--steady-tokens", type=int, default=6_000_000, help="tokens after the start, for the steady rate")
    p.add_argument("--strategy", default="concat", choices=["concat", "best_fit", "bucket"])
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--encoder", default="tokie", choices=["tokie", "tiktoken", "tokenizers"],
                   help="tokie: the default with the fast extra; tiktoken: the default without it; tokenizers: forced")
    p.add_argument("--no-ramp", action="store_true", help="best_fit and bucket: full windows from the start (ramp=False)")
    p.add_argument("--wide-vocab", type=int, default=0, metavar="N",
                   help="a byte-level BPE of N tokens trained on random words (wide_vocab.py), as GPT-2's 50k or "
                        "Llama 3's 128k, instead of the corpus's own (which stops at a few thousand merges)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers (0: the pipeline's own iterator)")
    p.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"],
                   help="how the DataLoader starts its workers (spawn and forkserver unpickle the pipeline in each)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="tiny sizes: run the checks in seconds")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if args.child:
        child(args)
        return 0
    if args.smoke:
        args.mb, args.tokens, args.steady_tokens, args.repeats, args.vocab = 3, 200_000, 200_000, 1, 2000
    args.corpus, args.tokenizer = corpus_and_tokenizer(args)
    if args.wide_vocab:
        from wide_vocab import wide_tokenizer_file

        args.tokenizer = str(wide_tokenizer_file(Path(args.workdir), args.wide_vocab))
    bytecode = ensure_bytecode()  # as a wheel install leaves it: the children do not compile arrowstream
    runs: dict[str, list[dict[str, Any]]] = {"first": [], "second": []}
    for r in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="arrowstream-verdicts-") as cache_dir:
            for kind in ("first", "second"):
                res = run_child(args, cache_dir)
                runs[kind].append(res)
                log(f"  run {r + 1} {kind}: first batch {res['first_batch_s']:.2f} s, first {res['tokens'] / 1e6:.1f} M "
                    f"tokens {res['start_tok_s'] / 1e6:.2f} M tok/s, then {res['steady_tok_s'] / 1e6:.2f} M tok/s")
    steady = median([r["steady_tok_s"] for kind in runs for r in runs[kind]])
    rows, results = [], {"machine": machine_facts(), "args": vars(args), "steady_tok_s": steady, "bytecode": bytecode}
    for kind, items in runs.items():
        start = median([r["start_tok_s"] for r in items])
        first = median([r["first_batch_s"] for r in items])
        padding = median([r["padding"] for r in items])
        imports = median([r["imports_s"] for r in items])
        after = median([r["after_imports_tok_s"] for r in items])
        peak = median([r["peak_mb"] for r in items])
        results[kind] = {"runs": items, "start_tok_s": start, "first_batch_s": first, "ratio": start / steady,
                         "padding": padding, "imports_s": imports, "after_imports_tok_s": after,
                         "after_imports_ratio": after / steady, "peak_mb": peak}
        rows.append([kind, f"{first:.2f}", f"{start / 1e6:.2f}", f"{steady / 1e6:.2f}", f"{start / steady:.2f}",
                     f"{imports:.2f}", f"{after / steady:.2f}", f"{peak:.0f}",
                     "-" if args.workers else f"{100 * padding:.3f}"])
    log()
    log(fmt_table(["process", "first batch s", f"first {args.tokens / 1e6:g} M tokens (M tok/s)",
                   "steady (M tok/s)", "start / steady", "imports s", "after imports / steady", "peak MB",
                   "padding %"], rows))
    vocab = f"{args.wide_vocab:,}-token random-word BPE" if args.wide_vocab else f"the corpus's BPE (--vocab {args.vocab})"
    workers = f"{args.workers} DataLoader workers ({args.start_method})" if args.workers else "no workers"
    log(f"({args.strategy} {args.batch_size} x {args.seq_len}, {args.encoder}, {vocab}, {workers}; steady = median of every run's rate "
        f"after its first {args.tokens / 1e6:g} M tokens; imports = process start to `import arrowstream` done; "
        f"after imports = the first {args.tokens / 1e6:g} M tokens timed from there; peak MB = the largest resident "
        f"set of the process or of any of its workers; medians of {args.repeats})")
    checks = Checks()
    try:
        for kind in runs:
            least = min(r["tokens"] for r in runs[kind])
            checks(least >= args.tokens, f"{kind}: every run reached {args.tokens:,} tokens (a larger --mb if not)",
                   f"fewest {least:,}")
            used = sorted({r["backend"] for r in runs[kind]})
            checks(used == [args.encoder], f"{kind}: every run encoded with {args.encoder}", f"used {used}")
    except CheckFailed:
        return 1
    finally:
        results["checks"] = checks.items
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
