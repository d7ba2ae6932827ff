"""Consumers and their share of an epoch; merging states and re-dealing them.

A *consumer* is one iterator among ``count`` (rank x DataLoader worker). A
fresh epoch is laid out with one stream per consumer (equal rows, see
:mod:`arrowstream.io.layout`) and consumer ``i`` reads stream ``i``. A consumer's
*work* is a list of segments ``(stream, start, end, skip, take)``: rows
``start..end-1`` of one of the epoch's streams, read in order, where the first
``skip`` tokens of row ``start`` were already emitted by another consumer and,
when ``take`` is not 0, only the tokens of row ``end - 1`` before ``take`` are
this consumer's (the rest are another's). A position names a segment, a row
sequence number inside its stream and a token offset.

:func:`merge_states` joins the states of all consumers into one global
checkpoint. Loading it with the same topology gives every consumer its own
state back (byte-identical continuation). With another topology the rows not
yet emitted are pooled in consumer order and cut into equal contiguous parts,
one per new consumer: every document not yet emitted in the epoch is emitted
exactly once, none twice. Near an epoch end, consumers may be one epoch apart;
then the next epoch's rows left are pooled and dealt the same way (a
consumer's ``next_work``). Later epochs start fresh with the new topology.
The re-deal itself is :mod:`arrowstream.distributed.redeal`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from arrowstream.checks import check_int
from arrowstream.errors import ConfigError, StateError, StateMismatchError
from arrowstream.io.chunk import KEPT_EPOCHS
from arrowstream.state import RowRange, Work
from arrowstream.state.checksum import verify_checksum, with_checksum

__all__ = [
    "WHOLE_RUN_COUNTERS",
    "Consumer",
    "Deal",
    "Fresh",
    "Left",
    "RowRange",
    "cut_at",
    "held_left",
    "merge_states",
    "recut",
    "remaining",
]


#: Tokens still to come of documents a look-ahead packer held, by ``(stream, seq)`` in an epoch's layout.
Left = dict[tuple[int, int], int]


def held_left(left: Mapping[tuple[int, int], Any], rng: RowRange) -> Any:
    """What ``left`` records for ``rng`` if it is a held document's row (a range of one row), else ``None``.

    Examples
    --------
    >>> held_left({(0, 7): 12}, (0, 7, 8, 40, 0)), held_left({(0, 7): 12}, (0, 7, 9, 40, 0))
    (12, None)
    """
    stream, start, end, _, _ = rng
    return left.get((stream, start)) if end == start + 1 else None


@dataclass(frozen=True, slots=True)
class Consumer:
    """One iterator's place among all: ``index`` of ``count``, ``per_rank`` consumers a rank.

    ``per_rank`` (the DataLoader workers of a rank) decides only how counted
    even batches are shared out: equal totals per rank, not per worker.

    Examples
    --------
    >>> Consumer.of(rank=1, world_size=2, worker=1, num_workers=3)
    Consumer(index=4, count=6, per_rank=3)
    """

    index: int
    count: int
    per_rank: int = 1

    @classmethod
    def of(cls, *, rank: int, world_size: int, worker: int = 0, num_workers: int = 1) -> Consumer:
        """Return the consumer for a rank and a DataLoader worker (rank-major)."""
        for key, value, low in (
            ("world_size", world_size, 1),
            ("num_workers", num_workers, 1),
            ("rank", rank, 0),
            ("worker", worker, 0),
        ):
            check_int(key, value, low=low)
        if rank >= world_size:
            raise ConfigError(f"`rank` must be below `world_size` ({world_size}), got {rank}")
        if worker >= num_workers:
            raise ConfigError(f"`worker` must be below `num_workers` ({num_workers}), got {worker}")
        return cls(rank * num_workers + worker, world_size * num_workers, num_workers)


def remaining(work: list[RowRange], segment: int, seq: int, token_offset: int) -> list[RowRange]:
    """Return the segments still to read from position ``(segment, seq, token_offset)`` on.

    Examples
    --------
    >>> remaining([(0, 0, 10, 0, 0), (3, 5, 9, 0, 0)], 0, 4, 2)
    [(0, 4, 10, 2, 0), (3, 5, 9, 0, 0)]
    >>> remaining([(0, 0, 10, 0, 0), (3, 5, 9, 0, 0)], 1, 9, 0)
    []
    >>> remaining([(0, 0, 10, 0, 7)], 0, 9, 7)   # row 9 only up to token 7, all emitted
    []
    """
    out = []
    for k, (stream, start, end, skip, take) in enumerate(work):
        if k < segment:
            continue
        lo, first = (seq, token_offset) if k == segment else (start, skip)
        if lo < end and not (take and lo == end - 1 and first >= take):
            out.append((stream, lo, end, first, take))
    return out


def recut(pool: list[RowRange], parts: int) -> list[list[RowRange]]:
    """Cut pooled segments, in order, into ``parts`` runs of (nearly) equal rows.

    A segment's ``skip`` stays with its first row and its ``take`` with its last.

    Examples
    --------
    >>> recut([(0, 4, 10, 3, 0), (1, 0, 4, 0, 2)], 2)
    [[(0, 4, 9, 3, 0)], [(0, 9, 10, 0, 0), (1, 0, 4, 0, 2)]]
    """
    total = sum(end - start for _, start, end, _, _ in pool)
    return cut_at(pool, [total * p // parts for p in range(parts + 1)])


def cut_at(pool: Sequence[RowRange], bounds: Sequence[int]) -> list[list[RowRange]]:
    """Cut pooled segments, in order, into runs between row positions ``bounds`` (counted over the whole pool).

    Run ``p`` holds the pool's rows ``bounds[p]`` to ``bounds[p + 1] - 1``;
    a segment's ``skip`` stays with its first row and its ``take`` with its last.

    Examples
    --------
    >>> cut_at([(0, 4, 10, 3, 0), (1, 0, 4, 0, 2)], [0, 2, 10])
    [[(0, 4, 6, 3, 0)], [(0, 6, 10, 0, 0), (1, 0, 4, 0, 2)]]
    """
    out: list[list[RowRange]] = [[] for _ in range(len(bounds) - 1)]
    offset = 0
    for stream, start, end, skip, take in pool:
        n = end - start
        for p in range(len(out)):
            lo, hi = max(bounds[p], offset), min(bounds[p + 1], offset + n)
            if lo < hi:
                first = skip if lo == offset else 0
                last = take if hi == offset + n else 0
                out[p].append((stream, start + lo - offset, start + hi - offset, first, last))
        offset += n
    return out


#: ``fresh(epoch, consumer)``: a consumer's share of a fresh epoch (its own stream, whole).
Fresh = Callable[[int, Consumer], Work]


@dataclass(frozen=True, slots=True)
class Deal:
    """All consumers' shares of one epoch's rows not yet emitted.

    ``num_streams`` and ``by`` are the epoch's layout the row ranges refer
    to (its stream count, and whether streams hold equal rows or tokens);
    ``parts[i]`` is consumer ``i``'s work. ``left`` gives the tokens still to
    come of the documents look-ahead packers held, by ``(stream, seq)``
    (as their states recorded them, from version 9), for estimates.
    """

    num_streams: int
    parts: list[list[RowRange]]
    by: str = "rows"
    left: Left = field(default_factory=dict)


def _common_dataset(states: list[dict[str, Any]]) -> Any:
    """Return the data identity of the consumers' states, which must be one run's.

    After files were added (see :mod:`arrowstream.pipeline.growth`), consumers
    still in an epoch cut over the old files carry the old files' identity
    (with ``until_epoch``) and those past it the whole corpus's: one step of
    one run, merged under the old identity, which says where the files join.
    """
    found: list[Any] = []
    for st in states:
        if st.get("dataset") not in found:
            found.append(st.get("dataset"))
    if len(found) == 1:
        return found[0]
    old = [d for d in found if isinstance(d, dict) and isinstance(d.get("until_epoch"), int)]
    if len(found) == 2 and len(old) == 1:
        until = old[0]["until_epoch"]
        if all(
            (st.get("dataset") == old[0]) == (int(st["position"]["epoch"]) < until) for st in states
        ):
            return old[0]
    raise StateMismatchError(
        "states disagree on `dataset`: they are not from one run; merge the states of one "
        "pipeline over one dataset"
    )


#: Counters every consumer reports for the whole run, not for its share: merged, they count once.
WHOLE_RUN_COUNTERS = ("pruned_rows",)


def _is_rank(state: Any) -> bool:
    return isinstance(state, dict) and state.get("kind") == "rank"


def merge_states(states: list[dict[str, Any]], *, drift: bool = False) -> dict[str, Any]:
    """Join the states of all consumers of one run into a global checkpoint.

    Parameters
    ----------
    states
        One ``state_dict()`` per consumer (every rank, every worker), or one
        per rank from :class:`~arrowstream.pytorch.StatefulLoader`, taken at the
        same training step.
    drift
        Accept consumers more than one epoch apart: a mixture's sources are
        read at the pace the schedule takes their rows, so consumers whose
        shares differ drift apart over many epochs. A lone pipeline's
        consumers stay within one epoch of each other, so there it means the
        states are not of one step.

    Returns
    -------
    dict
        A JSON-able global state; ``load_state_dict`` accepts it on any
        topology.

    Raises
    ------
    StateError
        A consumer is missing or given twice, or the states are not from one
        run (other data, options, topology or epoch).

    Examples
    --------
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> ds = read_parquet(example_dir(row_group_size=3))
    >>> its = [ds.iter(rank=r, world_size=2) for r in range(2)]
    >>> _ = [next(it) for it in its]
    >>> merged = merge_states([it.state_dict() for it in its])
    >>> rest = [n for b in ds.iter(merged) for n in b.column("n").to_pylist()]
    >>> sorted(rest)  # one consumer now reads what both had left
    [3, 4, 5, 9, 10, 11]
    """
    for st in states:  # as saved: an edited consumer state would spread into every share
        verify_checksum(st)
    # a loader's rank state holds one state per DataLoader worker
    states = [own for st in states for own in (st["states"] if _is_rank(st) else [st])]
    for st in states:
        verify_checksum(st)
    if not states:
        raise StateError("`merge_states` needs the states of every consumer, got none")
    for st in states:
        if not isinstance(st, dict) or "consumer" not in st or "work" not in st:
            raise StateError(
                "`merge_states` takes per-consumer states (from `state_dict()`), got "
                f"{type(st).__name__ if not isinstance(st, dict) else sorted(st)!r}"
            )
    first = states[0]
    count = first["consumer"]["count"]
    dataset = _common_dataset(states)
    for st in states[1:]:
        for key in ("version", "options_hash"):
            if st.get(key) != first.get(key):
                raise StateMismatchError(
                    f"states disagree on `{key}`: they are not from one run; merge the states "
                    "of one pipeline over one dataset"
                )
        if st["consumer"]["count"] != count:
            raise StateError(
                f"states come from topologies of {count} and {st['consumer']['count']} consumers: "
                "merge the states of one step of one run"
            )
        if st.get("num_workers") != first.get("num_workers"):
            raise StateError(
                f"states come from topologies of {first.get('num_workers') or 1} and "
                f"{st.get('num_workers') or 1} DataLoader workers a rank: merge the states of one step of one run"
            )
    seen = sorted(st["consumer"]["index"] for st in states)
    if seen != list(range(count)):
        raise StateError(
            f"`merge_states` needs one state per consumer 0..{count - 1}, got consumers {seen}: "
            "collect every rank's (and every DataLoader worker's) state"
        )
    epochs = sorted({int(st["position"]["epoch"]) for st in states})
    if epochs[-1] - epochs[0] > 1 and not drift:
        raise StateError(
            f"consumers are in epochs {epochs}, more than one apart: merge the states of one "
            "training step of one run; if they are (an endless stream, num_epochs=None, or one without "
            "even batches, whose consumers go round at different speeds; or DataLoader workers, whose "
            "shares of an epoch may hold different batch counts, as only a rank's total is even), "
            "pass `drift=True`"
        )
    ordered = sorted(states, key=lambda st: st["consumer"]["index"])
    totals: dict[str, int] = {}
    per_epoch: dict[int, dict[str, int]] = {}
    # each consumer's counters, and those from before the last re-deal that one of them carries (version 10)
    counted = [*ordered, *(st["earlier"] for st in ordered if st.get("earlier") is not None)]
    for st in counted:
        for key, value in st["stats"].items():
            if key in WHOLE_RUN_COUNTERS:  # every consumer reports the same whole-run figure: count it once
                totals[key] = max(totals.get(key, 0), int(value))
            else:
                totals[key] = totals.get(key, 0) + int(value)
        for entry in st.get("epoch_stats") or []:  # version 5 on
            row = per_epoch.setdefault(int(entry["epoch"]), {})
            for key, value in entry.items():
                if key != "epoch":
                    row[key] = row.get(key, 0) + int(value)
    # a consumer keeps its last KEPT_EPOCHS epochs: those another, further on, let go are partial here
    full = [st["epoch_stats"][0]["epoch"] for st in ordered if len(st.get("epoch_stats") or []) >= KEPT_EPOCHS]
    per_epoch = {e: row for e, row in per_epoch.items() if e >= max(full, default=0)}
    merged = {
        key: copy.deepcopy(dataset if key == "dataset" else first[key])
        for key in ("format", "version", "dataset", "options_hash", "options")
    }
    merged.update(
        {
            "kind": "global",
            "epoch": epochs[0],
            "consumer_count": count,
            **({} if first.get("num_workers") is None else {"num_workers": first["num_workers"]}),
            "consumers": [
                {
                    k: copy.deepcopy(st[k])
                    for k in (
                        "position", "work", "stats", "packer", "next_work", "later_work", "held", "epoch_stats", "earlier"
                    )
                    if k in st
                }
                for st in ordered
            ],
            "stats": totals,
            "epoch_stats": [{"epoch": e, **row} for e, row in sorted(per_epoch.items())],
        }
    )
    return with_checksum(merged)
