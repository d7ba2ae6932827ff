"""The read plan: worked out once per description, which stays immutable and holds nothing."""

from __future__ import annotations

import gc
import pickle
from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pytest
from tokenizers import Tokenizer

from arrowstream import read_parquet
from arrowstream.pipeline import plan as plan_module
from arrowstream.pipeline.plan import Plan

from .conftest import heavy_tail, write_named_docs, write_parts


@pytest.mark.filterwarnings("ignore::arrowstream.DataLossWarning")  # estimated batch counts: drops are the point
def test_iterating_leaves_the_description_byte_for_byte_as_it_was(tmp_path: Path) -> None:
    """Nothing is cached in a description, so DataLoader workers get the same bytes whenever it is pickled.

    (A tokenizer's encoder still records how much of its proof sample it has
    checked; pre-tokenized ids keep this test to the description itself.)
    """
    write_named_docs(tmp_path, heavy_tail(120, seed=4), files=3, rg=9)
    ds = (
        read_parquet(tmp_path, num_epochs=2)
        .shuffle(seed=1)
        .filter(pc.list_value_length(pc.field("input_ids")) > 2)
        .tokenize(None, column="input_ids", eos_id=0)
        .pack(seq_len=16, batch_size=2)
    )
    before = pickle.dumps(ds)
    for rank in range(2):  # even batches: the token-rate sample, layouts and targets are computed
        assert sum(1 for _ in ds.iter(rank=rank, world_size=2)) > 0
    assert ds.num_pruned_rows == 0 and ds.prefetch_depth == 2
    assert pickle.dumps(ds) == before


def test_one_plan_per_description_shared_by_its_iterators_and_freed_with_it(text_dir: Callable[..., Path]) -> None:
    ds = read_parquet(text_dir()).filter(pc.field("id") > 3)
    its = [ds.iter(), ds.iter(rank=1, world_size=2)]
    assert its[0].plan is its[1].plan is Plan.of(ds)
    assert Plan.of(read_parquet(text_dir()).filter(pc.field("id") > 3)) is not its[0].plan  # another description
    key = id(ds)
    assert key in plan_module._PLANS
    del ds, its
    gc.collect()
    assert key not in plan_module._PLANS


def test_iter_returns_at_once_and_sets_up_at_the_first_next(tmp_path: Path, tokenizer: Tokenizer) -> None:
    from arrowstream.testing.texts import make_texts

    write_parts(tmp_path, [{"text": make_texts(200, seed=1)}], row_group_size=20)
    ds = read_parquet(tmp_path).tokenize(tokenizer).pack(seq_len=32, batch_size=2)
    plan = Plan.of(ds)
    it = ds.iter(rank=0, world_size=2)  # even batches over text: estimated from a sample
    assert plan._sample is None  # nothing read, nothing tokenized yet
    first = next(it)
    assert plan._sample is not None and first["input_ids"].shape == (2, 32)
    # a state asked before the first batch sets up the same way, and says where the share starts
    again = ds.iter(rank=1, world_size=2)
    assert again.state_dict()["work"]["by"] == "estimate"
