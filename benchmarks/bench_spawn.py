#!/usr/bin/env python
"""How fast spawned DataLoader workers start over object storage: the pickled dataset and the first batch.

A worker started by ``spawn`` or ``forkserver`` (the default on Linux from
Python 3.14) receives the dataset through a pipe, and the parent's
``start()`` of each worker waits until that worker, its imports done, has
read all of it once it outgrows the pipe's 64 KB: a large pickle makes the
workers start one after another. Here a corpus of ``--files`` files of
``--row-groups`` row groups is read from a real S3 server on loopback (the
test suite's: SeaweedFS where its binary is installed, else moto's) by
``DataLoader(ds.to_torch(), batch_size=None, num_workers=W)`` in a fresh
process, started with ``spawn`` and, as the control that pickles nothing,
with ``fork``; each run reports the pickled dataset's size (as a spawned
worker gets it, and as pickled for another machine, with the files' pins) and the time from
the ``DataLoader``'s creation to its first batch (medians of ``--repeats``,
alternating). A check asserts both give the same batches, and that the
pickle does not carry the footers.

Usage::

    python benchmarks/bench_spawn.py                  # 20 files of 150 row groups, 4 workers, 3 repeats
    python benchmarks/bench_spawn.py --files 60       # more files: a larger pickle
    python benchmarks/bench_spawn.py --files 2000 --row-groups 1   # many small files: the pins' size
    python benchmarks/bench_spawn.py --smoke          # seconds: the checks only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from harness import CheckFailed, Checks, fmt_table, log, machine_facts, median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test suite's server
from arrowstream.testing.data import sample_tokenizer  # noqa: E402
from tests.s3fixtures import S3Server, seaweedfs_available  # noqa: E402

# The child: imports, the dataset over S3, then the DataLoader timed to its first batch.
CHILD = r"""
import hashlib, json, multiprocessing.context, pickle, sys, time
import pyarrow.fs as pafs
from torch.utils.data import DataLoader
from arrowstream import read_parquet
endpoint, key, secret, source, tokenizer, workers, method = sys.argv[1:8]
fs = pafs.S3FileSystem(access_key=key, secret_key=secret, endpoint_override=endpoint, scheme="http", region="us-east-1")
ds = read_parquet(source, filesystem=fs).tokenize(tokenizer).pack(seq_len=256, batch_size=4)
footers = sum(len(pickle.dumps(ds.manifest.footer(p))) for p in ds.manifest.paths)
elsewhere = len(pickle.dumps(ds))  # as for another machine: with the files' pins
multiprocessing.context.set_spawning_popen(object())  # as `Process.start()` pickles a worker's arguments
try:  # the pipeline alone: the torch adapter's shared flag pickles only through a real process start
    size = len(pickle.dumps(ds))
finally:
    multiprocessing.context.set_spawning_popen(None)
start = time.monotonic()
it = iter(DataLoader(ds.to_torch(), batch_size=None, num_workers=int(workers), multiprocessing_context=method))
digest = hashlib.sha256(next(it)["input_ids"].numpy().tobytes())
first = time.monotonic() - start
for _, batch in zip(range(7), it):
    digest.update(batch["input_ids"].numpy().tobytes())
print(json.dumps({"first_batch_s": first, "pickle_bytes": size, "pickle_bytes_elsewhere": elsewhere, "footer_bytes": footers,
                  "digest": digest.hexdigest()}))
"""


def _write(root: Path, files: int, row_groups: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    rows = 4 * row_groups
    for f in range(files):
        table = pa.table({"text": [f"document {f}-{i} " * 20 for i in range(rows)], "n": list(range(rows))})
        pq.write_table(table, root / f"part-{f:05d}.parquet", row_group_size=4)


def _child(server: S3Server, tokenizer: Path, workers: int, method: str, cache: Path) -> dict[str, Any]:
    env = dict(os.environ, ARROWSTREAM_CACHE_DIR=str(cache))
    cmd = [sys.executable, "-c", CHILD, server.endpoint, server.access_key, server.secret_key, "bench/corpus",
           str(tokenizer), str(workers), method]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=600)
    if out.returncode:
        raise RuntimeError(f"child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=20)
    p.add_argument("--row-groups", type=int, default=150, help="row groups a file")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--server", choices=["seaweedfs", "moto"], default="seaweedfs" if seaweedfs_available() else "moto")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if args.smoke:
        args.files, args.row_groups, args.workers, args.repeats = 3, 150, 2, 1
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    work = Path(tempfile.mkdtemp(prefix="bench-spawn-"))
    _write(work / "corpus", args.files, args.row_groups)
    sample_tokenizer(300).save(str(work / "tokenizer.json"))
    (work / "s3").mkdir()
    server = S3Server(work / "s3", kind=args.server)
    checks = Checks()
    results: dict[str, Any] = {"machine": machine_facts(), "args": vars(args)}
    try:
        server.upload("bench", "corpus", work / "corpus")
        runs: dict[str, list[dict[str, Any]]] = {"spawn": [], "fork": []}
        for r in range(args.repeats):
            for method in ("spawn", "fork") if r % 2 == 0 else ("fork", "spawn"):
                runs[method].append(_child(server, work / "tokenizer.json", args.workers, method, work / "cache"))
        digests = {run["digest"] for method in runs for run in runs[method]}
        checks(len(digests) == 1, "spawned and forked workers give the same first 8 batches", f"{len(digests)} digest(s)")
        spawned = runs["spawn"][0]
        checks(spawned["pickle_bytes"] < spawned["footer_bytes"], "the pickled dataset does not carry the footers",
               f"{spawned['pickle_bytes']:,} bytes pickled, {spawned['footer_bytes']:,} of footers")
        fork_s = median([run["first_batch_s"] for run in runs["fork"]])
        rows = []
        for method in ("spawn", "fork"):
            first = median([run["first_batch_s"] for run in runs[method]])
            rows.append([method, f"{runs[method][0]['pickle_bytes'] / 1024:.0f}", f"{first:.2f}", f"{first / fork_s:.2f}"])
            results[method] = {"first_batch_s": [run["first_batch_s"] for run in runs[method]],
                               "pickle_bytes": runs[method][0]["pickle_bytes"]}
        results["footer_bytes"] = spawned["footer_bytes"]
        results["pickle_bytes_elsewhere"] = spawned["pickle_bytes_elsewhere"]
        log(fmt_table(["start method", "dataset pickled for a worker KB", "first batch s", "vs fork"], rows))
        log(f"({args.files} files of {args.row_groups} row groups on {args.server} over loopback, {args.workers} "
            f"workers, from the DataLoader's creation; footers {spawned['footer_bytes'] / 1024:.0f} KB pickled; "
            f"the dataset pickled for another machine {spawned['pickle_bytes_elsewhere'] / 1024:.0f} KB; "
            f"medians of {args.repeats})")
    except CheckFailed:
        return 1
    finally:
        server.stop()
        results["checks"] = checks.items
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    log("correctness checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
