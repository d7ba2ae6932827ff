"""Concatenation: documents laid end to end into full rows.

:class:`ConcatPacker` joins documents (each ending with EOS when the tokenize
stage adds it) into rows of exactly ``seq_len`` tokens, ``batch_size`` rows per
batch, cutting documents at row ends. Its whole state is the position of the
first token not yet emitted. Batches never span two epochs: the last batch of
an epoch is padded (``drop_last=False``) or dropped and counted
(``drop_last=True``). The one exception is data carried past an estimated
even-batches target: it counts toward the next epoch, whose batches it then
opens (the state's ``packer.epoch`` is then ahead of the position's).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from arrowstream.io.chunk import Chunk, Ledger
from arrowstream.pack.base import Packer, PackRun, drop_at_target
from arrowstream.pack.blocks import assemble_full_batches, block_batches, in_sorted, segment_starts
from arrowstream.pack.layout import Layout
from arrowstream.state import Position, Progress, State

__all__ = ["ConcatPacker"]

#: Most batches computed together (their arrays share memory). Measured per batch on
#: 8 x 2048 tokens: 60 us in blocks of 8, 98 us in blocks of 32 (out of cache), 209 us alone.
_BLOCK_BATCHES = 8


class ConcatPacker(Packer):
    """Concatenate documents into full rows, cutting at row ends.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.io.chunk import Chunk
    >>> chunk = Chunk(epoch=0, shard=0, seq_start=0, seq_end=2, row_start=0,
    ...               seq=np.arange(2), tokens=np.arange(1, 8, dtype=np.int32),
    ...               offsets=np.array([0, 4, 7]))
    >>> run = ConcatPacker(seq_len=3, batch_size=2, drop_last=False, pad_id=0).start(None)
    >>> batch = run.next_batch(iter([chunk]))
    >>> batch["input_ids"].tolist(), batch["segment_ids"].tolist()
    ([[1, 2, 3], [4, 5, 6]], [[1, 1, 1], [1, 2, 2]])
    >>> run.state_dict()["position"]
    {'epoch': 0, 'segment': 0, 'seq': 1, 'token_offset': 2}
    """

    name = "concat"

    def exact_batches(self, num_tokens: int) -> int | None:
        """Rows are filled back to back: ``ceil(num_tokens / (seq_len * batch_size))`` batches.

        Examples
        --------
        >>> ConcatPacker(seq_len=4, batch_size=2).exact_batches(17)
        3
        """
        return -(-num_tokens // (self.seq_len * self.batch_size))

    def start(
        self,
        state: State | None,
        *,
        targets: Callable[[int], int | None] | None = None,
        origin: Position | None = None,
    ) -> PackRun:
        return _ConcatRun(self, state, targets or (lambda epoch: None), origin)


class _ConcatRun(PackRun):
    def __init__(
        self,
        packer: ConcatPacker,
        state: State | None,
        targets: Callable[[int], int | None],
        origin: Position | None = None,
    ) -> None:
        self.p = packer
        self.targets = targets
        self.queue: deque[Chunk] = deque()
        self.cursor = 0  # token index into queue[0]
        self.ahead: deque[dict[str, Any]] = deque()  # the next batches, made ahead (see _make_ahead)
        self.blocks = 0  # blocks of batches made ahead so far
        if state is None:
            self.pos = origin or Position(0, 0, 0, 0)
            self.ledger = Ledger()
        else:
            self.pos = state.position
            self.ledger = Ledger(state.stats, state.epoch_stats)
        self._ended = False
        progress = Progress.from_dict({} if state is None else state.packer, epoch=self.pos.epoch)
        self.epoch = progress.epoch
        self.emitted = progress.epoch_batches  # batches emitted in self.epoch
        self.target = progress.target if progress.target_known else targets(self.epoch)
        self.ledger.begin_epoch(self.epoch)

    def upstream_position(self) -> Position:
        return self.pos

    def _head(self, chunks: Iterator[Chunk]) -> Chunk | None:
        """Return the chunk holding the next token, pulling and retiring chunks as needed."""
        while True:
            if self.queue:
                head = self.queue[0]
                if self.cursor < head.offsets[-1]:
                    return head
                self.queue.popleft()
                self.ledger.commit(head)
                self.pos = Position(head.epoch, head.segment, head.seq_end, 0)
                self.cursor = 0
                continue
            if self._ended:
                return None
            chunk = next(chunks, None)
            if chunk is None:
                self._ended = True
                return None
            self.queue.append(chunk)

    def next_batch(self, chunks: Iterator[Chunk]) -> dict[str, np.ndarray]:
        if self.target is None or self.emitted < self.target:
            if not self.ahead:
                self._make_ahead(chunks)
            if self.ahead:
                return self._take_ahead(chunks)
        return self.next_layout(chunks).assemble(seq_len=self.p.seq_len, pad_id=self.p.pad_id)

    def _make_ahead(self, chunks: Iterator[Chunk]) -> None:
        """Compute the next full batches together, where the chunks of this epoch hold them.

        The batches :meth:`next_layout` would lay out one at a time, computed
        in one pass over up to ``_BLOCK_BATCHES`` of them, and no more tokens
        than :data:`~arrowstream.pack.blocks.BLOCK_TOKENS` (the first blocks
        of a run are smaller: 1, 2, 4... batches, so the first batch waits for
        no more data than before). Nothing of the run's state moves here but
        the chunks pulled ahead into the queue; :meth:`_take_ahead` does the
        bookkeeping batch by batch. An epoch's end, a target or a loss mask
        that only some chunks have ends a block; what is left goes through
        :meth:`next_layout`. A read error in a chunk pulled ahead is raised up
        to a block's batches early; the state still names the last batch
        emitted, so a resume loses nothing.
        """
        need = self.p.seq_len * self.p.batch_size
        want = min(block_batches(_BLOCK_BATCHES, need), 1 << min(self.blocks, 8))
        if self.target is not None:
            want = min(want, self.target - self.emitted)
        pieces, have = self._pieces_ahead(chunks, want * need)
        count = min(want, have // need)
        if not count:
            return
        tokens, starts, ends, mask = _gather(pieces, count * need)
        self.ahead.extend(assemble_full_batches(
            tokens, starts, ends, batch_size=self.p.batch_size, seq_len=self.p.seq_len, mask=mask
        ))
        self.blocks += 1

    def _pieces_ahead(self, chunks: Iterator[Chunk], most: int) -> tuple[list[tuple[Chunk, int, int]], int]:
        """Return the queued pieces ``(chunk, a, b)`` from the cursor on that hold ``most`` tokens (or all there are), and their tokens.

        Only this epoch's chunks count, and only those that have a loss mask
        if the first one has (or none has one); chunks are pulled into the
        queue as needed, nothing else moves. The last piece may hold more
        than needed: :func:`_gather` cuts them to size.
        """
        head = self._head(chunks)
        if head is None or head.epoch != self.epoch:
            return [], 0
        masked = head.mask is not None
        have, used = int(head.offsets[-1]) - self.cursor, 1
        while have < most:
            if used == len(self.queue):
                chunk = None if self._ended else next(chunks, None)
                if chunk is None:
                    self._ended = True
                    break
                self.queue.append(chunk)
            chunk = self.queue[used]
            if chunk.epoch != self.epoch or (chunk.mask is not None) != masked:
                break
            have += int(chunk.offsets[-1])
            used += 1
        pieces = [(chunk, 0, int(chunk.offsets[-1])) for chunk in itertools.islice(self.queue, used)]
        pieces[0] = (head, self.cursor, pieces[0][2])
        return pieces, min(have, most)

    def _take_ahead(self, chunks: Iterator[Chunk]) -> dict[str, Any]:
        """Hand out the next batch made ahead, moving the cursor and counting as :meth:`next_layout` does."""
        self._advance(chunks, self.p.seq_len * self.p.batch_size)
        return self.ahead.popleft()

    def _advance(self, chunks: Iterator[Chunk], need: int, layouts: int = 1) -> None:
        """Move past ``need`` tokens known to be queued, and count them as ``layouts`` full batches (or layouts)."""
        got = 0
        while got < need:
            head = self._head(chunks)
            assert head is not None  # the tokens were seen in the queue ahead of time
            take = min(need - got, int(head.offsets[-1]) - self.cursor)
            self.cursor += take
            got += take
        self.emitted += layouts
        self.ledger.add("tokens", need)
        self.ledger.add("padding_tokens", 0)
        self.ledger.add("batches", layouts)

    def rows_ahead(
        self, chunks: Iterator[Chunk], rows: int
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray] | None:
        """Return the tokens of the next ``rows`` full rows, with document starts and ends, if this epoch has them.

        For a mixture that lays out several of its batches at once: the
        tokens are ``rows * seq_len`` of them in pieces laid end to end
        (views into the chunks, to be copied, not written to); starts and
        ends count from the first piece's first token, as
        :func:`~arrowstream.pack.blocks.assemble_full_batches` takes them.
        ``None`` where the rows are not all full in this epoch, where a target
        counts the batches, or where a loss mask comes: the caller lays out
        one batch at a time then. Nothing moves: :meth:`skip_rows` does, one
        layout at a time.
        """
        if self.target is not None:
            return None
        need = rows * self.p.seq_len
        pieces, have = self._pieces_ahead(chunks, need)
        if have < need or pieces[0][0].mask is not None:
            return None
        cut = _cut(pieces, need)
        starts, ends = _doc_edges(cut)
        return [c.tokens[a:b] for c, a, b in cut], starts, ends

    def rows_held(self, chunks: Iterator[Chunk], rows: int) -> int:
        """Return how many of the next ``rows`` full rows :meth:`rows_ahead` can give (0 where it gives none)."""
        if self.target is not None:
            return 0
        pieces, have = self._pieces_ahead(chunks, rows * self.p.seq_len)
        return 0 if not pieces or pieces[0][0].mask is not None else have // self.p.seq_len

    def skip_rows(self, chunks: Iterator[Chunk], rows: int, layouts: int = 1) -> None:
        """Count the next ``rows`` full rows out, as ``layouts`` calls of :meth:`next_layout` would lay them out (after :meth:`rows_ahead`)."""
        self.ahead.clear()  # as next_layout does
        self._advance(chunks, rows * self.p.seq_len, layouts)

    def next_layout(self, chunks: Iterator[Chunk], rows: int | None = None) -> Layout:
        """Return the next batch's layout: ``batch_size`` rows, or ``rows`` (a mixture asks for its rows of a source)."""
        L, B = self.p.seq_len, self.p.batch_size if rows is None else rows
        need = L * B
        self.ahead.clear()  # batches made ahead assumed this call would not come
        while True:
            if self.target is not None and self.emitted >= self.target:
                if self._carry(chunks):  # the rest counts toward the next epoch's target
                    continue
                # the last epoch, or carrying is off: count the rest as dropped (and say so)
                drop_at_target(self.ledger, self.epoch, lambda: self._drain_epoch(chunks))
                if not self._next_epoch(chunks):
                    raise StopIteration
                continue
            pieces: list[tuple[Chunk, int, int]] = []
            got = 0
            head = None
            while got < need:
                head = self._head(chunks)
                if head is None or head.epoch > self.epoch:  # an earlier epoch's: carried data
                    break
                take = min(need - got, int(head.offsets[-1]) - self.cursor)
                pieces.append((head, self.cursor, self.cursor + take))
                self.cursor += take
                got += take
            if got == 0:  # the epoch's data is used up
                if self.target is not None and self.emitted < self.target:
                    self.emitted += 1
                    self.ledger.add("padding_batches", 1)
                    return self._layout([], 0, B)  # all padding: other consumers still have data
                if not self._next_epoch(chunks):
                    raise StopIteration
                continue
            if got < need and self.p.drop_last and self.target is None:
                self.ledger.add("dropped_tokens", got)
                self.ledger.add("dropped_docs", sum(_untouched(c, a) for c, a, _ in pieces))
                continue
            self.emitted += 1
            return self._layout(pieces, got, B)

    def _carry(self, chunks: Iterator[Chunk]) -> bool:
        """At the target with data left: count it toward the next epoch, if there is one; return whether."""
        if not self.p.carries:
            return False
        head = self._head(chunks)
        if head is None or head.epoch > self.epoch:
            return False  # nothing left to carry
        target = self.targets(self.epoch + 1)
        if target is None:
            return False  # the last epoch
        self.epoch += 1
        self.emitted = 0
        self.target = target
        self.ledger.begin_epoch(self.epoch)
        return True

    def _next_epoch(self, chunks: Iterator[Chunk]) -> bool:
        """Move to the next epoch; return false when there is none."""
        head = self._head(chunks)
        target = self.targets(self.epoch + 1)
        if head is None and target is None:
            return False
        self.epoch += 1
        self.emitted = 0
        self.target = target
        self.ledger.begin_epoch(self.epoch)
        return True

    def _drain_epoch(self, chunks: Iterator[Chunk]) -> None:
        """Skip what is left of ``self.epoch``, counting the documents and tokens dropped."""
        while True:
            head = self._head(chunks)
            if head is None or head.epoch > self.epoch:
                return
            assert head.offsets is not None
            self.ledger.add("dropped_tokens", int(head.offsets[-1]) - self.cursor)
            self.ledger.add("dropped_docs", _untouched(head, self.cursor))
            self.cursor = int(head.offsets[-1])

    def _layout(self, pieces: list[tuple[Chunk, int, int]], got: int, B: int) -> Layout:
        L = self.p.seq_len
        if len(pieces) == 1:  # the usual case: the rows lie in one chunk
            chunk, a, b = pieces[0]
            src = chunk.tokens[a:b]
            mask = None if chunk.mask is None else chunk.mask[a:b]
        else:
            src = np.concatenate([c.tokens[a:b] for c, a, b in pieces] or [np.empty(0, np.int32)])
            masked = pieces and all(c.mask is not None for c, _, _ in pieces)
            mask = np.concatenate([c.mask[a:b] for c, a, b in pieces]) if masked else None  # type: ignore[index]
        for chunk, a, b in pieces:
            if chunk.epoch < self.epoch:  # carried: read in an earlier epoch, counted in this one
                self.ledger.add("carried_tokens", b - a)
                self.ledger.add("carried_docs", int(_starts_in(chunk, a, b).size))
        starts_all, ends_all = _doc_edges(pieces)
        bounds = segment_starts(got, L, starts_all.astype(np.int64))
        seg_len = np.diff(bounds, append=got)
        whole = in_sorted(bounds, starts_all) & in_sorted(bounds + seg_len, ends_all)
        self.ledger.add("tokens", got)
        self.ledger.add("padding_tokens", B * L - got)
        self.ledger.add("batches", 1)
        return Layout(src, bounds, seg_len, bounds // L, whole, mask, B)

    def state_dict(self) -> dict[str, Any]:
        pos, partial = self.pos, None
        if self.queue and self.cursor < self.queue[0].offsets[-1]:
            head = self.queue[0]
            i = int(np.searchsorted(head.offsets, self.cursor, side="right")) - 1
            skipped = head.head_skip if i == 0 else 0  # tokens removed before this run
            offset = self.cursor - int(head.offsets[i]) + skipped
            pos = Position(head.epoch, head.segment, int(head.seq[i]), offset)
            partial = head
        elif self.queue:
            head = self.queue[0]
            pos = Position(head.epoch, head.segment, head.seq_end, 0)
            partial = head
        stats = self.ledger.snapshot(partial, pos.seq)
        return {
            "position": pos.to_dict(),
            "stats": stats,
            "epoch_stats": self.ledger.epoch_snapshot(),
            "packer": Progress(self.epoch, self.emitted, self.target).to_dict(),
        }


def _starts_in(chunk: Chunk, a: int, b: int) -> np.ndarray:
    """Return the document starts in tokens ``[a, b)`` of ``chunk`` (a continued document's first token is none)."""
    offsets = chunk.offsets  # increasing: the documents in [a, b) are a slice
    starts = offsets[np.searchsorted(offsets, a) : np.searchsorted(offsets, b)]
    if chunk.head_skip and a == 0:
        starts = starts[1:]  # the first document's head went out before: a continuation
    return starts


def _doc_edges(pieces: list[tuple[Chunk, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Return where documents start and end in the pieces ``(chunk, a, b)`` laid end to end."""
    doc_starts, doc_ends = [], []
    base = 0
    for chunk, a, b in pieces:
        offsets = chunk.offsets
        doc_starts.append(_starts_in(chunk, a, b) - a + base)
        ends = offsets[np.searchsorted(offsets, a, "right") : np.searchsorted(offsets, b, "right")]
        if chunk.tail_take and b == offsets[-1]:
            ends = ends[:-1]  # the last document goes on in another consumer's share
        doc_ends.append(ends - a + base)
        base += b - a
    empty = np.empty(0, np.int64)
    starts = doc_starts[0] if len(doc_starts) == 1 else np.concatenate(doc_starts or [empty])
    ends = doc_ends[0] if len(doc_ends) == 1 else np.concatenate(doc_ends or [empty])
    return starts, ends


def _cut(pieces: list[tuple[Chunk, int, int]], size: int) -> list[tuple[Chunk, int, int]]:
    """Return the pieces ``(chunk, a, b)`` that hold the first ``size`` tokens of ``pieces``, the last cut to fit."""
    cut, left = [], size
    for chunk, a, b in pieces:
        b = min(b, a + left)
        cut.append((chunk, a, b))
        left -= b - a
        if not left:
            break
    return cut


def _gather(
    pieces: list[tuple[Chunk, int, int]], size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Return the first ``size`` tokens of ``pieces`` as one fresh array, with document starts, ends and loss mask."""
    cut = _cut(pieces, size)
    starts, ends = _doc_edges(cut)
    tokens = np.concatenate([c.tokens[a:b] for c, a, b in cut])
    masked = cut[0][0].mask is not None
    mask = np.concatenate([c.mask[a:b] for c, a, b in cut]) if masked else None  # type: ignore[index]
    return tokens, starts, ends, mask


def _untouched(chunk: Chunk, cursor: int) -> int:
    """How many of ``chunk``'s documents have no token before token ``cursor`` (none of theirs went out)."""
    assert chunk.offsets is not None
    untouched = int((chunk.offsets[:-1] >= cursor).sum())
    if chunk.head_skip and cursor == 0:
        untouched -= 1  # its first document's first tokens went out before a resume, or to another consumer
    return untouched
