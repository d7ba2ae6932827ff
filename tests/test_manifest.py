"""Discovery: directories, globs, lists, URIs, fsspec, empty files, two writers, schema drift."""

from __future__ import annotations

import multiprocessing.context
import os
import pickle
import time
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from arrowstream import ConfigError, SchemaError, ShardError, read_manifest, read_parquet
from arrowstream.io.footerfile import KEEP_S, keep_bytes, load_bytes
from arrowstream.io.manifest import normalize_type

from .conftest import write_parts


def test_directory_is_searched_recursively_in_sorted_order(tmp_path: Path) -> None:
    write_parts(tmp_path / "b", [{"text": ["x"] * 5}], row_group_size=2)
    write_parts(tmp_path / "a", [{"text": ["y"] * 3}], row_group_size=2)
    (tmp_path / "notes.txt").write_text("not parquet")
    m = read_manifest(tmp_path)
    assert m.relpaths == ("a/part-000.parquet", "b/part-000.parquet")
    assert [(s.row_group, s.num_rows) for s in m.shards] == [(0, 2), (1, 1), (0, 2), (1, 2), (2, 1)]
    assert m.num_rows == 8 and all(s.num_bytes > 0 for s in m.shards)


def test_glob_list_file_and_uri_sources(tmp_path: Path) -> None:
    paths = write_parts(tmp_path, [{"text": ["a"]}, {"text": ["b", "c"]}])
    assert read_manifest(str(tmp_path / "*-001.parquet")).num_rows == 2
    assert read_manifest([paths[1], paths[0]]).relpaths == ("part-000.parquet", "part-001.parquet")
    assert read_manifest(paths[0]).num_rows == 1
    assert read_manifest(f"file://{tmp_path}").num_rows == 3
    assert read_manifest(str(tmp_path), filesystem=pafs.LocalFileSystem()).num_rows == 3


def test_fsspec_filesystem_is_accepted(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"text": ["a", "b"]}])
    ds = read_parquet(str(tmp_path), filesystem=fsspec.filesystem("file"))
    assert sum(b.num_rows for b in ds) == 2


def test_fingerprint_ignores_where_the_dataset_lives_but_not_its_content(tmp_path: Path) -> None:
    write_parts(tmp_path / "one", [{"text": ["a", "b"]}])
    write_parts(tmp_path / "two", [{"text": ["a", "b"]}])
    write_parts(tmp_path / "three", [{"text": ["a", "b", "c"]}])
    fps = [read_manifest(tmp_path / d).fingerprint for d in ("one", "two", "three")]
    assert fps[0] == fps[1] != fps[2]


def test_empty_files_and_empty_row_groups_are_skipped_and_counted(tmp_path: Path) -> None:
    schema = pa.schema([("text", pa.string())])
    pq.write_table(schema.empty_table(), tmp_path / "a-empty.parquet")
    with pq.ParquetWriter(tmp_path / "b.parquet", schema) as w:
        w.write_table(pa.table({"text": ["x"]}, schema=schema))
        w.write_table(schema.empty_table())
        w.write_table(pa.table({"text": ["y", "z"]}, schema=schema))
    m = read_manifest(tmp_path)
    assert m.num_files == 1 and m.num_empty_files == 1
    assert [s.num_rows for s in m.shards] == [1, 2]
    assert m.num_empty_row_groups == 1
    assert [b.column("text").to_pylist() for b in read_parquet(tmp_path)] == [["x"], ["y", "z"]]
    assert m.shard_row_group.tolist() == [0, 2] and m.shard_bytes.size == 2
    assert not {"shard_file", "shard_row_group", "shard_rows", "shard_bytes", "paths", "relpaths"} & set(m.__getstate__())
    clone = pickle.loads(pickle.dumps(m))  # the shard arrays are not pickled (32 bytes a row group): made again
    assert clone.paths == m.paths and clone.relpaths == m.relpaths and clone.shard(1).path == m.shard(1).path
    for name in ("shard_file", "shard_row_group", "shard_rows", "shard_bytes"):
        assert getattr(clone, name).tolist() == getattr(m, name).tolist() and getattr(clone, name).dtype == np.int64


def test_files_from_pyarrow_and_polars_read_alike(tmp_path: Path) -> None:
    texts = ["alpha", "beta", None, "gamma"]
    pq.write_table(pa.table({"text": texts}), tmp_path / "a.parquet")
    pl.DataFrame({"text": texts}).write_parquet(tmp_path / "b.parquet", row_group_size=2)
    ds = read_parquet(tmp_path)
    assert ds.manifest.schema == pa.schema([("text", pa.string())])
    rows = [t for b in ds for t in b.column("text").to_pylist()]
    assert rows == texts + texts


def test_sample_writers_produce_the_same_stream(tmp_path: Path) -> None:
    from arrowstream.testing.data import sample_tokenizer, write_dataset

    tok = sample_tokenizer(vocab_size=1024)
    out = []
    for writer in ("pyarrow", "polars"):
        write_dataset(tmp_path / writer, num_files=2, docs_per_file=30, rows_per_group=7, writer=writer)
        ds = read_parquet(tmp_path / writer).tokenize(tok).pack(seq_len=32, batch_size=2)
        out.append([b["input_ids"].tobytes() for b in ds])
    assert out[0] == out[1] and out[0]


def test_missing_path_is_a_shard_error(tmp_path: Path) -> None:
    with pytest.raises(ShardError, match="does not exist"):
        read_parquet(tmp_path / "nope")


def test_directory_without_parquet_is_a_shard_error(tmp_path: Path) -> None:
    with pytest.raises(ShardError, match="no Parquet files"):
        read_parquet(tmp_path)


def test_file_that_is_not_parquet_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.parquet").write_bytes(b"this is not parquet at all" * 10)
    with pytest.raises(ShardError, match="bad.parquet.*not Parquet"):
        read_parquet(tmp_path)


def test_truncated_file_names_the_file(tmp_path: Path) -> None:
    [path] = write_parts(tmp_path, [{"text": ["x" * 100] * 50}])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError, match="part-000.parquet"):
        read_parquet(tmp_path)


def test_missing_column_is_a_schema_error(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"body": ["x"]}])
    with pytest.raises(SchemaError, match="`text` is missing"):
        read_parquet(tmp_path, columns=["text"])


def test_schema_drift_names_both_files_and_the_column(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": ["a"], "n": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": ["b"], "n": ["one"]}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"body": ["c"]}), tmp_path / "c.parquet")
    pair = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    with pytest.raises(SchemaError, match=r"`n`.*a\.parquet.*b\.parquet"):
        read_manifest(pair, columns=["n"])
    with pytest.raises(SchemaError, match=r"`text`.*a\.parquet.*c\.parquet"):
        read_manifest([tmp_path / "a.parquet", tmp_path / "c.parquet"], columns=["text"])
    # selecting only the common column works
    assert read_manifest(pair, columns=["text"]).num_rows == 2


def test_drift_in_a_column_nobody_reads_does_not_matter(tmp_path: Path, tokenizer: Tokenizer) -> None:
    pq.write_table(pa.table({"text": ["a b"], "n": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": ["c"], "n": ["one"]}), tmp_path / "b.parquet")
    m = read_manifest(tmp_path)
    assert m.schema.names == ["text"] and "`n`" in m.drift["n"]
    ds = read_parquet(tmp_path)
    with pytest.raises(SchemaError, match=r"`n`.*a\.parquet.*b\.parquet.*columns="):
        ds.iter()  # reads every column, so the drift matters
    packed = ds.tokenize(tokenizer).pack(seq_len=4, batch_size=1)
    assert packed.read_columns() == ("text",)
    assert len(list(packed)) >= 1
    with pytest.raises(SchemaError, match="schema drift"):
        ds.tokenize(tokenizer, column="n")


def test_types_that_hold_the_same_values_agree_and_read_as_the_widest(tmp_path: Path, tokenizer: Tokenizer) -> None:
    """Token ids as list<int32> here and list<int64> there; a column pandas wrote all-None (type null) beside text."""
    pq.write_table(pa.table({"ids": pa.array([[1, 2, 3]] * 4, pa.list_(pa.int32())),
                             "text": pa.nulls(4, pa.null())}), tmp_path / "a.parquet", row_group_size=2)
    pq.write_table(pa.table({"ids": pa.array([[4, 5]] * 4, pa.list_(pa.int64())),
                             "text": ["one two"] * 4}), tmp_path / "b.parquet", row_group_size=2)
    m = read_manifest(tmp_path)
    assert m.drift == {} and m.schema.field("ids").type == pa.list_(pa.int64())
    assert m.schema.field("text").type == pa.string()
    ids = read_parquet(tmp_path).shuffle(seed=1, window=4).tokenize(None, column="ids", eos_id=0)
    batches = list(ids.pack(seq_len=4, batch_size=1).iter())  # 28 tokens with EOS: 7 rows of 4
    assert len(batches) == 7 and sorted(int(t) for b in batches for t in b["input_ids"].ravel()) == sorted(
        [1, 2, 3, 0] * 4 + [4, 5, 0] * 4)
    it = read_parquet(tmp_path).shuffle(seed=1, window=4).tokenize(tokenizer).pack(seq_len=8, batch_size=1).iter()
    list(it)
    assert (it.stats["null"], it.stats["docs"]) == (4, 4)  # the all-None rows are nulls, counted
    pq.write_table(pa.table({"ids": pa.array([["6"]], pa.list_(pa.string()))}), tmp_path / "c.parquet")
    with pytest.raises(SchemaError, match=r"`ids` has type list<item: int64> in '.*b\.parquet' but list<item: string>"):
        read_manifest(tmp_path, columns=["ids"])


def test_a_column_only_a_later_file_has_is_named_with_both_files(tmp_path: Path, tokenizer: Tokenizer) -> None:
    pq.write_table(pa.table({"n": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"n": [3, 4], "text": ["a", "b"]}), tmp_path / "b.parquet")
    with pytest.raises(SchemaError, match=r"`text` is in '.*b\.parquet' but missing from '.*a\.parquet'"):
        read_parquet(tmp_path).tokenize(tokenizer)
    with pytest.raises(ConfigError, match=r"`columns` should be a list of column names, got the string 'n': pass \['n'\]"):
        read_parquet(tmp_path, columns="n")


def test_selecting_columns_does_not_change_the_data_fingerprint(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"text": ["a", "b"], "n": [1, 2]}])
    assert read_manifest(tmp_path).fingerprint == read_manifest(tmp_path, columns=["text"]).fingerprint


def test_glob_star_stays_in_one_directory_and_skips_hidden(tmp_path: Path) -> None:
    for sub in ("", "sub/", ".hidden/", "_tmp/"):
        write_parts(tmp_path / sub, [{"text": ["a"]}])
    assert read_manifest(str(tmp_path / "*.parquet")).relpaths == ("part-000.parquet",)
    deep = read_manifest(str(tmp_path / "**" / "*.parquet")).relpaths
    assert deep == ("part-000.parquet", "sub/part-000.parquet")


def test_fsspec_uri_paths_give_relative_fingerprints(tmp_path: Path) -> None:
    mem = fsspec.filesystem("memory")
    for root in ("/one", "/two"):
        with mem.open(f"{root}/a.parquet", "wb") as f:
            pq.write_table(pa.table({"text": ["x", "y"]}), f)
    one = read_manifest("memory://one", filesystem=mem)
    two = read_manifest("/two", filesystem=mem)
    assert one.relpaths == two.relpaths == ("a.parquet",)
    assert one.fingerprint == two.fingerprint


def test_manifest_and_dataset_pickle(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"text": ["a", "b", "c"]}], row_group_size=2)
    ds = read_parquet(tmp_path)
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.manifest.fingerprint == ds.manifest.fingerprint
    assert [b.num_rows for b in clone] == [2, 1]


def test_normalize_type_maps_large_and_view_types() -> None:
    assert normalize_type(pa.large_string()) == pa.string()
    assert normalize_type(pa.large_list(pa.int32())) == pa.list_(pa.int32())
    assert normalize_type(pa.int64()) == pa.int64()


@pytest.mark.parametrize("view", [pa.list_view, pa.large_list_view])
def test_token_ids_written_as_list_views_read_as_lists(tmp_path: Path, view: Any) -> None:
    """A list view (some writers' output) holds the same ids: read, beside a file of plain lists, id for id."""
    pq.write_table(pa.table({"ids": pa.array([[1, 2], [3], None, [4, 5, 6]], view(pa.int32()))}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"ids": pa.array([[7], [8, 9]], pa.list_(pa.int64()))}), tmp_path / "b.parquet")
    ds = read_parquet(tmp_path).tokenize(None, column="ids", eos_id=0)
    out = [doc for b in ds.iter() for doc in b.column("input_ids").to_pylist()]
    assert out == [[1, 2, 0], [3, 0], [4, 5, 6, 0], [7, 0], [8, 9, 0]]


def test_column_sizes_come_from_the_one_footer_pass(tmp_path: Path) -> None:
    """The even-batches estimate needs per-column sizes: kept from the footers, never read again."""
    import shutil

    root = tmp_path / "d"
    write_parts(root, [{"a": list(range(10)), "text": ["x" * (i + 1) for i in range(10)]}], row_group_size=4)
    m = read_manifest(root)
    meta = pq.ParquetFile(root / "part-000.parquet").metadata
    want = [meta.row_group(i).column(1).total_uncompressed_size for i in range(meta.num_row_groups)]
    shutil.rmtree(root)  # nothing is read from here on
    assert m.column_bytes(["text"]).tolist() == want
    assert (m.column_bytes(["a", "text"]) > m.column_bytes(["text"])).all()


def test_a_broken_link_to_a_parquet_file_is_an_error_naming_it(tmp_path: Path) -> None:
    import os

    from arrowstream import read_parquet
    from arrowstream.errors import ShardError

    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "ok.parquet")
    os.symlink(tmp_path / "gone.parquet", tmp_path / "broken.parquet")
    with pytest.raises(ShardError, match=r"broken.parquet' is a symbolic link to .*gone.parquet', which does not exist"):
        read_parquet(tmp_path)
    os.remove(tmp_path / "broken.parquet")
    os.symlink(tmp_path / "ok.parquet", tmp_path / "linked.parquet")  # a working link is a file like any
    assert read_parquet(tmp_path).manifest.num_files == 2


def test_a_row_group_with_more_text_than_one_batch_holds_is_named_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # past 2 GiB of text in one row group (pyarrow's 32-bit offsets) a large_string file failed as "the file's
    # schema changed" and a string file read part of the rows, then failed in a stage check: named up front now
    # (the limit lowered here; the real one is 2 GiB)
    from arrowstream import SchemaError
    from arrowstream.io import schema

    monkeypatch.setattr(schema, "MAX_BATCH_VALUES", 1000)
    pq.write_table(pa.table({"text": pa.array(["x" * 200] * 4 + ["y" * 400] * 3, pa.large_string())}),
                   tmp_path / "big.parquet", row_group_size=4)
    it = read_parquet(tmp_path).iter()
    assert next(it).num_rows == 4  # 800 bytes: fits
    with pytest.raises(SchemaError, match=r"big.parquet', row group 1, column `text`: 1,200 bytes of values, more than one batch holds .*smaller row groups"):
        next(it)


def test_a_row_group_of_ids_is_measured_in_elements_not_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a list column's 32-bit offsets count elements: 600 int64 ids (4,800 bytes) fit a limit of 1,000, 1,200 do not
    from arrowstream import SchemaError
    from arrowstream.io import schema

    monkeypatch.setattr(schema, "MAX_BATCH_VALUES", 1000)
    ids = pa.array([list(range(200))] * 3 + [list(range(400))] * 3, pa.list_(pa.int64()))
    pq.write_table(pa.table({"input_ids": ids}), tmp_path / "ids.parquet", row_group_size=3)
    it = read_parquet(tmp_path).iter()
    assert next(it).column("input_ids").to_pylist() == [list(range(200))] * 3
    with pytest.raises(SchemaError, match=r"ids.parquet', row group 1, column `input_ids`: 1,200 list elements, more than one batch holds \(1,000 list elements"):
        next(it)


def many_footers(root: Path) -> list[Path]:
    """Three files of 150 row groups each: their footers together are far past a pipe's 64 KB."""
    parts = [{"text": [f"doc {f}-{i}" for i in range(300)], "n": list(range(300))} for f in range(3)]
    return write_parts(root, parts, row_group_size=2)


def test_a_pickled_local_dataset_leaves_its_footers_out_and_reads_the_same_ones_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spawned DataLoader worker's start() waited for the worker's imports while the footers filled the pipe."""
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", "off")  # no local file for the records: they travel in the pickle
    many_footers(tmp_path / "data")
    ds = read_parquet(tmp_path / "data")
    kept = sum(len(pickle.dumps(ds.manifest.footer(p))) for p in ds.manifest.paths)
    assert kept > 64_000
    data = pickle.dumps(ds.manifest)
    assert len(data) < 32_000, f"the pickled manifest is {len(data):,} bytes: it carries the footers"
    clone = pickle.loads(data)
    for path in ds.manifest.paths:  # read again when first asked for: the very footer discovery read
        assert clone.footer(path).to_dict() == ds.manifest.footer(path).to_dict()
    expr = pc.field("n") < 3
    assert pickle.loads(data).matching_shards(expr).tolist() == ds.manifest.matching_shards(expr).tolist()
    assert [b.to_pylist() for b in pickle.loads(pickle.dumps(ds))] == [b.to_pylist() for b in ds]


def test_a_pickled_dataset_of_many_row_groups_sends_its_file_records_through_a_local_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows, bytes and column sizes per row group, a few KB a file, filled the pipe to spawned workers too."""
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    parts = [{"text": [f"doc {f}-{i}" for i in range(1200)], "n": list(range(1200))} for f in range(3)]
    paths = write_parts(tmp_path / "data", parts, row_group_size=2)  # 600 row groups a file
    ds = read_parquet(tmp_path / "data")
    records = pickle.dumps(tuple(f.without_footer() for f in ds.manifest._files), protocol=pickle.HIGHEST_PROTOCOL)
    assert len(records) > 32_000
    data = pickle.dumps(ds)
    assert len(data) < 8_000, f"the pickled dataset is {len(data):,} bytes: it carries the files' records"
    (kept,) = (tmp_path / "cache" / "footers").glob("*.pickle")
    assert kept.read_bytes() == records

    def same(clone: Any) -> None:
        m = clone.manifest
        assert m.fingerprint == ds.manifest.fingerprint and m.paths == ds.manifest.paths
        assert [m.file_identity(i) for i in range(3)] == [ds.manifest.file_identity(i) for i in range(3)]
        assert m.column_bytes(["text"]).tolist() == ds.manifest.column_bytes(["text"]).tolist()
        assert m.shard_rows.tolist() == ds.manifest.shard_rows.tolist()
        assert [b.to_pylist() for b in clone] == [b.to_pylist() for b in ds]

    same(pickle.loads(data))
    kept.write_bytes(kept.read_bytes()[:-1] + b"?")  # changed: never unpickled; the footers are read again
    same(pickle.loads(data))
    kept.unlink()
    same(pickle.loads(data))
    pq.write_table(pa.table({"text": ["other"] * 1200, "n": list(range(1200))}), paths[1], row_group_size=3)
    with pytest.raises(ShardError, match=rf"file '{paths[1]}' changed since the dataset was opened: its Parquet footer"):
        pickle.loads(data)  # made again from the files, each footer checked against its digest


def test_a_pickled_dataset_of_many_files_carries_their_pins_compressed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file's pin (path, size, footer digest, mtime) is what the pickle grows by: compressed, some 55 bytes."""
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    deep = tmp_path / "a-corpus-with-a-long-name" / "split=train" / "language=en"
    write_parts(deep, [{"text": [f"doc {f}"], "n": [f]} for f in range(400)])
    ds = read_parquet(tmp_path / "a-corpus-with-a-long-name")
    pins = pickle.dumps(tuple(f.pin() for f in ds.manifest._files), protocol=pickle.HIGHEST_PROTOCOL)
    assert len(pins) > 400 * 150
    data = pickle.dumps(ds)
    assert len(data) < 400 * 90, f"{len(data):,} bytes pickled for 400 files"
    for kept in (tmp_path / "cache" / "footers").glob("*.pickle"):
        kept.unlink()  # the records are made again from the pins
    clone = pickle.loads(data)
    assert [clone.manifest.file_identity(i) for i in range(400)] == [ds.manifest.file_identity(i) for i in range(400)]
    assert [b.to_pylist() for b in clone] == [b.to_pylist() for b in ds]



def test_a_dataset_pickled_to_start_a_process_here_names_its_records_file_and_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spawned workers of a dataset of a few thousand files started one after another again: the pins filled the pipe."""
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    write_parts(tmp_path / "data", [{"text": [f"doc {f}"], "n": [f]} for f in range(400)])
    ds = read_parquet(tmp_path / "data")
    elsewhere = pickle.dumps(ds)  # might be read anywhere: with the pins
    multiprocessing.context.set_spawning_popen(object())  # as while `Process.start()` pickles a new process's arguments
    try:
        here = pickle.dumps(ds)
    finally:
        multiprocessing.context.set_spawning_popen(None)
    assert len(here) < 6_000 < 400 * 30 < len(elsewhere), (len(here), len(elsewhere))
    assert b"doc" not in here and b"part-00399" not in here
    clone = pickle.loads(here)
    assert clone.manifest.fingerprint == ds.manifest.fingerprint
    assert [b.to_pylist() for b in clone] == [b.to_pylist() for b in ds]
    (kept,) = (tmp_path / "cache" / "footers").glob("*.pickle")
    kept.unlink()
    with pytest.raises(ShardError, match=r"records of the dataset's 400 files, kept for this process in .*\.pickle.* gone"):
        pickle.loads(here)
    assert [b.to_pylist() for b in pickle.loads(elsewhere)] == [b.to_pylist() for b in ds]  # the pins make them again


def test_a_spawned_dataloader_worker_gets_the_dataset_by_its_records_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.utils.data import DataLoader

    from arrowstream.io import manifest as manifest_module

    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    write_parts(tmp_path / "data", [{"ids": [[f, i] for i in range(1200)]} for f in range(3)], row_group_size=2)
    ds = read_parquet(tmp_path / "data").tokenize(None, column="ids", eos_id=0).pack(seq_len=64, batch_size=4)
    sent = []
    real = manifest_module.Manifest.__getstate__

    def spied(self: Any) -> dict[str, Any]:
        state = real(self)
        sent.append((state["_files"] is None, "_kept_files" in state))
        return state

    monkeypatch.setattr(manifest_module.Manifest, "__getstate__", spied)
    loader = DataLoader(ds.to_torch(), batch_size=None, num_workers=1, multiprocessing_context="spawn")
    got = [b["input_ids"].tolist() for b in loader]
    assert sent == [(True, True)]  # the records file alone: no pins
    assert got == [b["input_ids"].tolist() for b in ds.to_torch()]

def test_kept_record_files_unused_for_a_week_are_removed_when_another_is_written(tmp_path: Path) -> None:
    where = tmp_path / "footers"
    stale, fresh, reused = (keep_bytes(data, where) for data in (b"stale", b"fresh", b"reused"))
    week_ago = time.time() - KEEP_S - 60
    (where / ".crashed-writer.tmp").write_bytes(b"half")
    for name in (stale, reused, ".crashed-writer.tmp"):
        os.utime(where / name, (week_ago, week_ago))
    assert keep_bytes(b"reused", where) == reused  # reused: it stays another week
    assert sorted(p.name for p in where.iterdir()) == sorted([stale, fresh, reused, ".crashed-writer.tmp"])
    new = keep_bytes(b"new", where)  # written: the files of a week ago go
    assert sorted(p.name for p in where.iterdir()) == sorted([fresh, reused, new])
    assert load_bytes(reused, where) == b"reused" and load_bytes(fresh, where) == b"fresh"


def test_a_file_rewritten_after_the_dataset_was_pickled_is_refused_when_its_footer_is_read_again(tmp_path: Path) -> None:
    (first, *_) = many_footers(tmp_path / "data")
    clone = pickle.loads(pickle.dumps(read_parquet(tmp_path / "data").manifest))
    pq.write_table(pa.table({"text": ["other"] * 300, "n": list(range(300))}), first, row_group_size=3)
    with pytest.raises(ShardError, match=rf"file '{first}' changed since the dataset was opened: its Parquet footer"):
        clone.footer(str(first))
