"""Iterating a mixture: one consumer's batches, its state and its per-source counters.

A :class:`MixtureIterator` is one consumer (rank x DataLoader worker). Its
``k``-th batch is its rank's batch of global step ``k * num_workers + worker``
(a loader hands out its workers' batches in turn); the rows of that step it
emits are its rank's slots (:func:`~arrowstream.mixture.schedule.step_rows`),
and the schedule names each row's source. Each source is that source's own
packed pipeline, iterated as this consumer (its share of every epoch); a
batch takes each source's rows in one pull where it can and gathers the
batch once.

The state is the batch count, the stages in global rows, and each source's
own state (coordinates, as for any pipeline): resuming replays nothing.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from arrowstream.distributed.topology import Consumer
from arrowstream.errors import ConfigError, StateError, StateMismatchError
from arrowstream.mixture.blocks import Block, assemble_mixture_block
from arrowstream.mixture.merge import GLOBAL_KIND, KIND
from arrowstream.mixture.reweight import fixed_changes, reweighted, row_reached
from arrowstream.mixture.rows import Taken, place_rows
from arrowstream.mixture.schedule import Schedule, Stage, step_rows, steps_rows
from arrowstream.mixture.snapshot import MixturePlans, MixtureSnapshot
from arrowstream.pack.blocks import block_batches
from arrowstream.pipeline.iterator import DatasetIterator
from arrowstream.state import STATE_FORMAT
from arrowstream.state.checksum import verify_checksum
from arrowstream.state.envelope import check_counters

if TYPE_CHECKING:
    import polars as pl

    from arrowstream.mixture.mix import PackedMixture

__all__ = ["MixtureIterator"]

#: The counters kept in all and per source.
_ROW_COUNTS = ("rows", "tokens", "padding_tokens", "segments")

#: Most batches of a ``concat`` mixture laid out together (see :mod:`arrowstream.mixture.blocks`).
_BLOCK_BATCHES = 32


class MixtureIterator:
    """Batches of one consumer of a :class:`~arrowstream.mixture.mix.PackedMixture`, with checkpointable state.

    Examples
    --------
    >>> import json
    >>> from arrowstream import mix, read_parquet
    >>> from arrowstream.testing import example_dir
    >>> ids = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0)
    >>> m = mix({"a": ids, "b": ids}, {"a": 2, "b": 1}).pack(seq_len=4, batch_size=3)
    >>> it = m.iter()
    >>> _ = next(it)
    >>> saved = json.loads(json.dumps(it.state_dict()))
    >>> [next(it)["input_ids"].tolist() for _ in range(2)] == [next(b)["input_ids"].tolist() for b in [m.iter(saved)] * 2]
    True
    """

    def __init__(
        self,
        mixture: PackedMixture,
        state: dict[str, Any] | None = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
    ) -> None:
        self.mixture = mixture
        self.consumer = Consumer.of(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)
        self.rank, self.world_size, self.worker, self.num_workers = rank, world_size, worker, num_workers
        self._sources: dict[str, DatasetIterator] = {}
        self._batches = self._origin = 0
        self._ahead: deque[Block] = deque()  # the next batches, laid out together (see _make_ahead)
        self._blocks = 0
        self._owed: dict[int, list[int]] = {}  # per source: rows and layouts handed out of blocks, not yet skipped
        self._stats = self._zero_stats()
        self._broken: BaseException | None = None  # what made the last next() fail
        self.load_state_dict(state)

    # -- state --------------------------------------------------------------------

    def _zero_stats(self) -> dict[str, int]:
        keys = ["batches", *_ROW_COUNTS]
        keys += [f"{name}.{key}" for name in self.mixture.names for key in _ROW_COUNTS]
        return dict.fromkeys(keys, 0)

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Continue from ``state``: this consumer's, a loader's rank state holding it, or a merged one (any topology).

        Raises
        ------
        StateMismatchError
            The state is another mixture's (sources, weights, seed, caps or row shape).
        StateError
            Not a mixture state, another consumer's own state (merge every
            consumer's with :func:`~arrowstream.merge_states` to change the
            topology), or malformed.
        """
        own = None if state is None else self._own(state)
        self._broken = None
        for it in self._sources.values():
            it.close()
        self._ahead.clear()
        self._blocks = 0
        self._owed = {}
        saved = {} if own is None else own["sources"]
        topology = {"rank": self.rank, "world_size": self.world_size, "worker": self.worker, "num_workers": self.num_workers}
        self._sources = {
            name: pipeline.iter(saved.get(name), **topology) for name, pipeline in self.mixture.pipelines.items()
        }
        stages = self.mixture.stages_for(self.world_size) if own is None else own["stages"]
        self.schedule = Schedule(stages)
        self._batches = 0 if own is None else own["batches"]
        self._origin = 0 if own is None else own["origin"]
        self._dormant = {} if own is None else own["dormant"]  # sources left out by a re-weighting
        self._prior = {} if own is None else dict(own.get("prior") or {})  # targets of earlier weights
        self._stats = self._zero_stats()
        self._stat_keys = [[(key, f"{name}.{key}") for key in _ROW_COUNTS] for name in self.mixture.names]
        if own is not None:
            self._stats.update({k: int(v) for k, v in own["stats"].items() if k in self._stats})
        # counters from before the last re-deal, which this consumer carries for a later merge (version 10)
        self._earlier = None if own is None else own.get("earlier")

    def _own(self, state: dict[str, Any]) -> dict[str, Any]:
        """Return what this consumer continues from: batches, origin, stages, sources' states, stats."""
        verify_checksum(state)
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise StateError(f"expected a mixture state (from `state_dict()`), got {type(state).__name__}")
        here = {"index": self.consumer.index, "count": self.consumer.count}
        rank_state = state if state.get("kind") == "rank" else None
        if rank_state is not None:  # a loader's: one state per DataLoader worker
            owns = [s for s in state.get("states") or [] if isinstance(s, dict) and s.get("consumer") == here]
            if not owns:
                raise StateError(
                    f"this rank state holds no state for consumer {here}: load it on the topology that "
                    "saved it, or merge every rank's state with `arrowstream.merge_states`"
                )
            state = owns[0]
        if state.get("kind") not in (KIND, GLOBAL_KIND):
            raise StateError(
                f"expected a mixture state (kind {KIND!r}), got kind {state.get('kind')!r}: a single "
                "pipeline's state resumes that pipeline, not a mixture"
            )
        current = self.mixture.options()
        diffs = _diff(state.get("mixture"), current)
        fixed = fixed_changes(state.get("mixture"), current)
        if diffs and (fixed or not self.mixture.mixture.reweight):
            way = "" if fixed else (
                "; or pass reweight=True to mix() to go on with these sources and weights from the row the "
                "run reached"
            )
            raise StateMismatchError(
                "the state was saved by another mixture: " + "; ".join(diffs)
                + f". Build the mixture with the saved sources and weights, or start without the state{way}"
            )
        try:
            own = self._saved(state, here)
            if diffs:  # re-weighted: a new stage from the row reached, sources by name
                row = row_reached(state, rank_state)
                own = reweighted(own, row, self.mixture.names, self.mixture.stages_for(self.world_size))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(f"mixture state is malformed ({exc}): pass what `state_dict()` returned") from exc
        if own["batches"] < 0 or own["origin"] < 0:
            raise StateError("mixture state is malformed (a negative count): pass what `state_dict()` returned")
        return own

    def _saved(self, state: dict[str, Any], here: dict[str, int]) -> dict[str, Any]:
        """Return what ``state`` (a consumer's or a merged one) says this consumer continues from."""
        stages = [Stage(int(start), tuple(int(c) for c in counts)) for start, counts in state["stages"]]
        if state["kind"] == GLOBAL_KIND:
            return self._share(state, stages)
        if state.get("consumer") != here:
            raise StateError(
                f"the state belongs to consumer {state.get('consumer')}, this iterator is consumer {here} "
                "(rank x DataLoader worker): load the state this consumer saved, or merge every "
                "consumer's state with `arrowstream.merge_states` to resume on another topology"
            )
        position = state["position"]
        return {
            "batches": int(position["batches"]),
            "origin": int(position.get("origin", 0)),
            "stages": stages,
            "sources": dict(state["sources"]),
            "dormant": dict(state.get("dormant") or {}),
            "prior": {str(k): float(v) for k, v in (state.get("prior") or {}).items()},
            "stats": state["stats"],
            "earlier": _counters(state.get("earlier")),
        }

    def _share(self, state: dict[str, Any], stages: list[Stage]) -> dict[str, Any]:
        """Return this consumer's part of a merged state: its own on the same topology, else a fresh start at the row reached."""
        saved = state["topology"]
        same = (int(saved["world_size"]), int(saved["num_workers"])) == (self.world_size, self.num_workers)
        common = {"stages": stages, "sources": dict(state["sources"]), "dormant": dict(state.get("dormant") or {})}
        if same:
            entry = state["consumers"][self.consumer.index]
            return {
                **common, "batches": int(entry["batches"]), "origin": int(state["origin"]),
                "stats": entry.get("stats", {}), "earlier": _counters(entry.get("earlier")),
            }
        # another topology: every source re-deals what its consumers had left; the schedule goes on from the row
        # reached; one consumer keeps the counters so far, so a later merge counts them
        return {
            **common, "batches": 0, "origin": int(state["rows"]), "stats": {},
            "earlier": _counters(state["stats"]) if self.consumer.index == 0 else None,
        }

    def state_dict(self) -> dict[str, Any]:
        """Return this consumer's position after the last batch: a small JSON-able dict."""
        return self.snapshot().to_dict()

    def snapshot(self) -> MixtureSnapshot:
        """Capture the position after the last batch; ``.to_dict()`` builds its state (see :mod:`arrowstream.state.snapshot`).

        Raises
        ------
        StateError
            The last ``next()`` failed (a read, a source run out, an
            interrupt): the rows it took are not in any state.
        """
        if self._broken is not None:
            raise StateError(self._lost("a state asked for"))
        self._settle()
        return MixtureSnapshot(
            self.mixture,
            {
                "consumer": {"index": self.consumer.index, "count": self.consumer.count},
                "topology": {"world_size": self.world_size, "num_workers": self.num_workers},
                "stages": [[s.start, list(s.counts)] for s in self.schedule.stages],
                "position": {"batches": self._batches, "origin": self._origin},
                "stats": dict(self._stats),
                **({"prior": dict(self._prior)} if self._prior else {}),
                **({"earlier": dict(self._earlier)} if self._earlier else {}),
            },
            {name: it.snapshot() for name, it in self._sources.items()},
            dict(self._dormant),
        )

    @property
    def plan(self) -> MixturePlans:
        """The mixture and its sources' plans: what a snapshot pickled without them needs back (``with_plan``)."""
        return MixturePlans(self.mixture, {name: it.plan for name, it in self._sources.items()})

    @property
    def stats(self) -> dict[str, int]:
        """Counters: batches; rows, tokens, padding tokens and segments (document pieces), in all and per source (``"web.tokens"``)."""
        return dict(self._stats)

    def report(self) -> pl.DataFrame:
        """Return, per source, what this consumer has emitted against what the schedule asks.

        One row per source: ``rows``, ``tokens``, ``docs`` (documents its
        pipeline read), ``epoch`` (the source epoch it is in), ``row_share``
        and ``token_share`` (of this consumer's rows and real tokens) and
        ``target_share`` (the schedule's share of the global slots these
        counters cover). See :mod:`arrowstream.mixture.progress`.

        Examples
        --------
        >>> from arrowstream import mix, read_parquet
        >>> from arrowstream.testing import example_dir
        >>> ids = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0)
        >>> it = mix({"a": ids, "b": ids}, {"a": 3, "b": 1}).pack(seq_len=4, batch_size=4).iter()
        >>> _ = [next(it) for _ in range(5)]
        >>> it.report().select("source", "rows", "row_share", "target_share").rows()
        [('a', 15, 0.75, 0.75), ('b', 5, 0.25, 0.25)]
        """
        from arrowstream.mixture.progress import progress_report

        self._settle()
        end = self._origin + self._step() * self.world_size * self.mixture.slots
        states = {name: it.state_dict() for name, it in self._sources.items()}
        return progress_report(
            self.mixture.names, self._stats, states, self.schedule.stages, (self._origin, end), self._prior
        )

    def source_stats(self) -> dict[str, dict[str, int]]:
        """Each source's own pipeline counters (rows read, documents, skips, epochs begun...)."""
        self._settle()
        return {name: it.stats for name, it in self._sources.items()}

    def _step(self) -> int:
        """The global step of this consumer's next batch."""
        return self._batches * self.num_workers + self.worker

    # -- iteration ----------------------------------------------------------------

    def __iter__(self) -> MixtureIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._broken is not None:
            raise StateError(self._lost("next()"))
        try:
            return self._next_batch()
        except StopIteration:
            raise
        except BaseException as exc:  # rows a failed batch took from its sources are gone: say so, never resume
            self._broken = exc
            raise

    def _lost(self, what: str) -> str:
        exc = self._broken
        return (
            f"{what} after a next() that failed ({type(exc).__name__}: {exc}): the failed batch had taken rows "
            "from its sources, so this iterator no longer knows where it stands; resume from the state saved "
            "after the last batch you kept (`mixture.iter(state)`)"
        )

    def _next_batch(self) -> dict[str, Any]:
        step = self._step()
        if not self._in_run(step):
            raise StopIteration
        if self.mixture.strategy == "concat":
            if not self._ahead:
                self._make_ahead()
            if self._ahead:
                batch, counts, pulls = self._ahead.popleft()
                for source, n in pulls:  # the source moves past them when next looked at (_settle)
                    owed = self._owed.setdefault(source, [0, 0])
                    owed[0] += n
                    owed[1] += 1
                return self._counted(batch, counts)
        self._settle()
        rows = self._rows(step)
        ids = self.schedule.sources_of(rows)
        if self.mixture.strategy == "bucket":  # one slot: the whole batch is one source's
            batch, counts = self._bucketed(int(ids[0]), int(rows[0]))
        else:
            names = self.mixture.names
            need = np.bincount(ids, minlength=len(names)).tolist()
            first_row = int(rows.min())
            taken = {  # in source order: the same pulls on every resume
                source: self._take(names[source], n, first_row) for source, n in enumerate(need) if n
            }
            batch, counts = place_rows(taken, ids, unit=self.mixture.unit, pad_ids=self.mixture.pad_ids)
        return self._counted(batch, counts)

    def _in_run(self, step: int) -> bool:
        """Whether global step ``step`` starts before the run's end (``num_tokens``)."""
        first = self._origin + step * self.world_size * self.mixture.slots
        return self.mixture.num_rows is None or first < self.mixture.num_rows

    def _rows(self, step: int) -> np.ndarray:
        """The global rows of this consumer's batch of global step ``step``."""
        return self._origin + step_rows(step, self.rank, self.world_size, self.mixture.slots)

    def _settle(self) -> None:
        """Move each source past the rows of the block batches handed out since it was last looked at.

        As if each batch had moved them when handed out: one layout per batch
        (:meth:`~arrowstream.pipeline.iterator.DatasetIterator.skip_rows`), so
        states and counters are the same; doing it when a source is next read
        or its state asked for saves a call per source per batch.
        """
        for source, (rows, layouts) in self._owed.items():
            self._sources[self.mixture.names[source]].skip_rows(rows, layouts=layouts)
        self._owed.clear()

    def _make_ahead(self) -> None:
        """Lay out the next batches together where every source has their rows in full in its epoch.

        Blocks grow 1, 2, 4, ... up to ``_BLOCK_BATCHES`` batches within
        :data:`~arrowstream.pack.blocks.BLOCK_TOKENS` (the first batch waits
        no longer). Where a source cannot give its rows in full (its epoch's
        end, a loss mask), the block holds the first batches whose rows every
        source has; where not even one batch's, nothing is made and the batch
        goes the one-at-a-time way. A read error in data a source pulled ahead
        is raised up to a block's batches early; the state still names the
        last batch emitted, so a resume loses nothing.
        """
        self._settle()
        want = min(block_batches(_BLOCK_BATCHES, self.mixture.slots * self.mixture.unit), 1 << min(self._blocks, 8))
        step0, stride = self._step(), self.num_workers
        count = sum(1 for k in range(want) if self._in_run(step0 + k * stride))
        if not count:
            return
        ids = self.schedule.sources_of(self._origin + steps_rows(
            range(step0, step0 + count * stride, stride), self.rank, self.world_size, self.mixture.slots
        )).reshape(count, -1)
        rows = self._rows_ahead(ids)
        if rows is None:  # near a source's epoch end: the batches whose rows every source holds
            count = self._batches_held(ids)
            rows = self._rows_ahead(ids[:count]) if count else None
        if rows is not None:
            self._ahead.extend(assemble_mixture_block(ids[:count], rows, seq_len=self.mixture.unit))
            self._blocks += 1

    def _batches_held(self, ids: np.ndarray) -> int:
        """How many of the batches whose slots' sources are ``ids`` (one row per batch) the sources hold the rows of."""
        names = self.mixture.names
        need = np.stack([np.bincount(row, minlength=len(names)) for row in ids]).cumsum(axis=0)  # by batch, source
        held = np.array([
            self._sources[name].rows_held(int(need[-1, s])) if need[-1, s] else 0 for s, name in enumerate(names)
        ])
        return int(np.all(need <= held, axis=1).sum())  # need grows batch by batch: the first ones fit

    def _rows_ahead(self, ids: np.ndarray) -> dict[int, tuple[list[np.ndarray], np.ndarray, np.ndarray]] | None:
        """Each source's full rows for the batches whose slots' sources are ``ids``, or ``None`` where one lacks them."""
        need = np.bincount(ids.reshape(-1), minlength=len(self.mixture.names)).tolist()
        rows = {}
        for source, n in enumerate(need):  # in source order: the same pulls on every resume
            if n:
                got = self._sources[self.mixture.names[source]].rows_ahead(n)
                if got is None:
                    return None
                rows[source] = got
        return rows

    def _counted(self, batch: dict[str, Any], counts: dict[int, dict[str, int]]) -> dict[str, Any]:
        """Count ``batch`` (with its per-source ``counts``) as emitted, and return it."""
        self._batches += 1
        stats = self._stats
        stats["batches"] += 1
        for source, mine in counts.items():
            for key, named in self._stat_keys[source]:
                n = mine[key]
                stats[key] += n
                stats[named] += n
        return batch

    def _pull(self, name: str, row: int, rows: int | None = None) -> Any:
        """Return source ``name``'s next batch (``rows``: its next layout of that many rows)."""
        it = self._sources[name]
        try:
            return next(it) if rows is None else it.next_layout(rows)
        except StopIteration:
            cap = self.mixture.mixture.max_epochs.get(name)
            raise ConfigError(
                f"source {name!r} ran out at global row {row}: this consumer "
                f"({self.consumer.index} of {self.consumer.count}) has read its share of all "
                f"{cap} epoch(s) of it (max_epochs); other consumers may run out later, or not. "
                f"Raise max_epochs[{name!r}], lower its weight, or drop the cap; before a run, "
                "`mixture.report(num_tokens, world_size=..., num_workers=...)` says which sources run out"
            ) from None

    def _take(self, name: str, need: int, row: int) -> list[Taken]:
        """Return ``need`` rows of source ``name``: one packed layout of them, or more at its epoch end.

        One pull gives at most the rows asked for (the source's state stays
        at a batch boundary, so it merges like any pipeline's). Rows that hold
        no token (an epoch's end pads whole rows) are left out and asked for again.
        """
        out: list[Taken] = []
        empty = 0
        while need:
            layout = self._pull(name, row, need)
            real = layout.real_rows
            empty = empty + 1 if real.size == 0 else 0
            if empty > 2:
                raise ConfigError(f"source {name!r} yields no tokens (every document filtered, empty or null)")
            if real.size:
                out.append(layout)
                need -= real.size
        return out

    def _bucketed(self, source: int, row: int) -> tuple[dict[str, Any], dict[int, dict[str, int]]]:
        """Return source ``source``'s next bucketed batch with its ``source_ids``, and its counts."""
        name = self.mixture.names[source]
        for _ in range(3):
            batch = self._pull(name, row)
            if batch["num_docs"]:
                break
        else:
            raise ConfigError(f"source {name!r} yields no tokens (every document filtered, empty or null)")
        n = int(batch["input_ids"].shape[0])
        batch["source_ids"] = np.full(n, source, dtype=np.int32)
        counts = {
            "rows": n, "tokens": batch["num_tokens"], "padding_tokens": batch["num_padding_tokens"],
            "segments": batch["num_docs"],
        }
        return batch, {source: counts}

    def close(self) -> None:
        """Release every source's files and threads."""
        for it in self._sources.values():
            it.close()


def _counters(value: Any) -> dict[str, int] | None:
    return None if value is None else check_counters(value, "earlier")


def _diff(saved: Any, current: Any, prefix: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(current, dict):
        return [d for key in sorted(set(saved) | set(current), key=str) for d in _diff(saved.get(key), current.get(key), f"{prefix}{key}.")]
    if saved != current:
        return [f"`{prefix.rstrip('.')}` was {saved!r}, now {current!r}"]
    return []

