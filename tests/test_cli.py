"""The command line: inspect, stream with save and resume, demo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from arrowstream.cli import main

from .conftest import write_parts


def test_inspect_prints_files_row_groups_rows_and_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_parts(tmp_path, [{"text": ["a"] * 5}, {"text": ["b"] * 3}], row_group_size=2)
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "part-000.parquet" in out and "part-001.parquet" in out
    total = [line for line in out.splitlines() if line.startswith("total")][0].split()
    assert total[1:3] == ["5", "8"]  # 3 + 2 row groups, 8 rows
    assert "text: string" in out


def test_inspect_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_parts(tmp_path, [{"text": ["a"] * 5}], row_group_size=2)
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_rows"] == 5 and info["files"][0]["row_groups"] == 3
    assert info["schema"] == {"text": "string"}


def test_errors_print_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "does not exist" in err


def test_stream_saves_and_resumes(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from arrowstream.testing.data import write_dataset

    write_dataset(tmp_path / "data", num_files=2, docs_per_file=50, rows_per_group=20)
    common = ["stream", str(tmp_path / "data"), "--tokenizer", str(tokenizer_path),
              "--seq-len", "64", "--batch-size", "2"]
    state = tmp_path / "state.json"
    assert main([*common, "--max-batches", "5", "--save-state", str(state)]) == 0
    saved = json.loads(state.read_text())
    assert saved["stats"]["batches"] == 5 and saved["stats"]["tokens"] == 5 * 2 * 64
    capsys.readouterr()
    assert main([*common, "--resume", str(state), "--max-batches", "3", "--save-state", str(state)]) == 0
    out = capsys.readouterr().out
    assert "3 batches, 384 tokens" in out
    assert json.loads(state.read_text())["stats"]["batches"] == 8


def test_demo_runs_offline_and_reports_a_matching_resume(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "arrowstream", "demo", "--workdir", str(tmp_path), "--batches", "10",
         "--seq-len", "256", "--batch-size", "2"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "resumed stream matches the uninterrupted one: True (5/5 batches identical)" in proc.stdout
    assert (tmp_path / "state.json").exists()
    assert "tokens/s" in proc.stdout


@pytest.mark.parametrize(("batches", "shown"), [("1", "(0/0 batches"), ("400", "the end of the data")])
def test_the_demo_at_both_ends_of_its_batch_count(
    tmp_path: Path, batches: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # one batch said the resume DIFFERED (a limit of 0 still took a batch); more batches than the data crashed
    assert main(["demo", "--workdir", str(tmp_path), "--batches", batches, "--seq-len", "2048", "--batch-size", "16"]) == 0
    out = capsys.readouterr().out
    assert "resumed stream matches the uninterrupted one: True" in out and shown in out, out


def test_version_and_help() -> None:
    assert main(["--version"]) == 0
    assert main([]) == 1


def test_pretokenized_data_needs_no_tokenizer_for_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_parts(tmp_path, [{"input_ids": pa.array([[1, 2]], pa.list_(pa.int32()))}])
    assert main(["inspect", str(tmp_path)]) == 0
    assert "input_ids: list<item: int32>" in capsys.readouterr().out


def test_stream_reports_unusable_state_files_cleanly(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_parts(tmp_path / "d", [{"text": ["a b c"] * 4}])
    common = ["stream", str(tmp_path / "d"), "--tokenizer", str(tokenizer_path), "--seq-len", "4",
              "--batch-size", "1"]
    assert main([*common, "--resume", str(tmp_path / "missing.json")]) == 2
    assert "missing.json: cannot read it" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    assert main([*common, "--resume", str(tmp_path / "bad.json")]) == 2
    assert "is not JSON" in capsys.readouterr().err
    (tmp_path / "binary.json").write_bytes(b"\x00\x01PK\xa0\xff")  # a checkpoint of another kind, say
    assert main([*common, "--resume", str(tmp_path / "binary.json")]) == 2
    assert "binary.json: the file is not JSON (not UTF-8 text" in capsys.readouterr().err
    assert main([*common, "--save-state", str(tmp_path / "no" / "dir" / "s.json")]) == 2
    assert "directory does not exist" in capsys.readouterr().err


def test_stream_endless_with_max_batches(tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_parts(tmp_path / "d", [{"text": ["a b c"] * 2}])
    assert main(["stream", str(tmp_path / "d"), "--tokenizer", str(tokenizer_path), "--seq-len", "4",
                 "--batch-size", "1", "--endless", "--max-batches", "30"]) == 0
    assert "30 batches" in capsys.readouterr().out


def test_inspect_reports_schema_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a"], "n": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": ["b"], "n": ["one"]}), tmp_path / "b.parquet")
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "columns that differ between files" in out and "n: column `n` has type int64" in out
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    assert "n" in json.loads(capsys.readouterr().out)["drift"]


def test_index_cache_and_inspect_give_their_advice_in_flags(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow.parquet as pq

    for name, table in (("notext", {"body": ["a b c"]}), ("intcol", {"text": [1, 2]}), ("ok", {"text": ["hello world"]})):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table(table), tmp_path / name / "a.parquet")
    (tmp_path / "drift").mkdir()
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "drift" / "a.parquet")
    pq.write_table(pa.table({"text": ["b"], "id": [1]}), tmp_path / "drift" / "b.parquet")
    tok, cache = ["--tokenizer", str(tokenizer_path)], ["--cache", str(tmp_path / "c")]
    for command in (["index"], ["cache", *cache]):
        assert main([command[0], str(tmp_path / "notext"), *tok, *command[1:]]) == 2
        assert capsys.readouterr().err.rstrip().endswith("fix --column or the data")
        assert main([command[0], str(tmp_path / "intcol"), *tok, *command[1:]]) == 2
        assert capsys.readouterr().err.rstrip().endswith("pass the name of a text column with --column")
    import warnings

    with warnings.catch_warnings():  # printed by the command line, as a user sees it
        warnings.simplefilter("always")
        assert main(["cache", str(tmp_path / "ok"), *tok, "--cache", "/proc/nowhere"]) != 0
    err = capsys.readouterr().err
    assert "cannot write to the token cache" in err and "--cache-read-only" not in err  # `cache` has no such flag
    assert main(["inspect", str(tmp_path / "drift")]) == 0
    out = capsys.readouterr().out
    assert "read the others only (--columns)" in out and "columns=" not in out
