"""Before a run: what a token budget means for each source of a mixture.

:func:`budget_report` gives, per source, the tokens a run of ``num_tokens``
takes from it (its weight in each stage times the stage's share of the
budget), the tokens one epoch of it holds (counted when its pipeline can count
them: token ids, a complete read-only token cache or a length index; else
estimated from a sample, as even batches are), and the epochs that implies,
next to its ``max_epochs`` cap: a source that would run out shows before the
run does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from arrowstream.checks import check_int
from arrowstream.pipeline.plan import Plan

if TYPE_CHECKING:
    from arrowstream.mixture.mix import PackedMixture

__all__ = ["budget_report"]


def budget_report(mixture: PackedMixture, num_tokens: int) -> pl.DataFrame:
    """Return one row per source: ``weight`` (the first stage's), ``target_tokens``, ``epoch_tokens``, ``counted``, ``epochs``, ``max_epochs``, ``runs_out``.

    Tokens are those of the packed rows (``seq_len`` a row, padding
    included), which is what the weights share out.

    Examples
    --------
    >>> from arrowstream import mix, read_parquet
    >>> from arrowstream.testing import example_dir
    >>> ids = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0)
    >>> m = mix({"a": ids, "b": ids}, {"a": 3, "b": 1}, max_epochs={"a": 2}).pack(seq_len=4, batch_size=2)
    >>> budget_report(m, 160).select("source", "target_tokens", "epoch_tokens", "epochs", "runs_out").rows()
    [('a', 120, 42, 2.857142857142857, True), ('b', 40, 42, 0.9523809523809523, False)]
    """
    num_tokens = check_int("num_tokens", num_tokens)
    stages = mixture.mixture.stages
    target = np.zeros(len(mixture.names))
    for k, (start, counts) in enumerate(stages):
        end = stages[k + 1][0] if k + 1 < len(stages) else num_tokens
        span = max(0, min(end, num_tokens) - start)
        target += span * np.asarray(counts, dtype=np.float64) / sum(counts)
    first = np.asarray(stages[0][1], dtype=np.float64) / sum(stages[0][1])
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
        rows.append({
            "source": name,
            "weight": float(first[i]),
            "target_tokens": int(round(target[i])),
            "epoch_tokens": int(round(per_epoch)),
            "counted": counts is not None,
            "epochs": float(epochs),
            "max_epochs": cap,
            "runs_out": bool(cap is not None and epochs > cap),
        })
    return pl.DataFrame(rows, schema_overrides={"max_epochs": pl.Int64})
