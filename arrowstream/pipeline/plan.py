"""The read plan: what a pipeline description implies for reading, worked out once.

A :class:`~arrowstream.Dataset` only describes (files, stages, packer,
options). A :class:`Plan` holds what iterating it needs: the columns to read
and the reader, the row groups that filter statistics rule out, each epoch's
layout, each consumer's fresh share, the even-batches target and the
prefetch depth. The iterator runs a plan (its chunks come from
:func:`arrowstream.pipeline.reading.iter_chunks`) and never calls back into
the description.

A plan is a pure function of its description, so :meth:`Plan.of` builds one
per description object and process and its iterators share it (its caches
fill as they are used, from any thread: a value computed twice is the same).
Nothing of it travels with a pickled description: a DataLoader worker builds
its own.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import numpy as np

from arrowstream.core.stage import KnownTokens
from arrowstream.distributed.balance import (
    Sample,
    batch_target,
    byte_cut,
    doc_target,
    measure_sample,
    token_estimates,
)
from arrowstream.distributed.recut import counted_lengths, estimated_lengths, weighted_recut
from arrowstream.distributed.tokens import (
    BatchCut,
    TokenCounts,
    batch_cut,
    batch_recut,
    batch_share,
    part_chunks,
    part_tokens,
    rank_targets,
    token_cut,
)
from arrowstream.distributed.topology import Consumer, Left, RowRange
from arrowstream.errors import StateError
from arrowstream.io.chunk import Chunk
from arrowstream.io.layout import Layout
from arrowstream.io.readahead import ReadAhead, read_ahead_depth
from arrowstream.io.reader import Reader, ShardReader
from arrowstream.pipeline.options import (
    Description,
    columns_to_read,
    pipeline_options,
    prefetch_depth,
)
from arrowstream.state import Work, hash_options

__all__ = ["Plan"]


#: id(description) -> (weak reference to it, its plan)
_PLANS: dict[int, tuple[weakref.ref[Any], Plan]] = {}


class Plan:
    """Everything reading a pipeline needs, derived from its description.

    Parameters
    ----------
    description
        The pipeline; the plan keeps its parts, not the description itself.

    Examples
    --------
    >>> import pyarrow.compute as pc
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> plan = Plan.of(read_parquet(example_dir()).filter(pc.field("n") >= 4))
    >>> plan.num_pruned_rows, plan.fresh_work(0, Consumer(0, 1)), plan.prefetch_depth
    (4, [(0, 0, 8, 0, 0)], 0)
    """

    def __init__(self, description: Description) -> None:
        self.manifest = description.manifest
        self.stages = description.stages
        self.packer = description.packer
        self.num_epochs = description.num_epochs
        self.batch_rows = description.batch_rows
        self.seed, self.window, self.fragments = description.seed, description.window, description.fragments
        self.columns = columns_to_read(description)
        self._options = pipeline_options(description, self.columns)
        self.options_hash = hash_options(self._options)
        self.prefetch_depth = prefetch_depth(description.prefetch, self.stages)
        self.num_inflight = max((s.num_inflight for s in self.stages if s.expensive), default=1)
        self.added_files = description.added_files
        self.skip_unreadable = getattr(description, "on_error", "raise") == "skip"
        self.balanced = bool(getattr(description, "balanced", False))
        self._clear()

    def _clear(self) -> None:
        """Forget everything worked out from the manifest."""
        self._shards: np.ndarray | None = None
        self._layouts: dict[tuple[int, int], Layout] = {}
        self._sample: Sample | None = None
        self._read_bytes: np.ndarray | None = None
        self._estimates: np.ndarray | None = None
        self._token_counts: TokenCounts | None | bool = False  # False: not worked out yet
        self._known: list[KnownTokens | None] | None = None  # what each stage tells of its tokens
        self._targets: dict[tuple[Any, ...], list[int]] = {}
        self._batch_cuts: dict[tuple[int, int], BatchCut] = {}

    @classmethod
    def of(cls, description: Description) -> Plan:
        """Return the plan of ``description``, built on first use and shared while it lives."""
        key = id(description)
        hit = _PLANS.get(key)
        if hit is not None and hit[0]() is description:
            return hit[1]
        plan = cls(description)
        _PLANS[key] = (weakref.ref(description, lambda _: _PLANS.pop(key, None)), plan)
        return plan

    def at(self, epoch: int) -> Plan:
        """Return the plan ``epoch`` is cut by: this one (see :class:`~arrowstream.pipeline.growth.GrownPlan`)."""
        return self

    def describe(self, epoch: int) -> dict[str, Any]:
        """Return the data identity a state saved in ``epoch`` carries: the manifest's."""
        return self.manifest.describe()

    # -- identity and reading -----------------------------------------------------

    def options(self) -> dict[str, Any]:
        """Return the pipeline's options (a copy: states carry them)."""
        return copy.deepcopy(self._options)

    def make_reader(self) -> Reader:
        """Return a reader of the columns this pipeline reads, wrapped by the stages that wrap it.

        A stage whose columns no other stage (nor the output, when there is no
        packer) reads is told it need not keep them (the token cache then reads
        the text only to fill a miss).
        """
        depth = read_ahead_depth(self.manifest)
        reader: Reader = (
            ReadAhead(self.manifest, self.columns, depth=depth, skip_unreadable=self.skip_unreadable)
            if depth
            else ShardReader(self.manifest, self.columns, skip_unreadable=self.skip_unreadable)
        )
        for stage in self.stages:
            used = stage.columns() or set()
            others = any(
                s is not stage and (s.columns() is None or used & s.columns()) for s in self.stages
            )
            reader = stage.wrap_reader(reader, keep_text=self.packer is None or others)  # type: ignore[arg-type]
        return reader

    # -- epochs and shares ----------------------------------------------------------

    @property
    def shards(self) -> np.ndarray:
        """Manifest indices of the shards read every epoch: all but those filter statistics rule out."""
        if self._shards is None:
            mask = np.ones(self.manifest.num_shards, dtype=bool)
            for stage in self.stages:
                ruled_out = stage.prune(self.manifest)
                if ruled_out is not None:
                    mask &= ruled_out
            self._shards = np.flatnonzero(mask)
        return self._shards

    @property
    def num_pruned_shards(self) -> int:
        """Row groups per epoch that filter statistics rule out (never read)."""
        return self.manifest.num_shards - int(self.shards.size)

    @property
    def num_pruned_rows(self) -> int:
        """Rows per epoch in row groups that filter statistics rule out."""
        return self.manifest.num_rows - int(self.manifest.shard_rows[self.shards].sum())

    def layout(self, epoch: int, num_streams: int = 1, by: str = "rows") -> Layout:
        """Return the order of ``epoch`` cut into ``num_streams`` streams of equal rows or tokens (a few kept).

        Raises
        ------
        StateError
            Streams by tokens asked of a pipeline that cannot count them (a
            state saved by another pipeline).
        """
        key = (epoch, num_streams, by)
        layout = self._layouts.get(key)
        if layout is None:
            if len(self._layouts) >= 4:  # a few at most: they are cheap to rebuild
                self._layouts.pop(next(iter(self._layouts)), None)
            layout = self._layouts[key] = self._layout(epoch, num_streams, by)
        return layout

    def _layout(self, epoch: int, num_streams: int, by: str) -> Layout:
        def cut(at: np.ndarray | None) -> Layout:
            return Layout(
                self.shards,
                self.manifest.shard_rows,
                epoch=epoch,
                seed=self.seed,
                window=self.window,
                num_streams=num_streams,
                fragments=self.fragments,
                cut=at,
            )

        rows = cut(None)
        if by == "rows" or num_streams == 1:
            return rows
        if by == "bytes":
            return cut(byte_cut(rows, self.manifest.shard_rows, self.read_bytes()))
        if by == "estimate":
            return cut(byte_cut(rows, self.manifest.shard_rows, self.estimated_tokens()))
        counts = self.token_counts
        per_batch = None if self.packer is None else self.packer.exact_batches(0)
        if counts is None or (by == "batches" and per_batch is None):
            raise StateError(
                f"the state's epoch {epoch} was cut into streams of equal tokens, but this pipeline "
                f"cannot count its tokens before reading ({self.balance}): resume with the pipeline "
                "that saved it"
            )
        if by == "tokens":
            return cut(token_cut(rows, counts))
        return cut(self.batch_cut(epoch, num_streams).rows)

    def batch_cut(self, epoch: int, num_streams: int) -> BatchCut:
        """Return ``epoch`` cut into ``num_streams`` shares of whole batches of tokens (a few kept).

        See :func:`~arrowstream.distributed.tokens.batch_cut`; only for a
        packer whose batches the tokens decide (``concat``) over counted tokens.
        """
        key = (epoch, num_streams)
        hit = self._batch_cuts.get(key)
        if hit is None:
            if len(self._batch_cuts) >= 4:
                self._batch_cuts.pop(next(iter(self._batch_cuts)), None)
            assert self.packer is not None and self.token_counts is not None
            per_batch = self.packer.seq_len * self.packer.batch_size
            rows = Layout(
                self.shards, self.manifest.shard_rows, epoch=epoch, seed=self.seed, window=self.window,
                num_streams=num_streams, fragments=self.fragments,
            )
            hit = self._batch_cuts[key] = batch_cut(rows, self.token_counts, per_batch)
        return hit

    @property
    def streams_by(self) -> str:
        """How fresh epochs are cut into streams for even batches (or a mixture's capped source, ``balanced``).

        ``"batches"`` when batch counts are counted and the tokens decide them
        (``concat``): every consumer gets whole batches of tokens, a document
        split where a share ends (:func:`~arrowstream.distributed.tokens.batch_cut`);
        ``"tokens"`` when they are counted by running the packer (equal tokens,
        cut between documents); ``"estimate"`` (each row
        group's Parquet bytes times the token rate of a nearby sampled row
        group, see :func:`~arrowstream.distributed.balance.token_estimates`)
        when they are estimated (``"bytes"``, equal Parquet bytes, in states
        before version 5);
        ``"rows"`` without either, or when a batch takes a fixed number
        of documents (``.bucket(batch_size=...)``).
        """
        even = self.packer is not None and (self.packer.even_batches or self.balanced) and self.num_epochs is not None
        if not even or self.packer.counts_documents:  # type: ignore[union-attr]
            return "rows"  # batches of a fixed number of documents: equal rows keep counts even
        if self.token_counts is None:
            return "estimate"
        return "batches" if self.packer.exact_batches(0) is not None else "tokens"  # type: ignore[union-attr]

    def recut(
        self, epoch: int, num_streams: int, by: str, pooled: list[RowRange], parts: int, left: Left | None = None
    ) -> list[list[RowRange]] | None:
        """Cut an epoch's pooled rows (an elastic resume's) into shares of even batches, or ``None`` (equal rows).

        For a counted ``concat`` (:attr:`streams_by` ``"batches"``), shares of
        whole batches, so every new rank's count for the rest of the epoch is
        within one of the others' (:func:`~arrowstream.distributed.tokens.batch_recut`);
        with other even batches (``"tokens"``, ``"estimate"``), shares of equal
        tokens, counted or estimated, cut between documents
        (:func:`~arrowstream.distributed.recut.weighted_recut`): a look-ahead
        packer's held documents, most of their tokens already emitted, weigh
        what they have left (counted; estimated, what their states recorded,
        ``left``). Batches of a fixed number of documents, and pipelines
        without even batches, re-deal equal rows.
        """
        mode = self.streams_by
        if mode == "rows":
            return None
        layout = self.layout(epoch, num_streams, by)
        counts = self.token_counts
        if mode == "batches":
            assert self.packer is not None and counts is not None
            per_batch = self.packer.seq_len * self.packer.batch_size
            return batch_recut(layout, counts, pooled, per_batch, parts)
        if counts is not None:
            return weighted_recut(pooled, counted_lengths(layout, counts), parts)
        tokens = estimated_lengths(layout, self.manifest.shard_rows, self.estimated_tokens())
        return weighted_recut(pooled, tokens, parts, left=left or {}, counted=False)

    def fresh_work(self, epoch: int, consumer: Consumer) -> list[RowRange]:
        """Return ``consumer``'s share of a fresh ``epoch``: its own stream, whole."""
        return list(self.fresh_deal(epoch, consumer).segments)

    def fresh_deal(self, epoch: int, consumer: Consumer) -> Work:
        """Return ``consumer``'s share of a fresh ``epoch`` with the layout it refers to."""
        by = self.streams_by
        layout = self.layout(epoch, consumer.count, by)
        if by == "batches":
            assert self.token_counts is not None
            share = batch_share(layout, self.token_counts, self.batch_cut(epoch, consumer.count), consumer.index)
            return Work(consumer.count, tuple(share), by=by)
        return Work(consumer.count, ((consumer.index, 0, layout.stream_rows(consumer.index), 0, 0),), by=by)

    # -- even batches -----------------------------------------------------------------

    @property
    def token_counts(self) -> TokenCounts | None:
        """Exact tokens of any share and document, when the stages tell them before an epoch.

        One stage must say each row's tokens (:meth:`~arrowstream.core.stage.Stage.known_tokens`:
        the tokenize stage over token ids, a complete read-only token cache or
        a length index) and every other keep its rows. Then every consumer's
        batch count is known: from its tokens (``concat``), or by running the
        packer over its documents' lengths (``best_fit``, ``bucket``). ``None``
        otherwise: the even-batches target is then estimated.
        """
        if self._token_counts is False:
            self._token_counts = None
            if self.packer is not None:
                known = self._stage_tokens()
                told = [k for k in known if k is not None]
                if len(told) == 1 and all(k is not None or s.keeps_rows for s, k in zip(self.stages, known)):
                    counted = told[0]
                    if self.skip_unreadable:  # as the read skips it, a row group that does not decode has no token
                        counted = counted.skipping_unreadable(self.manifest)
                    self._token_counts = TokenCounts(self.manifest, counted)
        return self._token_counts  # type: ignore[return-value]

    def _stage_tokens(self) -> list[KnownTokens | None]:
        """What each stage tells of its tokens before reading (asked once: a cache reads footers)."""
        if self._known is None:
            self._known = [stage.known_tokens(self.manifest) for stage in self.stages]
        return self._known

    @property
    def balance(self) -> str:
        """How consumers get equal batch counts: ``"counted: ..."``, ``"estimated: ..."`` or ``"off: ..."``, with why.

        Examples
        --------
        >>> import pyarrow.compute as pc
        >>> from arrowstream import read_parquet
        >>> from arrowstream.testing import example_dir
        >>> ds = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0)
        >>> Plan.of(ds.pack(seq_len=4, batch_size=2)).balance
        'counted: token ids (whole row groups from the footers)'
        >>> Plan.of(ds.pack(seq_len=4, batch_size=2, strategy="best_fit")).balance
        'counted: token ids (whole row groups from the footers; batches by running best_fit on the lengths, from a length index where there is one, else read)'
        >>> Plan.of(read_parquet(example_dir()).filter(pc.field("n") > 0).tokenize(None, column="ids", eos_id=0)
        ...         .pack(seq_len=4, batch_size=2)).balance
        'estimated: filter may drop rows before they are read'
        """
        packer = self.packer
        if packer is None:
            return "off: no packer (items are record batches)"
        if not packer.even_batches:
            return "off: even_batches=False"
        if self.num_epochs is None:
            return "off: endless epochs (no epoch end to wait at)"
        if self.token_counts is not None:
            known = self.token_counts.known
            how = "whole row groups from the footers" if known.per_shard is not None else "read per row group"
            if packer.exact_batches(0) is None:
                how += f"; batches by running {packer.name} on the lengths{known.rows_from}"
            return f"counted: {known.source} ({how})"
        known = self._stage_tokens()
        droppers = [s.name for s, k in zip(self.stages, known) if k is None and not s.keeps_rows]
        if all(k is None for k in known):
            return (
                "estimated: text without a length index (build one with `arrowstream index PATH "
                "--tokenizer T`) or a complete token cache read only (fill it with `arrowstream "
                "cache`, then read it with `cache_write=False`, or `--cache-read-only`)"
            )
        return f"estimated: {', '.join(droppers)} may drop rows before they are read"

    def batch_targets(
        self,
        epoch: int,
        parts: list[list[RowRange]],
        num_streams: int,
        by: str = "rows",
        per_rank: int = 1,
        left: Left | None = None,
    ) -> list[int]:
        """Return the batches each consumer emits in ``epoch`` given all consumers' ``parts`` (rank-major).

        Exact when the tokens of every share are known (:attr:`token_counts`):
        every rank emits as many batches as the largest rank's consumers give
        together, so no consumer has data beyond its target; a rank's
        padding goes to its workers with the fewest batches
        (:func:`~arrowstream.distributed.tokens.rank_targets`; ``per_rank``
        consumers a rank). Else estimated, the same for every consumer (see
        :mod:`~arrowstream.distributed.balance`), where held documents of an
        elastic resume count the tokens ``left`` recorded for them.
        """
        left = left or {}
        key = (epoch, tuple(tuple(p) for p in parts), num_streams, by, per_rank, tuple(sorted(left.items())))
        hit = self._targets.get(key)
        if hit is None:
            if len(self._targets) >= 4:  # a few epochs' worth: every iterator of a process asks the same
                self._targets.pop(next(iter(self._targets)), None)
            hit = self._targets[key] = self._batch_targets(epoch, parts, num_streams, by, per_rank, left)
        return list(hit)

    def _batch_targets(
        self, epoch: int, parts: list[list[RowRange]], num_streams: int, by: str, per_rank: int, left: Left
    ) -> list[int]:
        packer = self.packer
        assert packer is not None
        counts = self.token_counts
        if counts is not None:
            layout = self.layout(epoch, num_streams, by)
            natural = []
            for part in parts:
                exact = packer.exact_batches(part_tokens(layout, counts, part))
                if exact is None:  # the packing decides: run it over the documents' lengths
                    exact = packer.count_batches(part_chunks(layout, counts, part, self.batch_rows))
                natural.append(exact)
            return rank_targets(natural, per_rank)
        return [self._estimated_target(epoch, parts, num_streams, by, left)] * len(parts)

    def _estimated_target(
        self, epoch: int, parts: list[list[RowRange]], num_streams: int, by: str, left: Left
    ) -> int:
        packer = self.packer
        assert packer is not None
        sample = self.sample()
        rows = min((sum(hi - lo for _, lo, hi, _, _ in part) for part in parts), default=0)
        docs, per_batch = packer.per_batch(
            sample.lengths,
            num_docs=rows * sample.docs_per_row,
            docs_per_read=self.batch_rows * sample.docs_per_row,
        )
        if docs is not None:  # batches of a fixed number of documents
            return doc_target(parts, sample.docs_per_row, docs)
        return batch_target(  # each share's tokens: its rows' shares of their row groups' estimates
            self.layout(epoch, num_streams, by),
            self.manifest.shard_rows,
            self.estimated_tokens(),
            1.0,
            parts,
            per_batch,
            left=left,
        )

    def sample(self) -> Sample:
        """Return the stages' output on a fixed sample of rows (see :mod:`~arrowstream.distributed.balance`)."""
        if self._sample is None:
            self._sample = measure_sample(
                self.manifest, self.columns, self.shards, self.stages, self.where, self.read_bytes(),
                skip_unreadable=self.skip_unreadable,
            )
        return self._sample

    def estimated_tokens(self) -> np.ndarray:
        """Return every shard's estimated tokens (see :func:`~arrowstream.distributed.balance.token_estimates`)."""
        if self._estimates is None:
            self._estimates = token_estimates(
                self.shards, self.sample(), self.read_bytes(), self.manifest.shard_file
            )
        return self._estimates

    def read_bytes(self) -> np.ndarray:
        """Return the uncompressed bytes per shard of the columns read."""
        if self._read_bytes is None:
            self._read_bytes = self.manifest.column_bytes(self.columns)
        return self._read_bytes

    # -- naming ---------------------------------------------------------------------------

    def where(self, chunk: Chunk) -> str:
        """Name the file, row group and rows of ``chunk``, for error messages."""
        m = self.manifest
        if chunk.mixed:
            shards = list(dict.fromkeys(chunk.mixed))  # each row group once, in the window's order
            groups = ", ".join(
                f"{m.paths[int(m.shard_file[s])]!r} row group {int(m.shard_row_group[s])}" for s in shards[:4]
            )
            more = f" and {len(shards) - 4} more" if len(shards) > 4 else ""
            return f"in a shuffle window over {groups}{more}"
        path = m.paths[int(m.shard_file[chunk.shard])]
        rows = f"{chunk.row_start}..{chunk.row_start + chunk.seq_end - chunk.seq_start - 1}"
        return f"in {path!r}, row group {int(m.shard_row_group[chunk.shard])}, rows {rows}"
