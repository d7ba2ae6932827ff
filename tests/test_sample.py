"""Tests of arrowstream.testing.data: seeded text, Parquet files and tokenizer."""

from __future__ import annotations

import doctest
import re
import string

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from arrowstream.testing import data as sample
from arrowstream.testing.data import (
    SCHEMA,
    SOURCES,
    make_texts,
    sample_tokenizer,
    train_tokenizer,
    write_dataset,
)

EOS = "<|endoftext|>"


def _row_groups(path) -> list[int]:
    meta = pq.read_metadata(path)
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def _text_bytes(paths) -> list[int]:
    return [
        pc.sum(pc.binary_length(pq.read_table(p, columns=["text"])["text"])).as_py()
        for p in paths
    ]


# -- make_texts -------------------------------------------------------------


def test_make_texts_same_seed_same_texts_other_seed_differs():
    a = make_texts(200, seed=5)
    assert a == make_texts(200, seed=5)
    b = make_texts(200, seed=6)
    assert a != b
    assert sum(x == y for x, y in zip(a, b)) == 0


def test_make_texts_count_and_empty():
    assert make_texts(0) == []
    assert len(make_texts(1)) == 1
    assert len(make_texts(1234, seed=3)) == 1234


def test_make_texts_look_like_english():
    texts = make_texts(500, seed=11)
    corpus = "\n".join(texts)
    assert all(texts) and corpus.isascii()
    assert all(text.endswith((".", "?")) for text in texts)
    assert all(text[0].isupper() or text[0].isdigit() for text in texts)
    assert all(text == text.strip() and "  " not in text for text in texts)
    for mark in (". ", ", ", "? ", ".\n\n", "?\n\n"):
        assert mark in corpus
    assert "\n\n\n" not in corpus
    # Every sentence starts with a capital (or a number).
    for start in re.findall(r"[.?](?: |\n\n)(\S)", corpus):
        assert start.isupper() or start.isdigit()
    words = re.findall(r"[A-Za-z']+|\d+", corpus)
    known = {w.lower() for w in sample._WORDS}
    assert all(w.lower() in known for w in words if not w.isdigit())
    assert any(w.isdigit() for w in words)
    # Zipf-like: "the" is the most frequent word, at a few percent.
    lower = [w.lower() for w in words]
    values, counts = np.unique(lower, return_counts=True)
    assert values[np.argmax(counts)] == "the"
    assert 0.02 < counts.max() / len(lower) < 0.1
    assert len(values) > 900  # the long tail is drawn too


def test_vocabulary_is_unique_common_words():
    assert 600 <= len(sample._WORDS) <= 1200
    assert len(set(sample._WORDS)) == len(sample._WORDS)
    allowed = set(string.ascii_letters + "'")
    assert all(word and set(word) <= allowed for word in sample._WORDS)


def test_make_texts_lengths_are_heavy_tailed_and_follow_parameters():
    lengths = np.array([len(t.split()) for t in make_texts(2000, seed=2)])
    assert lengths.min() >= 1
    assert 100 < np.median(lengths) < 220  # exp(5) ~ 148 words
    assert lengths.max() > 8 * np.median(lengths)
    short = np.array([len(t.split()) for t in make_texts(500, seed=2, mean_log_words=2.0)])
    assert np.median(short) < 15
    fixed = {len(t.split()) for t in make_texts(50, seed=2, mean_log_words=3.0, sigma_log_words=0)}
    assert fixed == {20}  # rint(exp(3))
    tiny = make_texts(20, mean_log_words=-3.0, sigma_log_words=0.5)
    assert all(len(t.split()) == 1 for t in tiny)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_docs": -1}, "num_docs"),
        ({"num_docs": 2.0}, "num_docs"),
        ({"num_docs": True}, "num_docs"),
        ({"num_docs": 1, "seed": -1}, "seed"),
        ({"num_docs": 1, "mean_log_words": float("nan")}, "mean_log_words"),
        ({"num_docs": 1, "mean_log_words": "5"}, "mean_log_words"),
        ({"num_docs": 1, "sigma_log_words": -0.5}, "sigma_log_words"),
        ({"num_docs": 1, "sigma_log_words": float("inf")}, "sigma_log_words"),
    ],
)
def test_make_texts_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        make_texts(**kwargs)


# -- write_dataset ----------------------------------------------------------


def test_write_dataset_layout_ids_and_schema(tmp_path):
    out = tmp_path / "nested" / "dir"
    paths = write_dataset(out, num_files=3, docs_per_file=250, rows_per_group=100, seed=1)
    assert paths == [out / f"part-{i:05d}.parquet" for i in range(3)]
    ids = []
    for path in paths:
        assert _row_groups(path) == [100, 100, 50]
        meta = pq.read_metadata(path)
        assert {meta.row_group(0).column(i).compression for i in range(3)} == {"SNAPPY"}
        table = pq.read_table(path)
        assert table.schema.equals(SCHEMA)
        assert table["text"].null_count == 0
        assert pc.min(pc.binary_length(table["text"])).as_py() > 0
        assert set(table["source"].to_pylist()) <= set(SOURCES)
        ids.extend(table["id"].to_pylist())
    assert ids == list(range(750))


def test_write_dataset_sources_mix_and_lengths_differ(tmp_path):
    (path,) = write_dataset(tmp_path, num_files=1, docs_per_file=4000, rows_per_group=1000)
    table = pq.read_table(path)
    values, counts = table["source"].value_counts().flatten()
    counts = dict(zip(values.to_pylist(), counts.to_pylist()))
    assert set(counts) == set(SOURCES)
    shares = {k: v / table.num_rows for k, v in counts.items()}
    for source, p in zip(SOURCES, sample._SOURCE_PROBS):
        assert abs(shares[source] - p) < 0.04
    lengths = pc.binary_length(table["text"])
    medians = {
        s: np.median(pc.filter(lengths, pc.equal(table["source"], s)).to_numpy()) for s in SOURCES
    }
    assert medians["books"] > medians["web"] > medians["code"]


def test_write_dataset_is_byte_identical_for_same_seed(tmp_path):
    kwargs = dict(num_files=2, docs_per_file=300, rows_per_group=128)
    a = write_dataset(tmp_path / "a", seed=4, **kwargs)
    b = write_dataset(tmp_path / "b", seed=4, **kwargs)
    c = write_dataset(tmp_path / "c", seed=5, **kwargs)
    for pa_, pb, pc_ in zip(a, b, c):
        assert pa_.read_bytes() == pb.read_bytes()
        assert pa_.read_bytes() != pc_.read_bytes()
    assert pq.read_table(a[0])["text"] != pq.read_table(c[0])["text"]


def test_pyarrow_and_polars_writers_give_equal_tables(tmp_path):
    kwargs = dict(num_files=2, docs_per_file=230, rows_per_group=100, seed=9)
    a = write_dataset(tmp_path / "pyarrow", writer="pyarrow", **kwargs)
    b = write_dataset(tmp_path / "polars", writer="polars", **kwargs)
    for path_a, path_b in zip(a, b):
        assert path_a.name == path_b.name
        assert _row_groups(path_a) == _row_groups(path_b) == [100, 100, 30]
        assert "polars" in pq.read_metadata(path_b).created_by.lower()
        table_a, table_b = pq.read_table(path_a), pq.read_table(path_b)
        assert table_b.schema.names == SCHEMA.names
        # polars stores large_string; the values are the same.
        assert table_a.equals(table_b.cast(SCHEMA))


def test_target_bytes_gets_close_to_target(tmp_path):
    target = 2_000_000
    paths = write_dataset(
        tmp_path, num_files=4, target_bytes=target, rows_per_group=200, docs_per_file=1, seed=2
    )
    sizes = _text_bytes(paths)
    # Each file stops at the first document that reaches its quarter.
    assert target <= sum(sizes) < target * 1.02
    for path, size in zip(paths, sizes):
        assert target // 4 <= size < target // 4 * 1.05
        groups = _row_groups(path)
        assert len(groups) > 1 and all(n == 200 for n in groups[:-1]) and 1 <= groups[-1] <= 200
    ids = pa.concat_tables(pq.read_table(p, columns=["id"]) for p in paths)["id"].to_pylist()
    assert ids == list(range(len(ids)))
    again = write_dataset(
        tmp_path / "again", num_files=4, target_bytes=target, rows_per_group=200, seed=2
    )
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in paths]


def test_target_bytes_with_polars_matches_pyarrow(tmp_path):
    kwargs = dict(num_files=2, target_bytes=200_000, rows_per_group=64, seed=3)
    a = write_dataset(tmp_path / "a", **kwargs)
    b = write_dataset(tmp_path / "b", writer="polars", **kwargs)
    for path_a, path_b in zip(a, b):
        assert _row_groups(path_a) == _row_groups(path_b)
        assert pq.read_table(path_a).equals(pq.read_table(path_b).cast(SCHEMA))


def test_tiny_target_still_writes_one_document_per_file(tmp_path):
    paths = write_dataset(tmp_path, num_files=3, target_bytes=1)
    assert [pq.read_metadata(p).num_rows for p in paths] == [1, 1, 1]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_files": 0}, "num_files"),
        ({"docs_per_file": 0}, "docs_per_file"),
        ({"rows_per_group": 0}, "rows_per_group"),
        ({"seed": -2}, "seed"),
        ({"writer": "fastparquet"}, "writer"),
        ({"target_bytes": 0}, "target_bytes"),
        ({"target_bytes": 1.5e6}, "target_bytes"),
        ({"sigma_log_words": -1.0}, "sigma_log_words"),
    ],
)
def test_write_dataset_rejects_bad_arguments(tmp_path, kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`") as info:
        write_dataset(tmp_path / "out", **kwargs)
    message = str(info.value)
    assert message[0] == "`" and ", got " in message and "; " in message
    assert not (tmp_path / "out").exists()


# -- tokenizers -------------------------------------------------------------


def test_sample_tokenizer_round_trips_and_has_eos():
    tok = sample_tokenizer()
    assert tok.get_vocab_size() == 4096
    eos_id = tok.token_to_id(EOS)
    assert eos_id is not None and tok.get_added_tokens_decoder()[eos_id].special
    odd = ["", " leading", "tabs\tand  double  spaces\n", "Ünïcödé 日本 🎉"]
    for text in make_texts(100, seed=77) + odd:
        ids = tok.encode(text).ids
        assert tok.decode(ids) == text
        assert eos_id not in ids
    assert tok.encode(EOS).ids == [eos_id]
    assert tok.decode([eos_id], skip_special_tokens=False) == EOS
    # No post-processor: nothing is added around the text.
    assert tok.encode("").ids == []
    assert len(tok.encode(" the").ids) == 1


def test_sample_tokenizer_is_cached_and_calls_are_independent():
    first = sample_tokenizer()
    assert 4096 in sample._SAMPLE_TOKENIZERS
    first.enable_truncation(3)
    second = sample_tokenizer()
    assert second is not first and second.truncation is None
    assert second.to_str() == sample._SAMPLE_TOKENIZERS[4096].to_str()


def test_train_tokenizer_options():
    tok = train_tokenizer(iter(make_texts(100, seed=1)), vocab_size=400, eos_token="</s>")
    assert tok.get_vocab_size() == 400
    assert tok.token_to_id("</s>") is not None
    assert tok.token_to_id(EOS) is None
    text = "Who knew? 1999 was, after all, a year.\n\nThe end."
    assert tok.decode(tok.encode(text).ids) == text
    again = train_tokenizer(make_texts(100, seed=1), vocab_size=400, eos_token="</s>")
    assert again.to_str() == tok.to_str()


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"vocab_size": 256}, "vocab_size"),
        ({"vocab_size": "4096"}, "vocab_size"),
        ({"eos_token": ""}, "eos_token"),
    ],
)
def test_train_tokenizer_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        train_tokenizer(["a b c"], **kwargs)


# -- docs --------------------------------------------------------------------


def test_docstring_examples_run():
    result = doctest.testmod(sample, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 4 and result.failed == 0
