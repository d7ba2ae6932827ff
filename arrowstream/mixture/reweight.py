"""Changing a mixture's weights or sources on resume: a new stage from the global row the run reached.

With ``mix(..., reweight=True)``, a state saved by a mixture that differs
only in its sources, weights (stages) or caps continues with the new ones:

- the schedule gets a new stage that starts at the global row the run had
  reached (every rank's batches of the completed steps), so shares count from
  there and there is no burst of one source; the new weights' later stages
  follow at their own starts;
- sources are matched by name: a source in both goes on from its own state,
  a new source starts at its beginning, and a source left out keeps its state
  in the mixture's state (``dormant``), so adding it back later resumes it.

Other differences (row shape, strategy, seed) are still refused: they change
what every source emits.
"""

from __future__ import annotations

from typing import Any

from arrowstream.errors import StateError
from arrowstream.mixture.merge import slots_per_batch
from arrowstream.mixture.schedule import Stage, target_slots

__all__ = ["REWEIGHTABLE", "fixed_changes", "reweighted", "row_reached"]

#: The parts of a mixture's options that ``reweight=True`` lets a state change.
REWEIGHTABLE = ("sources", "stages", "max_epochs")


def fixed_changes(saved: Any, current: dict[str, Any]) -> list[str]:
    """Return the options outside :data:`REWEIGHTABLE` that differ between ``saved`` and ``current``."""
    if not isinstance(saved, dict):
        return ["mixture"]
    return sorted(k for k in set(saved) | set(current) if k not in REWEIGHTABLE and saved.get(k) != current.get(k))


def row_reached(state: dict[str, Any], rank_state: dict[str, Any] | None) -> int:
    """Return the global row the run that saved ``state`` had reached (every rank's completed steps).

    ``state`` is a consumer's or a merged state; ``rank_state`` the loader's
    rank state it came from, if any (it says how many steps the rank made).

    Raises
    ------
    StateError
        One DataLoader worker's state alone: where the run is depends on every
        worker of its rank.
    """
    if state.get("kind") == "mixture-global":
        return int(state["rows"])
    world, workers = int(state["topology"]["world_size"]), int(state["topology"]["num_workers"])
    if rank_state is not None:
        steps = sum(int(s["position"]["batches"]) for s in rank_state["states"])
    elif workers == 1:
        steps = int(state["position"]["batches"])
    else:
        raise StateError(
            "re-weighting from one DataLoader worker's state needs where its whole rank is: load the "
            "loader's rank state (`StatefulLoader.state_dict()`) or a merged state (`merge_states`)"
        )
    return int(state["position"].get("origin", 0)) + steps * world * slots_per_batch(state["mixture"])


def reweighted(
    own: dict[str, Any], row: int, names: tuple[str, ...], stages: list[Stage]
) -> dict[str, Any]:
    """Return ``own`` (what a consumer continues from) with ``stages`` from global ``row`` on and sources by ``names``.

    ``stages`` are the new weights' stages in global rows (the first from 0);
    the one in force at ``row`` starts there, later ones keep their starts.

    Examples
    --------
    >>> own = {"stages": [Stage(0, (3, 1))], "sources": {"a": {"s": 1}, "b": {"s": 2}}, "dormant": {}}
    >>> out = reweighted(own, 40, ("b", "c"), [Stage(0, (1, 1)), Stage(60, (1, 3))])
    >>> [(s.start, s.counts) for s in out["stages"]], out["sources"], out["dormant"]
    ([(40, (1, 1)), (60, (1, 3))], {'b': {'s': 2}, 'c': None}, {'a': {'s': 1}})
    >>> out["prior"]   # rows 0..39 by the old weights, 3:1
    {'a': 30.0, 'b': 10.0}
    """
    current = [s for s in stages if s.start <= row][-1]
    later = [s for s in stages if s.start > row]
    known = {**own.get("dormant", {}), **own["sources"]}
    # what the weights so far gave each source over the counters' span up to the row reached
    prior = dict(own.get("prior") or {})
    if own.get("stages"):
        old = target_slots(own["stages"], int(own.get("origin", 0)), row, before_first=not prior)
        for name, slots in zip(own["sources"], old.tolist()):
            prior[name] = prior.get(name, 0.0) + slots
    return {
        **own,
        "prior": prior,
        "stages": [Stage(row, current.counts), *later],
        "sources": {name: known.get(name) for name in names},
        "dormant": {name: st for name, st in known.items() if name not in names},
    }
