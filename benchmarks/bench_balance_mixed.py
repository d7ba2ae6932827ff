#!/usr/bin/env python
"""Even batches on a corpus whose parts differ in tokens per byte: estimated, carried, counted.

The estimated mode cuts each epoch into shares of equal Parquet bytes and
takes one token rate for all of them. On a corpus of one kind of text that is
close (``bench_balance.py``: 0.023 % dropped); here half the files are prose
and half are identifier soup (random lowercase and digit words, several
tokens each with a BPE trained on prose), so shares of equal bytes hold
unequal tokens and the estimate is off for every share. The script prints,
for all consumers of 8 ranks x 2 DataLoader workers, ``concat`` 2048 x 8:

- one epoch, estimated: the share of tokens dropped and of padding;
- two shuffled epochs, estimated, with ``even_batches=True`` (what a consumer
  holds beyond the target is carried into the next epoch, dropped only in the
  last) against ``even_batches="drop"`` (dropped in every epoch);
- one epoch counted with a length index: nothing dropped.

Run: ``python benchmarks/bench_balance_mixed.py`` (200 MB, a few minutes on 2
cores); ``--smoke`` for a tiny corpus.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from bench_balance import parse_args, run_epoch
from harness import CheckFailed, Checks, fmt_table, log, machine_facts, tokenizer_file


def mixed_corpus(workdir: Path, size_mb: float, *, files: int = 8, rows_per_group: int = 1000) -> Path:
    """Return a corpus of ``size_mb`` MB: even files prose, odd files identifier soup (written once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from arrowstream.testing.texts import make_texts

    out = workdir / "corpora" / f"mixed{int(size_mb * 1e6)}B-files{files}-rg{rows_per_group}-v1"
    marker = out / "_bench_corpus.json"
    if marker.is_file():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    per_file = size_mb * 1e6 / files
    step = 2000 if size_mb >= 50 else 100  # documents generated at a time: a small corpus stays small
    rng = np.random.default_rng(7)
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789"))
    for f in range(files):
        texts: list[str] = []
        size = 0
        seed = 100 * f
        while size < per_file:
            batch = make_texts(step, seed=seed)
            seed += 1
            if f % 2:  # the same document lengths, every word replaced by a random identifier
                batch = [
                    " ".join("".join(rng.choice(alphabet, size=len(w))) for w in text.split())
                    for text in batch
                ]
            texts += batch
            size += sum(len(t) for t in batch)
        pq.write_table(pa.table({"text": texts}), out / f"part-{f:05d}.parquet", row_group_size=rows_per_group)
    marker.write_text(json.dumps({"size_mb": size_mb, "files": files}))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, 200.0, 4.0)
    from arrowstream import build_length_index, read_parquet

    corpus = mixed_corpus(args.workdir, args.size_mb)
    tok_path, _ = tokenizer_file(args.workdir, args.vocab_size)
    tok = str(tok_path)
    pack = {"seq_len": args.seq_len, "batch_size": args.batch_size}
    world, workers = args.ranks, args.workers
    log(f"mixed corpus {corpus}; {world} ranks x {workers} workers, concat {args.seq_len} x {args.batch_size}")
    index = Path(tempfile.mkdtemp(prefix="arrowstream-mixed-index-"))
    results: dict[str, Any] = {}
    try:
        results["one epoch, estimated"] = run_epoch(read_parquet(corpus).tokenize(tok).pack(**pack), world, workers)
        for even in (True, "drop"):
            ds = read_parquet(corpus, num_epochs=2).shuffle(seed=1).tokenize(tok).pack(even_batches=even, **pack)
            name = f"two shuffled epochs, estimated, even_batches={even!r}"
            results[name] = run_epoch(ds, world, workers)  # both epochs: the iterators run to their end
        build_length_index(corpus, tok, length_index=index)
        counted = read_parquet(corpus).tokenize(tok, length_index=index).pack(**pack)
        results["one epoch, counted (length index)"] = run_epoch(counted, world, workers)
    finally:
        shutil.rmtree(index, ignore_errors=True)

    one_epoch = results["one epoch, estimated"]["tokens"] + results["one epoch, estimated"]["dropped_tokens"]
    rows = []
    for name, res in results.items():
        epochs = 2 if name.startswith("two") else 1
        corpus_tokens = one_epoch * epochs
        rows.append([
            name,
            f"{res['dropped_tokens'] / corpus_tokens:.3%}",
            f"{res['dropped_docs']:,}",
            f"{res.get('carried_tokens', 0) / corpus_tokens:.3%}",
            f"{res['padding_tokens'] / max(res['tokens'], 1):.3%}",
            f"{max(res['padding_batches_per_rank'])}",
        ])
    print()
    print(fmt_table(
        ["run", "tokens dropped", "documents dropped", "tokens carried", "padding / tokens emitted",
         "padding batches (most on a rank)"],
        rows,
    ))
    print(f"\ncorpus: {one_epoch:,} tokens with EOS an epoch")
    checks = Checks()
    failed = None
    try:
        carry = results["two shuffled epochs, estimated, even_batches=True"]
        drop = results["two shuffled epochs, estimated, even_batches='drop'"]
        checks(carry["dropped_tokens"] <= drop["dropped_tokens"], "carrying drops no more than dropping every epoch",
               f"{carry['dropped_tokens']:,} vs {drop['dropped_tokens']:,}")
        checks(results["one epoch, counted (length index)"]["dropped_tokens"] == 0, "counted: nothing dropped",
               str(results["one epoch, counted (length index)"]["dropped_tokens"]))
        for name, res in results.items():
            checks(len(res["batches_per_rank"]) == 1, f"{name}: every rank the same batches",
                   str(res["batches_per_rank"]))
    except CheckFailed as exc:
        failed = exc
    if args.json:
        args.json.write_text(json.dumps({
            "args": {k: str(v) for k, v in vars(args).items()}, "machine": machine_facts(),
            "results": results, "checks": checks.items,
        }, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
