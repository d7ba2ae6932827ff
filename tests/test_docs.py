"""The documentation's examples run as shown: every Python block followed by an output block.

Each ```python block that is immediately followed by a ```text or ```json block
runs in a fresh interpreter, and what it prints must be that block, exactly,
except for temporary directory names.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
