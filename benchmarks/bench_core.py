#!/usr/bin/env python
"""Core benchmark of arrowstream: throughput, peak memory and resume latency.

Three measurements, each with its bar and one correctness check:

1. Throughput ratio (bar: >= 0.85). Over the same texts (a dedicated corpus of
   ``--throughput-mb`` MB, about 20 M tokens by default), the tokens/s of the
   full pipeline ``read_parquet(...).tokenize(tok, backend=...).pack(...)``
   divided by the tokens/s of the fastest raw call of the *same* encoder fed
   from a Python list already in memory: ``backend="tiktoken"`` (what the
   default ``"auto"`` encodes with where tokie is not installed) against raw
   tiktoken, ``backend="tokenizers"`` against raw ``tokenizers``. Each raw pass builds a fresh encoder and each
   pipeline pass runs in a fresh process, so no pass finds caches an earlier
   one filled (imports are outside the clock on both sides). Raw and pipeline
   runs alternate (A B A B ...). Check: the pipelines emit exactly the raw
   encoders' tokens plus one EOS per non-empty document.
2. Peak RSS against corpus size (bar: largest corpus peak <= 1.5 x smallest).
   One fresh child process per size streams the whole corpus and reports its
   own peak resident set. Check: every row was read, every batch is full
   except for counted padding.
3. Resume latency (bar: at 90 % < 1 s and <= 2 x the 10 % figure). From a
   state at 10 %, 50 % and 90 % of the ``--resume-size`` corpus, the time of
   ``ds.iter(state)`` plus the first ``next(it)``, in a fresh process each.
   Check: resuming from a state saved mid-stream gives exactly the batches the
   uninterrupted iterator gives next; each edited state starts at the
   document it names.

Corpora and the tokenizer are cached in ``--workdir`` (keyed by size, seed and
layout) by ``harness.py``, which every benchmark script shares, so a second run
does not regenerate them. ``--smoke`` runs tiny sizes in well under a minute
(CI). Exit status: 0 if every correctness check passed (bars met or not:
timings are noisy), 1 if a check failed, 2 on another error.

Run ``python benchmarks/bench_core.py --help`` for the options and see
``benchmarks/README.md`` for what each figure means.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from contestants import raw_count, raw_encoder
from harness import (
    BYTES_PER_MB,
    EOS_TOKEN,
    CheckFailed,
    Checks,
    bar_word,
    corpus_dir,
    fmt_table,
    loadavg,
    log,
    machine_facts,
    median,
    mtok,
    peak_kib,
    peak_rss_kib,
    tiktoken_file,
    tokenizer_file,
)
from tokenizers import Tokenizer

import arrowstream
from arrowstream.state.checksum import with_checksum

# -- constants ----------------------------------------------------------------------

RESUME_POINTS = (0.1, 0.5, 0.9)
RESULT_TAG = "BENCH_CHILD_RESULT "
HEAD_TOKENS = 64  # tokens of a resumed batch compared with the expected document

BAR_THROUGHPUT = 0.85  # pipeline tok/s >= 0.85 x raw tok/s
BAR_RSS = 1.5  # peak RSS(largest) <= 1.5 x peak RSS(smallest)
BAR_RESUME_S = 1.0  # resume at 90 % < 1 s ...
BAR_RESUME_RATIO = 2.0  # ... and <= 2 x resume at 10 %

SMOKE = {
    "sizes": "5,10",
    "resume_size": 10.0,
    "repeats": 1,
    "vocab_size": 4096,
}
DEFAULTS = {
    "sizes": "100,1000",
    "resume_size": 500.0,
    "repeats": 3,
    "vocab_size": 32000,
}


# -- child processes ----------------------------------------------------------------


def run_child(script_args: list[str]) -> dict[str, Any]:
    """Run this script in ``--child`` mode in a fresh interpreter and return its result."""
    cmd = [sys.executable, os.path.abspath(__file__), *script_args]
    # An explicit env: tokenizers' fork handler may set TOKENIZERS_PARALLELISM=false
    # in a forked child's environ, which would otherwise reach the new interpreter.
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG):])
    if proc.returncode != 0 or result is None:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        if "AssertionError" in proc.stderr:
            raise CheckFailed(f"child {' '.join(script_args)} failed a check (status {proc.returncode})")
        raise RuntimeError(f"child {' '.join(script_args)} failed with status {proc.returncode}")
    return result


def child_main(args: argparse.Namespace) -> int:
    if args.child == "rss":
        out = child_rss(args)
    elif args.child == "resume":
        out = child_resume(args)
    elif args.child == "throughput":
        out = child_throughput(args)
    else:
        raise SystemExit(f"unknown child mode {args.child!r}")
    print(RESULT_TAG + json.dumps(out), flush=True)
    return 0


def child_rss(args: argparse.Namespace) -> dict[str, Any]:
    """Stream a corpus through the pipeline; report peak RSS (fresh process)."""
    baseline = peak_rss_kib()  # interpreter + numpy/pyarrow/tokenizers/arrowstream imported
    t0 = time.perf_counter()
    ds = arrowstream.read_parquet(args.corpus).tokenize(args.tokenizer).pack(
        seq_len=args.seq_len, batch_size=args.batch_size
    )
    it = ds.iter()
    batches = 0
    cap = args.rss_max_batches
    for _ in it:
        batches += 1
        if cap is not None and batches >= cap:
            break
    wall = time.perf_counter() - t0
    stats = it.state_dict()["stats"]
    it.close()
    peak = peak_rss_kib()
    full = args.seq_len * args.batch_size
    assert stats["batches"] == batches, (stats, batches)
    assert stats["tokens"] + stats.get("padding_tokens", 0) == batches * full, stats
    if cap is None or batches < cap:  # the whole corpus was streamed
        num_rows = ds.manifest.num_rows
        assert stats["rows"] == num_rows, (stats, num_rows)
        assert stats["docs"] + stats.get("empty", 0) + stats.get("null", 0) == num_rows, stats
        assert stats.get("padding_tokens", 0) < full, stats  # only the last batch is padded
    return {
        "baseline_kib": baseline,
        "peak_kib": peak,
        "batches": batches,
        "stats": stats,
        "whole_corpus": cap is None or batches < cap,
        "wall_s": wall,
        "tokens_per_s": stats["tokens"] / wall if wall > 0 else None,
    }


def child_resume(args: argparse.Namespace) -> dict[str, Any]:
    """Open the dataset and resume from one saved state; time each step (fresh process)."""
    with open(args.state_file) as f:
        state = json.load(f)[args.state_key]
    t0 = time.perf_counter()
    ds = arrowstream.read_parquet(args.corpus)
    t1 = time.perf_counter()
    ds = ds.tokenize(args.tokenizer).pack(seq_len=args.seq_len, batch_size=args.batch_size)
    t2 = time.perf_counter()
    it = ds.iter(state)  # state None: fresh start
    t3 = time.perf_counter()
    batch = next(it)
    t4 = time.perf_counter()
    position = it.state_dict()["position"]
    it.close()
    return {
        "key": args.state_key,
        "open_s": t1 - t0,
        "build_s": t2 - t1,
        "iter_s": t3 - t2,
        "first_next_s": t4 - t3,
        "resume_s": t4 - t2,
        "head": batch["input_ids"][0, :HEAD_TOKENS].tolist(),
        "position_after": position,
        "peak_kib": peak_rss_kib(),
    }


def child_args(args: argparse.Namespace, corpus: Path, tok_path: Path) -> list[str]:
    return [
        "--corpus", str(corpus),
        "--tokenizer", str(tok_path),
        "--seq-len", str(args.seq_len),
        "--batch-size", str(args.batch_size),
    ]


# -- 1. throughput ------------------------------------------------------------------


def raw_pass(tok_path: Path, tiktoken_path: Path, texts: list[str], method: str, slice_n: int | None,
             with_ids: bool) -> dict[str, Any]:
    """Time one raw encoder method over ``texts`` with a fresh encoder (its caches empty)."""
    if method.startswith("tiktoken"):
        encoder = raw_encoder(method, tok_path, tiktoken_path)
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        n = raw_count(method, encoder, texts)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"tokens": n, "wall_s": wall, "cpu_s": cpu, "tok_per_s": n / wall, "tok_per_cpu_s": n / cpu if cpu else None}
    encode = getattr(Tokenizer.from_file(str(tok_path)), method)
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    n = 0
    if slice_n is None:
        encs = encode(texts)
        n = sum(len(e) for e in encs)
        if with_ids:
            ids = [e.ids for e in encs]
            del ids
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        del encs
    else:
        for i in range(0, len(texts), slice_n):
            encs = encode(texts[i : i + slice_n])
            n += sum(len(e) for e in encs)
            if with_ids:
                ids = [e.ids for e in encs]
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    gc.collect()
    return {"tokens": n, "wall_s": wall, "cpu_s": cpu, "tok_per_s": n / wall, "tok_per_cpu_s": n / cpu if cpu else None}


def child_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """One full pipeline pass in a fresh process: no conversion or check cached by an earlier pass."""
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    ds = arrowstream.read_parquet(args.corpus).tokenize(args.tokenizer, backend=args.backend).pack(
        seq_len=args.seq_len, batch_size=args.batch_size
    )
    t_open = time.perf_counter() - t0
    it = ds.iter()
    next(it)
    t_first = time.perf_counter() - t0
    batches = 1
    for _ in it:
        batches += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stats = it.state_dict()["stats"]
    it.close()
    return {
        "tokens": int(stats["tokens"]),
        "stats": stats,
        "batches": batches,
        "backend": next(s.backend for s in ds.stages if hasattr(s, "backend")),
        "num_rows": ds.manifest.num_rows,
        "open_s": t_open,
        "first_batch_s": t_first,
        "wall_s": wall,
        "cpu_s": cpu,
        "tok_per_s": stats["tokens"] / wall,
        "tok_per_cpu_s": stats["tokens"] / cpu if cpu else None,
    }


#: Pipeline passes of the throughput measurement: backend option -> the encoder it should use.
PIPELINES = {"tiktoken": "tiktoken", "tokenizers": "tokenizers"}


def measure_throughput(args: argparse.Namespace, corpus: Path, tok_path: Path, checks: Checks) -> dict[str, Any]:
    tiktoken_path = tiktoken_file(args.workdir, tok_path)
    manifest = arrowstream.read_parquet(corpus).manifest
    # The raw side reads the same files' text column, outside any timed region.
    texts: list[str] = []
    text_bytes = nulls = 0
    for path in manifest.paths:
        col = pq.read_table(path, columns=["text"]).column("text")
        text_bytes += int(pc.sum(pc.binary_length(col)).as_py() or 0)
        nulls += col.null_count
        texts.extend(t for t in col.to_pylist() if t is not None)
    nonempty = sum(1 for t in texts if t)
    log(f"  {len(texts)} texts, {text_bytes / 1e6:.1f} MB of text in memory ({nulls} null)")

    methods: list[tuple[str, str, int | None, bool]] = [
        (f"encode_batch[{args.raw_slice}]", "encode_batch", args.raw_slice, False),
        (f"encode_batch_fast[{args.raw_slice}]", "encode_batch_fast", args.raw_slice, False),
        ("tiktoken encode_batch[1000], 2 threads", "tiktoken-batch", None, False),
        ("tiktoken joined[1000], 2 threads", "tiktoken-joined", None, False),
    ]
    if text_bytes <= args.one_call_max_mb * BYTES_PER_MB:
        methods.append(("encode_batch_fast[all]", "encode_batch_fast", None, False))
    else:
        log(f"  (one call on all texts skipped: more than --one-call-max-mb {args.one_call_max_mb:g} MB)")
    ids_method = (f"encode_batch_fast[{args.raw_slice}]+ids", "encode_batch_fast", args.raw_slice, True)
    encoder_of = {m[0]: ("tiktoken" if m[1].startswith("tiktoken") else "tokenizers") for m in [*methods, ids_method]}

    # Warm-up (not timed) of the tokenizers thread pool only, with a throwaway encoder: every timed
    # raw pass builds its own encoder and every pipeline pass runs in a fresh process.
    Tokenizer.from_file(str(tok_path)).encode_batch(texts[:1000])

    raw_runs: dict[str, list[dict[str, Any]]] = {m[0]: [] for m in [*methods, ids_method]}
    pipe_runs: dict[str, list[dict[str, Any]]] = {b: [] for b in PIPELINES}
    for r in range(args.repeats):
        # A: raw (methods rotated each repeat), then B: the pipelines.
        order = [*methods[r % len(methods):], *methods[: r % len(methods)], ids_method]
        for name, method, slice_n, with_ids in order:
            res = raw_pass(tok_path, tiktoken_path, texts, method, slice_n, with_ids)
            res["loadavg"] = loadavg()
            raw_runs[name].append(res)
            log(f"  repeat {r + 1}/{args.repeats}  raw {name:<38} {mtok(res['tok_per_s'])} M tok/s  ({res['wall_s']:.2f} s)")
        for backend in PIPELINES:
            res = run_child(["--child", "throughput", *child_args(args, corpus, tok_path), "--backend", backend])
            res["loadavg"] = loadavg()
            pipe_runs[backend].append(res)
            log(f"  repeat {r + 1}/{args.repeats}  pipeline backend={backend:<27} {mtok(res['tok_per_s'])} M tok/s  "
                f"({res['wall_s']:.2f} s, first batch {res['first_batch_s'] * 1e3:.0f} ms)")

    # Correctness: every raw method agrees, and each pipeline emits raw tokens + one EOS per document.
    raw_tokens = {name: {run["tokens"] for run in runs} for name, runs in raw_runs.items()}
    all_counts = set().union(*raw_tokens.values())
    checks(len(all_counts) == 1, "throughput: every raw encoder method (tokenizers and tiktoken) gives the same token count",
           str(raw_tokens))
    raw_count_ = all_counts.pop()
    every = [res for runs in pipe_runs.values() for res in runs]
    n = len(every)
    checks(
        all(res["tokens"] == raw_count_ + nonempty for res in every),
        "throughput: pipeline tokens == raw tokens + one EOS per non-empty document",
        f"pipeline {sorted({res['tokens'] for res in every})}, raw {raw_count_} + {nonempty} docs"
        f" = {raw_count_ + nonempty}; {n} run(s)",
    )
    checks(
        all(r["stats"]["docs"] == nonempty and r["stats"]["rows"] == manifest.num_rows for r in every),
        "throughput: pipeline read every row and kept every non-empty document",
        f"rows {every[0]['stats']['rows']}/{manifest.num_rows}, docs {every[0]['stats']['docs']}/{nonempty}; {n} run(s)",
    )
    checks(
        all(r["tokens"] + r["stats"].get("padding_tokens", 0) == r["batches"] * args.seq_len * args.batch_size
            for r in every),
        "throughput: batches hold real tokens + counted padding",
        f"{every[0]['batches']} batches, padding {every[0]['stats'].get('padding_tokens', 0)}; {n} run(s)",
    )
    checks(
        all(r["backend"] == PIPELINES[b] for b, runs in pipe_runs.items() for r in runs),
        "throughput: backend='tiktoken' encoded with tiktoken, backend='tokenizers' with tokenizers",
        str({b: sorted({r["backend"] for r in runs}) for b, runs in pipe_runs.items()}),
    )

    # Ratios: each pipeline against the fastest raw method of the encoder it used.
    med = {name: median([run["tok_per_s"] for run in runs]) for name, runs in raw_runs.items()}
    med_cpu = {name: median([run["tok_per_cpu_s"] for run in runs]) for name, runs in raw_runs.items()}
    fastest = {enc: max((m[0] for m in methods if encoder_of[m[0]] == enc), key=lambda name: med[name])
               for enc in ("tokenizers", "tiktoken")}
    pipes = {}
    for backend, runs in pipe_runs.items():
        ref = fastest[PIPELINES[backend]]
        pipe_med = median([run["tok_per_s"] for run in runs])
        pipe_cpu = median([run["tok_per_cpu_s"] for run in runs])
        pair = [p["tok_per_s"] / raw_runs[ref][i]["tok_per_s"] for i, p in enumerate(runs)]
        pipes[backend] = {
            "runs": runs, "median_tok_per_s": pipe_med, "median_tok_per_cpu_s": pipe_cpu, "reference": ref,
            "ratio": pipe_med / med[ref], "pair_ratios": pair, "pair_ratio_median": median(pair),
            "ratio_cpu": pipe_cpu / med_cpu[ref] if med_cpu[ref] else None,
        }
    head = pipes["tiktoken"]
    return {
        "corpus": str(corpus),
        "texts": len(texts),
        "nonempty_docs": nonempty,
        "text_bytes": text_bytes,
        "raw_tokens": raw_count_,
        "raw_runs": raw_runs,
        "raw_encoder": encoder_of,
        "raw_median_tok_per_s": med,
        "raw_median_tok_per_cpu_s": med_cpu,
        "fastest_raw_method": fastest,
        "pipelines": pipes,
        "ratio": head["ratio"],
        "ratio_tokenizers_backend": pipes["tokenizers"]["ratio"],
        "ratio_default_vs_tokenizers_ceiling": head["median_tok_per_s"] / med[fastest["tokenizers"]],
        "ratio_vs_raw_with_ids": pipes["tokenizers"]["median_tok_per_s"] / med[ids_method[0]],
        "bar": BAR_THROUGHPUT,
        "bar_met": min(p["ratio"] for p in pipes.values()) >= BAR_THROUGHPUT,
    }


def report_throughput(res: dict[str, Any], args: argparse.Namespace) -> None:
    log(f"\n[1] Throughput ratio  (bar: pipeline / raw, same encoder, >= {BAR_THROUGHPUT})")
    log(f"    texts: {res['texts']} docs, {res['text_bytes'] / 1e6:.1f} MB of text, {res['raw_tokens'] / 1e6:.2f} M raw tokens"
        f" (+{res['nonempty_docs']} EOS); {args.repeats} repeat(s), raw and pipelines interleaved, each pipeline"
        " pass in a fresh process, each raw pass with a fresh encoder")
    rows = []
    fastest = set(res["fastest_raw_method"].values())
    for name, runs in res["raw_runs"].items():
        tag = " (fastest)" if name in fastest else ""
        rows.append([f"raw {name}{tag}", res["raw_encoder"][name], mtok(res["raw_median_tok_per_s"][name]),
                     mtok(res["raw_median_tok_per_cpu_s"][name] or 0), "-",
                     " ".join(mtok(r["tok_per_s"]) for r in runs)])
    for backend, pipe in res["pipelines"].items():
        rows.append([f"pipeline read_parquet.tokenize(backend={backend!r}).pack", PIPELINES[backend],
                     mtok(pipe["median_tok_per_s"]), mtok(pipe["median_tok_per_cpu_s"] or 0), f"{pipe['ratio']:.3f}",
                     " ".join(mtok(r["tok_per_s"]) for r in pipe["runs"])])
    log(fmt_table(["method", "encoder", "median M tok/s", "M tok/cpu-s", "vs fastest raw, same encoder", "per run M tok/s"], rows))
    for backend, pipe in res["pipelines"].items():
        runs = pipe["runs"]
        log(f"    backend={backend!r}: open {median([r['open_s'] for r in runs]) * 1e3:.0f} ms, first batch "
            f"{median([r['first_batch_s'] for r in runs]) * 1e3:.0f} ms, {runs[0]['batches']} batches; ratio = "
            f"median(pipeline) / median(raw {pipe['reference']}) = {pipe['ratio']:.3f}; per-pair "
            f"{' '.join(f'{x:.3f}' for x in pipe['pair_ratios'])} (median {pipe['pair_ratio_median']:.3f});"
            f" CPU-time ratio {pipe['ratio_cpu']:.3f}")
    log(f"    secondary: default pipeline / fastest raw tokenizers (an encoder swap, not a pipeline figure)"
        f" {res['ratio_default_vs_tokenizers_ceiling']:.3f}; tokenizers pipeline / raw including id extraction"
        f" {res['ratio_vs_raw_with_ids']:.3f}")
    log(f"    bar {BAR_THROUGHPUT} (both pipelines): {bar_word(res['bar_met'])}")


# -- 2. peak RSS --------------------------------------------------------------------


def measure_rss(args: argparse.Namespace, corpora: dict[float, Path], tok_path: Path, checks: Checks) -> dict[str, Any]:
    per_size = []
    for size in sorted(corpora):
        runs = []
        for r in range(args.rss_repeats):
            extra = [] if args.rss_max_batches is None else ["--rss-max-batches", str(args.rss_max_batches)]
            res = run_child(["--child", "rss", *child_args(args, corpora[size], tok_path), *extra])
            runs.append(res)
            log(f"  {size:g} MB run {r + 1}/{args.rss_repeats}: peak {peak_kib(res['peak_kib']) / 1024:.1f} MiB "
                f"(baseline {peak_kib(res['baseline_kib']) / 1024:.1f} MiB), {res['batches']} batches, "
                f"{res['stats']['tokens'] / 1e6:.1f} M tokens in {res['wall_s']:.1f} s "
                f"({mtok(res['tokens_per_s'])} M tok/s)")
        if args.rss_max_batches is None:
            checks(all(r["whole_corpus"] for r in runs),
                   f"rss {size:g} MB: every row streamed, batches full except counted padding (asserted in child)")
        else:
            checks(all(r["batches"] <= args.rss_max_batches for r in runs),
                   f"rss {size:g} MB: capped stream, batches full except counted padding (asserted in child)")
        per_size.append({
            "size_mb": size,
            "runs": runs,
            "peak_mib": median([peak_kib(r["peak_kib"]) / 1024 for r in runs]),
            "baseline_mib": median([peak_kib(r["baseline_kib"]) / 1024 for r in runs]),
            "ru_maxrss_mib": median([r["peak_kib"]["ru_maxrss"] / 1024 for r in runs]),
            "tokens": runs[0]["stats"]["tokens"],
            "batches": runs[0]["batches"],
            "whole_corpus": all(r["whole_corpus"] for r in runs),
        })
    small, large = per_size[0], per_size[-1]
    ratio = large["peak_mib"] / small["peak_mib"]
    growth_small = small["peak_mib"] - small["baseline_mib"]
    growth_large = large["peak_mib"] - large["baseline_mib"]
    return {
        "sizes": per_size,
        "max_batches": args.rss_max_batches,
        "measure": "VmHWM" if small["runs"][0]["peak_kib"]["vmhwm"] is not None else "ru_maxrss",
        "ratio": ratio,
        "growth_ratio": growth_large / growth_small if growth_small > 0 else None,
        "bar": BAR_RSS,
        "bar_met": ratio <= BAR_RSS,
    }


def report_rss(res: dict[str, Any], args: argparse.Namespace) -> None:
    log(f"\n[2] Peak RSS vs corpus size  (bar: largest <= {BAR_RSS} x smallest)")
    cap = "whole corpus" if res["max_batches"] is None else f"at most {res['max_batches']} batches per size"
    log(f"    one fresh process per size, streaming {cap}; peak = {res['measure']} of the child"
        f" ({args.rss_repeats} run(s) per size, median)")
    rows = []
    for s in res["sizes"]:
        rows.append([f"{s['size_mb']:g} MB", f"{s['peak_mib']:.1f}", f"{s['baseline_mib']:.1f}",
                     f"{s['peak_mib'] - s['baseline_mib']:.1f}", f"{s['ru_maxrss_mib']:.1f}",
                     s["batches"], f"{s['tokens'] / 1e6:.1f}", "yes" if s["whole_corpus"] else "no"])
    log(fmt_table(["corpus", "peak MiB", "after imports MiB", "growth MiB", "ru_maxrss MiB", "batches", "M tokens", "whole"], rows))
    growth = "n/a" if res["growth_ratio"] is None else f"{res['growth_ratio']:.2f}"
    log(f"    ratio largest/smallest peak = {res['ratio']:.3f}  (growth above the import baseline: {growth})")
    log(f"    bar {BAR_RSS}: {bar_word(res['bar_met'])}")


# -- 3. resume latency --------------------------------------------------------------


def locate(manifest: Any, seq: int) -> dict[str, Any]:
    """Return file / row_group / row of epoch row ``seq`` (manifest order: no filter, no shuffle)."""
    cum = np.concatenate([[0], np.cumsum(manifest.shard_rows)])
    i = int(np.searchsorted(cum, seq, side="right")) - 1
    return {
        "shard": i,
        "path": manifest.paths[int(manifest.shard_file[i])],
        "file": manifest.relpaths[int(manifest.shard_file[i])],
        "row_group": int(manifest.shard_row_group[i]),
        "row": int(seq - cum[i]),
    }


def chunk_rows_from(manifest: Any, batch_rows: int, seq: int) -> int:
    where = locate(manifest, seq)
    rows = int(manifest.shard_rows[where["shard"]])
    row = where["row"]
    return min((row // batch_rows + 1) * batch_rows, rows) - row


def measure_resume(args: argparse.Namespace, corpus: Path, tok_path: Path, workdir: Path, checks: Checks) -> dict[str, Any]:
    tok = Tokenizer.from_file(str(tok_path))
    eos = tok.token_to_id(EOS_TOKEN)
    # Same construction as the children (tokenizer from the same JSON), so the states match.
    ds = arrowstream.read_parquet(corpus).tokenize(str(tok_path)).pack(seq_len=args.seq_len, batch_size=args.batch_size)
    manifest = ds.manifest
    num_rows = manifest.num_rows

    # Correctness: a state saved mid-stream by a real iterator resumes exactly.
    it = ds.iter()
    for _ in range(args.resume_warm_batches):
        next(it)
    saved = json.loads(json.dumps(it.state_dict()))
    expected = [next(it) for _ in range(2)]
    it.close()
    t0 = time.perf_counter()
    it2 = ds.iter(saved)
    got0 = next(it2)
    warm_resume_s = time.perf_counter() - t0
    got = [got0, next(it2)]
    it2.close()
    same = all(np.array_equal(e[k], g[k]) for e, g in zip(expected, got) for k in e)
    pos = saved["position"]
    checks(same, "resume: batches after a mid-stream state equal the uninterrupted stream's",
           f"state after {args.resume_warm_batches} batches at seq {pos['seq']} token_offset {pos['token_offset']}")

    # States at p % of the epoch: edit only the position of the real state.
    states: dict[str, Any] = {"start": None}
    expected_heads: dict[str, list[int] | None] = {}
    # Rows from the position to the end of its read chunk (chunks are cut on a grid of
    # `batch_rows` rows inside each row group). A diagnostic: if resume latency tracks
    # it, the pipeline tokenizes whole chunks before it can yield the first batch.
    first_chunk_rows = {"start": chunk_rows_from(manifest, ds.batch_rows, 0)}
    for p in RESUME_POINTS:
        seq = round(p * num_rows)
        where = locate(manifest, seq)
        first_chunk_rows[f"{round(p * 100)}%"] = chunk_rows_from(manifest, ds.batch_rows, seq)
        st = json.loads(json.dumps(saved))
        st["position"].update(seq=seq, token_offset=0, file=where["file"], row_group=where["row_group"], row=where["row"])
        with_checksum(st)  # edited on purpose: sealed again
        key = f"{round(p * 100)}%"
        states[key] = st
        text = pq.ParquetFile(where["path"]).read_row_group(where["row_group"], columns=["text"]).column(0)[where["row"]].as_py()
        expected_heads[key] = (tok.encode(text).ids + [eos])[:HEAD_TOKENS] if text else None
    state_file = workdir / f"resume-states-{os.getpid()}.json"
    state_file.write_text(json.dumps(states))

    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in states}
    try:
        for r in range(args.repeats):
            for key in states:
                res = run_child(["--child", "resume", *child_args(args, corpus, tok_path),
                                 "--state-file", str(state_file), "--state-key", key])
                runs[key].append(res)
                log(f"  repeat {r + 1}/{args.repeats} {'fresh start' if key == 'start' else 'resume at ' + key:<16}"
                    f" open {res['open_s'] * 1e3:6.1f} ms   iter+next {res['resume_s'] * 1e3:7.1f} ms")
    finally:
        state_file.unlink(missing_ok=True)
    for key, head in expected_heads.items():
        if head is None:
            log(f"  (resume at {key}: the named document is empty; head check skipped)")
            continue
        ok = all(run["head"][: len(head)] == head for run in runs[key])
        checks(ok, f"resume at {key}: first batch starts with the document the state names",
               f"seq {states[key]['position']['seq']}, {states[key]['position']['file']} rg {states[key]['position']['row_group']} row {states[key]['position']['row']}")

    med = {k: median([run["resume_s"] for run in v]) for k, v in runs.items()}
    open_med = median([run["open_s"] for k in runs for run in runs[k]])
    build_med = median([run["build_s"] for k in runs for run in runs[k]])
    at90, at10 = med["90%"], med["10%"]
    met = at90 < BAR_RESUME_S and at90 <= BAR_RESUME_RATIO * at10
    return {
        "corpus": str(corpus),
        "num_rows": num_rows,
        "num_files": manifest.num_files,
        "num_shards": manifest.num_shards,
        "warm_check_state_position": pos,
        "in_process_resume_s": warm_resume_s,
        "states_position": {k: (None if v is None else v["position"]) for k, v in states.items()},
        "batch_rows": ds.batch_rows,
        "first_chunk_rows": first_chunk_rows,
        "runs": runs,
        "median_resume_s": med,
        "median_open_s": open_med,
        "median_build_s": build_med,
        "ratio_90_10": at90 / at10 if at10 > 0 else None,
        "bar_met": met,
    }


def report_resume(res: dict[str, Any], args: argparse.Namespace) -> None:
    log(f"\n[3] Resume latency  (bar: at 90% < {BAR_RESUME_S:g} s and <= {BAR_RESUME_RATIO:g} x the 10% figure)")
    log(f"    corpus {args.resume_size:g} MB: {res['num_rows']} rows, {res['num_files']} files, {res['num_shards']} row groups;"
        f" each figure is a fresh process (cold file handles, warm page cache), median of {args.repeats}")
    rows = []
    for key, runs in res["runs"].items():
        pos = res["states_position"][key]
        where = "-" if pos is None else f"seq {pos['seq']} ({pos['file']} rg {pos['row_group']} row {pos['row']})"
        label = "fresh start: iter() + next" if key == "start" else f"resume at {key}: iter(st) + next"
        rows.append([label, where, res["first_chunk_rows"][key], f"{res['median_resume_s'][key] * 1e3:.1f}",
                     " ".join(f"{r['resume_s'] * 1e3:.0f}" for r in runs)])
    log(fmt_table(["measurement", "position", "rows to chunk end", "median ms", "per run ms"], rows))
    log(f"    (rows to chunk end: rows from the position to the end of its {res['batch_rows']}-row read chunk;"
        " if latency follows this column, whole chunks are tokenized before the first batch)")
    log(f"    open dataset (read_parquet, footers): median {res['median_open_s'] * 1e3:.1f} ms;"
        f" .tokenize().pack() (loads the tokenizer JSON): {res['median_build_s'] * 1e3:.1f} ms")
    log(f"    in-process resume from a state saved mid-stream (warm): {res['in_process_resume_s'] * 1e3:.1f} ms")
    ratio = "n/a" if res["ratio_90_10"] is None else f"{res['ratio_90_10']:.2f}"
    log(f"    90%: {res['median_resume_s']['90%'] * 1e3:.1f} ms, 90%/10% = {ratio}")
    log(f"    bar: {bar_word(res['bar_met'])}")


# -- main ---------------------------------------------------------------------------


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False):  # those options document their default themselves
            return action.help or ""
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark arrowstream: throughput vs the raw tokenizer, peak RSS vs corpus size, "
        "resume latency. See benchmarks/README.md.",
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "arrowstream-bench",
                   help="where corpora and the tokenizer are cached between runs")
    p.add_argument("--sizes", default=None, help=f"corpus sizes in MB of text for the RSS measurement [{DEFAULTS['sizes']}; smoke {SMOKE['sizes']}]")
    p.add_argument("--resume-size", type=float, default=None, help=f"MB of text of the resume corpus [{DEFAULTS['resume_size']:g}; smoke {SMOKE['resume_size']:g}]")
    p.add_argument("--repeats", type=int, default=None, help=f"repeats of each timing [{DEFAULTS['repeats']}; smoke {SMOKE['repeats']}]")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per packed row")
    p.add_argument("--batch-size", type=int, default=8, help="rows per packed batch")
    p.add_argument("--vocab-size", type=int, default=None, help=f"tokenizer vocabulary asked for [{DEFAULTS['vocab_size']}; smoke {SMOKE['vocab_size']}]")
    p.add_argument("--throughput-mb", type=float, default=None,
                   help="MB of text of the throughput corpus [min(smallest size, 85) ~ 20 M tokens]")
    p.add_argument("--raw-slice", type=int, default=1000, help="texts per raw encode_batch call")
    p.add_argument("--one-call-max-mb", type=float, default=100.0,
                   help="also time one encode_batch_fast call on all texts if they are at most this many MB")
    p.add_argument("--rss-max-batches", type=int, default=None, help="cap on batches streamed per size for RSS (default: whole corpus)")
    p.add_argument("--rss-repeats", type=int, default=1, help="RSS runs per size (peak RSS is not a timing)")
    p.add_argument("--resume-warm-batches", type=int, default=3, help="batches streamed before saving the real mid-stream state")
    p.add_argument("--rows-per-group", type=int, default=1000, help="rows per Parquet row group of generated corpora")
    p.add_argument("--mb-per-file", type=float, default=64.0, help="MB of text per generated Parquet file (at least 2 files)")
    p.add_argument("--seed", type=int, default=0, help="corpus seed")
    p.add_argument("--only", default="throughput,rss,resume", help="comma-separated subset of measurements to run")
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="write every result (per-run numbers included) to this JSON file")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 1 repeat, small vocabulary: a < 60 s check that the script works")
    # Hidden: child-process modes.
    p.add_argument("--child", choices=["rss", "resume", "throughput"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--backend", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--corpus", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", default=None, help=argparse.SUPPRESS)
    p.add_argument("--state-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--state-key", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return args
    base = SMOKE if args.smoke else DEFAULTS
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.size_list = sorted({float(s) for s in str(args.sizes).split(",") if s.strip()})
    if len(args.size_list) < 2:
        p.error("--sizes needs at least two sizes (the RSS bar compares the largest with the smallest)")
    if args.throughput_mb is None:
        args.throughput_mb = min(args.size_list[0], 85.0)
    args.phases = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = args.phases - {"throughput", "rss", "resume"}
    if unknown:
        p.error(f"--only: unknown measurement(s) {sorted(unknown)}")
    if args.repeats < 1 or args.rss_repeats < 1:
        p.error("--repeats and --rss-repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)

    t_start = time.perf_counter()
    workdir: Path = args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    checks = Checks()
    results: dict[str, Any] = {
        "config": {k: (str(v) if isinstance(v, Path) else sorted(v) if isinstance(v, set) else v)
                   for k, v in vars(args).items() if k not in ("child", "corpus", "tokenizer", "state_file", "state_key")},
        "machine": machine_facts(),
        "checks": checks.items,
    }
    m = results["machine"]
    log("arrowstream core benchmark" + (" (smoke)" if args.smoke else ""))
    log(f"  cpus {m['cpu_count']} (affinity {m['cpu_affinity']}), mem {m['mem_total_mib']} MiB, python {m['python']}, "
        f"arrowstream {m['arrowstream']}, pyarrow {m['pyarrow']}, tokenizers {m['tokenizers']}, numpy {m['numpy']}")
    g = m["git"]
    log(f"  arrowstream from {g['root']} at commit {g.get('commit')}"
        + (" with local changes under arrowstream/" if g.get("arrowstream_dirty") else ""))
    log(f"  {m['platform']}; load average {m['loadavg_start']}; env {m['env']}")
    if m["loadavg_start"] and m["cpu_count"] and m["loadavg_start"][0] > 0.5 * m["cpu_count"]:
        log("  WARNING: the machine is busy (load average above half the CPUs): timings will be noisy")
    log(f"  workdir {workdir}")

    status = 0
    try:
        log("\n[0] Preparing tokenizer and corpora (cached in workdir)")
        tok_path, tok_info = tokenizer_file(workdir, args.vocab_size)
        results["tokenizer"] = tok_info
        log(f"  tokenizer {tok_path.name}: vocab {tok_info['vocab_size']} (asked {args.vocab_size}), eos id {tok_info['eos_id']}"
            + (" [cached]" if tok_info["cached"] else ""))
        corpora_info: dict[str, Any] = {}

        def get(size: float) -> Path:
            path, info = corpus_dir(workdir, size, seed=args.seed, rows_per_group=args.rows_per_group, mb_per_file=args.mb_per_file)
            corpora_info[f"{size:g}"] = info
            return path

        sizes = {s: get(s) for s in args.size_list} if "rss" in args.phases else {}
        resume_corpus = get(args.resume_size) if "resume" in args.phases else None
        tp_corpus = get(args.throughput_mb) if "throughput" in args.phases else None
        results["corpora"] = corpora_info
        rows = [[f"{float(k):g} MB", v["rows"], v["row_groups"], v["num_files"], f"{v['parquet_bytes'] / 2**20:.1f}",
                 "cached" if v["cached"] else f"written in {v['write_seconds']:.1f} s"] for k, v in corpora_info.items()]
        log(fmt_table(["corpus (text)", "rows", "row groups", "files", "parquet MiB", ""], rows))

        # Children first, while this process is small; throughput (which holds texts in memory) last.
        if "rss" in args.phases:
            log("\n[2] Peak RSS: streaming each corpus in a fresh process ...")
            results["rss"] = measure_rss(args, sizes, tok_path, checks)
        if "resume" in args.phases:
            log("\n[3] Resume latency ...")
            assert resume_corpus is not None
            results["resume"] = measure_resume(args, resume_corpus, tok_path, workdir, checks)
        if "throughput" in args.phases:
            log("\n[1] Throughput: raw tokenizer vs pipeline, interleaved ...")
            assert tp_corpus is not None
            results["throughput"] = measure_throughput(args, tp_corpus, tok_path, checks)
    except CheckFailed as exc:
        log(f"\nCORRECTNESS CHECK FAILED: {exc}")
        results["error"] = f"check failed: {exc}"
        status = 1
    except Exception as exc:  # noqa: BLE001 - report, write what we have, exit 2
        traceback.print_exc()
        results["error"] = f"{type(exc).__name__}: {exc}"
        status = 2

    log("\n" + "=" * 78)
    log("RESULTS" + (" (smoke: tiny sizes, figures not meaningful)" if args.smoke else ""))
    log(f"  machine: {m['cpu_count']} cpus, python {m['python']}, arrowstream {m['arrowstream']}, pyarrow {m['pyarrow']},"
        f" tokenizers {m['tokenizers']}, numpy {m['numpy']}; tokenizer vocab {results.get('tokenizer', {}).get('vocab_size')};"
        f" commit {m['git'].get('commit')}{' (+local changes)' if m['git'].get('arrowstream_dirty') else ''}")
    if "throughput" in results:
        report_throughput(results["throughput"], args)
    if "rss" in results:
        report_rss(results["rss"], args)
    if "resume" in results:
        report_resume(results["resume"], args)
    bars = {k: results[k]["bar_met"] for k in ("throughput", "rss", "resume") if k in results}
    results["bars"] = bars
    results["loadavg_end"] = loadavg()
    results["total_seconds"] = time.perf_counter() - t_start
    log("\nSummary")
    for name in ("throughput", "rss", "resume"):
        if name in bars:
            log(f"  bar {name:<10} {bar_word(bars[name])}")
    n_ok = sum(c["passed"] for c in checks.items)
    log(f"  correctness checks: {n_ok}/{len(checks.items)} passed" + ("" if status == 0 else f"; FAILED ({results['error']})"))
    log(f"  load average at end {results['loadavg_end']}; total {results['total_seconds']:.1f} s")
    if args.json is not None:
        results["status"] = status
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str))
        log(f"  wrote {args.json}")
    return status


if __name__ == "__main__":
    sys.exit(main())
