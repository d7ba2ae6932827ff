#!/usr/bin/env python
"""Packing strategies compared on one corpus: padding, cut documents, speed, resume.

For each strategy (``concat`` and ``best_fit`` at a few window sizes) one
epoch of the same pre-tokenized corpus is packed, and the script reports:

- padding: padding tokens / all tokens of the batches;
- cuts: segments that are only a piece of a document, per 100 documents
  (``concat`` cuts a document at every row end it crosses; ``best_fit`` only
  splits documents longer than ``seq_len``);
- batches, and packing speed in tokens/s (median of ``--repeats`` runs,
  strategies alternated so load spikes hit all of them), as a ratio to
  ``concat`` measured in the same run;
- resume: the state's JSON size at mid-epoch, the rows between the resume
  position and the read mark (documents re-read), and the time of
  ``ds.iter(state)`` plus the first batch (median).

Then the end-to-end ratio with the real tokenizer: ``best_fit`` tokens/s over
``concat`` tokens/s on the text corpus (both are tokenizer-bound, so it
should be close to 1).

Correctness check: every strategy emits every token of the corpus exactly once
(``long_docs="split"``), and a resumed stream equals the uninterrupted one.

Corpora and tokenizers are cached like ``bench_core.py`` (same ``--workdir``).
``--smoke`` runs tiny sizes in seconds. Exit status: 0 when the checks pass, 1
when one fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer

import arrowstream
from harness import (
    Checks,
    CheckFailed,
    corpus_dir,
    fmt_table,
    log,
    machine_facts,
    median,
    tokenizer_file,
)

STRATEGIES: list[tuple[str, dict[str, Any]]] = [
    ("concat", {"strategy": "concat"}),
    ("best_fit window=256", {"strategy": "best_fit", "window": 256}),
    ("best_fit window=1024 (default)", {"strategy": "best_fit"}),
    ("best_fit window=4096", {"strategy": "best_fit", "window": 4096}),
]


def pretokenize(corpus: Path, tok_path: Path, out: Path) -> Path:
    """Write the corpus's token ids (no EOS) as Parquet, once; return the directory."""
    marker = out / "_done.json"
    if marker.is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(tok_path))
    for path in sorted(corpus.glob("*.parquet")):
        pf = pq.ParquetFile(path)
        writer = None
        for rg in range(pf.num_row_groups):
            texts = pf.read_row_group(rg, columns=["text"]).column("text").to_pylist()
            ids = [e.ids for e in tok.encode_batch_fast([t or "" for t in texts])]
            table = pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32()))})
            if writer is None:
                writer = pq.ParquetWriter(out / path.name, table.schema)
            writer.write_table(table, row_group_size=len(ids))
        if writer is not None:
            writer.close()
    marker.write_text("{}")
    return out


def pipeline(source: Path, *, eos_id: int, seq_len: int, batch_size: int, pack: dict, tok: Any = None):  # noqa: ANN202
    ds = arrowstream.read_parquet(source)
    ds = ds.tokenize(tok, column="text") if tok is not None else ds.tokenize(None, column="input_ids", eos_id=eos_id)
    return ds.pack(seq_len=seq_len, batch_size=batch_size, **pack)


def run_epoch(ds: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    it = ds.iter()
    segments = cut = padding = real = batches = 0
    for b in it:
        segments += b["num_docs"]
        cut += b["num_cut_docs"]
        padding += b["num_padding_tokens"]
        real += b["num_tokens"]
        batches += 1
    wall = time.perf_counter() - t0
    stats = it.stats
    it.close()
    return {
        "wall_s": wall,
        "tok_per_s": real / wall,
        "tokens": real,
        "padding_tokens": padding,
        "segments": segments,
        "cut_segments": cut,
        "docs": stats["docs"],
        "batches": batches,
        "stats": stats,
    }


def measure_resume(ds: Any, batches: int, repeats: int, checks: Checks, name: str) -> dict[str, Any]:
    it = ds.iter()
    for _ in range(batches // 2):
        next(it)
    state = json.loads(json.dumps(it.state_dict()))
    expected = [next(it)["input_ids"].tobytes() for _ in range(3)]
    it.close()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        again = ds.iter(state)
        first = next(again)
        times.append(time.perf_counter() - t0)
        got = [first["input_ids"].tobytes()] + [next(again)["input_ids"].tobytes() for _ in range(2)]
        again.close()
        checks(got == expected, f"{name}: a resumed stream continues identically")
    held = state.get("held")
    reread = (held["read"][1] - state["position"]["seq"]) if held else 0
    return {"state_bytes": len(json.dumps(state)), "reread_rows": reread, "resume_s": median(times)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/arrowstream-bench"))
    p.add_argument("--mb", type=float, default=None, help="MB of text in the corpus [20; smoke 2]")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=None, help="timed runs per strategy [3; smoke 1]")
    p.add_argument("--vocab-size", type=int, default=None, help="[32000; smoke 4096]")
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    mb = args.mb if args.mb is not None else (2.0 if args.smoke else 20.0)
    repeats = args.repeats if args.repeats is not None else (1 if args.smoke else 3)
    vocab = args.vocab_size if args.vocab_size is not None else (4096 if args.smoke else 32000)
    checks = Checks()
    log("machine: " + json.dumps(machine_facts()))
    corpus, cinfo = corpus_dir(args.workdir, mb, seed=0, rows_per_group=1000, mb_per_file=64.0)
    tok_path, tinfo = tokenizer_file(args.workdir, vocab)
    eos_id = tinfo["eos_id"]
    pretok = pretokenize(corpus, tok_path, args.workdir / "pretokenized" / f"{cinfo['key']}-vocab{vocab}")
    lengths = np.concatenate([
        pq.read_table(f, columns=["input_ids"]).column("input_ids").combine_chunks().value_lengths().to_numpy()
        for f in sorted(pretok.glob("*.parquet"))
    ]) + 1  # with EOS
    L, B = args.seq_len, args.batch_size
    log(f"corpus: {cinfo['key']}, {lengths.size} documents, {int(lengths.sum()):,} tokens with EOS; "
        f"tokens per document: median {int(np.median(lengths))}, p90 {int(np.percentile(lengths, 90))}, "
        f"max {int(lengths.max())}; {int((lengths > L).sum())} longer than seq_len={L}")

    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in STRATEGIES}
    for _ in range(repeats):  # alternate strategies so a load spike hits all of them
        for name, pack in STRATEGIES:
            runs[name].append(run_epoch(pipeline(pretok, eos_id=eos_id, seq_len=L, batch_size=B, pack=pack)))
    total = int(lengths.sum())
    results: dict[str, Any] = {}
    base = median([r["tok_per_s"] for r in runs["concat"]])
    for name, pack in STRATEGIES:
        first = runs[name][0]
        checks(first["tokens"] == total, f"{name}: every token emitted once", f"{first['tokens']} of {total}")
        ds = pipeline(pretok, eos_id=eos_id, seq_len=L, batch_size=B, pack=pack)
        resume = measure_resume(ds, first["batches"], max(repeats, 3), checks, name)
        tps = median([r["tok_per_s"] for r in runs[name]])
        results[name] = {
            "padding_fraction": first["padding_tokens"] / (first["padding_tokens"] + first["tokens"]),
            "cut_per_100_docs": 100 * first["cut_segments"] / first["docs"],
            "batches": first["batches"],
            "tok_per_s": tps,
            "ratio_to_concat": tps / base,
            **resume,
        }
    rows = [
        [name, f"{r['padding_fraction']:.2%}", f"{r['cut_per_100_docs']:.1f}", r["batches"],
         f"{r['tok_per_s'] / 1e6:.1f} M", f"{r['ratio_to_concat']:.2f}", r["state_bytes"],
         r["reread_rows"], f"{r['resume_s'] * 1000:.0f} ms"]
        for name, r in results.items()
    ]
    log(f"\npacking one epoch of pre-tokenized data, seq_len={L}, batch_size={B} "
        f"(medians of {repeats}):\n")
    log(fmt_table(["strategy", "padding", "cuts/100 docs", "batches", "tok/s", "vs concat",
                   "state B", "rows re-read", "resume"], rows))

    tok = Tokenizer.from_file(str(tok_path))
    e2e: dict[str, list[float]] = {"concat": [], "best_fit": []}
    for _ in range(repeats):
        for name in e2e:
            ds = pipeline(corpus, eos_id=eos_id, seq_len=L, batch_size=B, pack={"strategy": name}, tok=tok)
            e2e[name].append(run_epoch(ds)["tok_per_s"])
    ratio = median(e2e["best_fit"]) / median(e2e["concat"])
    log(f"\nend to end with the tokenizer: concat {median(e2e['concat']) / 1e6:.3f} M tok/s, "
        f"best_fit {median(e2e['best_fit']) / 1e6:.3f} M tok/s, ratio {ratio:.2f}")
    failed = [c for c in checks.items if not c["passed"]]
    log(f"\ncorrectness checks: {len(checks.items) - len(failed)} passed, {len(failed)} failed")
    if args.json:
        args.json.write_text(json.dumps({
            "machine": machine_facts(), "corpus": cinfo, "seq_len": L, "batch_size": B, "repeats": repeats,
            "results": results, "end_to_end": {**e2e, "ratio": ratio}, "checks": checks.items,
        }, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CheckFailed:
        sys.exit(1)
