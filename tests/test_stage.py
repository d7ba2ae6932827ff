"""A stage of the user's own joins the pipeline through ``Dataset.pipe`` like the built-in ones."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from arrowstream import ConfigError, SchemaError, Stage, StateMismatchError, read_parquet
from arrowstream.io.chunk import Chunk
from arrowstream.testing import assert_resumes_identically


class DropMultiples(Stage):
    """Drop rows whose ``id`` is a multiple of ``k`` (counted as ``multiple``)."""

    name = "drop_multiples"
    counters = ("multiple",)

    def __init__(self, k: int) -> None:
        self.k = k

    def spec(self) -> dict[str, Any]:
        return {"k": self.k}

    def columns(self) -> set[str]:
        return {"id"}

    def run(self, piece: Chunk) -> Chunk:
        assert piece.batch is not None
        return piece.with_rows(piece.batch.column("id").to_numpy() % self.k != 0, "multiple")


def test_a_piped_stage_filters_counts_and_resumes(text_dir: Callable[..., Path], tokenizer: Tokenizer) -> None:
    root = text_dir()
    ds = read_parquet(root, num_epochs=2, batch_rows=4).pipe(DropMultiples(3))
    ids = [i for b in ds for i in b.column("id").to_pylist()]
    assert ids == [i for _ in range(2) for i in range(60) if i % 3]
    it = ds.iter()
    assert next(it).column("id").to_pylist() == [1, 2]  # rows 0..3 read: 0 and 3 dropped, counted
    assert it.stats["multiple"] == 2 and it.stats["rows"] == 4
    assert assert_resumes_identically(ds, min_epochs=2) > 10
    packed = ds.tokenize(tokenizer).pack(seq_len=16, batch_size=2)
    assert assert_resumes_identically(packed, min_epochs=2) > 5
    state = packed.iter().state_dict()
    assert state["options"]["stages"][0] == {"name": "drop_multiples", "k": 3}
    assert state["stats"]["multiple"] == 0  # there from the first state on
    other = read_parquet(root, num_epochs=2, batch_rows=4).pipe(DropMultiples(4)).tokenize(tokenizer)
    with pytest.raises(StateMismatchError, match="stages.0.k"):
        other.pack(seq_len=16, batch_size=2).iter(state)


class Broken(DropMultiples):
    """Slices its batch without ``with_rows`` (rows lost, uncounted), or raises an error of its own."""

    name = "broken"

    def run(self, piece: Chunk) -> Chunk:
        assert piece.batch is not None
        if self.k == 0:
            raise ValueError("my own stage's error")
        return dataclasses.replace(piece, batch=piece.batch.slice(0, 2))


def test_a_stage_that_loses_rows_or_fails_is_named_with_where(text_dir: Callable[..., Path]) -> None:
    root = text_dir()
    with pytest.raises(SchemaError, match=r"part-000\.parquet', row group 0, rows 0\.\.3: stage `broken` gave 4 "
                       r"documents \(`seq`\) but 2 rows in `batch`: .*`chunk\.with_rows\(keep, reason\)`"):
        list(read_parquet(root, batch_rows=4).pipe(Broken(3)))
    with pytest.raises(ValueError, match="my own stage's error") as info:  # its own type, kept
        list(read_parquet(root, batch_rows=4).pipe(Broken(0)))
    if sys.version_info >= (3, 11):
        assert any("stage `broken` in '" in note and "row group 0" in note for note in info.value.__notes__)


def test_pipe_takes_only_stages(text_dir: Callable[..., Path]) -> None:
    with pytest.raises(ConfigError, match="arrowstream.Stage"):
        read_parquet(text_dir()).pipe(lambda chunk: chunk)  # type: ignore[arg-type]


def test_builders_hand_their_options_to_the_classes_that_validate_them(
    text_dir: Callable[..., Path], tokenizer: Tokenizer
) -> None:
    import arrowstream

    ds = read_parquet(text_dir()).tokenize(tokenizer, add_eos=False, slice_bytes=4096)
    stage = ds.stages[-1]
    assert isinstance(stage, arrowstream.Tokenize)
    assert (stage.add_eos, stage.slice_bytes) == (False, 4096)
    fit = ds.pack(seq_len=16, batch_size=2, strategy="best_fit", window=32, fill=0.5).packer
    assert isinstance(fit, arrowstream.BestFitPacker) and (fit.window, fit.fill, fit.pad_id) == (32, 0.5, 0)
    assert isinstance(ds.bucket(max_tokens=64).packer, arrowstream.BucketPacker)
    with pytest.raises(ConfigError, match="slice_bytes"):  # checked once, by the stage
        read_parquet(text_dir()).tokenize(tokenizer, slice_bytes=0)
    with pytest.raises(ConfigError, match="windw"):  # a misspelt option is never ignored
        ds.pack(seq_len=16, batch_size=2, strategy="best_fit", windw=32)
