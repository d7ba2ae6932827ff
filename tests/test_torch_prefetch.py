"""Batches made ahead in a background thread (``to_torch(prefetch=N)``): the same batches, and states of those handed out."""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import mix, read_parquet
from arrowstream.pytorch import TorchDataset
from arrowstream.testing import assert_resumes_identically

from .conftest import named_docs, write_parts


def _ds(tmp_path: Path, epochs: int = 2):
    rng = np.random.default_rng(7)
    docs = named_docs([int(n) for n in rng.integers(1, 12, size=90)])
    parts = [{"input_ids": pa.array(docs[a : a + 30], pa.list_(pa.int32()))} for a in range(0, 90, 30)]
    write_parts(tmp_path, parts, row_group_size=7)
    ds = read_parquet(tmp_path, batch_rows=5, num_epochs=epochs).shuffle(seed=3, window=2)
    return ds.tokenize(None, column="input_ids", eos_id=0)


class TorchIterator:
    """A :class:`TorchDataset` iterated in this process, seen as an iterator with state (for the resume helper)."""

    def __init__(self, dataset: TorchDataset) -> None:
        self.dataset = dataset
        self._gen: Any = None

    def __iter__(self) -> TorchIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._gen is None:
            self._gen = iter(self.dataset)
        batch = next(self._gen)
        return {k: v.numpy() if hasattr(v, "numpy") else v for k, v in batch.items()}

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
        self._gen = None


@pytest.mark.parametrize(("prefetch", "strategy"), [(1, "concat"), (3, "concat"), (3, "best_fit"), (2, "bucket")])
def test_prefetched_batches_resume_exactly_at_every_step(tmp_path: Path, prefetch: int, strategy: str) -> None:
    ds = _ds(tmp_path)
    packed = ds.bucket(max_tokens=16, max_len=8, long_docs="truncate") if strategy == "bucket" else ds.pack(seq_len=8, batch_size=2, strategy=strategy)
    steps = assert_resumes_identically(lambda: TorchIterator(packed.to_torch(prefetch=prefetch)), min_epochs=2)
    assert steps > 20


def test_prefetching_gives_the_batches_and_states_of_no_prefetching(tmp_path: Path) -> None:
    for packed in (
        _ds(tmp_path / "a").pack(seq_len=8, batch_size=2, strategy="best_fit"),
        mix({"x": _ds(tmp_path / "b"), "y": _ds(tmp_path / "c")}, {"x": 2, "y": 1}).pack(seq_len=8, batch_size=3),
    ):
        runs = []
        for prefetch in (0, 4):
            it = TorchIterator(packed.to_torch(prefetch=prefetch))
            runs.append([(b["input_ids"].tobytes(), it.state_dict()) for b in itertools.islice(it, 60)])  # a mixture is endless
        assert runs[0] == runs[1] and len(runs[0]) > 10


def test_the_state_is_of_the_batches_handed_out_while_the_thread_runs_ahead(tmp_path: Path) -> None:
    packed = _ds(tmp_path).pack(seq_len=8, batch_size=2)
    reference = TorchIterator(packed.to_torch(prefetch=0))
    for _ in range(4):
        next(reference)
    want = reference.state_dict()
    ahead = packed.to_torch(prefetch=8)
    gen = iter(ahead)
    for _ in range(4):
        next(gen)
    deadline = time.monotonic() + 5
    while ahead._it is not None and ahead._it.stats["batches"] < 12 and time.monotonic() < deadline:
        time.sleep(0.01)  # let the producer run well ahead
    assert ahead._it.stats["batches"] >= 12  # it did run ahead ...
    assert ahead.state_dict() == want  # ... and the state is still that after the 4th batch
    gen.close()


def test_an_abandoned_iteration_stops_its_thread(tmp_path: Path) -> None:
    packed = _ds(tmp_path, epochs=50).pack(seq_len=8, batch_size=2)
    before = {t for t in threading.enumerate() if t.name == "arrowstream-prefetch"}
    gen = iter(packed.to_torch(prefetch=2))
    next(gen)
    gen.close()
    after = {t for t in threading.enumerate() if t.name == "arrowstream-prefetch" and t.is_alive()}
    assert after <= before


def test_torchdata_resumes_with_workers_that_prefetch(tmp_path: Path) -> None:
    packed = _ds(tmp_path).pack(seq_len=8, batch_size=2)
    whole = [b["input_ids"].numpy().tobytes() for b in StatefulDataLoader(packed.to_torch(prefetch=3), batch_size=None, num_workers=2)]
    loader = StatefulDataLoader(packed.to_torch(prefetch=3), batch_size=None, num_workers=2)
    it = iter(loader)
    first = [next(it)["input_ids"].numpy().tobytes() for _ in range(7)]
    state = loader.state_dict()
    del it
    resumed = StatefulDataLoader(packed.to_torch(prefetch=3), batch_size=None, num_workers=2)
    resumed.load_state_dict(state)
    assert first + [b["input_ids"].numpy().tobytes() for b in resumed] == whole


def test_prefetch_must_be_a_count(tmp_path: Path) -> None:
    packed = _ds(tmp_path).pack(seq_len=8, batch_size=2)
    with pytest.raises(ValueError, match="prefetch"):
        packed.to_torch(prefetch=-1)


@pytest.mark.parametrize("strategy", ["best_fit", "bucket"])
def test_batches_made_ahead_keep_snapshots_and_build_a_state_only_when_asked(
    tmp_path: Path, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A best_fit or bucket state lists the window's documents: built after every batch made ahead, it made the stream 3-10 x slower."""
    from arrowstream.pipeline.snapshot import IteratorSnapshot

    ds = _ds(tmp_path)
    packed = ds.bucket(max_tokens=24, max_len=12, long_docs="truncate") if strategy == "bucket" else ds.pack(seq_len=12, batch_size=2, strategy=strategy)
    built: list[int] = []
    real = IteratorSnapshot.to_dict
    monkeypatch.setattr(IteratorSnapshot, "to_dict", lambda self: built.append(1) or real(self))
    torch_ds = packed.to_torch()
    assert torch_ds.prefetch is None  # made ahead by default (up to 16, within 64 MiB), as for concat
    got = list(itertools.islice(iter(torch_ds), 10))
    assert len(got) == 10 and not built  # a snapshot after each batch made ahead; no state built
    saved = torch_ds.state_dict()
    assert len(built) == 1
    reference = TorchIterator(packed.to_torch(prefetch=0))
    assert [b["input_ids"].tolist() for b in itertools.islice(reference, 10)] == [b["input_ids"].tolist() for b in got]
    assert reference.state_dict() == saved == json.loads(json.dumps(saved))


EXIT_SCRIPT = """
import sys
import torch  # loaded first, as in training: it changes the order modules are torn down at exit
import arrowstream
from arrowstream.testing.data import sample_tokenizer
ds = arrowstream.read_parquet(sys.argv[1]).tokenize(sample_tokenizer(1024)).pack(seq_len=64, batch_size=2)
it = iter(ds.to_torch())
next(it)  # leave the generator, its encode threads and its prefetch thread mid-stream, and exit
"""


def test_a_script_that_exits_mid_stream_prints_nothing_at_exit(tmp_path: Path) -> None:
    """Regression: closing the encode pool while the interpreter tore down printed 'Exception ignored ... Empty'."""
    import subprocess
    import sys

    from arrowstream.testing.data import make_texts

    write_parts(tmp_path / "d", [{"text": make_texts(400, seed=1)}], row_group_size=50)
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(tmp_path / "d")], capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stderr == "", proc.stderr[-2000:]


def test_a_stream_closed_from_a_thread_its_producer_waits_on_does_not_deadlock(tmp_path: Path) -> None:
    """Regression: a garbage collection in an encoder thread finalized an abandoned ``to_torch()`` stream.

    Its ``finally`` waited for the producer thread, which waited for that
    encoder thread: a hang (seen at exit in ``bench_stall.py --prefetch 64``).
    Here a stage's piece, run in the pipeline's pool, waits until the stream
    is closed from another thread: the close must return without waiting for
    the producer, and the stream's threads must end once the piece is let go.
    """
    from arrowstream import Stage

    release, holding = threading.Event(), threading.Event()

    class Hold(Stage):
        name, expensive = "hold", True

        def spec(self) -> dict[str, Any]:
            return {}

        def columns(self) -> set[str]:
            return {"input_ids"}

        def run(self, piece: Any) -> Any:
            if hold_now.is_set():
                holding.set()
                release.wait(timeout=60)
            return piece

    hold_now = threading.Event()
    existing = set(threading.enumerate())
    gen = iter(_ds(tmp_path, epochs=20).pipe(Hold()).pack(seq_len=8, batch_size=2).to_torch(prefetch=2))
    next(gen)
    hold_now.set()
    assert holding.wait(timeout=30), "the producer never asked for another piece"
    closer = threading.Thread(target=gen.close)  # as a garbage collection in another thread would
    closer.start()
    closer.join(timeout=10)
    returned = not closer.is_alive()
    release.set()
    closer.join(timeout=30)
    assert returned, "closing the stream from another thread waited for the producer that waits on it"
    deadline = time.monotonic() + 30
    while (started := set(threading.enumerate()) - existing) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not started, sorted(t.name for t in started)


@pytest.mark.parametrize(("prefetch", "ahead"), [(None, 5), (3, 3)])
def test_the_default_depth_is_sized_from_the_first_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefetch: int | None, ahead: int
) -> None:
    """``prefetch=None``: 2 batches ahead until the first is made, then what ``depth_for`` says of its bytes."""
    import arrowstream.io.prefetch as prefetch_module
    import arrowstream.pytorch as adapter

    sizes: list[int] = []  # the batch queue's size, as made and as resized

    class Recorded(prefetch_module.RefillQueue):
        def __init__(self, maxsize: int) -> None:
            super().__init__(maxsize)
            sizes.append(maxsize)

        def resize(self, maxsize: int) -> None:
            super().resize(maxsize)
            sizes.append(maxsize)

    monkeypatch.setattr(prefetch_module, "RefillQueue", Recorded)
    asked: list[int] = []
    monkeypatch.setattr(adapter, "depth_for", lambda nbytes: asked.append(nbytes) or 5)
    made: list[int] = []
    real = TorchDataset._tensors
    monkeypatch.setattr(TorchDataset, "_tensors", lambda self, batch: made.append(1) or real(self, batch))
    gen = iter(_ds(tmp_path, epochs=20).pack(seq_len=8, batch_size=2).to_torch(prefetch=prefetch))
    first = next(gen)
    deadline, seen = time.monotonic() + 30, -1
    while seen != len(made) and time.monotonic() < deadline:  # until the producer waits for room
        seen = len(made)
        time.sleep(0.3)
    gen.close()
    # the batch handed out, the batches held ahead, and one more made, waiting for room; the queue refills by
    # halves, so when the first batch was taken from a full queue it rests one short of full
    assert seen in (1 + ahead, 1 + ahead + 1) and sizes[-1] == ahead
    expected = sum(v.nbytes for v in first.values() if hasattr(v, "nbytes"))
    assert asked == ([expected] if prefetch is None else [])


@pytest.mark.parametrize("loader", ["to_torch", "StatefulLoader"])
def test_a_look_ahead_snapshot_is_freed_by_the_producer_not_in_the_training_step(tmp_path: Path, loader: str) -> None:
    """A best_fit snapshot holds thousands of objects: freeing it in the consumer's next() took 0.1-0.2 ms a step."""
    import weakref

    from arrowstream.pytorch import StatefulLoader

    packed = _ds(tmp_path, epochs=3).pack(seq_len=8, batch_size=2, strategy="best_fit")
    torch_ds = packed.to_torch(prefetch=2)
    freed_in: list[int] = []
    batches = iter(StatefulLoader(torch_ds)) if loader == "StatefulLoader" else iter(torch_ds)
    for _ in range(30):
        next(batches)
        snap = torch_ds._handed  # StatefulLoader's: sealed, to cross from a worker as bytes
        run = (snap.open() if hasattr(snap, "open") else snap).inner.run  # thousands of objects in a real window
        weakref.finalize(run, lambda: freed_in.append(threading.get_ident()))
        del run, snap
    assert len(freed_in) >= 20
    assert threading.get_ident() not in freed_in[:20]  # all freed by the producer thread
