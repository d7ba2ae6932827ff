"""The mixture's schedule: which source fills each global row, and which rows each consumer emits.

A mixture emits packed rows, each from one source. Row ``u`` of the whole run
(counted over all ranks: global step ``t`` holds rows ``t * N`` to
``t * N + N - 1``, ``N`` the global batch in rows) comes from the source a
deterministic rule picks for ``u``, the same on every rank and worker:

- Weights are made exact fractions ``p_s / D`` (``Fraction`` of the numbers
  given; a denominator above :data:`MAX_PERIOD` is approximated and reported).
- One period of ``D`` rows holds ``p_s`` rows of each source, in the order the
  *largest deficit* rule gives: row ``i`` goes to the source whose count lags
  ``w_s * (i + 1)`` the most, ties to the lowest index. Every prefix of a
  period is then within one row of every source's share (a tested bound), and
  so is every prefix of the run, as each period ends exactly on the shares.
- Each period is that order rotated by one of the rotations that keep the
  bound (:attr:`Stage.rotations`) and run forwards or backwards (a reversed
  period keeps the bound too: its prefix errors are the original's suffix
  errors), both chosen by low-discrepancy functions of the period's index. Any
  sequence of such periods keeps the bound, as each ends exactly on the
  shares; the variety keeps a consumer that sees every ``W``-th step (a
  DataLoader worker), or the same slot of every step, from landing on the same
  phase of a short period again and again, so every consumer draws each
  source at its weight in the long run.
- Stages (weights that change during the run) restart the rule at their first
  row: shares are counted from the stage's start, so a change makes no burst.

Within a global step, consumer slots are rotated by a low-discrepancy offset
(:func:`step_rows`): a rank does not take the same positions of every step, so
its draws from each source follow the weights on average, even when the
schedule's period divides the step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property, lru_cache

import numpy as np

from arrowstream.errors import ConfigError

__all__ = ["MAX_PERIOD", "Schedule", "Stage", "exact_weights", "step_rows", "steps_rows", "target_slots"]

#: The longest period (rows) of a stage's schedule; weights needing more are approximated.
MAX_PERIOD = 1 << 16

# Three irrationals, independent over the rationals, so the choices they drive never line up:
# a period's direction, a period's rotation and a step's slot offset.
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_SILVER = math.sqrt(2.0) - 1.0
_STEP = math.sqrt(3.0) - 1.0


def exact_weights(weights: Mapping[str, float], names: Sequence[str]) -> tuple[tuple[int, ...], int]:
    """Return the weights of ``names`` as integers ``p_s`` over their sum ``D`` (the schedule's period).

    Decimal numbers are taken as written (``0.1`` is one tenth), so weights
    such as 0.6/0.3/0.1 or 2/1 are exact. A period above :data:`MAX_PERIOD`
    rows is replaced by the closest fractions with a smaller one.

    Examples
    --------
    >>> exact_weights({"web": 0.6, "code": 0.3, "books": 0.1}, ["web", "code", "books"])
    ((6, 3, 1), 10)
    >>> exact_weights({"a": 2, "b": 1}, ["a", "b"])
    ((2, 1), 3)
    """
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ConfigError(f"weights name source(s) {unknown} that the mixture does not have: {list(names)}")
    fracs = []
    for name in names:
        value = weights.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"the weight of source {name!r} should be a number >= 0, got {value!r}")
        fracs.append(Fraction(str(value)) if isinstance(value, float) else Fraction(value))
    total = sum(fracs)
    if total == 0:
        raise ConfigError(f"every weight is 0 ({dict(weights)}): give at least one source a weight above 0")
    shares = [f / total for f in fracs]
    period = math.lcm(*(s.denominator for s in shares))
    if period > MAX_PERIOD:
        shares = _approximate(shares)
        period = math.lcm(*(s.denominator for s in shares))
    return tuple(int(s * period) for s in shares), period


def _approximate(shares: list[Fraction]) -> list[Fraction]:
    """Round ``shares`` to multiples of ``1 / MAX_PERIOD`` that still sum to 1 (largest remainders)."""
    raw = [s * MAX_PERIOD for s in shares]
    counts = [math.floor(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[: MAX_PERIOD - sum(counts)]:
        counts[i] += 1
    return [Fraction(c, MAX_PERIOD) for c in counts]


@lru_cache(maxsize=64)
def _period_order(counts: tuple[int, ...]) -> np.ndarray:
    """Return one period of the largest-deficit order for integer weights ``counts`` (read-only, cached per process).

    The deficit of source ``s`` before row ``i``, times the period, is
    ``counts[s] * (i + 1) - emitted[s] * period``: each row adds ``counts[s]``
    to every source's and takes ``period`` from the one picked.
    """
    period = sum(counts)
    live = [s for s, c in enumerate(counts) if c]  # a source of weight 0 is never picked
    rates = [counts[s] for s in live]
    deficit = list(rates)  # before row 0
    picks = [0] * period
    for i in range(period):
        best, top = 0, deficit[0]
        for j in range(1, len(live)):
            if deficit[j] > top:  # ties keep the lowest index
                best, top = j, deficit[j]
        picks[i] = best
        deficit[best] -= period
        for j in range(len(live)):
            deficit[j] += rates[j]
    order = np.asarray(live, dtype=np.int16)[np.asarray(picks, dtype=np.int64)]
    order.flags.writeable = False
    return order


@lru_cache(maxsize=64)
def _rotations(counts: tuple[int, ...]) -> np.ndarray:
    """Return the rotations of :func:`_period_order`'s order that keep every prefix within one row of every share.

    Rotating by ``k`` shifts every prefix error by ``-e(k)`` (the error
    after ``k`` rows; a period sums to zero), so ``k`` keeps the bound
    when ``e(k)`` is within 1 of both the largest and the smallest error.
    Rotation 0 always does. Read-only, cached per process: every iterator
    of a mixture shares it.
    """
    period, order = sum(counts), _period_order(counts)
    onehot = np.zeros((period, len(counts)))
    onehot[np.arange(period), order] = 1.0
    shares = np.asarray(counts, dtype=np.float64) / period
    steps = np.arange(1, period + 1)[:, None]
    errors = np.vstack([np.zeros(len(counts)), onehot.cumsum(axis=0) - steps * shares])[:-1]
    ok = np.all((errors > errors.max(axis=0) - 1.0 + 1e-9) & (errors < errors.min(axis=0) + 1.0 - 1e-9), axis=1)
    out = np.flatnonzero(ok)
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class Stage:
    """Weights from global row ``start`` on: integer shares ``counts`` of a period of ``sum(counts)`` rows."""

    start: int
    counts: tuple[int, ...]

    @cached_property
    def order(self) -> np.ndarray:
        """One period of the largest-deficit order."""
        return _period_order(self.counts)

    @property
    def period(self) -> int:
        return sum(self.counts)

    @property
    def rotations(self) -> np.ndarray:
        """The rotations of :attr:`order` that keep every prefix within one row of every share (cached per process)."""
        return _rotations(self.counts)


class Schedule:
    """The source of every global row, over the stages of a run.

    Parameters
    ----------
    stages
        Each from its first global row on, in order. The first starts at 0,
        or, after a re-weighting, at the row the run had reached (rows before
        it are never asked for).

    Examples
    --------
    >>> s = Schedule([Stage(0, (2, 1))])
    >>> s.sources(0, 9).tolist()
    [0, 0, 1, 0, 0, 1, 0, 1, 0]
    >>> s.counts(9).tolist()
    [6, 3]
    """

    def __init__(self, stages: Sequence[Stage]) -> None:
        if not stages or stages[0].start < 0:
            raise ValueError("a schedule needs a first stage, from row 0 (or, re-weighted, from the row reached)")
        starts = [s.start for s in stages]
        if starts != sorted(set(starts)):
            raise ValueError(f"stage starts must increase, got {starts}")
        widths = {len(s.counts) for s in stages}
        if len(widths) != 1:
            raise ValueError("every stage weighs the same sources")
        self.stages = tuple(stages)
        self.num_sources = widths.pop()

    def stage_at(self, row: int) -> int:
        """Return the index of the stage global row ``row`` is in."""
        return int(np.searchsorted([s.start for s in self.stages], row, side="right")) - 1

    def sources(self, start: int, count: int) -> np.ndarray:
        """Return the source of each global row ``start`` .. ``start + count - 1``."""
        rows = np.arange(start, start + count, dtype=np.int64)
        return self.sources_of(rows)

    def sources_of(self, rows: np.ndarray) -> np.ndarray:
        """Return the source of each of the global ``rows`` (any order)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(self.stages) == 1:
            return self._stage_sources(self.stages[0], rows)
        out = np.empty(rows.shape, dtype=np.int16)
        starts = np.array([s.start for s in self.stages], dtype=np.int64)
        which = np.searchsorted(starts, rows, side="right") - 1
        for k in np.unique(which).tolist():
            mask = which == k
            out[mask] = self._stage_sources(self.stages[k], rows[mask])
        return out

    @staticmethod
    def _stage_sources(stage: Stage, rows: np.ndarray) -> np.ndarray:
        """Return the source of each of ``rows``, all in ``stage``."""
        local = rows - stage.start
        period_index, phase = np.divmod(local, stage.period)
        rotations = stage.rotations
        pick = (np.modf((period_index + 1) * _SILVER)[0] * rotations.size).astype(np.int64)
        phase = np.where(_reversed(period_index), stage.period - 1 - phase, phase)
        return stage.order[(phase + rotations[pick]) % stage.period]

    def counts(self, row: int) -> np.ndarray:
        """Return how many of global rows ``0 .. row - 1`` each source fills."""
        total = np.zeros(self.num_sources, dtype=np.int64)
        for k, stage in enumerate(self.stages):
            end = self.stages[k + 1].start if k + 1 < len(self.stages) else None
            if stage.start >= row:
                break
            stop = row if end is None else min(row, end)
            total += self.stage_counts(k, stop)
        return total

    def stage_counts(self, k: int, row: int) -> np.ndarray:
        """Return how many rows of stage ``k``, from its start up to global row ``row``, each source fills."""
        stage = self.stages[k]
        n = row - stage.start
        full, rest = divmod(n, stage.period)
        out = np.asarray(stage.counts, dtype=np.int64) * full
        if rest:
            tail = self.sources(stage.start + full * stage.period, rest)
            out += np.bincount(tail, minlength=self.num_sources)
        return out


def _reversed(period_index: np.ndarray) -> np.ndarray:
    """Whether each period runs backwards: a low-discrepancy bit of its index (half of them)."""
    return np.modf((period_index + 1) * _GOLDEN)[0] >= 0.5


def step_rows(step: int, slot: int, slots: int, rows_per_slot: int) -> np.ndarray:
    """Return the global rows of consumer slot ``slot`` (of ``slots``) in global step ``step``.

    A step holds ``slots * rows_per_slot`` rows. Slot ``r`` takes
    ``rows_per_slot`` consecutive positions starting at
    ``r * rows_per_slot + offset``, wrapping around the step, where the offset
    is a low-discrepancy function of the step: every slot sees every position
    of the step equally often in the long run.

    Examples
    --------
    >>> step_rows(0, 1, 2, 2).tolist(), step_rows(1, 1, 2, 2).tolist()
    ([0, 1], [7, 4])
    """
    n = slots * rows_per_slot
    offset = int(math.modf((step + 1) * _STEP)[0] * n)
    positions = (slot * rows_per_slot + offset + np.arange(rows_per_slot)) % n
    return step * n + positions


def steps_rows(steps: Sequence[int], slot: int, slots: int, rows_per_slot: int) -> np.ndarray:
    """Return :func:`step_rows` of each of ``steps``, one after the other, in one array.

    Examples
    --------
    >>> steps_rows([0, 1], 1, 2, 2).tolist() == step_rows(0, 1, 2, 2).tolist() + step_rows(1, 1, 2, 2).tolist()
    True
    """
    n = slots * rows_per_slot
    steps = np.asarray(steps, dtype=np.int64)
    offsets = np.array([int(math.modf((int(k) + 1) * _STEP)[0] * n) for k in steps], dtype=np.int64)
    positions = (slot * rows_per_slot + offsets[:, None] + np.arange(rows_per_slot)) % n
    return (steps[:, None] * n + positions).reshape(-1)


def target_slots(stages: Sequence[Stage], start: int, end: int, *, before_first: bool = False) -> np.ndarray:
    """Return the global slots ``start..end-1`` the schedule's stages give each source (fractions of slots).

    ``before_first``: slots before the first stage count with its weights;
    otherwise they count for nothing (a re-weighted run records what the
    earlier weights gave them, as ``prior``).

    Examples
    --------
    >>> target_slots([Stage(40, (1, 3))], 0, 80).tolist()   # 40..79 by the stage; 0..39 recorded apart
    [10.0, 30.0]
    """
    total = np.zeros(len(stages[0].counts))
    for k, stage in enumerate(stages):
        lo = start if k == 0 and before_first else max(start, stage.start)
        hi = end if k + 1 == len(stages) else min(end, stages[k + 1].start)
        if hi > lo:
            counts = np.asarray(stage.counts, dtype=np.float64)
            total += (hi - lo) * counts / counts.sum()
    return total
