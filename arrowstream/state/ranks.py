"""A rank state's parts: which one a consumer (rank x DataLoader worker) loads.

A rank state (``kind: "rank"``, from :class:`~arrowstream.pytorch.StatefulLoader`
or torchdata's ``StatefulDataLoader``) holds one state per consumer of one
rank. A consumer loads its own, but is given the whole rank state: its
siblings say when files added since it was saved join (see
:mod:`arrowstream.pipeline.growth`), which every worker must agree on.

Examples
--------
>>> rank = {"kind": "rank", "states": [{"consumer": {"index": 0, "count": 2}},
...                                    {"consumer": {"index": 1, "count": 2}}]}
>>> pick_consumer(rank, 1, 2)
{'consumer': {'index': 1, 'count': 2}}
>>> whole_rank(rank, pick_consumer(rank, 1, 2)) is rank
True
>>> pick_consumer({"kind": "global"}, 1, 2)  # any other state is everyone's
{'kind': 'global'}
"""

from __future__ import annotations

from typing import Any

from arrowstream.errors import StateError
from arrowstream.state.checksum import verify_checksum

__all__ = ["epoch_of", "next_worker", "own_of_rank", "pick_consumer", "whole_rank"]


def whole_rank(state: dict[str, Any] | None, own: dict[str, Any] | None) -> dict[str, Any] | None:
    """Return the rank state ``own`` was picked from, whole (the iterator picks its own again), else ``own``."""
    return state if own is not None and state is not None and state.get("kind") == "rank" else own


def pick_consumer(state: dict[str, Any] | None, index: int, count: int) -> dict[str, Any] | None:
    """Return what consumer ``index`` of ``count`` should load from ``state``.

    Raises
    ------
    StateError
        A rank state with no state for that consumer: the topology changed.
    """
    if state is None or state.get("kind") != "rank":
        return state
    for own in state.get("states", []):
        if own.get("consumer") == {"index": index, "count": count}:
            return own
    raise StateError(
        f"this rank state has no state for consumer {index} of {count} (rank x DataLoader "
        "worker): the topology changed; merge every rank's state with "
        "`arrowstream.merge_states` and load the result"
    )


def next_worker(state: dict[str, Any] | None, consumers: list[int], count: int) -> int:
    """The DataLoader worker whose batch comes first when ``state`` resumes the rank of ``consumers`` (of ``count``).

    A rank state says (``next_worker``). A merged state of the same topology
    tells it from the batches each of the rank's workers gave: they take
    turns, so after ``n`` batches of the rank worker ``n % workers`` is next
    (while none of them has run out). Otherwise the first worker.

    Examples
    --------
    >>> merged = {"kind": "global", "consumer_count": 2,
    ...           "consumers": [{"stats": {"batches": 2}}, {"stats": {"batches": 1}}]}
    >>> next_worker(merged, [0, 1], 2)   # 3 batches: worker 1 gave the third's turn back to worker 1
    1
    >>> next_worker({"kind": "rank", "states": [{}, {}], "next_worker": 1}, [0, 1], 2)
    1
    """
    if not isinstance(state, dict):
        return 0
    n = len(consumers)
    if state.get("kind") == "rank":
        return int(state.get("next_worker", 0)) if len(state.get("states") or []) == n else 0
    entries = state.get("consumers")
    if not isinstance(entries, list) or len(entries) != count:
        return 0
    if state.get("kind") == "global":
        batches = [int((entries[i].get("stats") or {}).get("batches", 0)) for i in consumers]
    elif state.get("kind") == "mixture-global" and (state.get("topology") or {}).get("num_workers") == n:
        batches = [int(entries[i].get("batches", 0)) for i in consumers]
    else:
        return 0
    return sum(batches) % n


def epoch_of(state: dict[str, Any]) -> int:
    """Return the epoch a state (own or merged) is in, 0 if it does not say (its checks report that)."""
    if state.get("kind") == "global":
        epoch = state.get("epoch")
    else:
        position = state.get("position")
        epoch = position.get("epoch") if isinstance(position, dict) else None
    return epoch if isinstance(epoch, int) else 0


def own_of_rank(state: dict[str, Any], index: int, count: int) -> dict[str, Any]:
    """Return ``consumer``'s own state from a loader's rank state, or say how to load that state."""
    verify_checksum(state)
    owns = state.get("states") or []
    here = {"index": index, "count": count}
    for own in owns:
        if isinstance(own, dict) and own.get("consumer") == here:
            return own
    held = [own.get("consumer") for own in owns if isinstance(own, dict)]
    raise StateError(
        f"this is a `StatefulLoader` state of one rank (consumers {held}), and this iterator is "
        f"consumer {index} of {count} (rank x DataLoader worker), not one of "
        "them: load it with `StatefulLoader.load_state_dict` on the same topology, or pass "
        "`arrowstream.merge_states([...every rank's state...])` to resume on any topology"
    )
