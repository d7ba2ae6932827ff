"""A DataLoader without workers, iterated without its per-batch profiler range unless a profiler records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, IterableDataset  # noqa: E402

from arrowstream import read_parquet  # noqa: E402
from arrowstream.pytorch import StatefulLoader  # noqa: E402
from arrowstream.single_process import single_process_batches  # noqa: E402
from arrowstream.testing import assert_items_equal  # noqa: E402

from .conftest import write_parts  # noqa: E402


class _Counting(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for k in range(self.n):
            yield {"x": torch.full((2,), k), "k": k}


def _plain(batch: Any) -> dict[str, Any]:
    """A batch with numpy arrays for tensors, as ``assert_items_equal`` compares them."""
    items = batch.items() if isinstance(batch, dict) else [("value", batch)]
    return {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in items}


def _no_range(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a profiler range was opened while no profiler records")


def test_the_batches_are_the_dataloaders() -> None:
    for loader in (DataLoader(range(7), batch_size=3), DataLoader(_Counting(5), batch_size=None),
                   DataLoader(_Counting(4), batch_size=2, collate_fn=lambda items: [i["k"] for i in items])):
        expected = list(loader)
        got = list(single_process_batches(loader))
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert_items_equal(_plain(a), _plain(b))


def test_the_profiler_range_opens_only_while_a_profiler_records(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = DataLoader(_Counting(3), batch_size=None)
    name = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    with monkeypatch.context() as patch:
        patch.setattr(torch.autograd.profiler, "record_function", _no_range)
        assert len(list(single_process_batches(loader))) == 3
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert len(list(single_process_batches(loader))) == 3
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as ref:
        assert len(list(loader)) == 3
    ours = [e.name for e in prof.events() if e.name == name]
    theirs = [e.name for e in ref.events() if e.name == name]
    assert len(ours) == len(theirs) == 4  # a range per batch, and one for the fetch that ends the pass


def test_a_loader_with_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="without workers, got num_workers=1: iterate a loader with workers as it is"):
        next(single_process_batches(DataLoader(_Counting(3), batch_size=None, num_workers=1)))


def test_a_stateful_loader_without_workers_opens_no_range_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_parts(tmp_path, [{"ids": [[k % 9 + 1] * (k % 5 + 1) for k in range(40)]}])
    ds = read_parquet(tmp_path).tokenize(None, column="ids", eos_id=0).pack(seq_len=8, batch_size=2)
    expected = [dict(b) for b in DataLoader(ds.to_torch(), batch_size=None)]
    monkeypatch.setattr(torch.autograd.profiler, "record_function", _no_range)
    loader = StatefulLoader(ds.to_torch())
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    resumed = StatefulLoader(ds.to_torch())
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(first) + len(rest) == len(expected) > 3
    for got, want in zip(first + rest, expected):
        assert_items_equal(_plain(got), _plain(want))
