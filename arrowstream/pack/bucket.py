"""Length bucketing: one whole document per row, rows of similar length batched together.

For training without packing (fine-tuning, evaluation), :class:`BucketPacker`
reads documents a window at a time (see :mod:`arrowstream.pack.lookahead`), sorts the
window's pool by length (a stable sort, so ties keep stream order) and cuts the
sorted run into batches: ``batch_size`` rows each, or, with ``max_tokens``, the
longest run of consecutive documents whose ``rows x padded length`` stays
within the budget. Each batch is right-padded to its longest document, so its
shape varies from batch to batch.

Leftovers travel to the next window's pool so batches stay full: the pool's
newest documents *in stream order*, as many as would make the last batch
short (``len(pool) % batch_size`` of them; with ``max_tokens``, as many as the
last batch's rows while that batch has room for another row). They are never
chosen by length, so a long document cannot be held to the epoch's end: what
waits is always the newest part of the stream. At the end of an epoch
everything is flushed: batches never span epochs, and the last one is kept,
or dropped and counted with ``drop_last``. A window's batches go out in an
order permuted by ``(seed, epoch, window)``, so lengths do not rise and fall.

Documents longer than ``max_len`` are truncated or dropped (``long_docs``) and
counted. The decisions work on lengths; tokens move once per batch
(:func:`~arrowstream.pack.assemble.assemble_padded_batch`). The state names held
documents by reference (``[segment, seq]``): the batches formed but not yet
emitted, the carried documents, the read mark, the window counter and the
counters; a resume re-reads from the earliest held document, which is in the
current window or among the newest documents of the windows before.

Deterministic: the output depends only on the data, the options, the seed
and ``batch_rows`` (a window ends where a read batch ends), not on
prefetching or where a run was resumed. Not thread-safe: one run belongs to
one iterator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from arrowstream.checks import check_int
from arrowstream.errors import ConfigError
from arrowstream.io.chunk import Chunk, Ledger
from arrowstream.pack import Packer, PackRun
from arrowstream.pack.assemble import PADDED_KEYS, assemble_padded_batch
from arrowstream.pack.base import check_even_batches
from arrowstream.pack.lookahead import (
    Doc,
    DocumentSource,
    Key,
    LookaheadRun,
    fresh_origin,
)
from arrowstream.state import BucketState, Position, Progress, State

__all__ = ["LONG_DOCS", "BucketPacker"]

#: What to do with documents longer than ``max_len``.
LONG_DOCS = ("truncate", "drop")


class BucketPacker(Packer):
    """Batch whole documents of similar length, one per row, right-padded.

    Parameters
    ----------
    batch_size
        Rows per batch (the epoch's last may have fewer); exclusive with ``max_tokens``.
    max_tokens
        Budget of padded tokens (``rows x width``) per batch; the rows vary.
    window
        Documents read and sorted at once (at least: a window ends where a
        read batch of ``batch_rows`` rows ends).
    max_len
        Longest document kept whole (``None``: no limit with ``batch_size``;
        ``max_tokens`` rounded down to ``pad_to_multiple_of`` with ``max_tokens``).
    long_docs
        ``"truncate"`` (keep the first ``max_len`` tokens) or ``"drop"``.
    pad_id
        Token id on padding.
    pad_to_multiple_of
        Each batch's width is a multiple of this.
    drop_last
        Drop (and count) the epoch's last batch when it is not full.
    even_batches
        With several consumers and finite epochs, emit the same number of
        batches per epoch on every rank: ``True``, ``"drop"`` or ``False``, as
        for :class:`~arrowstream.pack.base.Packer`.
    seed
        Seed of the batch order.

    Raises
    ------
    ConfigError
        Not exactly one of ``batch_size`` and ``max_tokens``, or an option
        out of range.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.io.chunk import Chunk
    >>> lengths = [4, 1, 3, 2]
    >>> offsets = np.r_[0, np.cumsum(lengths)]
    >>> chunk = Chunk(epoch=0, shard=0, seq_start=0, seq_end=4, row_start=0, seq=np.arange(4),
    ...               tokens=np.arange(1, offsets[-1] + 1, dtype=np.int32), offsets=offsets)
    >>> run = BucketPacker(batch_size=2, pad_id=0).start(None)
    >>> chunks = iter([chunk])
    >>> [run.next_batch(chunks)["input_ids"].tolist() for _ in range(2)]
    [[[5, 0], [9, 10]], [[6, 7, 8, 0], [1, 2, 3, 4]]]
    """

    name = "bucket"
    batch_keys = PADDED_KEYS
    counters = (
        *Packer.counters, "long_docs_truncated", "long_docs_dropped", "long_tokens_dropped", "truncated_tokens",
    )

    def __init__(
        self,
        *,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        window: int = 1024,
        max_len: int | None = None,
        long_docs: str = "truncate",
        pad_id: int = 0,
        pad_to_multiple_of: int = 1,
        drop_last: bool = False,
        even_batches: bool | str = True,
        seed: int = 0,
    ) -> None:
        # Packer.__init__ is not called: a bucketed batch has no fixed `seq_len`
        if (batch_size is None) == (max_tokens is None):
            got = "both" if batch_size is not None else "neither"
            raise ConfigError(
                f"`.bucket` takes exactly one of `batch_size` (rows per batch) and `max_tokens` "
                f"(padded tokens per batch), got {got}: pass one of them"
            )
        self.batch_size = None if batch_size is None else check_int("batch_size", batch_size)
        self.max_tokens = None if max_tokens is None else check_int("max_tokens", max_tokens)
        self.window = check_int("window", window)
        self.pad_to_multiple_of = check_int("pad_to_multiple_of", pad_to_multiple_of)
        self.seed = check_int("seed", seed, low=0)
        self.pad_id = check_int("pad_id", pad_id, low=0)
        if self.pad_id > np.iinfo(np.int32).max:
            raise ConfigError(f"`pad_id` must be an int in [0, 2**31), got {pad_id!r}")
        if long_docs not in LONG_DOCS:
            raise ConfigError(f"`long_docs` must be one of {list(LONG_DOCS)!r}, got {long_docs!r}")
        self.long_docs = long_docs
        if max_len is not None:
            max_len = check_int("max_len", max_len)
        if self.max_tokens is not None:
            fits = self.max_tokens // self.pad_to_multiple_of * self.pad_to_multiple_of
            if fits == 0:
                raise ConfigError(
                    f"`pad_to_multiple_of` ({self.pad_to_multiple_of}) is larger than `max_tokens` "
                    f"({self.max_tokens}), so no row fits a batch: lower it or raise `max_tokens`"
                )
            if max_len is None:
                max_len = fits
            elif self.padded(max_len) > self.max_tokens:
                raise ConfigError(
                    f"`max_len` must fit one row in `max_tokens` ({self.max_tokens}) once padded "
                    f"to a multiple of {self.pad_to_multiple_of}, got {max_len}: use at most {fits}"
                )
        self.max_len = max_len
        self.drop_last = bool(drop_last)
        self.even_batches = check_even_batches(even_batches)

    def spec(self) -> dict[str, Any]:
        return {
            "strategy": self.name,
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "window": self.window,
            "max_len": self.max_len,
            "long_docs": self.long_docs,
            "pad_id": self.pad_id,
            "pad_to_multiple_of": self.pad_to_multiple_of,
            "drop_last": self.drop_last,
            "even_batches": self.even_batches,
            "seed": self.seed,
        }

    def start(
        self, state: State | None, *, targets: Callable[[int], int | None] | None = None, origin: Position | None = None
    ) -> PackRun:
        fresh_origin(self.name, origin)
        return _BucketRun(self, state, targets or (lambda epoch: None))

    # -- decisions on lengths ---------------------------------------------------------

    def padded(self, length: int) -> int:
        """Return the width of a row of ``length`` tokens, rounded up to ``pad_to_multiple_of``."""
        m = self.pad_to_multiple_of
        return max(1, -(-length // m)) * m

    def is_full(self, lengths: Sequence[int]) -> bool:
        """Return whether a batch of documents of ``lengths`` could take no other row."""
        if self.batch_size is not None:
            return len(lengths) >= self.batch_size
        assert self.max_tokens is not None
        return (len(lengths) + 1) * self.padded(max(lengths, default=0)) > self.max_tokens

    def plan(self, lengths: Sequence[int], *, final: bool) -> tuple[list[list[int]], list[int]]:
        """Cut a pool of documents into batches.

        Parameters
        ----------
        lengths
            Tokens per document of the pool, in stream order.
        final
            The epoch's last window: carry nothing.

        Returns
        -------
        tuple
            The batches as lists of pool indices, shortest documents first, in
            the order they were formed; and the pool indices carried on, always
            the pool's newest documents (a suffix), so no document is held
            back for its length.

        Examples
        --------
        >>> BucketPacker(batch_size=2).plan([5, 1, 4, 2, 3], final=False)
        ([[1, 3], [2, 0]], [4])
        >>> BucketPacker(max_tokens=8).plan([5, 1, 4, 2, 1], final=True)
        ([[1, 4, 3], [2], [0]], [])
        >>> BucketPacker(max_tokens=8).plan([1, 3, 1], final=False)  # [3] alone has room: 1 waits
        ([[0, 1]], [2])
        """
        n = len(lengths)
        if self.batch_size is not None:
            B = self.batch_size
            cut = n if final else n - n % B
            order = np.argsort(np.asarray(lengths[:cut], dtype=np.int64), kind="stable").tolist()
            return [order[i : i + B] for i in range(0, cut, B)], list(range(cut, n))
        cut = n
        while True:
            batches = self._cut(lengths[:cut])
            if final or not batches or self.is_full([lengths[k] for k in batches[-1]]):
                return batches, list(range(cut, n))
            cut -= len(batches[-1])  # the last batch has room: its size in newest documents waits

    def _cut(self, lengths: Sequence[int]) -> list[list[int]]:
        """Sort by length; cut the longest runs whose ``rows x padded width`` fit ``max_tokens``."""
        assert self.max_tokens is not None
        order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable").tolist()
        width = [self.padded(int(lengths[k])) for k in order]
        batches: list[list[int]] = []
        i, n = 0, len(order)
        while i < n:
            j = i + 1  # sorted ascending: the document added sets the width
            while j < n and (j - i + 1) * width[j] <= self.max_tokens:
                j += 1
            batches.append(order[i:j])
            i = j
        return batches

    def fill(self, lengths: Sequence[int]) -> float:
        """Return the share of a full batch that documents of ``lengths`` make, in rows."""
        if self.batch_size is not None:
            return len(lengths) / self.batch_size
        assert self.max_tokens is not None
        return len(lengths) / max(1, self.max_tokens // self.padded(max(lengths, default=0)))

    @property
    def counts_documents(self) -> bool:
        """With ``batch_size``, a batch takes that many documents."""
        return self.batch_size is not None

    def per_batch(
        self, lengths: np.ndarray, *, num_docs: float, docs_per_read: float = 1.0
    ) -> tuple[float | None, float]:
        """Return the documents per batch (with ``batch_size``; ``None`` with ``max_tokens``) and the tokens read per batch.

        For an epoch of ``num_docs`` documents.

        Used for even batches. The simulation draws documents from a sample's
        ``lengths`` (with a fixed seed, so every consumer gets the same
        numbers), truncates or drops long ones, and cuts them as an epoch
        would: windows of ``window`` documents rounded up to a multiple of
        ``docs_per_read`` (a window ends where a read batch ends), at most
        ``num_docs``. It draws ``num_docs`` documents, or four windows' worth
        scaled up to ``num_docs``; the epoch's last batch counts once, whole.

        Examples
        --------
        >>> packer = BucketPacker(batch_size=4, window=8)
        >>> packer.per_batch(np.array([3, 5, 2, 7, 1, 1]), num_docs=10)  # 4 + 4 + 2 documents
        (3.3333333333333335, 13.333333333333334)
        >>> docs, tokens = BucketPacker(max_tokens=64, window=8).per_batch(
        ...     np.array([4, 8, 16]), num_docs=1000)
        >>> docs, round(tokens, 2)  # 16 pads most batches: under 64 tokens each
        (None, 47.88)
        """
        lengths = np.asarray(lengths, dtype=np.int64)
        n = round(num_docs)
        if lengths.size == 0 or n <= 0:
            return (math.inf if self.batch_size is not None else None), math.inf
        step = max(1, round(docs_per_read))
        window = min(-(-self.window // step) * step, n)
        size = min(n, 4 * window)
        drawn = lengths[np.random.default_rng(0).integers(0, lengths.size, size)]
        kept = drawn
        if self.max_len is not None:
            if self.long_docs == "drop":
                kept = drawn[drawn <= self.max_len]
            else:
                kept = np.minimum(drawn, self.max_len)
        docs = kept.tolist()
        batches, last = 0, 1.0
        carry: list[int] = []
        for start in range(0, len(docs), window):
            pool = carry + docs[start : start + window]
            final = start + window >= len(docs)
            formed, left = self.plan(pool, final=final)
            carry = [pool[i] for i in left]
            batches += len(formed)
            if final and formed:
                last = self.fill([pool[i] for i in formed[-1]])
        if batches == 0:
            return (math.inf if self.batch_size is not None else None), math.inf
        scale = n / size
        total = (batches - 1 + last) * scale + (1 - last)  # the steady part scaled; the end once
        docs = n / total if self.batch_size is not None else None  # token budgets: counted in tokens
        return docs, float(drawn.sum()) * scale / total


class _BucketRun(LookaheadRun):
    def __init__(
        self,
        packer: BucketPacker,
        state: State | None,
        targets: Callable[[int], int | None],
    ) -> None:
        self.p = packer
        self.targets = targets
        self.store: dict[Key, Doc] = {}
        self.carry: list[Key] = []  # documents waiting for the next window, in stream order
        self.out: list[list[Key]] = []  # batches formed, in emission order
        if state is None:
            self.ledger = Ledger()
            self.epoch, self.emitted, self.windows, self.flushed = 0, 0, 0, False
            self._count(0)
            self.target = targets(0)
            self.src = DocumentSource(self.p.window, self.ledger, epoch=0)
            return
        self.ledger = Ledger(state.stats, state.epoch_stats)
        loaded = self._load_position(state)
        if not state.packer:  # a re-dealt share: nothing held, read from the position
            epoch = loaded.epoch
            self.epoch, self.emitted, self.windows, self.flushed = epoch, 0, 0, False
            self._count(epoch)
            self.target = targets(epoch)
            mark = (epoch, loaded.segment, loaded.seq)
            self.src = DocumentSource(self.p.window, self.ledger, epoch=epoch, mark=mark)
            return
        part = BucketState.from_dict(state.packer)
        self._start_counting(part.progress)
        self.emitted = part.progress.epoch_batches
        self.target = part.progress.target if part.progress.target_known else targets(self.counting)
        self.windows, self.flushed, mark = part.window, part.flushed, part.read
        self.carry = list(part.carry)
        self.out = [list(batch) for batch in part.out]
        self.src = DocumentSource(
            self.p.window,
            self.ledger,
            epoch=self.epoch,
            mark=(mark[0], mark[1], mark[2]),
            wanted=set(self._held_keys()),
        )

    # -- state ----------------------------------------------------------------------

    def _held_keys(self) -> list[Key]:
        return [*self.carry, *(key for batch in self.out for key in batch)]

    def _held_docs(self) -> dict[Key, int]:
        # documents are never cut: a held document's tokens are all still to come
        return dict.fromkeys(self._held_keys(), 0)

    def _packer_state(self, progress: Progress, read: tuple[int, int, int]) -> BucketState:
        return BucketState(progress, read, self.windows, self.flushed, tuple(self.carry), tuple(map(tuple, self.out)))

    def _new_epoch(self) -> None:
        self.windows = 0

    # -- batches --------------------------------------------------------------------

    def next_batch(self, chunks: Iterator[Chunk]) -> dict[str, Any]:
        if self.loaded is not None:
            self._recover_documents(chunks)
        while True:
            if self.target is not None and self.emitted >= self.target:
                # this consumer's share is used up: carry the rest into the next epoch's count, or
                # in the last epoch drop it (and say so)
                if not self._past_target(chunks, lambda: self._drop_rest(chunks)):
                    raise StopIteration
                continue
            if self.out:
                self.emitted += 1
                return self._assemble(self.out.pop(0))
            if self.flushed:  # the epoch's data is used up
                if self._pad_to_target():
                    self.emitted += 1
                    self.ledger.add("padding_batches", 1)
                    return self._assemble([])  # all padding: other consumers still have data
                if not self._next_epoch(chunks):
                    raise StopIteration
                continue
            window = self.src.pull(chunks)
            if window is None:
                self._form(self.carry, final=True)
                self.flushed = True
                continue
            self._form(self.carry + self._admit(window.keys, window.docs))

    def _size(self, key: Key) -> int:
        """Tokens a held document puts in its row (``max_len`` at most)."""
        n = int(self.store[key].tokens.size)
        return n if self.p.max_len is None else min(n, self.p.max_len)

    def _admit(self, keys: list[Key], docs: list[Doc]) -> list[Key]:
        """Hold a window's documents, truncating or dropping long ones; return the held keys."""
        limit = self.p.max_len
        held: list[Key] = []
        for key, doc in zip(keys, docs):
            n = int(doc.tokens.size)
            if limit is not None and n > limit:
                if self.p.long_docs == "drop":
                    self.ledger.add("long_docs_dropped", 1)
                    self.ledger.add("long_tokens_dropped", n)
                    continue
                self.ledger.add("long_docs_truncated", 1)
                self.ledger.add("truncated_tokens", n - limit)
            self.store[key] = doc
            held.append(key)
        return held

    def _form(self, pool: list[Key], *, final: bool = False) -> None:
        """Cut ``pool`` into batches, queue them in a shuffled order, keep the leftovers."""
        lengths = [self._size(key) for key in pool]
        batches, left = self.p.plan(lengths, final=final)
        self.carry = [pool[i] for i in left]
        formed = [[pool[i] for i in batch] for batch in batches]
        if (
            final
            and formed
            and self.p.drop_last
            and self.target is None
            and not self.p.is_full([self._size(key) for key in formed[-1]])
        ):
            self._drop(formed.pop())
        order = np.random.default_rng([self.p.seed, self.epoch, self.windows]).permutation(len(formed))
        self.windows += 1
        self.out.extend(formed[int(i)] for i in order)

    def _assemble(self, keys: list[Key]) -> dict[str, Any]:
        sizes = [self._size(key) for key in keys]
        docs = [self.store[key] for key in keys]
        parts = [doc.tokens[:n] for doc, n in zip(docs, sizes)]
        masks = [doc.mask[:n] for doc, n in zip(docs, sizes) if doc.mask is not None]
        batch = assemble_padded_batch(
            np.concatenate(parts) if parts else np.empty(0, np.int32),
            np.asarray(sizes, dtype=np.int64),
            pad_id=self.p.pad_id,
            pad_to_multiple_of=self.p.pad_to_multiple_of,
            num_rows=None if keys else (self.p.batch_size or 1),
            mask=np.concatenate(masks) if masks and len(masks) == len(parts) else None,
        )
        if self.carrying:  # read in an earlier epoch, counted in this one
            self.ledger.add("carried_tokens", batch["num_tokens"])
            self.ledger.add("carried_docs", sum(1 for key in keys if self.store[key].skip == 0))
        for key in keys:
            del self.store[key]
        self.ledger.add("tokens", batch["num_tokens"])
        self.ledger.add("padding_tokens", batch["num_padding_tokens"])
        self.ledger.add("batches", 1)
        return batch

    def _drop(self, keys: list[Key]) -> None:
        """Count held documents that will not be emitted and let them go."""
        self.ledger.add("dropped_tokens", sum(self._size(key) for key in keys))
        # a document whose head went out elsewhere (a re-dealt skip) is not a whole one
        self.ledger.add("dropped_docs", sum(1 for key in keys if self.store[key].skip == 0))
        for key in keys:
            del self.store[key]

    def _drop_rest(self, chunks: Iterator[Chunk]) -> None:
        """Drop everything held and the rest of the epoch upstream, counted."""
        self._drop(self._held_keys())
        self.carry, self.out = [], []
        docs, tokens = self.src.drain(chunks)
        self.ledger.add("dropped_docs", docs)
        self.ledger.add("dropped_tokens", tokens)
        self.flushed = True
