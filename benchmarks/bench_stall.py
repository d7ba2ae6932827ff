#!/usr/bin/env python
"""Does the GPU ever wait? A consumer that behaves like a training step, against the loader.

The consumer pulls batches from ``ds.to_torch()`` through a ``DataLoader``
(``batch_size=None``, ``num_workers`` 0, 1 and 2, ``pin_memory`` when an
accelerator is present; ``--loader stateful``: through
``arrowstream.pytorch.StatefulLoader``, which without workers opens the
``DataLoader``'s profiler range only while a profiler records) and holds
each batch for a fixed step time while releasing the GIL (``time.sleep``),
as a step that runs on a GPU does. It records the time spent inside
``next()``: the time the GPU would have waited.

For each worker count, the loader's own rate is measured first (batches/s
with no step time, after ``--warmup`` batches), then the consumer runs with a
step time giving the loader ``--headroom`` times that rate (1.25: the loader
is 25 % faster than the step). Reported per run, after the warm-up batches:
the share of wall time spent waiting, the part of it the consumer's thread
spent runnable but without a CPU (where Linux reports it: other threads held
every core), the p50/p99 wait per step, the longest wait (its step in each
run's JSON) and the part of the share waited in the longest 1 % of steps
(a few long waits, or many short ones). The
first batch is start-up, not a stall, and is reported apart. Medians of
``--repeats`` runs; every run is a fresh loader.

Beside each run, the same consumer at the same step time pulls from a
dataset that has its batches ready (one real batch handed over again and
again, the way ``to_torch`` hands batches over from a worker with the same
``--sharing``): the wait that the DataLoader and the handover cost by
themselves, which no loader behind them can remove. With ``--beside``, also
the same ready batches while another process makes the loader's batches at
the consumer's pace: the floor on a machine whose cores, caches and memory
do the loader's work, without this process's interpreter lock or queues.

Also reported at each step time: how long the profiler range that every
``DataLoader.__next__`` opens (``torch.autograd.profiler.record_function``,
a torch operator) takes right after sleeping the step, and back to back,
with nothing else running: what a CPU that comes back cold from the step
adds to every ``next()``, whatever the loader. ``--cpu-latency-us 0`` runs
with a request held on ``/dev/cpu_dma_latency`` (Linux PM QoS, needs write
access to it) that keeps idle CPUs from entering any sleep state with an
exit latency: the same runs on CPUs that do not go cold while the step sleeps.

Usage::

    python benchmarks/bench_stall.py                   # 85 MB corpus, concat 8 x 2048
    python benchmarks/bench_stall.py --strategy best_fit --prefetch 0   # best_fit, batches made when asked for
    python benchmarks/bench_stall.py --step-ms 5,20,100   # your own step times instead of the headroom
    python benchmarks/bench_stall.py --thread-nice 0,5 --workers 0   # producer threads as nice as the step, and 5 nicer
    python benchmarks/bench_stall.py --spare-cpus 0,1 --workers 0   # producer threads on every CPU, and all but one
    python benchmarks/bench_stall.py --collate none   # batches handed over as they are (StatefulLoader's way)
    python benchmarks/bench_stall.py --loader stateful   # through StatefulLoader (no profiler range without workers)
    python benchmarks/bench_stall.py --cpu-latency-us default,0   # idle CPUs as the machine has them, and kept awake
    python benchmarks/bench_stall.py --smoke           # seconds: runs once, checks only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import struct
import sys
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import numpy as np
from arrowstream.io.niceness import SPARE_CPUS_ENV, THREAD_NICE_ENV
from harness import CheckFailed, Checks, add_corpus_options, corpus_and_tokenizer, fmt_table, log, machine_facts, median


def _packed(ds: Any, args: argparse.Namespace) -> Any:
    """Pack or bucket ``ds`` as ``--strategy`` says (``bucket``: a token budget of ``batch_size x seq_len``)."""
    if args.strategy == "bucket":
        return ds.bucket(max_tokens=args.batch_size * args.seq_len, max_len=args.seq_len, long_docs="truncate")
    return ds.pack(seq_len=args.seq_len, batch_size=args.batch_size, strategy=args.strategy)


def _loader(args: argparse.Namespace, workers: int) -> Any:
    import torch
    from torch.utils.data import DataLoader

    from arrowstream import read_parquet

    ds = _packed(read_parquet(args.corpus).tokenize(args.tokenizer), args)
    pin = torch.cuda.is_available()
    options: dict[str, Any] = {"batch_size": None, "num_workers": workers, "pin_memory": pin, **_collate(args)}
    if workers:
        options["prefetch_factor"] = args.prefetch_factor
        options["persistent_workers"] = False
    sharing = {} if args.sharing is None else {"sharing": args.sharing}
    if args.loader == "stateful":
        from arrowstream.pytorch import StatefulLoader

        options.pop("batch_size")
        return StatefulLoader(ds.to_torch(prefetch=args.prefetch, **sharing), **options)
    return DataLoader(ds.to_torch(prefetch=args.prefetch, **sharing), **options)


def _collate(args: argparse.Namespace) -> dict[str, Any]:
    """The DataLoader's ``collate_fn`` as ``--collate`` says: torch's default (``default_convert``) or none."""
    if args.collate == "none":
        from arrowstream.pytorch import no_collate

        return {"collate_fn": no_collate}
    return {}


def _ready_loader(args: argparse.Namespace, workers: int) -> Any:
    """A DataLoader whose batches are ready: one real batch, handed over again and again as ``to_torch`` hands batches over."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    from arrowstream import read_parquet
    from arrowstream.handover import by_value_limit, handed, one_storage, use_sharing
    from arrowstream.pytorch import TorchDataset

    if not hasattr(args, "ready_batch"):
        it = _packed(read_parquet(args.corpus).tokenize(args.tokenizer), args).iter()
        args.ready_batch = next(it)
        it.close()
    arrays = {k: v for k, v in args.ready_batch.items() if isinstance(v, np.ndarray)}
    counts = {k: v for k, v in args.ready_batch.items() if not isinstance(v, np.ndarray)}

    sharing = args.sharing if args.sharing is not None else _default_sharing(TorchDataset)

    class Ready(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            in_worker = get_worker_info() is not None
            if in_worker:
                use_sharing(sharing)
                limit = by_value_limit(sharing, sys._getframe())
            while True:
                if in_worker:
                    yield handed({**counts, **one_storage(arrays)}, sharing=sharing, pipe_at_most=limit)
                else:
                    yield {**counts, **{k: torch.from_numpy(v) for k, v in arrays.items()}}

    options: dict[str, Any] = {"batch_size": None, "num_workers": workers, **_collate(args)}
    if workers:
        options["prefetch_factor"] = args.prefetch_factor
    if args.loader == "stateful" and not workers:  # as StatefulLoader takes batches without workers
        from arrowstream.single_process import single_process_batches

        return single_process_batches(DataLoader(Ready(), **options))
    return DataLoader(Ready(), **options)


def _default_sharing(cls: Any) -> str:
    """The ``sharing`` that ``to_torch()`` takes by default."""
    import inspect

    return inspect.signature(cls).parameters["sharing"].default


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """Run with the environment variable ``name=value`` (``""``: as the environment has it); workers inherit it."""
    before = os.environ.get(name)
    if value:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


CPU_LATENCY = "/dev/cpu_dma_latency"


@contextlib.contextmanager
def _cpu_latency(value: str) -> Iterator[int | None]:
    """Hold a Linux PM QoS request of ``value`` microseconds on ``/dev/cpu_dma_latency`` (``""``: none).

    While the file stays open no CPU of the machine enters an idle state
    whose exit latency exceeds ``value`` (0: idle CPUs poll instead of
    halting). Whole-machine, so DataLoader workers run under it too. Yields
    the latency in force (the device read back), ``None`` where unreadable.
    """
    if not value:
        yield _latency_in_force()
        return
    try:
        fd = os.open(CPU_LATENCY, os.O_WRONLY)
    except OSError as exc:
        raise SystemExit(f"--cpu-latency-us {value} needs write access to {CPU_LATENCY} ({exc}); "
                         "run as root, or leave the option out") from exc
    try:
        os.write(fd, struct.pack("i", int(value)))
        yield _latency_in_force()
    finally:
        os.close(fd)


def _latency_in_force() -> int | None:
    """The machine's PM QoS CPU latency target now, in microseconds (``None``: no such device, or not readable)."""
    try:
        with open(CPU_LATENCY, "rb") as f:
            return int(struct.unpack("i", f.read(4))[0])
    except (OSError, struct.error):
        return None


def _rate(args: argparse.Namespace, workers: int) -> float:
    """Batches per second the loader gives a consumer that never waits (after the warm-up)."""
    it = iter(_loader(args, workers))
    for _ in range(args.warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(args.batches):
        next(it)
    rate = args.batches / (time.perf_counter() - start)
    del it
    return rate


def _cpu_wait_clock() -> Any:
    """A clock of the seconds this thread has spent runnable but off a CPU (Linux schedstat), or ``None``."""
    import threading

    path = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat")
    if not path.is_file():
        return None
    return lambda: int(path.read_text().split()[1]) / 1e9


def _neighbour(args: argparse.Namespace, step_s: float, stop: Any, started: Any) -> None:
    """Make the loader's batches in this process, one per ``step_s``, until ``stop`` is set (the work beside a ready consumer)."""
    from arrowstream import read_parquet

    it = None
    due = time.perf_counter()
    while not stop.is_set():
        if it is None:
            it = _packed(read_parquet(args.corpus).tokenize(args.tokenizer), args).iter()
        try:
            next(it)
        except StopIteration:
            it = None
            continue
        started.set()
        due += step_s
        time.sleep(max(0.0, due - time.perf_counter()))


def _beside(args: argparse.Namespace, step_s: float) -> Any:
    """Start :func:`_neighbour` in a fresh process; return a function that stops it."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    stop, started = ctx.Event(), ctx.Event()
    plain = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "ready_batch"})
    proc = ctx.Process(target=_neighbour, args=(plain, step_s, stop, started), daemon=True)
    proc.start()
    started.wait(timeout=120)

    def halt() -> None:
        stop.set()
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()

    return halt


def _consume(
    args: argparse.Namespace, workers: int, step_s: float, *, ready: bool = False, beside: bool = False
) -> dict[str, Any]:
    """Run the consumer with ``step_s`` per step (``ready``: against batches made in advance); return its waits.

    Beside the wait inside ``next()``, the part of it this thread spent
    runnable but without a CPU (the machine's other threads, the encoder's
    among them, held both cores), where the kernel reports it: the rest is
    waiting for the batch or for the interpreter lock. ``beside``: while
    another process makes the loader's batches at the consumer's pace
    (:func:`_neighbour`): the same work on the machine's cores and memory,
    without this process's interpreter lock or queues.
    """
    halt = _beside(args, step_s) if beside else None
    try:
        return _consume_once(args, workers, step_s, ready=ready)
    finally:
        if halt is not None:
            halt()


def _cold_range_us(step_s: float, samples: int = 200) -> tuple[float, float]:
    """Return the median microseconds of the profiler range every ``DataLoader.__next__`` opens, after sleeping ``step_s`` and back to back.

    Nothing else runs meanwhile: what the range costs more after a step is
    the CPU coming back cold (caches, and a virtual CPU halted while idle).
    """
    import torch

    def once() -> float:
        a = time.perf_counter()
        with torch.autograd.profiler.record_function("probe"):
            pass
        return time.perf_counter() - a

    cold, warm = [], []
    for _ in range(samples):
        time.sleep(step_s)
        cold.append(once())
        warm.append(once())  # right after: warm
    return float(np.median(cold) * 1e6), float(np.median(warm) * 1e6)


def _consume_once(args: argparse.Namespace, workers: int, step_s: float, *, ready: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    it = iter((_ready_loader if ready else _loader)(args, workers))
    next(it)
    first = time.perf_counter() - t0
    for _ in range(args.warmup - 1):
        next(it)
        time.sleep(step_s)
    waits, off_cpu = np.empty(args.batches), np.zeros(args.batches)
    cpu_wait = _cpu_wait_clock()
    start = time.perf_counter()
    for i in range(args.batches):
        before = cpu_wait() if cpu_wait else 0.0
        a = time.perf_counter()
        next(it)
        waits[i] = time.perf_counter() - a
        if cpu_wait:
            off_cpu[i] = cpu_wait() - before
        time.sleep(step_s)  # the step: the GIL is released, as while a GPU computes
    wall = time.perf_counter() - start
    del it
    longest = np.sort(waits)[-max(1, -(-args.batches // 100)) :]  # the longest 1 % of the steps' waits
    return {
        "first_batch_s": first,
        "wait_share": float(waits.sum() / wall),
        "cpu_wait_share": float(off_cpu.sum() / wall) if cpu_wait else float("nan"),
        "p50_ms": float(np.percentile(waits, 50) * 1e3),
        "p99_ms": float(np.percentile(waits, 99) * 1e3),
        "max_ms": float(waits.max() * 1e3),
        "longest_share": float(longest.sum() / wall),
        "longest_step": int(waits.argmax()),
        "step_ms": step_s * 1e3,
    }


def _latency_value(text: str) -> str:
    """``--cpu-latency-us``'s ``text`` as held (``""``: the machine's default); a clear exit if not an integer."""
    text = text.strip()
    if text in ("", "default"):
        return ""
    if not text.isdigit():
        raise SystemExit(f"--cpu-latency-us takes 'default' or microseconds (an integer >= 0), got {text!r}")
    return text


def _measure(
    args: argparse.Namespace, k: int, spare: str, plan: list[tuple[str, Any]], nices: list[str], latencies: list[str],
    results: dict[str, Any],
) -> list[list[Any]]:
    """Measure ``k`` workers' rate, then the consumer at each setting of ``plan``: the table's rows (runs into ``results``)."""
    variants = [(n, lat) for lat in latencies for n in nices]
    rows = []
    rates = [_rate(args, k) for _ in range(args.repeats)]
    rate = median(rates)
    who = f"workers={k}" + (f", spare cpus={spare}" if spare else "")
    log(f"{who}: {rate:.0f} batches/s ({rate * args.batch_size * args.seq_len / 1e6:.2f} M token slots/s)")
    for setting, step_of in plan:
        step = step_of(rate)
        h = step * rate
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {v: [] for v in variants}
        floors: dict[str, list[dict[str, Any]]] = {lat: [] for lat in latencies}
        besides: dict[str, list[dict[str, Any]]] = {lat: [] for lat in latencies}
        for _ in range(args.repeats):  # alternated, so all see the same machine
            for lat in latencies:
                with _cpu_latency(lat):
                    for n in nices:
                        with _env(THREAD_NICE_ENV, n):
                            runs[n, lat].append(_consume(args, k, step))
                    floors[lat].append(_consume(args, k, step, ready=True))
                    if args.beside:
                        besides[lat].append(_consume(args, k, step, ready=True, beside=True))
        colds, in_force = {}, {}
        for lat in latencies:
            with _cpu_latency(lat) as in_force[lat]:
                colds[lat] = _cold_range_us(step)
        for n, lat in variants:
            floor = {key: median([r[key] for r in floors[lat]]) for key in floors[lat][0]}
            cold_us, warm_us = colds[lat]
            summary = {key: median([r[key] for r in runs[n, lat]]) for key in runs[n, lat][0] if key != "longest_step"}
            name = (f"{who}, {setting}" + (f", nice={n}" if n else "")
                    + (f", cpu latency={lat} us" if lat else ""))
            results["runs"][name] = {
                "rate": rate, "rates": rates, "runs": runs[n, lat], **summary,
                "ready": {"runs": floors[lat], **floor},
                "profiler_range_us": {"after_step": cold_us, "back_to_back": warm_us},
                "cpu_latency_in_force_us": in_force[lat],
            }
            row = [k, spare or "default", n or "default", f"{lat} us" if lat else "default", f"{rate:.0f}", f"{h:.3g}", f"{step * 1e3:.2f}",
                   f"{100 * summary['wait_share']:.1f}", f"{100 * summary['cpu_wait_share']:.1f}",
                   f"{summary['p50_ms']:.2f}", f"{summary['p99_ms']:.2f}", f"{summary['first_batch_s']:.2f}",
                   f"{100 * floor['wait_share']:.1f}", f"{floor['p50_ms']:.2f}", f"{cold_us:.0f} ({warm_us:.0f})"]
            if args.beside:
                near = {key: median([r[key] for r in besides[lat]]) for key in besides[lat][0]}
                results["runs"][name]["ready_beside"] = {"runs": besides[lat], **near}
                row += [f"{100 * near['wait_share']:.1f}", f"{near['p50_ms']:.2f}"]
            rows.append(row)
            log(f"  headroom {h:.3g}{f', nice {n}' if n else ''}{f', cpu latency {lat} us' if lat else ''}: step {step * 1e3:.2f} ms, waited "
                f"{100 * summary['wait_share']:.1f} % of wall time "
                f"({100 * summary['cpu_wait_share']:.1f} points of it runnable without a CPU), "
                f"p50 {summary['p50_ms']:.2f} ms, p99 {summary['p99_ms']:.2f} ms, longest {summary['max_ms']:.1f} ms "
                f"({100 * summary['longest_share']:.1f} points in the longest 1 % of steps); batches ready: waited "
                f"{100 * floor['wait_share']:.1f} %, p50 {floor['p50_ms']:.2f} ms; the DataLoader's profiler range "
                f"after a step {cold_us:.0f} us, back to back {warm_us:.0f} us")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_corpus_options(p)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--strategy", default="concat", choices=["concat", "best_fit", "bucket"])
    p.add_argument("--workers", default="0,1,2", help="comma-separated DataLoader worker counts")
    p.add_argument("--headroom", default="1.25,2", help="comma-separated: loader rate / consumer rate")
    p.add_argument("--step-ms", default=None,
                   help="comma-separated fixed step times in ms (your training step's), instead of --headroom")
    p.add_argument("--batches", type=int, default=300, help="batches measured per run (after the warm-up)")
    p.add_argument("--warmup", type=int, default=20, help="batches before measuring")
    p.add_argument("--prefetch-factor", type=int, default=2, help="DataLoader prefetch_factor with workers")
    p.add_argument("--prefetch", type=int, default=None,
                   help="to_torch(prefetch=...): batches made ahead in a thread [the library's default: up to 16, within 64 MiB]")
    p.add_argument("--sharing", default=None, choices=["auto", "pipe", "file_system", "file_descriptor"],
                   help="to_torch(sharing=...): how workers hand batches over [the library's default: in slots]")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--loader", default="dataloader", choices=["dataloader", "stateful"],
        help="what the consumer iterates: a torch DataLoader over ds.to_torch() [default], or "
             "arrowstream.pytorch.StatefulLoader (batches handed over as they are, so --collate none)",
    )
    p.add_argument(
        "--collate", default="default", choices=["default", "none"],
        help="the DataLoaders' collate_fn: torch's default_convert, or arrowstream.pytorch.no_collate "
             "(batches handed over as they are, as StatefulLoader does) [default]",
    )
    p.add_argument(
        "--thread-nice", default=None,
        help="comma-separated ARROWSTREAM_THREAD_NICE values, each run in turn at the same step "
             "(e.g. 0,5,idle: producer threads at the consumer's priority, 5 steps nicer, and in Linux's "
             "SCHED_IDLE policy) [the library's default]",
    )
    p.add_argument(
        "--spare-cpus", default=None,
        help="comma-separated ARROWSTREAM_SPARE_CPUS values, each with its own loader rate and step time "
             "(e.g. 0,1: producer threads on every CPU, and on all but the first) [the library's default: 0]",
    )
    p.add_argument(
        "--cpu-latency-us", default=None,
        help="comma-separated: 'default' (idle CPUs as the machine has them) or microseconds held on "
             "/dev/cpu_dma_latency during the runs (0: idle CPUs never halt; needs write access), each run in turn",
    )
    p.add_argument(
        "--switch-interval", type=float, default=None,
        help="sys.setswitchinterval(seconds) before the runs (default: Python's, 0.005)",
    )
    p.add_argument(
        "--beside", action="store_true",
        help="also the ready batches while another process makes the loader's batches at the consumer's pace",
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes: run the checks in seconds")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if args.loader == "stateful":
        args.collate = "none"  # StatefulLoader's own
    if args.smoke:
        args.mb, args.vocab, args.batches, args.warmup, args.repeats = 2, 2000, 20, 3, 1
        args.seq_len, args.workers, args.headroom = 256, "0,1", "2"
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    args.corpus, args.tokenizer = corpus_and_tokenizer(args)
    workers = [int(w) for w in args.workers.split(",")]
    nices = [n.strip() for n in args.thread_nice.split(",")] if args.thread_nice else [""]
    spares = [c.strip() for c in args.spare_cpus.split(",")] if args.spare_cpus else [""]
    latencies = [_latency_value(v) for v in args.cpu_latency_us.split(",")] if args.cpu_latency_us else [""]
    headrooms = [float(h) for h in args.headroom.split(",")]
    fixed = [float(ms) for ms in args.step_ms.split(",")] if args.step_ms else []
    # each setting's name and its step time from the loader's rate
    plan = [(f"step={ms:g} ms", lambda rate, ms=ms: ms / 1e3) for ms in fixed] or [
        (f"headroom={h}", lambda rate, h=h: h / rate) for h in headrooms
    ]
    results: dict[str, Any] = {"machine": machine_facts(), "args": vars(args), "runs": {}}
    rows = []
    for k, spare in [(k, c) for k in workers for c in spares]:
        with _env(SPARE_CPUS_ENV, spare):  # the producers' CPUs set the loader's rate, so each its own step
            rows += _measure(args, k, spare, plan, nices, latencies, results)
    log()
    header = ["workers", "spare cpus", "thread nice", "cpu latency", "loader batches/s", "headroom", "step ms", "wait % of wall", "of it off a CPU %", "p50 wait ms",
              "p99 wait ms", "first batch s", "ready: wait %", "ready: p50 ms", "profiler range after a step us (back to back)"]
    if args.beside:
        header += ["ready beside the work: wait %", "p50 ms"]
    log(fmt_table(header, rows))
    for setting, _ in plan:  # the question asked: with the best worker count (and CPUs), how much does the step wait?
        best = min((run["wait_share"], name) for name, run in results["runs"].items() if f", {setting}" in name)
        key = setting.split("=", 1)[1] if not fixed else setting
        results.setdefault("best", {})[key] = {"run": best[1], "wait_share": best[0]}
        at = f"{key}x headroom" if not fixed else f"a {setting.split('=', 1)[1]} step"
        log(f"best configuration at {at}: {best[1].split(f', {setting}')[0]}, waited {100 * best[0]:.1f} % of wall time")
    from arrowstream.pytorch import TorchDataset

    sharing = args.sharing or f"{_default_sharing(TorchDataset)} (the default)"
    log(f"({args.strategy} {args.batch_size} x {args.seq_len}, {args.loader}, sharing {sharing}, collate {args.collate}, medians of {args.repeats}; waits over "
        f"{args.batches} steps after {args.warmup} warm-up batches)")
    checks = Checks()
    try:
        for name, run in results["runs"].items():
            checks(0.0 <= run["wait_share"] < 1.0, f"{name}: a wait share was measured", f"{run['wait_share']:.3f}")
            ready = run["ready"]["wait_share"]
            checks(0.0 <= ready < 1.0, f"{name}: a wait share was measured with batches ready", f"{ready:.3f}")
            if args.beside:
                near = run["ready_beside"]["wait_share"]
                checks(0.0 <= near < 1.0, f"{name}: a wait share was measured beside the work", f"{near:.3f}")
    except CheckFailed:
        return 1
    finally:
        results["checks"] = checks.items
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
