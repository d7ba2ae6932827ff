"""Concatenation packing: shapes, boundary arrays, epochs, and properties over random inputs."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from arrowstream import ConfigError, SchemaError, read_parquet
from arrowstream.testing import (
    assert_batch_consistent,
    assert_items_equal,
    assert_resumes_identically,
)
from arrowstream.testing.data import sample_tokenizer

from .conftest import write_parts

EOS = 0


def _docs_dir(root: Path, docs: list[list[int] | None], *, files: int, rg: int) -> Path:
    """Write ``docs`` (token lists, None for null) over ``files`` files."""
    out = root / f"d-{files}-{rg}-{abs(hash(str(docs))) % 10**8}"
    per = -(-len(docs) // files) if docs else 1
    parts = []
    for f in range(files):
        part = docs[f * per : (f + 1) * per]
        if part:
            parts.append({"input_ids": pa.array(part, pa.list_(pa.int32()))})
    write_parts(out, parts, row_group_size=rg)
    return out


def _stream(directory: Path, *, seq_len: int, batch_size: int, batch_rows: int = 7, **kw) -> list:
    ds = read_parquet(directory, batch_rows=batch_rows, **kw).tokenize(
        None, column="input_ids", eos_id=EOS
    ).pack(seq_len=seq_len, batch_size=batch_size)
    return list(ds)


def _real_tokens(batches: list[dict[str, np.ndarray]]) -> np.ndarray:
    parts = [b["input_ids"][b["segment_ids"] > 0] for b in batches]
    return np.concatenate(parts) if parts else np.empty(0, np.int32)


doc_lists = st.lists(
    st.one_of(st.none(), st.lists(st.integers(1, 5000), min_size=0, max_size=40)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    docs=doc_lists,
    seq_len=st.integers(1, 24),
    batch_size=st.integers(1, 4),
    files=st.integers(1, 3),
    rg=st.integers(1, 9),
)
def test_epoch_emits_exactly_the_input_tokens_plus_separators(
    tmp_path: Path, docs: list, seq_len: int, batch_size: int, files: int, rg: int
) -> None:
    directory = _docs_dir(tmp_path, docs, files=files, rg=rg)
    batches = _stream(directory, seq_len=seq_len, batch_size=batch_size)
    expected = [t for d in docs if d for t in (*d, EOS)]
    assert _real_tokens(batches).tolist() == expected
    for b in batches:
        assert b["input_ids"].shape == (batch_size, seq_len)
        assert all(b[k].dtype == np.int32 for k in ("input_ids", "position_ids", "segment_ids"))
        labels = np.where(b["segment_ids"] > 0, b["input_ids"], -100)
        labels[b["position_ids"] == 0] = -100  # every segment starts at position 0
        assert np.array_equal(b["labels"], labels)
        assert_batch_consistent(b)
    # only the last batch may hold padding
    assert all((b["segment_ids"] > 0).all() for b in batches[:-1])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    docs=st.lists(st.lists(st.integers(1, 999), min_size=1, max_size=30), min_size=1, max_size=50),
    layout_a=st.tuples(st.integers(1, 3), st.integers(1, 8), st.integers(1, 10)),
    layout_b=st.tuples(st.integers(1, 3), st.integers(1, 8), st.integers(1, 10)),
)
def test_output_does_not_depend_on_row_groups_files_or_read_batch_size(
    tmp_path: Path, docs: list, layout_a: tuple, layout_b: tuple
) -> None:
    outs = []
    for files, rg, batch_rows in (layout_a, layout_b):
        directory = _docs_dir(tmp_path, docs, files=files, rg=rg)
        outs.append(_stream(directory, seq_len=8, batch_size=2, batch_rows=batch_rows))
    assert len(outs[0]) == len(outs[1])
    for a, b in zip(*outs):
        assert_items_equal(a, b)


def test_same_inputs_give_the_same_bytes(tmp_path: Path, tokenizer: Tokenizer) -> None:
    from arrowstream.testing.data import write_dataset

    write_dataset(tmp_path, num_files=2, docs_per_file=40, rows_per_group=15, seed=3)
    runs = []
    for _ in range(2):
        ds = read_parquet(tmp_path).tokenize(tokenizer).pack(seq_len=64, batch_size=3)
        runs.append(b"".join(np.asarray(v).tobytes() for b in ds for v in b.values()))
    assert runs[0] == runs[1] and len(runs[0]) > 0


def test_text_tokens_match_the_tokenizer(tmp_path: Path, tokenizer: Tokenizer) -> None:
    texts = ["the cat sat", "on the mat", "a much longer document with several words in it"]
    write_parts(tmp_path, [{"text": texts}], row_group_size=2)
    batches = list(read_parquet(tmp_path).tokenize(tokenizer).pack(seq_len=10, batch_size=2))
    eos = tokenizer.token_to_id("<|endoftext|>")
    expected = [t for s in texts for t in (*tokenizer.encode(s).ids, eos)]
    assert _real_tokens(batches).tolist() == expected


def test_position_and_segment_ids_follow_documents(tmp_path: Path) -> None:
    docs = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    write_parts(tmp_path, [{"input_ids": pa.array(docs, pa.list_(pa.int32()))}])
    [batch] = _stream(tmp_path, seq_len=6, batch_size=2)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0, 8, 0], [9, 10, 11, 12, 13, 0]]
    assert batch["segment_ids"].tolist() == [[1, 1, 1, 1, 2, 2], [1, 1, 1, 1, 1, 1]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 5]]


def test_document_cut_at_row_end_continues_in_next_row(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1, 2, 3, 4, 5, 6, 7]], pa.list_(pa.int32()))}])
    [batch] = _stream(tmp_path, seq_len=3, batch_size=3)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 5, 6], [7, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 1, 2], [0, 1, 2]]
    assert batch["segment_ids"].tolist() == [[1, 1, 1], [1, 1, 1], [1, 1, 0]]


def test_last_batch_is_padded_and_padding_is_not_a_document_start(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1, 2]], pa.list_(pa.int32()))}])
    [batch] = _stream(tmp_path, seq_len=4, batch_size=2)
    assert batch["input_ids"].tolist() == [[1, 2, 0, 0], [0, 0, 0, 0]]
    assert batch["segment_ids"].tolist() == [[1, 1, 1, 0], [0, 0, 0, 0]]
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3]  # padding keeps counting


def test_drop_last_drops_and_counts_the_tail(tmp_path: Path) -> None:
    docs = [[1, 2, 3]] * 5  # 20 tokens with EOS
    write_parts(tmp_path, [{"input_ids": pa.array(docs, pa.list_(pa.int32()))}])
    ds = read_parquet(tmp_path, num_epochs=2).tokenize(None, column="input_ids", eos_id=0)
    it = ds.pack(seq_len=3, batch_size=2, drop_last=True).iter()
    batches = list(it)
    assert len(batches) == 6  # 3 full batches of 6 tokens per epoch
    stats = it.state_dict()["stats"]
    assert stats["dropped_tokens"] == 4 and stats["tokens"] == 36 and stats["padding_tokens"] == 0


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_drop_last_counts_every_document_it_drops_whole(tmp_path: Path, strategy: str) -> None:
    docs = [[i + 1] * 3 for i in range(10)]  # 30 tokens: one batch of 16 goes out, the rest is dropped
    write_parts(tmp_path, [{"input_ids": pa.array(docs, pa.list_(pa.int32()))}])
    ds = read_parquet(tmp_path).tokenize(None, column="input_ids", add_eos=False)
    it = ds.pack(seq_len=4, batch_size=4, drop_last=True, strategy=strategy).iter()
    out = {int(t) for b in it for t in b["input_ids"].ravel() if t > 0}  # a document's id: it went out
    stats = it.state_dict()["stats"]
    assert stats["dropped_docs"] > 0 and len(out) + stats["dropped_docs"] == len(docs)
    assert stats["tokens"] + stats["dropped_tokens"] == 30


def test_batches_never_span_epochs(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1, 2, 3, 4]], pa.list_(pa.int32()))}])
    batches = _stream(tmp_path, seq_len=3, batch_size=1, num_epochs=3)
    flat = [b["input_ids"][0].tolist() for b in batches]
    assert flat == [[1, 2, 3], [4, 0, 0]] * 3


def test_pad_id_defaults_to_eos_and_can_be_set(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1]], pa.list_(pa.int32()))}])
    ds = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=9)
    assert next(iter(ds.pack(seq_len=3, batch_size=1)))["input_ids"].tolist() == [[1, 9, 9]]
    assert next(iter(ds.pack(seq_len=3, batch_size=1, pad_id=4)))["input_ids"].tolist() == [[1, 9, 4]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seq_len": 0, "batch_size": 1}, "seq_len"),
        ({"seq_len": 4, "batch_size": -1}, "batch_size"),
        ({"seq_len": 4, "batch_size": 1, "strategy": "magic"}, "unknown packing strategy"),
    ],
)
def test_bad_pack_options_are_config_errors(tmp_path: Path, kwargs: dict, match: str) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1]], pa.list_(pa.int32()))}])
    ds = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0)
    with pytest.raises(ConfigError, match=match):
        ds.pack(**kwargs)


def test_pack_without_tokenize_is_a_config_error(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"text": ["a"]}])
    with pytest.raises(ConfigError, match="tokenize"):
        read_parquet(tmp_path).pack(seq_len=4, batch_size=1)


def test_counters_are_exact(tmp_path: Path) -> None:
    docs = [[1, 2], None, [], [3]]
    write_parts(tmp_path, [{"input_ids": pa.array(docs, pa.list_(pa.int32()))}])
    ds = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0)
    it = ds.pack(seq_len=4, batch_size=1).iter()
    list(it)
    stats = it.state_dict()["stats"]
    assert {k: stats[k] for k in ("rows", "docs", "null", "empty", "tokens", "padding_tokens")} == {
        "rows": 4, "docs": 2, "null": 1, "empty": 1, "tokens": 5, "padding_tokens": 3
    }


def test_long_stream_is_lazy_and_endless_with_num_epochs_none(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1, 2, 3]], pa.list_(pa.int32()))}])
    ds = read_parquet(tmp_path, num_epochs=None).tokenize(None, column="input_ids", eos_id=0)
    batches = list(itertools.islice(ds.pack(seq_len=4, batch_size=1), 50))
    assert len(batches) == 50


@pytest.mark.parametrize("num_inflight", [1, 2])
def test_first_batch_waits_for_one_tokenizer_slice_only(
    tmp_path: Path, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch, num_inflight: int
) -> None:
    """Regression: a whole chunk was tokenized before the first batch could leave."""
    from arrowstream.tokenize import Tokenize

    calls = []
    original = Tokenize._encode

    def counting(self: Tokenize, chunk):
        calls.append(chunk.num_docs)
        return original(self, chunk)

    monkeypatch.setattr(Tokenize, "_encode", counting)
    texts = ["word " * 400] * 512  # 1 MB in one chunk
    write_parts(tmp_path, [{"text": texts}], row_group_size=512)
    ds = read_parquet(tmp_path, batch_rows=512, prefetch=0).tokenize(
        tokenizer, num_inflight=num_inflight, first_slice_bytes=1 << 16, slice_bytes=1 << 18
    )
    it = ds.pack(seq_len=16, batch_size=1).iter()
    next(it)
    assert len(calls) <= num_inflight  # at most the slices in flight
    assert calls[0] == 33  # the first slice is about 64 KB: 2,000-byte texts
    list(it)
    # slices grow 64 KB, 128 KB, then 256 KB each; the rest of 17 texts (under a quarter of
    # 256 KB) joins the last slice instead of making a call of its own
    assert calls == [33, 66, 132, 132, 149] and sum(calls) == 512


def test_output_does_not_depend_on_encoder_threads_or_prefetch(tmp_path: Path, tokenizer: Tokenizer) -> None:
    from arrowstream.testing.data import write_dataset

    write_dataset(tmp_path, num_files=2, docs_per_file=60, rows_per_group=25, seed=4)
    outs = set()
    for threads, prefetch in ((1, 0), (2, 2), (3, 1)):
        # small slices: many of them, so the threads really interleave
        ds = read_parquet(tmp_path, prefetch=prefetch).tokenize(
            tokenizer, num_inflight=threads, slice_bytes=2000
        )
        outs.add(b"".join(b["input_ids"].tobytes() for b in ds.pack(seq_len=32, batch_size=2)))
    assert len(outs) == 1


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_loss_mask_travels_with_the_tokens_into_labels(tmp_path: Path, strategy: str) -> None:
    docs = [[11, 12, 13, 14], [21, 22], [31, 32, 33, 34, 35]]
    masks = [[0, 0, 1, 1], [1, 0], [0, 1, 1, 0, 1]]  # say, the prompt tokens are 0
    write_parts(
        tmp_path,
        [{"input_ids": pa.array(docs, pa.list_(pa.int32())), "mask": pa.array(masks, pa.list_(pa.int8()))}],
        row_group_size=2,
    )
    ds = read_parquet(tmp_path, batch_rows=1).tokenize(None, column="input_ids", eos_id=EOS, loss_mask="mask")
    packed = ds.pack(seq_len=6, batch_size=2, strategy=strategy)
    trained: set[int] = set()
    for b in packed:
        assert_batch_consistent(b, pad_id=EOS)
        trained |= {int(t) for t in b["labels"][b["labels"] != -100] if t != EOS}
    # tokens with mask 0 never carry loss; masked-in tokens do unless they start a row piece
    assert trained <= {13, 14, 21, 32, 33, 35}
    assert {14, 33} <= trained
    assert assert_resumes_identically(packed) == sum(1 for _ in packed) >= 2


def test_loss_mask_errors_name_the_column(tmp_path: Path) -> None:
    write_parts(
        tmp_path,
        [{"input_ids": pa.array([[1, 2], [3]], pa.list_(pa.int32())), "mask": pa.array([[1, 1], [1, 0]], pa.list_(pa.int8())),
          "text": pa.array(["a", "b"])}],
        row_group_size=2,
    )
    ds = read_parquet(tmp_path)
    with pytest.raises(SchemaError, match="loss mask column `mask` has 2 values in row 1"):
        list(ds.tokenize(None, column="input_ids", eos_id=0, loss_mask="mask").pack(seq_len=4, batch_size=1))
    with pytest.raises(SchemaError, match="loss mask column `nope` is not among"):
        ds.tokenize(None, column="input_ids", eos_id=0, loss_mask="nope")
    with pytest.raises(SchemaError, match="a loss mask is a list of booleans or integers"):
        ds.tokenize(None, column="input_ids", eos_id=0, loss_mask="text")
    with pytest.raises(ConfigError, match="needs `tokenizer=None`"):
        ds.tokenize(sample_tokenizer(), loss_mask="mask")
