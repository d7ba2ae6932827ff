"""The resume contract, for every stage and for the whole pipeline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tokenizers import Tokenizer

from arrowstream import Dataset, read_parquet
from arrowstream.testing import assert_items_equal, assert_resumes_identically
from arrowstream.tokenize.encoders import Encoder

from .conftest import EncodedBy, write_parts


def test_source_stage_resumes(text_dir: Callable[..., Path]) -> None:
    ds = read_parquet(text_dir(), num_epochs=2, batch_rows=4)
    assert assert_resumes_identically(ds, min_epochs=2) > 10


def test_filter_stage_resumes(text_dir: Callable[..., Path]) -> None:
    ds = read_parquet(text_dir(), num_epochs=2, batch_rows=4).filter(~pc.field("id").isin(list(range(0, 1000, 3))))
    assert assert_resumes_identically(ds, min_epochs=2) > 10


def test_tokenize_stage_resumes(text_dir: Callable[..., Path], tokenizer_path: Path) -> None:
    root = text_dir()
    # rebuilt from the file for every run: nothing (tokenizer, encoder, caches) is shared
    assert assert_resumes_identically(
        lambda: read_parquet(root, num_epochs=2, batch_rows=4).tokenize(str(tokenizer_path)), min_epochs=2
    ) > 10


def test_pretokenized_stage_resumes(tmp_path: Path) -> None:
    ids = pa.array([[i, i + 1, i + 2][: 1 + i % 3] for i in range(40)], pa.list_(pa.int64()))
    write_parts(tmp_path, [{"input_ids": ids}], row_group_size=7)
    ds = read_parquet(tmp_path, num_epochs=2, batch_rows=5).tokenize(None, column="input_ids", eos_id=0)
    assert assert_resumes_identically(ds, min_epochs=2) > 10


@pytest.mark.parametrize("drop_last", [False, True])
def test_whole_pipeline_resumes(
    text_dir: Callable[..., Path], tokenizer_path: Path, drop_last: bool
) -> None:
    root = text_dir()

    def build() -> Dataset:  # a new pipeline for every run, as after a restart
        return (
            read_parquet(root, num_epochs=2, batch_rows=5)
            .filter(~pc.field("id").isin(list(range(1, 1000, 5))))
            .tokenize(str(tokenizer_path))
            .pack(seq_len=32, batch_size=2, drop_last=drop_last)
        )

    assert assert_resumes_identically(build, min_epochs=2) > 10


def test_whole_pipeline_resumes_with_tiktoken_ids_from_the_first_document(
    text_dir: Callable[..., Path], tokenizer_path: Path, encoded_by: EncodedBy
) -> None:
    """``sample_bytes=0``: no document sample, so every id the contract compares is tiktoken's."""
    root = text_dir()

    def build() -> Dataset:
        encoder = Encoder(str(tokenizer_path), sample_bytes=0)
        assert encoder.backend == "tiktoken"
        return (
            read_parquet(root, num_epochs=2, batch_rows=5)
            .shuffle(seed=4, window=2)
            .tokenize(encoder)
            .pack(seq_len=32, batch_size=2)
        )

    assert assert_resumes_identically(build, min_epochs=2) > 10
    assert encoded_by.tiktoken > 0 and encoded_by.tokenizers == 0


def test_the_helper_compares_with_a_run_that_never_saves_a_state(text_dir: Callable[..., Path]) -> None:
    """A state_dict() that changes what comes next must fail the helper (guards the guard)."""
    ds = read_parquet(text_dir(), batch_rows=4)

    class Meddling:
        def __init__(self) -> None:
            self.it = ds.iter()

        def __iter__(self) -> Meddling:
            return self

        def __next__(self) -> pa.RecordBatch:
            return next(self.it)

        def state_dict(self) -> dict:
            next(self.it, None)  # a side effect: saving a state skips an item
            return self.it.state_dict()

        def load_state_dict(self, state: dict) -> None:
            self.it.load_state_dict(state)

    with pytest.raises(AssertionError, match="state_dict"):
        assert_resumes_identically(Meddling)


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
