"""The multi-rank loop of docs/training.md, run whole: 2 ranks (gloo on CPU), killed and resumed.

The snippet runs as written but for the substitutions in ``SUBSTITUTIONS``
(the backend, the data, the sizes, a step to stop at); each must match the
doc exactly once, so a changed snippet fails here until this test follows it.
A tiny model records a digest of every batch it trains on.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from arrowstream.testing.data import sample_tokenizer, write_dataset

DOC = Path(__file__).resolve().parent.parent / "docs" / "training.md"

SUBSTITUTIONS = [
    ('dist.init_process_group("nccl")', 'dist.init_process_group("gloo")'),
    ('"s3://bucket/corpus/"', "DATA"),
    ('.tokenize("tokenizer.json")', ".tokenize(TOKENIZER)"),
    ("seq_len=4096, batch_size=8", "seq_len=64, batch_size=2"),
    ("v.cuda(non_blocking=True)", "v"),
    ("step % 1000 == 0", "step % 4 == 0"),
    ("for batch in loader:\n", "for batch in loader:\n    if step == STOP:\n        break\n"),
]

PREAMBLE = '''
import hashlib, os, sys, types
import torch
DATA, TOKENIZER, STOP = sys.argv[1], sys.argv[2], int(sys.argv[3])
RECORD = open(f"batches-rank{os.environ['RANK']}.txt", "a")

class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))

    def forward(self, input_ids, labels, position_ids):
        digest = hashlib.sha256(input_ids.numpy().tobytes() + labels.numpy().tobytes()).hexdigest()
        print(digest[:16], file=RECORD, flush=True)
        return types.SimpleNamespace(loss=self.w * input_ids.float().mean() / 1000)

model = TinyModel()
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
'''


def _snippet() -> str:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## A plain PyTorch loop with torch.distributed") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    body = code.group(1)
    for old, new in SUBSTITUTIONS:
        assert body.count(old) == 1, f"docs/training.md's loop no longer has {old!r} once: update this test"
        body = body.replace(old, new)
    return PREAMBLE + body + "\ndist.destroy_process_group()\n"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(workdir: Path, script: Path, data: Path, tok: Path, stop: int) -> None:
    port = _port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(
            [sys.executable, str(script), str(data), str(tok), str(stop)],
            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        ))
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, err.decode()[-3000:]


def _batches(workdir: Path, rank: int) -> list[str]:
    return (workdir / f"batches-rank{rank}.txt").read_text().split()


def test_the_multi_rank_loop_resumes_from_its_last_complete_checkpoint(tmp_path: Path) -> None:
    data, tok = tmp_path / "data", tmp_path / "tokenizer.json"
    write_dataset(data, num_files=3, docs_per_file=120, rows_per_group=30, seed=2)
    sample_tokenizer().save(str(tok))
    script = tmp_path / "train.py"
    script.write_text(_snippet(), encoding="utf-8")
    reference, run = tmp_path / "reference", tmp_path / "run"
    reference.mkdir()
    run.mkdir()

    _run(reference, script, data, tok, stop=14)
    _run(run, script, data, tok, stop=10)  # "crashes" after step 10; checkpoints at steps 4 and 8
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000000004", "step-0000000008"]
    names = sorted(p.name for p in (run / "checkpoints" / "step-0000000008" / "arrowstream").iterdir())
    assert names == ["rank-00000-of-00002.json", "rank-00001-of-00002.json"]
    _run(run, script, data, tok, stop=14)  # resumes at step 9 from the last complete checkpoint

    for rank in range(2):
        want, got = _batches(reference, rank), _batches(run, rank)
        assert len(want) == 14 and len(got) == 10 + 6
        assert got[10:] == want[8:], f"rank {rank} did not continue with the batches after step 8"
    assert _batches(reference, 0) != _batches(reference, 1)  # the ranks read different data
