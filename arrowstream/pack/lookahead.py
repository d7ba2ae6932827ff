"""What the runs of look-ahead packers share: held documents, position, state, epochs.

Packers that look ahead (best-fit packing, length bucketing) hold documents
back. Their state names the held documents by reference, ``(segment, seq)``
in the consumer's work, with how many tokens each has left, never by their
tokens; the documents come a window at a time from a
:class:`~arrowstream.pack.windows.DocumentSource`. A resume re-reads from
the earliest held document and keeps only those the state references.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

from arrowstream.io.chunk import Chunk, Ledger
from arrowstream.pack import PackRun
from arrowstream.pack.base import drop_at_target
from arrowstream.pack.frozen import freeze
from arrowstream.pack.store import size_in
from arrowstream.pack.windows import Doc, DocumentSource, Key
from arrowstream.state import BestFitState, BucketState, Position, Progress, State
from arrowstream.state.snapshot import Snapshot

__all__ = ["LookaheadRun", "fresh_origin"]


def fresh_origin(name: str, origin: Position | None) -> None:
    """Check that a look-ahead packer's fresh run starts at its share's first row.

    Shares that begin inside a document (whole batches of tokens) are dealt
    only to packers whose batch count the tokens decide (``concat``).

    Raises
    ------
    ValueError
        ``origin`` is not the start of the share's first segment.
    """
    if origin is not None and (origin.segment, origin.seq, origin.token_offset) != (0, 0, 0):
        raise ValueError(f"a fresh {name} run starts at its share's first row, got {origin}")


class LookaheadRun(PackRun):
    """What the runs of look-ahead packers share: held documents, position, state, epochs.

    A subclass keeps ``store`` (held documents by key), ``src`` (its
    :class:`DocumentSource`), ``ledger``, ``epoch``, ``emitted``, ``target``,
    ``flushed`` and ``targets``; it says which documents it holds
    (:meth:`_held_docs`), what its ``packer`` state adds
    (:meth:`_packer_state`) and what a new epoch resets (:meth:`_new_epoch`).
    Until the held documents of a loaded state are re-read, the loaded
    position and ``held`` are echoed, so a state saved right after a load is
    the state loaded.
    """

    store: Any  # a HeldStore (a frozen run's: its skips alone)
    size_windows: list[dict[Key, int]]  # the store's sizes, a dict per window (see pack/store.py)
    src: DocumentSource
    ledger: Ledger
    epoch: int  # the epoch being read
    counting: int  # the epoch whose batches are being counted: ahead of `epoch` while data is carried
    emitted: int
    target: int | None
    flushed: bool
    windows: int  # look-ahead windows read in the epoch
    targets: Callable[[int], int | None]
    loaded: Position | None = None
    _loaded_held: dict[str, Any] | None = None
    long_limit: int | None  # documents longer than this are split, truncated or dropped (`long_docs`)
    _counted_when_read = False  # a loaded state from before version 10: its held long documents were counted
    #: Containers of rows that never change once formed (a snapshot shares them: :mod:`~arrowstream.pack.frozen`).
    _shared: tuple[str, ...] = ()

    @abstractmethod
    def _held_docs(self) -> dict[Key, int]:
        """Return every held document and the first of its tokens not emitted yet."""

    def _nonzero_skips(self) -> dict[Key, int]:
        """Each held document's tokens removed from its front upstream, where there are any."""
        return self.store.skips  # type: ignore[no-any-return]  # a HeldStore, or a frozen run's copy

    @abstractmethod
    def _copy_rows(self, frozen: Any) -> None:
        """Give ``frozen`` (a shallow copy of this run) copies of the rows or batches later batches change."""

    def snapshot(self) -> Snapshot:
        """Capture the state after the last batch in microseconds; it is built when asked (:mod:`~arrowstream.pack.frozen`)."""
        return freeze(self)

    @abstractmethod
    def _packer_state(self, progress: Progress, read: tuple[int, int, int]) -> BestFitState | BucketState:
        """Return the strategy's ``packer`` part of the state (references only)."""

    @abstractmethod
    def _new_epoch(self) -> None:
        """Reset the strategy's per-epoch counters."""

    def _start(self, state: State | None, window: int) -> bool:
        """Begin a fresh run, or a re-dealt share (a state without a ``packer`` part); return whether it did.

        Sets the ledger (from the state's counts), the epoch's counters and
        the document source; a re-dealt share holds nothing and reads from
        the state's position. Returns ``False``, with only the ledger and the
        loaded position set, when ``state`` has a ``packer`` part for the
        subclass to load.
        """
        mark = None
        if state is None:
            self.ledger, epoch = Ledger(), 0
        else:
            self.ledger = Ledger(state.stats, state.epoch_stats)
            loaded = self._load_position(state)
            if state.packer:
                self._counted_when_read = state.version < 10
                return False
            epoch, mark = loaded.epoch, (loaded.epoch, loaded.segment, loaded.seq)
        self.epoch, self.emitted, self.windows, self.flushed = epoch, 0, 0, False
        self._count(epoch)
        self.target = self.targets(epoch)
        self.src = DocumentSource(window, self.ledger, epoch=epoch, mark=mark)
        return True

    def _load_position(self, state: State) -> Position:
        self.loaded = state.position
        self._loaded_held = None if state.held is None else state.held.to_dict()
        return self.loaded

    def upstream_position(self) -> Position:
        return self._position(sorted(self._held_docs().items()) if self.loaded is None else [])

    def _position(self, held: list[tuple[Key, int]]) -> Position:
        """Where a resume starts reading: the loaded position, the first held document (``held`` sorted), or the read mark."""
        if self.loaded is not None:
            return self.loaded
        if held:
            key = held[0][0]
            return Position(self.epoch, key[0], key[1], self.store[key].skip)
        epoch, segment, seq = self.src.read
        return Position(epoch, segment, seq, 0)

    def state_dict(self) -> dict[str, Any]:
        held: dict[str, Any] | None = None
        if self.loaded is not None:
            pos, loaded = self.loaded, self._loaded_held
            if loaded:
                held = {"read": list(loaded["read"]), "docs": [list(d) for d in loaded["docs"]]}
        else:
            first = self._held_docs()  # one pass over the held pieces
            keys = sorted(first)  # (segment, seq) pairs of ints: list.sort's fast path, unlike ((segment, seq), first)
            pos = self._position([(keys[0], first[keys[0]])] if keys else [])
            if keys:
                skips, windows, read = self._nonzero_skips(), self.size_windows, self.src.read
                docs = [[k[0], k[1], skips.get(k, 0) + first[k], size_in(windows, k) - first[k]] for k in keys]
                held = {"read": [read[1], read[2]], "docs": docs}  # each: tokens from `skip` on, `left` of them
        return {
            "held": held,
            "position": pos.to_dict(),
            "stats": self.ledger.snapshot(),
            "epoch_stats": self.ledger.epoch_snapshot(),
            "packer": self._packer_state(
                Progress(self.counting, self.emitted, self.target, data_epoch=self.epoch),
                tuple(self.src.read),  # type: ignore[arg-type]
            ).to_dict(),
        }

    def _recover_documents(self, chunks: Iterator[Chunk]) -> None:
        """Re-read the held documents of a loaded state into ``store``."""
        self.src.prime(chunks)
        self.store.update(self.src.recovered)
        self.src.recovered = {}
        self.loaded = None
        self._loaded_held = None
        if self._counted_when_read:  # they will be counted again when their first piece leaves
            self._counted_when_read = False
            for key, first in self._held_docs().items():
                if first == 0:
                    self._count_long(self.store[key], -1)

    def _count_long(self, doc: Doc, sign: int = 1) -> None:
        """Count ``doc`` split or truncated if it is a long document: called as its first piece leaves.

        Counted when its first piece is emitted or dropped, not when it is
        read, a long document held when the states were merged is counted
        once: by the consumer it was dealt to, which reads it again, or by
        the one that held it if its first piece had gone out (the copy dealt
        on then has a ``skip``). ``sign`` -1 takes a count back.
        """
        limit, n = self.long_limit, int(doc.tokens.size)
        if limit is None or doc.skip or n <= limit:  # not a long document's first piece: its head went out elsewhere
            return
        if self.p.long_docs == "split":  # type: ignore[attr-defined]
            self.ledger.add("long_docs_split", sign)
        elif self.p.long_docs == "truncate":  # type: ignore[attr-defined]
            self.ledger.add("long_docs_truncated", sign)
            self.ledger.add("truncated_tokens", sign * (n - limit))

    def _start_counting(self, progress: Progress) -> None:
        """Take the counted and the read epoch from a loaded ``progress``."""
        self._count(progress.epoch)
        self.epoch = progress.epoch if progress.data_epoch is None else progress.data_epoch

    def _count(self, epoch: int) -> None:
        """Count batches (and the per-epoch counters) toward ``epoch`` from now on."""
        self.counting = epoch
        self.ledger.begin_epoch(epoch)

    def _next_epoch(self, chunks: Iterator[Chunk]) -> bool:
        """Move to the next epoch; return false when there is none.

        While data is carried (the count is already in a later epoch), only
        the reading moves on: the count and its target stay.
        """
        more = self.src.peek(chunks)
        if self.counting > self.epoch:
            self.epoch += 1
            self.src.epoch = self.epoch
            self.flushed = False
            self._new_epoch()
            return True
        target = self.targets(self.epoch + 1)
        if not more and target is None:
            return False
        self.epoch += 1
        self._count(self.epoch)
        self.src.epoch = self.epoch
        self.emitted, self.flushed = 0, False
        self.target = target
        self._new_epoch()
        return True

    def _past_target(self, chunks: Iterator[Chunk], drop_rest: Callable[[], None]) -> bool:
        """At the target: carry what is left into the next epoch's count, or drop it; return false at the end.

        Carrying needs the packer to carry (``even_batches=True``), data left
        in the epoch being read, and a next epoch with a target. Otherwise
        ``drop_rest`` drops and counts what is left (with a warning).
        """
        if self.p.carries and (self._held_docs() or self.src.more_in_epoch(chunks)):  # type: ignore[attr-defined]
            target = self.targets(self.counting + 1)
            if target is not None:
                self._count(self.counting + 1)
                self.emitted = 0
                self.target = target
                return True
        drop_at_target(self.ledger, self.counting, drop_rest)
        return self._next_epoch(chunks)

    @property
    def carrying(self) -> bool:
        """Whether the batches being made hold data of an earlier epoch than the one counted."""
        return self.counting > self.epoch

    def _pad_to_target(self) -> bool:
        """Whether the epoch being read is used up short of the target of the same epoch: pad."""
        return self.target is not None and self.emitted < self.target and not self.carrying
