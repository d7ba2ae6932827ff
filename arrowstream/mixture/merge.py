"""Merging the states of every consumer of a mixture into one global state that loads on any topology.

A mixture's global state holds the global row the run has reached (every
rank's batches of every completed step), the stages in global rows, each
consumer's batch count (so the same topology continues byte for byte) and,
per source, the global state :func:`~arrowstream.distributed.topology.merge_states`
makes of that source's consumer states. Loaded on another topology, each
source re-deals the rows its consumers had left, and the schedule continues
from the global row reached: the sequence of sources by global row is the
one an uninterrupted run gives.

:func:`merge_states` here is the one the package exports: it merges a
mixture's states, and hands any other states to the single-pipeline merge.
"""

from __future__ import annotations

import copy
from typing import Any

from arrowstream.distributed import topology
from arrowstream.errors import StateError, StateMismatchError
from arrowstream.state import STATE_FORMAT, STATE_VERSION
from arrowstream.state.checksum import verify_checksum, with_checksum

__all__ = ["GLOBAL_KIND", "KIND", "merge_states", "slots_per_batch"]

#: ``kind`` of a mixture consumer's state, and of a merged one.
KIND, GLOBAL_KIND = "mixture", "mixture-global"


def merge_states(states: list[dict[str, Any]], *, drift: bool = False) -> dict[str, Any]:
    """Join the states of all consumers of one run, taken at one training step, into a global state.

    Accepts consumer states, or a loader's rank states, of a pipeline (see
    :func:`arrowstream.distributed.topology.merge_states`) or of a mixture.
    ``drift``: accept a pipeline's consumers more than one epoch apart, as
    those of an endless stream (``num_epochs=None``) or of one without even
    batches are when their shares go round at different speeds (a mixture's
    sources always may).

    Raises
    ------
    StateError
        A consumer is missing or given twice, or the ranks are not at one
        step (their batch counts differ).
    StateMismatchError
        The states come from different mixtures.

    Examples
    --------
    >>> from arrowstream import mix, read_parquet
    >>> from arrowstream.testing import example_dir
    >>> ids = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0)
    >>> m = mix({"a": ids, "b": ids}, {"a": 1, "b": 1}).pack(seq_len=4, batch_size=2)
    >>> its = [m.iter(rank=r, world_size=2) for r in range(2)]
    >>> _ = [next(it) for it in its for _ in range(3)]
    >>> merged = merge_states([it.state_dict() for it in its])
    >>> merged["kind"], merged["rows"]
    ('mixture-global', 12)
    """
    if isinstance(states, (dict, str, bytes)) or not isinstance(states, (list, tuple)):
        raise StateError(
            f"`merge_states` takes a list of states (every consumer's `state_dict()`, or every rank's "
            f"`StatefulLoader.state_dict()`), got {type(states).__name__}"
        )
    flat = [own for st in states for own in (st.get("states") or [] if _is_rank(st) else [st])]
    if not any(isinstance(st, dict) and st.get("kind") == KIND for st in flat):
        return topology.merge_states(states, drift=drift)
    return _merge_mixture(flat)


def _is_rank(state: Any) -> bool:
    return isinstance(state, dict) and state.get("kind") == "rank"


def _merge_mixture(states: list[dict[str, Any]]) -> dict[str, Any]:
    for st in states:
        verify_checksum(st)  # as saved: an edited consumer state would spread into every share
        if not isinstance(st, dict) or st.get("kind") != KIND:
            raise StateError(
                "`merge_states` got a mixture's states mixed with others: pass every consumer's state "
                "of one mixture (or its loaders' rank states)"
            )
    first = states[0]
    for key in ("mixture", "stages", "topology"):
        if any(st.get(key) != first.get(key) for st in states[1:]):
            raise StateMismatchError(f"the states disagree on `{key}`: merge the states of one run of one mixture")
    try:
        world, workers = int(first["topology"]["world_size"]), int(first["topology"]["num_workers"])
        count = world * workers
        by_index = {int(st["consumer"]["index"]): st for st in states}
        if sorted(by_index) != list(range(count)) or len(states) != count:
            seen = sorted(int(st["consumer"]["index"]) for st in states)
            raise StateError(
                f"`merge_states` needs one state per consumer 0..{count - 1} ({world} rank(s) x "
                f"{workers} worker(s)), got consumers {seen}: collect every rank's state"
            )
        origins = {int(st["position"]["origin"]) for st in states}
        batches = [int(by_index[q]["position"]["batches"]) for q in range(count)]
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"mixture state is malformed ({exc}): pass what `state_dict()` returned") from exc
    if len(origins) != 1:
        raise StateMismatchError("the states start from different global rows: merge the states of one run")
    steps = {sum(batches[r * workers : (r + 1) * workers]) for r in range(world)}
    if len(steps) != 1:
        raise StateError(
            f"the ranks are at different steps ({sorted(steps)} batches): merge the states every rank "
            "saved at one training step"
        )
    step = steps.pop()
    for q, k in enumerate(batches):  # a loader hands out its workers' batches in turn
        worker = q % workers
        if k != -(-(step - worker) // workers):
            raise StateError(
                f"consumer {q} (worker {worker}) emitted {k} batches, but its rank's {step} steps give "
                f"its worker {-(-(step - worker) // workers)}: pass the states a `StatefulLoader` saved"
            )
    slots = slots_per_batch(first["mixture"])
    names = list(first["sources"])
    stats: dict[str, int] = {}
    # each consumer's counters, and those from before the last re-deal that one of them carries (version 10)
    for counters in [st["stats"] for st in states] + [st["earlier"] for st in states if st.get("earlier")]:
        for key, value in counters.items():
            stats[key] = stats.get(key, 0) + int(value)
    return with_checksum({
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "kind": GLOBAL_KIND,
        "mixture": copy.deepcopy(first["mixture"]),
        "stages": copy.deepcopy(first["stages"]),
        "topology": copy.deepcopy(first["topology"]),
        "origin": origins.pop(),
        "step": step,
        "rows": int(first["position"]["origin"]) + step * world * slots,
        "consumers": [
            {
                "batches": k,
                "stats": by_index[q]["stats"],  # its own, for a resume on the same topology
                **({"earlier": by_index[q]["earlier"]} if by_index[q].get("earlier") else {}),
            }
            for q, k in enumerate(batches)
        ],
        "stats": stats,
        "sources": {
            name: topology.merge_states([by_index[q]["sources"][name] for q in range(count)], drift=True)
            for name in names
        },
        "dormant": {  # sources a re-weighting left out, kept for a later one
            name: topology.merge_states([by_index[q]["dormant"][name] for q in range(count)], drift=True)
            for name in first.get("dormant") or {}
        },
    })


def slots_per_batch(options: dict[str, Any]) -> int:
    """Return the schedule's slots in one consumer's batch, from a state's mixture options: its rows, or 1 when bucketed."""
    return int(options.get("batch_size", 1))
