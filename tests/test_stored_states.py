"""States written by earlier versions keep loading and resuming byte for byte.

``tests/data/states-v*.json`` holds states saved by each state version on a
stored corpus, with a digest of what the stream emitted after each of them
(written once by ``tests/data/regen.py``). Each is loaded into a pipeline
rebuilt from the stored files; the rest of the stream must match the digest.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parent / "data"
_spec = importlib.util.spec_from_file_location("_regen", DATA / "regen.py")
assert _spec is not None and _spec.loader is not None
regen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(regen)


def _saved() -> list[Any]:
    out = []
    for path in sorted(DATA.glob("states-v*.json")):
        record = json.loads(path.read_text())
        for name, saved in record["saved"].items():
            case = {"pipeline": name, **record["cases"][name]}
            for entry in saved:
                out.append(pytest.param(case, entry, id=f"v{record['version']}-{name}-step{entry['step']}"))
    return out


def test_every_state_version_so_far_is_on_record() -> None:
    from arrowstream.state import STATE_VERSION

    versions = {json.loads(p.read_text())["version"] for p in DATA.glob("states-v*.json")}
    assert versions == set(range(2, STATE_VERSION + 1)), "run tests/data/regen.py for the new version"


@pytest.mark.filterwarnings("ignore::arrowstream.DataLossWarning")  # estimated cases drop in their last epoch
@pytest.mark.parametrize(("case", "entry"), _saved())
def test_a_stored_state_resumes_as_it_did_when_saved(case: dict[str, Any], entry: dict[str, Any]) -> None:
    assert regen.rest_digest(case, entry["state"]) == entry["rest"]
    if case["world"] == 1:  # and the record itself is right: the uninterrupted stream's tail
        items = regen.build(case["pipeline"]).iter()
        assert list(regen.digest(itertools.islice(items, entry["step"], None))) == entry["rest"][0]
    if "own" in case:  # one consumer of several: its own uninterrupted stream's tail
        items = regen.build(case["pipeline"]).iter(rank=case["own"], world_size=case["world"])
        assert list(regen.digest(itertools.islice(items, entry["step"], None))) == entry["rest"][0]


LONG = ("long_docs_split", "long_docs_truncated", "truncated_tokens", "tokens")


@pytest.mark.parametrize(
    ("case", "entry"),
    [p for p in _saved() if p.values[0]["world"] == 1 and p.values[0]["pipeline"] in ("best-fit-text", "best-fit-split")],
)
def test_a_stored_state_resumes_to_the_long_document_counts_of_an_uninterrupted_run(
    case: dict[str, Any], entry: dict[str, Any]
) -> None:
    # before version 10 a long document was counted when read; now when its first piece leaves. The
    # held ones of an older state were counted already, and are not counted twice
    whole = regen.build(case["pipeline"]).iter()
    for _ in whole:
        pass
    resumed = regen.build(case["pipeline"]).iter(entry["state"])
    for _ in resumed:
        pass
    assert {k: resumed.stats.get(k, 0) for k in LONG} == {k: whole.stats.get(k, 0) for k in LONG}
    assert whole.stats["long_docs_split"] > 50


def test_the_stored_carrying_states_carry() -> None:
    record = json.loads((DATA / "states-v5.json").read_text())
    for entry in record["saved"]["best-fit-text-carrying"]:
        packer = entry["state"]["packer"]
        assert packer["data_epoch"] == 0 and packer["epoch"] == 1, packer
