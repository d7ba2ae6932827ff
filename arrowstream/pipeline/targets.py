"""A consumer's even-batches target for an epoch: the batches it emits there, or ``None`` (as many as the data gives).

With even batches over several consumers, every rank emits the same number
of batches in an epoch. The target is saved with the state for the epochs a
merge dealt; otherwise it comes from the plan: counted (each consumer's own
count, evened per rank over its DataLoader workers) or estimated (one for
every consumer). See :meth:`~arrowstream.pipeline.plan.Plan.batch_targets`.
"""

from __future__ import annotations

from arrowstream.distributed.topology import Consumer, Deal
from arrowstream.pipeline.plan import Plan

__all__ = ["counted_targets", "epoch_target"]


def counted_targets(plan: Plan) -> bool:
    """Whether consumers' batch targets are counted (each its own, evened per rank), not one estimate for all."""
    packer = plan.packer
    return packer is not None and bool(packer.even_batches) and plan.num_epochs is not None and plan.token_counts is not None


def epoch_target(
    plan: Plan,
    consumer: Consumer,
    parts: dict[int, Deal],
    known: dict[int, int | None],
    epoch: int,
) -> int | None:
    """Batches every consumer emits in ``epoch`` (None: as many as the data gives)."""
    if plan.packer is None or not plan.packer.even_batches or consumer.count == 1:
        return None
    if plan.num_epochs is None or epoch >= plan.num_epochs:
        return None
    if epoch in known:
        return known[epoch]
    if epoch in parts:
        deal = parts[epoch]
        return plan.batch_targets(epoch, deal.parts, deal.num_streams, deal.by, consumer.per_rank, deal.left)[
            consumer.index
        ]
    fresh = [plan.fresh_work(epoch, Consumer(c, consumer.count)) for c in range(consumer.count)]
    by = plan.at(epoch).streams_by
    return plan.batch_targets(epoch, fresh, consumer.count, by, consumer.per_rank)[consumer.index]
