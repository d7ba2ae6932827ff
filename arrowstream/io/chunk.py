"""The unit that flows between stages: a slice of one shard's rows, with coordinates.

A :class:`Chunk` covers a contiguous range ``[seq_start, seq_end)`` of the
epoch's row sequence (every row of every shard in the epoch's order has one
sequence number). Rows that a stage drops stay accounted for in
:attr:`Chunk.skipped`, keyed by reason, so counters are exact at any position
and nothing is lost silently. After tokenization the documents' tokens travel
as one flat ``int32`` array plus ``int64`` offsets (the Arrow ``list<int32>``
layout), never as Python lists.

A chunk never spans two shards and never spans two epochs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from arrowstream.errors import StateError
from arrowstream.io.arrays import from_numpy

__all__ = ["Chunk", "Ledger", "tokens_to_arrow"]


@dataclass(slots=True)
class Chunk:
    """A slice of one shard's rows, with the rows' sequence numbers.

    Attributes
    ----------
    epoch : int
        Epoch the rows belong to.
    shard : int
        Manifest index of the shard the rows come from.
    seq_start, seq_end : int
        The range of epoch sequence numbers this chunk covers, kept or not.
    row_start : int
        Row inside the shard's row group that ``seq_start`` maps to.
    seq : numpy.ndarray
        ``int64`` sequence number of each kept row, increasing.
    batch : pyarrow.RecordBatch or None
        The kept rows' columns (``None`` once a stage no longer needs them).
    tokens, offsets : numpy.ndarray or None
        Flat ``int32`` tokens and ``int64`` offsets (``len(seq) + 1``) once
        tokenized.
    skipped : dict[str, numpy.ndarray]
        Reason to sequence numbers of rows dropped inside the range.
    source_end : bool
        Whether this chunk ends where a source chunk (one cell of the
        ``batch_rows`` grid) ends; false on all but the last piece of a split.
    mixed : tuple[int, ...]
        With shuffling, the shards whose rows are interleaved in this chunk
        (``shard`` and ``row_start`` then name only the window's first piece).
    segment : int
        Index, in the consumer's work, of the segment the rows belong to;
        ``seq`` numbers count rows of that segment's stream.
    head_skip : int
        Tokens already removed from the front of the first document (emitted
        before a resume or by another consumer).
    tail_take : int
        When not 0, the last document is cut after this many of its tokens
        (counted from its first, ``head_skip`` included): the rest is another
        consumer's, which also counts the row.
    mask : numpy.ndarray or None
        Per token, whether it carries loss (``bool``, aligned with
        ``tokens``), when the pipeline has a loss mask column.
    """

    epoch: int
    shard: int
    seq_start: int
    seq_end: int
    row_start: int
    seq: np.ndarray
    batch: pa.RecordBatch | None = None
    tokens: np.ndarray | None = None
    offsets: np.ndarray | None = None
    skipped: dict[str, np.ndarray] = field(default_factory=dict)
    source_end: bool = True
    mixed: tuple[int, ...] = ()
    segment: int = 0
    head_skip: int = 0
    mask: np.ndarray | None = None
    tail_take: int = 0

    @property
    def num_docs(self) -> int:
        """Kept rows (documents) in the chunk."""
        return int(self.seq.size)

    def with_rows(self, keep: np.ndarray, reason: str, **changes: object) -> Chunk:
        """Return a chunk keeping the rows where ``keep`` is true; the rest count as ``reason``.

        ``batch`` and, once tokenized, ``tokens`` and ``offsets`` are filtered
        too unless ``changes`` replaces them.
        """
        keep = np.asarray(keep, dtype=bool)
        if keep.all():
            return replace(self, **changes) if changes else self
        dropped = self.seq[~keep]
        skipped = dict(self.skipped)
        if dropped.size:
            prev = skipped.get(reason)
            skipped[reason] = dropped if prev is None else np.sort(np.concatenate([prev, dropped]))
        if "batch" not in changes and self.batch is not None:
            changes["batch"] = self.batch.filter(from_numpy(keep))
        if "tokens" not in changes and self.tokens is not None and self.offsets is not None:
            lens = np.diff(self.offsets)
            token_keep = np.repeat(keep, lens)
            changes["tokens"] = self.tokens[token_keep]
            if "mask" not in changes and self.mask is not None:
                changes["mask"] = self.mask[token_keep]
            offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
            np.cumsum(lens[keep], out=offsets[1:])
            changes["offsets"] = offsets
        return replace(self, seq=self.seq[keep], skipped=skipped, **changes)

    def trim_head(self, seq: int, skip: int) -> Chunk:
        """Drop the first ``skip`` tokens of document ``seq``, which must come first.

        Raises
        ------
        StateError
            Document ``seq`` is not the first kept document, or has no more
            than ``skip`` tokens (the data, filter or tokenizer changed).
        """
        if self.num_docs == 0 or int(self.seq[0]) != seq or self.offsets is None:
            raise StateError(
                f"the state points {skip} tokens into document {seq} of epoch {self.epoch}, but "
                "that document is not there any more (the data or the filter changed): start "
                "without the state"
            )
        length = int(self.offsets[1] - self.offsets[0])
        if skip >= length:
            raise StateError(
                f"the state points {skip} tokens into document {seq} of epoch {self.epoch}, which "
                f"has only {length} tokens: the tokenizer or the data changed; start without the state"
            )
        assert self.tokens is not None
        offsets = self.offsets - skip
        offsets[0] = 0
        mask = None if self.mask is None else self.mask[skip:]
        return replace(self, tokens=self.tokens[skip:], offsets=offsets, head_skip=skip, mask=mask)

    def trim_tail(self, seq: int, take: int) -> Chunk:
        """Keep only the tokens before ``take`` of document ``seq``, which must come last.

        ``take`` counts from the document's first token, those removed by
        :meth:`trim_head` included.

        Raises
        ------
        StateError
            Document ``seq`` is not the last kept document, or has no more
            than ``take`` tokens (the data, filter or tokenizer changed).
        """
        if self.num_docs == 0 or int(self.seq[-1]) != seq or self.offsets is None:
            raise StateError(
                f"the state gives {take} tokens of document {seq} of epoch {self.epoch} to this "
                "consumer, but that document is not there any more (the data or the filter "
                "changed): start without the state"
            )
        head = self.head_skip if self.num_docs == 1 else 0
        length = int(self.offsets[-1] - self.offsets[-2]) + head
        if not head < take < length:
            raise StateError(
                f"the state gives tokens {head}..{take - 1} of document {seq} of epoch {self.epoch} "
                f"to this consumer, but it has {length} tokens: the tokenizer or the data changed; "
                "start without the state"
            )
        assert self.tokens is not None
        end = int(self.offsets[-1]) - (length - take)
        offsets = self.offsets.copy()
        offsets[-1] = end
        mask = None if self.mask is None else self.mask[:end]
        return replace(self, tokens=self.tokens[:end], offsets=offsets, tail_take=take, mask=mask)

    def split(self, bounds: np.ndarray) -> list[Chunk]:
        """Split at kept-row indices ``bounds`` (increasing, excluding 0 and ``num_docs``).

        Each piece covers the sequence range up to the next piece's first row,
        so skipped rows stay attached to the piece whose range holds them.
        """
        if len(bounds) == 0:
            return [self]
        cuts = [0, *[int(b) for b in bounds], self.num_docs]
        last = len(cuts) - 2
        pieces = []
        for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            lo = self.seq_start if a == 0 else int(self.seq[a])
            hi = self.seq_end if b == self.num_docs else int(self.seq[b])
            skipped = {}
            for reason, seqs in self.skipped.items():
                part = seqs[(seqs >= lo) & (seqs < hi)]
                if part.size:
                    skipped[reason] = part
            tokens = offsets = mask = None
            if self.offsets is not None and self.tokens is not None:
                t0, t1 = int(self.offsets[a]), int(self.offsets[b])
                tokens = self.tokens[t0:t1]
                offsets = self.offsets[a : b + 1] - t0
                mask = None if self.mask is None else self.mask[t0:t1]
            pieces.append(
                Chunk(
                    epoch=self.epoch,
                    shard=self.shard,
                    seq_start=lo,
                    seq_end=hi,
                    row_start=self.row_start + (lo - self.seq_start),
                    seq=self.seq[a:b],
                    batch=None if self.batch is None else self.batch.slice(a, b - a),
                    tokens=tokens,
                    offsets=offsets,
                    skipped=skipped,
                    source_end=self.source_end and k == last,
                    mixed=self.mixed,
                    segment=self.segment,
                    head_skip=self.head_skip if k == 0 else 0,
                    mask=mask,
                    tail_take=self.tail_take if k == last else 0,
                )
            )
        return pieces

    @staticmethod
    def concat(pieces: list[Chunk]) -> Chunk:
        """Join consecutive pieces (as :meth:`split` made them) back into one chunk."""
        if len(pieces) == 1:
            return pieces[0]
        first, last = pieces[0], pieces[-1]
        skipped: dict[str, np.ndarray] = {}
        for reason in sorted({r for p in pieces for r in p.skipped}):
            skipped[reason] = np.concatenate([p.skipped[reason] for p in pieces if reason in p.skipped])
        tokens = offsets = None
        if all(p.tokens is not None and p.offsets is not None for p in pieces):
            tokens = np.concatenate([p.tokens for p in pieces])  # type: ignore[misc]
            sizes = np.cumsum([0] + [int(p.offsets[-1]) for p in pieces[:-1]])  # type: ignore[index]
            offsets = np.concatenate(
                [[0]] + [p.offsets[1:] + base for p, base in zip(pieces, sizes)]  # type: ignore[index]
            ).astype(np.int64)
        mask = None
        if all(p.mask is not None for p in pieces):
            mask = np.concatenate([p.mask for p in pieces])  # type: ignore[misc]
        batch = None
        if all(p.batch is not None for p in pieces):
            batch = pa.concat_batches([p.batch for p in pieces])  # type: ignore[misc]
        return Chunk(
            epoch=first.epoch,
            shard=first.shard,
            seq_start=first.seq_start,
            seq_end=last.seq_end,
            row_start=first.row_start,
            seq=np.concatenate([p.seq for p in pieces]),
            batch=batch,
            tokens=tokens,
            offsets=offsets,
            skipped=skipped,
            source_end=last.source_end,
            mixed=first.mixed,
            segment=first.segment,
            head_skip=first.head_skip,
            mask=mask,
            tail_take=last.tail_take,
        )

    def counts_before(self, seq: int) -> dict[str, int]:
        """Count rows of this chunk with sequence number below ``seq``, by outcome.

        Returns ``{"rows": ..., "docs": ..., <reason>: ...}`` where ``rows``
        counts every row of the range and ``docs`` the kept ones.
        """
        seq = min(max(seq, self.seq_start), self.seq_end)
        # a row cut by ``tail_take`` is counted by the consumer its last token goes to
        cut = 1 if self.tail_take and seq == self.seq_end else 0
        out = {
            "rows": seq - self.seq_start - cut,
            "docs": int(np.searchsorted(self.seq, seq, side="left")) - cut,
        }
        for reason, seqs in self.skipped.items():
            out[reason] = int(np.searchsorted(seqs, seq, side="left"))
        return out


def tokens_to_arrow(tokens: np.ndarray, offsets: np.ndarray) -> pa.ListArray:
    """View flat tokens and offsets as an Arrow ``list<int32>`` array without copying tokens.

    Examples
    --------
    >>> import numpy as np
    >>> tokens_to_arrow(np.array([5, 6, 7], np.int32), np.array([0, 2, 3])).to_pylist()
    [[5, 6], [7]]
    """
    return pa.ListArray.from_arrays(
        from_numpy(offsets, pa.int32()), from_numpy(tokens, pa.int32())
    )


#: The packer's counters also kept per epoch (the epoch whose batches are being counted).
EPOCH_COUNTERS = (
    "tokens", "padding_tokens", "batches", "padding_batches", "dropped_docs", "dropped_tokens",
    "carried_docs", "carried_tokens",
)
_EPOCH_KEYS = frozenset(EPOCH_COUNTERS)
#: Epochs whose :data:`EPOCH_COUNTERS` a :class:`Ledger` keeps: the one counting and those just before.
KEPT_EPOCHS = 16


class Ledger:
    """Exact counters at a position: rows, kept documents and every skip reason.

    Fully consumed chunks are committed; a partly consumed chunk is counted up
    to the position's sequence number. Counters that are not per row (tokens,
    padding) are added directly with :meth:`add`; those of
    :data:`EPOCH_COUNTERS` are also kept per epoch, for the epoch a packer
    said it counts (:meth:`begin_epoch`).

    Examples
    --------
    >>> import numpy as np
    >>> c = Chunk(epoch=0, shard=0, seq_start=0, seq_end=4, row_start=0,
    ...           seq=np.array([0, 2, 3]), skipped={"null": np.array([1])})
    >>> ledger = Ledger()
    >>> ledger.snapshot(c, 3)
    {'rows': 3, 'docs': 2, 'null': 1}
    >>> ledger.commit(c); ledger.snapshot()
    {'rows': 4, 'docs': 3, 'null': 1}
    >>> ledger.begin_epoch(1); ledger.add("tokens", 8); ledger.epoch_snapshot()[0]["tokens"]
    8
    """

    def __init__(self, counts: dict[str, int] | None = None, epochs: Sequence[dict[str, int]] = ()) -> None:
        self.counts: dict[str, int] = {"rows": 0, "docs": 0}
        if counts:
            self.counts.update({k: int(v) for k, v in counts.items()})
        self.epoch = 0
        self.by_epoch: dict[int, dict[str, int]] = {
            int(entry["epoch"]): {k: int(v) for k, v in entry.items() if k != "epoch"} for entry in epochs
        }

    def add(self, key: str, n: int) -> None:
        """Add ``n`` to counter ``key`` (and to the epoch's, for :data:`EPOCH_COUNTERS`)."""
        n = int(n)
        self.counts[key] = self.counts.get(key, 0) + n
        if key in _EPOCH_KEYS:
            row = self.by_epoch.get(self.epoch)
            if row is None:
                row = self.by_epoch[self.epoch] = dict.fromkeys(EPOCH_COUNTERS, 0)
            row[key] = row.get(key, 0) + n

    def begin_epoch(self, epoch: int) -> None:
        """Count :data:`EPOCH_COUNTERS` toward ``epoch`` from now on (it is listed from now, at 0).

        Only the last :data:`KEPT_EPOCHS` epochs are kept: an endless run's
        state would otherwise grow by an entry an epoch (the totals stay in
        the counters).
        """
        self.epoch = int(epoch)
        self.by_epoch.setdefault(self.epoch, dict.fromkeys(EPOCH_COUNTERS, 0))
        for old in [e for e in self.by_epoch if e <= self.epoch - KEPT_EPOCHS]:
            del self.by_epoch[old]

    def epoch_snapshot(self) -> list[dict[str, int]]:
        """Return the per-epoch counters of every epoch begun, in order: ``[{"epoch": 0, "tokens": ...}, ...]``."""
        return [{"epoch": e, **counts} for e, counts in sorted(self.by_epoch.items())]

    def commit(self, chunk: Chunk) -> None:
        """Count every row of ``chunk``."""
        for key, n in chunk.counts_before(chunk.seq_end).items():
            self.add(key, n)

    def snapshot(self, partial: Chunk | None = None, seq: int = 0) -> dict[str, int]:
        """Return the counters, plus ``partial``'s rows before ``seq``."""
        out = dict(self.counts)
        if partial is not None:
            for key, n in partial.counts_before(seq).items():
                out[key] = out.get(key, 0) + n
        return out
