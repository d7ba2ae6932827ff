"""The ``arrowstream`` command: ``inspect``, ``analyze``, ``demo`` and ``stream``.

``inspect PATH`` prints the files, row groups, rows, bytes and schema of a
dataset (footers only), the length indexes beside it and, with
``--tokenizer``, how even batches are split. ``cache PATH`` tokenizes a dataset ahead of time into
a token cache, with a progress bar. ``index PATH`` counts every document's
tokens into a length index, so even batches over text are exact. ``analyze PATH`` reports document lengths and what
each batching strategy would cost, as text, JSON and a PNG. ``demo`` builds a sample dataset and tokenizer offline,
streams packed batches, stops midway, saves the state, resumes in a fresh
iterator and shows that the resumed stream matches. ``stream PATH`` runs a
tokenize-and-pack pipeline over your data with a progress bar, optionally
saving or resuming a state file.

Errors of the library (``ArrowStreamError``) print as one line and exit 2.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
from pyarrow.fs import FileSelector, FileType
from tqdm import tqdm

from arrowstream import __version__
from arrowstream.cli import analyze as analyze_cli
from arrowstream.cli import manifest, stream
from arrowstream.cli.common import (
    HelpFormatter,
    Parser,
    Terminated,
    UsageError,
    check_tokenizer,
    parse_shard,
    positive_int,
    progress,
)
from arrowstream.cli.words import as_flags, show_warning
from arrowstream.errors import ArrowStreamError, CacheError
from arrowstream.io.manifest import read_manifest
from arrowstream.pipeline.dataset import read_parquet
from arrowstream.pipeline.indexing import build_length_index
from arrowstream.pipeline.plan import Plan
from arrowstream.testing.data import sample_tokenizer, write_dataset
from arrowstream.tokenize.cache import IDS_COLUMN, CachedReader
from arrowstream.tokenize.lengths import INDEX_DIR, LengthIndex

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    Examples
    --------
    >>> main(["--version"])
    arrowstream ...
    0
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        print(f"arrowstream {__version__}")
        return 0
    if args.command is None:
        parser.print_help()
        return 1
    try:
        with warnings.catch_warnings():
            warnings.showwarning = show_warning(args.command)  # in the command line's words too
            return int(args.func(args))
    except (ArrowStreamError, UsageError, ImportError) as exc:  # ImportError: an optional extra
        print(f"error: {as_flags(str(exc), args.command)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as exc:
        hint = {"index": ": the files already counted are kept; run the same command again to finish"}
        how = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"{how}{hint.get(args.command, '')}", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="arrowstream",
        description="Resumable Parquet-to-token-batch loading for language-model training.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser = functools.partial(sub.add_parser, formatter_class=HelpFormatter)  # type: ignore[method-assign]

    p = sub.add_parser("inspect", help="list files, row groups, rows, bytes and schema")
    p.add_argument("path", help="directory, glob, file or URI")
    p.add_argument("--columns", help="comma-separated columns to check across files")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--tokenizer",
        help="a tokenizer.json: also say how even batches are split for it (counted with a length index)",
    )
    p.add_argument("--column", default="text", help="the text column --tokenizer reads")
    p.set_defaults(func=_inspect)

    analyze_cli.add_parser(sub)

    p = sub.add_parser("cache", help="tokenize a dataset ahead of time into a token cache")
    p.add_argument("path", help="directory, glob, file or URI")
    p.add_argument("--tokenizer", required=True, help="path to a tokenizer.json")
    p.add_argument("--cache", required=True, help="the token cache directory")
    p.add_argument("--column", default="text", help="text column (default: text)")
    p.add_argument("--no-special-tokens", action="store_true", help="encode with add_special_tokens=False")
    p.add_argument(
        "--shard", type=parse_shard, metavar="I/N",
        help="tokenize every N-th row group from the I-th: one process of N (auto: from the launcher's environment)",
    )
    p.set_defaults(func=_cache)

    p = sub.add_parser("index", help="count every document's tokens, so even batches are exact")
    p.add_argument("path", help="directory, glob, file or URI")
    p.add_argument(
        "--tokenizer",
        help="path to a tokenizer.json; without one, --column holds token ids and their counts are kept",
    )
    p.add_argument("--column", default="text", help="text column, or token-id column without --tokenizer (default: text)")
    p.add_argument("--no-special-tokens", action="store_true", help="encode with add_special_tokens=False")
    p.add_argument(
        "--index",
        help="directory to keep the index in (default: PATH's root/_arrowstream_index, where "
        "pipelines look for it)",
    )
    p.add_argument(
        "--shard", type=parse_shard, metavar="I/N",
        help="count every N-th file from the I-th: one process of N (auto: from the launcher's environment)",
    )
    p.set_defaults(func=_index)

    p = sub.add_parser("demo", help="stream, checkpoint and resume on built-in sample data")
    p.add_argument("--workdir", help="where to write the sample data (default: a temp dir)")
    p.add_argument("--batches", type=positive_int, default=40, help="batches to stream in all")
    p.add_argument("--seq-len", type=positive_int, default=1024, help="tokens per row")
    p.add_argument("--batch-size", type=positive_int, default=8, help="rows per batch")
    p.set_defaults(func=_demo)

    stream.add_parser(sub)
    manifest.add_parser(sub)
    return parser


def _inspect(args: argparse.Namespace) -> int:
    columns = args.columns.split(",") if args.columns else None
    m = read_manifest(args.path, columns=columns)
    rows: dict[int, list[int]] = {}
    for f, n in zip(m.shard_file.tolist(), m.shard_rows.tolist()):
        rows.setdefault(f, []).append(n)
    files = [
        {
            "file": m.relpaths[i],
            "row_groups": len(rows.get(i, [])),
            "rows": sum(rows.get(i, [])),
            "bytes": m.file_sizes[i],
        }
        for i in range(m.num_files)
    ]
    indexes = _indexes(args.path)
    balance = _balance(args)
    if args.json:
        print(
            json.dumps(
                {
                    "root": m.root,
                    "length_indexes": indexes,
                    **({} if balance is None else {"balance": balance}),
                    "files": files,
                    "schema": {f.name: str(f.type) for f in m.schema},
                    **m.describe(),
                    "num_empty_files": m.num_empty_files,
                    "num_empty_row_groups": m.num_empty_row_groups,
                    "drift": m.drift,
                },
                indent=2,
            )
        )
        return 0
    width = max(len("file"), *(len(f["file"]) for f in files))
    print(f"{m.root}")
    print(f"{'file':<{width}}  {'row groups':>10}  {'rows':>12}  {'bytes':>14}")
    for f in files:
        print(f"{f['file']:<{width}}  {f['row_groups']:>10}  {f['rows']:>12,}  {f['bytes']:>14,}")
    total_bytes = sum(m.file_sizes)
    print(f"{'total':<{width}}  {m.num_shards:>10}  {m.num_rows:>12,}  {total_bytes:>14,}")
    if m.num_empty_files or m.num_empty_row_groups:
        print(f"skipped: {m.num_empty_files} empty file(s), {m.num_empty_row_groups} empty row group(s)")
    print("schema:")
    for field in m.schema:
        print(f"  {field.name}: {field.type}")
    if m.drift:
        print("columns that differ between files (left out; select others with --columns):")
        for name, problem in m.drift.items():
            print(f"  {name}: {as_flags(problem, 'inspect')}")
    for index in indexes:
        print(
            f"length index: column {index['column']!r}, tokenizer {index['tokenizer']}, covers "
            f"{index['files_covered']} of {m.num_files} files ({index['dir']})"
        )
    if balance is not None:
        print(f"even batches (concat) with this tokenizer: {balance}")
    return 0


def _balance(args: argparse.Namespace) -> str | None:
    """Return how even batches are split for ``--tokenizer`` with ``concat``, or ``None`` without one."""
    if args.tokenizer is None:
        return None
    check_tokenizer(args.tokenizer)
    ds = read_parquet(args.path, columns=[args.column]).tokenize(args.tokenizer, column=args.column, add_eos=False)
    return Plan.of(ds.pack(seq_len=2048, batch_size=8)).balance


def _indexes(path: str) -> list[dict[str, Any]]:
    """Return the length indexes beside the data: their setting and the files they cover."""
    m = read_manifest(path)
    found = []
    base = f"{m.root.rstrip('/')}/{INDEX_DIR}"
    for info in m.filesystem.get_file_info(FileSelector(base, allow_not_found=True)):
        if info.type != FileType.Directory:
            continue
        try:
            with m.filesystem.open_input_stream(f"{info.path}/index.json") as f:
                setting = json.loads(f.read())
        except (OSError, ValueError):
            continue
        index = LengthIndex(m, {k: v for k, v in setting.items() if k != "format"})
        covered = sum(index.entry(fi, quiet=True) is not None for fi in range(m.num_files))
        found.append({"dir": info.path, **setting, "files_covered": covered})
    return found


def _index(args: argparse.Namespace) -> int:
    if args.tokenizer is not None:
        check_tokenizer(args.tokenizer)
    m = read_manifest(args.path, columns=[args.column])
    i, n = args.shard or (0, 1)
    total = int(np.isin(m.shard_file, list(range(i, m.num_files, n))).sum())
    with tqdm(total=total, desc="counting tokens", unit="row group", file=sys.stderr) as bar:
        summary = build_length_index(
            args.path,
            args.tokenizer,
            column=args.column,
            add_special_tokens=not args.no_special_tokens,
            length_index=args.index,
            progress=bar.update,
            shard=(i, n),
        )
    where = (
        "pipelines over this data find it"
        if args.index is None
        else "pass this directory to --length-index (stream) or as `.tokenize(..., length_index=...)` (Python)"
    )
    print(
        f"length index {summary.dir}: {summary.num_files:,} files{f' (part {i} of {n})' if n > 1 else ''} "
        f"({summary.num_built:,} counted now, "
        f"{summary.num_files - summary.num_built:,} already there), {summary.num_docs:,} documents, "
        f"{summary.num_tokens:,} tokens, {summary.seconds:.1f} s; {where}"
    )
    return 0


def _cache(args: argparse.Namespace) -> int:
    check_tokenizer(args.tokenizer)
    ds = read_parquet(args.path, columns=[args.column]).tokenize(
        args.tokenizer,
        column=args.column,
        add_special_tokens=not args.no_special_tokens,
        cache=args.cache,
    )
    manifest = ds.manifest
    plan = Plan.of(ds)
    reader = plan.make_reader()
    assert isinstance(reader, CachedReader)  # `cache=` was given
    cache = reader.cache
    hits = tokens = 0
    t0 = time.perf_counter()
    i, n = args.shard or (0, 1)
    mine = range(i, manifest.num_shards, n)  # entries are whole files: processes never write the same one
    with tqdm(total=len(mine), desc="tokenizing", unit="row group", file=sys.stderr) as bar:
        for shard in mine:
            hits += cache.entry_path(manifest, shard).is_file()
            ids = reader.read(shard).column(IDS_COLUMN)
            tokens += int(pc.sum(pc.list_value_length(ids)).as_py() or 0)
            if not cache.entry_path(manifest, shard).is_file():  # the reader warns and goes on; this command cannot
                reader.close()
                raise CacheError(
                    f"could not write the token cache under {str(cache.dir)!r} (no entry for "
                    f"{manifest.paths[int(manifest.shard_file[shard])]!r}, row group "
                    f"{int(manifest.shard_row_group[shard])}): --cache must be a directory you can "
                    "write to, with free space"
                )
            bar.update(1)
            bar.set_postfix_str(f"{tokens:,} tokens")
    reader.close()
    seconds = time.perf_counter() - t0
    part = f" (part {i} of {n}: row groups {i}, {i + n}, {i + 2 * n}, ...)" if n > 1 else ""
    print(
        f"token cache {cache.dir}: {len(mine):,} row groups{part} "
        f"({len(mine) - hits:,} tokenized now, {hits:,} already there), "
        f"{tokens:,} tokens, {seconds:.1f} s"
    )
    return 0


def _run(it: Any, limit: int | None, desc: str) -> tuple[list[dict[str, np.ndarray]], float]:
    """Consume up to ``limit`` batches with a progress bar; return them and the elapsed time."""
    out: list[dict[str, np.ndarray]] = []
    start = time.perf_counter()
    if limit is not None and limit <= 0:
        return out, 0.0
    tokens0 = it.state_dict()["stats"].get("tokens", 0)
    with progress(limit, desc) as bar:
        for batch in it:
            out.append(batch)
            bar.update(1)
            if len(out) % 10 == 0:
                done = it.state_dict()["stats"].get("tokens", 0) - tokens0
                bar.set_postfix(tokens_per_s=f"{done / (time.perf_counter() - start):,.0f}")
            if limit is not None and len(out) >= limit:
                break
    return out, time.perf_counter() - start


def _demo(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="arrowstream-demo-"))
    data = workdir / "data"
    print(f"writing sample Parquet data to {data} ...")
    write_dataset(data, num_files=4, docs_per_file=1500, rows_per_group=250, seed=0)
    tokenizer = sample_tokenizer(vocab_size=4096)
    tok_path = workdir / "tokenizer.json"
    tokenizer.save(str(tok_path))
    ds = read_parquet(data).tokenize(tok_path).pack(seq_len=args.seq_len, batch_size=args.batch_size)
    m = ds.manifest
    print(f"dataset: {m.num_files} files, {m.num_shards} row groups, {m.num_rows:,} documents")

    half = max(1, args.batches // 2)
    it = ds.iter()
    first, elapsed = _run(it, half, "streaming")
    state = it.state_dict()
    state_path = workdir / "state.json"
    state_path.write_text(json.dumps(state, indent=2))
    size = len(json.dumps(state))
    pos = state["position"]
    where = (
        f"epoch {pos['epoch']}, file {pos['file']}, row group {pos['row_group']}, row {pos['row']}, "
        f"{pos['token_offset']} tokens into the document" if pos.get("file") is not None else "the end of the data"
    )
    print(f"stopped after {len(first)} batches; state saved to {state_path} ({size} bytes): {where}")
    want = args.batches - len(first)
    reference, _ = _run(it, want, "uninterrupted run")

    t0 = time.perf_counter()
    resumed_it = ds.iter(json.loads(state_path.read_text()))
    resumed = list(itertools.islice(resumed_it, min(1, want)))  # the first batch (none where the data ended)
    latency = time.perf_counter() - t0
    more, _ = _run(resumed_it, len(reference) - len(resumed), "resumed run")
    resumed += more
    if len(reference) < want:  # the data ended before the batches asked for: so must the resumed stream
        resumed += list(itertools.islice(resumed_it, 1))
    same = len(resumed) == len(reference) and all(
        all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(reference, resumed)
    )
    tokens = int(state["stats"]["tokens"])
    print(f"resumed in {latency * 1000:.0f} ms (first batch included)")
    print(
        f"resumed stream matches the uninterrupted one: {same} "
        f"({len(resumed)}/{len(reference)} batches identical)" if same else
        "resumed stream DIFFERS from the uninterrupted one"
    )
    print(f"throughput: {tokens / elapsed:,.0f} tokens/s over the first {len(first)} batches")
    return 0 if same else 1
