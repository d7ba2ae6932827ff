"""Several batches assembled in one pass equal each assembled alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowstream.pack.assemble import assemble_batch
from arrowstream.pack.layout import Layout
from arrowstream.pack.split import assemble_split
from arrowstream.testing import assert_items_equal


@st.composite
def blocks(draw):
    """A layout of ``parts`` batches of ``batch_size`` rows (rows may be padding only), and its parts."""
    parts = draw(st.integers(1, 4))
    batch_size = draw(st.integers(1, 3))
    seq_len = draw(st.integers(1, 10))
    segs = []
    for row in range(parts * batch_size):
        room = seq_len
        while room and draw(st.booleans()):
            n = draw(st.integers(1, room))
            segs.append((row, n, draw(st.booleans())))
            room -= n
    seg_row = np.array([r for r, _, _ in segs], dtype=np.int64)
    seg_len = np.array([n for _, n, _ in segs], dtype=np.int64)
    whole = np.array([w for _, _, w in segs], dtype=bool)
    total = int(seg_len.sum())
    src = np.arange(1000, 1000 + total, dtype=np.int32)
    mask = np.array(draw(st.lists(st.booleans(), min_size=total, max_size=total)), dtype=bool) if draw(st.booleans()) else None
    layout = Layout(src, np.cumsum(seg_len) - seg_len, seg_len, seg_row, whole, mask, parts * batch_size)
    return layout, parts, seq_len


@settings(max_examples=300, deadline=None)
@given(blocks(), st.integers(0, 3))
def test_each_part_equals_its_rows_assembled_alone(block, pad_id: int) -> None:
    layout, parts, seq_len = block
    B = layout.num_rows // parts
    got = assemble_split(layout, parts, seq_len=seq_len, pad_id=pad_id)
    assert len(got) == parts
    for k, batch in enumerate(got):
        mine = (layout.seg_row >= k * B) & (layout.seg_row < (k + 1) * B)
        alone = assemble_batch(
            layout.src, layout.seg_src[mine], layout.seg_len[mine], layout.seg_row[mine] - k * B,
            batch_size=B, seq_len=seq_len, pad_id=pad_id, seg_whole=layout.seg_whole[mine], mask=layout.mask,
        )
        assert list(batch) == list(alone)  # the same keys, in the same order
        assert_items_equal(batch, alone, where=f"part {k}")  # dtypes, shapes and bytes
        for name in ("input_ids", "labels", "position_ids", "segment_ids"):
            assert batch[name].flags.c_contiguous


def test_parts_share_the_blocks_arrays() -> None:
    layout = Layout(np.arange(1, 9, dtype=np.int32), np.array([0, 4]), np.array([4, 4]), np.array([0, 1]),
                    np.array([True, True]), None, num_rows=2)
    first, second = assemble_split(layout, 2, seq_len=4, pad_id=0)
    assert first["input_ids"].base is second["input_ids"].base is not None
    assert second["input_ids"].tolist() == [[5, 6, 7, 8]] and second["cu_seqlens"].tolist() == [0, 4]


@pytest.mark.parametrize("parts", [0, 3, 5])
def test_parts_that_do_not_divide_the_rows_are_refused(parts: int) -> None:
    layout = Layout(np.arange(4, dtype=np.int32), np.array([0]), np.array([4]), np.array([0]),
                    np.array([True]), None, num_rows=4)
    with pytest.raises(ValueError, match="must divide the layout's 4 rows"):
        assemble_split(layout, parts, seq_len=4, pad_id=0)


def test_a_segment_without_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="every segment must hold a token, got a length of 0"):
        assemble_batch(np.arange(4, dtype=np.int32), np.array([0, 2]), np.array([2, 0]), np.array([0, 0]),
                       batch_size=1, seq_len=4, pad_id=0)
