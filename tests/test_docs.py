"""The documentation's examples run as shown: every Python block followed by an output block.

Each ```python block that is immediately followed by a ```text or ```json block
runs in a fresh interpreter, and what it prints must be that block, exactly,
except for temporary directory names.

The docstrings' examples read one shared table,
:func:`arrowstream.testing.example_dir`, instead of each writing its own.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "arrowstream"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLE = re.compile(r"```python\n((?:(?!```).)*?)```[ \t]*\n\s*```(?:text|json)\n(.*?)```", re.S)
TMP = re.compile(r"/tmp/tmp\w+")


def _examples() -> list:
    out = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in EXAMPLE.finditer(text):
            line = text[: match.start()].count("\n") + 1
            out.append(pytest.param(match.group(1), match.group(2), id=f"{path.name}:{line}"))
    return out


def test_the_docs_have_examples_with_output() -> None:
    assert len(_examples()) >= 20


@pytest.mark.parametrize(("code", "expected"), _examples())
def test_example_prints_what_the_docs_show(code: str, expected: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = TMP.sub("/tmp/TMP", proc.stdout).strip()
    assert got == TMP.sub("/tmp/TMP", expected).strip()


#: Modules whose docstring examples may write their own Parquet table, each with the reason.
OWN_TABLES = {
    # footer statistics of an in-memory sink, over nulls and chosen value ranges
    "arrowstream.io.statistics",
    # the token cache keeps a null text's null ids through a miss and then a hit
    "arrowstream.tokenize.cache",
}


def _docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = [tree] + [
        n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    return [doc for n in nodes if (doc := ast.get_docstring(n, clean=False))]


def _modules_writing_tables() -> set[str]:
    return {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in sorted(PACKAGE.rglob("*.py"))
        if any("write_table(" in doc for doc in _docstrings(p))
    }


def test_docstring_examples_read_the_shared_table() -> None:
    own = _modules_writing_tables() - OWN_TABLES
    assert not own, (
        f"these modules' examples write their own Parquet table: {sorted(own)}; read the shared one "
        "(`from arrowstream.testing import example_dir`, `d = example_dir()`), or add the module to "
        "`OWN_TABLES` with the reason the shared table cannot show the point"
    )


def test_the_own_tables_allowlist_is_current() -> None:
    stale = OWN_TABLES - _modules_writing_tables()
    assert not stale, (
        f"drop from `OWN_TABLES` these modules that no longer write their own table: {sorted(stale)}"
    )


def test_every_environment_variable_the_library_reads_is_in_the_guides_table() -> None:
    # a setting a user cannot find is a setting they cannot use (or cannot explain when it bites)
    guide = (ROOT / "docs" / "guide.md").read_text()
    table = guide.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    read = set()
    for path in (ROOT / "arrowstream").rglob("*.py"):
        read |= set(re.findall(r"[\"'](ARROWSTREAM_[A-Z_]+)[\"']", path.read_text()))
    assert {"ARROWSTREAM_CACHE_DIR", "ARROWSTREAM_SPARE_CPUS"} <= read  # the search finds them
    rows = {name for name in re.findall(r"^\| `(ARROWSTREAM_[A-Z_]+)`", table, flags=re.M)}
    assert read == rows, f"in the code, not the table: {sorted(read - rows)}; in the table, not the code: {sorted(rows - read)}"

