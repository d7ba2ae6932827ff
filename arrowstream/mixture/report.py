"""Before a run: what a token budget means for each source of a mixture.

:func:`budget_report` gives, per source, the tokens a run of ``num_tokens``
takes from it (its weight in each stage times the stage's share of the
budget), the tokens one epoch of it holds (counted when its pipeline can count
them: token ids, a complete read-only token cache or a length index; else
estimated from a sample, as even batches are), and the epochs that implies,
next to its ``max_epochs`` cap: a source that would run out shows before the
run does.

Every consumer (rank x DataLoader worker) reads its own share of each epoch
of a source and the schedule takes the same rows from each, so on several
consumers the one with the smallest share comes round first: given the
topology, ``consumer_epochs`` is the most epochs of its own share any
consumer reads, and a capped source runs out when that passes the cap, even
if the source as a whole holds enough.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from arrowstream.checks import check_int
from arrowstream.distributed.tokens import part_tokens
from arrowstream.distributed.topology import Consumer
from arrowstream.mixture.schedule import Schedule, steps_rows, target_slots
from arrowstream.pipeline.plan import Plan

if TYPE_CHECKING:
    from arrowstream.mixture.mix import PackedMixture

__all__ = ["budget_report"]

#: Most epochs walked share by share for a source without a cap; past them its last epoch's shares go on.
_WALKED_EPOCHS = 64

#: Global rows whose sources are counted consumer by consumer; a longer run adds the rest at the weights.
_COUNTED_ROWS = 1 << 22


def budget_report(
    mixture: PackedMixture, num_tokens: int, *, world_size: int = 1, num_workers: int = 1
) -> pl.DataFrame:
    """Return one row per source: ``weight`` (the first stage's), ``target_tokens``, ``epoch_tokens``, ``counted``, ``epochs``, ``consumer_epochs``, ``max_epochs``, ``runs_out``.

    Tokens are those of the packed rows (``seq_len`` a row, padding
    included), which is what the weights share out. ``consumer_epochs`` is
    the most epochs of its own share a consumer of ``world_size`` ranks x
    ``num_workers`` DataLoader workers reads (``epochs`` on one consumer);
    ``runs_out`` compares it with ``max_epochs``.

    Examples
    --------
    >>> from arrowstream import mix, read_parquet
    >>> from arrowstream.testing import example_dir
    >>> ids = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0)
    >>> m = mix({"a": ids, "b": ids}, {"a": 3, "b": 1}, max_epochs={"a": 2}).pack(seq_len=4, batch_size=2)
    >>> budget_report(m, 160).select("source", "target_tokens", "epoch_tokens", "epochs", "runs_out").rows()
    [('a', 120, 42, 2.857142857142857, True), ('b', 40, 42, 0.9523809523809523, False)]

    On two ranks, one's share of ``a`` is read past the cap where the whole source would not be:

    >>> budget_report(m, 100).select("source", "epochs", "runs_out").row(0)
    ('a', 1.7857142857142858, False)
    >>> budget_report(m, 100, world_size=2).select("source", "consumer_epochs", "runs_out").row(0)
    ('a', 2.6666666666666665, True)
    """
    num_tokens = check_int("num_tokens", num_tokens)
    count = Consumer.of(rank=0, world_size=world_size, num_workers=num_workers).count
    stages = mixture.mixture.stages
    target = np.zeros(len(mixture.names))
    for k, (start, counts) in enumerate(stages):
        end = stages[k + 1][0] if k + 1 < len(stages) else num_tokens
        span = max(0, min(end, num_tokens) - start)
        target += span * np.asarray(counts, dtype=np.float64) / sum(counts)
    first = np.asarray(stages[0][1], dtype=np.float64) / sum(stages[0][1])
    if count > 1:  # each consumer's slots of each source, in tokens
        demand = _consumer_slots(mixture, -(-num_tokens // mixture.unit), world_size, num_workers) * mixture.unit
    rows = []
    for i, name in enumerate(mixture.names):
        plan = Plan.of(mixture.pipelines[name])
        counts = plan.token_counts
        if counts is not None:
            per_epoch = float(sum(counts.total(int(s)) for s in plan.shards.tolist()))
        else:
            per_epoch = float(plan.estimated_tokens()[plan.shards].sum())
        cap = mixture.mixture.max_epochs.get(name)
        epochs = target[i] / per_epoch if per_epoch else float("inf")
        walk = _WALKED_EPOCHS if cap is None else cap
        consumer_epochs = _most_epochs(plan, demand[:, i], walk) if count > 1 and per_epoch else epochs
        rows.append({
            "source": name,
            "weight": float(first[i]),
            "target_tokens": int(round(target[i])),
            "epoch_tokens": int(round(per_epoch)),
            "counted": counts is not None,
            "epochs": float(epochs),
            "consumer_epochs": float(consumer_epochs),
            "max_epochs": cap,
            "runs_out": bool(cap is not None and consumer_epochs > cap),
        })
    return pl.DataFrame(rows, schema_overrides={"max_epochs": pl.Int64})


def _consumer_slots(mixture: PackedMixture, num_rows: int, world_size: int, num_workers: int) -> np.ndarray:
    """Return the slots each consumer of a fresh run of ``num_rows`` global rows fills from each source (consumer, source).

    The schedule's own choice for the first :data:`_COUNTED_ROWS` rows
    (a consumer's draws stray from its weights by up to tens of rows); the
    rest of a longer run adds its slots at the weights, shared equally.
    """
    slots, count = mixture.slots, world_size * num_workers
    schedule = Schedule(mixture.stages_for(world_size))
    per_step = world_size * slots
    steps = -(-num_rows // per_step)  # the run ends at the step reaching num_rows, the same on every rank
    counted = min(steps, max(1, _COUNTED_ROWS // per_step))
    out = np.zeros((count, len(mixture.names)))
    for rank in range(world_size):
        for worker in range(num_workers):
            rows = steps_rows(range(worker, counted, num_workers), rank, world_size, slots)
            out[rank * num_workers + worker] = np.bincount(schedule.sources_of(rows), minlength=len(mixture.names))
    if counted < steps:
        out += target_slots(schedule.stages, counted * per_step, steps * per_step) / count
    return out


def _most_epochs(plan: Plan, demand: np.ndarray, walk: int) -> float:
    """Return the most epochs of its own share any consumer reads to give its ``demand`` tokens (one per consumer).

    The shares of the first ``walk`` epochs are added up as dealt; a
    consumer still short after them goes on at its last epoch's share.
    """
    count = len(demand)
    read = np.zeros(count)  # tokens each consumer has had
    epochs = np.zeros(count)
    share = np.zeros(count)
    for epoch in range(walk):
        short = read < demand
        if not short.any():
            break
        share = _share_tokens(plan, epoch, count)
        part = np.ones(count)  # a whole epoch, or the part of it that covers what is still owed
        np.divide(demand - read, share, out=part, where=share > demand - read)
        epochs += np.where(short, part, 0.0)
        read += np.where(short, share, 0.0)
    short = read < demand
    if short.any():  # on at the last epoch's share; a consumer whose share is empty never gets there
        more = np.full(count, np.inf)
        np.divide(demand - read, share, out=more, where=share > 0)
        epochs = np.where(short, epochs + more, epochs)
    return float(epochs.max())


def _share_tokens(plan: Plan, epoch: int, count: int) -> np.ndarray:
    """Return the tokens of each of ``count`` consumers' shares of ``epoch`` (counted, or estimated per row group)."""
    layout = plan.layout(epoch, count, plan.streams_by)
    parts = [plan.fresh_work(epoch, Consumer(c, count)) for c in range(count)]
    counts = plan.token_counts
    if counts is not None:
        return np.array([part_tokens(layout, counts, part) for part in parts], dtype=np.float64)
    row_tokens = plan.estimated_tokens() / np.maximum(plan.manifest.shard_rows, 1)
    return np.array([
        sum(layout.range_bytes(s, lo, hi, row_tokens) for s, lo, hi, _, _ in part) for part in parts
    ], dtype=np.float64)
