"""The run of a bucketing packer: documents a window at a time, batched by length, with its state.

:class:`BucketRun` is what :meth:`BucketPacker.start <arrowstream.pack.bucket.BucketPacker.start>`
returns for one consumer: it pulls look-ahead windows
(:mod:`arrowstream.pack.windows`), lets the packer cut each window's pool
into batches (:meth:`~arrowstream.pack.bucket.BucketPacker.plan`), queues them
in an order permuted by ``(seed, epoch, window)``, carries the leftovers in
stream order, and assembles each batch once, right-padded. Its state names
held documents by reference (see ``docs/state-format.md``).

A document longer than ``max_len`` is split by default (``long_docs="split"``):
it enters the pool as its first piece, and each next piece, ``(segment, seq,
start)``, is carried to the next pool once the piece before it is in a formed
batch. A window's batches all go out before the next pool is formed, so a
document's pieces go out in order and what is held of it is always its tokens
from one point on (what ``held`` says, and what ``merge_states`` deals out
again). When the epoch's data is used up, the pieces still to come are
formed round by round.

While the first epoch's windows ramp up (``ramp``), a window emits only its
best-filled batch and carries the other documents on in stream order, so the
first batch comes after a few dozen documents and only one batch per ramp
window is cut from a small pool (the epoch's padding stays as without the
ramp). The ramp is bounded (two small windows before the default 1,024), so
carried documents wait at most until the first full window.

Deterministic: the output depends only on the data, the options, the seed
and ``batch_rows``. Not thread-safe: one run belongs to one iterator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from arrowstream.io.chunk import Chunk
from arrowstream.pack.assemble import assemble_padded_batch
from arrowstream.pack.lookahead import LookaheadRun
from arrowstream.pack.windows import Doc, DocumentSource, Key, window_size
from arrowstream.pack.store import HeldStore
from arrowstream.state import BucketState, Progress, State

if TYPE_CHECKING:
    from arrowstream.pack.bucket import BucketPacker

__all__ = ["BucketRun"]


#: A held piece of a document: ``(segment, seq)`` from its first token, or ``(segment, seq, start)``.
Ref = tuple[int, ...]


class BucketRun(LookaheadRun):
    """One consumer's run of a :class:`~arrowstream.pack.bucket.BucketPacker`: windows in, batches out, state."""

    def __init__(
        self,
        packer: BucketPacker,
        state: State | None,
        targets: Callable[[int], int | None],
    ) -> None:
        self.p = packer
        self.targets = targets
        self.store = HeldStore(cap=packer.max_len if packer.long_docs == "truncate" else None)
        self.long_limit = packer.max_len
        self.size_windows = self.store.windows  # the same list: a snapshot copies it
        self.carry: list[Ref] = []  # documents (or a split one's next piece) waiting for the next window, in stream order
        self.out: list[list[Ref]] = []  # batches formed, in emission order
        self.ramp = packer.ramp
        if self._start(state, packer.window):
            return
        assert state is not None
        part = BucketState.from_dict(state.packer)
        self._start_counting(part.progress)
        self.emitted = part.progress.epoch_batches
        self.target = part.progress.target if part.progress.target_known else targets(self.counting)
        self.windows, self.flushed, mark = part.window, part.flushed, part.read
        self.ramp = part.ramp  # a state from before the ramp: none, to the end
        self.carry = list(part.carry)
        self.out = [list(batch) for batch in part.out]
        self.src = DocumentSource(
            self.p.window,
            self.ledger,
            epoch=self.epoch,
            mark=(mark[0], mark[1], mark[2]),
            wanted={ref[:2] for ref in self._held_keys()},
        )

    # -- state ----------------------------------------------------------------------

    def _held_keys(self) -> list[Ref]:
        return [*self.carry, *(ref for batch in self.out for ref in batch)]

    def _held_docs(self) -> dict[Key, int]:
        # a split document's pieces go out in order, so what is held of it is its tokens from its earliest held piece on
        first: dict[Key, int] = {}
        for ref in self._held_keys():
            key, start = (ref[0], ref[1]), _start(ref)
            if start < first.get(key, start + 1):
                first[key] = start
        return first

    _shared = ("out", "size_windows")  # a formed batch never changes, nor a sealed window's sizes

    def _copy_rows(self, frozen: Any) -> None:
        frozen.carry = list(self.carry)
        frozen.out = list(self.out)

    def _packer_state(self, progress: Progress, read: tuple[int, int, int]) -> BucketState:
        return BucketState(
            progress, read, self.windows, self.flushed, tuple(self.carry), tuple(map(tuple, self.out)), self.ramp
        )

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
            if self.flushed and self.carry:  # the next pieces of split documents, after the ones before them
                self._form(self.carry, final=True)
                continue
            if self.flushed:  # the epoch's data is used up
                if self._pad_to_target():
                    self.emitted += 1
                    self.ledger.add("padding_batches", 1)
                    return self._assemble([])  # all padding: other consumers still have data
                if not self._next_epoch(chunks):
                    raise StopIteration
                continue
            size = window_size(self.p.window, self.windows, ramp=self.ramp and self.epoch == 0)
            window = self.src.pull(chunks, size, exact=size < self.p.window)
            if window is None:
                self._form(self.carry, final=True)
                self.flushed = True
                continue
            # a small window that ends the epoch is its last: formed whole, as without the ramp
            ramping = size < self.p.window and self.src.more_in_epoch(chunks)
            self._form(self.carry + self._admit(window.keys, window.docs), ramping=ramping)

    def _size(self, ref: Ref) -> int:
        """Tokens a held document (or piece) puts in its row (``max_len`` at most)."""
        return self._pieces([ref])[2][0]

    def _pieces(self, refs: list[Ref]) -> tuple[list[Doc], list[int], list[int]]:
        """Return held pieces' documents, first tokens and sizes (tokens each puts in its row, ``max_len`` at most)."""
        store, cap = self.store, self.p.max_len
        docs = [store[ref] if len(ref) == 2 else store[ref[:2]] for ref in refs]  # a key is its own document's
        starts = [ref[2] if len(ref) > 2 else 0 for ref in refs]
        sizes = [doc.tokens.size - a for doc, a in zip(docs, starts)]
        return docs, starts, sizes if cap is None else [n if n < cap else cap for n in sizes]

    def _admit(self, keys: list[Key], docs: list[Doc]) -> list[Key]:
        """Hold a window's documents, splitting, truncating or dropping long ones; return the held keys.

        A split document enters as its first piece; each next piece is
        carried once the one before is in a formed batch (:meth:`_form`), so
        its pieces go out in order.
        """
        limit = self.p.max_len
        if limit is None or self.p.long_docs != "drop":
            held, kept = keys, docs
        else:
            held, kept = [], []
            for key, doc in zip(keys, docs):
                n = int(doc.tokens.size)
                if n > limit:
                    self.ledger.add("long_docs_dropped", 1)
                    self.ledger.add("long_tokens_dropped", n)
                    continue
                held.append(key)
                kept.append(doc)
        self.store.hold(held, kept)  # split or truncated: counted when its first piece leaves (_count_long)
        return list(held)

    def _form(self, pool: list[Key], *, final: bool = False, ramping: bool = False) -> None:
        """Cut ``pool`` into batches, queue them in a shuffled order, keep the leftovers.

        A ramp-up window (``ramping``) emits only its best-filled batch and
        carries the other documents on to the next, larger pool, where they
        sort among more documents.
        """
        _, _, lengths = self._pieces(pool)
        batches, left = self.p.plan(lengths, final=final)
        if ramping and not final and batches:
            padded = [len(b) * self.p.padded(max(lengths[i] for i in b)) for b in batches]
            filled = [sum(lengths[i] for i in b) / max(1, w) for b, w in zip(batches, padded)]
            best = {min(range(len(batches)), key=lambda k: (-filled[k], k))}
            left = sorted(left + [i for k, b in enumerate(batches) if k not in best for i in b])  # stream order
            batches = [b for k, b in enumerate(batches) if k in best]
        self.carry = [pool[i] for i in left]
        formed = [[pool[i] for i in batch] for batch in batches]
        following = self._following(formed)
        if following:  # in stream order among the leftovers: formed with the next pool
            self.carry = sorted(self.carry + following)
        if (
            final
            and formed
            and not self.carry
            and self.p.drop_last
            and self.target is None
            and not self.p.is_full([self._size(key) for key in formed[-1]])
        ):
            self._drop(formed.pop())
        order = np.random.default_rng([self.p.seed, self.epoch, self.windows]).permutation(len(formed))
        self.windows += 1
        self.out.extend(formed[int(i)] for i in order)

    def _following(self, formed: list[list[Ref]]) -> list[Ref]:
        """The next piece of each split document whose piece is in ``formed`` and has tokens after it."""
        if self.p.long_docs != "split" or self.p.max_len is None:
            return []
        out = []
        for batch in formed:
            for ref in batch:
                end = _start(ref) + self.p.max_len
                if end < self.store[(ref[0], ref[1])].tokens.size:
                    out.append((ref[0], ref[1], end))
        return out

    def _assemble(self, keys: list[Ref]) -> dict[str, Any]:
        docs, starts, sizes = self._pieces(keys)
        parts = [doc.tokens[a : a + n] for doc, a, n in zip(docs, starts, sizes)]
        masks = [doc.mask[a : a + n] for doc, a, n in zip(docs, starts, sizes) if doc.mask is not None]
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
            self.ledger.add("carried_docs", sum(1 for key, doc, a in zip(keys, docs, starts) if doc.skip == 0 and a == 0))
        limit = self.long_limit
        if limit is not None:  # a long document counted as its first piece leaves
            for doc in [doc for doc, a in zip(docs, starts) if a == 0 and doc.tokens.size > limit]:
                self._count_long(doc)
        if self.p.long_docs != "split":  # a truncated document's one piece is its last
            gone = [key if len(key) == 2 else key[:2] for key in keys]
        else:  # its last piece (pieces go out in order)
            gone = [key[:2] for doc, a, n, key in zip(docs, starts, sizes, keys) if a + n >= doc.tokens.size]
        self.store.let_go(gone)
        self.ledger.add("tokens", batch["num_tokens"])
        self.ledger.add("padding_tokens", batch["num_padding_tokens"])
        self.ledger.add("batches", 1)
        return batch

    def _drop(self, refs: list[Ref]) -> None:
        """Count held documents (a split one: from its earliest piece here to its end) that will not be emitted; let them go."""
        first: dict[Key, int] = {}
        for ref in refs:
            key = (ref[0], ref[1])
            first[key] = min(first.get(key, _start(ref)), _start(ref))
        if self.p.long_docs == "split":  # a piece stands for every token after it too
            tokens = sum(int(self.store[key].tokens.size) - a for key, a in first.items())
        else:
            tokens = sum(self._size(ref) for ref in refs)
        self.ledger.add("dropped_tokens", tokens)
        # a document whose head went out elsewhere (a re-dealt skip, or its first pieces) is not a whole one
        self.ledger.add("dropped_docs", sum(1 for key, a in first.items() if self.store[key].skip == 0 and a == 0))
        for key, a in first.items():
            if a == 0:
                self._count_long(self.store[key])
        self.store.let_go(first)

    def _drop_rest(self, chunks: Iterator[Chunk]) -> None:
        """Drop everything held and the rest of the epoch upstream, counted."""
        self._drop(self._held_keys())
        self.carry, self.out = [], []
        docs, tokens = self.src.drain(chunks)
        self.ledger.add("dropped_docs", docs)
        self.ledger.add("dropped_tokens", tokens)
        self.flushed = True


def _start(ref: Ref) -> int:
    """The first token of a held piece within its document's tokens (0: the whole document)."""
    return ref[2] if len(ref) > 2 else 0
