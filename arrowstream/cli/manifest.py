"""``arrowstream manifest``: describe a corpus once, in one file, for every consumer to start from.

``arrowstream manifest SOURCE -o FILE`` lists SOURCE and reads every footer
once (see :mod:`arrowstream.io.manifest_file`); ``--shard I/N`` describes only
every N-th file from the I-th, so N processes (a Slurm array, torchrun ranks)
share a large corpus, and ``arrowstream manifest --merge PART... -o FILE``
joins their parts. Train with ``read_parquet(SOURCE, manifest=FILE)`` (or
``stream --manifest FILE``).
"""

from __future__ import annotations

import argparse
from typing import Any

from arrowstream.cli.common import UsageError, parse_shard
from arrowstream.errors import ArrowStreamError
from arrowstream.io.manifest_file import merge_manifests, write_manifest

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Add the ``manifest`` command to the subcommands ``sub``."""
    p = sub.add_parser("manifest", help="describe a corpus in one file, so consumers start without listing it")
    p.add_argument("source", nargs="?", help="directory or URI prefix of the corpus (not with --merge)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the manifest file to write (a path or URI)")
    p.add_argument(
        "--shard", type=parse_shard, metavar="I/N",
        help="describe every N-th file from the I-th: one part of N (auto: from the launcher's environment)",
    )
    p.add_argument("--merge", nargs="+", metavar="PART", help="join the N parts --shard wrote into one manifest")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the manifest (or join the parts); print what was written."""
    if args.merge:
        if args.source or args.shard:
            raise UsageError("--merge joins parts already written: give no SOURCE and no --shard")
        try:
            n = merge_manifests(args.merge, args.output)
        except ArrowStreamError as exc:
            raise UsageError(f"--merge: {exc}") from exc
        print(f"joined {len(args.merge)} parts: {n:,} files described in {args.output}")
        return 0
    if not args.source:
        raise UsageError("give the corpus: arrowstream manifest SOURCE -o FILE (or --merge PART... -o FILE)")
    n = write_manifest(args.source, args.output, shard=args.shard)
    part = f" (part {args.shard[0]} of {args.shard[1]})" if args.shard else ""
    print(f"{n:,} files described in {args.output}{part}")
    return 0
