"""A tiny distributed "training" run used by test_distributed.py (not collected by pytest).

Usage: python dist_train.py DATA OUT RANK WORLD PORT STEPS [--save-at K] [--die-at K] [--resume]

Each rank streams packed batches through a StatefulLoader with 2 workers, all-reduces a
checksum per step (as DDP would synchronise), writes a digest per step, and can save its
loader state at a step, die abruptly later, and resume from the saved state.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from arrowstream import read_parquet
from arrowstream.pytorch import StatefulLoader


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("data", "out"):
        p.add_argument(name)
    for name in ("rank", "world", "port", "steps"):
        p.add_argument(name, type=int)
    p.add_argument("--save-at", type=int)
    p.add_argument("--die-at", type=int)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    dist.init_process_group("gloo", rank=a.rank, world_size=a.world)
    out = Path(a.out)
    ds = read_parquet(a.data, num_epochs=None).shuffle(seed=11, window=2)
    ds = ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=16, batch_size=2)
    loader = StatefulLoader(ds.to_torch(), num_workers=2)
    start = 0
    state_file = out / f"state-rank{a.rank}.json"
    if a.resume:
        saved = json.loads(state_file.read_text())
        loader.load_state_dict(saved["loader"])
        start = saved["step"]
    digests = out / f"digests-rank{a.rank}.jsonl"
    with digests.open("a") as log:
        for step, batch in enumerate(loader, start=start):
            if step >= a.steps:
                break
            check = torch.tensor([float(batch["input_ids"].sum())])
            dist.all_reduce(check)  # every rank must reach every step, or this hangs
            digest = hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()[:16]
            log.write(json.dumps({"step": step, "digest": digest}) + "\n")
            log.flush()
            if a.save_at is not None and step + 1 == a.save_at:
                state_file.write_text(json.dumps({"step": step + 1, "loader": loader.state_dict()}))
            if a.die_at is not None and step + 1 == a.die_at:
                os._exit(17)  # preemption: no cleanup, no goodbye
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
