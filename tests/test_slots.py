"""Batches in slots of a worker's shared memory: never overwritten while held, freed when dropped, same bytes."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import read_parquet, slots
from arrowstream.pytorch import StatefulLoader

from .conftest import write_parts


def _corpus(tmp_path: Path, *, docs: int = 300, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    ids = [rng.integers(1, 30_000, size=int(rng.integers(20, 700)), dtype=np.int32) for _ in range(docs)]
    write_parts(tmp_path, [{"input_ids": pa.array(ids, pa.list_(pa.int32()))}], row_group_size=10)
    return tmp_path


def _packed(root: Path, *, bucket: bool = False) -> Any:
    ds = read_parquet(root).tokenize(None, column="input_ids", eos_id=0)
    if bucket:  # batches of every shape: the ring grows to the largest
        return ds.bucket(max_tokens=2048, max_len=512, long_docs="truncate")
    return ds.pack(seq_len=256, batch_size=4, even_batches=False)


def _expected(ds: Any, num_workers: int) -> list[dict[str, np.ndarray]]:
    """The batches a DataLoader with ``num_workers`` hands over, in order, made without workers."""
    per_worker = [list(ds.iter(worker=w, num_workers=num_workers)) for w in range(num_workers)]
    out = []
    for i in range(max(len(b) for b in per_worker)):
        out += [b[i] for b in per_worker if i < len(b)]
    return out


def _same(got: dict[str, Any], want: dict[str, Any]) -> bool:
    arrays = [k for k, v in want.items() if isinstance(v, np.ndarray)]
    return list(got) == list(want) and all(np.array_equal(got[k].numpy(), want[k]) for k in arrays)


def test_a_slot_is_free_again_once_its_view_is_gone_and_never_handed_out_while_held() -> None:
    gc.collect()  # (views left by earlier tests in this process)
    placed = [slots.place(np.full(100, i, dtype=np.uint8)) for i in range(slots.SLOTS_MOST)]
    held = [slots.take_out(where) for where in placed]
    assert slots.place(np.zeros(100, dtype=np.uint8)) is None  # every slot held: the caller sends it otherwise
    assert [int(v[0]) for v in held] == list(range(slots.SLOTS_MOST))  # nothing overwritten
    del held[3]
    gc.collect()
    where = slots.place(np.full(100, 99, dtype=np.uint8))
    assert where is not None and where.slot == placed[3].slot  # the freed one, and only it
    assert int(slots.take_out(where)[0]) == 99
    assert [int(v[0]) for i, v in enumerate(held)] == [0, 1, 2, 4, 5, 6, 7]


def test_a_view_of_a_view_keeps_the_slot_held() -> None:
    arr = slots.take_out(slots.place(np.arange(64, dtype=np.uint8)))
    tensor = torch.from_numpy(arr)[8:16].view(torch.int64)  # what a batch's tensors are
    del arr
    gc.collect()
    taken = [slots.place(np.zeros(64, dtype=np.uint8)) for _ in range(slots.SLOTS_MOST)]
    assert taken[-1] is None  # the slot under `tensor` is still held
    assert int(tensor[0]) == int.from_bytes(bytes(range(8, 16)), "little")
    views = [slots.take_out(where) for where in taken[:-1]]  # (and their slots are free again)
    del views


def test_a_process_forked_while_a_batch_is_held_does_not_free_its_slot() -> None:
    gc.collect()
    where = slots.place(np.full(64, 5, dtype=np.uint8))
    view = slots.take_out(where)
    pid = os.fork()
    if pid == 0:  # the child drops its copy of the batch, as a forked worker might
        del view
        gc.collect()
        os._exit(0)
    os.waitpid(pid, 0)
    others = [slots.place(np.zeros(64, dtype=np.uint8)) for _ in range(slots.SLOTS_MOST)]
    assert others[-1] is None and where.slot not in {w.slot for w in others[:-1]}  # still held here
    assert view.tolist() == [5] * 64
    views = [slots.take_out(w) for w in others[:-1]]
    del views


def test_a_batch_larger_than_the_slots_gets_a_larger_ring() -> None:
    small = slots.take_out(slots.place(np.ones(10, dtype=np.uint8)))
    where = slots.place(np.full(300_000, 7, dtype=np.uint8))
    assert where.slot_bytes == 1 << 19 and where.handle is not None  # a new ring, sent with its batch
    big = slots.take_out(where)
    assert int(big.sum()) == 7 * 300_000 and small.tolist() == [1] * 10  # the old ring's batch still readable


def test_a_batch_naming_a_ring_never_received_is_refused() -> None:
    where = slots.place(np.ones(10, dtype=np.uint8))
    stray = slots.Where((os.getpid(), 0, 10**6), where.size, where.slot_bytes, where.slots, where.slot, 10)
    with pytest.raises(slots.SlotError, match="never received"):
        slots.take_out(stray)
    slots.take_out(where)  # (and its slot is free again)


@pytest.mark.parametrize("bucket", [False, True])
def test_batches_kept_by_the_trainer_are_never_overwritten(tmp_path: Path, bucket: bool) -> None:
    ds = _packed(_corpus(tmp_path), bucket=bucket)
    want = _expected(ds, 2)
    assert len(want) > 4 * slots.SLOTS_MOST
    before = slots.counts["taken_out"]
    kept = list(DataLoader(ds.to_torch(), batch_size=None, num_workers=2))  # all held until the end
    came_in_slots = slots.counts["taken_out"] - before
    assert 0 < came_in_slots <= 2 * slots.SLOTS_MOST  # the rest went through the pipe once the slots were held
    assert len(kept) == len(want) and all(_same(g, w) for g, w in zip(kept, want, strict=True))


@pytest.mark.parametrize(("context", "loader_type"), [("fork", DataLoader), ("spawn", DataLoader), ("fork", StatefulDataLoader)])
def test_batches_dropped_as_they_come_all_cross_in_slots(tmp_path: Path, context: str, loader_type: type) -> None:
    ds = _packed(_corpus(tmp_path))
    want = _expected(ds, 2)
    before = slots.counts["taken_out"]
    loader = loader_type(ds.to_torch(), batch_size=None, num_workers=2, multiprocessing_context=context)
    same = [_same(batch, want[i]) for i, batch in enumerate(loader)]
    assert len(same) == len(want) and all(same)
    assert slots.counts["taken_out"] - before == len(want)  # slots freed and used again: never full


def test_workers_of_later_epochs_get_new_rings_and_exited_ones_are_forgotten(tmp_path: Path) -> None:
    ds = _packed(_corpus(tmp_path, docs=40))
    want = _expected(ds, 2)
    loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=2)
    for _ in range(3):  # new worker processes each epoch
        got = list(loader)
        assert all(_same(g, w) for g, w in zip(got, want, strict=True))
        del got
    assert len(slots._received) <= 4  # at most the last epoch's two and, until the next ring comes, the one before's
    persistent = DataLoader(ds.to_torch(), batch_size=None, num_workers=2, persistent_workers=True)
    for _ in range(3):  # the same workers and rings each epoch
        assert all(_same(g, w) for g, w in zip(persistent, want, strict=True))


def test_without_memory_for_a_ring_batches_cross_the_other_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)  # forked workers inherit it
    ds = _packed(_corpus(tmp_path))
    want = _expected(ds, 2)
    before = slots.counts["taken_out"]
    got = list(DataLoader(ds.to_torch(), batch_size=None, num_workers=2))
    assert all(_same(g, w) for g, w in zip(got, want, strict=True)) and len(got) == len(want)
    assert slots.counts["taken_out"] == before


def test_the_stateful_loader_resumes_exactly_with_batches_in_slots(tmp_path: Path) -> None:
    ds = _packed(_corpus(tmp_path), bucket=True)
    before = slots.counts["taken_out"]
    loader = StatefulLoader(ds.to_torch(), num_workers=2)
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    state = loader.state_dict()
    rest = list(it)
    assert slots.counts["taken_out"] - before >= 2 * slots.SLOTS_MOST  # (the rest through the pipe: all are kept)
    resumed = StatefulLoader(ds.to_torch(), num_workers=2)
    resumed.load_state_dict(state)
    again = list(resumed)
    assert len(again) == len(rest)
    for g, w in zip(again, rest, strict=True):
        assert all(torch.equal(g[k], w[k]) for k in w if isinstance(w[k], torch.Tensor))


def test_batches_already_received_stay_whole_when_their_worker_is_killed(tmp_path: Path) -> None:
    import signal

    ds = _packed(_corpus(tmp_path))
    want = _expected(ds, 1)
    before = slots.counts["taken_out"]
    it = iter(DataLoader(ds.to_torch(), batch_size=None, num_workers=1, timeout=30))
    held = [next(it) for _ in range(3)]
    assert slots.counts["taken_out"] - before == 3
    worker = next(iter(it._workers))  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="exited unexpectedly|killed by signal"):  # (torch's SIGCHLD handler)
        os.kill(worker.pid, signal.SIGKILL)
        for _ in range(len(want)):
            next(it)
    gc.collect()
    assert all(_same(g, w) for g, w in zip(held, want[:3], strict=True))  # the ring outlives its worker here
    held[0]["input_ids"][0, 0] = -1  # and is still ours to write
    assert int(held[0]["input_ids"][0, 0]) == -1


class _GoneSharer:
    """A ring handle whose worker is gone: fetching the descriptor fails, as resource_sharer's does."""

    def detach(self) -> int:
        raise ConnectionResetError(104, "Connection reset by peer")


def test_a_ring_whose_worker_died_before_handing_it_over_is_a_slot_error_naming_the_worker() -> None:
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # exited and reaped: gone
    where = slots.Where((child.pid, 1, 0), 4096 + 65536, 65536, 1, 0, 10, _GoneSharer())
    start = time.monotonic()
    with pytest.raises(slots.SlotError, match=f"DataLoader worker pid {child.pid} .*exited after sending it"):
        slots.take_out(where)
    assert time.monotonic() - start < 2  # no wait once the worker is seen gone


def test_a_ring_handle_that_fails_while_its_worker_is_dying_waits_until_the_worker_can_be_seen_dead() -> None:
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.4)"])  # exits on its own, not reaped
    where = slots.Where((child.pid, 2, 0), 4096 + 65536, 65536, 1, 0, 10, _GoneSharer())
    start = time.monotonic()
    with pytest.raises(slots.SlotError):
        slots.take_out(where)
    waited = time.monotonic() - start
    # the DataLoader, which checks its workers when receiving fails, must then find this one dead
    assert child.poll() is not None and 0.2 < waited < 5
