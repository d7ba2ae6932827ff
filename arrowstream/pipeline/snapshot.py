"""A :class:`~arrowstream.pipeline.iterator.DatasetIterator`'s state, captured now and built when asked.

:meth:`DatasetIterator.snapshot <arrowstream.pipeline.iterator.DatasetIterator.snapshot>`
keeps what moves (the packer run's own snapshot, or the position and counters
of an unpacked pipeline, and the shares dealt per epoch); :class:`IteratorSnapshot`
turns them into the state's dict: the data's identity, the options, the
position's file, row group and row, the work shares. ``state_dict()`` is a
snapshot built at once, so both give the same dict for the same position (see
:mod:`arrowstream.state.snapshot`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from arrowstream.distributed.topology import Consumer
from arrowstream.errors import ConfigError
from arrowstream.state import Position, State, Work
from arrowstream.state.checksum import with_checksum

from arrowstream.state.sealed import shared_rows
from arrowstream.state.snapshot import Snapshot

if TYPE_CHECKING:
    from arrowstream.pipeline.plan import Plan

__all__ = ["IteratorSnapshot", "where_of", "work_of"]


def work_of(plan: Plan, consumer: Consumer, deals: dict[int, Work], epoch: int) -> Work:
    """Return the layout's stream count and ``consumer``'s segments for ``epoch``: dealt, or a fresh share."""
    if epoch in deals:
        return deals[epoch]
    return plan.fresh_deal(epoch, consumer)


def where_of(plan: Plan, share: Work, pos: Position) -> dict[str, Any]:
    """Return the stream, file, row group and row that ``pos`` names, in ``share`` (``None`` past its end)."""
    work = share.segments
    none = {"stream": None, "file": None, "row_group": None, "row": None}
    if pos.segment >= len(work):
        return none
    stream, _, end, _, _ = work[pos.segment]
    if pos.seq >= end:
        return {**none, "stream": stream}
    shard, row = plan.layout(pos.epoch, share.num_streams, share.by).locate(stream, pos.seq)
    manifest = plan.at(pos.epoch).manifest
    return {
        "stream": stream,
        "file": manifest.relpaths[int(manifest.shard_file[shard])],
        "row_group": int(manifest.shard_row_group[shard]),
        "row": row,
    }


@dataclass(frozen=True, slots=True)
class IteratorSnapshot:
    """What a state needs of one iterator at one position; :meth:`to_dict` builds it.

    ``inner`` is the packer run's snapshot; without a packer, ``position`` and
    ``stats`` are the iterator's own. ``deals`` and ``known_targets`` are
    copies: a later load does not change them. Pickled, it leaves the plan
    behind (``plan`` is ``None`` once unpickled; see :meth:`with_plan`).
    """

    plan: Plan | None
    consumer: Consumer
    counters: dict[str, None]
    inner: Snapshot | None
    position: Position | None
    stats: dict[str, int] | None
    deals: dict[int, Work]
    known_targets: dict[int, int | None]
    earlier: dict[str, Any] | None = None  # counters from before a re-deal, carried (see State.earlier)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle without the plan (a DataLoader worker sends its snapshots): :meth:`with_plan` puts it back."""
        return (
            IteratorSnapshot,
            (
                None, self.consumer, self.counters, self.inner, self.position, self.stats, self.deals,
                self.known_targets, self.earlier,
            ),
        )

    def shared_rows(self) -> list[Any]:
        """The packer run's rows that a later snapshot may hold unchanged (see :mod:`arrowstream.state.sealed`)."""
        return shared_rows(self.inner)

    def with_plan(self, plan: Plan) -> IteratorSnapshot:
        """Return this snapshot with ``plan``: the plan of an iterator over the same data, state and consumer."""
        return replace(self, plan=plan)

    def to_dict(self) -> dict[str, Any]:
        """Return the state at the position captured (the dict ``state_dict()`` returned there)."""
        if self.plan is None:
            raise ConfigError(
                "this snapshot was pickled without its plan: give it back the plan of an iterator over the "
                "same dataset, state and consumer with `snapshot.with_plan(iterator.plan)` before `to_dict()`"
            )
        epochs: list[dict[str, int]] = []
        held = None
        if self.inner is not None:
            inner = self.inner.to_dict()
            position = Position.from_dict(inner["position"])
            stats, extra = inner["stats"], inner.get("packer", {})
            epochs = inner.get("epoch_stats", [])
            held = inner.get("held") or None  # the run's own, built for this state: no need to check or copy it
        else:
            assert self.position is not None and self.stats is not None
            position, stats, extra = self.position, self.stats, {}
        stats = {**dict.fromkeys(self.counters, 0), **stats}  # every counter, from the first state on
        if "pruned_rows" in stats:  # derived, so it is exact at any position: epochs begun times rows pruned
            stats["pruned_rows"] = self.plan.num_pruned_rows * (position.epoch + 1)
        share = work_of(self.plan, self.consumer, self.deals, position.epoch)
        ahead = []  # the shares of the epochs after this one that a merge dealt
        nxt = position.epoch + 1
        while nxt in self.deals:
            deal = self.deals[nxt]
            ahead.append(Work(deal.num_streams, deal.segments, self.known_targets.get(nxt), deal.by, left=deal.left))
            nxt += 1
        state = State(
            dataset=self.plan.describe(position.epoch),
            options_hash=self.plan.options_hash,
            options=self.plan.options(),
            position=position,
            where=where_of(self.plan, share, position),
            work=Work(share.num_streams, share.segments, by=share.by, left=share.left),
            consumer=(self.consumer.index, self.consumer.count),
            stats=stats,
            packer=extra,
            next_work=ahead[0] if ahead else None,
            epoch_stats=tuple(epochs),
            later_work=tuple(ahead[1:]),
            num_workers=self.consumer.per_rank if self.consumer.per_rank > 1 else None,
            earlier=self.earlier,
        ).to_dict()
        state["held"] = held
        return with_checksum(state)
