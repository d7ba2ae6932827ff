"""``best_fit`` batches assembled several at a time equal those assembled one at a time, state included."""

from __future__ import annotations

import json
import pickle
import warnings
from collections.abc import Callable
from typing import Any
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowstream.errors import DataLossWarning
from arrowstream.io.chunk import Chunk
from arrowstream.pack import bestfit
from arrowstream.pack.bestfit import BestFitPacker
from arrowstream.testing import assert_items_equal

from .conftest import block_sizes


def _chunks(lengths: list[int], *, epochs: int, per_chunk: int, masked: bool) -> list[Chunk]:
    """Documents of ``lengths`` tokens (every token its own value), ``per_chunk`` a chunk, for ``epochs`` epochs."""
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.arange(1, int(offsets[-1]) + 1, dtype=np.int32)
    mask = (tokens % 3 != 0) if masked else None
    out = []
    for epoch in range(epochs):
        for a in range(0, len(lengths), per_chunk):
            b = min(a + per_chunk, len(lengths))
            lo, hi = int(offsets[a]), int(offsets[b])
            out.append(Chunk(
                epoch=epoch, shard=0, seq_start=a, seq_end=b, row_start=a, seq=np.arange(a, b),
                tokens=tokens[lo:hi], offsets=offsets[a : b + 1] - lo, mask=None if mask is None else mask[lo:hi],
            ))
    return out


def _stream(packer: BestFitPacker, chunks: list[Chunk], targets: Callable[[int], int | None],
            calls: list[int | None] | None = None) -> list[tuple[dict[str, Any], str]]:
    """Every batch with the state after it, then the warnings; ``calls`` says per step: ``None`` a ``next_batch``, ``r`` a layout of ``r`` rows."""
    run, it, out = packer.start(None, targets=targets), iter(chunks), []
    with warnings.catch_warnings(record=True) as caught:  # data dropped at a target: the same either way
        warnings.simplefilter("always", DataLossWarning)
        for k in range(10_000):
            rows = None if calls is None else calls[k % len(calls)]
            try:
                if rows is None:
                    batch = run.next_batch(it)
                else:
                    batch = run.next_layout(it, rows).assemble(seq_len=packer.seq_len, pad_id=packer.pad_id)
            except StopIteration:
                return out + [({"warnings": [str(w.message) for w in caught]}, "")]
            out.append((batch, json.dumps(run.state_dict(), sort_keys=True)))
    raise AssertionError("the run did not end")


def _one_at_a_time(packer: BestFitPacker, chunks: list[Chunk], targets: Callable, calls: list | None = None) -> list:
    with mock.patch.object(bestfit, "_AHEAD_BATCHES", 1):
        return _stream(packer, chunks, targets, calls)


@settings(max_examples=120, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=90),
    seq_len=st.integers(4, 16),
    batch_size=st.integers(1, 3),
    window=st.integers(2, 24),
    per_chunk=st.integers(1, 9),
    long_docs=st.sampled_from(["split", "truncate", "drop"]),
    masked=st.booleans(),
    drop_last=st.booleans(),
    target=st.sampled_from([None, 1, 3, 40]),
    epochs=st.integers(1, 2),
    ramp=st.booleans(),
)
def test_batches_and_states_equal_one_batch_at_a_time(
    lengths: list[int], seq_len: int, batch_size: int, window: int, per_chunk: int, long_docs: str,
    masked: bool, drop_last: bool, target: int | None, epochs: int, ramp: bool,
) -> None:
    packer = BestFitPacker(seq_len=seq_len, batch_size=batch_size, drop_last=drop_last, window=window,
                           long_docs=long_docs, ramp=ramp, shuffle_batches=2)
    chunks = _chunks(lengths, epochs=epochs, per_chunk=per_chunk, masked=masked)
    targets = lambda epoch: target if epoch < epochs else None  # noqa: E731
    fast, slow = _stream(packer, chunks, targets), _one_at_a_time(packer, chunks, targets)
    assert len(fast) == len(slow)
    for k, ((fb, fs), (sb, ss)) in enumerate(zip(fast, slow)):
        assert_items_equal(fb, sb, where=f"batch {k}")  # same keys, dtypes, shapes and bytes
        assert fs == ss, f"the state after batch {k} differs"


def test_formed_batches_are_assembled_together_up_to_the_cap() -> None:
    """300 documents of 5 tokens in rows of 16: after the ramp, blocks of 8 batches (the cap), then what is left."""
    packer = BestFitPacker(seq_len=16, batch_size=2, window=64, shuffle_batches=4, ramp=False)
    chunks = _chunks([5] * 300, epochs=1, per_chunk=16, masked=False)
    fast = _stream(packer, chunks, lambda epoch: None)
    sizes = block_sizes([b for b, _ in fast[:-1]])
    assert max(sizes) == 8 and sum(sizes) == len(fast) - 1 == 50
    assert block_sizes([b for b, _ in _one_at_a_time(packer, chunks, lambda epoch: None)[:-1]]) == [1] * 50


def test_rows_taken_by_a_layout_in_between_are_not_given_twice() -> None:
    """A caller that takes layouts between batches (rows of its own count) gets what it would without blocks."""
    packer = BestFitPacker(seq_len=16, batch_size=2, window=64, ramp=False)
    chunks = _chunks([5, 3, 9, 2, 7] * 60, epochs=2, per_chunk=16, masked=True)
    calls = [None, None, 3, None, 1]
    fast = _stream(packer, chunks, lambda epoch: None, calls)
    slow = _one_at_a_time(packer, chunks, lambda epoch: None, calls)
    assert len(fast) == len(slow) > 50
    assert fast[-1] == slow[-1] == ({"warnings": []}, "")
    fast, slow = fast[:-1], slow[:-1]
    for (fb, fs), (sb, ss) in zip(fast, slow):
        assert_items_equal(fb, sb)
        assert fs == ss


def test_a_snapshot_leaves_the_batches_assembled_ahead_behind() -> None:
    """A DataLoader worker pickles a snapshot with every batch: the arrays assembled ahead stay out of it."""
    packer = BestFitPacker(seq_len=512, batch_size=4, window=64, ramp=False)
    chunks = _chunks([100] * 200, epochs=1, per_chunk=16, masked=False)
    run = packer.start(None)
    run.next_batch(iter(chunks))
    ahead = sum(a.nbytes for _, batch in run.ahead for a in batch.values() if isinstance(a, np.ndarray))
    assert ahead > 100_000  # seven batches wait, assembled ...
    assert len(pickle.dumps(run.snapshot())) < ahead / 20  # ... and the snapshot holds none of them


def test_every_document_is_let_go_once_its_last_piece_is_out() -> None:
    """Nothing stays held after an epoch: the store and the piece counts empty as batches go out."""
    packer = BestFitPacker(seq_len=16, batch_size=2, window=64, long_docs="split")
    chunks = _chunks([5, 3, 40, 2, 7] * 40, epochs=1, per_chunk=16, masked=False)
    run, it = packer.start(None), iter(chunks)
    held = []
    while True:
        try:
            run.next_batch(it)
        except StopIteration:
            break
        held.append(len(run.store))
    assert max(held) > 20 and len(run.store) == len(run.refs) == 0 and run.store.windows == []
