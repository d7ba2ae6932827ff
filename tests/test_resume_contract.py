"""The resume contract, for every stage and for the whole pipeline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tokenizers import Tokenizer

from arrowstream import read_parquet
from arrowstream.testing import assert_items_equal, assert_resumes_identically

from .conftest import write_parts


def test_source_stage_resumes(text_dir: Callable[..., Path]) -> None:
    ds = read_parquet(text_dir(), num_epochs=2, batch_rows=4)
    assert assert_resumes_identically(ds, min_epochs=2) > 10


def test_filter_stage_resumes(text_dir: Callable[..., Path]) -> None:
    ds = read_parquet(text_dir(), num_epochs=2, batch_rows=4).filter(~pc.field("id").isin(list(range(0, 1000, 3))))
    assert assert_resumes_identically(ds, min_epochs=2) > 10


def test_tokenize_stage_resumes(text_dir: Callable[..., Path], tokenizer: Tokenizer) -> None:
    ds = read_parquet(text_dir(), num_epochs=2, batch_rows=4).tokenize(tokenizer)
    assert assert_resumes_identically(ds, min_epochs=2) > 10


def test_pretokenized_stage_resumes(tmp_path: Path) -> None:
    ids = pa.array([[i, i + 1, i + 2][: 1 + i % 3] for i in range(40)], pa.list_(pa.int64()))
    write_parts(tmp_path, [{"input_ids": ids}], row_group_size=7)
    ds = read_parquet(tmp_path, num_epochs=2, batch_rows=5).tokenize(None, column="input_ids", eos_id=0)
    assert assert_resumes_identically(ds, min_epochs=2) > 10


@pytest.mark.parametrize("drop_last", [False, True])
def test_whole_pipeline_resumes(
    text_dir: Callable[..., Path], tokenizer: Tokenizer, drop_last: bool
) -> None:
    ds = (
        read_parquet(text_dir(), num_epochs=2, batch_rows=5)
        .filter(~pc.field("id").isin(list(range(1, 1000, 5))))
        .tokenize(tokenizer)
        .pack(seq_len=32, batch_size=2, drop_last=drop_last)
    )
    assert assert_resumes_identically(ds, min_epochs=2) > 10


def test_pipeline_resumes_with_nulls_and_empty_texts(tmp_path: Path, tokenizer: Tokenizer) -> None:
    texts = ["alpha beta", None, "", "gamma", None, "delta epsilon zeta", "", "eta"] * 5
    write_parts(tmp_path, [{"text": texts}], row_group_size=3)
    ds = read_parquet(tmp_path, num_epochs=2, batch_rows=2).tokenize(tokenizer).pack(
        seq_len=8, batch_size=2
    )
    assert assert_resumes_identically(ds, min_epochs=2) > 5


def test_resume_helper_catches_a_broken_resume(text_dir: Callable[..., Path]) -> None:
    """The helper must fail when a resumed iterator repeats data (guards the guard)."""
    ds = read_parquet(text_dir(), batch_rows=4)

    class Forgetful:
        def __init__(self) -> None:
            self.it = ds.iter()

        def __iter__(self) -> Forgetful:
            return self

        def __next__(self) -> pa.RecordBatch:
            return next(self.it)

        def state_dict(self) -> dict:
            return self.it.state_dict()

        def load_state_dict(self, state: dict) -> None:  # ignores the state: restarts
            pass

    with pytest.raises(AssertionError):
        assert_resumes_identically(Forgetful)


def test_items_equal_detects_dtype_and_value_changes() -> None:
    import numpy as np

    a = {"x": np.arange(3, dtype=np.int32)}
    assert_items_equal(a, {"x": np.arange(3, dtype=np.int32)})
    with pytest.raises(AssertionError):
        assert_items_equal(a, {"x": np.arange(3, dtype=np.int64)})
    with pytest.raises(AssertionError):
        assert_items_equal(a, {"x": np.array([0, 1, 3], dtype=np.int32)})
