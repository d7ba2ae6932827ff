"""How DataLoader workers hand batches to the main process: in slots, through the result pipe, or by shared-memory name."""

from __future__ import annotations

import os
import pickle
import sys
import warnings
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import read_parquet, slots
from arrowstream.handover import PICKLE_SLACK, ByValue, by_value_limit, handed, one_storage, widen_result_pipe
from arrowstream.pytorch import Batch

from .conftest import write_parts

PIPE_MAX = int(Path("/proc/sys/fs/pipe-max-size").read_text())


def _packed(tmp_path: Path, *, seq_len: int, batch_size: int, docs: int = 40, doc_len: int = 900):
    rng = np.random.default_rng(0)
    ids = [rng.integers(1, 30_000, size=doc_len, dtype=np.int32) for _ in range(docs)]
    write_parts(tmp_path, [{"input_ids": pa.array(ids, pa.list_(pa.int32()))}], row_group_size=10)
    return read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0).pack(
        seq_len=seq_len, batch_size=batch_size, even_batches=False
    )


def _nbytes(batch: dict[str, Any]) -> int:
    return sum(v.nbytes for v in batch.values() if isinstance(v, np.ndarray))


def _shm_managers(pid: int) -> list[int]:
    """The ``torch_shm_manager`` processes among ``pid``'s descendants."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").iterdir():
            try:  # a thread or a child may end while we look
                children = [int(c) for c in (task / "children").read_text().split()]
                todo += children
                found += [c for c in children if Path(f"/proc/{c}/comm").read_text().startswith("torch_shm_manag")]
            except OSError:
                continue
    return found


def _receive(
    ds: Any, sharing: str | None = None, n: int = 3, context: str | None = None
) -> tuple[list[dict[str, Any]], list[int]]:
    """The first ``n`` batches one worker hands over, and the shm managers under it meanwhile."""
    options = {} if sharing is None else {"sharing": sharing}
    loader = DataLoader(ds.to_torch(**options), batch_size=None, num_workers=1, multiprocessing_context=context)
    it = iter(loader)
    got = [next(it) for _ in range(n)]
    managers = _shm_managers(next(iter(it._workers)).pid)  # type: ignore[attr-defined]
    for _ in it:  # to the end: the worker exits on its own
        pass
    return got, managers


def _assert_same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    for g, w in zip(got, want, strict=False):
        assert list(g) == list(w)
        for key, value in w.items():
            if isinstance(value, np.ndarray):
                assert g[key].dtype == torch.from_numpy(value).dtype and np.array_equal(g[key].numpy(), value), key
            else:
                assert g[key] == value, key


def test_by_default_a_batch_crosses_in_a_slot_and_no_shm_manager_starts(tmp_path: Path) -> None:
    ds = _packed(tmp_path, seq_len=2048, batch_size=32, docs=240)
    want = list(ds.iter())[:3]
    assert _nbytes(want[0]) > PIPE_MAX - PICKLE_SLACK  # larger than the pipe: by name without slots
    before = slots.counts["taken_out"]
    got, managers = _receive(ds)
    _assert_same(got, want)
    assert slots.counts["taken_out"] - before >= 3  # every batch the worker sent came in a slot
    for batch in got:
        assert type(batch) is Batch
        storages = {t.untyped_storage() for t in batch.values() if isinstance(t, torch.Tensor)}
        assert len({s.data_ptr() for s in storages}) == 1  # one buffer per batch
        assert not any(s.is_shared() for s in storages)  # no segment of torch's
    assert managers == []  # torch starts one per worker for its first segment by name
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # writable: no "non-writable buffer" warning
        got[0]["labels"][0, 0] = -100
    assert int(got[0]["labels"][0, 0]) == -100
    # the same batches by name: segments, and the manager the default avoids (a spawned worker starts its
    # own; a forked one may reuse a manager this process connected to when it opened an earlier segment)
    named, managers = _receive(ds, "file_system", context="spawn")
    _assert_same(named, want)
    assert all(b["input_ids"].untyped_storage().is_shared() for b in named)
    assert len(managers) == 1


def test_without_slots_a_batch_that_fits_the_pipe_crosses_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slots, "available", lambda: False)  # as on a system without memfd (forked workers see it)
    ds = _packed(tmp_path, seq_len=1024, batch_size=8)
    want = list(ds.iter())[:3]
    assert 64 * 1024 < _nbytes(want[0]) < PIPE_MAX - PICKLE_SLACK  # more than an unwidened pipe holds
    before = slots.counts["taken_out"]
    got, managers = _receive(ds)
    _assert_same(got, want)
    assert slots.counts["taken_out"] == before
    for batch in got:
        storages = {t.untyped_storage() for t in batch.values() if isinstance(t, torch.Tensor)}
        assert len({s.data_ptr() for s in storages}) == 1
        assert not any(s.is_shared() for s in storages)  # bytes from the pipe, no segment
    assert managers == []


def test_a_batch_too_large_for_slots_goes_by_name_unless_pipe_is_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slots, "RING_MOST", 128 << 10)  # a ring of at most 128 KiB: these batches do not fit
    ds = _packed(tmp_path, seq_len=2048, batch_size=32, docs=80)
    want = list(ds.iter())[:2]
    assert _nbytes(want[0]) > PIPE_MAX - PICKLE_SLACK
    got, _ = _receive(ds, n=2)
    _assert_same(got, want)
    assert all(b["input_ids"].untyped_storage().is_shared() for b in got)
    piped, managers = _receive(ds, "pipe", n=2)
    _assert_same(piped, want)
    assert not any(b["input_ids"].untyped_storage().is_shared() for b in piped) and managers == []


class _Capacity(IterableDataset):  # type: ignore[type-arg]
    """Yields what widening its worker's result pipe returned."""

    def __iter__(self):
        yield widen_result_pipe(sys._getframe())


def _pipe_capacity(it: Any) -> int:
    """The capacity of a DataLoader iterator's result pipe, seen from the main process's end."""
    import fcntl

    return fcntl.fcntl(it._worker_result_queue._reader.fileno(), fcntl.F_GETPIPE_SZ)


@pytest.mark.parametrize("loader", [DataLoader, StatefulDataLoader])
def test_a_worker_widens_the_result_pipe_of_either_dataloader(tmp_path: Path, loader: Any) -> None:
    import fcntl

    read_end, write_end = os.pipe()  # a pipe as made: less than its widest
    assert fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ) < PIPE_MAX
    os.close(read_end), os.close(write_end)
    it = iter(loader(_Capacity(), batch_size=None, num_workers=1))
    assert next(it) == PIPE_MAX  # (the worker may widen it before the first next(): checked after)
    assert _pipe_capacity(it) == PIPE_MAX
    assert list(loader(_Capacity(), batch_size=None, num_workers=0)) == [None]  # no pipe without workers
    it = iter(loader(_packed(tmp_path, seq_len=64, batch_size=2).to_torch(), batch_size=None, num_workers=1))
    next(it)
    assert _pipe_capacity(it) == PIPE_MAX  # what to_torch() does in its workers by default


def test_the_limit_follows_the_sharing() -> None:
    here = sys._getframe()
    assert by_value_limit("pipe", here) == float("inf")
    assert by_value_limit("file_system", here) == by_value_limit(None, here) == 0
    assert by_value_limit("auto", here) == 0  # no worker, no pipe found: by name


@pytest.mark.parametrize("dumps", [pickle.dumps, ForkingPickler.dumps])
def test_by_value_sends_the_buffer_once_and_other_values_as_themselves(dumps: Any) -> None:
    arrays = {"a": np.arange(12, dtype=np.int64).reshape(3, 4), "empty": np.zeros((0, 5), np.int32),
              "flag": np.array([True, False, True])}
    other = torch.arange(3.0)  # not a view of the batch's buffer
    batch = ByValue({"n": 7, **one_storage(arrays), "other": other, "state": {"epoch": 1}})
    payload = dumps(batch)
    assert len(payload) < sum(a.nbytes for a in arrays.values()) + 2048  # the buffer once, not per tensor
    back = pickle.loads(payload)
    assert type(back) is dict and list(back) == ["n", "a", "empty", "flag", "other", "state"]
    for key, value in arrays.items():
        assert back[key].dtype == torch.from_numpy(value).dtype and np.array_equal(back[key].numpy(), value)
    assert back["n"] == 7 and back["state"] == {"epoch": 1} and torch.equal(back["other"], other)
    assert back["a"].untyped_storage().data_ptr() == back["flag"].untyped_storage().data_ptr()
    assert ByValue().__reduce__()[1][2] == b""  # nothing to send
    assert pickle.loads(pickle.dumps(ByValue(n=1))) == {"n": 1}


def test_a_copy_made_in_a_worker_takes_no_slot() -> None:
    import copy

    arrays = {"a": np.arange(6, dtype=np.int64).reshape(2, 3)}
    batch = handed({"n": 1, **one_storage(arrays)}, sharing="auto", pipe_at_most=1 << 20)
    before = dict(slots.counts)
    for twin in (copy.copy(batch), copy.deepcopy(batch)):
        assert type(twin) is ByValue and twin.in_slots and twin.pipe_at_most == 1 << 20
        assert twin["n"] == 1 and torch.equal(twin["a"], batch["a"])
    assert slots.counts == before  # a slot is taken only when the batch is sent
    back = pickle.loads(ForkingPickler.dumps(batch))
    assert slots.counts["placed"] == before["placed"] + 1 and np.array_equal(back["a"].numpy(), arrays["a"])
