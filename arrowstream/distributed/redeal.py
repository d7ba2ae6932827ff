"""Re-dealing a global state: what its consumers have left, pooled per epoch, and each new consumer's share.

A merged state (:func:`~arrowstream.distributed.topology.merge_states`)
loaded on the topology it was saved on gives every consumer its own state
back. On another, :func:`pools` gathers, per open epoch, the rows its
consumers had not emitted (a look-ahead packer's held documents first, one
row each, with the tokens they have left), :func:`redeal` cuts each pool
into the new consumers' shares (equal rows, or the pipeline's own cut), and
:func:`own_share` builds one new consumer's state from them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arrowstream.distributed.topology import Consumer, Deal, Fresh, Left, held_left, recut, remaining
from arrowstream.errors import StateError
from arrowstream.state import Held, Position, RowRange, Work

__all__ = ["Cut", "Pool", "own_share", "pools", "redeal"]


@dataclass(frozen=True, slots=True)
class Pool:
    """One open epoch's rows not yet emitted, pooled in consumer order (see :func:`pools`).

    ``streams`` is the epoch's ``(num_streams, by)``; ``left`` as in :class:`Deal`.
    """

    streams: tuple[int, str]
    rows: list[RowRange] = field(default_factory=list)
    left: Left = field(default_factory=dict)


def pools(state: dict[str, Any], fresh: Fresh) -> dict[int, Pool]:
    """Return, per epoch still open in a global state, its stream count and the rows left, pooled.

    The global state's ``epoch`` is the earliest epoch of any consumer. Near
    an epoch end some consumers may already be further on (one epoch, or
    several for the sources of a mixture, whose consumers drift apart):
    every epoch up to the last any consumer has begun (or was dealt, as
    ``next_work`` and ``later_work``) is pooled, from what each consumer has
    left of its own epoch and the whole shares (fresh, or dealt earlier) of
    the epochs it has not begun. Pools are in consumer order; a look-ahead
    packer's held documents come first in its consumer's rows, one row each,
    with the tokens they have left where their state recorded them.

    Raises
    ------
    ValueError
        The consumers' entries do not fit together (the caller wraps it).
    """
    epoch = int(state["epoch"])
    count = int(state["consumer_count"])
    out: dict[int, Pool] = {}

    def add(e: int, share: Work, segs: list[RowRange] | None = None) -> Pool:
        streams = (share.num_streams, share.by)
        have = out.setdefault(e, Pool(streams))
        if have.streams != streams:
            raise ValueError(f"consumers disagree on the streams of epoch {e}: {have.streams} and {streams}")
        have.rows.extend(list(share.segments) if segs is None else segs)
        return have

    entries = state["consumers"]
    dealt = [[] if e.get("next_work") is None else [e["next_work"], *(e.get("later_work") or [])] for e in entries]
    last = max(int(e["position"]["epoch"]) + len(ahead) for e, ahead in zip(entries, dealt))
    for i, (entry, ahead) in enumerate(zip(entries, dealt)):
        at = int(entry["position"]["epoch"])
        if at < epoch:
            raise ValueError(f"consumer {i} is in epoch {at}, before the state's epoch {epoch}")
        share = Work.from_dict(entry["work"])
        pool = add(at, share, [])
        rows = _left(entry, list(share.segments), left=pool.left)
        pool.rows.extend(rows)
        _still_left(pool.left, rows, share)
        for e in range(at + 1, last + 1):  # epochs it has not begun: its whole share
            k = e - at - 1
            later = Work.from_dict(ahead[k], field="next_work") if k < len(ahead) else fresh(e, Consumer(i, count))
            _still_left(add(e, later).left, list(later.segments), later)
    return out


def _still_left(left: Left, rows: list[RowRange], share: Work) -> None:
    """Add to ``left`` the rows of ``rows`` that a merge dealt as held documents (``share.left``) and nobody held since.

    A consumer's state names the documents its packer holds (exact, in
    ``left`` already); a row dealt to it as a held document that it has not
    reached keeps what the deal recorded, less what went out of it since.
    """
    recorded = {(stream, seq): (skip, tokens) for stream, seq, skip, tokens in share.left}
    for rng in rows:
        dealt, key = held_left(recorded, rng), (rng[0], rng[1])
        if dealt is not None and key not in left and rng[3] >= dealt[0]:
            left[key] = max(dealt[1] - (rng[3] - dealt[0]), 0)


def _left(entry: dict[str, Any], work: list[RowRange], *, left: Left) -> list[RowRange]:
    """Return what a consumer has not emitted of its position's epoch.

    A look-ahead packer (best-fit) holds read documents back: they come first,
    one row each (from the first token not emitted), then the rows from its
    read mark on. Each held document's tokens still to come, where recorded,
    go to ``left`` by ``(stream, seq)``.
    """
    pos = Position.from_dict(entry["position"])
    if not entry.get("held"):
        return remaining(work, pos.segment, pos.seq, pos.token_offset)
    held = Held.from_dict(entry["held"])
    out: list[RowRange] = []
    for segment, seq, skip, tokens in held.docs:
        stream, _, end, _, take = work[segment]
        if tokens >= 0:
            left[(stream, seq)] = tokens
        out.append((stream, seq, seq + 1, skip, take if seq == end - 1 else 0))
    return out + remaining(work, held.read[0], held.read[1], 0)


#: ``cut(epoch, num_streams, by, pooled, parts, left)``: a pipeline's own way to cut an epoch's
#: pooled rows into ``parts`` shares (whole batches of tokens, for a counted ``concat``), or
#: ``None``; ``left`` as in :class:`Deal`.
Cut = Callable[[int, int, str, list[RowRange], int, Left], "list[list[RowRange]] | None"]


def redeal(state: dict[str, Any], parts: int, fresh: Fresh, cut: Cut | None = None) -> dict[int, Deal]:
    """Cut every open epoch's pooled rows of a global state into ``parts`` runs.

    Runs of equal rows (:func:`recut`), unless ``cut`` cuts them its own way.
    """
    out = {}
    for e, pool in pools(state, fresh).items():
        (streams, by), pooled = pool.streams, pool.rows
        shares = None if cut is None else cut(e, streams, by, pooled, parts, pool.left)
        out[e] = Deal(streams, shares if shares is not None else recut(pooled, parts), by, pool.left)
    return out


def own_share(
    state: dict[str, Any], consumer: Consumer, fresh: Fresh, cut: Cut | None = None
) -> tuple[dict[str, Any], dict[int, Deal]]:
    """Return ``consumer``'s own state from a global one, and the deals made for it.

    With the topology the global state was merged from, that is the
    consumer's saved state (and no deal); otherwise its equal share of every
    row not yet emitted (counters restart at zero), and every consumer's
    share of each open epoch. When some consumers had already begun the next
    epoch, the share of that epoch's rows left travels as ``next_work``.
    Consumer 0 carries the merged counters as ``earlier`` (not in its own
    ``stats``), so a later merge counts them again. Check the state's
    identity first (:func:`~arrowstream.state.check_identity`): the rows are
    re-dealt over this pipeline's layout.

    Raises
    ------
    StateError
        ``state`` is not a well-formed global state.
    """
    try:
        entries = state["consumers"]
        count = int(state["consumer_count"])
        epoch = int(state["epoch"])
        if len(entries) != count:
            raise ValueError(f"{len(entries)} consumer entries for {count} consumers")
        # the same consumers split into other ranks (workers a rank) are another topology: even batches are per rank
        same = count == consumer.count and state.get("num_workers") in (None, consumer.per_rank)
        deals = {} if same else redeal(state, consumer.count, fresh, cut)
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(
            f"global state is malformed ({exc}): pass what `merge_states` returned"
        ) from exc
    common = {k: state[k] for k in ("format", "version", "dataset", "options_hash", "options")}
    me = {"index": consumer.index, "count": consumer.count}
    if same:
        entry = entries[consumer.index]
        own = {k: entry[k] for k in ("position", "work", "stats", "packer")}
        own.update({k: entry.get(k) for k in ("held", "next_work")})  # absent in version 2
        own["later_work"] = entry.get("later_work") or []
        own["epoch_stats"] = entry.get("epoch_stats", [])  # version 5 on
        if entry.get("earlier") is not None:  # version 10
            own["earlier"] = entry["earlier"]
        workers = {} if state.get("num_workers") is None else {"num_workers": state["num_workers"]}
        return {**common, **own, "consumer": me, **workers}, deals
    mine = deals[epoch].parts[consumer.index]
    first = mine[0] if mine else (0, 0, 0, 0, 0)
    out = {
        **common,
        "position": Position(epoch, 0, first[1], first[3]).to_dict(),
        "work": _share(deals[epoch], consumer.index).to_dict(),
        "consumer": me,
        "stats": {},
        "packer": {},
        "held": None,
        "next_work": None,
        "epoch_stats": [],
    }
    later = [
        _share(deals[e], consumer.index).to_dict()
        for e in range(epoch + 1, max(deals) + 1)
    ]
    out["next_work"] = later[0] if later else None
    out["later_work"] = later[1:]
    if consumer.index == 0:  # the counters so far go on in one consumer's state, so a later merge keeps them
        out["earlier"] = {"stats": _not_read_again(state), "epoch_stats": list(state.get("epoch_stats") or [])}
    return out, deals


def _not_read_again(state: dict[str, Any]) -> dict[str, int]:
    """Return a global state's counters less the held documents' rows, which the consumers they are dealt to read again."""
    stats = dict(state["stats"])
    held = sum(len((entry.get("held") or {}).get("docs") or []) for entry in state["consumers"])
    for key in ("rows", "docs"):  # counted as read; every held document is a row, and a document, read again
        if key in stats:
            stats[key] -= held
    return stats


def _share(deal: Deal, index: int) -> Work:
    """Consumer ``index``'s share of ``deal``, with what its held documents had left (for a later re-deal's estimates)."""
    part = deal.parts[index]
    left = tuple((rng[0], rng[1], rng[3], n) for rng in part if (n := held_left(deal.left, rng)) is not None)
    return Work(deal.num_streams, tuple(part), by=deal.by, left=left)
