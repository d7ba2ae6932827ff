#!/usr/bin/env python
"""What object storage costs: the same pipeline from local disk and from an S3 server on loopback, with latency added.

A corpus of pre-tokenized documents (so reading, not tokenizing, is the work)
is read whole, packed with ``concat``, from local disk and from a real S3
server (moto's, a child process) through the test suite's fault proxy, which
adds ``--latency`` seconds to every request. Each configuration runs with the
default prefetch (2 chunks ahead, in a background thread) and with none; the
medians of ``--repeats`` runs, alternating, give tokens/s and the ratio to
local disk. A check asserts the batches are the same everywhere.

Usage::

    python benchmarks/bench_storage.py                # 40 files, 30 ms added, 3 repeats
    python benchmarks/bench_storage.py --smoke        # seconds: the checks only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from harness import CheckFailed, Checks, fmt_table, log, machine_facts, median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test suite's server and proxy
from arrowstream import read_parquet  # noqa: E402
from tests.s3fixtures import FaultProxy, Faults, S3Server  # noqa: E402


def _write(root: Path, files: int, docs: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        lengths = rng.integers(50, 2000, size=docs)
        ids = [rng.integers(1, 50_000, size=n, dtype=np.int32) for n in lengths]
        table = pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32()))})
        pq.write_table(table, root / f"part-{f:05d}.parquet", row_group_size=max(1, docs // 4))


def _run(source: str, prefetch: int | None, **kw: Any) -> tuple[float, list[bytes]]:
    ds = read_parquet(source, prefetch=prefetch, **kw).tokenize(None, column="input_ids", eos_id=0)
    it = ds.pack(seq_len=2048, batch_size=8).iter()
    start = time.perf_counter()
    tokens, digests = 0, []
    for batch in it:
        tokens += int(batch["num_tokens"])
        digests.append(batch["input_ids"].tobytes()[:64])
    it.close()
    return tokens / (time.perf_counter() - start), digests


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=40)
    p.add_argument("--docs", type=int, default=200, help="documents a file")
    p.add_argument("--latency", type=float, default=0.03, help="seconds added to every request")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if args.smoke:
        args.files, args.docs, args.repeats = 4, 40, 1
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    work = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    local = work / "corpus"
    _write(local, args.files, args.docs)
    server = S3Server(work)
    proxy = FaultProxy(server.endpoint)
    checks = Checks()
    results: dict[str, Any] = {"machine": machine_facts(), "args": vars(args)}
    try:
        server.upload("bench", "corpus", local)
        fs = server.filesystem(proxy.endpoint)
        configs = {
            "local disk": (str(local), {}, Faults()),
            "S3, loopback": ("bench/corpus", {"filesystem": fs}, Faults()),
            f"S3, +{args.latency * 1000:.0f} ms a request": ("bench/corpus", {"filesystem": fs}, Faults(latency=args.latency)),
        }
        rates: dict[tuple[str, str], list[float]] = {}
        reference = None
        for r in range(args.repeats):
            for name, (source, kw, faults) in (configs.items() if r % 2 == 0 else reversed(configs.items())):
                for label, prefetch in (("prefetch 2", None), ("no prefetch", 0)):
                    proxy.set(faults)
                    rate, digests = _run(source, prefetch, **kw)
                    rates.setdefault((name, label), []).append(rate)
                    reference = reference or digests
                    checks(digests == reference, f"{name}, {label}: the same batches", f"{len(digests)} batches")
        base = {label: median(rates[("local disk", label)]) for label in ("prefetch 2", "no prefetch")}
        rows = []
        for (name, label), values in rates.items():
            rate = median(values)
            rows.append([name, label, f"{rate / 1e6:.1f}", f"{rate / base[label]:.2f}"])
            results[f"{name} / {label}"] = {"tok_s": values, "ratio_to_local": rate / base[label]}
        log(fmt_table(["source", "prefetch", "M tokens/s", "vs local disk"], rows))
        log("(medians of runs alternating in one process; concat 8 x 2048 over pre-tokenized documents)")
    except CheckFailed:
        return 1
    finally:
        proxy.stop()
        server.stop()
        results["checks"] = checks.items
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    log("correctness checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
