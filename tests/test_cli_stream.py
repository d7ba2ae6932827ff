"""`arrowstream stream` runs the pipeline one trains with; arguments are checked before any work."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from arrowstream import read_parquet
from arrowstream.cli import _parser, main
from arrowstream.cli.expressions import FilterSyntaxError, parse_filter

from .conftest import write_parts


def _data(root: Path, n: int = 300) -> Path:
    from arrowstream.testing.texts import make_texts

    texts = make_texts(n, seed=4)
    write_parts(root, [{"text": texts[: n // 2], "n": list(range(n // 2))},
                       {"text": texts[n // 2 :], "n": list(range(n // 2, n))}], row_group_size=25)
    return root


def _last_line(out: str, prefix: str) -> str:
    return [line for line in out.splitlines() if line.startswith(prefix)][-1]


def test_stream_runs_the_pipeline_python_builds(
    tmp_path: Path, tokenizer: Tokenizer, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, cache = _data(tmp_path / "data"), tmp_path / "cache"
    state = tmp_path / "s.json"
    assert main(["stream", str(root), "--tokenizer", str(tokenizer_path), "--strategy", "best_fit",
                 "--seq-len", "64", "--batch-size", "2", "--window", "32", "--shuffle", "3",
                 "--filter", "n >= 40 and not (n in (50, 51))", "--cache", str(cache),
                 "--save-state", str(state)]) == 0
    out = capsys.readouterr().out
    n = pc.field("n")  # `not (n in ...)` is carried down to `n not in ...`, which drops a null `n`
    ds = read_parquet(root).shuffle(3).filter((n >= 40) & (~n.isin([50, 51]) & n.is_valid()))
    ds = ds.tokenize(tokenizer, cache=str(cache)).pack(seq_len=64, batch_size=2, strategy="best_fit", window=32)
    it = ds.iter()
    batches = sum(1 for _ in it)
    assert _last_line(out, "stats:").startswith("stats: ")
    assert f"{batches:,} batches" in out
    saved = json.loads(state.read_text())
    assert saved["options_hash"] == it.state_dict()["options_hash"]  # the same pipeline, option for option
    assert saved["stats"]["filtered"] + saved["stats"]["pruned_rows"] == 42 and any(cache.rglob("*.ids"))


@pytest.mark.parametrize("strategy", ["best_fit", "bucket"])
@pytest.mark.parametrize("ramp", [True, False])
def test_no_ramp_builds_the_pipeline_with_full_windows(
    tmp_path: Path, tokenizer: Tokenizer, tokenizer_path: Path, capsys: pytest.CaptureFixture[str],
    strategy: str, ramp: bool,
) -> None:
    root, state = _data(tmp_path / "data"), tmp_path / "s.json"
    command = ["stream", str(root), "--tokenizer", str(tokenizer_path), "--strategy", strategy,
               "--seq-len", "64", "--batch-size", "2", "--window", "256", "--save-state", str(state)]
    assert main(command + ([] if ramp else ["--no-ramp"])) == 0
    ds = read_parquet(root).tokenize(tokenizer)

    def options_hash(ramp: bool) -> str:
        if strategy == "bucket":
            packed = ds.bucket(batch_size=2, window=256, max_len=64, ramp=ramp)
        else:
            packed = ds.pack(seq_len=64, batch_size=2, strategy="best_fit", window=256, ramp=ramp)
        return packed.iter().state_dict()["options_hash"]

    saved = json.loads(state.read_text())["options_hash"]
    assert saved == options_hash(ramp) and saved != options_hash(not ramp)


def test_resuming_a_finished_run_says_what_to_do(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, state = _data(tmp_path / "data", n=60), tmp_path / "s.json"
    common = ["stream", str(root), "--tokenizer", str(tokenizer_path), "--seq-len", "32", "--batch-size", "2"]
    assert main([*common, "--save-state", str(state)]) == 0
    capsys.readouterr()
    assert main([*common, "--resume", str(state), "--save-state", str(state)]) == 0
    out = capsys.readouterr().out
    assert "0 batches" in out and "hint: nothing was left to stream" in out and "--num-epochs" in out


def test_stream_continues_on_data_with_files_added_when_told(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, state = _data(tmp_path / "data", n=60), tmp_path / "s.json"
    common = ["stream", str(root), "--tokenizer", str(tokenizer_path), "--seq-len", "32", "--batch-size", "2",
              "--num-epochs", "2"]
    assert main([*common, "--max-batches", "3", "--save-state", str(state)]) == 0
    from arrowstream.testing.texts import make_texts

    write_parts(tmp_path / "more", [{}, {}, {"text": make_texts(30, seed=9), "n": list(range(60, 90))}])
    (tmp_path / "more" / "part-002.parquet").rename(root / "part-002.parquet")
    capsys.readouterr()
    assert main([*common, "--resume", str(state)]) == 2
    err = capsys.readouterr().err
    assert "1 file(s) were added since" in err and "pass --added-files next_epoch" in err
    assert "read_parquet" not in err
    assert main([*common, "--resume", str(state), "--added-files", "next_epoch", "--save-state", str(state)]) == 0
    final = json.loads(state.read_text())
    assert final["dataset"]["num_files"] == 3 and final["position"]["epoch"] == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-batches", "0"], "--max-batches: must be a whole number of at least 1, got '0'"),
        (["--max-batches", "-3"], "--max-batches: must be a whole number of at least 1, got '-3'"),
        (["--num-epochs", "2", "--endless"], "--endless: not allowed with argument --num-epochs"),
        (["--filter", "len(text) > 3"], "--filter 'len(text) > 3': `len(text)` (at character 1) compares no column"),
        (["--filter", "n >"], "--filter 'n >': invalid syntax"),
        (["--strategy", "best_fit", "--seq-len", "-"], "--seq-len: must be a whole number"),
        (["--rank", "2", "--world-size", "2"], "--rank must be in 0..1"),
        (["--cache-read-only"], "--cache-read-only needs --cache DIR"),
        (["--shuffle", "-1"], "--shuffle: must be a whole number of at least 0, got '-1'"),
        (["--window", "5"], "--window is the look-ahead of --strategy best_fit and bucket"),
        (["--no-ramp"], "--no-ramp turns off the look-ahead ramp of --strategy best_fit and bucket"),
        (["--column", "nope"], "--column nope: the data has no such column; its columns are ['text', 'n']"),
    ],
)
def test_stream_arguments_are_checked_before_any_work(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    root = _data(tmp_path / "data", n=60)
    command = ["stream", str(root), "--tokenizer", str(tokenizer_path), "--batch-size", "2", *extra]
    if "--seq-len" not in extra:
        command += ["--seq-len", "16"]
    try:
        status = main(command)
    except SystemExit as exc:  # argparse's own checks
        status = exc.code
    assert status == 2
    assert message in capsys.readouterr().err


def test_a_tokenizer_directory_is_used_through_its_tokenizer_json(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _data(tmp_path / "data", n=60)
    common = ["stream", str(root), "--seq-len", "8", "--batch-size", "1", "--max-batches", "5"]
    assert main([*common, "--tokenizer", str(tokenizer_path)]) == 0
    by_file = _last_line(capsys.readouterr().out, "stats:")
    assert main([*common, "--tokenizer", str(tokenizer_path.parent)]) == 0  # where save_pretrained wrote it
    assert _last_line(capsys.readouterr().out, "stats:") == by_file
    assert main([*common, "--tokenizer", str(root)]) == 2
    assert "is a directory without a tokenizer.json" in capsys.readouterr().err
    state = read_parquet(root).tokenize(str(tokenizer_path.parent)).pack(seq_len=8, batch_size=1).iter().state_dict()
    assert state["options_hash"] == read_parquet(root).tokenize(str(tokenizer_path)).pack(
        seq_len=8, batch_size=1).iter().state_dict()["options_hash"]  # the same tokenizer, the same pipeline


def test_analyze_refuses_an_output_it_could_not_write_before_analysing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _data(tmp_path / "data", n=60)
    t0 = time.perf_counter()
    assert main(["analyze", str(root), "--plot", str(tmp_path / "missing" / "x.png")]) == 2
    assert "--plot" in capsys.readouterr().err and time.perf_counter() - t0 < 5


@pytest.mark.parametrize(("stop", "status", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_ctrl_c_or_sigterm_saves_the_state_and_exits_quietly(
    tmp_path: Path, tokenizer_path: Path, stop: signal.Signals, status: int, word: str
) -> None:
    root, state = _data(tmp_path / "data"), tmp_path / "s.json"
    command = [sys.executable, "-m", "arrowstream", "stream", str(root), "--tokenizer", str(tokenizer_path),
               "--seq-len", "16", "--batch-size", "1", "--endless", "--save-state", str(state)]
    import threading

    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(lambda: proc.stderr.read(1), "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while "batch/s" not in "".join(seen[-400:]) and time.monotonic() < deadline:  # batches flow
        time.sleep(0.05)
    proc.send_signal(stop)
    proc.wait(timeout=60)
    reader.join(timeout=10)  # it reads stderr to its end
    proc.stdout.read()
    proc.stdout.close()
    proc.stderr.close()
    err = "".join(seen)
    assert proc.returncode == status, err[-2000:]
    assert "Traceback" not in err and f"{word} after" in err and "state saved to" in err
    saved = json.loads(state.read_text())
    batches = saved["stats"]["batches"]
    # the state continues where the interrupted run stopped
    again = subprocess.run([*command[:-3], "--resume", str(state), "--max-batches", "2", "--save-state", str(state)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(state.read_text())["stats"]["batches"] == batches + 2


def test_every_option_of_every_command_says_what_it_does() -> None:
    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings[0]} has no help"


@pytest.mark.parametrize(
    ("text", "rows"),
    [
        ("n < 3", [0, 1, 2]),
        ("3 > n", [0, 1, 2]),
        ("2 <= n < 4 or n == 9", [2, 3, 9]),
        ("n in (1, 5) or tag is None", [1, 5, 7]),
        ("tag is not None and not tag == 'b'", [0, 2, 4, 6, 8]),
        ("col(\"my n\") >= 8", [8, 9]),
        ("n > -1 and n not in [0, 1, 2, 3, 4, 5, 6, 7, 8]", [9]),
        ("tag not in ('a',)", [1, 3, 5, 9]),  # the null tag (row 7) dropped, as `tag != 'a'` drops it
        ("tag != 'a'", [1, 3, 5, 9]),
        ("not (tag in ('a',))", [1, 3, 5, 9]),  # pyarrow's ~isin kept it: a null's membership is null now
        ("not (tag not in ('a',))", [0, 2, 4, 6, 8]),  # and this kept it too
        ("tag in ('a',) or tag is None", [0, 2, 4, 6, 7, 8]),
        ("not (tag in ('a',) or n > 8)", [1, 3, 5]),  # De Morgan: tag not in ('a',) and not n > 8
        ("not (tag is None or tag in ('b',))", [0, 2, 4, 6, 8]),
        ("not (n < 2 and tag in ('a',))", [1, 2, 3, 4, 5, 6, 7, 8, 9]),  # the null tag's row: n >= 2 keeps it
    ],
)
def test_filter_conditions_select_what_they_say(text: str, rows: list[int]) -> None:
    table = pa.table({
        "n": list(range(10)),
        "tag": ["a", "b", "a", "b", "a", "b", "a", None, "a", "b"],
        "my n": list(range(10)),
    })
    assert table.filter(parse_filter(text))["n"].to_pylist() == rows


@pytest.mark.parametrize("text", ["n + 1 > 2", "n == m", "f(n)", "n is 3", "n in m", "import os"])
def test_anything_else_in_a_filter_is_refused(text: str) -> None:
    with pytest.raises(FilterSyntaxError):
        parse_filter(text)


def _python_words(text: str) -> list[str]:
    return [w for w in ("`column=`", "`columns=`", "cache_write", "state_dict()", "read_parquet") if w in text]


def test_errors_and_warnings_speak_in_flags(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _data(tmp_path / "data", n=60)
    common = ["stream", str(root), "--tokenizer", str(tokenizer_path), "--seq-len", "16", "--batch-size", "2"]
    cases = [
        ([*common, "--filter", "nope > 1"], "--filter"),
        ([*common, "--resume", str(tokenizer_path)], f"--resume {tokenizer_path}: the file is not an arrowstream state"),
        (["analyze", str(root), "--column", "nope"], "fix --column (or --by) or the data"),
        (["inspect", str(root), "--columns", "nope"], "fix --columns (or --column) or the data"),
    ]
    for command, message in cases:
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert message in err and not _python_words(err), err
    # a state of other options: the differences by flag, the one changed first
    assert main([*common, "--max-batches", "1", "--save-state", str(tmp_path / "o.json")]) == 0
    capsys.readouterr()
    assert main([*common[:-4], "--seq-len", "32", "--batch-size", "2", "--shuffle", "3", "--resume", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "--seq-len was 16, now 32" in err and "--shuffle was None" in err and not _python_words(err), err
    for command, message in [
        ([*common, "--column", "n"], "needs text (string); pass the name of a text column with --column"),
        ([*common, "--filter", "n > 'a'"], "compare each column with a value of its type"),
        (["analyze", str(root), "--json", str(tmp_path / "file" / "x.json")], "is a file, not a directory"),
    ]:
        (tmp_path / "file").write_text("x")
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert message in err and not _python_words(err), err
    # another rank's state: say which flags to pass
    state = tmp_path / "s.json"
    assert main([*common, "--rank", "1", "--world-size", "2", "--max-batches", "1", "--save-state", str(state)]) == 0
    capsys.readouterr()
    assert main([*common, "--resume", str(state)]) == 2
    err = capsys.readouterr().err
    assert "pass the --rank and --world-size the state was saved with" in err and not _python_words(err), err
    assert "merge_states" not in err
    # a cache the storage refuses: the warning names the flag
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # as outside the test suite: shown, not raised
        assert main([*common, "--max-batches", "1", "--cache", str(blocker / "cache")]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "--cache-read-only" in err and not _python_words(err), err


def test_analyze_refuses_a_figure_format_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _data(tmp_path / "data", n=60)
    t0 = time.perf_counter()
    assert main(["analyze", str(root), "--plot", str(tmp_path / "x.txt")]) == 2
    err = capsys.readouterr().err
    assert f"--plot {tmp_path / 'x.txt'}: a figure is written as .png, .pdf, .svg" in err
    assert time.perf_counter() - t0 < 5  # before any analysis


def test_a_cache_command_that_cannot_write_fails_naming_the_flag(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _data(tmp_path / "data", n=60)
    (tmp_path / "file").write_text("x")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        status = main(["cache", str(root), "--tokenizer", str(tokenizer_path), "--cache", str(tmp_path / "file" / "c")])
    assert status == 2
    err = capsys.readouterr().err
    assert "could not write the token cache" in err and "--cache must be a directory you can write to" in err


def test_a_mistyped_argument_prints_one_line_and_where_help_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["stream", str(tmp_path), "--tokenizer", "t.json", "--batch-size", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "arrowstream stream: error: argument --batch-size: must be a whole number of at least 1, got '0' "
        "(see arrowstream stream --help)"
    ]


def test_a_mixture_file_streams_and_reports_from_the_command_line(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _data(tmp_path / "data", n=200)
    spec = {
        "sources": {"low": {"path": "data", "filter": "n < 100"}, "high": {"path": "data", "filter": "n >= 100"}},
        "weights": {"low": 3, "high": 1},
        "max_epochs": {"high": 1},
        "num_tokens": 16 * 4 * 30,
    }
    (tmp_path / "mix.json").write_text(json.dumps(spec))
    mix_file = str(tmp_path / "mix.json")
    assert main(["analyze", "--mixture", mix_file, "--tokenizer", str(tokenizer_path), "--seq-len", "16"]) == 0
    out = capsys.readouterr().out
    assert "a run of 1,920 tokens" in out and "low" in out and "1,440 tokens" in out and "high" in out
    # a budget the cap cannot give: flagged, and the status says so (a check CI can run)
    assert main(["analyze", "--mixture", mix_file, "--tokenizer", str(tokenizer_path), "--seq-len", "16",
                 "--tokens", str(10**7)]) == 1
    out, err = capsys.readouterr()
    assert "high" in out and "<- runs out" in out and "error: high run(s) out before the budget" in err
    state = tmp_path / "s.json"
    common = ["stream", "--mixture", mix_file, "--tokenizer", str(tokenizer_path), "--seq-len", "16", "--batch-size", "4"]
    assert main([*common, "--max-batches", "10", "--save-state", str(state)]) == 0
    assert main([*common, "--resume", str(state), "--save-state", str(state)]) == 0
    out = capsys.readouterr().out
    assert "20 batches" in out  # the budget: 30 steps in all
    stats = _last_line(out, "stats")
    assert "batches=30" in stats and "low.rows=90" in stats and "high.rows=30" in stats
    low, high = [line.split() for line in out.splitlines() if line.startswith(("  low ", "  high "))][-2:]
    assert low[-1] == "0.7500" and high[-1] == "0.2500", "each source's target share is printed"
    assert float(low[-3]) > 0.5 and high[5] == "epoch" and high[6] == "0"
    # the same mixture in Python gives the same state
    from arrowstream import mix

    src = {name: read_parquet(root).filter(cond).tokenize(str(tokenizer_path))
           for name, cond in (("low", pc.field("n") < 100), ("high", pc.field("n") >= 100))}
    it = mix(src, {"low": 3, "high": 1}, max_epochs={"high": 1}).pack(seq_len=16, batch_size=4).iter()
    for _ in range(30):
        next(it)
    assert json.loads(state.read_text())["stats"] == it.state_dict()["stats"]
    # on 2 ranks x 2 workers a consumer's share runs out before the whole source would: said, and the status is 1
    m = mix(src, {"low": 3, "high": 1}, max_epochs={"high": 1}).pack(seq_len=16, batch_size=8)
    budget = next(b for b in range(500, 10**6, 500) if m.report(b, world_size=2, num_workers=2)["runs_out"][1])
    assert not m.report(budget)["runs_out"][1]
    ask = ["analyze", "--mixture", mix_file, "--tokenizer", str(tokenizer_path), "--seq-len", "16", "--tokens", str(budget)]
    capsys.readouterr()
    assert main(ask) == 0
    assert "share" not in capsys.readouterr().out
    assert main([*ask, "--world-size", "2", "--workers", "2"]) == 1
    out = capsys.readouterr().out
    assert "on 2 rank(s) x 2 worker(s)" in out and "a consumer's share" in out and "<- runs out" in out
    assert main(["analyze", str(root), "--world-size", "2"]) == 2
    assert "--world-size and --workers go with --mixture" in capsys.readouterr().err
    # other weights: refused in the command line's words; with "reweight": true, the run goes on from there
    (tmp_path / "other.json").write_text(json.dumps({**spec, "weights": {"low": 1, "high": 1}, "num_tokens": 16 * 4 * 40}))
    other = ["stream", "--mixture", str(tmp_path / "other.json"), *common[3:], "--resume", str(state)]
    assert main(other) == 2
    err = capsys.readouterr().err
    assert "another mixture: the weights (`weights` in the mixture file) was [[0, [3, 1]]], now [[0, [1, 1]]]" in err
    assert 'set `"reweight": true` in the mixture file to go on' in err and "reweight=True" not in err
    (tmp_path / "other.json").write_text(json.dumps(
        {**spec, "weights": {"low": 1, "high": 1}, "num_tokens": 16 * 4 * 40, "reweight": True}))
    assert main(other) == 0 and "10 batches" in capsys.readouterr().out  # steps 30..39 of the new budget
    (tmp_path / "other.json").write_text(json.dumps({**spec, "reweight": "yes"}))
    assert main(other) == 2 and "`reweight` should be true or false, got 'yes'" in capsys.readouterr().err
    for extra, message in [
        (["--filter", "n > 1"], "--filter (give each source's `filter` in the file) does not apply to --mixture"),
        ([str(root)], "give PATH or --mixture FILE, not both"),
        (["--strategy", "bucket"], "--mixture with --strategy bucket takes --max-tokens N"),
        (["--max-tokens", "64"], "--max-tokens is the budget of --strategy bucket's batches; concat takes"),
    ]:
        assert main([*common, *extra]) == 2
        assert message in capsys.readouterr().err
    # the same file in YAML gives the same stream
    import yaml

    (tmp_path / "mix.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))  # sources in their order
    for name in ("mix.json", "mix.yaml"):
        main(["stream", "--mixture", str(tmp_path / name), *common[3:], "--max-batches", "5",
              "--save-state", str(tmp_path / f"{name}.state")])
    assert json.loads((tmp_path / "mix.json.state").read_text()) == json.loads((tmp_path / "mix.yaml.state").read_text())
    (tmp_path / "bad.yml").write_text("sources: [unclosed")
    assert main(["stream", "--mixture", str(tmp_path / "bad.yml"), *common[3:]]) == 2
    assert "bad.yml: the file is not YAML" in capsys.readouterr().err
    # bucketed: each batch one source's, at most --max-tokens padded tokens
    bucketed = ["stream", "--mixture", mix_file, "--tokenizer", str(tokenizer_path), "--strategy", "bucket",
                "--max-tokens", "64"]
    assert main([*bucketed, "--max-batches", "12", "--save-state", str(state)]) == 0
    saved = json.loads(state.read_text())
    assert saved["mixture"]["strategy"] == "bucket" and saved["stats"]["batches"] == 12
    assert saved["stats"]["low.segments"] > saved["stats"]["high.segments"] > 0
    assert main([*bucketed, "--batch-size", "4"]) == 2
    assert "--batch-size and --max-tokens both size the batch" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text(json.dumps({**spec, "weight": 1}))
    assert main(["stream", "--mixture", str(tmp_path / "bad.json"), *common[3:]]) == 2
    assert "unknown key(s) ['weight']" in capsys.readouterr().err


def test_a_run_with_no_batch_says_why(tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pq.write_table(pa.table({"text": ["hello world there", "another small doc"]}), tmp_path / "a.parquet")
    common = ["stream", str(tmp_path), "--tokenizer", str(tokenizer_path), "--seq-len", "8", "--batch-size", "1"]
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # the drop's DataLossWarning, printed by the command in its words
        assert main([*common, "--rank", "0", "--world-size", "3"]) == 0
    out, err = capsys.readouterr()
    assert "warning: this consumer reached its estimated batch count" in err and "`arrowstream inspect PATH" in err
    assert "hint: no batch came out: the documents this rank read were dropped at its estimated batch count" in out
    assert "--world-size 3" in out and "even_batches=False" not in out + err and "ds.balance" not in out + err
    assert main([*common, "--rank", "1", "--world-size", "3"]) == 0
    assert "hint: no batch came out: this rank read no row" in capsys.readouterr().out
    assert main([*common, "--filter", "text == 'nothing like it'"]) == 0
    assert "hint: no batch came out: this rank read no row" in capsys.readouterr().out  # pruned by the statistics


def test_membership_filters_keep_the_expressions_saved_states_were_hashed_with() -> None:
    # a state records the filter's expression: `in` and `not in` must read as they did, or --resume is refused
    tag = pc.field("tag")
    assert parse_filter("tag in ('a', 'b')").equals(tag.isin(["a", "b"]))
    assert parse_filter("tag not in ('a',)").equals(~tag.isin(["a"]) & tag.is_valid())
    assert parse_filter("not (tag == 'a')").equals(~(tag == "a"))  # a `not` over no membership test: pyarrow's `~`
