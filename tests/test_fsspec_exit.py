"""Regression: reading through an fsspec filesystem aborted the interpreter at exit.

An Arrow pool thread that called into a Python-implemented filesystem while the
interpreter shut down was killed mid C++ frame ("terminate called without an
active exception", exit status 134) in about 2 runs of 5. Reads of such
filesystems now happen in the calling thread.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from arrowstream import read_parquet

fs = fsspec.filesystem("memory")
with fs.open("/corpus/part-0.parquet", "wb") as f:
    pq.write_table(pa.table({"text": ["a b", "c d e"]}), f)
print(sum(batch.num_rows for batch in read_parquet("memory://corpus", filesystem=fs)))
"""


def test_reading_through_fsspec_does_not_abort_at_exit() -> None:
    for _ in range(8):
        proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
        assert proc.stdout.strip() == "2"
