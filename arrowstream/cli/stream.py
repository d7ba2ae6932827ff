"""``arrowstream stream``: run the pipeline one trains with, over your data, with a progress bar.

The options build the same pipeline as Python does: ``read_parquet``
(``--num-epochs`` or ``--endless``), ``.filter`` (``--filter``, see
:mod:`arrowstream.cli.expressions`), ``.shuffle`` (``--shuffle SEED``),
``.tokenize`` (``--cache``, ``--length-index``) and ``.pack`` or
``.bucket`` (``--strategy``). ``--save-state`` writes the state after the last
batch (also on Ctrl-C, which ends the run with status 130, and on SIGTERM, 143); ``--resume``
continues from one (``--added-files next_epoch``: also on data with files
added since).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any

from arrowstream.cli.common import (
    Terminated,
    UsageError,
    check_output,
    check_tokenizer,
    natural_int,
    on_sigterm,
    positive_int,
    progress,
    read_state,
    write_state,
)
from arrowstream.cli.expressions import FilterSyntaxError, parse_filter
from arrowstream.cli.mixfile import load_mixture
from arrowstream.cli.words import as_flags
from arrowstream.errors import StateError
from arrowstream.mixture import PackedMixture
from arrowstream.mixture.iterator import MixtureIterator
from arrowstream.pipeline.dataset import Dataset, read_parquet

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Add the ``stream`` command to the subcommands ``sub``."""
    p = sub.add_parser(
        "stream",
        help="run a tokenize-and-pack pipeline over a dataset, with a progress bar",
    )
    p.add_argument("path", nargs="?", help="directory, glob, file or URI (or --mixture FILE)")
    p.add_argument(
        "--mixture", metavar="FILE",
        help="stream a mixture of sources described in this file (see docs/mixtures.md) instead of PATH",
    )
    p.add_argument(
        "--manifest", metavar="FILE",
        help="open PATH from this manifest file (`arrowstream manifest`): no listing, no footer reads",
    )
    p.add_argument(
        "--on-error", choices=["raise", "skip"], default="raise",
        help="row groups that do not decode: stop with an error naming them (default), or skip them, "
        "counted (stats unreadable) and warned about, the same ones on every resume",
    )
    p.add_argument("--tokenizer", required=True, help="a tokenizer.json, or a directory holding one")
    p.add_argument("--column", default="text", help="text column")
    p.add_argument("--no-special-tokens", action="store_true", help="encode with add_special_tokens=False")
    p.add_argument(
        "--strategy", choices=("concat", "best_fit", "bucket"), default="concat",
        help="concat and best_fit pack rows of --seq-len tokens; bucket batches whole documents of "
        "similar length (--seq-len is then the longest row; a longer document is split into rows of that length)",
    )
    p.add_argument("--seq-len", type=positive_int, help="tokens per row (required for concat and best_fit)")
    p.add_argument("--batch-size", type=positive_int, help="rows per batch (required but with --max-tokens)")
    p.add_argument(
        "--max-tokens", type=positive_int, metavar="N",
        help="bucket: batches of at most N padded tokens instead of --batch-size rows (a mixture buckets so)",
    )
    p.add_argument(
        "--window", type=positive_int, metavar="DOCS",
        help="look-ahead of best_fit and bucket, in documents (default: 1024)",
    )
    p.add_argument(
        "--no-ramp", action="store_true",
        help="best_fit and bucket: full windows from the first batch (default: the first epoch's windows "
        "ramp up from 64 documents, so the first batch comes sooner)",
    )
    p.add_argument("--filter", metavar="CONDITION", help="keep the rows where it holds, e.g. \"lang == 'en' and n >= 100\"")
    p.add_argument("--shuffle", type=natural_int, metavar="SEED", help="shuffle with this seed (default: no shuffle)")
    p.add_argument("--shuffle-window", type=positive_int, default=8, help="row groups mixed together when shuffling")
    p.add_argument("--cache", metavar="DIR", help="token cache directory (filled by `arrowstream cache`)")
    p.add_argument("--cache-read-only", action="store_true", help="read the cache, never write to it")
    p.add_argument("--length-index", metavar="DIR", help="length index directory (default: found beside the data)")
    p.add_argument("--no-length-index", action="store_true", help="ignore any length index")
    epochs = p.add_mutually_exclusive_group()
    epochs.add_argument("--num-epochs", type=positive_int, default=1, help="passes over the data")
    epochs.add_argument("--endless", action="store_true", help="repeat epochs forever (stop with --max-batches or Ctrl-C)")
    p.add_argument("--drop-last", action="store_true", help="drop each epoch's last partial batch")
    p.add_argument("--rank", type=natural_int, default=0, help="stream this rank's share (with --world-size)")
    p.add_argument("--world-size", type=positive_int, default=1, help="ranks the data is shared by")
    p.add_argument("--max-batches", type=positive_int, help="stop after this many batches (default: the whole run)")
    p.add_argument("--save-state", metavar="FILE", help="write the state after the last batch (and on Ctrl-C or SIGTERM) here")
    p.add_argument("--resume", metavar="FILE", help="continue from a state written by --save-state")
    p.add_argument(
        "--added-files", choices=("refuse", "next_epoch"), default="refuse",
        help="a --resume state saved before files were added to the data: refuse it, or finish its "
        "epoch over the old files and read the added ones from the next epoch on",
    )
    p.set_defaults(func=run)


def build(args: argparse.Namespace) -> Dataset | PackedMixture:
    """Return the pipeline the options describe (checked before any data is read)."""
    check_tokenizer(args.tokenizer)
    check_output("--save-state", args.save_state)
    if args.strategy != "bucket" and args.seq_len is None:
        raise UsageError(f"--strategy {args.strategy} needs --seq-len (tokens per row)")
    if args.strategy != "bucket" and args.max_tokens is not None:
        raise UsageError(f"--max-tokens is the budget of --strategy bucket's batches; {args.strategy} takes --batch-size rows")
    if args.batch_size is None and args.max_tokens is None:
        raise UsageError("give the batch: --batch-size N rows (or, with --strategy bucket, --max-tokens N)")
    if args.batch_size is not None and args.max_tokens is not None:
        raise UsageError("--batch-size and --max-tokens both size the batch: pass one")
    if args.length_index and args.no_length_index:
        raise UsageError("--length-index and --no-length-index contradict each other: pass one")
    if args.cache_read_only and not args.cache:
        raise UsageError("--cache-read-only needs --cache DIR")
    if args.window is not None and args.strategy == "concat":
        raise UsageError("--window is the look-ahead of --strategy best_fit and bucket; concat has none")
    if args.no_ramp and args.strategy == "concat":
        raise UsageError("--no-ramp turns off the look-ahead ramp of --strategy best_fit and bucket; concat has none")
    window = 1024 if args.window is None else args.window
    if not 0 <= args.rank < args.world_size:
        raise UsageError(f"--rank must be in 0..{args.world_size - 1} (--world-size {args.world_size}), got {args.rank}")
    if args.mixture is not None or args.path is None:
        return _mixture(args, window)
    try:
        condition = parse_filter(args.filter) if args.filter else None
    except FilterSyntaxError as exc:
        raise UsageError(f"--filter {args.filter!r}: {exc}") from exc
    ds = read_parquet(
        args.path, num_epochs=None if args.endless else args.num_epochs, added_files=args.added_files,
        manifest=args.manifest, on_error=args.on_error,
    )
    names = ds.manifest.schema.names
    if args.column not in names:
        raise UsageError(f"--column {args.column}: the data has no such column; its columns are {names}")
    if args.shuffle is not None:
        ds = ds.shuffle(args.shuffle, window=args.shuffle_window)
    if condition is not None:
        ds = ds.filter(condition)
    options: dict[str, Any] = {"column": args.column, "add_special_tokens": not args.no_special_tokens}
    if args.cache:
        options.update(cache=args.cache, cache_write=not args.cache_read_only)
    if args.length_index or args.no_length_index:
        options["length_index"] = False if args.no_length_index else args.length_index
    ds = ds.tokenize(args.tokenizer, **options)
    if args.strategy == "bucket":
        size = {"batch_size": args.batch_size} if args.max_tokens is None else {"max_tokens": args.max_tokens}
        return ds.bucket(**size, **_look_ahead(args, window), max_len=args.seq_len, drop_last=args.drop_last)
    extra = _look_ahead(args, window) if args.strategy == "best_fit" else {}
    return ds.pack(
        seq_len=args.seq_len, batch_size=args.batch_size, strategy=args.strategy, drop_last=args.drop_last, **extra
    )


def _look_ahead(args: argparse.Namespace, window: int) -> dict[str, Any]:
    """The look-ahead options of best_fit and bucket: the window, and ``ramp=False`` with ``--no-ramp``."""
    return {"window": window, **({"ramp": False} if args.no_ramp else {})}


#: Options of one pipeline that a mixture file says per source, or that a mixture has no use for.
_NOT_WITH_MIXTURE = (
    ("filter", None, "--filter (give each source's `filter` in the file)"),
    ("shuffle", None, "--shuffle (the file's `seed` orders every source)"),
    ("length_index", None, "--length-index"),
    ("no_length_index", False, "--no-length-index"),
    ("endless", False, "--endless (a mixture never ends; stop with --max-batches)"),
    ("num_epochs", 1, "--num-epochs (sources repeat; cap them with the file's `max_epochs`)"),
    ("drop_last", False, "--drop-last"),
    ("added_files", "refuse", "--added-files"),
    ("manifest", None, "--manifest (give each source's `manifest` in the file)"),
)


def _mixture(args: argparse.Namespace, window: int) -> PackedMixture:
    """Return the packed mixture of ``--mixture FILE`` (checked before any data is read)."""
    if args.mixture is None:
        raise UsageError("give the data: PATH, or --mixture FILE")
    if args.path is not None:
        raise UsageError("give PATH or --mixture FILE, not both")
    for key, default, flag in _NOT_WITH_MIXTURE:
        if getattr(args, key) != default:
            raise UsageError(f"{flag} does not apply to --mixture")
    if args.strategy == "bucket" and args.max_tokens is None:
        raise UsageError(
            "--mixture with --strategy bucket takes --max-tokens N (padded tokens a batch), not --batch-size: "
            "the weights share out tokens"
        )
    mixture, budget = load_mixture(
        args.mixture, tokenizer=args.tokenizer, column=args.column, add_special_tokens=not args.no_special_tokens,
        cache=args.cache, cache_write=not args.cache_read_only,
    )
    if args.strategy == "bucket":
        return mixture.bucket(
            max_tokens=args.max_tokens, **_look_ahead(args, window), max_len=args.seq_len, num_tokens=budget
        )
    extra = _look_ahead(args, window) if args.strategy == "best_fit" else {}
    return mixture.pack(
        seq_len=args.seq_len, batch_size=args.batch_size, strategy=args.strategy, num_tokens=budget, **extra
    )


def run(args: argparse.Namespace) -> int:
    """Stream the batches; print what came out; save the state when asked (also on Ctrl-C)."""
    ds = build(args)
    state = read_state(args.resume) if args.resume else None
    try:
        it = ds.iter(state, rank=args.rank, world_size=args.world_size)
    except StateError as exc:  # the file given: say which
        raise UsageError(f"--resume {args.resume}: {as_flags(str(exc), 'stream')}") from exc
    before = it.state_dict()["stats"].get("tokens", 0)
    count, start = 0, time.perf_counter()
    # a mixture's batch that an interrupt cuts short has taken rows its state cannot hold: keep each batch's
    keep = bool(args.save_state) and isinstance(it, MixtureIterator)
    kept = it.snapshot() if keep else None
    previous = signal.signal(signal.SIGTERM, on_sigterm)  # a scheduler's stop: saved as Ctrl-C is
    try:
        with progress(args.max_batches, "streaming") as bar:
            for _ in it:
                if keep:
                    kept = it.snapshot()
                count += 1
                bar.update(1)
                if count % 10 == 0:
                    done = it.state_dict()["stats"].get("tokens", 0) - before
                    bar.set_postfix(tokens_per_s=f"{done / (time.perf_counter() - start):,.0f}")
                if args.max_batches is not None and count >= args.max_batches:
                    break
    except KeyboardInterrupt as exc:
        if not args.save_state:
            raise
        write_state(args.save_state, it.state_dict() if kept is None else kept.to_dict())
        how = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(
            f"{how} after {count:,} batches; state saved to {args.save_state} (continue with --resume)",
            file=sys.stderr,
        )
        return 143 if isinstance(exc, Terminated) else 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    elapsed = time.perf_counter() - start
    final = it.state_dict()
    tokens = final["stats"].get("tokens", 0) - before
    if args.save_state:
        write_state(args.save_state, final)
        print(f"state saved to {args.save_state}")
    noun = "batch" if count == 1 else "batches"
    print(f"{count:,} {noun}, {tokens:,} tokens in {elapsed:.2f} s: {tokens / max(elapsed, 1e-9):,.0f} tokens/s")
    since = " (since the run began)" if state is not None else ""
    print(f"stats{since}: " + ", ".join(f"{k}={v:,}" for k, v in sorted(final["stats"].items())))
    if isinstance(it, MixtureIterator):
        print(f"per source{since}:")
        for row in it.report().iter_rows(named=True):
            print(
                f"  {row['source']:<12} {row['tokens']:>14,} tokens  {row['docs']:>10,} docs  epoch {row['epoch']:<4} "
                f"token share {row['token_share']:.4f}  target {row['target_share']:.4f}"
            )
    if count == 0:
        print(
            f"hint: nothing was left to stream: the state is at the end of its run of {args.num_epochs} "
            "epoch(s); raise --num-epochs to go on, or start without --resume"
            if state is not None
            else f"hint: no batch came out: {_why_none(final['stats'], args)}"
        )
    return 0


def _why_none(stats: dict[str, int], args: argparse.Namespace) -> str:
    """Why a fresh run gave no batch, from its counters."""
    if stats.get("rows", 0) == 0:
        return "this rank read no row (more ranks than the data's row groups can feed, or every row group pruned)"
    if stats.get("dropped_tokens", 0) or stats.get("dropped_docs", 0):
        return (
            f"the documents this rank read were dropped at its estimated batch count ({stats.get('dropped_docs', 0):,} "
            f"documents, {stats.get('dropped_tokens', 0):,} tokens; see the warning): the data is small for "
            f"--world-size {args.world_size} (`arrowstream inspect PATH --tokenizer T` says how batch counts are made equal)"
        )
    if stats.get("filtered", 0) and not stats.get("docs", 0):
        return "the filter kept no document"
    return "no document had text (counted as null or empty)"

