#!/usr/bin/env python
"""arrowstream against the raw encoders and its peers (``datasets``, StatefulDataLoader, Grain), like for like.

One corpus, one byte-level BPE tokenizer, one packing shape. Every run is a
fresh child process (``peers_child.py``: its own peak RSS, its own empty
in-memory caches; arrowstream's encoder verdict is on disk, in a directory
made for this benchmark run, so the first child pays the encoder's proof and
the others find it, as on any machine after its first run; arrowstream's
modules are compiled to bytecode first, as the peers' wheels were when
installed: ``harness.ensure_bytecode``), runs alternate
across contestants, and figures are medians
of ``--repeats``. Each pipeline is compared with the raw speed of the *same*
encoder, and with ``datasets`` using the same encoder:

- raw encoders (texts already in memory; reading them is not timed), see
  :mod:`contestants`: ``tokenizers`` (``encode_batch_fast``, 1,000 texts per
  call), ``tiktoken-batch`` (``Encoding.encode_batch``, 2 threads) and
  ``tiktoken-joined`` (1,000 texts joined into one ``encode_to_numpy`` call,
  2 calls at a time: the call arrowstream's tiktoken backend makes). The
  tiktoken encoding is arrowstream's own conversion of the ``tokenizer.json``;
  and ``tokie`` (``encode_batch_flat``, 1,000 texts per call, one call at a
  time) where it is installed.
  A pipeline's ``vs raw`` divides by the faster raw method of its encoder.
- ``arrowstream <strategy>, <backend>, workers=k``: ``read_parquet(...)
  .tokenize(tok, backend=...).pack(seq_len, batch_size, strategy)``
  (``bucket``: ``.bucket(max_tokens=seq_len * batch_size, max_len=seq_len, long_docs="truncate")``),
  iterated through ``ds.to_torch()`` (k=0) or ``DataLoader(ds.to_torch(),
  batch_size=None, num_workers=k)``. ``tokenizers`` forces that encoder;
  ``tiktoken`` is ``backend="auto"`` with tokie hidden, what the default gives
  where the ``fast`` extra is not installed; ``tokie`` is ``backend="auto"``
  where it is (the default with the ``fast`` extra). No peer encodes with
  tokie, so its rows are set against the raw ``tokie`` encoder and against
  each peer's own rows in a table of their own; the like-for-like rows name
  their encoder. ``even_batches`` is the library's default
  (``True``) unless the name says ``even_batches=False``; it matters only with
  several consumers (k > 0), where it may drop or pad a little at the end.
- ``datasets, <encoder>, workers=k``: ``load_dataset("parquet",
  streaming=True)``, a batched ``map`` that tokenizes (``tokenizers``:
  ``encode_batch_fast``; ``tiktoken``: the map batch as two joined halves on
  two threads, as ``tiktoken-joined``) and appends EOS, a batched ``map``
  that concatenates each 1,000-document batch and cuts it into rows of
  ``seq_len`` (the ``run_clm`` recipe, with numpy), torch format,
  ``DataLoader(batch_size, num_workers=k)``. Its usual encoder is the
  tokenizer's own (``tokenizers``).
- ``torchdata StatefulDataLoader + datasets, <encoder>, workers=k``: the same
  ``datasets`` pipeline through torchdata's
  ``StatefulDataLoader(ds, batch_size, num_workers=k)`` (its defaults, so
  with workers each batch carries a snapshot of the worker's dataset state).
- ``grain, <encoder>, workers=k``: the same recipe in Grain (see
  :func:`contestants.grain_pipeline`): the files chained in order
  (``InterleaveIterDataset(cycle_length=1)`` of one ``ParquetIterDataset``
  per file), ``.batch(1000)`` of the texts, one ``map`` that encodes them
  with the same calls as ``datasets``' map and cuts the 1,000 documents into
  rows of ``seq_len``, ``RebatchIterDataset`` into arrays of
  ``(batch_size, seq_len)``, and for k > 0 ``mp_prefetch`` with k worker
  processes (Grain's own multiprocessing; spawned, each on a slice of the
  files); each numpy batch goes through ``torch.from_numpy``.

``--peers`` picks the peers (``datasets`` is always needed: it is the
reference of the others' checks and of the ``vs datasets`` columns).

Clocks: a pipeline's clock starts after ``import torch`` (a training process
has loaded it) and before importing the loader library (arrowstream, or
``datasets``, torchdata, Grain, ``tokenizers`` and tiktoken): every side
imports inside its clock.
Figures: tokens/s over the whole epoch (first batch included; real tokens,
never padding), time to first batch, peak RSS of the main process
(``VmHWM``), peak PSS of the whole process tree (DataLoader workers included,
sampled every 50 ms) and that peak minus the same measure of an idle process
that imported torch and that side's libraries (``above idle``). A summary
table sets arrowstream ``concat`` against each peer row with the same encoder
and workers on tokens/s, first batch and working memory. Resume latency at
10 %, 50 % and 90 % of the epoch (torch imported before the clock on every
side): arrowstream ``ds.iter(state)`` plus the first batch; ``datasets``'
``load_state_dict`` plus the first example, and ``.skip(n)``;
``StatefulDataLoader.load_state_dict`` plus the first batch; Grain's
``iterator.set_state`` plus the first batch (the peers with ``tokenizers``,
no workers).

Checks, on whole streams (every pipeline hashes its real ids in order with
SHA-256 and counts each id): the three raw encoders give the same stream;
arrowstream ``concat`` without workers gives exactly the raw stream (the
encoder's ids plus one EOS per document, in order) with either backend; with
workers and ``even_batches=False`` the same ids in another order; with the
default ``even_batches`` no id more than the raw stream has, and an even
number of batches; ``best_fit`` every id; ``bucket`` the raw count minus the
tokens it truncates; every peer without workers, with either encoder, gives
exactly the raw stream cut per 1,000 documents into whole rows (the
``run_clm`` recipe, computed from the raw encoder's ids), and with workers the
same ids as ``datasets`` with ``tokenizers`` and the same workers (each worker
groups its own files). Output: tables as text, in Markdown (``--markdown``),
and JSON with versions and machine facts (``--json``). ``--smoke`` runs a
tiny corpus once. Needs ``datasets``, ``torchdata`` and ``grain`` (``pip
install 'arrowstream[bench]' torchdata``). Exit status 0 when the checks
pass.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import (
    EOS_TOKEN,
    Checks,
    corpus_dir,
    ensure_bytecode,
    fmt_table,
    loadavg,
    log,
    machine_facts,
    md_table,
    median,
    tiktoken_file,
    tokenizer_file,
)
from contestants import RAW_METHODS, arrowstream_dataset, datasets_pipeline, grain_pipeline
from peers_child import RESULT

CHILD = Path(__file__).with_name("peers_child.py")
_VERDICTS = tempfile.TemporaryDirectory(prefix="arrowstream-peers-verdicts-")
ENCODER = {"tokenizers": "tokenizers", "tiktoken": "tiktoken", "tokie": "tokie"}  # arrowstream backend name -> encoder
BACKEND = {v: k for k, v in ENCODER.items()}  # encoder -> the arrowstream backend name that uses it
#: The peers, by child kind, and the start of their rows' names; ``datasets`` is the reference of the others.
PEERS = {"datasets": "datasets", "torchdata": "torchdata StatefulDataLoader + datasets", "grain": "grain"}


# -- contestants ------------------------------------------------------------------------


def peer_name(kind: str, encoder: str, workers: int) -> str:
    """Return the row name of a peer pipeline, e.g. ``grain, tiktoken, workers=0``."""
    return f"{PEERS[kind]}, {encoder}, workers={workers}"


def contestants(
    strategies: list[str], peers: list[str], peer_encoders: tuple[str, ...] = ("tokenizers", "tiktoken")
) -> list[dict[str, Any]]:
    """Return every contestant of one round, each a child spec (without the shared keys) with its name.

    ``datasets`` runs with both encoders (the other peers' reference); the
    other peers with ``peer_encoders``.
    """
    out: list[dict[str, Any]] = [
        {"name": f"raw {m}", "kind": "raw", "method": m, "encoder": m.split("-")[0]} for m in RAW_METHODS
    ]

    def ours(strategy: str, backend: str, workers: int, even: bool | None = None) -> dict[str, Any]:
        name = f"arrowstream {strategy}, {backend}, workers={workers}"
        if even is False:
            name += ", even_batches=False"
        return {"name": name, "kind": "arrowstream", "strategy": strategy, "encoder": ENCODER[backend],
                "backend": backend, "workers": workers, "even_batches": even}

    if "concat" in strategies:
        out += [ours("concat", "tokenizers", 0), ours("concat", "tokenizers", 2)]
        out += [ours("concat", "tiktoken", 0), ours("concat", "tiktoken", 2), ours("concat", "tiktoken", 2, False)]
        out += [ours("concat", "tokie", 0), ours("concat", "tokie", 2)]
    for strategy in strategies:
        if strategy != "concat":
            out += [ours(strategy, "tiktoken", 0), ours(strategy, "tiktoken", 2)]
    for kind in peers:
        for encoder in ("tokenizers", "tiktoken") if kind == "datasets" else peer_encoders:
            out += [{"name": peer_name(kind, encoder, w), "kind": kind, "encoder": encoder, "workers": w} for w in (0, 2)]
    out += [{"name": f"idle {side}", "kind": "idle", "side": side} for side in ("arrowstream", *peers)]
    return out


# -- child processes -------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    """Return ``pid`` and its descendants (DataLoader workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _pss_mb(pids: list[int]) -> float:
    """Sum the proportional set size of ``pids``: shared pages (a fork's) are counted once in all."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in a fresh process; sample the memory of its process tree every 50 ms."""
    # one encoder verdict directory per benchmark run: the first arrowstream child proves the encoder,
    # later ones find the verdict, as on any machine after its first run (docs/encoders.md, warm start)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "true", "ARROWSTREAM_CACHE_DIR": _VERDICTS.name}
    # files, not pipes: a child (or a Grain worker sharing its stderr) that writes more than a pipe holds
    # would block while this loop samples memory instead of reading
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        proc = subprocess.Popen([sys.executable, str(CHILD), json.dumps(spec)], stdout=out_f, stderr=err_f,
                                text=True, env=env)
        peak = 0.0
        while proc.poll() is None:
            peak = max(peak, _pss_mb(_tree(proc.pid)))
            time.sleep(0.05)
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    if proc.returncode != 0:
        raise RuntimeError(f"child {spec.get('kind')} failed:\n{err[-3000:]}")
    line = next(ln for ln in out.splitlines() if ln.startswith(RESULT))
    return {**json.loads(line[len(RESULT):]), "tree_pss_mb": peak, "loadavg_end": loadavg()}


def run_rounds(configs: list[dict[str, Any]], shared: dict[str, Any], repeats: int) -> dict[str, list[dict[str, Any]]]:
    """Run every contestant once per round, ``repeats`` rounds; the raw encoders digest in the first."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in range(repeats):
        for c in configs:
            spec = {**shared, **{k: v for k, v in c.items() if k != "name"}, "digest": r == 0}
            res = run_child(spec)
            runs.setdefault(c["name"], []).append(res)
            rate = f"{res['tok_per_s'] / 1e6:.3f} M tok/s" if "tok_per_s" in res else f"{res['tree_pss_mb']:.0f} MB PSS"
            log(f"  run {r + 1}/{repeats}: {c['name']:<62} {rate}  (load {res['loadavg_end']})")
    return runs


# -- checks ----------------------------------------------------------------------------


def check_streams(checks: Checks, runs: dict[str, list[dict[str, Any]]], configs: list[dict[str, Any]],
                  seq_len: int) -> dict[str, Any]:
    """Compare whole streams (hash in order, histogram of ids, counts) with the raw encoders'; return the reference."""
    raw = {name: rs[0]["digest"] for name, rs in runs.items() if name.startswith("raw")}
    ref = raw["raw tokenizers"]
    for name, d in raw.items():
        checks(d["sha256"] == ref["sha256"] and d["tokens"] == ref["tokens"],
               f"{name}: the same stream as raw tokenizers (ids + one EOS per document)",
               f"{d['tokens']:,} tokens, sha256 {d['sha256'][:12]}")
    want = np.array(ref["histogram"])
    for c in configs:
        if c["kind"] == "arrowstream" or c["kind"] in PEERS:
            check_pipeline(checks, c, runs[c["name"]], runs, ref, want, seq_len)
    return ref


def check_pipeline(checks: Checks, c: dict[str, Any], rs: list[dict[str, Any]], runs: dict[str, list[dict[str, Any]]],
                   ref: dict[str, Any], want: np.ndarray, seq_len: int) -> None:
    """Check one pipeline's streams against the raw stream (``want``: its histogram of ids)."""
    name, ordered = c["name"], c["workers"] == 0  # with workers, the loader interleaves their batches
    digests = [r["digest"] for r in rs]
    hist, tokens = np.array(digests[0]["histogram"]), digests[0]["tokens"]
    key = "sha256" if ordered else "histogram"
    checks(all(d[key] == digests[0][key] for d in digests), f"{name}: every run gives the same stream",
           f"{len(rs)} run(s)")
    if c["kind"] in PEERS and ordered:
        rows = ref["rows"]
        checks(digests[0]["sha256"] == rows["sha256"] and tokens == rows["tokens"],
               f"{name}: exactly the raw stream cut into whole rows per 1,000 documents (the run_clm recipe), in order",
               f"{tokens:,} of {ref['tokens']:,} tokens")
    elif c["kind"] in PEERS:  # each worker groups its own files' documents: compare with datasets' workers
        twin = runs[peer_name("datasets", "tokenizers", c["workers"])][0]["digest"]
        checks(twin["histogram"] == digests[0]["histogram"] and tokens % seq_len == 0 and bool(np.all(hist <= want)),
               f"{name}: the same ids as datasets with tokenizers and the same workers, whole rows, "
               "no id beyond the raw stream's", f"{tokens:,} of {ref['tokens']:,} tokens")
    elif c["strategy"] == "concat" and ordered:
        checks(digests[0]["sha256"] == ref["sha256"] and tokens == ref["tokens"],
               f"{name}: exactly the raw encoders' stream, in order", f"{tokens:,} tokens")
        checks(rs[0]["backend"] == c["encoder"], f"{name}: encoded with the expected backend", rs[0]["backend"])
    elif c["strategy"] == "bucket" and ordered:
        cut = rs[0]["stats"].get("truncated_tokens", 0)
        checks(bool(np.all(hist <= want)) and tokens + cut == ref["tokens"],
               f"{name}: the raw stream's ids minus the tokens truncated to seq_len", f"{tokens:,} + {cut:,} truncated")
    elif ordered or c["even_batches"] is False:
        checks(bool(np.array_equal(hist, want)) and tokens == ref["tokens"], f"{name}: every id of the raw stream, once",
               f"{tokens:,} tokens")
    else:  # workers with the default even_batches: the end of a consumer's share may be dropped
        batches = rs[0]["batches"]
        checks(bool(np.all(hist <= want)) and batches % c["workers"] == 0,
               f"{name}: no id beyond the raw stream's, the same number of batches from each worker",
               f"{tokens:,} of {ref['tokens']:,} tokens ({tokens / ref['tokens']:.2%}), {batches} batches")


# -- tables ----------------------------------------------------------------------------


def summarize(runs: dict[str, list[dict[str, Any]]], configs: list[dict[str, Any]], idle: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Return the medians of each contestant and its like-for-like ratios."""
    encoder = {c["name"]: c["encoder"] for c in configs if "encoder" in c}
    kind = {c["name"]: c["kind"] for c in configs}
    table: dict[str, dict[str, Any]] = {}
    for name, rs in runs.items():
        table[name] = {
            "encoder": encoder[name],
            "tok_per_s": median([x["tok_per_s"] for x in rs]),
            "first_batch_s": median([x["first_batch_s"] for x in rs]) if "first_batch_s" in rs[0] else None,
            "peak_mb": max(x["peak_mb"] for x in rs),
            "tree_pss_mb": max(x["tree_pss_mb"] for x in rs),
            "working_mb": None if kind[name] == "raw" else max(x["tree_pss_mb"] for x in rs) - idle[kind[name]],
            # the median round: for arrowstream, a process after the first (which proves the encoder)
            "working_mb_median": None if kind[name] == "raw" else median([x["tree_pss_mb"] for x in rs]) - idle[kind[name]],
            "tokens": rs[0]["tokens"],
        }
    raw_ref = {
        enc: max((n for n in table if n.startswith("raw") and table[n]["encoder"] == enc),
                 key=lambda n: table[n]["tok_per_s"])
        for enc in ("tokenizers", "tiktoken", "tokie")
    }
    for name, t in table.items():
        workers = 2 if "workers=2" in name else 0
        t["raw_reference"] = raw_ref[t["encoder"]]
        t["vs_raw"] = t["tok_per_s"] / table[raw_ref[t["encoder"]]]["tok_per_s"]
        t["vs_datasets_same_encoder"] = t["vs_datasets_tokenizers"] = None
        if kind[name] not in ("raw", "datasets"):
            same, usual = peer_name("datasets", t["encoder"], workers), peer_name("datasets", "tokenizers", workers)
            if same in table:  # no peer encodes with tokie
                t["vs_datasets_same_encoder"] = t["tok_per_s"] / table[same]["tok_per_s"]
            t["vs_datasets_tokenizers"] = t["tok_per_s"] / table[usual]["tok_per_s"]
    return table


def table_rows(table: dict[str, dict[str, Any]], expected: int) -> list[list[str]]:
    def f(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    return [[
        name, t["encoder"], f"{t['tok_per_s'] / 1e6:.3f}",
        "(reference)" if name == t["raw_reference"] else f"{t['vs_raw']:.2f}",
        f(t["vs_datasets_same_encoder"], ".2f"), f(t["vs_datasets_tokenizers"], ".2f"),
        "-" if name.startswith("raw") else f"{t['tokens'] / expected:.2%}", f(t["first_batch_s"], ".2f"),
        f"{t['peak_mb']:.0f}", f"{t['tree_pss_mb']:.0f}", f(t["working_mb"], ".0f"),
    ] for name, t in table.items()]


#: The like-for-like comparisons: (label, numerator, denominator); ``{w}`` is the workers, ``raw`` the encoder's fastest.
HEADLINE = (
    ("arrowstream (tokenizers) / raw tokenizers", "arrowstream concat, tokenizers, workers={w}", "raw:tokenizers"),
    ("arrowstream (tiktoken) / raw tiktoken", "arrowstream concat, tiktoken, workers={w}", "raw:tiktoken"),
    ("datasets (tokenizers) / raw tokenizers", "datasets, tokenizers, workers={w}", "raw:tokenizers"),
    ("datasets (tiktoken) / raw tiktoken", "datasets, tiktoken, workers={w}", "raw:tiktoken"),
    ("arrowstream / datasets, both tokenizers", "arrowstream concat, tokenizers, workers={w}", "datasets, tokenizers, workers={w}"),
    ("arrowstream / datasets, both tiktoken", "arrowstream concat, tiktoken, workers={w}", "datasets, tiktoken, workers={w}"),
    ("arrowstream tiktoken / datasets usual (tiktoken / tokenizers)", "arrowstream concat, tiktoken, workers={w}",
     "datasets, tokenizers, workers={w}"),
    ("grain (tokenizers) / raw tokenizers", "grain, tokenizers, workers={w}", "raw:tokenizers"),
    ("grain (tiktoken) / raw tiktoken", "grain, tiktoken, workers={w}", "raw:tiktoken"),
    ("arrowstream / grain, both tokenizers", "arrowstream concat, tokenizers, workers={w}", "grain, tokenizers, workers={w}"),
    ("arrowstream / grain, both tiktoken", "arrowstream concat, tiktoken, workers={w}", "grain, tiktoken, workers={w}"),
    ("arrowstream / StatefulDataLoader + datasets, both tokenizers", "arrowstream concat, tokenizers, workers={w}",
     "torchdata StatefulDataLoader + datasets, tokenizers, workers={w}"),
    ("arrowstream / StatefulDataLoader + datasets, both tiktoken", "arrowstream concat, tiktoken, workers={w}",
     "torchdata StatefulDataLoader + datasets, tiktoken, workers={w}"),
    ("arrowstream (tokie) / raw tokie", "arrowstream concat, tokie, workers={w}", "raw:tokie"),
    ("arrowstream default with the fast extra (tokie) / datasets usual (tokenizers)",
     "arrowstream concat, tokie, workers={w}", "datasets, tokenizers, workers={w}"),
)


def headline(runs: dict[str, list[dict[str, Any]]], table: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return each like-for-like ratio per workers: ratio of the medians, and the median of per-round ratios.

    A comparison whose contestants did not run (``--peers``) is left out.
    """
    raw = {t["encoder"]: t["raw_reference"] for t in table.values()}
    out: dict[str, dict[str, Any]] = {}
    for label, top, bottom in HEADLINE:
        for w in (0, 2):
            a, b = top.format(w=w), raw[bottom[4:]] if bottom.startswith("raw:") else bottom.format(w=w)
            if a not in table or b not in table:
                continue
            rounds = [x["tok_per_s"] / y["tok_per_s"] for x, y in zip(runs[a], runs[b])]
            out.setdefault(label, {})[f"workers={w}"] = {
                "of_medians": table[a]["tok_per_s"] / table[b]["tok_per_s"], "per_round": rounds,
                "median_per_round": median(rounds), "numerator": a, "denominator": b,
            }
    return out


def headline_rows(ratios: dict[str, dict[str, Any]]) -> list[list[str]]:
    return [[label, *(f"{r[w]['of_medians']:.2f} ({r[w]['median_per_round']:.2f})" for w in ("workers=0", "workers=2"))]
            for label, r in ratios.items()]


HEADER = ["pipeline", "encoder", "M tok/s", "vs raw, same encoder", "vs datasets, same encoder",
          "vs datasets with tokenizers", "tokens out", "first batch s", "peak RSS MB (main)",
          "peak PSS MB (all processes)", "above idle MB"]


def versus(table: dict[str, dict[str, Any]], backend: str | None = None) -> list[dict[str, Any]]:
    """Return arrowstream ``concat`` against each peer row, same workers, on the three measures of the bar.

    ``backend=None``: arrowstream with the peer's encoder (like for like);
    ``"tokie"``: arrowstream's default where the ``fast`` extra is installed.
    Each entry: the peer, arrowstream's row, the ratio of tokens/s (above 1:
    arrowstream faster), both times to first batch and both working memories
    (peak PSS of all processes above the side's idle process: the largest
    over the rounds, and the median round's, shown but not in the verdict),
    and whether arrowstream is ahead on all three.
    """
    out = []
    for name, t in table.items():
        if not any(name.startswith(PEERS[kind] + ", ") for kind in PEERS):
            continue
        workers = 2 if "workers=2" in name else 0
        mine = f"arrowstream concat, {backend or BACKEND[t['encoder']]}, workers={workers}"
        if mine not in table:
            continue
        ours = table[mine]
        entry = {
            "peer": name, "arrowstream": mine,
            "tok_per_s_ratio": ours["tok_per_s"] / t["tok_per_s"],
            "first_batch_s": [ours["first_batch_s"], t["first_batch_s"]], "working_mb": [ours["working_mb"], t["working_mb"]],
            "working_mb_median": [ours["working_mb_median"], t["working_mb_median"]],
        }
        entry["ahead_on_all"] = (entry["tok_per_s_ratio"] > 1 and ours["first_batch_s"] < t["first_batch_s"]
                                 and ours["working_mb"] < t["working_mb"])
        out.append(entry)
    return out


def versus_rows(entries: list[dict[str, Any]]) -> list[list[str]]:
    return [[e["peer"], f"{e['tok_per_s_ratio']:.2f}", "{:.2f} / {:.2f}".format(*e["first_batch_s"]),
             "{:.0f} / {:.0f}".format(*e["working_mb"]), "{:.0f} / {:.0f}".format(*e["working_mb_median"]),
             "yes" if e["ahead_on_all"] else "no"] for e in entries]


VERSUS_HEADER = ["arrowstream concat against (same encoder and workers)", "tok/s, arrowstream / peer",
                 "first batch s, arrowstream / peer", "above idle MB, arrowstream / peer",
                 "above idle MB, median round", "ahead on all three"]


# -- resume ----------------------------------------------------------------------------


def save_states(shared: dict[str, Any], total_batches: int, out: Path, points: tuple[float, ...],
                peers: list[str]) -> dict[str, Any]:
    """Save every side's state at the given fractions of the epoch; return their paths and offsets.

    The peers' pipelines use the ``tokenizers`` encoder (``datasets``' usual
    one); StatefulDataLoader and Grain save after whole batches, as
    arrowstream does, ``datasets`` after the same number of rows.
    """
    corpus, tok, L, B = Path(shared["corpus"]), Path(shared["tokenizer"]), shared["seq_len"], shared["batch_size"]
    tt = Path(shared["tiktoken"])
    it = arrowstream_dataset(corpus, tok, seq_len=L, batch_size=B, strategy="concat", backend="auto",
                             even_batches=None).iter()
    hf = datasets_pipeline(corpus, tok, tt, seq_len=L, encoder="tokenizers")
    hf_it = iter(hf)
    iters: dict[str, Any] = {}  # peer -> (its batch iterator, the call that returns its state)
    if "torchdata" in peers:
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(datasets_pipeline(corpus, tok, tt, seq_len=L, encoder="tokenizers"), batch_size=B)
        iters["torchdata"] = (iter(loader), loader.state_dict)
    if "grain" in peers:
        grain_it = iter(grain_pipeline(corpus, tok, tt, seq_len=L, batch_size=B, encoder="tokenizers", workers=0))
        iters["grain"] = (grain_it, grain_it.get_state)
    saved: dict[str, Any] = {}
    done = hf_done = 0
    for point in points:
        target = int(total_batches * point)
        while done < target:
            next(it)
            for peer_it, _ in iters.values():
                next(peer_it)
            done += 1
        while hf_done < target * B:  # datasets yields rows; batches are formed by the loader
            next(hf_it)
            hf_done += 1
        paths = {side: out / f"{side}-{point}.json" for side in ("ours", "datasets", *iters)}
        paths["ours"].write_text(json.dumps(it.state_dict()))
        paths["datasets"].write_text(json.dumps(hf.state_dict(), default=int))
        for side, (_, state_dict) in iters.items():
            paths[side].write_text(json.dumps(state_dict(), default=int))
        saved[str(point)] = {**{k: str(v) for k, v in paths.items()}, "rows": hf_done}
    it.close()
    if "grain" in iters:
        iters["grain"][0].close()
    return saved


#: The resume rows: name, child kind and which saved state it loads (``None``: ``.skip`` the saved rows).
RESUME_WAYS = (
    ("arrowstream", "resume-arrowstream", "ours"),
    ("datasets state_dict", "resume-datasets", "datasets"),
    ("datasets skip", "skip", None),
    ("torchdata StatefulDataLoader + datasets state_dict", "resume-torchdata", "torchdata"),
    ("grain set_state", "resume-grain", "grain"),
)


def measure_resume(shared: dict[str, Any], saved: dict[str, Any], points: tuple[float, ...], repeats: int) -> dict[str, dict[str, float]]:
    """Time resuming at each point in fresh processes, alternating the ways; return medians."""
    resume: dict[str, dict[str, float]] = {}
    for point in points:
        s = saved[str(point)]
        ways = {name: {"kind": kind, "state": s[side]} if side else {"kind": kind, "skip": s["rows"]}
                for name, kind, side in RESUME_WAYS if side is None or side in s}
        got: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(repeats):
            for way, spec in ways.items():
                got[way].append(run_child({**shared, **spec})["resume_s"])
        resume[f"{round(point * 100)}%"] = {k: median(v) for k, v in got.items()}
    return resume


# -- main ------------------------------------------------------------------------------


def wide_tokenizer(workdir: Path, vocab_size: int) -> tuple[Path, dict[str, Any]]:
    """The random-word tokenizer of ``vocab_size`` tokens (:mod:`wide_vocab`) and its description, as :func:`tokenizer_file`'s."""
    from tokenizers import Tokenizer
    from wide_vocab import wide_tokenizer_file

    path = wide_tokenizer_file(workdir, vocab_size)
    tok = Tokenizer.from_file(str(path))
    return path, {"path": str(path), "requested_vocab_size": vocab_size, "vocab_size": tok.get_vocab_size(),
                  "eos_id": tok.token_to_id(EOS_TOKEN)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/arrowstream-bench"))
    p.add_argument("--mb", type=float, default=None, help="MB of text [85 (about 20 M tokens); smoke 2]")
    p.add_argument("--rows-per-group", type=int, default=2000, help="documents per Parquet row group [2000]")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--vocab-size", type=int, default=None, help="[32000; smoke 4096]")
    p.add_argument("--wide-vocab", type=int, default=0, metavar="N",
                   help="a byte-level BPE of N tokens trained on random words (wide_vocab.py), as GPT-2's 50k or "
                        "Llama 3's 128k, instead of the corpus's (which stops near 6,000 merges whatever --vocab-size)")
    p.add_argument("--repeats", type=int, default=None, help="[3; smoke 1]")
    p.add_argument("--strategies", default=None, help="[concat,best_fit,bucket; smoke concat]")
    p.add_argument("--points", default=None, help="resume points [0.1,0.5,0.9; smoke 0.5]")
    p.add_argument("--peers", default=",".join(PEERS),
                   help=f"peers to run, among {','.join(PEERS)}; datasets is the reference, always needed [all]")
    p.add_argument(
        "--peer-encoders", default="tokenizers,tiktoken",
        help="encoders of the torchdata and grain rows (datasets runs both: it is their reference)",
    )
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, help="write the tables in Markdown to this file")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    args.mb = args.mb if args.mb is not None else (2.0 if args.smoke else 85.0)
    args.vocab_size = args.vocab_size or (4096 if args.smoke else 32000)
    args.repeats = args.repeats or (1 if args.smoke else 3)
    args.strategies = (args.strategies or ("concat" if args.smoke else "concat,best_fit,bucket")).split(",")
    if "concat" not in args.strategies:
        p.error("--strategies must include concat (the reference of the stream checks and of resume)")
    args.points = tuple(float(x) for x in (args.points or ("0.5" if args.smoke else "0.1,0.5,0.9")).split(","))
    args.peers = [x for x in args.peers.split(",") if x]
    if unknown := sorted(set(args.peers) - set(PEERS)):
        p.error(f"unknown peer(s) {unknown!r} in --peers; expected some of {list(PEERS)!r}")
    if "datasets" not in args.peers:
        p.error("--peers must include datasets (the reference of the other peers' checks and ratios)")
    args.peers = [k for k in PEERS if k in args.peers]  # the table's order, whatever the option's
    args.peer_encoders = tuple(e for e in ("tokenizers", "tiktoken") if e in args.peer_encoders.split(","))
    if not args.peer_encoders:
        p.error("--peer-encoders takes tokenizers, tiktoken or both (comma-separated)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    L, B = args.seq_len, args.batch_size
    checks = Checks()
    facts = machine_facts()
    log("machine: " + json.dumps(facts))
    corpus, cinfo = corpus_dir(args.workdir, args.mb, seed=0, rows_per_group=args.rows_per_group, mb_per_file=64.0)
    if args.wide_vocab:
        tok_path, tinfo = wide_tokenizer(args.workdir, args.wide_vocab)
    else:
        tok_path, tinfo = tokenizer_file(args.workdir, args.vocab_size)
    shared = {"corpus": str(corpus), "tokenizer": str(tok_path), "tiktoken": str(tiktoken_file(args.workdir, tok_path)),
              "seq_len": L, "batch_size": B, "eos_id": tinfo["eos_id"], "vocab_size": tinfo["vocab_size"]}
    configs = contestants(args.strategies, args.peers, args.peer_encoders)
    facts["bytecode"] = ensure_bytecode()  # the peers come from wheels, with their bytecode: so does arrowstream
    runs = run_rounds(configs, shared, args.repeats)
    ref = check_streams(checks, runs, configs, L)
    expected = ref["tokens"]
    idle = {side: median([x["tree_pss_mb"] for x in runs.pop(f"idle {side}")]) for side in ("arrowstream", *args.peers)}
    table = summarize(runs, configs, idle)
    rows = table_rows(table, expected)
    log(f"\n{cinfo['key']}: {expected:,} tokens with EOS, seq_len={L}, batch_size={B}, medians of {args.repeats}:\n")
    log(fmt_table(HEADER, rows))
    markdown = [md_table(HEADER, rows)]
    ratios = headline(runs, table)
    hrows = headline_rows(ratios)
    hheader = ["like for like (concat)", "workers=0", "workers=2"]
    log("\nratios of the medians (median of the per-round ratios):\n")
    log(fmt_table(hheader, hrows))
    markdown.append(md_table(hheader, hrows))
    against = versus(table)
    vrows = versus_rows(against)
    log("\narrowstream against each peer, on the three measures of the bar:\n")
    log(fmt_table(VERSUS_HEADER, vrows))
    markdown.append(md_table(VERSUS_HEADER, vrows))
    against_default = versus(table, "tokie")
    if against_default:
        dheader = ["arrowstream concat with tokie (the default with the fast extra) against", *VERSUS_HEADER[1:]]
        drows = versus_rows(against_default)
        log("\narrowstream's default with the fast extra (tokie) against each peer, same workers:\n")
        log(fmt_table(dheader, drows))
        markdown.append(md_table(dheader, drows))
    log("\nidle (torch and the loader imported, nothing read), PSS: "
        + ", ".join(f"{side} {mb:.0f} MB" for side, mb in idle.items())
        + "; 'above idle' is the peak PSS of all processes minus its side's")

    total_batches = runs["arrowstream concat, tiktoken, workers=0"][0]["batches"]
    states_dir = args.workdir / "peer-states"
    states_dir.mkdir(parents=True, exist_ok=True)
    saved = save_states(shared, total_batches, states_dir, args.points, args.peers)
    resume = measure_resume(shared, saved, args.points, args.repeats)
    rrows = [[k, *(f"{resume[p][k]:.2f}" for p in resume)] for k in next(iter(resume.values()))]
    log("\nresume latency, seconds (new process, torch loaded: open, load the state, first batch or example):\n")
    log(fmt_table(["", *resume], rrows))
    markdown.append(md_table(["resume, seconds", *resume], rrows))
    if args.markdown:
        args.markdown.write_text("\n\n".join(markdown) + "\n")
        log(f"\nwrote the tables in Markdown to {args.markdown}")
    failed = [c for c in checks.items if not c["passed"]]
    log(f"\ncorrectness checks: {len(checks.items) - len(failed)} passed, {len(failed)} failed")
    log(f"load average at the start {facts['loadavg_start']}, at the end {loadavg()}")
    if args.json:
        from importlib.metadata import version

        import datasets
        import tiktoken
        import tokenizers
        import torch

        for rs in runs.values():  # the histograms were for the checks; keep the hashes
            for r in rs:
                r.get("digest", {}).pop("histogram", None)
        args.json.write_text(json.dumps({
            "machine": facts, "versions": {"datasets": datasets.__version__, "torch": torch.__version__,
                                           "tokenizers": tokenizers.__version__, "tiktoken": tiktoken.__version__,
                                           **{k: version(k) for k in args.peers if k != "datasets"}},
            "peers": args.peers,
            "corpus": cinfo, "tokenizer": tinfo, "seq_len": L, "batch_size": B, "repeats": args.repeats,
            "expected_tokens": expected, "stream_sha256": ref["sha256"], "runs": runs, "table": table, "headline": ratios,
            "versus": against, "versus_default_tokie": against_default,
            "idle_pss_mb": idle, "resume": resume, "checks": checks.items,
        }, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
