"""``arrowstream analyze``: document lengths and what each batching strategy costs, or a mixture's budget."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from arrowstream.analysis import analyze
from arrowstream.analysis.report import render_analysis
from arrowstream.cli.common import UsageError, check_output, check_tokenizer, positive_int
from arrowstream.cli.mixfile import load_mixture

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Add ``analyze`` to the command's subparsers."""
    p = sub.add_parser("analyze", help="document lengths and what each batching strategy costs")
    p.add_argument("path", nargs="?", help="directory, glob, file or URI (or --mixture FILE)")
    p.add_argument(
        "--mixture", metavar="FILE",
        help="a mixture file (sources, weights, budget; see docs/mixtures.md): report the tokens and "
        "epochs a run takes from each source (with --tokenizer, --seq-len, --tokens)",
    )
    p.add_argument("--tokens", type=positive_int, help="the run's token budget for --mixture (default: the file's num_tokens)")
    p.add_argument(
        "--world-size", type=positive_int, default=1,
        help="with --mixture: the run's ranks (each reads its own share of every source, so one may run out first)",
    )
    p.add_argument("--workers", type=positive_int, default=1, help="with --mixture: DataLoader workers per rank")
    p.add_argument("--column", default="text", help="text column, or a column of token ids")
    p.add_argument("--tokenizer", help="path to a tokenizer.json, for token lengths and strategies")
    p.add_argument("--seq-len", type=positive_int, default=2048, help="training sequence length")
    p.add_argument("--batch-size", type=positive_int, default=8, help="rows per batch")
    p.add_argument("--by", help="also summarise per value of this column, or per file with 'file'")
    p.add_argument(
        "--by-groups", type=_groups, default=20, metavar="N|all",
        help="print the N groups with the most documents, or all (the JSON always has all)",
    )
    p.add_argument("--sample", type=positive_int, help="tokenize about this many documents instead of all")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample and the random batches")
    p.add_argument("--window", type=positive_int, default=1024, help="look-ahead of best-fit and bucketing")
    p.add_argument("--no-eos", action="store_true", help="do not count an EOS token per document")
    p.add_argument(
        "--on-error", choices=["raise", "skip"], default="raise",
        help="row groups that do not decode: stop with an error naming them (default), or leave them out, listed",
    )
    p.add_argument("--plot", help="write the figure here: .png, .pdf or .svg (needs matplotlib)")
    p.add_argument("--json", help="write the full result as JSON here")
    p.set_defaults(func=run)


def _groups(text: str) -> int | None:
    return None if text == "all" else positive_int(text)


def _analyze_mixture(args: argparse.Namespace) -> int:
    """``analyze --mixture FILE``: per source, the tokens a budget takes and the epochs they imply."""
    if args.mixture is None:
        raise UsageError("give the data: PATH, or --mixture FILE")
    if args.path is not None:
        raise UsageError("give PATH or --mixture FILE, not both")
    if args.tokenizer is None:
        raise UsageError("--mixture needs --tokenizer (every source is tokenized with it)")
    check_tokenizer(args.tokenizer)
    mixture, budget = load_mixture(args.mixture, tokenizer=args.tokenizer, column=args.column)
    budget = args.tokens or budget
    if budget is None:
        raise UsageError(f"--mixture {args.mixture}: give the run's budget with --tokens N (or `num_tokens` in the file)")
    packed = mixture.pack(seq_len=args.seq_len, batch_size=args.batch_size)
    report = packed.report(budget, world_size=args.world_size, num_workers=args.workers)
    consumers = args.world_size * args.workers
    on = f" on {args.world_size} rank(s) x {args.workers} worker(s)" if consumers > 1 else ""
    print(f"a run of {budget:,} tokens (rows of {args.seq_len}){on}:")
    for row in report.iter_rows(named=True):
        how = "counted" if row["counted"] else "estimated"
        cap = f", max_epochs {row['max_epochs']}" if row["max_epochs"] is not None else ""
        warn = "  <- runs out: raise max_epochs or lower the weight" if row["runs_out"] else ""
        share = f", a consumer's share {row['consumer_epochs']:.2f} epochs" if consumers > 1 else ""
        print(
            f"  {row['source']:<12} weight {row['weight']:.3f}  {row['target_tokens']:>16,} tokens  "
            f"{row['epochs']:8.2f} epochs of {row['epoch_tokens']:,} ({how}){share}{cap}{warn}"
        )
    if args.json:
        Path(args.json).write_text(report.write_json())
        print(f"wrote {args.json}")
    short = [row["source"] for row in report.iter_rows(named=True) if row["runs_out"]]
    if short:  # a check a script or CI can act on: the run as planned would not get its budget
        print(f"error: {', '.join(short)} run(s) out before the budget: raise max_epochs or lower the weight",
              file=sys.stderr)
        return 1
    return 0


#: The figure formats --plot writes (by the file's suffix).
_FIGURES = (".png", ".pdf", ".svg")


def run(args: argparse.Namespace) -> int:
    """``analyze PATH`` (or ``--mixture FILE``): print the analysis, and write it as JSON or a figure if asked."""
    if args.mixture or args.path is None:
        return _analyze_mixture(args)
    if (args.world_size, args.workers) != (1, 1):
        raise UsageError("--world-size and --workers go with --mixture (the epochs each consumer's share of a source takes)")
    if args.tokens is not None:
        raise UsageError("--tokens is the budget of --mixture; without one there is nothing to budget")
    if args.tokenizer is not None:
        check_tokenizer(args.tokenizer)
    check_output("--plot", args.plot)
    if args.plot and Path(args.plot).suffix.lower() not in _FIGURES:
        raise UsageError(
            f"--plot {args.plot}: a figure is written as {', '.join(_FIGURES)}; name the file with one "
            "of those suffixes"
        )
    check_output("--json", args.json)
    result = analyze(
        args.path,
        column=args.column,
        tokenizer=args.tokenizer,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        by=args.by,
        sample=args.sample,
        seed=args.seed,
        add_eos=not args.no_eos,
        window=args.window,
        on_error=args.on_error,
    )
    print(render_analysis(result, max_groups=args.by_groups))
    if args.json:
        result.to_json(args.json)
        print(f"\nwrote {args.json}")
    if args.plot:
        result.plot(args.plot)
        print(f"wrote {args.plot}")
    return 0
