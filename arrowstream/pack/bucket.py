"""Length bucketing: one whole document per row, rows of similar length batched together.

For training without packing (fine-tuning, evaluation), :class:`BucketPacker`
reads documents a window at a time (see :mod:`arrowstream.pack.windows`), sorts the
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
With ``ramp`` (the default) the first epoch's first windows are smaller (64
documents, four times as many each window up to ``window``; see
:func:`~arrowstream.pack.windows.window_size`), so the first batch comes
after a few dozen documents rather than a whole window (a small window
emits only its best-filled batch, the rest waits for a larger pool; see
:mod:`arrowstream.pack.bucketrun`).

Documents longer than ``max_len`` are split into rows of ``max_len`` tokens (the
default: a piece is formed into a batch only once the piece before it is, so a
document's pieces go out in order and what is held of it is always its tokens
from some point on), truncated or dropped (``long_docs``), and counted. The decisions work on lengths; tokens move once per batch
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
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from arrowstream.checks import check_int
from arrowstream.errors import ConfigError
from arrowstream.pack import Packer, PackRun
from arrowstream.pack.assemble import PADDED_KEYS
from arrowstream.pack.base import check_even_batches
from arrowstream.pack.bucketrun import BucketRun
from arrowstream.pack.lookahead import fresh_origin
from arrowstream.state import Position, State

__all__ = ["LONG_DOCS", "BucketPacker"]

#: What to do with documents longer than ``max_len``.
LONG_DOCS = ("split", "truncate", "drop")


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
        What to do with a document longer than ``max_len``: ``"split"`` (the
        default) into rows of ``max_len`` tokens and a last, shorter one,
        each row sorted and batched like any document, the pieces of one
        document going out in order (every token is emitted); ``"truncate"``
        (keep its first ``max_len`` tokens) or ``"drop"``. Counted:
        ``long_docs_split``, ``long_docs_truncated`` and ``truncated_tokens``,
        ``long_docs_dropped`` and ``long_tokens_dropped``.
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
    ramp
        Start the first epoch with smaller windows (64 documents, four times
        as many each window up to ``window``), so the first batch comes
        early; ``False``: every window is ``window`` documents.

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
        *Packer.counters, "long_docs_split", "long_docs_truncated", "long_docs_dropped", "long_tokens_dropped",
        "truncated_tokens",
    )

    def __init__(
        self,
        *,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        window: int = 1024,
        max_len: int | None = None,
        long_docs: str = "split",
        pad_id: int = 0,
        pad_to_multiple_of: int = 1,
        drop_last: bool = False,
        even_batches: bool | str = True,
        seed: int = 0,
        ramp: bool = True,
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
        self.ramp = bool(ramp)

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
            # only when off: the options (and states) of pipelines from before the ramp stay the same
            **({} if self.ramp else {"ramp": False}),
        }

    def start(
        self, state: State | None, *, targets: Callable[[int], int | None] | None = None, origin: Position | None = None
    ) -> PackRun:
        fresh_origin(self.name, origin)
        return BucketRun(self, state, targets or (lambda epoch: None))

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
        lens = np.asarray(lengths, dtype=np.int64)
        ranked = np.argsort(lens, kind="stable")  # sorted once: a prefix's stable order is this one's, filtered
        cut = n
        while True:
            batches = self._cut(lens, ranked if cut == n else ranked[ranked < cut])
            if final or not batches or self.is_full([lengths[k] for k in batches[-1]]):
                return batches, list(range(cut, n))
            cut -= len(batches[-1])  # the last batch has room: its size in newest documents waits

    def _cut(self, lens: np.ndarray, ranked: np.ndarray) -> list[list[int]]:
        """Cut documents ``ranked`` (indices into ``lens``, by length) into the longest runs whose ``rows x padded width`` fit ``max_tokens``."""
        assert self.max_tokens is not None
        m, cap = self.pad_to_multiple_of, self.max_tokens
        width = (np.maximum(1, -(-lens[ranked] // m)) * m).tolist()  # padded(), for every document
        order = ranked.tolist()
        batches: list[list[int]] = []
        i, n = 0, len(order)
        while i < n:
            # sorted ascending, the document added sets the width, so (rows x width) only grows with
            # the end: the batch ends at the first document past the budget (a bisection)
            j = i + 1 + bisect_right(range(i + 1, n), cap, key=lambda k: (k - i + 1) * width[k])  # noqa: B023
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
            elif self.long_docs == "truncate":
                kept = np.minimum(drawn, self.max_len)
            else:  # each long document as its pieces (taken together here: the counts are the same)
                kept = _pieces(drawn, self.max_len)
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


def _pieces(lengths: np.ndarray, max_len: int) -> np.ndarray:
    """Return the row lengths of ``lengths`` split into rows of ``max_len`` and a last, shorter one, in order.

    Examples
    --------
    >>> _pieces(np.array([3, 10, 4]), 4).tolist()
    [3, 4, 4, 2, 4]
    """
    counts = -(-lengths // max_len)
    rows = np.full(int(counts.sum()), max_len, dtype=np.int64)
    ends = np.cumsum(counts) - 1
    rows[ends] = lengths - (counts - 1) * max_len
    return rows
