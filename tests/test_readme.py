"""The README's API tour states the real signatures and defaults."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import arrowstream
from arrowstream import BestFitPacker, BucketPacker, ConcatPacker, Dataset, Tokenize
from arrowstream.analysis import analyze

README = Path(__file__).resolve().parents[1] / "README.md"

#: the README's name -> the callables whose parameters it shows (the first that has a name wins)
TARGETS: dict[str, list[Any]] = {
    "read_parquet": [arrowstream.read_parquet],
    ".shuffle": [Dataset.shuffle],
    ".filter": [Dataset.filter],
    ".tokenize": [Tokenize.__init__],
    ".pack": [Dataset.pack, ConcatPacker.__init__, BestFitPacker.__init__],
    ".bucket": [Dataset.bucket, BucketPacker.__init__],
    "ds.iter": [Dataset.iter],
    "ds.to_torch": [Dataset.to_torch],
    "arrowstream.merge_states": [arrowstream.merge_states],
    "arrowstream.analyze": [analyze],
}


def _entries() -> list[tuple[str, str]]:
    out = []
    for line in README.read_text(encoding="utf-8").splitlines():
        m = re.match(r"- `([\w.]+)\((.*?)\)`", line)
        if m and m.group(1) in TARGETS:
            out.append((m.group(1), m.group(2)))
    return out


def _shown(params: str) -> dict[str, Any]:
    """Return the README's parameters: name -> default (``inspect.Parameter.empty`` when none shown)."""
    text = params.replace(" | ", ", ").replace(", ...", "").replace("...", "")
    node = ast.parse(f"def f({text}): pass").body[0]
    args = node.args  # type: ignore[attr-defined]
    out: dict[str, Any] = {}
    positional = args.posonlyargs + args.args
    for arg, default in zip(positional, [None] * (len(positional) - len(args.defaults)) + list(args.defaults)):
        out[arg.arg] = inspect.Parameter.empty if default is None else ast.literal_eval(default)
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        out[arg.arg] = inspect.Parameter.empty if default is None else eval(compile(ast.Expression(default), "", "eval"))
    return out


def test_the_readme_shows_every_entry_point() -> None:
    assert {name for name, _ in _entries()} == set(TARGETS)


@pytest.mark.parametrize(("name", "params"), _entries())
def test_the_readme_signature_matches_the_code(name: str, params: str) -> None:
    real: dict[str, inspect.Parameter] = {}
    for target in TARGETS[name]:
        for key, p in inspect.signature(target).parameters.items():
            if key != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                real.setdefault(key, p)
    for key, default in _shown(params).items():
        assert key in real, f"README `{name}` shows `{key}`, which the code does not take"
        if default is not inspect.Parameter.empty:
            assert real[key].default == default, f"README `{name}`: `{key}={default!r}`, code: {real[key].default!r}"


def test_the_readme_names_every_dependency_and_extra() -> None:
    pyproject = (README.parent / "pyproject.toml").read_text()  # read by hand: tomllib is 3.11+
    block = re.search(r"^dependencies = \[(.*?)\]", pyproject, re.S | re.M)
    extras = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    assert block is not None
    requirements = re.findall(r'"([^"]+)"', block.group(1))
    names = re.findall(r"^(\w+) = \[", extras, re.M)
    assert requirements and names
    setup = README.read_text(encoding="utf-8").split("## Set up", 1)[1].split("## API tour", 1)[0]
    for requirement in requirements:
        assert f"`{requirement}`" in setup, f"README's set-up section does not state `{requirement}`"
    for extra in names:
        assert f"`{extra}`" in setup, f"README's set-up section does not name the extra `{extra}`"
