"""Best-fit packing: whole documents placed into rows over a look-ahead window.

:class:`BestFitPacker` reads documents a window at a time (see
:mod:`arrowstream.pack.windows`), sorts the window's pieces by length, longest
first, and puts each into the open row with the least room that still fits
it, opening a row when none does (best-fit decreasing). Open rows are carried
into the next windows, so later short documents fill their gaps. A row
closes when it is full enough (``fill``), when it has been open for
``max_age`` windows, or when more than ``max_open`` rows are open (the
fullest close first). At the end of an epoch every open row closes, so
batches never span epochs.

Only documents longer than ``seq_len`` are cut (``long_docs``): ``"split"``
makes full rows of ``seq_len`` tokens and packs the remainder like any
document, ``"truncate"`` keeps the first ``seq_len`` tokens, ``"drop"``
skips the document; each is counted.

Closed rows pass through a bounded shuffle: every ``shuffle_batches x
batch_size`` closed rows are permuted with a generator seeded by ``(seed,
epoch, block)``, so batches are not ordered by length and the shuffle's state
is one counter.

With ``ramp`` (the default), the first epoch's first windows are smaller
(64 documents, then four times as many each window up to ``window``; see
:func:`~arrowstream.pack.windows.window_size`) and the blocks shuffled
after them one batch each, so the first batch waits for a few dozen
documents rather than a whole window. Later windows and epochs are as
without it.

The decisions work on lengths; the tokens move once per batch, gathered
from the held documents. The state names held documents by reference
(``[segment, seq]``, or ``[segment, seq, start, length]`` for a piece), with
the rows they are in, the read mark and the counters; a resume re-reads from
the earliest held document, which is at most a few windows back.

Deterministic: the output depends only on the data, the options, the seed
and ``batch_rows`` (a window ends where a read batch of ``batch_rows`` rows
ends), not on prefetching, the tokenizer's slicing or where a run was
resumed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np

from arrowstream.checks import check_int
from arrowstream.errors import ConfigError
from arrowstream.io.chunk import Chunk
from arrowstream.pack import Packer, PackRun
from arrowstream.pack.blocks import block_batches
from arrowstream.pack.layout import Layout, layout_of_rows
from arrowstream.pack.lookahead import LookaheadRun, fresh_origin
from arrowstream.pack.queued import (
    Entry, FullRows, count_rows, entry_from_refs, first_pieces, iter_rows, piece_counts, pieces_from_refs, push_rows,
    row_refs, shuffled_rows, take_rows,
)
from arrowstream.pack.rowfit import OpenRow, fit_pieces
from arrowstream.pack.split import assemble_split
from arrowstream.pack.store import HeldStore
from arrowstream.pack.windows import Doc, DocumentSource, Key, window_size
from arrowstream.state import BestFitState, Position, Progress, State

__all__ = ["LONG_DOCS", "BestFitPacker"]

#: What to do with documents longer than ``seq_len``.
LONG_DOCS = ("split", "truncate", "drop")

#: The most batches assembled in one pass (:meth:`_BestFitRun._batch`).
_AHEAD_BATCHES = 8

#: ``(key, start, length, whole)``: tokens ``start..start+length`` of a document.
DocSegment = tuple[Key, int, int, bool]


class BestFitPacker(Packer):
    """Pack whole documents into rows by best-fit decreasing over a window.

    Parameters
    ----------
    window
        Documents read and placed at once (the look-ahead).
    fill
        A row closes once this share of ``seq_len`` is filled.
    max_age
        A row closes after this many windows open.
    max_open
        At most this many rows stay open after a window (``None``:
        ``4 * batch_size``).
    long_docs
        ``"split"``, ``"truncate"`` or ``"drop"`` for documents longer than
        ``seq_len``.
    shuffle_batches
        Closed rows are shuffled in blocks of this many batches (1: no
        shuffle across batches).
    seed
        Seed of that shuffle.
    ramp
        Start the first epoch with smaller windows (64 documents, four
        times as many each window up to ``window``) and one-batch shuffle
        blocks, so the first batch comes early; ``False``: every window is
        ``window`` documents.

    Other parameters are those of :class:`~arrowstream.pack.Packer`.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.io.chunk import Chunk
    >>> lengths = [5, 2, 3, 4, 1, 1]   # two rows of 8 hold them all: 5+2+1, 4+3+1
    >>> offsets = np.r_[0, np.cumsum(lengths)]
    >>> chunk = Chunk(epoch=0, shard=0, seq_start=0, seq_end=6, row_start=0, seq=np.arange(6),
    ...               tokens=np.arange(1, offsets[-1] + 1, dtype=np.int32), offsets=offsets)
    >>> packer = BestFitPacker(seq_len=8, batch_size=2, drop_last=False, pad_id=0, window=6)
    >>> batch = packer.start(None).next_batch(iter([chunk]))
    >>> batch["num_padding_tokens"], batch["num_docs"], batch["num_cut_docs"]
    (0, 6, 0)
    """

    name = "best_fit"
    counters = (
        *Packer.counters,
        "long_docs_split", "long_docs_truncated", "long_docs_dropped", "long_tokens_dropped", "truncated_tokens",
    )

    def __init__(
        self,
        *,
        seq_len: int,
        batch_size: int,
        drop_last: bool = False,
        pad_id: int = 0,
        even_batches: bool | str = True,
        window: int = 1024,
        fill: float = 0.98,
        max_age: int = 4,
        max_open: int | None = None,
        long_docs: str = "split",
        shuffle_batches: int = 4,
        seed: int = 0,
        ramp: bool = True,
    ) -> None:
        super().__init__(
            seq_len=seq_len,
            batch_size=batch_size,
            drop_last=drop_last,
            pad_id=pad_id,
            even_batches=even_batches,
        )
        max_open = 4 * self.batch_size if max_open is None else max_open
        for key, value in (
            ("window", window),
            ("max_age", max_age),
            ("max_open", max_open),
            ("shuffle_batches", shuffle_batches),
        ):
            check_int(key, value)
        check_int("seed", seed, low=0)
        if isinstance(fill, bool) or not isinstance(fill, (int, float)) or not 0 < fill <= 1:
            raise ConfigError(f"`fill` must be a number in (0, 1], got {fill!r}")
        if long_docs not in LONG_DOCS:
            raise ConfigError(f"`long_docs` must be one of {list(LONG_DOCS)!r}, got {long_docs!r}")
        self.window = int(window)
        self.fill = float(fill)
        self.max_age = int(max_age)
        self.max_open = int(max_open)
        self.long_docs = long_docs
        self.shuffle_batches = int(shuffle_batches)
        self.seed = int(seed)
        self.ramp = bool(ramp)

    def spec(self) -> dict[str, Any]:
        return {
            **super().spec(),
            "window": self.window,
            "fill": self.fill,
            "max_age": self.max_age,
            "max_open": self.max_open,
            "long_docs": self.long_docs,
            "shuffle_batches": self.shuffle_batches,
            "seed": self.seed,
            # only when off: the options (and states) of pipelines from before the ramp stay the same
            **({} if self.ramp else {"ramp": False}),
        }

    def start(
        self, state: State | None, *, targets: Callable[[int], int | None] | None = None, origin: Position | None = None
    ) -> PackRun:
        fresh_origin(self.name, origin)
        return _BestFitRun(self, state, targets or (lambda epoch: None))


class _BestFitRun(LookaheadRun):
    def __init__(self, packer: BestFitPacker, state: State | None, targets: Callable[[int], int | None]) -> None:
        self.p = packer
        self.targets = targets
        self.store = HeldStore(cap=packer.seq_len if packer.long_docs == "truncate" else None)
        self.long_limit = packer.seq_len
        self.size_windows = self.store.windows  # the same list: a snapshot copies it
        self.refs: dict[Key, int] = {}  # pieces not yet emitted, per held document
        self.open: list[OpenRow] = []
        # rows (a split document's full rows as one FullRows entry, see pack/queued.py) and how many
        self.ready: list[Entry] = []
        self.out: list[Entry] = []
        self.n_ready = self.n_out = 0
        self.ramp, self.block = packer.ramp, 0
        self.ahead: deque[tuple[list[list[DocSegment]], dict[str, Any]]] = deque()  # rows at the front of out, assembled
        if self._start(state, packer.window):
            return
        assert state is not None
        part = BestFitState.from_dict(state.packer)
        self._start_counting(part.progress)
        self.emitted = part.progress.epoch_batches
        self.target = part.progress.target if part.progress.target_known else targets(self.counting)
        self.block, self.flushed, mark = part.block, part.flushed, part.read
        self.windows, self.ramp = part.windows, part.ramp  # a state from before the ramp: none, to the end
        self.open = [OpenRow(pieces_from_refs(p), 0, age) for age, p in part.open]
        self.ready = [entry_from_refs(p) for p in part.ready]
        self.out = [entry_from_refs(p) for p in part.out]
        self.n_ready, self.n_out = count_rows(self.ready), count_rows(self.out)
        self.refs = piece_counts(self._rows())
        self.src = DocumentSource(
            self.p.window, self.ledger, epoch=self.epoch, mark=mark, wanted=set(self.refs)  # type: ignore[arg-type]
        )

    # -- state ----------------------------------------------------------------------

    def _rows(self) -> Iterator[Entry]:
        """Every pending row, a split document's full rows as one :class:`FullRows`."""
        yield from (row.pieces for row in self.open)
        yield from self.ready
        yield from self.out

    def _held_docs(self) -> dict[Key, int]:
        return first_pieces(self._rows())

    _shared = ("ready", "out", "size_windows")  # a closed row's pieces never change (open rows' do), nor a sealed window's sizes

    def _copy_rows(self, frozen: Any) -> None:
        frozen.open = [OpenRow(list(row.pieces), row.fill, row.age) for row in self.open]
        frozen.ready = list(self.ready)
        frozen.out = list(self.out)

    def _packer_state(self, progress: Progress, read: tuple[int, int, int]) -> BestFitState:
        return BestFitState(
            progress, read, self.block, self.flushed, tuple((row.age, row_refs(row.pieces)) for row in self.open),
            tuple(row_refs(p) for p in self.ready), tuple(row_refs(p) for p in self.out), self.windows, self.ramp,
        )

    def _new_epoch(self) -> None:
        self.block = self.windows = 0

    # -- batches --------------------------------------------------------------------

    def next_batch(self, chunks: Iterator[Chunk]) -> dict[str, Any]:
        return self._batch(*self._take(chunks, None))

    def next_layout(self, chunks: Iterator[Chunk], rows: int | None = None) -> Layout:
        """Return the next batch's layout: ``batch_size`` rows, or ``rows`` (a mixture asks for its rows of a source)."""
        return self._layout(*self._take(chunks, rows))

    def _take(self, chunks: Iterator[Chunk], rows: int | None) -> tuple[list[list[DocSegment]], int]:
        """Return the next batch's rows (none for a batch of padding) and its size, counted as emitted."""
        if self.loaded is not None:
            self._recover(chunks)
        B = self.p.batch_size if rows is None else rows
        while True:
            if self.target is not None and self.emitted >= self.target:
                # this consumer's share is used up: carry the rest into the next epoch's count, or
                # in the last epoch drop it (and say so)
                if not self._past_target(chunks, lambda: self._drop_rest(chunks)):
                    raise StopIteration
                continue
            if self.n_out >= B or (self.flushed and self.n_out):
                taken, self.out = take_rows(self.out, B)
                self.n_out -= len(taken)
                if len(taken) < B and self.p.drop_last and self.target is None:
                    self._drop(taken)
                    continue
                self.emitted += 1
                return taken, B
            if self.flushed:  # the epoch's data is used up
                if self._pad_to_target():
                    self.emitted += 1
                    self.ledger.add("padding_batches", 1)
                    return [], B  # all padding: other consumers still have data
                if not self._next_epoch(chunks):
                    raise StopIteration
                continue
            size = window_size(self.p.window, self.windows, ramp=self.ramp and self.epoch == 0)
            window = self.src.pull(chunks, size, exact=size < self.p.window)
            if window is None:
                self._close(list(range(len(self.open))))
                self._shuffle_block(self.n_ready)
                self.flushed = True
                continue
            self.windows += 1
            self._place(window.keys, window.docs)
            self._close_after_window()
            # whatever the rows asked for; one batch while the windows ramp up, so the first goes out early
            block = (1 if size < self.p.window else self.p.shuffle_batches) * self.p.batch_size
            while self.n_ready >= block:
                self._shuffle_block(block)

    def _recover(self, chunks: Iterator[Chunk]) -> None:
        """Re-read the held documents of a loaded state and complete their pieces."""
        self._recover_documents(chunks)

        def full(pieces: Entry) -> Any:
            if type(pieces) is FullRows:  # lengths always known
                return pieces
            return [
                (key, start, int(self.store[key].tokens.size) if n < 0 else n, whole)
                for key, start, n, whole in pieces
            ]

        for row in self.open:
            row.pieces = full(row.pieces)
            row.fill = sum(n for _, _, n, _ in row.pieces)
        self.ready = [full(p) for p in self.ready]
        self.out = [full(p) for p in self.out]

    def _place(self, keys: list[Key], docs: list[Doc]) -> None:
        L = self.p.seq_len
        sizes = [doc.tokens.size for doc in docs]
        # each document's one piece (not whole if its head went out elsewhere, a skip), and its count
        pieces = list(zip(keys, repeat(0), sizes, [not doc.skip for doc in docs]))
        counts = dict.fromkeys(keys, 1)
        if max(sizes, default=0) > L:
            pieces, keys, docs, sizes = self._cut_long(pieces, counts, keys, docs, sizes)
        self.store.hold(keys, docs, sizes)
        self.refs.update(counts)
        fit_pieces(self.open, pieces, L)  # best-fit decreasing

    def _cut_long(
        self, pieces: list[DocSegment], counts: dict[Key, int], keys: list[Key], docs: list[Doc], sizes: list[int]
    ) -> tuple[list[DocSegment], list[Key], list[Doc], list[int]]:
        """Deal with a window's documents longer than ``seq_len``, in order: full rows, the pieces left, counts.

        Returns the pieces to place and the documents to hold (all but dropped ones), with their sizes.
        """
        L = self.p.seq_len
        gone: set[int] = set()  # places in ``pieces`` left with no piece to place
        dropped: set[int] = set()
        for i in [i for i, n in enumerate(sizes) if n > L]:
            key, n = keys[i], sizes[i]
            gone.add(i)
            if self.p.long_docs == "drop":
                self.ledger.add("long_docs_dropped", 1)
                self.ledger.add("long_tokens_dropped", n)
                dropped.add(i)
                del counts[key]
                continue
            if self.p.long_docs == "truncate":  # counted when its piece leaves (_release)
                push_rows(self.ready, [[(key, 0, L, False)]])
                self.n_ready += 1
                continue
            full, rest = divmod(n, L)  # counted when its first piece leaves (_release)
            counts[key] = full + (rest > 0)
            push_rows(self.ready, [FullRows(key, 0, L, full)])  # one entry however long the document
            self.n_ready += full
            if rest:
                pieces[i] = (key, full * L, rest, False)
                gone.discard(i)
        pieces = [p for i, p in enumerate(pieces) if i not in gone]
        if dropped:
            kept = [i for i in range(len(keys)) if i not in dropped]
            keys, docs, sizes = [keys[i] for i in kept], [docs[i] for i in kept], [sizes[i] for i in kept]
        return pieces, keys, docs, sizes

    def _close_after_window(self) -> None:
        L = self.p.seq_len
        for row in self.open:
            row.age += 1
        closing = {
            i for i, row in enumerate(self.open)
            if row.fill >= self.p.fill * L or row.age >= self.p.max_age
        }
        keep = [i for i in range(len(self.open)) if i not in closing]
        if len(keep) > self.p.max_open:  # too many open: the fullest close first
            by_fill = sorted(keep, key=lambda i: (-self.open[i].fill, i))
            closing.update(by_fill[: len(keep) - self.p.max_open])
        self._close(sorted(closing))

    def _close(self, indices: list[int]) -> None:
        chosen = set(indices)
        push_rows(self.ready, [self.open[i].pieces for i in indices])
        self.n_ready += len(indices)
        self.open = [row for i, row in enumerate(self.open) if i not in chosen]

    def _shuffle_block(self, n: int) -> None:
        if n == 0:
            return
        block, self.ready = take_rows(self.ready, n)
        self.n_ready -= n
        push_rows(self.out, shuffled_rows(block, np.random.default_rng([self.p.seed, self.epoch, self.block])))
        self.n_out += n
        self.block += 1

    def _layout(self, rows: list[list[DocSegment]], B: int) -> Layout:
        layout = layout_of_rows(rows, self.store, B)
        self._account(rows, layout.num_tokens, B)
        return layout

    def _batch(self, rows: list[list[DocSegment]], B: int) -> dict[str, Any]:
        """Return the batch of ``rows``: assembled ahead with the batches before, or now with the next few.

        The next full batches' rows wait at the front of ``out``: up to ``_AHEAD_BATCHES``
        batches (within :data:`~arrowstream.pack.blocks.BLOCK_TOKENS` and the target) are
        assembled in one pass (:func:`~arrowstream.pack.split.assemble_split`). Their rows stay
        in ``out`` and their documents held until each batch is taken, so every state is
        the one without this. A batch is used only if its rows are the ones taken (a mixed
        caller may take rows through :meth:`next_layout`); none is left when ``out`` empties
        (a new epoch, whose keys name other documents, begins only then).
        """
        L, ahead = self.p.seq_len, self.ahead
        if ahead:
            ahead_rows, batch = ahead.popleft()
            if ahead_rows == rows:
                self._account(rows, batch["num_tokens"], B)
                return batch
            ahead.clear()  # rows were taken another way in between (a layout): what waits is stale
        more = min(block_batches(_AHEAD_BATCHES, B * L) - 1, self.n_out // B) if len(rows) == B else 0
        if self.target is not None:
            more = min(more, self.target - self.emitted)
        if more <= 0:
            return self._layout(rows, B).assemble(seq_len=L, pad_id=self.p.pad_id)
        following, _ = take_rows(self.out, more * B)
        batches = assemble_split(
            layout_of_rows(rows + following, self.store, (more + 1) * B), more + 1, seq_len=L, pad_id=self.p.pad_id
        )
        ahead.extend((following[k * B : (k + 1) * B], batches[k + 1]) for k in range(more))
        self._account(rows, batches[0]["num_tokens"], B)
        return batches[0]

    def _account(self, rows: list[list[DocSegment]], tokens: int, B: int) -> None:
        """Count a batch of ``rows`` (``tokens`` of them) and let its pieces go."""
        flat = [piece for row in rows for piece in row]
        if self.carrying:  # read in an earlier epoch, counted in this one
            self.ledger.add("carried_tokens", tokens)
            heads = sum(1 for key, start, _, _ in flat if start == 0 and self.store[key].skip == 0)
            self.ledger.add("carried_docs", heads)
        self._release(flat)
        self.ledger.add("tokens", tokens)
        self.ledger.add("padding_tokens", B * self.p.seq_len - tokens)
        self.ledger.add("batches", 1)

    def _release(self, pieces: list[DocSegment]) -> None:
        """Let pieces go (emitted or dropped); a long document is counted as its first piece goes (``_count_long``)."""
        if not all(map(itemgetter(3), pieces)):  # not all whole documents: a long one's first piece, maybe
            for key, _, _, _ in [p for p in pieces if p[1] == 0 and not p[3]]:
                self._count_long(self.store[key])
        refs = self.refs
        keys = list(map(itemgetter(0), pieces))
        if max(map(refs.__getitem__, keys), default=1) == 1:  # each one's last piece (so no key twice): all go
            deque(map(refs.__delitem__, keys), maxlen=0)
            self.store.let_go(keys)
            return
        gone = []
        for key in keys:
            left = refs[key] - 1
            if left:
                refs[key] = left
            else:
                del refs[key]
                gone.append(key)
        self.store.let_go(gone)

    def _drop(self, rows: list[list[DocSegment]]) -> None:
        """Count rows that will not be emitted: their tokens, and documents whose head they hold."""
        pieces = [piece for row in rows for piece in row]
        self.ledger.add("dropped_tokens", sum(n for _, _, n, _ in pieces))
        heads = sum(1 for key, start, _, _ in pieces if start == 0 and self.store[key].skip == 0)
        self.ledger.add("dropped_docs", heads)
        self._release(pieces)

    def _drop_rest(self, chunks: Iterator[Chunk]) -> None:
        """Drop everything held and the rest of the epoch upstream, counted."""
        self._drop([row.pieces for row in self.open] + list(iter_rows(self.ready)) + list(iter_rows(self.out)))
        self.open, self.ready, self.out = [], [], []
        self.n_ready = self.n_out = 0
        docs, tokens = self.src.drain(chunks)
        self.ledger.add("dropped_docs", docs)
        self.ledger.add("dropped_tokens", tokens)
        self.flushed = True

