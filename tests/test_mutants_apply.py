"""Every mutant of ``tests/mutations.py`` still applies to the code it names.

A mutant whose ``old`` text no longer occurs (the code moved or was
reworded) checks nothing; the mutation script only notices when it is run by
hand. These checks read files only, so they keep every mutant current on
every test run.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

_SCRIPT = Path(__file__).resolve().parent / "mutations.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("arrowstream_test_mutations", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


_MUTATIONS = _load()
MUTANTS = _MUTATIONS.MUTANTS
ROOT: Path = _MUTATIONS.ROOT


def test_mutant_names_are_unique() -> None:
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_old_text_occurs_exactly_once(mutant) -> None:  # type: ignore[no-untyped-def]
    path = ROOT / mutant.path
    assert path.is_file(), f"{mutant.name}: {mutant.path} does not exist"
    found = path.read_text(encoding="utf-8").count(mutant.old)
    assert found == 1, (
        f"mutant {mutant.name!r}: its `old` text occurs {found} times in {mutant.path}, not once; "
        "rewrite it in tests/mutations.py to plant the same bug in the current code"
    )


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_changes_the_code_and_still_parses(mutant) -> None:  # type: ignore[no-untyped-def]
    # a mutant that breaks the syntax would be "killed" by any test, whatever the tests guard
    assert mutant.old != mutant.new, f"{mutant.name}: `old` and `new` are the same"
    text = (ROOT / mutant.path).read_text(encoding="utf-8")
    ast.parse(text.replace(mutant.old, mutant.new), filename=mutant.path)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_guarding_tests_exist(mutant) -> None:  # type: ignore[no-untyped-def]
    assert mutant.tests, f"{mutant.name}: names no tests"
    for test in mutant.tests:
        file, _, function = test.partition("::")
        path = ROOT / file
        assert path.is_file(), f"{mutant.name}: its test file {file} does not exist"
        if function:
            name = function.split("[")[0]
            assert re.search(rf"^\s*def {re.escape(name)}\(", path.read_text(encoding="utf-8"), re.M), (
                f"{mutant.name}: {file} has no test {name}"
            )


def test_a_mutant_whose_tests_hang_is_stopped_and_counted_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutant can make the code loop forever; the runner must not wait for it."""
    mutations = _load()
    (tmp_path / "test_hangs.py").write_text("import time\n\n\ndef test_hangs():\n    time.sleep(120)\n")
    monkeypatch.setattr(mutations, "_TESTS_TIMEOUT_SECONDS", 3)
    passed, summary = mutations._run_tests(tmp_path, ("test_hangs.py",))
    assert not passed and "timed out after 3 s" in summary
