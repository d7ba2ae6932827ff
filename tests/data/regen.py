#!/usr/bin/env python
"""Write the stored states that ``tests/test_stored_states.py`` loads.

States saved by a released version must keep loading and resuming
byte-identically after the code changes. This script writes, once, a small
corpus (``corpus/``, Parquet), a tokenizer (``tokenizer.json``) and, for each
pipeline in :data:`CASES`, states saved at a few steps together with a digest
of the rest of the stream (``states-v<version>.json``). The test rebuilds each
pipeline from the stored files, loads each state and compares the digest.

Run it only to add cases for a new state version (or, with ``--rest-only``, after a change
of output an issue asks for, which the file then records), never to make a failing test
pass: the stored files are the record of what earlier versions wrote::

    python tests/data/regen.py             # writes states-v<current version>.json
    python tests/data/regen.py --rest-only "why"   # an intended change of output: states kept,
                                                   # what follows them recorded again (and why)
    python tests/data/regen.py --corpus    # also rewrites corpus/ and tokenizer.json (invalidates
                                           # every stored state: only for a new, empty record)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
TOKENIZER = HERE / "tokenizer.json"


def build(case: str) -> Any:
    """Return the pipeline of ``case``, built from the stored corpus and tokenizer."""
    from arrowstream import read_parquet

    ds = read_parquet(CORPUS, batch_rows=5, num_epochs=2)
    ids = dict(column="input_ids", eos_id=0)
    if case == "concat-shuffled":
        return ds.shuffle(seed=11, window=2).tokenize(None, **ids).pack(seq_len=16, batch_size=2)
    if case == "best-fit-text":
        return ds.tokenize(str(TOKENIZER)).pack(seq_len=24, batch_size=2, strategy="best_fit", window=12)
    if case == "best-fit-split":  # version 10: rows short enough that documents are split into full rows
        return ds.tokenize(str(TOKENIZER)).pack(seq_len=4, batch_size=2, strategy="best_fit", window=12)
    if case == "bucket":
        # long_docs="truncate": the default when these states were saved (no document is longer than a row
        # without max_len, so the output is the same; the option is named to match their options hash)
        return ds.shuffle(seed=2).tokenize(None, **ids).bucket(batch_size=3, window=10, long_docs="truncate")
    if case == "rows":
        return ds.shuffle(seed=5, window=3)
    raise KeyError(case)


#: case -> (consumers that save, steps at which they save, consumers that resume a merged state)
CASES: dict[str, dict[str, Any]] = {
    "concat-shuffled": {"world": 1, "steps": [0, 3, 17, 30]},
    "best-fit-text": {"world": 1, "steps": [2, 9]},
    "bucket": {"world": 1, "steps": [1, 6]},
    "rows": {"world": 1, "steps": [4, 11]},
    "concat-shuffled-merged": {"pipeline": "concat-shuffled", "world": 2, "steps": [5], "resume_on": 3},
    "best-fit-text-merged": {"pipeline": "best-fit-text", "world": 2, "steps": [3], "resume_on": 1},
    # version 5: consumer 2 of 3 past its estimated target, carrying epoch 0's rest into epoch 1's count
    "best-fit-text-carrying": {"pipeline": "best-fit-text", "world": 3, "own": 2, "steps": [32, 34]},
    # version 6: consumer 1 of 3 of a counted concat, whose share of whole batches begins and ends
    # inside a document
    "concat-split": {"pipeline": "concat-shuffled", "world": 3, "own": 1, "steps": [0, 4, 10, 17]},
    # version 10: a split document's full rows as one entry of `packer.ready` and `packer.out`
    "best-fit-split": {"world": 1, "steps": [2, 13]},
}


def digest(items: Iterator[Any]) -> tuple[int, str]:
    """Return the number of items and a SHA-256 of all their bytes, in order."""
    h = hashlib.sha256()
    n = 0
    for item in items:
        n += 1
        if isinstance(item, dict):
            for key in sorted(item):
                value = item[key]
                h.update(key.encode())
                h.update(np.asarray(value).tobytes() if isinstance(value, np.ndarray) else repr(value).encode())
        else:  # a record batch
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, item.schema) as writer:
                writer.write_batch(item)
            h.update(sink.getvalue().to_pybytes())
    return n, h.hexdigest()


def rest_digest(case: dict[str, Any], state: dict[str, Any]) -> list[list[Any]]:
    """Return [items, digest] of what each resuming consumer emits from ``state``."""
    ds = build(case.get("pipeline", ""))
    if "own" in case:  # one consumer's own state, resumed by that consumer
        return [list(digest(ds.iter(state, rank=case["own"], world_size=case["world"])))]
    world = case.get("resume_on", 1)
    if world == 1 and case["world"] == 1:
        return [list(digest(ds.iter(state)))]
    return [list(digest(ds.iter(state, rank=r, world_size=world))) for r in range(world)]


def record(name: str, case: dict[str, Any]) -> list[dict[str, Any]]:
    """Save the case's states and the digests of the streams that follow them."""
    from arrowstream import merge_states

    case = {"pipeline": name, **case}
    ds = build(case["pipeline"])
    out = []
    for step in case["steps"]:
        if "own" in case:
            it = ds.iter(rank=case["own"], world_size=case["world"])
            for _ in range(step):
                next(it)
            state = json.loads(json.dumps(it.state_dict()))
            out.append({"step": step, "state": state, "rest": rest_digest(case, state)})
            continue
        states = []
        for rank in range(case["world"]):
            it = ds.iter(rank=rank, world_size=case["world"])
            for _ in range(step + rank):  # uneven progress across ranks
                next(it)
            states.append(json.loads(json.dumps(it.state_dict())))
        state = states[0] if case["world"] == 1 else json.loads(json.dumps(merge_states(states)))
        out.append({"step": step, "state": state, "rest": rest_digest(case, state)})
    return out


def write_corpus() -> None:
    """Write the corpus (two files, row groups of 7) and the tokenizer."""
    from arrowstream.testing.data import make_texts, sample_tokenizer

    rng = np.random.default_rng(20261124)
    n = 60
    lengths = rng.integers(1, 30, size=n)
    ids = [[(i + 1) * 1000 + j for j in range(int(k))] for i, k in enumerate(lengths)]
    texts = make_texts(n, seed=7, mean_log_words=3.0)
    CORPUS.mkdir(parents=True, exist_ok=True)
    for f, (a, b) in enumerate(((0, 32), (32, n))):
        table = pa.table({
            "id": pa.array(range(a, b), pa.int64()),
            "text": texts[a:b],
            "input_ids": pa.array(ids[a:b], pa.list_(pa.int32())),
        })
        pq.write_table(table, CORPUS / f"part-{f}.parquet", row_group_size=7)
    sample_tokenizer(vocab_size=400).save(str(TOKENIZER))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", action="store_true", help="rewrite corpus/ and tokenizer.json first")
    parser.add_argument(
        "--rest-only",
        metavar="WHY",
        help="keep every stored state, record again what follows each one (after an intended change "
        "of output, said in WHY)",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE.parent.parent))
    from arrowstream.state import STATE_VERSION

    if args.rest_only:
        for path in sorted(HERE.glob("states-v*.json")):
            stored = json.loads(path.read_text())
            changed = 0
            for name, saved in stored["saved"].items():
                case = {"pipeline": name, **stored["cases"][name]}
                for entry in saved:
                    rest = rest_digest(case, entry["state"])
                    changed += rest != entry["rest"]
                    entry["rest"] = rest
            if changed:
                stored.setdefault("rest_changes", []).append(args.rest_only)
            path.write_text(json.dumps(stored, indent=1) + "\n")
            print(f"{path.name}: {changed} stored state(s) now continue differently")
        return 0

    if args.corpus or not CORPUS.is_dir():
        write_corpus()
    cases = {name: record(name, case) for name, case in CASES.items()}
    out = HERE / f"states-v{STATE_VERSION}.json"
    out.write_text(json.dumps({"version": STATE_VERSION, "cases": CASES, "saved": cases}, indent=1) + "\n")
    print(f"wrote {out} ({sum(len(v) for v in cases.values())} states)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

