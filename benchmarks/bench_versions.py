#!/usr/bin/env python
"""Two versions of the library side by side: did a change make the pipeline slower?

For a refactoring that must not change speed, check out the earlier commit
beside the work tree (``git worktree add /tmp/before <commit>``) and run::

    python benchmarks/bench_versions.py --before /tmp/before

Each pass is a fresh process whose ``PYTHONPATH`` puts one version's
``arrowstream`` first; passes alternate (before, after, before, ...) and
every figure is timed from before ``import arrowstream``. Three passes are
measured, each on the same corpus and tokenizer as ``bench_core.py``:

- ``text``: ``read_parquet(...).tokenize(tok).pack(2048, 8)`` over the whole
  corpus (tokens/s, and the time to the first batch);
- ``cache``: the same reading a token cache each version filled beforehand
  (untimed), where the pipeline's own overhead shows most;
- ``resume``: ``ds.iter(state)`` plus the first batch, from a state at half
  the epoch that each version saved for itself (three pairs a round: it
  takes tens of milliseconds and varies by as much).

Reported: the median of each figure per version and the median of the
per-pair ratios ``after / before``. Check: both versions emit the same
number of tokens. ``--smoke`` runs a tiny corpus once (its figures mean
nothing). Exit status 0 when the check passes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import CheckFailed, Checks, corpus_dir, log, median, tokenizer_file

ROOT = Path(__file__).resolve().parents[1]
RESULT = "BENCH_VERSIONS_RESULT "

#: The timed side, run in a fresh process: prints one JSON line.
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import arrowstream
corpus, tok, kind, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
step = arrowstream.read_parquet(corpus).tokenize(tok, **({"cache": extra} if kind == "cache" else {}))
ds = step.pack(seq_len=2048, batch_size=8)
out = {"file": arrowstream.__file__}
if kind == "save":
    it = ds.iter()
    for _ in range(int(sys.argv[5])):
        next(it)
    json.dump(it.state_dict(), open(extra, "w"))
elif kind == "resume":
    t1 = time.perf_counter()
    next(ds.iter(json.load(open(extra))))
    out["resume_s"] = time.perf_counter() - t1
else:
    first, n = None, 0
    for b in ds:
        first = time.perf_counter() - t0 if first is None else first
        n += int(b["num_tokens"])
    out.update(tokens=n, tok_per_s=n / (time.perf_counter() - t0), first_batch_s=first)
print("RESULT " + json.dumps(out))
"""


def run(path: Path, *args: str) -> dict[str, Any]:
    """Run the child with ``path`` first on ``PYTHONPATH``; return what it printed."""
    env = {**os.environ, "PYTHONPATH": str(path)}
    # run from the version's root too: `python -c` puts the working directory first on the path
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env, cwd=path
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{path}: {args[2]} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    if Path(result["file"]).resolve().parent.parent != path.resolve():
        raise RuntimeError(f"expected the library under {path}, imported {result['file']}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the earlier version")
    parser.add_argument("--after", type=Path, default=ROOT, help="the later version (default: this checkout)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "arrowstream-bench")
    parser.add_argument("--size-mb", type=float, default=85.0, help="MB of text of the corpus")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--smoke", action="store_true", help="a tiny corpus, once")
    args = parser.parse_args(argv)
    size, repeats, vocab = (2.0, 1, 4096) if args.smoke else (args.size_mb, args.repeats, 32000)
    corpus, _ = corpus_dir(args.workdir, size, seed=0, rows_per_group=2000, mb_per_file=64.0)
    tok, _ = tokenizer_file(args.workdir, vocab)
    versions = {"before": args.before, "after": args.after}
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="arrowstream-versions-") as tmp:
        common = [str(corpus), str(tok)]
        for name, path in versions.items():  # untimed: each version's cache and half-epoch state
            run(path, *common, "cache", f"{tmp}/cache-{name}")
        total = run(args.after, *common, "text", "-")["tokens"]
        half = str(max(1, total // (2 * 2048 * 8)))
        for name, path in versions.items():
            run(path, *common, "save", f"{tmp}/state-{name}.json", half)
        figures: dict[str, dict[str, list[float]]] = {v: {} for v in versions}
        # a resume takes tens of milliseconds, so it is timed three times a round
        kinds = ("text", "cache", "resume", "resume", "resume")
        for r in range(repeats):
            for kind in kinds:
                for name, path in versions.items():
                    extra = {"cache": f"{tmp}/cache-{name}", "resume": f"{tmp}/state-{name}.json"}.get(kind, "-")
                    got = run(path, *common, kind, extra)
                    if "tokens" in got:
                        checks(got["tokens"] == total, f"{name} {kind}: every token", f"{got['tokens']} vs {total}")
                    for key, value in got.items():
                        if key not in ("file", "tokens"):
                            figures[name].setdefault(f"{kind} {key}", []).append(float(value))
            log(f"round {r + 1} of {repeats} done")
    log(f"\n{'figure':28} {'before':>10} {'after':>10} {'after/before':>13}")
    report: dict[str, Any] = {}
    for key in figures["before"]:
        b, a = figures["before"][key], figures["after"][key]
        ratio = median([y / x for x, y in zip(b, a) if x])
        report[key] = {"before": b, "after": a, "ratio": ratio}
        log(f"{key:28} {median(b):10.3f} {median(a):10.3f} {ratio:13.3f}")
    log("(ratios are medians of per-pair ratios; tokens/s higher is better, seconds lower)")
    if args.json:
        args.json.write_text(json.dumps({"versions": {k: str(v) for k, v in versions.items()}, **report}, indent=1))
    print(RESULT + json.dumps({k: v["ratio"] for k, v in report.items()}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CheckFailed as exc:
        print(f"check failed: {exc}", file=sys.stderr)
        sys.exit(1)
