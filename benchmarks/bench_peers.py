#!/usr/bin/env python
"""arrowstream against the raw encoder and Hugging Face ``datasets`` streaming, side by side.

One corpus, one byte-level BPE tokenizer, one packing shape. Every run is a
fresh child process (so peak RSS is its own), runs alternate across configs,
and figures are medians of ``--repeats``:

- ``raw``: the tokenizer's fastest batch method (``encode_batch_fast``,
  1,000 texts per call) over the corpus's texts already in memory: the
  ceiling. Reading the Parquet into memory is not timed.
- ``arrowstream <strategy>, workers=k``: ``read_parquet(...).tokenize(tok)
  .pack(seq_len, batch_size, strategy)`` (``bucket``: ``.bucket(max_tokens=
  seq_len * batch_size, max_len=seq_len)``, longer documents truncated), iterated directly (k=0) or through
  ``DataLoader(ds.to_torch(), batch_size=None, num_workers=k)`` (with
  ``even_batches=False``, so that every token comes out with workers too).
- ``datasets, workers=k``: ``load_dataset("parquet", streaming=True)``, a
  batched ``map`` that tokenizes with the same tokenizer (EOS appended), a
  batched ``map`` that concatenates each 1,000-document map batch and cuts it
  into rows of ``seq_len`` (the ``run_clm`` recipe, with numpy), torch format,
  ``DataLoader(batch_size, num_workers=k)``.

Figures: tokens/s over the whole epoch (first batch included), time to first
batch (both from after ``import torch``, which a training process has done
before it loads data; importing the loader library counts), peak RSS of the main process (``VmHWM``), and the peak memory of the
whole process tree, DataLoader workers included: the sum of the processes'
proportional set sizes (PSS: pages shared after a fork counted once in all),
sampled every 50 ms; and that peak minus the same measure of an idle process
that imported torch and the loader (``above idle``: the loader's working
memory). arrowstream without workers is iterated through ``ds.to_torch()``,
so torch is loaded on both sides, as in training. Resume latency at 10 %, 50 % and 90 % of the epoch: for
arrowstream, ``ds.iter(state)`` plus the first batch; for ``datasets``, its
own ``state_dict``/``load_state_dict`` plus the first example; and skipping
(``.skip(n)``) to the same point.

Check: arrowstream emits exactly the raw encoder's tokens plus one EOS per
document. Output: the tables as text, in Markdown (``--markdown``), and JSON
with versions and machine facts (``--json``). ``--smoke`` runs a tiny corpus once. Needs ``datasets``
(``pip install 'arrowstream[bench]'``). Exit status 0 when the checks pass.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_core import Checks, corpus_dir, fmt_table, log, machine_facts, md_table, median, tokenizer_file

RESULT = "BENCH_PEERS_RESULT "


def _peak_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _texts(corpus: Path) -> list[str]:
    import pyarrow.parquet as pq

    return [t for f in sorted(corpus.glob("*.parquet")) for t in pq.read_table(f, columns=["text"]).column("text").to_pylist() if t]


def _hf_dataset(corpus: Path, tok_path: Path, seq_len: int) -> Any:
    import numpy as np
    from datasets import load_dataset
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    eos = tok.token_to_id("<|endoftext|>")

    def tokenize(batch: dict) -> dict:
        return {"input_ids": [e.ids + [eos] for e in tok.encode_batch_fast(batch["text"])]}

    def group(batch: dict) -> dict:
        flat = np.concatenate([np.asarray(x, dtype=np.int32) for x in batch["input_ids"]])
        n = flat.size // seq_len * seq_len
        return {"input_ids": flat[:n].reshape(-1, seq_len)}

    files = [str(p) for p in sorted(corpus.glob("*.parquet"))]
    ds = load_dataset("parquet", data_files=files, streaming=True, split="train")
    ds = ds.map(tokenize, batched=True, batch_size=1000, remove_columns=["id", "text", "source"])
    return ds.map(group, batched=True, batch_size=1000).with_format("torch")


def _ours(corpus: Path, tok_path: Path, seq_len: int, batch_size: int, strategy: str) -> Any:
    import arrowstream

    # even_batches=False: with DataLoader workers every token still comes out, so the check is exact
    ds = arrowstream.read_parquet(corpus).tokenize(str(tok_path))
    if strategy == "bucket":  # one document per row, at most batch_size * seq_len tokens with padding
        return ds.bucket(max_tokens=seq_len * batch_size, max_len=seq_len, even_batches=False)
    return ds.pack(seq_len=seq_len, batch_size=batch_size, strategy=strategy, even_batches=False)


def child(args: argparse.Namespace) -> dict[str, Any]:
    corpus, tok_path = Path(args.corpus), Path(args.tokenizer)
    L, B = args.seq_len, args.batch_size
    kind, workers = args.child, args.workers
    if kind == "raw":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_path))
        texts = _texts(corpus)
        t0 = time.perf_counter()
        n = sum(len(e.ids) for a in range(0, len(texts), 1000) for e in tok.encode_batch_fast(texts[a : a + 1000]))
        wall = time.perf_counter() - t0
        return {"tokens": n, "docs": len(texts), "wall_s": wall, "tok_per_s": n / wall, "peak_mb": _peak_mb()}
    import torch  # a training process has it loaded before it loads data, whichever loader it uses

    t0 = time.perf_counter()

    if kind.startswith("idle"):  # the libraries loaded, nothing read: the memory floor of each side
        import arrowstream  # noqa: F401

        if kind == "idle-datasets":
            import datasets  # noqa: F401
        time.sleep(0.5)
        return {"peak_mb": _peak_mb()}
    if kind == "datasets":
        ds = _hf_dataset(corpus, tok_path, L)
        loader = torch.utils.data.DataLoader(ds, batch_size=B, num_workers=workers)
        count = lambda b: int(b["input_ids"].numel())  # noqa: E731
    else:
        ds = _ours(corpus, tok_path, L, B, kind)
        if workers:
            loader = torch.utils.data.DataLoader(ds.to_torch(), batch_size=None, num_workers=workers)
            count = lambda b: int(b["num_tokens"])  # noqa: E731
        else:
            loader = ds.to_torch()  # tensors, as a training loop takes them
            count = lambda b: int(b["num_tokens"])  # noqa: E731
    first = None
    cut = 0
    tokens = batches = 0
    for b in loader:
        if first is None:
            first = time.perf_counter() - t0
        tokens += count(b)
        batches += 1
    wall = time.perf_counter() - t0
    if kind == "bucket" and not workers:
        cut = loader.state_dict()["stats"].get("truncated_tokens", 0)
    return {"tokens": tokens, "batches": batches, "wall_s": wall, "first_batch_s": first,
            "tok_per_s": tokens / wall, "peak_mb": _peak_mb(), "truncated_tokens": cut}


def child_resume(args: argparse.Namespace) -> dict[str, Any]:
    corpus, tok_path = Path(args.corpus), Path(args.tokenizer)
    state = json.loads(Path(args.state).read_text()) if args.state else None
    t0 = time.perf_counter()
    if args.child == "resume-ours":
        it = _ours(corpus, tok_path, args.seq_len, args.batch_size, "concat").iter(state)
        next(it)
    elif args.child == "resume-datasets":
        ds = _hf_dataset(corpus, tok_path, args.seq_len)
        ds.load_state_dict(state)
        next(iter(ds))
    else:  # skip
        ds = _hf_dataset(corpus, tok_path, args.seq_len).skip(args.skip)
        next(iter(ds))
    return {"resume_s": time.perf_counter() - t0}


def _tree(pid: int) -> list[int]:
    """Return ``pid`` and its descendants (DataLoader workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _pss_mb(pids: list[int]) -> float:
    """Sum the proportional set size of ``pids``: shared pages (a fork's) are counted once in all."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def run_child(script_args: list[str]) -> dict[str, Any]:
    """Run one measurement in a fresh process; sample the memory of its process tree every 50 ms."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "true"}
    proc = subprocess.Popen([sys.executable, __file__, *script_args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, _pss_mb(_tree(proc.pid)))
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"child {script_args} failed:\n{err[-3000:]}")
    line = next(ln for ln in out.splitlines() if ln.startswith(RESULT))
    return {**json.loads(line[len(RESULT):]), "tree_pss_mb": peak}


def save_states(
    corpus: Path, tok_path: Path, seq_len: int, batch_size: int, total_batches: int, out: Path, points: tuple
) -> dict:
    """Save arrowstream and datasets states at 10/50/90 % of the epoch; return their paths and offsets."""
    ds = _ours(corpus, tok_path, seq_len, batch_size, "concat")
    it = ds.iter()
    hf_iter_ds = _hf_dataset(corpus, tok_path, seq_len)
    hf_it = iter(hf_iter_ds)
    saved: dict[str, Any] = {}
    done = hf_done = 0
    for point in points:
        target = int(total_batches * point)
        while done < target:
            next(it)
            done += 1
        while hf_done < target * batch_size:  # datasets yields rows; batches are formed by the loader
            next(hf_it)
            hf_done += 1
        ours_path = out / f"ours-{point}.json"
        ours_path.write_text(json.dumps(it.state_dict()))
        hf_path = out / f"datasets-{point}.json"
        hf_path.write_text(json.dumps(hf_iter_ds.state_dict(), default=int))
        saved[str(point)] = {"ours": str(ours_path), "datasets": str(hf_path), "rows": hf_done}
    it.close()
    return saved


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/arrowstream-bench"))
    p.add_argument("--mb", type=float, default=None, help="MB of text [85 (about 20 M tokens); smoke 2]")
    p.add_argument("--rows-per-group", type=int, default=2000, help="documents per Parquet row group [2000]")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--vocab-size", type=int, default=None, help="[32000; smoke 4096]")
    p.add_argument("--repeats", type=int, default=None, help="[3; smoke 1]")
    p.add_argument("--strategies", default=None, help="[concat,best_fit,bucket; smoke concat]")
    p.add_argument("--points", default=None, help="resume points [0.1,0.5,0.9; smoke 0.5]")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, help="write the tables in Markdown to this file")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--corpus", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", default=None, help=argparse.SUPPRESS)
    p.add_argument("--state", default=None, help=argparse.SUPPRESS)
    p.add_argument("--skip", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        fn = child_resume if args.child.startswith(("resume", "skip")) else child
        print(RESULT + json.dumps(fn(args)))
        return 0
    mb = args.mb if args.mb is not None else (2.0 if args.smoke else 85.0)
    vocab = args.vocab_size or (4096 if args.smoke else 32000)
    repeats = args.repeats or (1 if args.smoke else 3)
    strategies = (args.strategies or ("concat" if args.smoke else "concat,best_fit,bucket")).split(",")
    points = tuple(float(x) for x in (args.points or ("0.5" if args.smoke else "0.1,0.5,0.9")).split(","))
    L, B = args.seq_len, args.batch_size
    checks = Checks()
    facts = machine_facts()
    log("machine: " + json.dumps(facts))
    corpus, cinfo = corpus_dir(args.workdir, mb, seed=0, rows_per_group=args.rows_per_group, mb_per_file=64.0)
    tok_path, tinfo = tokenizer_file(args.workdir, vocab)
    base = ["--corpus", str(corpus), "--tokenizer", str(tok_path), "--seq-len", str(L), "--batch-size", str(B)]
    configs = [("raw", 0)]
    for strategy in strategies:
        configs += [(strategy, 0), (strategy, 2)]
    configs += [("datasets", 0), ("datasets", 2), ("idle-ours", 0), ("idle-datasets", 0)]
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in range(repeats):
        for kind, workers in configs:
            if kind == "raw":
                name = "raw encoder"
            elif kind.startswith("idle") or kind == "datasets":
                name = kind if kind.startswith("idle") else f"datasets, workers={workers}"
            else:
                name = f"arrowstream {kind}, workers={workers}"
            log(f"  run {r + 1}/{repeats}: {name}")
            runs.setdefault(name, []).append(run_child(["--child", kind, "--workers", str(workers), *base]))
    raw = runs["raw encoder"][0]
    expected = raw["tokens"] + raw["docs"]
    for name, rs in runs.items():
        if name.startswith("arrowstream bucket, workers=0"):
            got = rs[0]["tokens"] + rs[0]["truncated_tokens"]
            checks(got == expected, f"{name}: the raw encoder's tokens plus one EOS per document, "
                   "with the tokens cut from documents longer than seq_len", f"{got} vs {expected}")
        elif name.startswith("arrowstream bucket"):
            want = runs["arrowstream bucket, workers=0"][0]["tokens"]
            checks(rs[0]["tokens"] == want, f"{name}: the same tokens as without workers", f"{rs[0]['tokens']} vs {want}")
        elif name.startswith("arrowstream"):
            checks(rs[0]["tokens"] == expected, f"{name}: the raw encoder's tokens plus one EOS per document",
                   f"{rs[0]['tokens']} vs {expected}")
    idle = {side: median([x["tree_pss_mb"] for x in runs.pop(f"idle-{side}")]) for side in ("ours", "datasets")}
    table = {
        name: {
            "tok_per_s": median([x["tok_per_s"] for x in rs]),
            "first_batch_s": median([x["first_batch_s"] for x in rs]) if "first_batch_s" in rs[0] else None,
            "peak_mb": max(x["peak_mb"] for x in rs),
            "tree_pss_mb": max(x["tree_pss_mb"] for x in rs),
            "working_mb": None if name == "raw encoder" else max(x["tree_pss_mb"] for x in rs)
            - idle["ours" if name.startswith("arrowstream") else "datasets"],
            "tokens": rs[0]["tokens"],
        }
        for name, rs in runs.items()
    }
    ceiling = table["raw encoder"]["tok_per_s"]
    hf = {w: table[f"datasets, workers={w}"] for w in (0, 2)}
    rows = []
    for name, t in table.items():
        workers = 2 if name.endswith("workers=2") else 0
        vs_hf = t["tok_per_s"] / hf[workers]["tok_per_s"] if name.startswith("arrowstream") else None
        rows.append([
            name, f"{t['tok_per_s'] / 1e6:.3f}", f"{t['tok_per_s'] / ceiling:.2f}",
            "-" if vs_hf is None else f"{vs_hf:.2f}",
            "-" if t["first_batch_s"] is None else f"{t['first_batch_s']:.2f}",
            f"{t['peak_mb']:.0f}", f"{t['tree_pss_mb']:.0f}",
            "-" if t["working_mb"] is None else f"{t['working_mb']:.0f}",
        ])
    header = ["pipeline", "M tok/s", "vs raw", "vs datasets", "first batch s", "peak RSS MB (main)",
              "peak PSS MB (all processes)", "above idle MB"]
    log(f"\n{cinfo['key']}: {expected:,} tokens, seq_len={L}, batch_size={B}, medians of {repeats}:\n")
    log(fmt_table(header, rows))
    markdown = [md_table(header, rows)]
    log(f"\nidle (torch and the loader imported, nothing read), PSS: arrowstream {idle['ours']:.0f} MB, "
        f"datasets {idle['datasets']:.0f} MB; 'above idle' is the peak PSS of all processes minus it")

    total_batches = runs["arrowstream concat, workers=0"][0]["batches"]
    states_dir = args.workdir / "peer-states"
    states_dir.mkdir(parents=True, exist_ok=True)
    saved = save_states(corpus, tok_path, L, B, total_batches, states_dir, points)
    resume: dict[str, dict[str, float]] = {}
    for point in points:
        s = saved[str(point)]
        got: dict[str, list[float]] = {"arrowstream": [], "datasets state_dict": [], "datasets skip": []}
        for _ in range(repeats):
            got["arrowstream"].append(run_child(["--child", "resume-ours", "--state", s["ours"], *base])["resume_s"])
            got["datasets state_dict"].append(
                run_child(["--child", "resume-datasets", "--state", s["datasets"], *base])["resume_s"])
            got["datasets skip"].append(run_child(["--child", "skip", "--skip", str(s["rows"]), *base])["resume_s"])
        resume[f"{round(point * 100)}%"] = {k: median(v) for k, v in got.items()}
    rrows = [[k, *(f"{resume[p][k]:.2f}" for p in resume)] for k in ("arrowstream", "datasets state_dict", "datasets skip")]
    log("\nresume latency, seconds (new process: open, load the state, first batch or example):\n")
    log(fmt_table(["", *resume], rrows))
    markdown.append(md_table(["resume, seconds", *resume], rrows))
    if args.markdown:
        args.markdown.write_text("\n\n".join(markdown) + "\n")
        log(f"\nwrote the tables in Markdown to {args.markdown}")
    failed = [c for c in checks.items if not c["passed"]]
    log(f"\ncorrectness checks: {len(checks.items) - len(failed)} passed, {len(failed)} failed")
    if args.json:
        import datasets
        import tokenizers
        import torch

        args.json.write_text(json.dumps({
            "machine": facts, "versions": {"datasets": datasets.__version__, "torch": torch.__version__,
                                           "tokenizers": tokenizers.__version__},
            "corpus": cinfo, "tokenizer": tinfo, "seq_len": L, "batch_size": B, "repeats": repeats,
            "runs": runs, "table": table, "idle_pss_mb": idle, "resume": resume, "checks": checks.items,
        }, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
