"""A smoke-size run of the benchmark script, so it cannot rot unnoticed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench(tmp_path: Path, script: str, *args: str, workdir: bool = True, timeout: int = 600) -> tuple[Any, str]:
    """Run ``benchmarks/<script>`` with ``args`` (and ``--workdir``, ``--json``); return its JSON report and stdout.

    Fails with the end of its output when the script exits non-zero (a failed check does).
    """
    out = tmp_path / f"{Path(script).stem}.json"
    command = [sys.executable, str(ROOT / "benchmarks" / script), *args, "--json", str(out)]
    if workdir:
        command += ["--workdir", str(tmp_path / "work")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_core_benchmark_smoke_run_passes_its_correctness_checks(tmp_path: Path) -> None:
    result, stdout = _bench(tmp_path, "bench_core.py", "--smoke")
    assert "correctness checks" in stdout
    assert result  # the JSON report was written


def test_shuffle_benchmark_runs_and_beats_shard_order(tmp_path: Path) -> None:
    report, _ = _bench(tmp_path, "bench_shuffle.py", "--files", "4", "--groups", "4", "--rows", "200", "--window", "4",
                       "--run", "400", "--epochs", "2", workdir=False, timeout=300)
    results = report["results"]
    ours = results["arrowstream .shuffle(window=4, fragments=2)"]
    assert ours["source_imbalance"] < results["shard-order shuffle"]["source_imbalance"]
    assert abs(ours["position_correlation"]) < 0.2


def test_packing_benchmark_smoke_run_passes_its_checks(tmp_path: Path) -> None:
    results = _bench(tmp_path, "bench_packing.py", "--smoke")[0]["results"]
    best, concat = results["best_fit window=1024 (default)"], results["concat"]
    assert best["cut_per_100_docs"] < concat["cut_per_100_docs"]


def test_analysis_benchmark_smoke_run_passes_its_checks(tmp_path: Path) -> None:
    result, _ = _bench(tmp_path, "bench_analysis.py", "--smoke")
    assert result["chars"]["wall_s"] > 0 and result["tokens"]["ratio"] > 0


def test_peers_benchmark_smoke_run_passes_its_checks(tmp_path: Path) -> None:
    # the other peers with one encoder here (the code their encoder calls is datasets', which runs both)
    result, _ = _bench(tmp_path, "bench_peers.py", "--smoke", "--peer-encoders", "tiktoken",
                       "--markdown", str(tmp_path / "peers.md"), timeout=900)
    table = result["table"]
    assert set(table) >= {"raw tokenizers", "raw tiktoken-joined", "arrowstream concat, tokenizers, workers=0",
                          "arrowstream concat, tiktoken, workers=0", "datasets, tokenizers, workers=0",
                          "datasets, tiktoken, workers=0"}
    # like for like: each pipeline against the raw speed of its own encoder
    assert table["arrowstream concat, tiktoken, workers=0"]["raw_reference"].startswith("raw tiktoken")
    assert table["arrowstream concat, tokenizers, workers=0"]["raw_reference"] == "raw tokenizers"
    assert table["arrowstream concat, tiktoken, workers=0"]["tokens"] == result["expected_tokens"]
    assert result["resume"]["50%"]["arrowstream"] > 0
    assert result["machine"]["bytecode"]["compiled"]  # no child timed Python compiling arrowstream
    assert all(t["tree_pss_mb"] > 0 for t in table.values())
    assert table["arrowstream concat, tiktoken, workers=2"]["working_mb"] is not None
    assert any("exactly the raw encoders' stream" in c["name"] for c in result["checks"])
    # the default with the fast extra: tokie, against raw tokie, and checked like the other backends
    assert table["arrowstream concat, tokie, workers=0"]["raw_reference"] == "raw tokie"
    assert table["arrowstream concat, tokie, workers=0"]["tokens"] == result["expected_tokens"]
    tokie_checks = [c for c in result["checks"] if c["name"].startswith("arrowstream concat, tokie, workers=0:")]
    assert any("expected backend" in c["name"] for c in tokie_checks) and all(c["passed"] for c in tokie_checks)
    assert {e["peer"] for e in result["versus_default_tokie"]} == {e["peer"] for e in result["versus"]}
    markdown = (tmp_path / "peers.md").read_text()
    assert "| arrowstream concat, tiktoken, workers=0 |" in markdown and "| arrowstream |" in markdown
    # the peers beside datasets: StatefulDataLoader over the same dataset, and Grain on the same recipe
    peers = {f"{peer}, {encoder}, workers={w}" for peer in ("torchdata StatefulDataLoader + datasets", "grain")
             for encoder in ("tiktoken",) for w in (0, 2)}
    assert not any(name.startswith("grain, tokenizers") for name in table)  # --peer-encoders
    assert peers <= set(table)
    assert all(table[name]["vs_datasets_same_encoder"] > 0 and table[name]["working_mb"] is not None for name in peers)
    for name in peers:
        checked = [c for c in result["checks"] if c["name"].startswith(name + ":")]
        assert len(checked) == 2 and all(c["passed"] for c in checked), checked
    assert {v["peer"] for v in result["versus"]} >= peers
    assert {"torchdata StatefulDataLoader + datasets state_dict", "grain set_state"} <= set(result["resume"]["50%"])
    # memory: the largest peak over the rounds decides; the median round's is shown beside it (one round here)
    assert all(e["working_mb_median"] == e["working_mb"] for e in result["versus"])
    assert "above idle MB, median round" in markdown
    assert "| grain, tiktoken, workers=2 |" in markdown and "| grain set_state |" in markdown


def test_encoders_benchmark_smoke_run_passes_its_checks(tmp_path: Path) -> None:
    result, _ = _bench(tmp_path, "bench_encoders.py", "--smoke", timeout=900)
    assert result


def test_text_path_benchmark_smoke_run_passes_its_checks(tmp_path: Path) -> None:
    result, stdout = _bench(tmp_path, "bench_text_path.py", "--smoke", timeout=300)
    assert "pipeline / raw encoder:" in stdout
    assert all(c["passed"] for c in result["checks"]) and len(result["checks"]) == 2
    assert result["rates"]["pipeline"] > 0 and result["rates"]["raw"] > 0


def test_cache_benchmark_smoke_run_passes_its_check(tmp_path: Path) -> None:
    result, _ = _bench(tmp_path, "bench_cache.py", "--smoke")
    assert result["ratio_vs_raw"] > 0


def test_transfer_benchmark_smoke_run_passes_its_checks(tmp_path: Path) -> None:
    result, _ = _bench(tmp_path, "bench_transfer.py", "--smoke", workdir=False, timeout=300)
    hows = {"one storage, in slots", "one storage, through the pipe", "one storage, by name", "one storage, by descriptor",
            "tensor per array"}
    assert result["checks_passed"] and set(result["us_per_batch"]) == hows and result["busy"]


def test_versions_benchmark_smoke_run_compares_a_checkout_with_itself(tmp_path: Path) -> None:
    report, _ = _bench(tmp_path, "bench_versions.py", "--smoke", "--before", str(ROOT))
    assert {"text tok_per_s", "cache tok_per_s", "resume resume_s"} <= set(report)
    assert all(report[k]["ratio"] > 0 for k in ("text tok_per_s", "cache tok_per_s"))


def test_balance_benchmark_smoke_run_counts_without_dropping(tmp_path: Path) -> None:
    result, _ = _bench(tmp_path, "bench_balance.py", "--smoke", "--ranks", "3", "--workers", "2")
    assert result["counted"]["dropped_tokens"] == 0 and result["indexed"]["dropped_tokens"] == 0
    assert all(c["passed"] for c in result["checks"]) and result["index_s"] > 0


def test_mixed_balance_benchmark_smoke_run_carries_and_counts(tmp_path: Path) -> None:
    result, _ = _bench(tmp_path, "bench_balance_mixed.py", "--smoke", "--ranks", "2", "--workers", "2")
    assert all(c["passed"] for c in result["checks"])
    assert result["results"]["one epoch, counted (length index)"]["dropped_tokens"] == 0
    assert result["results"]["two shuffled epochs, estimated, even_batches=True"]["carried_tokens"] > 0


def test_mixture_benchmark_smoke_run_passes_its_checks(tmp_path: Path) -> None:
    result, _ = _bench(tmp_path, "bench_mixture.py", "--smoke", "--modes", "ids")
    assert result["ids"]["ratio"] > 0 and result["ids"]["steady_ratio"] > 0
    assert all(c["passed"] for c in result["checks"])


def test_storage_benchmark_smoke_run_passes_its_checks(tmp_path: Path) -> None:
    results, _ = _bench(tmp_path, "bench_storage.py", "--smoke", workdir=False, timeout=300)
    assert all(c["passed"] for c in results["checks"]) and len(results["checks"]) == 6


def test_spawn_benchmark_smoke_run_passes_its_checks(tmp_path: Path) -> None:
    results, _ = _bench(tmp_path, "bench_spawn.py", "--smoke", workdir=False, timeout=300)
    assert [c["passed"] for c in results["checks"]] == [True, True]
    assert results["spawn"]["pickle_bytes"] < results["footer_bytes"] and results["spawn"]["first_batch_s"]
    assert results["spawn"]["pickle_bytes"] < results["pickle_bytes_elsewhere"]  # a worker here gets no pins


@pytest.mark.parametrize("encoder", ["tokie", "tiktoken"])
def test_start_benchmark_smoke_run_passes_its_checks(tmp_path: Path, encoder: str) -> None:
    result, _ = _bench(tmp_path, "bench_start.py", "--smoke", "--encoder", encoder)
    for kind in ("first", "second"):
        assert result[kind]["start_tok_s"] > 0 and result[kind]["first_batch_s"] > 0
        assert [run["backend"] for run in result[kind]["runs"]] == [encoder]
    bytecode = result["bytecode"]  # compiled before the first child, where arrowstream is imported from
    assert bytecode["compiled"] and list(Path(bytecode["package"], "pipeline", "__pycache__").glob("iterator.*.pyc"))
    assert result["checks"] and all(check["passed"] for check in result["checks"])


def test_stall_benchmark_smoke_run_passes_its_checks(tmp_path: Path) -> None:
    result, _ = _bench(tmp_path, "bench_stall.py", "--smoke", "--beside")
    assert set(result["runs"]) == {"workers=0, headroom=2.0", "workers=1, headroom=2.0"}
    assert all(0 <= run["wait_share"] < 1 and run["rate"] > 0 for run in result["runs"].values())
    for run in result["runs"].values():  # the longest waits: within the whole, and the longest is one of them
        assert 0 < run["longest_share"] <= run["wait_share"] and run["max_ms"] >= run["p99_ms"] >= run["p50_ms"]
        assert run["longest_share"] * 20 >= run["wait_share"]  # one run of 20 steps: the longest holds 1/20 or more
        assert all(0 <= each["longest_step"] < 20 for each in run["runs"])  # the smoke run's 20 steps
    assert all(0 <= run["ready_beside"]["wait_share"] < 1 for run in result["runs"].values())
    best = result["best"]["2.0"]
    assert best["wait_share"] == min(run["wait_share"] for run in result["runs"].values())
    assert result["runs"][best["run"]]["wait_share"] == best["wait_share"]
    assert result["checks"] and all(check["passed"] for check in result["checks"])


def test_stall_benchmark_takes_fixed_step_times(tmp_path: Path) -> None:
    result, stdout = _bench(tmp_path, "bench_stall.py", "--smoke", "--step-ms", "4,7", "--collate", "none")
    assert set(result["runs"]) == {f"workers={k}, step={ms} ms" for k in (0, 1) for ms in (4, 7)}
    for name, run in result["runs"].items():
        assert run["step_ms"] == pytest.approx(float(name.split("=")[-1].split()[0]))
    assert set(result["best"]) == {"step=4 ms", "step=7 ms"} and "best configuration at a 7 ms step: workers=" in stdout
    assert result["args"]["collate"] == "none" and "collate none" in stdout  # batches handed over as they are


def test_loaders_benchmark_smoke_run_hands_over_the_same_batches_through_every_loader(tmp_path: Path) -> None:
    result, stdout = _bench(tmp_path, "bench_loaders.py", "--smoke", "--every", "5", "--strategies", "best_fit")
    kinds = {"DataLoader", "StatefulLoader", "StatefulDataLoader", "StatefulDataLoader, every 5"}
    assert set(result["runs"]["best_fit"]) == kinds
    assert result["checks"] and all(check["passed"] for check in result["checks"])
    assert all(run["rate"] > 0 and run["batches"] > 0 for runs in result["runs"]["best_fit"].values() for run in runs)
    assert "x DataLoader" in stdout


def test_loaders_benchmark_smoke_run_mixes_two_sources(tmp_path: Path) -> None:
    result, stdout = _bench(
        tmp_path, "bench_loaders.py", "--smoke", "--mixture", "--strategies", "concat", "--loaders", "DataLoader",
        "--sharing", "pipe",
    )
    assert set(result["runs"]["concat"]) == {"DataLoader", "DataLoader, sharing=pipe"}
    assert result["checks"] and all(check["passed"] for check in result["checks"])
    assert "a mixture of two sources" in stdout


def test_stall_benchmark_compares_thread_niceness_side_by_side(tmp_path: Path) -> None:
    result, stdout = _bench(tmp_path, "bench_stall.py", "--smoke", "--thread-nice", "7,idle")
    assert set(result["runs"]) == {f"workers={k}, headroom=2.0, nice={n}" for k in (0, 1) for n in (7, "idle")}
    for k in (0, 1):
        a, b = (result["runs"][f"workers={k}, headroom=2.0, nice={n}"] for n in (7, "idle"))
        assert a["step_ms"] == b["step_ms"] and a["ready"]["runs"] == b["ready"]["runs"]  # the same step and floor
    assert result["best"]["2.0"]["run"] in result["runs"]


def test_stall_benchmark_runs_through_the_stateful_loader(tmp_path: Path) -> None:
    result, stdout = _bench(tmp_path, "bench_stall.py", "--smoke", "--loader", "stateful")
    assert result["args"]["loader"] == "stateful" and result["args"]["collate"] == "none"
    assert set(result["runs"]) == {f"workers={k}, headroom=2.0" for k in (0, 1)} and "8 x 256, stateful," in stdout


def test_stall_benchmark_measures_each_spare_cpu_count_at_its_own_rate(tmp_path: Path) -> None:
    result, stdout = _bench(tmp_path, "bench_stall.py", "--smoke", "--spare-cpus", "0,1")
    assert set(result["runs"]) == {f"workers={k}, spare cpus={c}, headroom=2.0" for k in (0, 1) for c in (0, 1)}
    for k in (0, 1):
        every, spared = (result["runs"][f"workers={k}, spare cpus={c}, headroom=2.0"] for c in (0, 1))
        assert every["rates"] != spared["rates"]  # the producers' CPUs set the rate: each measured its own
        assert every["step_ms"] == pytest.approx(2e3 / every["rate"])
        assert spared["step_ms"] == pytest.approx(2e3 / spared["rate"])
    assert result["best"]["2.0"]["run"] in result["runs"] and "best configuration at 2.0x headroom: workers=" in stdout


def test_stall_benchmark_holds_idle_cpus_awake_side_by_side(tmp_path: Path) -> None:
    device = Path("/dev/cpu_dma_latency")
    if not os.access(device, os.W_OK):  # the option says what it needs instead of a traceback
        command = [sys.executable, str(ROOT / "benchmarks" / "bench_stall.py"), "--smoke", "--cpu-latency-us", "0",
                   "--workers", "0", "--workdir", str(tmp_path / "work")]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert proc.returncode != 0 and "needs write access to /dev/cpu_dma_latency" in proc.stderr
        return
    result, stdout = _bench(tmp_path, "bench_stall.py", "--smoke", "--cpu-latency-us", "default,0", "--workers", "0")
    held, free = result["runs"]["workers=0, headroom=2.0, cpu latency=0 us"], result["runs"]["workers=0, headroom=2.0"]
    assert held["cpu_latency_in_force_us"] == 0 and free["cpu_latency_in_force_us"] > 0  # the request was in force
    assert held["step_ms"] == free["step_ms"] and held["ready"]["runs"] != free["ready"]["runs"]  # each its own floor
    assert "0 us" in stdout


def test_long_documents_benchmark_smoke_run_keeps_states_small(tmp_path: Path) -> None:
    report, _ = _bench(tmp_path, "bench_long_docs.py", "--smoke", workdir=False, timeout=300)
    assert report["checks_passed"]
    for key, result in report["results"].items():  # one long document leaves the largest state as it was
        assert result["state"]["long"] <= 1.2 * result["state"]["plain"] + 500, (key, result["state"])


def test_start_benchmark_reads_through_spawned_workers_and_reports_their_peak_memory(tmp_path: Path) -> None:
    result, _ = _bench(tmp_path, "bench_start.py", "--smoke", "--workers", "2", "--start-method", "spawn")
    for kind in ("first", "second"):
        runs = result[kind]["runs"]
        assert all(run["tokens"] >= 200_000 and run["first_batch_s"] > 0 for run in runs)
        # the workers ran: a spawned one imports torch and arrowstream, far past an idle process's few MB
        assert all(run["workers_peak_mb"] > 150 for run in runs)
    assert result["args"]["workers"] == 2 and all(check["passed"] for check in result["checks"])
