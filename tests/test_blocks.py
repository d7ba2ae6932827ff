"""Full concat batches made several at a time equal those made one layout at a time, state included."""

from __future__ import annotations

import json
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowstream.io.chunk import Chunk
from arrowstream.pack.assemble import assemble_batch
from arrowstream.pack.blocks import assemble_full_batches
from arrowstream.pack import blocks, concat
from arrowstream.pack.concat import ConcatPacker
from arrowstream.testing import assert_items_equal

from .conftest import block_sizes


def _chunks(lengths: list[int], *, pieces: int, head_skip: int, tail_take: int, masked: bool, seed: int) -> list[Chunk]:
    """Documents of ``lengths`` tokens (unique values), cut into ``pieces`` chunks."""
    rng = np.random.default_rng(seed)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.arange(1, int(offsets[-1]) + 1, dtype=np.int32)
    mask = rng.random(tokens.size) < 0.7 if masked else None
    cuts = np.linspace(0, len(lengths), pieces + 1).astype(int)
    out = []
    for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        if a == b:
            continue
        lo, hi = int(offsets[a]), int(offsets[b])
        out.append(Chunk(
            epoch=0, shard=0, seq_start=int(a), seq_end=int(b), row_start=int(a), seq=np.arange(a, b),
            tokens=tokens[lo:hi], offsets=offsets[a : b + 1] - lo,
            mask=None if mask is None else mask[lo:hi],
            head_skip=head_skip if k == 0 else 0, tail_take=tail_take if b == len(lengths) else 0,
        ))
    return out


def _run_both(chunks: list[Chunk], block: int = 8, **pack) -> tuple[list, list]:
    """Each batch with its state after it: through ``next_batch`` (blocks of at most ``block``) and one layout at a time."""
    with mock.patch.object(concat, "_BLOCK_BATCHES", block):
        return _run_pair(chunks, **pack)


def _block_sizes(batches: list) -> list[int]:
    """How many batches each block gave, in order (a block's batches share their ``input_ids`` array)."""
    return block_sizes([b for b, _ in batches])


def _run_pair(chunks: list[Chunk], **pack) -> tuple[list, list]:
    packer = ConcatPacker(**pack)
    fast, slow = packer.start(None), packer.start(None)
    it_fast, it_slow = iter(chunks), iter(chunks)
    a, b = [], []
    while True:
        try:
            batch = fast.next_batch(it_fast)
        except StopIteration:
            break
        a.append((batch, json.dumps(fast.state_dict(), sort_keys=True)))
        layout = slow.next_layout(it_slow)
        b.append((layout.assemble(seq_len=pack["seq_len"], pad_id=pack["pad_id"]),
                  json.dumps(slow.state_dict(), sort_keys=True)))
    with pytest.raises(StopIteration):
        slow.next_layout(it_slow)
    return a, b


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=80),
    seq_len=st.integers(1, 12),
    batch_size=st.integers(1, 4),
    pieces=st.integers(1, 4),
    head_skip=st.sampled_from([0, 1]),
    tail_take=st.sampled_from([0, 1]),
    masked=st.booleans(),
    drop_last=st.booleans(),
    block=st.sampled_from([1, 2, 8]),
)
def test_block_batches_equal_one_layout_at_a_time(
    lengths: list[int], seq_len: int, batch_size: int, pieces: int,
    head_skip: int, tail_take: int, masked: bool, drop_last: bool, block: int,
) -> None:
    chunks = _chunks(lengths, pieces=pieces, head_skip=head_skip, tail_take=tail_take, masked=masked, seed=len(lengths))
    fast, slow = _run_both(chunks, block, seq_len=seq_len, batch_size=batch_size, drop_last=drop_last, pad_id=0)
    assert len(fast) == len(slow)
    for (fb, fs), (sb, ss) in zip(fast, slow):
        assert_items_equal(fb, sb)  # same keys, dtypes, shapes and bytes
        assert fs == ss  # same state after every batch


@pytest.mark.parametrize("cut", [0, 1])
def test_a_chunk_of_many_batches_is_made_in_blocks(cut: int) -> None:
    """Batches come in blocks that share arrays, of 1, 2, 4, then 8 batches (87 full batches here)."""
    chunks = _chunks([7] * 200, pieces=1, head_skip=cut, tail_take=cut, masked=bool(cut), seed=0)
    fast, slow = _run_both(chunks, seq_len=8, batch_size=2, drop_last=False, pad_id=0)
    assert _block_sizes(fast) == [1, 2, 4] + [8] * 10 + [1]  # the last, partial batch: one layout
    for (fb, _), (sb, _) in zip(fast, slow):
        assert_items_equal(fb, sb)


@pytest.mark.parametrize(("cap", "sizes"), [(64, [1, 2, 4] + [4] * 20 + [1]), (32, [1, 2] + [2] * 42 + [1]), (8, [1] * 88)])
def test_blocks_hold_no_more_tokens_than_the_cap(cap: int, sizes: list[int]) -> None:
    """Large batches come in smaller blocks (16 tokens a batch here: 4, 2, then 1 a block), the same batches."""
    chunks = _chunks([7] * 200, pieces=1, head_skip=0, tail_take=0, masked=False, seed=0)
    with mock.patch.object(blocks, "BLOCK_TOKENS", cap):
        fast, slow = _run_both(chunks, seq_len=8, batch_size=2, drop_last=False, pad_id=0)
    assert _block_sizes(fast) == sizes
    for (fb, fs), (sb, ss) in zip(fast, slow):
        assert_items_equal(fb, sb)
        assert fs == ss


def test_full_batches_match_assemble_batch_on_one_layout() -> None:
    tokens = np.arange(102, 118, dtype=np.int32)
    # documents start at 3, 4 and 11 and end at 3, 4 and 11 (the first began earlier, the last goes on)
    got = assemble_full_batches(tokens, np.array([3, 4, 11]), np.array([3, 4, 11]), batch_size=2, seq_len=4)
    refs = [
        assemble_batch(tokens[:8], np.array([0, 3, 4]), np.array([3, 1, 4]), np.array([0, 0, 1]),
                       batch_size=2, seq_len=4, pad_id=0, seg_whole=np.array([False, True, False])),
        assemble_batch(tokens[8:], np.array([0, 3, 4]), np.array([3, 1, 4]), np.array([0, 0, 1]),
                       batch_size=2, seq_len=4, pad_id=0, seg_whole=np.array([False, False, False])),
    ]
    assert len(got) == 2
    for batch, ref in zip(got, refs):
        assert_items_equal(batch, ref)
    assert got[0]["labels"].tolist() == [[-100, 103, 104, -100], [-100, 107, 108, 109]]
    assert (got[0]["num_cut_docs"], got[1]["num_cut_docs"]) == (2, 3)


def test_a_partial_batch_is_an_error() -> None:
    with pytest.raises(ValueError, match="multiple of 8 tokens, got 12"):
        assemble_full_batches(np.zeros(12, np.int32), np.array([0]), np.array([12]), batch_size=2, seq_len=4)
