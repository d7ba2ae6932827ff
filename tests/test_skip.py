"""The opt-in skip policy: an unreadable row group is skipped, counted, warned about, and skipped the same way on resume."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from arrowstream import ConfigError, DataLossWarning, ShardError, read_parquet
from arrowstream.testing import assert_resumes_identically

from .conftest import BASE, write_named_docs, write_parts

LENGTHS = [int(n) for n in np.random.default_rng(2).integers(5, 60, size=60)]


def _corrupt(path: Path, row_group: int) -> None:
    """Scramble the data pages of one row group's column chunk (its footer stays intact)."""
    col = pq.read_metadata(path).row_group(row_group).column(0)
    data = bytearray(path.read_bytes())
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    for i in range(start + 8, start + col.total_compressed_size - 2):
        data[i] = (data[i] * 7 + 13) % 256
    path.write_bytes(bytes(data))


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = write_named_docs(tmp_path / "docs", LENGTHS, files=3, rg=5)
    _corrupt(root / "part-001.parquet", 1)
    return root


def _docs(batches: list[dict[str, Any]]) -> set[int]:
    out: set[int] = set()
    for b in batches:
        ids = b["input_ids"]
        out.update((ids[ids > 0] // BASE - 1).tolist())
    return out


def _pipeline(root: Path, **kw: Any) -> Any:
    ds = read_parquet(root, **kw).shuffle(seed=4, window=2)
    return ds.tokenize(None, column="input_ids", eos_id=0).pack(seq_len=32, batch_size=2)


def test_by_default_an_unreadable_row_group_is_a_named_error(corpus: Path) -> None:
    with pytest.raises(ShardError, match=r"part-001\.parquet', row group 1"):
        list(_pipeline(corpus))


def test_skipped_row_groups_are_counted_warned_and_nothing_else_is_lost(corpus: Path) -> None:
    it = _pipeline(corpus, on_error="skip").iter()
    with pytest.warns(DataLossWarning, match=r"skipped the unreadable row group 1 of '.*part-001\.parquet'") as caught:
        batches = list(it)
    assert {w.filename for w in caught} == {__file__}  # the warning names the user's line, not the library's
    # part-001 holds documents 20..39, five to a row group: its row group 1 is documents 25..29
    assert _docs(batches) == set(range(len(LENGTHS))) - set(range(25, 30))
    stats = it.state_dict()["stats"]
    assert stats["unreadable"] == 5 and stats["rows"] == len(LENGTHS)
    with pytest.raises(ConfigError, match="`on_error` should be 'raise' or 'skip'"):
        read_parquet(corpus, on_error="ignore")


def test_a_resume_skips_the_same_row_groups_and_yields_the_same_batches(corpus: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataLossWarning)
        assert assert_resumes_identically(lambda: _pipeline(corpus, on_error="skip", num_epochs=2)) > 0
        it = _pipeline(corpus, on_error="skip").iter()
        for _ in range(3):
            next(it)
        state = json.loads(json.dumps(it.state_dict()))
        rest = [b["input_ids"].tobytes() for b in it]
        again = [b["input_ids"].tobytes() for b in _pipeline(corpus, on_error="skip").iter(state)]
    assert again == rest


def test_the_read_ahead_reader_reads_hinted_row_groups_in_its_threads_and_warns_in_the_callers(corpus: Path) -> None:
    from arrowstream.io.manifest import read_manifest
    from arrowstream.io.readahead import ReadAhead
    from arrowstream.io.reader import ShardReader

    manifest = read_manifest(corpus)
    bad = next(i for i in range(manifest.num_shards) if manifest.shard(i).path.endswith("part-001.parquet")
               and manifest.shard(i).row_group == 1)
    plain = ShardReader(manifest, ["input_ids"])
    ahead = ReadAhead(manifest, ["input_ids"], depth=3, skip_unreadable=True)
    try:
        ahead.hint([0, 1, bad])
        assert ahead.read(0).equals(plain.read(0)) and ahead.read(1).equals(plain.read(1))
        assert not ahead._own._files, "hinted row groups were read by the pool's threads"
        with pytest.warns(DataLossWarning, match=r"row group 1 of '.*part-001\.parquet'"):
            table = ahead.read(bad)
        assert table.column("input_ids").null_count == table.num_rows == 5
        with pytest.raises(ShardError, match=r"part-001\.parquet', row group 1"):
            ReadAhead(manifest, ["input_ids"], depth=2).read(bad)  # without skip: the same error as a plain read
    finally:
        ahead.close()
        plain.close()


def test_a_dataset_none_of_whose_row_groups_decode_is_an_error_not_an_empty_stream(tmp_path: Path) -> None:
    """Counting tokens reads the row groups first: one that does not decode must not count as no token there."""
    root = write_named_docs(tmp_path / "docs", LENGTHS, files=2, rg=10)
    for path in sorted(root.glob("*.parquet")):
        for rg in range(pq.read_metadata(path).num_row_groups):
            _corrupt(path, rg)
    with pytest.raises(ShardError, match=r"part-00\d\.parquet', row group \d"):
        list(_pipeline(root))
    it = _pipeline(root, on_error="skip").iter()
    with pytest.warns(DataLossWarning, match=r"skipped the unreadable row group \d of '.*part-00\d") as caught:
        assert list(it) == []  # asked for: every row group skipped, and said (no share holds a token of them)
    assert any(str(w.message).startswith("counting tokens skipped") for w in caught)
    assert (it.stats["rows"], it.stats["unreadable"]) == (60, 60)  # and counted (no consumer read them before)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataLossWarning)
        per_rank = [_pipeline(root, on_error="skip").iter(rank=r, world_size=2) for r in range(2)]
        assert [list(it) for it in per_rank] == [[], []]
    assert sum(it.stats["unreadable"] for it in per_rank) == 60


def test_text_on_several_ranks_skips_too_estimated_batches_stay_even(tmp_path: Path, tokenizer: Any) -> None:
    """The token-rate sample of estimated even batches reads row groups first: it leaves an unreadable one out too."""
    texts = [f"document {i} " + "word " * (i % 17) for i in range(80)]
    write_parts(tmp_path, [{"text": texts[:40]}, {"text": texts[40:]}], row_group_size=10)
    _corrupt(tmp_path / "part-000.parquet", 0)  # the first row group: the sample's first pick
    for strategy in ("concat", "best_fit"):
        steps, unreadable, docs = [], 0, 0
        for rank in range(2):
            it = read_parquet(tmp_path, on_error="skip").tokenize(tokenizer).pack(
                seq_len=32, batch_size=2, strategy=strategy).iter(rank=rank, world_size=2)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DataLossWarning)
                steps.append(sum(1 for _ in it))
            unreadable += it.stats["unreadable"]
            docs += it.stats["docs"]
        assert len(set(steps)) == 1 and steps[0] > 0 and (unreadable, docs) == (10, 70), strategy



@pytest.mark.filterwarnings("always::arrowstream.DataLossWarning")  # the command prints it: asserted below
def test_the_stream_command_skips_unreadable_row_groups_when_asked(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from arrowstream.cli import main
    from arrowstream.testing.data import make_texts

    write_parts(tmp_path / "d", [{"text": make_texts(40, seed=1)}], row_group_size=10)
    _corrupt(tmp_path / "d" / "part-000.parquet", 1)
    common = ["stream", str(tmp_path / "d"), "--tokenizer", str(tokenizer_path), "--seq-len", "64", "--batch-size", "2"]
    assert main(common) != 0
    assert "row group 1" in capsys.readouterr().err
    assert main([*common, "--on-error", "skip"]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"warning: skipped the unreadable row group 1 of '.*part-000\.parquet' \(10 rows", err), err
    assert "unreadable" in out, out


@pytest.mark.filterwarnings("ignore::arrowstream.DataLossWarning")  # the skip's own warning, asserted elsewhere
def test_analyze_names_an_unreadable_row_group_or_leaves_it_out_listed(corpus: Path) -> None:
    # polars reads the files itself: a corrupt row group was an error naming the file alone, and could not be skipped
    from arrowstream.analysis import analyze

    with pytest.raises(ShardError, match=r"part-001\.parquet', row group 1, .*pass on_error=\"skip\" to leave"):
        analyze(corpus, column="input_ids")
    a = analyze(corpus, column="input_ids", on_error="skip")
    assert a.info["unreadable_row_groups"] == [{"file": "part-001.parquet", "row_group": 1}]
    assert (a.info["unreadable_rows"], a.info["num_docs"], a.info["null_or_empty"]) == (5, 55, 0)
    run = read_parquet(corpus, on_error="skip").tokenize(None, column="input_ids", add_eos=False).iter()
    lengths = sorted(len(ids) + 1 for b in run for ids in b.column("input_ids").to_pylist())  # analyze counts an EOS
    tokens = a.summary.filter(a.summary["measure"] == "tokens").row(0, named=True)
    assert tokens["num_docs"] == len(lengths) and tokens["p100"] == lengths[-1] and tokens["p0"] == lengths[0]


@pytest.mark.filterwarnings("always::arrowstream.DataLossWarning")  # the command prints it
def test_the_analyze_command_leaves_unreadable_row_groups_out_when_asked(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from arrowstream.cli import main
    from arrowstream.testing.data import make_texts

    write_parts(tmp_path / "d", [{"text": make_texts(40, seed=1)}], row_group_size=10)
    _corrupt(tmp_path / "d" / "part-000.parquet", 1)
    common = ["analyze", str(tmp_path / "d"), "--tokenizer", str(tokenizer_path)]
    assert main(common) != 0
    err = capsys.readouterr().err
    assert "row group 1" in err and "pass --on-error skip to leave" in err, err
    assert main([*common, "--on-error", "skip"]) == 0
    out = capsys.readouterr().out
    assert "left out, unreadable: 1 row group(s), 10 rows (part-000.parquet row group 1)" in out, out
    assert "30 documents" in out, out
