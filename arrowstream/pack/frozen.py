"""A look-ahead run's state, captured after a batch and built only when asked.

A ``best_fit`` or ``bucket`` state names every document of the look-ahead
window by reference (a thousand by default): built after every batch, it
cost 3-6.5 ms a batch on the 85 MB benchmark corpus, more than the
batch itself. :func:`freeze` takes a shallow copy of the run with its own
copies of what later batches change (the rows and batches formed, the held
documents' skipped heads, the counters, the read mark), 0.1-0.4 ms;
:meth:`FrozenRun.to_dict` runs the run's own ``state_dict()`` on that copy,
so the state is the one the run would have given then.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from arrowstream.state.sealed import resolve, sending_base

__all__ = ["FrozenRun", "freeze"]

class _Counts:
    """A ledger's counters as they were: what ``state_dict()`` reads of it."""

    __slots__ = ("_epochs", "_totals")

    def __init__(self, totals: dict[str, int], epochs: list[dict[str, int]]) -> None:
        self._totals, self._epochs = totals, epochs

    def snapshot(self) -> dict[str, int]:
        return dict(self._totals)

    def epoch_snapshot(self) -> list[dict[str, int]]:
        return [dict(e) for e in self._epochs]


class _Skip:
    """What ``state_dict()`` reads of a held document: the tokens removed from its front upstream."""

    __slots__ = ("skip",)

    def __init__(self, skip: int) -> None:
        self.skip = skip


_NO_SKIP = _Skip(0)


class _Skips:
    """A run's store of held documents as ``state_dict()`` reads it: each key's nonzero ``skip``.

    The tokens are left behind, so a frozen run is small and can be pickled
    (a DataLoader worker sends it with each batch); the sizes travel as the
    run's ``size_windows``.
    """

    __slots__ = ("skips",)

    def __init__(self, skips: dict[Any, int]) -> None:
        self.skips = skips

    def __getitem__(self, key: Any) -> _Skip:
        skip = self.skips.get(key)
        return _NO_SKIP if skip is None else _Skip(skip)


class _ReadMark:
    """A document source's read mark as it was: what ``state_dict()`` reads of it."""

    __slots__ = ("read",)

    def __init__(self, read: tuple[int, int, int]) -> None:
        self.read = read


@dataclass(frozen=True, slots=True)
class FrozenRun:
    """A run copied at one position; :meth:`to_dict` is its ``state_dict()`` there.

    The run's containers named in its ``_shared`` hold rows that never
    change once formed, shared with the live run and with later snapshots
    (:meth:`shared_rows`); while a :class:`~arrowstream.state.sealed.SealStream`
    pickles a difference, those its base holds cross as their place there.
    """

    run: Any

    def to_dict(self) -> dict[str, Any]:
        """Return the run's state at the position it was frozen at."""
        out: dict[str, Any] = self.run.state_dict()
        return out

    def shared_rows(self) -> list[Any]:
        """The rows of the run's ``_shared`` containers, in order: lists that a later snapshot may hold unchanged."""
        return [row for name in self.run._shared for row in getattr(self.run, name)]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle the run; while a stream pickles a difference, its base's rows as their places."""
        index = sending_base()
        if index is None or not self.run._shared:
            return (FrozenRun, (self.run,))
        bare = copy.copy(self.run)
        parts = {}
        for name in self.run._shared:
            parts[name] = [row if (i := index.get(id(row))) is None else i for row in getattr(self.run, name)]
            setattr(bare, name, None)
        return (_frozen_from, (bare, parts))


def _frozen_from(run: Any, parts: dict[str, list[Any]]) -> FrozenRun:
    """Rebuild a :class:`FrozenRun` pickled as a difference: its rows put back from the base."""
    for name, rows in parts.items():
        setattr(run, name, resolve(rows))
    return FrozenRun(run)


def freeze(run: Any) -> FrozenRun:
    """Return ``run`` frozen: a shallow copy whose counters, read mark, skips and rows are its own.

    The copy keeps no tokens and no plan (its store keeps the held
    documents' sizes and skips alone): it pickles in a few hundred
    microseconds for a window of a thousand documents.

    ``run._copy_rows(frozen)`` gives ``frozen`` copies of the strategy's own
    containers that later batches change (``best_fit``'s open, ready and
    formed rows; ``bucket``'s carried documents and formed batches).

    Examples
    --------
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> ds = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0)
    >>> it = ds.pack(seq_len=8, batch_size=2, strategy="best_fit").iter()
    >>> first = next(it)
    >>> frozen = freeze(it._run)
    >>> expected = it._run.state_dict()
    >>> rest = list(it)
    >>> frozen.to_dict() == expected
    True
    """
    frozen = copy.copy(run)
    frozen.ledger = _Counts(run.ledger.snapshot(), run.ledger.epoch_snapshot())
    frozen.src = _ReadMark(tuple(run.src.read))
    frozen.store = _Skips(dict(run.store.skips))
    run.store.seal()  # the snapshot shares the windows' dicts of sizes: none changes from now on
    frozen.size_windows = list(run.size_windows)
    frozen.targets = None  # (holds the plan) not read by state_dict(); nor is best_fit's count of pieces
    frozen.__dict__.pop("refs", None)
    frozen.__dict__.pop("ahead", None)  # best_fit's batches assembled ahead: arrays, not state
    run._copy_rows(frozen)
    return FrozenRun(frozen)
