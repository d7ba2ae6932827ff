"""The background producer: order, errors, a clean interpreter exit, and a lower priority than the consumer."""

from __future__ import annotations

import os
import subprocess
import sys
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from arrowstream import ConfigError
from arrowstream.io.niceness import DEFAULT_THREAD_NICE, SPARE_CPUS_ENV, THREAD_NICE_ENV
from arrowstream.io.prefetch import Prefetcher, RefillQueue

from .conftest import write_parts

SCRIPT = """
import sys, arrowstream
from arrowstream.testing.data import sample_tokenizer
ds = arrowstream.read_parquet(sys.argv[1]).tokenize(sample_tokenizer(1024)).pack(seq_len=64, batch_size=2)
iterators = [ds.iter() for _ in range(3)]
for it in iterators:
    next(it)  # leave them alive, their threads mid-stream, and exit
"""


def test_exit_with_live_iterators_does_not_abort(tmp_path: Path) -> None:
    """Regression: a producer thread releasing pyarrow files during finalization aborted Python."""
    from arrowstream.testing.data import make_texts

    write_parts(tmp_path / "d", [{"text": make_texts(400, seed=1)}], row_group_size=50)
    codes = [
        subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "d")], capture_output=True,
                       timeout=120).returncode
        for _ in range(4)
    ]
    assert codes == [0, 0, 0, 0]


def test_items_keep_their_order_and_errors_reach_the_consumer() -> None:
    assert list(Prefetcher(lambda: iter(range(100)), depth=3)) == list(range(100))

    def failing():
        yield 1
        raise ValueError("broken shard")

    p = Prefetcher(failing)
    assert next(p) == 1
    with pytest.raises(ValueError, match="broken shard"):
        next(p)


class _CountingQueue(RefillQueue):
    """Counts the gets that woke a resting producer."""

    wakes = 0

    def get(self, block: bool = True, timeout: float | None = None) -> object:
        resting = self.resting
        item = super().get(block, timeout)
        self.wakes += resting and not self.resting
        return item


def test_a_full_prefetch_queue_wakes_its_producer_once_per_half_queue_taken() -> None:
    q, n = _CountingQueue(8), 200
    seen: list[int] = []

    def produce() -> None:
        for i in range(n):
            q.put(i)
            seen.append(q.qsize())

    thread = threading.Thread(target=produce)
    thread.start()
    time.sleep(0.05)  # the producer fills the queue and rests
    got = []
    for _ in range(n):
        got.append(q.get())
        time.sleep(0.0005)  # a slower consumer: the producer keeps the queue full
    thread.join()
    assert got == list(range(n)) and max(seen) <= 8
    # each wake lets the producer put 4 items (8 // 2 were left): not one wake per item taken
    assert q.wakes <= n // 4 + 1 and q.wakes >= n // 8


def test_a_resting_producer_goes_on_when_the_queue_grows_or_is_emptied() -> None:
    q = RefillQueue(2)
    q.put(0)
    q.put(1)
    with pytest.raises(queue.Full):
        q.put(2, timeout=0.01)
    q.resize(4)  # as Prefetcher.resize: room now, at once
    q.put(2, timeout=0.01)
    assert [q.get_nowait() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(queue.Empty):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)


def test_close_before_use_starts_no_thread() -> None:
    p = Prefetcher(lambda: iter(range(3)))
    p.close()
    assert not p._thread.is_alive() and not p._started


def test_close_from_the_producer_thread_stops_it_without_joining_itself() -> None:
    """Regression: a garbage collection that ran in the producer thread finalized the consumer, whose
    close joined the current thread (RuntimeError, reported as an unraisable exception)."""
    holder: dict[str, Prefetcher[int]] = {}
    taken = threading.Event()
    errors: list[BaseException] = []

    def make():
        yield 1
        taken.wait(10)
        try:
            holder["p"].close()  # what that finalizer does, in this thread
        except RuntimeError as exc:
            errors.append(exc)
        yield 2

    p = Prefetcher(make, depth=1)
    holder["p"] = p
    assert next(p) == 1
    taken.set()
    p._thread.join(timeout=10)
    assert errors == [] and not p._thread.is_alive()
    assert list(p) == []  # closed: nothing more


_GC_CHILD = """
import gc, threading, time
from arrowstream.io.prefetch import Prefetcher, close_all

lock = threading.Lock()

def make():
    yield 1
    with lock:  # the producer's next item needs what the consumer holds
        yield 2

def consume():  # what TorchDataset.__iter__ does around its prefetcher
    ahead = Prefetcher(make, depth=4)
    me = threading.get_ident()
    try:
        for x in ahead:
            yield x
    finally:
        close_all(ahead.close, wait=threading.get_ident() == me)

g = consume()
with lock:
    assert next(g) == 1
    time.sleep(0.2)  # the producer now waits for the lock
    cycle = [g]
    cycle.append(cycle)
    del g, cycle
    gc.collect()  # finalizes the generator here, in the consumer's thread, inside the lock
print("collected")
deadline = time.monotonic() + 20
while any(t.name == "arrowstream-prefetch" for t in threading.enumerate()) and time.monotonic() < deadline:
    time.sleep(0.01)
print("producers left:", sum(t.name == "arrowstream-prefetch" for t in threading.enumerate()))
"""


def test_a_collection_in_the_consumers_thread_inside_a_lock_the_producer_needs_does_not_hang() -> None:
    """Regression: a collection that finalized an abandoned ``to_torch`` iterator while the training thread
    held ``concurrent.futures``' lock (starting a pool's thread) joined the producer, which waited for that
    lock to submit an encoder call: the process hung for good."""
    out = subprocess.run([sys.executable, "-c", _GC_CHILD], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["collected", "producers left: 0"]  # closed after all, in a thread


def test_warnings_of_the_producer_and_pool_threads_name_the_consumers_line() -> None:
    """A warning raised in a library thread is warned again in the consumer's, at the user's line, in order."""
    import sys
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    from arrowstream.core.execute import ordered_map
    from arrowstream.errors import DataLossWarning, warn_user

    def items():
        for i in range(3):
            warn_user(f"item {i}", DataLossWarning)
            yield i

    def square(x: int) -> int:
        warn_user(f"square {x}", DataLossWarning)
        return x * x

    lines = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lines.append(sys._getframe().f_lineno + 1)
        assert list(Prefetcher(items, depth=1)) == [0, 1, 2]
        with ThreadPoolExecutor(2) as pool:
            lines.append(sys._getframe().f_lineno + 1)
            assert list(ordered_map(pool, square, range(3), in_flight=2)) == [0, 1, 4]
        with ThreadPoolExecutor(2) as pool:  # a pool run from a producer thread: its warnings go the same way
            lines.append(sys._getframe().f_lineno + 1)
            assert list(Prefetcher(lambda: ordered_map(pool, square, range(2), in_flight=2))) == [0, 1]
    assert [(str(w.message), w.filename, w.lineno) for w in caught] == [
        *[(f"item {i}", __file__, lines[0]) for i in range(3)],
        *[(f"square {i}", __file__, lines[1]) for i in range(3)],
        *[(f"square {i}", __file__, lines[2]) for i in range(2)],
    ]


def _priority() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
@pytest.mark.parametrize(("setting", "added"), [(None, DEFAULT_THREAD_NICE), ("0", 0), ("11", 11)])
def test_the_producer_thread_runs_nicer_than_the_consumer(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, added: int
) -> None:
    # the training loop's thread, woken for its next batch, should find a CPU free of the loader's threads
    if setting is None:
        monkeypatch.delenv(THREAD_NICE_ENV, raising=False)
    else:
        monkeypatch.setenv(THREAD_NICE_ENV, setting)
    mine = _priority()

    def seen() -> Iterator[tuple[int, int, int]]:
        pool = ThreadPoolExecutor(1)  # a thread the producer starts inherits its niceness
        [inner] = list(Prefetcher(lambda: iter([_priority()])))  # a producer inside a producer: no nicer
        yield _priority(), pool.submit(_priority).result(), inner
        pool.shutdown()

    [(producer, started, inner)] = list(Prefetcher(seen))
    assert producer == started == inner == min(19, mine + added)
    assert _priority() == mine  # the consumer's own is untouched


def _policy() -> int:
    return os.sched_getscheduler(0)  # 0: the calling thread


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_idle_producer_threads_take_sched_idle_and_leave_the_consumer_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ARROWSTREAM_THREAD_NICE=idle: the loader's threads run only where no ordinary thread wants the CPU
    monkeypatch.setenv(THREAD_NICE_ENV, "idle")
    mine, nice = _policy(), _priority()

    def seen() -> Iterator[tuple[int, int, int]]:
        pool = ThreadPoolExecutor(1)  # a thread the producer starts inherits the policy
        [inner] = list(Prefetcher(lambda: iter([_policy()])))
        yield _policy(), pool.submit(_policy).result(), inner
        pool.shutdown()

    assert mine != os.SCHED_IDLE
    assert list(Prefetcher(seen)) == [(os.SCHED_IDLE,) * 3]
    assert (_policy(), _priority()) == (mine, nice)  # the consumer's own are untouched
    # a text pipeline's encoder pool, started by the consumer's own thread (no prefetch thread)
    from arrowstream import read_parquet
    from arrowstream.testing.data import make_texts, sample_tokenizer

    write_parts(tmp_path, [{"text": make_texts(20, seed=1)}])
    it = read_parquet(tmp_path).tokenize(sample_tokenizer(), num_inflight=2).pack(seq_len=32, batch_size=2).iter()
    next(it)
    assert it._pool is not None and it._pool.submit(_policy).result() == os.SCHED_IDLE
    assert _policy() == mine
    it.close()


def _cpus() -> frozenset[int]:
    return frozenset(os.sched_getaffinity(0))  # 0: the calling thread


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="per-thread CPU sets are Linux's")
@pytest.mark.parametrize("spare", ["1", "64"])
def test_the_producer_threads_leave_spare_cpus_to_the_consumer(monkeypatch: pytest.MonkeyPatch, spare: str) -> None:
    # the training loop's thread should always find a CPU the loader's threads never run on
    monkeypatch.setenv(SPARE_CPUS_ENV, spare)
    mine = _cpus()
    allowed = sorted(mine)
    expected = frozenset(allowed[min(int(spare), len(allowed) - 1):])  # never none: the last one at least

    def seen() -> Iterator[tuple[frozenset[int], frozenset[int], frozenset[int]]]:
        pool = ThreadPoolExecutor(1)  # a thread the producer starts inherits its CPUs
        [inner] = list(Prefetcher(lambda: iter([_cpus()])))  # a producer inside a producer: the same set
        yield _cpus(), pool.submit(_cpus).result(), inner
        pool.shutdown()

    [(producer, started, inner)] = list(Prefetcher(seen))
    assert producer == started == inner == expected
    assert len(allowed) < 2 or min(allowed) not in producer
    assert _cpus() == mine  # the consumer's own are untouched


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="per-thread CPU sets are Linux's")
def test_no_spare_cpus_by_default_and_a_bad_count_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SPARE_CPUS_ENV, raising=False)
    mine = _cpus()
    assert list(Prefetcher(lambda: iter([_cpus()]))) == [mine]
    monkeypatch.setenv(SPARE_CPUS_ENV, "-1")
    with pytest.raises(ConfigError, match=r"ARROWSTREAM_SPARE_CPUS='-1': expected a whole number of CPUs"):
        Prefetcher(lambda: iter([1]))


class _Placements:
    """A torch dataset whose worker reports its main thread's and its producer thread's niceness and CPUs."""

    def __iter__(self) -> Iterator[tuple[int, list[int], int, list[int]]]:
        [(nice, cpus)] = list(Prefetcher(lambda: iter([(_priority(), sorted(_cpus()))])))
        yield _priority(), sorted(_cpus()), nice, cpus


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="per-thread CPU sets are Linux's")
def test_a_dataloader_workers_producer_takes_its_placement_from_the_inherited_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # workers inherit the variables and place their producers against their own main thread
    torch_data = pytest.importorskip("torch.utils.data")
    monkeypatch.setenv(THREAD_NICE_ENV, "3")
    monkeypatch.setenv(SPARE_CPUS_ENV, "1")
    dataset = type("Placements", (_Placements, torch_data.IterableDataset), {})()
    loader = torch_data.DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context="fork")
    [(main_nice, main_cpus, nice, cpus)] = list(loader)
    assert nice == min(19, int(main_nice) + 3)
    assert cpus == main_cpus[min(1, len(main_cpus) - 1):]


def test_a_niceness_outside_0_to_19_is_refused_in_the_consumers_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THREAD_NICE_ENV, "-5")
    with pytest.raises(ConfigError, match=r"ARROWSTREAM_THREAD_NICE='-5': expected an integer from 0"):
        Prefetcher(lambda: iter([1]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_a_text_pipelines_encoder_threads_run_nicer_though_the_consumer_starts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `ds.iter()` over text runs no prefetch thread: the thread that iterates starts the encoder's pool itself
    from arrowstream import read_parquet
    from arrowstream.testing.data import make_texts, sample_tokenizer

    monkeypatch.setenv(THREAD_NICE_ENV, "4")
    monkeypatch.setenv(SPARE_CPUS_ENV, "1")
    write_parts(tmp_path, [{"text": make_texts(20, seed=1)}])
    it = read_parquet(tmp_path).tokenize(sample_tokenizer(), num_inflight=2).pack(seq_len=32, batch_size=2).iter()
    next(it)
    assert it._pool is not None and it._pool.submit(_priority).result() == min(19, _priority() + 4)
    allowed = sorted(_cpus())
    assert it._pool.submit(_cpus).result() == frozenset(allowed[min(1, len(allowed) - 1):])
    monkeypatch.setenv(THREAD_NICE_ENV, "x")
    with pytest.raises(ConfigError, match="ARROWSTREAM_THREAD_NICE='x'"):
        read_parquet(tmp_path).tokenize(sample_tokenizer(), num_inflight=2).pack(seq_len=32, batch_size=2).iter()


class _Freed:
    """Records which thread drops its last reference."""

    def __init__(self, log: list[int]) -> None:
        self.log = log

    def __del__(self) -> None:
        self.log.append(threading.get_ident())


def test_what_the_consumer_discards_is_freed_in_the_producers_thread() -> None:
    freed: list[int] = []
    producer: list[int] = []

    def items() -> Iterator[int]:
        producer.append(threading.get_ident())
        yield from range(50)

    p = Prefetcher(items, depth=2)
    for k, _ in enumerate(p):
        if k < 40:  # the stream goes on past each: the producer drops them after its next item, the newest waiting
            p.discard(_Freed(freed))
    assert len(freed) >= 39 and set(freed[:39]) == {producer[0]} != {threading.get_ident()}
