"""Filtering: vectorized expressions, counted drops, and row groups skipped by statistics."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from arrowstream import ConfigError, SchemaError, read_parquet
from arrowstream.io.reader import ShardReader

from .conftest import write_parts


def test_filter_keeps_matching_rows_and_counts_the_rest(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"n": list(range(20)), "text": [str(i) for i in range(20)]}], row_group_size=6)
    it = read_parquet(tmp_path).filter(pc.field("n") >= 5).iter()
    kept = [v for b in it for v in b.column("n").to_pylist()]
    assert kept == list(range(5, 20))
    stats = it.state_dict()["stats"]
    assert (stats["docs"], stats["filtered"]) == (15, 5)


def test_statistics_skip_row_groups_that_cannot_match(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_parts(tmp_path, [{"n": list(range(40))}], row_group_size=10)
    reads: list[int] = []
    original = ShardReader.read

    def spy(self: ShardReader, shard: int):
        reads.append(shard)
        return original(self, shard)

    monkeypatch.setattr(ShardReader, "read", spy)
    ds = read_parquet(tmp_path).filter(pc.field("n") >= 25)
    values = [v for b in ds for v in b.column("n").to_pylist()]
    assert values == list(range(25, 40))
    assert reads == [2, 3]  # row groups 0 and 1 (n < 20) were never read
    it = ds.iter()
    list(it)
    stats = it.stats
    assert (stats["pruned_rows"], stats["rows"], stats["filtered"], stats["docs"]) == (20, 20, 5, 15)
    assert ds.num_pruned_shards == 2


def test_null_filter_results_drop_the_row(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"lang": ["en", None, "de", "en"]}])
    it = read_parquet(tmp_path).filter(pc.field("lang") == "en").iter()
    assert sum(b.num_rows for b in it) == 2
    assert it.state_dict()["stats"]["filtered"] == 2


def test_filter_on_a_missing_column_is_a_schema_error(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"text": ["a"]}])
    with pytest.raises(SchemaError, match="does not apply"):
        read_parquet(tmp_path).filter(pc.field("lang") == "en")


def test_filter_needs_an_expression(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"text": ["a"]}])
    with pytest.raises(ConfigError, match="Expression"):
        read_parquet(tmp_path).filter("lang == 'en'")  # type: ignore[arg-type]


def test_filter_that_keeps_nothing_in_an_endless_stream_is_an_error(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"text": ["a", "b"]}])
    ds = read_parquet(tmp_path, num_epochs=None).filter(pc.field("text") == "zzz")
    with pytest.raises(ConfigError, match="never yield"):
        next(iter(ds))


def test_filter_after_tokenize_drops_the_rows_tokens(tmp_path: Path) -> None:
    import pyarrow as pa

    ids = pa.array([[1, 1], [2, 2, 2], [3]], pa.list_(pa.int32()))
    write_parts(tmp_path, [{"n": [1, 2, 3], "input_ids": ids}])
    ds = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0).filter(pc.field("n") != 2)
    [batch] = list(ds)
    assert batch.column("input_ids").to_pylist() == [[1, 1, 0], [3, 0]]
    [packed] = list(ds.pack(seq_len=5, batch_size=1))
    assert packed["input_ids"].tolist() == [[1, 1, 0, 3, 0]]
    assert packed["segment_ids"].tolist() == [[1, 1, 1, 2, 2]]


def test_filters_that_print_alike_have_different_identities(tmp_path: Path) -> None:
    write_parts(tmp_path, [{"n": list(range(60))}])
    a = list(range(50))
    b = list(range(50))
    b[20] = 99
    ds = read_parquet(tmp_path)
    fa, fb = ds.filter(pc.field("n").isin(a)), ds.filter(pc.field("n").isin(b))
    assert fa.options_hash != fb.options_hash
    assert fa.options_hash == ds.filter(pc.field("n").isin(list(range(50)))).options_hash


def test_filter_by_token_count_after_tokenize(tmp_path: Path) -> None:
    import pyarrow as pa

    ids = pa.array([[1, 1], [2, 2, 2, 2], [3]], pa.list_(pa.int32()))
    write_parts(tmp_path, [{"input_ids": ids}])
    ds = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0)
    long_only = ds.filter(pc.list_value_length(pc.field("input_ids")) > 3)
    it = long_only.pack(seq_len=5, batch_size=1).iter()
    assert [b["input_ids"].tolist() for b in it] == [[[2, 2, 2, 2, 0]]]
    assert it.stats["filtered"] == 2


def test_the_filter_plan_runs_in_the_calling_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # With Arrow's thread pool, a pool thread could still be releasing numpy-backed buffers
    # (taking the GIL) after the filter returned; at interpreter exit that aborted the process
    # in about 2 % of runs of a prefetching pipeline (seen with gdb). Every plan must run unthreaded.
    import pyarrow.acero as acero

    from arrowstream import filter as filter_module

    used: list[bool] = []

    class Plan:
        def __init__(self, declaration: acero.Declaration) -> None:
            self.declaration = declaration

        def to_table(self, *, use_threads: bool = True):  # noqa: ANN202
            used.append(use_threads)
            return self.declaration.to_table(use_threads=use_threads)

    class Declaration:
        def __new__(cls, *args, **kwargs):  # noqa: ANN204
            return acero.Declaration(*args, **kwargs)

        @staticmethod
        def from_sequence(declarations: list) -> Plan:
            return Plan(acero.Declaration.from_sequence(declarations))

    shim = type("acero", (), {"Declaration": Declaration, "TableSourceNodeOptions": acero.TableSourceNodeOptions,
                              "FilterNodeOptions": acero.FilterNodeOptions})
    monkeypatch.setattr(filter_module, "_acero", lambda: shim)
    write_parts(tmp_path, [{"n": list(range(30)), "input_ids": [[i + 1] for i in range(30)]}], row_group_size=10)
    ds = read_parquet(tmp_path).tokenize(None, column="input_ids", eos_id=0).filter(pc.equal(pc.bit_wise_and(pc.field("n"), 1), 0))
    got = [ids for b in ds for ids in b.column("input_ids").to_pylist()]
    assert got == [[n + 1, 0] for n in range(0, 30, 2)]
    assert used and not any(used)


def test_a_merged_state_counts_pruned_rows_once(tmp_path: Path) -> None:
    from arrowstream import merge_states

    write_parts(tmp_path, [{"n": list(range(40))}], row_group_size=10)
    ds = read_parquet(tmp_path, num_epochs=2).filter(pc.field("n") >= 25)
    its = [ds.iter(rank=r, world_size=2) for r in range(2)]
    for it in its:
        next(it)
    merged = merge_states([it.state_dict() for it in its])
    assert [it.stats["pruned_rows"] for it in its] == [20, 20]  # each reports the epoch's pruned rows
    assert merged["stats"]["pruned_rows"] == 20 and merged["stats"]["rows"] == sum(it.stats["rows"] for it in its)
