"""The pipeline description: an immutable, picklable chain built from ``read_parquet``.

``read_parquet(...)`` gives a :class:`Dataset`; ``.filter``, ``.tokenize`` and
``.pack`` each return a new one. Nothing is read until you iterate: ``iter(ds)``
or ``ds.iter()`` returns a :class:`~arrowstream.pipeline.iterator.DatasetIterator`,
which holds the state. Options are validated against the schema when each step
is added, so mistakes surface before any data is read.

What iteration yields depends on the last step: record batches of the
selected columns (after ``read_parquet`` or ``filter``), record batches with an
``input_ids`` ``list<int32>`` column (after ``tokenize``), dicts of numpy
arrays of fixed shape (after ``pack``), or dicts of numpy arrays with one
document per row, of varying shape (after ``bucket``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc
from tokenizers import Tokenizer

from arrowstream.checks import check_choice, check_int, check_options
from arrowstream.core.stage import Stage
from arrowstream.distributed.topology import Consumer
from arrowstream.errors import ConfigError
from arrowstream.filter import Filter
from arrowstream.io.manifest import Manifest, read_manifest
from arrowstream.pack import Packer
from arrowstream.pack.bucket import BucketPacker
from arrowstream.pack.strategies import make_packer
from arrowstream.pipeline.growth import ADDED_FILES
from arrowstream.pipeline.iterator import DatasetIterator
from arrowstream.pipeline.plan import Plan
from arrowstream.tokenize import Tokenize

if TYPE_CHECKING:
    from arrowstream.pytorch import TorchDataset

__all__ = ["Dataset", "read_parquet"]


def read_parquet(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    columns: Sequence[str] | None = None,
    filesystem: Any = None,
    num_epochs: int | None = 1,
    batch_rows: int = 1024,
    prefetch: int | None = None,
    added_files: str = "refuse",
    manifest: str | os.PathLike[str] | None = None,
    on_error: str = "raise",
) -> Dataset:
    """Open Parquet files as a dataset of row-group shards (footers only are read).

    Parameters
    ----------
    source
        A directory (searched recursively for ``*.parquet``), a glob, a file, a
        list of files, or a URI that ``pyarrow.fs`` resolves (``s3://...``).
    columns
        Columns to read; ``None`` reads every column (a packed pipeline without
        a filter reads only the token column).
    filesystem
        A ``pyarrow.fs.FileSystem`` or an fsspec filesystem; inferred if ``None``.
    num_epochs
        Passes over the data; ``None`` repeats forever.
    batch_rows
        Rows per record batch read (does not change packed output).
    prefetch
        Chunks read and tokenized ahead in a background thread; 0 reads
        inline. ``None`` (the default) prefetches 2 chunks when the pipeline
        reads token ids (a pre-tokenized column or a token cache), where
        reading is the work (measured 1.3 to 1.6 times faster), and reads
        inline when it tokenizes text (the encoder calls already run in a
        thread pool; measured as fast). Does not change the output. With a
        background thread, ``close()`` iterators you are done with.
    added_files
        What a state saved before files were added to the corpus does:
        ``"refuse"`` (the default: a state resumes only on the files it was
        saved on) or ``"next_epoch"`` (the epochs the state had begun finish
        over the old files, exactly as they would have; the added files join
        from the next epoch). Added files must sort after the old ones
        (``part-00010.parquet`` after ``part-00009.parquet``). See
        ``docs/guide.md``, "Growing corpora".
    manifest
        A manifest file of ``source`` (``arrowstream manifest``), local or
        remote: opens with no listing and no footer read; the same dataset
        and states. See ``docs/storage.md``.
    on_error
        An unreadable row group: ``"raise"`` a ``ShardError`` naming it;
        ``"skip"`` leave its rows out, counted (``stats["unreadable"]``),
        warned about, the same ones on every resume. Storage errors, missing
        or changed files always raise.

    Returns
    -------
    Dataset

    Examples
    --------
    >>> from arrowstream.testing import example_dir
    >>> ds = read_parquet(example_dir())  # 12 rows in row groups of 4
    >>> [b.num_rows for b in ds]
    [4, 4, 4]
    >>> next(iter(ds)).column("text").to_pylist()
    ['zero', 'one', 'two', 'three']
    """
    check_choice("on_error", on_error, ("raise", "skip"))
    num_epochs = check_int("num_epochs", num_epochs, none_ok=True)
    batch_rows = check_int("batch_rows", batch_rows)  # type: ignore[assignment]
    prefetch = check_int("prefetch", prefetch, low=0, none_ok=True)
    check_choice("added_files", added_files, ADDED_FILES)
    opened = read_manifest(source, columns=columns, filesystem=filesystem, manifest=manifest)
    return Dataset(
        manifest=opened,
        columns=None if columns is None else tuple(columns),
        num_epochs=num_epochs,
        batch_rows=batch_rows,
        prefetch=prefetch,
        added_files=added_files,
        on_error=on_error,
    )


_PACK_OR_BUCKET = (
    "the pipeline already has its last step: `.pack` and `.bucket` are alternatives (packed "
    "rows or one document per row); call one of them, once"
)


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """An immutable description of a pipeline over Parquet row groups.

    Build it with :func:`read_parquet`, then chain :meth:`filter`,
    :meth:`tokenize` and :meth:`pack`.
    """

    manifest: Manifest
    columns: tuple[str, ...] | None = None
    num_epochs: int | None = 1
    batch_rows: int = 1024
    prefetch: int | None = None
    seed: int | None = None
    window: int = 8
    fragments: int = 2
    stages: tuple[Stage, ...] = ()
    packer: Packer | None = None
    added_files: str = "refuse"
    on_error: str = "raise"
    balanced: bool = False  # shares of equal tokens without even batches: a mixture's capped source

    # -- building -----------------------------------------------------------------

    def filter(self, expr: pc.Expression) -> Dataset:
        """Keep rows where ``expr`` is true; row groups whose statistics rule it out are skipped.

        Examples
        --------
        >>> import pyarrow.compute as pc
        >>> from arrowstream.testing import example_dir
        >>> ds = read_parquet(example_dir()).filter(pc.field("n") > 8)
        >>> [b.column("n").to_pylist() for b in ds], ds.num_pruned_rows  # 2 row groups never read
        ([[9, 10, 11]], 8)
        """
        return self._add_stage(Filter(expr))

    def shuffle(self, seed: int, *, window: int = 8, fragments: int = 2) -> Dataset:
        """Shuffle: a new order every epoch, rows mixed across row groups.

        Every row group is cut into ``fragments`` row ranges, the row ranges
        of all row groups are permuted per epoch, and the rows of each shuffle
        window of ``window * fragments`` row ranges (about ``window`` row
        groups' worth) are emitted in a permuted order. The order is a pure function of
        ``(seed, epoch)``: nothing is buffered or stored, so a resume is exact
        and a state stays small. Memory grows with ``window``; each row group
        is read ``fragments`` times per epoch (reading is cheap next to
        tokenizing). See ``docs/guide.md`` for the measured shuffle quality.

        Examples
        --------
        >>> from arrowstream.testing import example_dir
        >>> ds = read_parquet(example_dir(), num_epochs=2).shuffle(seed=0, window=2)
        >>> order = [n for b in ds for n in b.column("n").to_pylist()]
        >>> order[:12], order[12:]
        ([4, 9, 2, 3, 1, 5, 8, 0, 6, 7, 11, 10], [10, 9, 2, 6, 7, 3, 8, 11, 4, 0, 1, 5])
        >>> sorted(order[:12]) == sorted(order[12:]) == list(range(12))  # every row once per epoch
        True
        """
        if self.seed is not None:
            raise ConfigError("the pipeline is already shuffled: call `.shuffle` once")
        if self.stages or self.packer is not None:
            raise ConfigError("call `.shuffle` right after `read_parquet`, before other steps")
        seed = check_int("seed", seed, low=0)  # type: ignore[assignment]
        window = check_int("window", window, hint="row groups mixed")  # type: ignore[assignment]
        fragments = check_int("fragments", fragments)  # type: ignore[assignment]
        return replace(self, seed=seed, window=window, fragments=fragments)

    def tokenize(self, tokenizer: Tokenizer | str | os.PathLike[str] | None, **options: Any) -> Dataset:
        """Tokenize ``column`` into an ``input_ids`` column; ``tokenizer=None`` reads ids as they are.

        ``options`` are those of :class:`~arrowstream.tokenize.Tokenize`
        (validated there, once): ``column`` (``"text"``), ``add_eos``,
        ``eos_id``, ``add_special_tokens``, ``num_inflight``, ``slice_bytes``,
        ``first_slice_bytes``, ``loss_mask``, ``backend``, ``cache``, ``cache_write``,
        ``length_index``. Null and empty documents are skipped and counted (``stats["null"]``,
        ``stats["empty"]``). ``loss_mask`` names a column of per-token loss
        masks next to pre-tokenized ids; masked tokens get ``-100`` in the
        packed ``labels``. ``backend`` picks the encoder: ``"auto"`` (the
        faster ``tiktoken`` encoder for a byte-level BPE once proven to give
        the same ids, else ``tokenizers``), ``"tiktoken"`` or ``"tokenizers"``
        (see ``docs/encoders.md``). ``cache`` names a token cache directory:
        each row group's ids are read from it, or tokenized once and kept
        there (``cache_write=False``: read only), so later epochs and runs
        skip tokenizing (see :mod:`arrowstream.tokenize.cache`). Neither changes the output.

        Examples
        --------
        >>> from arrowstream.testing import example_dir
        >>> ds = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0)
        >>> next(iter(ds)).column("input_ids").to_pylist()[:3]
        [[10, 11, 12, 0], [20, 0], [30, 31, 0]]
        """
        if any(isinstance(s, Tokenize) for s in self.stages):
            raise ConfigError("the pipeline is already tokenized: call `.tokenize` once")
        check_options(".tokenize", options, Tokenize)
        return self._add_stage(Tokenize(tokenizer, **options))

    def pack(self, *, strategy: str = "concat", pad_id: int | None = None, **options: Any) -> Dataset:
        """Pack tokens into batches of ``batch_size`` rows of ``seq_len`` tokens.

        ``options`` are those of the strategy's packer (validated there,
        once): ``seq_len`` and ``batch_size`` (required), ``drop_last``,
        ``even_batches``, and for ``best_fit`` those of
        :class:`~arrowstream.pack.bestfit.BestFitPacker`.

        Each batch is a dict: ``input_ids``, ``labels`` (``int64``, ``-100``
        on padding and at document boundaries), ``position_ids`` (restarting
        at every document and row start) and ``segment_ids`` (1..k within a
        row, 0 on padding), all ``[batch_size, seq_len]``; ``cu_seqlens`` and
        ``max_seqlen`` for variable-length attention; and the counts
        ``num_tokens``, ``num_padding_tokens``, ``num_docs``,
        ``num_cut_docs`` (see :mod:`arrowstream.pack.assemble`). Batches never span
        epochs; the last one of an epoch is padded, or dropped and counted in
        ``stats["dropped_tokens"]`` with ``drop_last=True``. ``pad_id``
        defaults to the EOS id (0 without one).

        ``strategy="concat"`` joins documents into full rows and cuts them at
        row ends (no padding but the epoch's last batch).
        ``strategy="best_fit"`` keeps documents whole where they fit, placing
        them by best-fit decreasing over a look-ahead ``window`` of documents
        (default 1024); rows close at ``fill`` (0.98), after ``max_age``
        windows (4) or beyond ``max_open`` open rows (``4 * batch_size``);
        documents longer than ``seq_len`` are handled by ``long_docs``
        (``"split"``, ``"truncate"``, ``"drop"``); closed rows are shuffled
        in blocks of ``shuffle_batches`` batches (4) seeded by ``seed`` (0).
        See :mod:`arrowstream.pack.bestfit`.

        With several consumers (ranks x workers) and finite epochs,
        ``even_batches=True`` makes every rank emit the same number of
        batches per epoch, so no rank waits for another at an epoch end. Over
        token ids, or text with a length index or a complete read-only token
        cache, the number is counted (for ``best_fit`` and ``bucket`` by
        running the packer over every share's lengths): the largest rank's, so
        nothing is dropped and the others pad with all-padding batches
        (``stats["padding_batches"]``); a rank's DataLoader workers may end
        at different times. Otherwise it is estimated, identically on every
        consumer, from the Parquet bytes of each share and a tokenized
        sample; a consumer with data left at that count carries it into the
        next epoch's count (``stats["carried_docs"]``), and only in the last
        epoch drops it (``stats["dropped_docs"]``, ``stats["dropped_tokens"]``,
        a ``DataLossWarning``; ``even_batches="drop"``: in every epoch).
        Every document is emitted or counted as
        dropped, once.

        Examples
        --------
        >>> from arrowstream.testing import example_dir
        >>> ds = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0).pack(
        ...     seq_len=4, batch_size=2)
        >>> batch = next(iter(ds))
        >>> batch["input_ids"].tolist(), batch["segment_ids"].tolist()
        ([[10, 11, 12, 0], [20, 0, 30, 31]], [[1, 1, 1, 1], [1, 1, 2, 2]])
        """
        if isinstance(self.packer, BucketPacker):
            raise ConfigError(_PACK_OR_BUCKET)
        if self.packer is not None:
            raise ConfigError("the pipeline is already packed: call `.pack` once")
        if self._tokenize_stage() is None:
            raise ConfigError("`.pack` needs tokens: call `.tokenize(...)` before `.pack(...)`")
        return replace(self, packer=make_packer(strategy, pad_id=self._pad_id(pad_id), **options))

    def bucket(self, *, pad_id: int | None = None, **options: Any) -> Dataset:
        """Batch whole documents of similar length, one per row, padded to the batch's longest.

        ``options`` are those of :class:`~arrowstream.pack.bucket.BucketPacker`
        (validated there, once): ``batch_size`` or ``max_tokens``, ``window``
        (1024), ``max_len``, ``long_docs`` (``"split"``),
        ``pad_to_multiple_of`` (1), ``drop_last``, ``even_batches``, ``seed`` (0).

        For training without packing (fine-tuning, evaluation). Each
        ``window`` of documents is sorted by length and cut into batches of
        ``batch_size`` rows, or, with ``max_tokens``, of as many rows as fit
        ``rows x width <= max_tokens``; the batches of a window go out in a
        shuffled order (``seed``). Pass exactly one of ``batch_size`` and
        ``max_tokens``. Each batch is a dict: ``input_ids``,
        ``attention_mask`` (1 on tokens, 0 on padding), ``labels`` (``int64``,
        ``-100`` on padding) and ``position_ids``, all ``[rows, width]``
        where ``width`` is the batch's longest document rounded up to
        ``pad_to_multiple_of`` (shapes vary from batch to batch); and the
        counts ``num_tokens``, ``num_padding_tokens``, ``num_docs``.
        Documents longer than ``max_len`` are split into pieces of ``max_len``,
        truncated or dropped (``long_docs``) and counted. ``pad_id`` defaults to the
        EOS id (0 without one). ``drop_last`` and ``even_batches`` work as in
        :meth:`pack`. See :mod:`arrowstream.pack.bucket` and ``docs/bucketing.md``.

        Examples
        --------
        >>> from arrowstream.testing import example_dir
        >>> ds = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0).bucket(
        ...     batch_size=4, pad_id=0)
        >>> batches = list(ds)
        >>> [b["input_ids"].shape for b in batches]  # width: the batch's longest document
        [(4, 5), (4, 3), (4, 4)]
        >>> batches[1]["input_ids"].tolist()
        [[20, 0, 0], [60, 0, 0], [100, 0, 0], [30, 31, 0]]
        """
        if self.packer is not None:
            raise ConfigError(_PACK_OR_BUCKET)
        if self._tokenize_stage() is None:
            raise ConfigError("`.bucket` needs tokens: call `.tokenize(...)` before `.bucket(...)`")
        check_options(".bucket", options, BucketPacker)
        return replace(self, packer=BucketPacker(pad_id=self._pad_id(pad_id), **options))

    def pipe(self, stage: Stage) -> Dataset:
        """Add a row stage of your own (a :class:`~arrowstream.Stage`) after the current ones.

        The stage's ``spec()`` enters the pipeline's options (so a state
        refuses a pipeline with another stage), its ``counters`` (skip reasons)
        enter ``stats``, and it runs like the built-in stages: through
        :func:`~arrowstream.testing.assert_resumes_identically` too.

        Examples
        --------
        >>> from arrowstream import Stage
        >>> from arrowstream.testing import example_dir
        >>> class KeepEven(Stage):
        ...     name, counters = "keep_even", ("odd",)
        ...     def spec(self):
        ...         return {}
        ...     def columns(self):
        ...         return {"n"}
        ...     def run(self, piece):
        ...         return piece.with_rows(piece.batch.column("n").to_numpy() % 2 == 0, "odd")
        >>> it = read_parquet(example_dir()).pipe(KeepEven()).iter()
        >>> [b.column("n").to_pylist() for b in it], it.stats["odd"]
        ([[0, 2], [4, 6], [8, 10]], 6)
        """
        if not isinstance(stage, Stage):
            raise ConfigError(
                f"`pipe` takes an arrowstream.Stage (subclass it: `spec` and `run`), got "
                f"{type(stage).__name__!r}"
            )
        return self._add_stage(stage)

    def _add_stage(self, stage: Stage) -> Dataset:
        if self.packer is not None:
            raise ConfigError(f"cannot add `{stage.name}` after `.pack`: pack is the last step")
        schema = self.manifest.schema
        for existing in self.stages:
            schema = existing.check(self.manifest, schema)
        stage.check(self.manifest, schema)
        return replace(self, stages=(*self.stages, stage))

    def _tokenize_stage(self) -> Tokenize | None:
        return next((s for s in self.stages if isinstance(s, Tokenize)), None)

    def _pad_id(self, pad_id: int | None) -> int:
        """``pad_id``, or by default the EOS id (0 without one)."""
        if pad_id is not None:
            return pad_id
        tok = self._tokenize_stage()
        return tok.eos_id if tok is not None and tok.eos_id is not None else 0

    # -- identity -----------------------------------------------------------------

    def options(self) -> dict[str, Any]:
        """Return the JSON-able options that define the output (they enter every state)."""
        return Plan.of(self).options()

    @property
    def options_hash(self) -> str:
        """Hash of :meth:`options`."""
        return Plan.of(self).options_hash

    def read_columns(self) -> tuple[str, ...]:
        """Return the columns the pipeline reads.

        ``columns=`` if given; else, for a packed pipeline whose stages name
        their columns, just those; else every column.

        Raises
        ------
        SchemaError
            A column to read drifts between files (missing or of another type).
        """
        return Plan.of(self).columns

    # -- what reading it implies (worked out once, by its plan) ---------------------

    @property
    def num_pruned_shards(self) -> int:
        """Row groups per epoch that filter statistics rule out (never read)."""
        return Plan.of(self).num_pruned_shards

    @property
    def num_pruned_rows(self) -> int:
        """Rows per epoch in row groups that filter statistics rule out."""
        return Plan.of(self).num_pruned_rows

    @property
    def balance(self) -> str:
        """How consumers get equal batch counts, and why: ``"counted: ..."``, ``"estimated: ..."``, ``"off: ..."``.

        Counted: every consumer's tokens are known before the epoch (token
        ids, a length index, or a complete read-only token cache; no filter),
        nothing is dropped. Estimated: a consumer's data beyond the estimate
        is dropped and counted, with a warning. See the guide's "Even batches
        for finite epochs".
        """
        return Plan.of(self).balance

    @property
    def prefetch_depth(self) -> int:
        """Chunks prefetched in a background thread: ``prefetch``, or for ``None`` 2 when ids are read, else 0.

        Examples
        --------
        >>> from arrowstream.testing import example_dir
        >>> d = example_dir()
        >>> read_parquet(d).prefetch_depth, read_parquet(d).tokenize(None, column="ids", eos_id=0).prefetch_depth
        (0, 2)
        >>> read_parquet(d, prefetch=0).tokenize(None, column="ids", eos_id=0).prefetch_depth
        0
        """
        return Plan.of(self).prefetch_depth

    # -- iteration ----------------------------------------------------------------

    def iter(
        self,
        state: dict[str, Any] | None = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
    ) -> DatasetIterator:
        """Return a new iterator, from the start or from a saved ``state``.

        ``rank``/``world_size`` and ``worker``/``num_workers`` make this
        iterator one consumer among ``world_size * num_workers``: each reads
        its own equal share of every epoch, so together they read every
        document once. ``state`` may be this consumer's own state, or a global
        one from :func:`~arrowstream.merge_states` for any topology.
        """
        consumer = Consumer.of(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)
        return DatasetIterator(Plan.of(self), state, consumer=consumer)

    def __iter__(self) -> Iterator[Any]:
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
        """Return a ``torch.utils.data.IterableDataset`` of tensor batches (needs ``torch``).

        Rank and world size come from ``torch.distributed`` when it is
        initialised; DataLoader workers each become a consumer. ``columns``
        keeps only the named arrays of each batch. ``prefetch`` batches are
        made ahead in a background thread while the step runs (0: none;
        ``None``: up to 16, within 64 MiB);
        ``sharing`` is how workers hand batches over (``"auto"``: through
        the DataLoader's pipe when a batch fits in it, else by name). See
        :class:`~arrowstream.pytorch.TorchDataset` and ``docs/training.md``.
        """
        from arrowstream.pytorch import TorchDataset  # torch is optional: imported on use

        return TorchDataset(self, rank=rank, world_size=world_size, columns=columns, prefetch=prefetch, sharing=sharing)
