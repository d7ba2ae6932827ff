"""Describing a mixture: several tokenized pipelines, weighed by tokens, packed on a shared schedule.

:func:`mix` takes named pipelines up to tokenization (each its own files,
filter, shuffle, tokenizer or token column) and their weights; ``.pack``
makes a :class:`PackedMixture`, whose iterators emit batches of packed rows,
each row from one source, the sources picked by the global schedule of
:mod:`arrowstream.mixture.schedule`. Every row holds ``seq_len`` tokens but
padding, so weights on rows are weights on tokens (``concat`` pads only at a
source's epoch ends; ``best_fit`` a little in every row).

Sources repeat: each is read epoch after epoch (``max_epochs`` caps it), every
epoch in a new order when the source is shuffled (by default from the
mixture's ``seed`` and the source's name), and each consumer reads its own
share of every epoch, as a lone pipeline does.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from arrowstream.checks import check_int
from arrowstream.errors import ConfigError
from arrowstream.mixture.rows import MIXTURE_KEYS
from arrowstream.mixture.schedule import Stage, exact_weights
from arrowstream.pack.assemble import BATCH_KEYS, PADDED_KEYS
from arrowstream.pipeline.dataset import Dataset
from arrowstream.tokenize import Tokenize
from arrowstream.tokenize.encoders import Encoder

if TYPE_CHECKING:
    import polars as pl

    from arrowstream.mixture.iterator import MixtureIterator
    from arrowstream.pytorch import TorchDataset

__all__ = ["Mixture", "PackedMixture", "mix"]

#: Weights: one mapping for the whole run, or stages ``[(start_tokens, mapping), ...]`` from 0.
Weights = Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]]


def mix(
    sources: Mapping[str, Dataset],
    weights: Weights,
    *,
    seed: int = 0,
    max_epochs: Mapping[str, int] | None = None,
    shuffle: bool = True,
    reweight: bool = False,
) -> Mixture:
    """Mix tokenized pipelines by token weight; call ``.pack(...)`` on the result.

    Parameters
    ----------
    sources
        Name -> a pipeline up to ``.tokenize`` (not packed): its own files,
        filter, shuffle and tokenizer (or token column). Its ``num_epochs``
        is replaced: sources repeat (see ``max_epochs``).
    weights
        Name -> weight (any non-negative numbers; they are normalised; a
        missing name weighs 0), the share of packed rows, hence of tokens.
        Or stages: ``[(0, {...}), (start_tokens, {...}), ...]``, each from a
        global token count on (rounded up to a whole global step), its
        shares counted from its own start.
    seed
        Seeds the order of every source that has no ``.shuffle`` of its own
        (each source and epoch its own order); with ``shuffle=False`` they keep
        their file order.
    max_epochs
        Name -> the most epochs of that source to read; running out raises
        :class:`~arrowstream.errors.ConfigError`. Unnamed sources repeat without end.
    shuffle
        Shuffle the sources that have no ``.shuffle`` of their own.
    reweight
        Let a state saved with other sources, weights or caps continue with
        these: a new stage from the global row the run had reached; sources
        matched by name (new ones start at their beginning, left-out ones keep
        their state for later). See :mod:`arrowstream.mixture.reweight`.

    Examples
    --------
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> ids = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0)
    >>> m = mix({"a": ids, "b": ids}, {"a": 0.75, "b": 0.25}).pack(seq_len=4, batch_size=4)
    >>> next(iter(m))["source_ids"].tolist()
    [1, 0, 0, 0]
    """
    if not isinstance(sources, Mapping) or not sources:
        raise ConfigError(f"`sources` should be a non-empty dict of name -> pipeline, got {sources!r}")
    for name, src in sources.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"source names should be non-empty strings, got {name!r}")
        if not isinstance(src, Dataset):
            raise ConfigError(f"source {name!r} should be a pipeline (read_parquet(...).tokenize(...)), got {type(src).__name__}")
        if src.packer is not None:
            raise ConfigError(f"source {name!r} is already packed: pass it before `.pack`, and pack the mixture")
        if not any(isinstance(stage, Tokenize) for stage in src.stages):
            raise ConfigError(f"source {name!r} has no `.tokenize(...)`: a mixture weighs tokens")
    names = tuple(sources)
    stages = _stages(weights, names)
    caps = dict(max_epochs or {})
    for name, cap in caps.items():
        if name not in sources:
            raise ConfigError(f"`max_epochs` names {name!r}, which is not a source: {list(names)}")
        check_int(f"max_epochs[{name!r}]", cap)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"`seed` should be an int, got {seed!r}")
    prepared = {}
    for name, src in _share_encoders(sources).items():
        if shuffle and src.seed is None:
            src = replace(src, seed=_source_seed(seed, name))
        # a capped source's consumers should come round together: shares of equal tokens, not rows
        prepared[name] = replace(src, num_epochs=caps.get(name), balanced=name in caps)
    return Mixture(prepared, stages, seed, caps, bool(reweight))


def _stages(weights: Weights, names: tuple[str, ...]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Return ``(start_tokens, integer shares)`` per stage."""
    if isinstance(weights, Mapping):
        weights = [(0, weights)]
    if not isinstance(weights, Sequence) or not weights:
        raise ConfigError("`weights` should be a dict of name -> weight, or a list of (start_tokens, dict) stages")
    out = []
    for item in weights:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], Mapping)):
            raise ConfigError(f"each stage should be (start_tokens, {{name: weight}}), got {item!r}")
        start = check_int("a stage's start_tokens", item[0], low=0)
        out.append((start, exact_weights(item[1], names)[0]))
    starts = [s for s, _ in out]
    if starts[0] != 0 or starts != sorted(set(starts)):
        raise ConfigError(f"stage starts (tokens) should begin at 0 and increase, got {starts}")
    return tuple(out)


def _share_encoders(sources: Mapping[str, Dataset]) -> dict[str, Dataset]:
    """Return the sources, those that tokenize alike sharing one encoder.

    An encoder proves its fast backend on the first documents it sees
    (:mod:`arrowstream.tokenize.encoders`); shared, it does so once on the
    mixture's first documents, not once per source.
    """
    seen: dict[tuple[Any, ...], Encoder] = {}
    out = {}
    for name, src in sources.items():
        stages = []
        for stage in src.stages:
            encoder = getattr(stage, "encoder", None)
            if isinstance(stage, Tokenize) and isinstance(encoder, Encoder):
                key = (encoder.hash, encoder.add_special_tokens, encoder.requested, encoder.sample_bytes, encoder.cache_dir)
                shared = seen.setdefault(key, encoder)
                if shared is not encoder:
                    stage = copy.copy(stage)
                    stage.encoder = shared
            stages.append(stage)
        out[name] = replace(src, stages=tuple(stages))
    return out


def _source_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}\0{name}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


@dataclass(frozen=True)
class Mixture:
    """Tokenized sources and their weights; ``.pack(...)`` gives a :class:`PackedMixture`."""

    sources: dict[str, Dataset]
    stages: tuple[tuple[int, tuple[int, ...]], ...]
    seed: int
    max_epochs: dict[str, int]
    reweight: bool = False

    def pack(
        self,
        *,
        seq_len: int,
        batch_size: int,
        strategy: str = "concat",
        num_tokens: int | None = None,
        **options: Any,
    ) -> PackedMixture:
        """Pack each source into rows of ``seq_len`` tokens; batches of ``batch_size`` rows mix them.

        ``strategy`` is ``"concat"`` or ``"best_fit"`` with its options (see
        :meth:`Dataset.pack <arrowstream.Dataset.pack>`), applied to every
        source. Each batch has the keys of a packed batch plus
        ``source_ids`` (``int32``, the source of each row, in the order of
        ``sources``). Sources never end (unless capped), so neither do the
        batches, unless ``num_tokens`` is given: the run then ends at the
        first global step that reaches that many tokens' worth of rows
        (``seq_len`` tokens a row), the same step on every rank, so no rank
        waits on another, whatever the topology (after a resume on another one
        too).
        """
        if strategy not in ("concat", "best_fit"):
            raise ConfigError(f"a mixture packs with strategy 'concat' or 'best_fit', got {strategy!r}")
        seq_len = check_int("seq_len", seq_len)
        batch_size = check_int("batch_size", batch_size)
        _no_even_batches(options)
        # a pull asks a source for its rows of a batch, up to batch_size
        packed = {
            name: src.pack(seq_len=seq_len, batch_size=batch_size, strategy=strategy, even_batches=False, **options)
            for name, src in self.sources.items()
        }
        shape = {"seq_len": seq_len, "batch_size": batch_size, "strategy": strategy}
        return PackedMixture(self, packed, shape, unit=seq_len, slots=batch_size, num_tokens=num_tokens)

    def bucket(self, *, max_tokens: int, num_tokens: int | None = None, **options: Any) -> PackedMixture:
        """Bucket each source by length; each batch is one source's, a budget of ``max_tokens`` padded tokens.

        ``options`` are those of :meth:`Dataset.bucket
        <arrowstream.Dataset.bucket>` (``window``, ``max_len``,
        ``long_docs``, ``pad_to_multiple_of``, ``seed``, ``pad_id``), applied
        to every source. Batches are not shared between sources (that would
        batch documents of unlike lengths together): the schedule gives
        each rank's batch of a global step to one source, so the weights share
        out batches, each worth ``max_tokens`` padded tokens; the real tokens
        of a batch depend on how well its documents fill it, so token shares
        follow the weights only as closely as the sources' fills agree
        (``stats`` counts them). Each batch has the keys of a bucketed batch
        plus ``source_ids`` (one per row, all the same). ``num_tokens`` ends
        the run at the first global step reaching that many batch budgets'
        worth of tokens.
        """
        max_tokens = check_int("max_tokens", max_tokens)
        if "batch_size" in options:
            raise ConfigError(
                "a mixture buckets by token budget: pass `max_tokens` (padded tokens per batch), not "
                "`batch_size`, so the weights share out tokens"
            )
        _no_even_batches(options)
        packed = {
            name: src.bucket(max_tokens=max_tokens, even_batches=False, **options) for name, src in self.sources.items()
        }
        shape = {"max_tokens": max_tokens, "strategy": "bucket"}
        return PackedMixture(self, packed, shape, unit=max_tokens, slots=1, num_tokens=num_tokens)


def _no_even_batches(options: dict[str, Any]) -> None:
    for key in ("even_batches", "drop_last"):
        if key in options:
            raise ConfigError(f"`{key}` does not apply to a mixture: its sources never end, so batches never do")


@dataclass(frozen=True)
class _MixtureBatches:
    """What :class:`~arrowstream.pytorch.TorchDataset` reads of a packer: the batch keys."""

    batch_keys: tuple[str, ...] = MIXTURE_KEYS


class PackedMixture:
    """A mixture packed into batches of rows; iterate it, or ``iter(state, rank=..., ...)``."""

    def __init__(
        self,
        mixture: Mixture,
        pipelines: dict[str, Dataset],
        shape: dict[str, Any],
        *,
        unit: int,
        slots: int,
        num_tokens: int | None = None,
    ) -> None:
        self.mixture = mixture
        self.names = tuple(pipelines)
        self.pipelines = pipelines
        self.shape = shape  # the batch shape options a state checks
        self.strategy: str = shape["strategy"]
        self.unit = unit  # tokens one slot of the schedule is worth: a row, or a bucketed batch
        self.slots = slots  # slots of the schedule in one consumer's batch
        num_tokens = check_int("num_tokens", num_tokens, none_ok=True)
        self.num_rows = None if num_tokens is None else -(-num_tokens // unit)  # the run's end, in slots
        # the same options pack every source, but each source's tokenizer may name its own EOS (the default pad)
        self.pad_ids = tuple(int(p.packer.pad_id) for p in pipelines.values())
        keys = PADDED_KEYS if self.strategy == "bucket" else BATCH_KEYS
        self.packer = _MixtureBatches((*keys, "source_ids"))

    def options(self) -> dict[str, Any]:
        """Return what a state checks: sources, stages, seed, caps, row shape and strategy (not ``num_tokens``: a run may be extended)."""
        return {
            "sources": list(self.names),
            "stages": [[start, list(counts)] for start, counts in self.mixture.stages],
            "seed": self.mixture.seed,
            "max_epochs": dict(sorted(self.mixture.max_epochs.items())),
            **self.shape,
        }

    def stages_for(self, world_size: int) -> list[Stage]:
        """Return the schedule's stages, their starts in global slots (whole global steps of ``world_size`` ranks)."""
        step = world_size * self.slots
        return [Stage(math.ceil(start / (self.unit * step)) * step, counts) for start, counts in self.mixture.stages]

    def report(self, num_tokens: int, *, world_size: int = 1, num_workers: int = 1) -> pl.DataFrame:
        """Return, per source, what a run of ``num_tokens`` takes from it and the epochs that implies.

        See :func:`~arrowstream.mixture.report.budget_report`: weight, target
        tokens, tokens an epoch holds (counted or estimated), epochs, the
        most epochs of its own share a consumer of ``world_size`` ranks x
        ``num_workers`` DataLoader workers reads, cap, and whether the
        source would run out on that topology.
        """
        from arrowstream.mixture.report import budget_report

        return budget_report(self, num_tokens, world_size=world_size, num_workers=num_workers)

    def iter(
        self,
        state: dict[str, Any] | None = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
    ) -> MixtureIterator:
        """Return an iterator for one consumer (rank x DataLoader worker), from the start or ``state``."""
        from arrowstream.mixture.iterator import MixtureIterator

        return MixtureIterator(self, state, rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)

    def __iter__(self) -> MixtureIterator:
        return self.iter()

    def to_torch(
        self,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        columns: Sequence[str] | None = None,
        prefetch: int | None = None,
        sharing: str | None = "auto",
    ) -> TorchDataset:
        """Return a ``torch.utils.data.IterableDataset`` of tensor batches (see :meth:`Dataset.to_torch <arrowstream.Dataset.to_torch>`)."""
        from arrowstream.pytorch import TorchDataset

        return TorchDataset(  # type: ignore[arg-type]
            self, rank=rank, world_size=world_size, columns=columns, prefetch=prefetch, sharing=sharing
        )
