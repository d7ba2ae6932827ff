"""The Hugging Face Trainer integration: data state saved with checkpoints, exact resume, topology change."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from arrowstream import ConfigError, StateError, mix, read_parquet
from arrowstream.huggingface import DataStateCallback, load_data_state, save_data_state
from arrowstream.pytorch import StatefulLoader

from .conftest import write_parts

NUM_DOCS = 120
SEQ_LEN = 16
COLUMNS = ["input_ids", "labels"]


def _ds(tmp_path: Path, *, num_epochs: int | None = None, mixture: bool = False, num_tokens: int | None = None):
    """Pre-tokenized documents ``[i + 1] * n`` (so every token names its document), packed.

    ``mixture``: the same files as two sources, each its own order, mixed 2:1.
    """
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 12, size=NUM_DOCS)
    docs = [[i + 1] * int(n) for i, n in enumerate(lengths)]
    parts = [{"input_ids": pa.array(docs[a : a + 40], pa.list_(pa.int32()))} for a in range(0, NUM_DOCS, 40)]
    data = tmp_path / "data"
    if not data.exists():
        write_parts(data, parts, row_group_size=9)
    expected = Counter({i + 1: int(n) for i, n in enumerate(lengths)})
    if mixture:
        sources = {
            name: read_parquet(data, batch_rows=5).shuffle(seed=seed, window=2).tokenize(None, column="input_ids", eos_id=0)
            for name, seed in (("a", 3), ("b", 4))
        }
        return mix(sources, {"a": 2, "b": 1}).pack(seq_len=SEQ_LEN, batch_size=2, num_tokens=num_tokens), expected
    ds = read_parquet(data, batch_rows=5, num_epochs=num_epochs).shuffle(seed=3, window=2)
    return ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=SEQ_LEN, batch_size=2), expected


def _model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1,
        n_head=2,
        n_embd=32,
        n_positions=SEQ_LEN,
        vocab_size=NUM_DOCS + 8,
        bos_token_id=0,  # the GPT-2 default (50256) lies outside this vocabulary
        eos_token_id=0,
        loss_type="ForCausalLM",
    )
    return GPT2LMHeadModel(config)


class _RecordingTrainer(Trainer):
    """Trains on an arrowstream loader (not re-wrapped by accelerate) and records every batch."""

    def __init__(self, *args: Any, loader: StatefulLoader, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loader = loader
        self.trained: list[bytes] = []

    def get_train_dataloader(self) -> StatefulLoader:  # type: ignore[override]
        return self.loader

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.trained.append(inputs["input_ids"].cpu().numpy().tobytes())
        return super().training_step(model, inputs, num_items_in_batch)


class _StopAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def _args(out: Path, **overrides: Any) -> TrainingArguments:
    options: dict[str, Any] = {
        "max_steps": 6,
        "gradient_accumulation_steps": 2,
        "save_steps": 3,
        "logging_steps": 1,
        "learning_rate": 1e-3,
        "report_to": [],
        "use_cpu": True,
        "ignore_data_skip": True,
        "disable_tqdm": True,
        "seed": 0,
    }
    options.update(overrides)
    return TrainingArguments(str(out), **options)


def _trainer(
    tmp_path: Path,
    out: Path,
    *,
    num_epochs: int | None = None,
    mixture: bool = False,
    num_tokens: int | None = None,
    callbacks: list[TrainerCallback] = (),  # type: ignore[assignment]
    resume_from: Path | None = None,
    **overrides: Any,
) -> _RecordingTrainer:
    ds, _ = _ds(tmp_path, num_epochs=num_epochs, mixture=mixture, num_tokens=num_tokens)
    # its own generator: a DataLoader draws its workers' base seed when iteration starts, which
    # would otherwise shift the global RNG (dropout) of a resumed run against an uninterrupted one
    loader = StatefulLoader(ds.to_torch(columns=COLUMNS), num_workers=2, generator=torch.Generator())
    return _RecordingTrainer(
        model=_model(),
        args=_args(out, **overrides),
        loader=loader,
        callbacks=[DataStateCallback(loader, resume_from=resume_from), *callbacks],
    )


@pytest.mark.parametrize("mixture", [False, True])
def test_trainer_resumed_from_a_checkpoint_trains_on_the_same_batches(tmp_path: Path, mixture: bool) -> None:
    full = _trainer(tmp_path, tmp_path / "full", mixture=mixture)
    full.train()
    assert len(full.trained) == 12  # 6 optimizer steps x 2 accumulated batches
    assert len(set(full.trained)) == 12

    out = tmp_path / "run"
    stopped = _trainer(tmp_path, out, mixture=mixture, callbacks=[_StopAt(4)])
    stopped.train()
    assert stopped.trained == full.trained[:8]
    saved = out / "checkpoint-3" / "arrowstream" / "rank-00000-of-00001.json"
    assert saved.is_file()
    assert [len(json.loads(saved.read_text())["states"])] == [2]  # one state per DataLoader worker
    assert not (out / "checkpoint-6").exists()

    # a new process would build all of this anew; the callback finds checkpoint-3 from global_step
    resumed = _trainer(tmp_path, out, mixture=mixture)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-3"))
    assert resumed.state.global_step == 6
    assert resumed.trained == full.trained[6:]  # byte for byte, from step 4 on
    assert (out / "checkpoint-6" / "arrowstream" / "rank-00000-of-00001.json").is_file()
    for a, b in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)  # and so is the model (dropout included)


def test_resume_from_a_checkpoint_outside_output_dir_needs_resume_from(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _trainer(tmp_path, out, max_steps=3).train()
    moved = tmp_path / "elsewhere"
    (out / "checkpoint-3").rename(moved)
    with pytest.raises(StateError, match="resume_from="):
        _trainer(tmp_path, out).train(resume_from_checkpoint=str(moved))
    resumed = _trainer(tmp_path, out, resume_from=moved)
    resumed.train(resume_from_checkpoint=str(moved))
    assert len(resumed.trained) == 6


def test_trainer_that_would_skip_batches_is_refused(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, tmp_path / "out", ignore_data_skip=False)
    with pytest.raises(ConfigError, match="ignore_data_skip=True"):
        trainer.train()
    assert trainer.trained == []


def test_finite_dataset_is_refused(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, tmp_path / "out", num_epochs=1)
    with pytest.raises(ConfigError, match="num_epochs=None"):
        trainer.train()
    assert trainer.trained == []
    trainer = _trainer(tmp_path, tmp_path / "out", mixture=True, num_tokens=10_000)
    with pytest.raises(ConfigError, match="drop `num_tokens`"):
        trainer.train()
    assert trainer.trained == []


def test_trainer_iterating_another_loader_is_refused(tmp_path: Path) -> None:
    ds, _ = _ds(tmp_path)
    loader = StatefulLoader(ds.to_torch(columns=COLUMNS))
    trainer = Trainer(  # no `get_train_dataloader` override: accelerate would wrap the dataset
        model=_model(),
        args=_args(tmp_path / "out"),
        train_dataset=ds.to_torch(columns=COLUMNS),
        callbacks=[DataStateCallback(loader)],
    )
    with pytest.raises(ConfigError, match="get_train_dataloader"):
        trainer.train()


def _tokens(batches: list[dict[str, torch.Tensor]]) -> Counter:
    out: Counter = Counter()
    for b in batches:
        ids = b["input_ids"][b["input_ids"] > 0]
        out.update(ids.tolist())
    return out


def test_two_ranks_resume_on_one_through_merge(tmp_path: Path) -> None:
    ds, expected = _ds(tmp_path, num_epochs=1)
    ckpt = tmp_path / "checkpoint-3"
    before: list[dict[str, torch.Tensor]] = []
    for rank in range(2):
        loader = StatefulLoader(ds.to_torch(rank=rank, world_size=2, columns=["input_ids"]), num_workers=2)
        it = iter(loader)
        before += [next(it) for _ in range(3)]
        save_data_state(ckpt, loader)
        del it
    assert sorted(p.name for p in (ckpt / "arrowstream").iterdir()) == [
        "rank-00000-of-00002.json",
        "rank-00001-of-00002.json",
    ]
    resumed = StatefulLoader(ds.to_torch(rank=0, world_size=1, columns=["input_ids"]))
    load_data_state(ckpt, resumed)
    after = list(resumed)
    assert _tokens(before) + _tokens(after) == expected  # every token of the epoch, once

    save_data_state(ckpt, resumed)  # the 2-rank files no longer describe this checkpoint
    assert [p.name for p in (ckpt / "arrowstream").iterdir()] == ["rank-00000-of-00001.json"]


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")  # a 2-core machine
def test_workers_epochs_apart_resume_on_more_workers(tmp_path: Path) -> None:
    # 10 documents of 8 tokens, 5 batches an epoch: worker 0 of 2 gets 2 of each epoch and worker 1 gets 3 (only
    # the rank's total is even), so after 24 steps they are in epochs 5 and 3; the checkpoint is one step
    import pyarrow.parquet as pq

    docs = [[(i + 1) * 1000 + j for j in range(7)] for i in range(10)]
    pq.write_table(pa.table({"ids": pa.array(docs, pa.list_(pa.int32()))}), tmp_path / "part-0.parquet", row_group_size=5)
    ds = read_parquet(tmp_path, num_epochs=8).tokenize(None, column="ids", eos_id=0).pack(seq_len=8, batch_size=2)
    loader = StatefulLoader(ds.to_torch(), num_workers=2)
    it = iter(loader)
    before = [next(it) for _ in range(24)]
    ckpt = tmp_path / "checkpoint-24"
    save_data_state(ckpt, loader)
    epochs = sorted(st["position"]["epoch"] for st in loader.state_dict()["states"])
    assert epochs[1] - epochs[0] > 1
    del it
    resumed = StatefulLoader(ds.to_torch(), num_workers=3)
    load_data_state(ckpt, resumed)
    after = list(resumed)
    assert len(before) + len(after) == 40
    assert _tokens(before) + _tokens(after) == Counter({t: 8 for doc in docs for t in doc if t})


def test_rank_files_of_different_steps_are_refused(tmp_path: Path) -> None:
    # a stale file (rank 1's from another checkpoint) merged silently: the model's step and the data out of step
    ds, _ = _ds(tmp_path, num_epochs=1)
    ckpt = tmp_path / "checkpoint-3"
    for rank in range(2):
        loader = StatefulLoader(ds.to_torch(rank=rank, world_size=2))
        it = iter(loader)
        for _ in range(3 + rank):
            next(it)
        save_data_state(ckpt, loader)
        del it
    with pytest.raises(StateError, match=r"come from different training steps \(batches handed out: rank 0: 3, rank 1: 4\)"):
        load_data_state(ckpt, StatefulLoader(ds.to_torch(rank=0, world_size=1)))


def test_merge_needs_every_rank_file(tmp_path: Path) -> None:
    ds, _ = _ds(tmp_path, num_epochs=1)
    ckpt = tmp_path / "checkpoint-3"
    for rank in range(2):
        loader = StatefulLoader(ds.to_torch(rank=rank, world_size=2))
        next(iter(loader))
        save_data_state(ckpt, loader)
    (ckpt / "arrowstream" / "rank-00001-of-00002.json").unlink()
    with pytest.raises(StateError, match=r"no file for rank\(s\) \[1\] of 2"):
        load_data_state(ckpt, StatefulLoader(ds.to_torch(rank=0, world_size=1)))
    # the same topology needs only the rank's own file (node-local checkpoint folders)
    own = StatefulLoader(ds.to_torch(rank=0, world_size=2))
    load_data_state(ckpt, own)
    assert own.state_dict()["states"][0]["consumer"] == {"index": 0, "count": 2}


def test_missing_data_state_names_the_folder(tmp_path: Path) -> None:
    ds, _ = _ds(tmp_path)
    with pytest.raises(StateError, match="no arrowstream data state in .*checkpoint-9"):
        load_data_state(tmp_path / "checkpoint-9", StatefulLoader(ds.to_torch()))


def test_a_data_state_the_storage_refuses_to_write_is_a_state_error(tmp_path: Path) -> None:
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import resource, signal
        from arrowstream import StateError, read_parquet
        from arrowstream.huggingface import save_data_state
        from arrowstream.pytorch import StatefulLoader
        from arrowstream.testing import example_dir
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # the limit then fails the write (EFBIG)
        ds = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0).pack(seq_len=4, batch_size=2)
        loader = StatefulLoader(ds.to_torch())
        next(iter(loader))
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))   # a state is over 1 KB
        try:
            save_data_state({str(tmp_path / "checkpoint-1")!r}, loader)
        except StateError as exc:
            print("StateError:", exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "StateError: cannot write the data state" in out.stdout and "save again" in out.stdout
    assert not list((tmp_path / "checkpoint-1" / "arrowstream").glob("*"))  # nothing half written
