"""A real multi-process run: 2 ranks (gloo on CPU) x 2 DataLoader workers, preempted and resumed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from .conftest import write_parts

SCRIPT = Path(__file__).with_name("dist_train.py")
STEPS, SAVE_AT, DIE_AT = 24, 9, 13


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(data: Path, out: Path, *extra: str) -> list[int]:
    port = _port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(data), str(out), str(rank), "2", str(port), str(STEPS), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for rank in range(2)
    ]
    codes = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        codes.append(proc.returncode)
        assert proc.returncode in (0, 17), err.decode()[-3000:]
    return codes


def _digests(out: Path, rank: int) -> dict[int, str]:
    lines = (out / f"digests-rank{rank}.jsonl").read_text().splitlines()
    return {r["step"]: r["digest"] for r in map(json.loads, lines)}


def test_preempted_distributed_run_resumes_with_the_same_batches(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    docs = [[i + 1] * int(n) for i, n in enumerate(rng.integers(1, 20, size=300))]
    parts = [{"input_ids": pa.array(docs[a : a + 100], pa.list_(pa.int32()))} for a in range(0, 300, 100)]
    write_parts(tmp_path / "data", parts, row_group_size=25)

    reference = tmp_path / "reference"
    reference.mkdir()
    assert _run(tmp_path / "data", reference) == [0, 0]

    run = tmp_path / "run"
    run.mkdir()
    assert _run(tmp_path / "data", run, "--save-at", str(SAVE_AT), "--die-at", str(DIE_AT)) == [17, 17]
    assert _run(tmp_path / "data", run, "--resume") == [0, 0]

    for rank in range(2):
        want = _digests(reference, rank)
        got = _digests(run, rank)  # steps SAVE_AT..DIE_AT-1 ran twice: the second time must agree
        assert sorted(want) == list(range(STEPS)) and sorted(got) == list(range(STEPS))
        assert got == want
    assert _digests(reference, 0) != _digests(reference, 1)  # the ranks read different data
