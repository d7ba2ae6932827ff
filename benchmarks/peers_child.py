#!/usr/bin/env python
"""The timed side of ``bench_peers.py``: one contestant in one fresh process.

``bench_peers.py`` starts ``python peers_child.py SPEC`` (``SPEC`` a JSON
object) and reads the line that starts with :data:`RESULT`. Module level
imports only the standard library and :mod:`contestants` (numpy): the
libraries measured are imported inside the clock, after ``import torch``,
for every pipeline and resume alike. The raw encoders' clock covers the
encoding only (texts in memory, encoder built), as a ceiling should.

Spec keys: ``kind`` (``raw``, ``arrowstream``, ``datasets``, ``torchdata``,
``grain``, ``idle``, ``resume-arrowstream``, ``resume-datasets``,
``resume-torchdata``, ``resume-grain``, ``skip``), ``corpus``,
``tokenizer``, ``tiktoken``, ``seq_len``, ``batch_size``, ``eos_id``,
``vocab_size``, and per kind ``method``, ``digest``, ``strategy``,
``backend``, ``even_batches``, ``encoder``, ``workers``, ``side``, ``state``,
``skip``, and optionally ``sharing`` (``to_torch(sharing=...)`` with workers;
the library's default when absent).
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from contestants import (
    StreamDigest,
    arrowstream_backend,
    arrowstream_dataset,
    datasets_pipeline,
    encoded_with,
    grain_pipeline,
    raw_count,
    raw_digest,
    raw_encoder,
    read_texts,
    real_ids,
)

RESULT = "BENCH_PEERS_RESULT "
#: What each idle process imports: the libraries of a side, nothing read.
IDLE_IMPORTS = {
    "arrowstream": ("arrowstream",),
    "datasets": ("datasets", "tiktoken", "tokenizers"),
    "torchdata": ("datasets", "tiktoken", "tokenizers", "torchdata.stateful_dataloader"),
    "grain": ("grain", "pyarrow.parquet", "tiktoken", "tokenizers"),
}


def peak_mb() -> float:
    """Return this process's peak resident set (``VmHWM``) in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run_raw(spec: dict[str, Any]) -> dict[str, Any]:
    """Time one raw encoder over the corpus's texts in memory; digest its stream in a second, untimed pass."""
    texts = read_texts(Path(spec["corpus"]))
    method = spec["method"]
    encoder = raw_encoder(method, spec["tokenizer"], spec["tiktoken"])
    t0 = time.perf_counter()
    n = raw_count(method, encoder, texts)
    wall = time.perf_counter() - t0
    out = {"tokens": n, "docs": len(texts), "wall_s": wall, "tok_per_s": n / wall, "peak_mb": peak_mb()}
    if spec.get("digest"):
        fresh = raw_encoder(method, spec["tokenizer"], spec["tiktoken"])
        out["digest"] = raw_digest(method, fresh, texts, spec["eos_id"], spec["vocab_size"],
                                   seq_len=spec["seq_len"])
    return out


def build_loader(spec: dict[str, Any], torch: Any) -> tuple[Any, Any]:
    """Build the contestant's dataset and the loader a training loop iterates."""
    corpus, tok, L, B, workers = Path(spec["corpus"]), Path(spec["tokenizer"]), spec["seq_len"], spec["batch_size"], spec["workers"]
    if spec["kind"] == "datasets":
        ds = datasets_pipeline(corpus, tok, Path(spec["tiktoken"]), seq_len=L, encoder=spec["encoder"])
        return ds, torch.utils.data.DataLoader(ds, batch_size=B, num_workers=workers)
    if spec["kind"] == "torchdata":
        from torchdata.stateful_dataloader import StatefulDataLoader

        ds = datasets_pipeline(corpus, tok, Path(spec["tiktoken"]), seq_len=L, encoder=spec["encoder"])
        return ds, StatefulDataLoader(ds, batch_size=B, num_workers=workers)
    if spec["kind"] == "grain":
        ds = grain_pipeline(corpus, tok, Path(spec["tiktoken"]), seq_len=L, batch_size=B, encoder=spec["encoder"],
                            workers=workers)
        return ds, iter_grain(ds, torch)
    backend = arrowstream_backend(spec["backend"])  # the default with the fast extra (tokie) or without (tiktoken)
    ds = arrowstream_dataset(corpus, tok, seq_len=L, batch_size=B, strategy=spec["strategy"],
                             backend=backend, even_batches=spec["even_batches"])
    if workers:
        return ds, torch.utils.data.DataLoader(ds.to_torch(**({"sharing": spec["sharing"]} if "sharing" in spec else {})), batch_size=None, num_workers=workers)
    return ds, ds.to_torch()  # tensors, as a training loop takes them


def iter_grain(ds: Any, torch: Any) -> Any:
    """Yield Grain's numpy batches as tensors, one ``torch.from_numpy`` per batch; close the iterator at the end.

    A training loop converts so; closing stops ``mp_prefetch``'s workers.
    """
    it = iter(ds)
    try:
        for batch in it:
            yield {"input_ids": torch.from_numpy(batch)}
    finally:
        it.close()


def run_pipeline(spec: dict[str, Any]) -> dict[str, Any]:
    """Iterate one pipeline over a whole epoch; time it from after ``import torch``."""
    import torch  # a training process has it loaded before it loads data, whichever loader it uses

    t0 = time.perf_counter()
    if spec["kind"] == "idle":  # the libraries loaded, nothing read: the memory floor of each side
        for module in IDLE_IMPORTS[spec["side"]]:
            importlib.import_module(module)
        time.sleep(0.5)
        return {"peak_mb": peak_mb()}
    ds, loader = build_loader(spec, torch)
    digest = StreamDigest(spec["vocab_size"])
    first = None
    batches = 0
    for b in loader:
        if first is None:
            first = time.perf_counter() - t0
        digest.update(real_ids(b))
        batches += 1
    wall = time.perf_counter() - t0
    out = {"tokens": digest.tokens, "batches": batches, "wall_s": wall, "first_batch_s": first,
           "tok_per_s": digest.tokens / wall, "peak_mb": peak_mb(), "digest": digest.result()}
    if spec["kind"] == "arrowstream" and not spec["workers"]:
        out["stats"] = loader.state_dict()["stats"]
        out["backend"] = encoded_with(ds)
    return out


def run_resume(spec: dict[str, Any]) -> dict[str, Any]:
    """Time opening the dataset, loading a saved state (or skipping) and the first batch or example.

    The peers resume the ``tokenizers`` encoder's pipeline (``datasets``' usual
    encoder); StatefulDataLoader and Grain without workers, as ``datasets``.
    """
    import torch  # noqa: F401 - loaded before the clock on both sides, as in training

    state = json.loads(Path(spec["state"]).read_text()) if spec.get("state") else None
    corpus, tok, L = Path(spec["corpus"]), Path(spec["tokenizer"]), spec["seq_len"]
    t0 = time.perf_counter()
    if spec["kind"] == "resume-arrowstream":
        ds = arrowstream_dataset(corpus, tok, seq_len=L, batch_size=spec["batch_size"], strategy="concat",
                                 backend="auto", even_batches=None)
        it = ds.iter(state)
        next(it)
    elif spec["kind"] == "resume-grain":
        ds = grain_pipeline(corpus, tok, Path(spec["tiktoken"]), seq_len=L, batch_size=spec["batch_size"],
                            encoder="tokenizers", workers=0)
        it = iter(ds)
        it.set_state(state)
        next(it)
    elif spec["kind"] == "resume-torchdata":
        from torchdata.stateful_dataloader import StatefulDataLoader

        ds = datasets_pipeline(corpus, tok, Path(spec["tiktoken"]), seq_len=L, encoder="tokenizers")
        loader = StatefulDataLoader(ds, batch_size=spec["batch_size"])
        loader.load_state_dict(state)
        next(iter(loader))
    else:
        ds = datasets_pipeline(corpus, tok, Path(spec["tiktoken"]), seq_len=L, encoder="tokenizers")
        if spec["kind"] == "resume-datasets":
            ds.load_state_dict(state)
        else:
            ds = ds.skip(spec["skip"])
        next(iter(ds))
    return {"resume_s": time.perf_counter() - t0}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    kind = spec["kind"]
    if kind == "raw":
        out = run_raw(spec)
    elif kind in ("arrowstream", "datasets", "torchdata", "grain", "idle"):
        out = run_pipeline(spec)
    else:
        out = run_resume(spec)
    print(RESULT + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
