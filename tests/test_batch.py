"""Batch assembly against a plain-Python reference, for contiguous and gathered layouts."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowstream.pack.assemble import assemble_batch


def _reference(src, segs, batch_size, seq_len, pad_id, mask=None):
    ids = [[pad_id] * seq_len for _ in range(batch_size)]
    pos = [list(range(seq_len)) for _ in range(batch_size)]
    seg = [[0] * seq_len for _ in range(batch_size)]
    labels = [[-100] * seq_len for _ in range(batch_size)]
    fill = [0] * batch_size
    count = [0] * batch_size
    last_len = [0] * batch_size
    for start, length, row in segs:
        count[row] += 1
        last_len[row] = length
        for j in range(length):
            ids[row][fill[row] + j] = int(src[start + j])
            pos[row][fill[row] + j] = j
            seg[row][fill[row] + j] = count[row]
            if j and (mask is None or mask[start + j]):  # a segment's first token has no predecessor in it
                labels[row][fill[row] + j] = int(src[start + j])
        fill[row] += length
    for row in range(batch_size):  # padding keeps counting from the row's last segment
        last_start = fill[row] - last_len[row]
        for j in range(fill[row], seq_len):
            pos[row][j] = j - last_start
    return ids, pos, seg, labels


@st.composite
def layouts(draw):
    batch_size = draw(st.integers(1, 4))
    seq_len = draw(st.integers(1, 12))
    src = np.arange(100, 160, dtype=np.int32)
    contiguous = draw(st.booleans())  # segments back to back in the source, as packers gather them
    segs, at = [], 0
    for row in range(batch_size):
        room = seq_len
        while room and draw(st.booleans()):
            length = draw(st.integers(1, room))
            start = at if contiguous else draw(st.integers(0, src.size - length))
            segs.append((start, length, row))
            room -= length
            at += length
    mask = np.array(draw(st.lists(st.booleans(), min_size=src.size, max_size=src.size))) if draw(st.booleans()) else None
    return src, segs, batch_size, seq_len, mask


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_gathered_layouts_match_the_reference(layout) -> None:
    src, segs, batch_size, seq_len, mask = layout
    arr = np.array(segs, dtype=np.int64).reshape(-1, 3)
    out = assemble_batch(src, arr[:, 0], arr[:, 1], arr[:, 2], batch_size=batch_size, seq_len=seq_len, pad_id=7,
                         mask=mask)
    ids, pos, seg, labels = _reference(src, segs, batch_size, seq_len, 7, mask)
    assert out["input_ids"].tolist() == ids
    assert out["position_ids"].tolist() == pos
    assert out["segment_ids"].tolist() == seg
    assert out["labels"].tolist() == labels
    assert out["labels"].dtype == np.int64  # what cross-entropy takes as targets
    for key in ("input_ids", "position_ids", "segment_ids"):
        assert out[key].dtype == np.int32 and out[key].shape == (batch_size, seq_len)
    # varlen view: every segment and every padding tail is its own span of the flat batch
    spans = []
    for row in range(batch_size):
        lens = [n for _, n, r in segs if r == row]
        fill = sum(lens)
        spans += lens + ([seq_len - fill] if fill < seq_len else [])
    assert out["cu_seqlens"].dtype == np.int32
    assert out["cu_seqlens"].tolist() == np.concatenate([[0], np.cumsum(spans)]).tolist()
    assert out["max_seqlen"] == max(spans) and isinstance(out["max_seqlen"], int)
    real = sum(n for _, n, _ in segs)
    assert (out["num_tokens"], out["num_padding_tokens"]) == (real, batch_size * seq_len - real)
    assert (out["num_docs"], out["num_cut_docs"]) == (len(segs), 0)


def test_contiguous_layout_takes_the_copy_path_and_matches() -> None:
    src = np.arange(1, 9, dtype=np.int32)
    # rows of 4 filled back to back from a contiguous source
    out = assemble_batch(src, [0, 3, 4], [3, 1, 4], [0, 0, 1], batch_size=3, seq_len=4, pad_id=0)
    assert out["input_ids"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8], [0, 0, 0, 0]]
    assert out["segment_ids"].tolist() == [[1, 1, 1, 2], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0], [0, 1, 2, 3], [0, 1, 2, 3]]
    assert out["labels"].tolist() == [[-100, 2, 3, -100], [-100, 6, 7, 8], [-100] * 4]


def test_loss_mask_and_cut_documents_show_in_labels_and_counts() -> None:
    src = np.arange(1, 9, dtype=np.int32)
    mask = np.array([0, 0, 1, 1, 1, 0, 1, 1], dtype=bool)  # say, prompts masked out
    out = assemble_batch(
        src, [0, 3, 5], [3, 2, 3], [0, 0, 1], batch_size=2, seq_len=5, pad_id=0,
        seg_whole=np.array([True, False, True]), mask=mask,
    )
    assert out["labels"].tolist() == [[-100, -100, 3, -100, 5], [-100, 7, 8, -100, -100]]
    assert out["num_cut_docs"] == 1 and out["num_docs"] == 3
    assert out["cu_seqlens"].tolist() == [0, 3, 5, 8, 10]
    # the copy path takes the mask too
    out = assemble_batch(src, [0, 4], [4, 4], [0, 1], batch_size=2, seq_len=4, pad_id=0, mask=mask)
    assert out["labels"].tolist() == [[-100, -100, 3, 4], [-100, -100, 7, 8]]
