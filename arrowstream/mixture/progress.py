"""During a run: what a mixture's consumer has taken from each source, against what the schedule asks.

:func:`progress_report` gives, per source, the rows, tokens and documents
this consumer has emitted, the source epoch it is in, its achieved shares of
rows and tokens, and the target share: the share of slots the schedule gives
the source over the same span (each stage's weights over its part of it), so
a re-weighting or a stage change shows as a target between the old and new
weights. A re-weighting replaces the schedule from the row the run reached:
what the earlier weights gave each source before it is kept in the state
(``prior``), so the target covers the same span as the counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from arrowstream.mixture.schedule import Stage, target_slots

__all__ = ["progress_report", "target_shares"]


def target_shares(stages: Sequence[Stage], start: int, end: int) -> np.ndarray:
    """Return each source's share of the global slots ``start..end-1`` by the schedule's stages.

    Slots before the first stage count with its weights (a state saved before
    re-weightings were recorded: see :func:`~arrowstream.mixture.schedule.target_slots`).

    Examples
    --------
    >>> target_shares([Stage(0, (1, 1)), Stage(100, (1, 3))], 0, 200).tolist()
    [0.375, 0.625]
    """
    total = target_slots(stages, start, end, before_first=True)
    span = total.sum()
    return total / span if span else total


def progress_report(
    names: Sequence[str],
    stats: dict[str, int],
    sources: dict[str, dict[str, Any]],
    stages: Sequence[Stage],
    span: tuple[int, int],
    prior: dict[str, float] | None = None,
) -> pl.DataFrame:
    """Return one row per source: ``rows``, ``tokens``, ``docs``, ``epoch``, ``row_share``, ``token_share``, ``target_share``.

    ``stats`` are the mixture consumer's counters, ``sources`` each source's
    own state, ``span`` the global slots those counters cover, ``prior`` the
    slots earlier weights gave each source (by name, those left out too)
    over the part of the span before a re-weighting's stage.
    """
    if prior:
        slots = target_slots(stages, *span)
        total = float(slots.sum()) + sum(prior.values())  # sources left out keep their part of the span
        target = np.array([(s + prior.get(n, 0.0)) / total if total else 0.0 for n, s in zip(names, slots.tolist())])
    else:
        target = target_shares(stages, *span)
    rows_all = max(1, stats["rows"])
    tokens_all = max(1, stats["tokens"])
    out = []
    for i, name in enumerate(names):
        state = sources[name]
        out.append({
            "source": name,
            "rows": stats[f"{name}.rows"],
            "tokens": stats[f"{name}.tokens"],
            "docs": int(state["stats"].get("docs", 0)),
            "epoch": int(state["position"]["epoch"]),
            "row_share": stats[f"{name}.rows"] / rows_all,
            "token_share": stats[f"{name}.tokens"] / tokens_all,
            "target_share": float(target[i]),
        })
    return pl.DataFrame(out)
