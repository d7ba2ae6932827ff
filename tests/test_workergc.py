"""A DataLoader worker freezes what it inherited, so its full garbage collections stay short."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from torch.utils.data import DataLoader

from arrowstream import read_parquet
from arrowstream.core.workergc import ENV

from .conftest import named_docs, write_parts


def _frozen_count(batch: dict[str, Any]) -> dict[str, Any]:
    """A collate_fn: it runs in the worker, so it can say how many objects the worker has frozen."""
    return {**batch, "frozen": gc.get_freeze_count()}


def _worker_freeze_counts(tmp_path: Path) -> list[int]:
    docs = named_docs([int(n) for n in np.random.default_rng(1).integers(1, 12, size=60)])
    write_parts(tmp_path, [{"input_ids": pa.array(docs, pa.list_(pa.int32()))}], row_group_size=10)
    ds = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0).pack(seq_len=8, batch_size=2, strategy="best_fit")
    loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=1, collate_fn=_frozen_count)
    return [batch["frozen"] for batch in loader]


def test_a_worker_freezes_what_it_inherited(tmp_path: Path) -> None:
    assert gc.get_freeze_count() == 0  # not this process: only a worker freezes
    counts = _worker_freeze_counts(tmp_path)
    assert counts and min(counts) > 1000  # torch's modules, the dataset, the tokenizer...
    assert gc.get_freeze_count() == 0


def test_the_collector_is_left_alone_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "default")
    assert set(_worker_freeze_counts(tmp_path)) == {0}
