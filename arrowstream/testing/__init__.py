"""The resume contract, as a reusable test helper.

:func:`assert_resumes_identically` checkpoints a pipeline before every step,
round-trips each state through JSON into a fresh iterator, and checks that the
rest of the stream is byte-identical to the uninterrupted one, and that the
resumed iterator reports the same states as the original at every later step.
It also resumes a second time from a resumed iterator. Use it on every stage
and on your own pipelines: a pipeline that passes it loses and repeats nothing
on preemption.

:func:`example_table` and :func:`example_dir` give the one small table the
examples in the docs and docstrings share (see :mod:`arrowstream.testing.examples`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from arrowstream.testing.examples import example_dir, example_table

__all__ = [
    "assert_batch_consistent",
    "assert_items_equal",
    "assert_resumes_identically",
    "example_dir",
    "example_table",
]


def assert_items_equal(a: Any, b: Any, *, where: str = "") -> None:
    """Assert two stream items are byte-identical (numpy dicts, record batches, or plain values)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys {a.keys()} != {b!r}"
        for key in a:
            assert_items_equal(a[key], b[key], where=f"{where}[{key!r}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), f"{where}: ndarray vs {type(b).__name__}"
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        )
        assert a.tobytes() == b.tobytes(), f"{where}: array contents differ"
    elif isinstance(a, (pa.RecordBatch, pa.Table)):
        assert isinstance(b, type(a)) and a.equals(b, check_metadata=True), (
            f"{where}: record batches differ"
        )
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_batch_consistent(batch: dict[str, Any], *, pad_id: int | None = None) -> None:
    """Assert a packed batch's document-aware arrays agree with each other on every row.

    Checks, from ``segment_ids``: ``position_ids`` restart at 0 at every
    segment start and count up inside it (and keep counting on padding, or
    count 0..L-1 on a row of padding only); ``labels`` are ``-100`` at segment
    starts and on padding and elsewhere either the token or ``-100`` (a loss
    mask); ``cu_seqlens`` are the segment and padding-tail boundaries of the
    flattened batch and ``max_seqlen`` the longest span; the counts match.

    Examples
    --------
    >>> from arrowstream import read_parquet
    >>> ds = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0).pack(seq_len=5, batch_size=3)
    >>> assert_batch_consistent(next(iter(ds)), pad_id=0)
    """
    seg = np.asarray(batch["segment_ids"])
    pos = np.asarray(batch["position_ids"])
    ids = np.asarray(batch["input_ids"])
    labels = np.asarray(batch["labels"])
    rows, L = seg.shape
    spans: list[int] = []
    num_segments = 0
    for r in range(rows):
        s = seg[r]
        fill = int(np.count_nonzero(s))
        assert (s[:fill] > 0).all() and (s[fill:] == 0).all(), f"row {r}: padding inside the row"
        starts = np.flatnonzero(np.r_[True, s[1:fill] != s[: fill - 1]]) if fill else np.empty(0, int)
        assert np.array_equal(s[starts], np.arange(1, starts.size + 1)), f"row {r}: segment ids not 1..k"
        num_segments += starts.size
        bounds = np.r_[starts, fill]
        expect = np.empty(L, dtype=np.int64)
        for a, b in zip(bounds[:-1], bounds[1:]):
            expect[a:b] = np.arange(b - a)
        last = bounds[-2] if starts.size else 0
        expect[fill:] = np.arange(fill, L) - last
        assert np.array_equal(pos[r], expect), f"row {r}: position_ids {pos[r].tolist()} != {expect.tolist()}"
        first = np.zeros(L, dtype=bool)
        first[starts] = True
        assert (labels[r][first | (s == 0)] == -100).all(), f"row {r}: a label at a start or on padding"
        inside = ~first & (s > 0)
        ok = (labels[r][inside] == ids[r][inside]) | (labels[r][inside] == -100)
        assert ok.all(), f"row {r}: labels differ from input_ids inside a segment"
        if pad_id is not None:
            assert (ids[r][fill:] == pad_id).all(), f"row {r}: padding is not pad_id {pad_id}"
        spans += np.diff(bounds).tolist() + ([L - fill] if fill < L else [])
    if "cu_seqlens" in batch:
        cu = np.asarray(batch["cu_seqlens"])
        assert cu.tolist() == np.r_[0, np.cumsum(spans)].tolist(), "cu_seqlens disagree with segment_ids"
        assert batch["max_seqlen"] == max(spans), "max_seqlen is not the longest span"
    if "num_tokens" in batch:
        real = int(np.count_nonzero(seg))
        assert batch["num_tokens"] == real and batch["num_padding_tokens"] == seg.size - real
        assert batch["num_docs"] == num_segments, "num_docs is not the number of segments"
        assert 0 <= batch["num_cut_docs"] <= batch["num_docs"]


def _roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))


def assert_resumes_identically(
    source: Any,
    *,
    every: int = 1,
    horizon: int | None = None,
    min_epochs: int = 1,
    max_steps: int = 10_000,
) -> int:
    """Check the resume contract of ``source`` at every step; return the number of steps.

    Parameters
    ----------
    source
        Something with ``.iter()`` (a :class:`~arrowstream.Dataset`), or a
        zero-argument callable returning either a fresh iterator or a freshly
        built :class:`~arrowstream.Dataset`. A callable that builds the
        pipeline anew is the stricter check: every resume then starts from a
        description that shares nothing (tokenizer, encoder, caches) with the
        run that saved the state, as after a real restart. Iterators must
        offer ``state_dict()`` and ``load_state_dict(state)``.
    every
        Check every ``every``-th checkpoint (1 checks all, including step 0
        and the state after the last item).
    horizon
        Compare at most this many items after each resume (``None``: the
        whole rest of the stream).
    min_epochs
        Fail unless the stream reaches epoch ``min_epochs - 1``, so the check
        covers epoch ends.
    max_steps
        Fail if the stream is longer (it must be finite).

    Raises
    ------
    AssertionError
        With the step at which resuming diverged.

    Examples
    --------
    >>> from arrowstream import read_parquet
    >>> assert_resumes_identically(read_parquet(example_dir(), num_epochs=2, batch_rows=3), min_epochs=2)
    12
    """
    make = _iterator_factory(source)
    # The reference run never calls state_dict(): a state_dict() that changes what comes
    # next would make the checkpointed run differ from it.
    untouched = []
    for item in make():
        untouched.append(item)
        assert len(untouched) <= max_steps, f"stream longer than max_steps={max_steps}"
    it = make()
    states = [_roundtrip(it.state_dict())]
    items = []
    for item in it:
        items.append(item)
        states.append(_roundtrip(it.state_dict()))
        assert len(items) <= max_steps, f"stream longer than max_steps={max_steps}"
    shapes = {_shape(s) for s in states}
    assert len(shapes) == 1, f"the state's keys change between steps: {sorted(shapes, key=str)}"
    assert len(items) == len(untouched), (
        f"calling state_dict() at every step gave {len(items)} items, not calling it {len(untouched)}"
    )
    for k, (a, b) in enumerate(zip(untouched, items)):
        assert_items_equal(a, b, where=f"item {k} with state_dict() called at every step")
    epochs = {s.get("position", {}).get("epoch", 0) for s in states}
    assert max(epochs) >= min_epochs - 1, (
        f"stream covered epochs {sorted(epochs)}, expected at least {min_epochs}: "
        "use a dataset with more epochs"
    )
    for step in range(0, len(states), every):
        rest, seen = _resume_and_collect(make, states[step], horizon, states, step)
        expect = items[step : None if horizon is None else step + horizon]
        assert len(rest) == len(expect), (
            f"resumed at step {step}: {len(rest)} items, the uninterrupted stream has {len(expect)}"
        )
        for k, (a, b) in enumerate(zip(expect, rest)):
            assert_items_equal(a, b, where=f"resumed at step {step}, item {step + k}")
        # resume a second time, from a state the resumed iterator produced
        second = step + max(1, (len(seen) - 1) // 2)
        if second - step < len(seen):
            again, _ = _resume_and_collect(make, seen[second - step], horizon, states, second)
            expect = items[second : None if horizon is None else second + horizon]
            assert len(again) == len(expect), f"second resume at step {second}: lengths differ"
            for k, (a, b) in enumerate(zip(expect, again)):
                assert_items_equal(a, b, where=f"second resume at step {second}, item {second + k}")
    return len(items)


def _shape(state: Any, key: str = "") -> Any:
    """Return the keys of ``state``'s dicts, recursively; a part that may be empty (null) counts as present."""
    if key in _PARTS:
        return "part"
    if isinstance(state, dict):
        return tuple(sorted((k, _shape(v, k)) for k, v in state.items() if k not in _WHILE))
    return None


#: Keys whose value is a dict at some steps and null at others (the part is empty now).
_PARTS = ("held", "next_work")
#: Keys present only for a stretch of the stream: ``dataset.until_epoch`` while epochs begun
#: before files were added finish over the old files.
_WHILE = ("until_epoch",)


def _iterator_factory(source: Any) -> Callable[[], Any]:
    """Return a zero-argument callable giving a fresh iterator over ``source``."""
    if hasattr(source, "iter"):
        return source.iter
    built = [source()]  # the first product is used once, so no pipeline is built for nothing

    def make() -> Any:
        made = built.pop() if built else source()
        return made.iter() if hasattr(made, "iter") else made

    return make


def _resume_and_collect(
    make: Callable[[], Any],
    state: dict[str, Any],
    horizon: int | None,
    states: list[dict[str, Any]],
    step: int,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Resume from ``state``; return the items and the states seen (the first right after loading)."""
    fresh = make()
    fresh.load_state_dict(_roundtrip(state))
    got = _roundtrip(fresh.state_dict())
    assert got == states[step], f"state right after loading step {step} differs: {got} vs {states[step]}"
    seen = [got]
    out = []
    for item in fresh:
        out.append(item)
        now = _roundtrip(fresh.state_dict())
        assert now == states[step + len(out)], (
            f"after resuming at step {step}, the state at step {step + len(out)} differs: "
            f"{now} vs {states[step + len(out)]}"
        )
        seen.append(now)
        if horizon is not None and len(out) >= horizon:
            break
    return out, seen
