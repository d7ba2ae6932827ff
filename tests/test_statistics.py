"""Filter pruning from the statistics the manifest kept: pyarrow's verdict, without reading a file again."""

from __future__ import annotations

import datetime as dt
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from arrowstream.io.manifest import Manifest, read_manifest
from arrowstream.io.statistics import BOUND_BYTES


def _pyarrow_on_the_files(manifest: Manifest, expr: pc.Expression) -> np.ndarray:
    """The reference: pyarrow.dataset reading each file's footer and judging its row groups."""
    keep = []
    for path in manifest.paths:
        fragment = pads.ParquetFileFormat().make_fragment(path, filesystem=manifest.filesystem)
        try:
            parts = fragment.split_by_row_group(expr, schema=fragment.physical_schema)
            keep.append({rg.id for part in parts for rg in part.row_groups})
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            keep.append(set(range(fragment.num_row_groups)))
    return np.array(
        [int(rg) in keep[int(f)] for f, rg in zip(manifest.shard_file, manifest.shard_row_group)]
    )


def _mixed_files(root: Path) -> None:
    rng = random.Random(0)
    for f in range(3):
        n = 60
        ints = [rng.randint(0, 100) if rng.random() > 0.1 else None for _ in range(n)]
        if f == 1:
            ints[:20] = [None] * 20  # two row groups all null
        table = pa.table({
            "n": pa.array(ints, pa.int64()),
            "x": pa.array([(i % 10) + 10 * f for i in range(n)]),  # floats rule nothing out (NaN)
            "lang": pa.array([rng.choice(["en", "de", None]) if i > 20 else "fr" for i in range(n)]),
            "cat": pa.array([rng.choice(["a", "b"]) for _ in range(n)]).dictionary_encode(),
            "text": pa.array([("w" * rng.randint(1, 200)) + str(i) for i in range(n)], pa.large_string()),
            "ts": pa.array([dt.datetime(2020, 1, 1) + dt.timedelta(days=i) for i in range(n)], pa.timestamp("ms")),
            "ids": pa.array([[1, 2]] * n, pa.list_(pa.int32())),
        })
        pq.write_table(table, root / f"f{f}.parquet", row_group_size=10)


EXPRESSIONS = [
    pc.field("n") > 50,
    pc.field("n") > 1000,
    pc.field("n").is_null(),
    ~pc.field("n").is_null(),
    pc.field("x") >= 20,
    pc.field("lang") == "fr",
    pc.field("lang").isin(["de"]),
    pc.field("cat") == "a",
    pc.field("text") < "x",
    pc.field("ts") > pa.scalar(dt.datetime(2020, 2, 15), pa.timestamp("ms")),
    (pc.field("n") > 90) & (pc.field("x") < 10),
    (pc.field("x") < 5) | (pc.field("lang") == "zz"),
    pc.field("missing") == 1,
    pc.list_value_length(pc.field("ids")) > 1,
]


def test_the_kept_statistics_give_pyarrow_s_verdict_on_the_files(tmp_path: Path) -> None:
    _mixed_files(tmp_path)
    manifest = read_manifest(tmp_path)
    pruned_some = 0
    for expr in EXPRESSIONS:
        expected = _pyarrow_on_the_files(manifest, expr)
        assert manifest.matching_shards(expr).tolist() == expected.tolist(), str(expr)
        pruned_some += int(not expected.all())
    assert pruned_some >= 6  # the comparison covers real pruning, not only "keep everything"


def test_pruning_reads_no_file(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    _mixed_files(tmp_path / "data")
    manifest = read_manifest(tmp_path / "data")
    shutil.rmtree(tmp_path / "data")  # a read would now fail
    mask = manifest.matching_shards(pc.field("x") >= 20)
    assert mask.tolist() == [False] * 12 + [True] * 6


def test_long_string_bounds_are_cut_and_still_hold(tmp_path: Path) -> None:
    low, high = "a" * 300, "m" * 300
    pq.write_table(pa.table({"s": [low, high, "z" * 300, "zz"]}), tmp_path / "t.parquet", row_group_size=2)
    manifest = read_manifest(tmp_path)
    table = manifest._files[0].statistics.table  # what the manifest keeps is small
    assert max(len(v) for v in table.column("s").to_pylist()) <= BOUND_BYTES
    groups = ([low, high], ["z" * 300, "zz"])
    for literal in ["a" * 299, "a" * 301, "m" * 300, "m" * 301, "n", "z" * 299]:
        for expr in (pc.field("s") > literal, pc.field("s") < literal, pc.field("s") == literal):
            kept = manifest.matching_shards(expr)
            matches = [pa.table({"s": g}).filter(expr).num_rows > 0 for g in groups]
            assert all(k for k, m in zip(kept, matches) if m), (literal, str(expr))  # never prunes a match
    assert manifest.matching_shards(pc.field("s") < "b").tolist() == [True, False]


def test_list_columns_count_their_elements_from_the_footers(tmp_path: Path) -> None:
    ids = pa.array([[1, 2, 3], [4], [], None, [5, 6], [7] * 9], pa.list_(pa.int32()))
    pq.write_table(pa.table({"ids": ids, "n": list(range(6))}), tmp_path / "t.parquet", row_group_size=3)
    manifest = read_manifest(tmp_path)
    shutil.rmtree(tmp_path)  # from the footers: nothing is read
    assert manifest.list_values("ids").tolist() == [4, 11]  # empty and null lists hold nothing
    assert manifest.list_empty_rows("ids").tolist() == [1, 1]
    assert manifest.list_values("n") is None  # not a list column


def test_a_floating_point_column_rules_nothing_out_so_nan_rows_are_kept(tmp_path: Path) -> None:
    """Bounds leave NaN out: pyarrow's own pruning drops a NaN row that ``~(x > 0.5)`` or ``x != 0.7`` keeps."""
    from arrowstream import read_parquet

    pq.write_table(pa.table({"text": list("abcdef"), "x": [0.6, 0.9, float("nan"), 0.7, 0.7, 0.7]}),
                   tmp_path / "f.parquet", row_group_size=3)
    for expr, kept in [(~(pc.field("x") > 0.5), ["c"]), (pc.field("x") != 0.7, ["a", "b", "c"]),
                       (pc.field("x") > 0.8, ["b"])]:
        assert pq.read_table(tmp_path, filters=expr).num_rows <= len(kept)  # what pyarrow gives, for the record
        ds = read_parquet(tmp_path).filter(expr)
        assert [t for b in ds for t in b.column("text").to_pylist()] == kept, str(expr)
        assert ds.num_pruned_shards == 0

