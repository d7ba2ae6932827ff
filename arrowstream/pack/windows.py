"""Whole documents a window at a time, resumable from a read mark.

Packers that look ahead (best-fit packing, length bucketing) take documents
a window at a time. :class:`DocumentSource` pulls chunks from upstream and
hands them out as :class:`LookaheadWindow` objects of whole documents, cut
only where a source chunk ends (a cell of the ``batch_rows`` grid), so a
window's contents depend only on where it starts, whether the stream started
there or was resumed. A document is known by its reference, ``(segment,
seq)`` in the consumer's work (:data:`Key`), as states hold it.

Windows ramp up: unless a packer turns it off, the first windows of the
first epoch hold :data:`RAMP_FIRST` documents, then four times as many each
time, up to the packer's ``window`` (:func:`window_size`), so the first batch
of a run waits for a few dozen documents, not a whole window. A ramp-up
window ends at its last document, cutting the chunk that holds it, so its
read mark may fall inside a read batch; a resume cuts the re-read chunk at
the mark again. The ramp depends only on the epoch and the window's index
in it, which the state keeps.

A resume re-reads from the earliest held document (the *replay*): documents
read before the checkpoint (before the *read mark*) are not counted again and
are kept only if the state still references them; from the read mark on,
windows are formed as in the uninterrupted run. Not thread-safe: one source
belongs to one packer run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from arrowstream.errors import StateError
from arrowstream.io.chunk import Chunk, Ledger
from arrowstream.state import DocKey

__all__ = ["RAMP_FIRST", "Doc", "DocumentSource", "Key", "LookaheadWindow", "window_size"]

#: A document's reference: ``(range, seq)`` in the consumer's work of an epoch (as states hold it).
Key = DocKey

#: Documents in the first window when windows ramp up (each next window holds four times as many).
RAMP_FIRST = 64


def window_size(window: int, index: int, *, ramp: bool) -> int:
    """Return the documents of an epoch's window number ``index`` (from 0) for a packer of ``window``.

    With ``ramp``, windows start at :data:`RAMP_FIRST` documents and grow
    fourfold until they reach ``window``; without, every window is ``window``.

    Examples
    --------
    >>> [window_size(1024, k, ramp=True) for k in range(4)]
    [64, 256, 1024, 1024]
    >>> window_size(1024, 0, ramp=False), window_size(40, 0, ramp=True)
    (1024, 40)
    """
    if not ramp or window <= RAMP_FIRST:
        return window
    return min(window, RAMP_FIRST << min(2 * index, 62))


@dataclass(slots=True)
class Doc:
    """One document's tokens (a view into its chunk) and loss mask; never changed once made.

    Not a frozen dataclass: one is made per document read, and a frozen
    one's constructor took twice as long (0.64 against 0.32 us).
    """

    tokens: np.ndarray
    mask: np.ndarray | None
    skip: int  # tokens removed upstream from its front (a re-dealt segment's head)


@dataclass(slots=True)
class LookaheadWindow:
    """Consecutive whole documents of one epoch, in stream order."""

    epoch: int
    keys: list[Key]
    docs: list[Doc]

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per document."""
        return np.fromiter((d.tokens.size for d in self.docs), dtype=np.int64, count=len(self.docs))


class DocumentSource:
    """Hand out windows of at least ``size`` documents, resuming from a read mark.

    Parameters
    ----------
    size
        Documents per window (a window ends where the source chunk holding
        its ``size``-th document ends, or at the epoch's end).
    ledger
        Counters: every chunk read past the read mark is committed.
    mark
        ``(epoch, segment, seq)`` of the first document not read before the
        checkpoint, or ``None`` on a fresh start.
    wanted
        Documents before ``mark`` that the state still references.
    """

    def __init__(
        self,
        size: int,
        ledger: Ledger,
        *,
        epoch: int,
        mark: tuple[int, int, int] | None = None,
        wanted: set[Key] | None = None,
    ) -> None:
        self.size = size
        self.ledger = ledger
        self.epoch = epoch
        self.mark = mark
        self.wanted = set(wanted or ())
        self.recovered: dict[Key, Doc] = {}
        self._pending: Chunk | None = None
        self._ended = False  # upstream is exhausted
        self.read: tuple[int, int, int] = mark if mark is not None else (epoch, 0, 0)

    def _next(self, chunks: Iterator[Chunk]) -> Chunk | None:
        """Return the next chunk past the read mark; replay the ones before it."""
        while True:
            if self._pending is not None:
                chunk, self._pending = self._pending, None
                return chunk
            if self._ended:
                return None
            chunk = next(chunks, None)
            if chunk is None:
                self._ended = True
                self._check_recovered()
                return None
            if self.mark is not None and (chunk.epoch, chunk.segment, chunk.seq_start) < self.mark:
                if (chunk.epoch, chunk.segment, chunk.seq_end) <= self.mark:
                    self._replay(chunk)
                    continue
                # a ramp-up window ended inside this chunk, at a document: replay up to it
                before, chunk = _cut_at(chunk, self.mark)
                if before is not None:
                    self._replay(before)
            self._check_recovered()
            self.mark = None
            return chunk

    def _replay(self, chunk: Chunk) -> None:
        assert self.mark is not None
        if (chunk.epoch, chunk.segment, chunk.seq_end) > self.mark:
            raise StateError(
                f"the state's read mark {self.mark} falls inside a chunk of rows "
                f"{chunk.seq_start}..{chunk.seq_end}: the state was edited or the data changed"
            )
        for key, doc in zip(_keys(chunk), _docs(chunk)):
            if key in self.wanted:
                self.recovered[key] = doc

    def _check_recovered(self) -> None:
        if self.mark is None:
            return
        missing = self.wanted - set(self.recovered)
        if missing:
            raise StateError(
                f"the state holds back {len(missing)} document(s) (for example (segment, seq) "
                f"{min(missing)}) that are not in the data any more: the data, the filter or "
                "the tokenizer changed; start without the state"
            )
        self.mark = None

    def pull(self, chunks: Iterator[Chunk], size: int | None = None, *, exact: bool = False) -> LookaheadWindow | None:
        """Return the next window of the current epoch, or ``None`` at the epoch's end.

        The window holds at least ``size`` documents (default: :attr:`size`)
        and ends where a source chunk ends; with ``exact`` (a ramp-up
        window), exactly ``size`` documents, cutting the chunk that holds
        the last one (the read mark then falls inside a read batch, at a
        document, where a resume cuts the re-read chunk again).
        """
        size = self.size if size is None else size
        keys: list[Key] = []
        docs: list[Doc] = []
        taken: list[Chunk] = []  # counted and marked read once the window is whole: a read that fails moves nothing
        while True:
            chunk = self._next(chunks)
            if chunk is None or chunk.epoch != self.epoch:
                self._pending = chunk
                break
            if exact and len(keys) < size < len(keys) + chunk.num_docs:
                chunk, self._pending = chunk.split(np.array([size - len(keys)]))
            taken.append(chunk)
            keys += _keys(chunk)
            docs += _docs(chunk)
            if len(keys) >= size and (exact or chunk.source_end):
                break
        self._commit(taken)
        return LookaheadWindow(self.epoch, keys, docs) if keys else None

    def _commit(self, taken: list[Chunk]) -> None:
        """Count ``taken`` as read and move the read mark past the last of them."""
        for chunk in taken:
            self.ledger.commit(chunk)
            self.read = (chunk.epoch, chunk.segment, chunk.seq_end)

    def prime(self, chunks: Iterator[Chunk]) -> None:
        """Replay up to the read mark now, so :attr:`recovered` holds every wanted document."""
        if self.mark is not None:
            self._pending = self._next(chunks)

    def peek(self, chunks: Iterator[Chunk]) -> bool:
        """Return whether upstream has another chunk (of any epoch)."""
        self._pending = self._next(chunks)
        return self._pending is not None

    def more_in_epoch(self, chunks: Iterator[Chunk]) -> bool:
        """Return whether upstream has another chunk of the current epoch."""
        return self.peek(chunks) and self._pending is not None and self._pending.epoch == self.epoch

    def drain(self, chunks: Iterator[Chunk]) -> tuple[int, int]:
        """Skip the rest of the current epoch; return the documents and tokens skipped."""
        docs = tokens = 0
        taken: list[Chunk] = []
        while True:
            chunk = self._next(chunks)
            if chunk is None or chunk.epoch != self.epoch:
                self._pending = chunk
                self._commit(taken)
                return docs, tokens
            taken.append(chunk)
            assert chunk.offsets is not None
            docs += chunk.num_docs
            tokens += int(chunk.offsets[-1])

    @property
    def exhausted(self) -> bool:
        """Whether upstream has ended and nothing is pending."""
        return self._ended and self._pending is None


def _cut_at(chunk: Chunk, mark: tuple[int, int, int]) -> tuple[Chunk | None, Chunk]:
    """Split ``chunk`` at the read mark, a kept document of it: the rows before (``None`` if no document) and from it."""
    seq = mark[2]
    k = int(np.searchsorted(chunk.seq, seq))
    if (chunk.epoch, chunk.segment) != mark[:2] or k == chunk.num_docs or int(chunk.seq[k]) != seq:
        raise StateError(
            f"the state's read mark {mark} falls inside a chunk of rows {chunk.seq_start}..{chunk.seq_end} "
            "but at no document of it: the state was edited or the data changed"
        )
    if k:
        before, after = chunk.split(np.array([k]))
        return before, after
    # only skipped rows before the mark: they were counted with the window before
    skipped = {reason: seqs[seqs >= seq] for reason, seqs in chunk.skipped.items() if (seqs >= seq).any()}
    return None, replace(chunk, seq_start=seq, row_start=chunk.row_start + seq - chunk.seq_start, skipped=skipped)


def _keys(chunk: Chunk) -> list[Key]:
    segment = chunk.segment
    return [(segment, s) for s in chunk.seq.tolist()]


def _docs(chunk: Chunk) -> list[Doc]:
    """Every document of ``chunk``: its tokens (and mask) as views, the chunk's ``head_skip`` on the first."""
    assert chunk.tokens is not None and chunk.offsets is not None
    tokens, mask, offsets = chunk.tokens, chunk.mask, chunk.offsets.tolist()
    ends = offsets[1:]
    if mask is None:
        docs = [Doc(tokens[a:b], None, 0) for a, b in zip(offsets, ends)]
    else:
        docs = [Doc(tokens[a:b], mask[a:b], 0) for a, b in zip(offsets, ends)]
    if docs and chunk.head_skip:
        docs[0] = Doc(docs[0].tokens, docs[0].mask, chunk.head_skip)
    return docs
