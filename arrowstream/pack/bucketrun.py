"""The run of a bucketing packer: whole documents a window at a time, batched by length, with its state.

:class:`BucketRun` is what :meth:`BucketPacker.start <arrowstream.pack.bucket.BucketPacker.start>`
returns for one consumer: it pulls look-ahead windows
(:mod:`arrowstream.pack.lookahead`), lets the packer cut each window's pool
into batches (:meth:`~arrowstream.pack.bucket.BucketPacker.plan`), queues them
in an order permuted by ``(seed, epoch, window)``, carries the leftovers in
stream order, and assembles each batch once, right-padded. Its state names
held documents by reference (see ``docs/state-format.md``).

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

import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from arrowstream.errors import DataLossWarning
from arrowstream.io.chunk import Chunk
from arrowstream.pack.assemble import assemble_padded_batch
from arrowstream.pack.lookahead import Doc, DocumentSource, Key, LookaheadRun, window_size
from arrowstream.state import BucketState, Progress, State

if TYPE_CHECKING:
    from arrowstream.pack.bucket import BucketPacker

__all__ = ["BucketRun"]


def _warn_truncated(key: Key, n: int, limit: int) -> None:
    """Say that a run truncates documents it was not told to (the first of them: ``key``, ``n`` tokens)."""
    warnings.warn(
        DataLossWarning(
            f"`.bucket` keeps one document per row, so it truncates documents longer than `max_len` "
            f"({limit:,} tokens) to their first {limit:,}: the first, [segment, seq] {list(key)}, has "
            f"{n:,}; stats `long_docs_truncated` and `truncated_tokens` count them all. Pass "
            f"`long_docs=\"truncate\"` to truncate without this warning, `long_docs=\"drop\"` to drop them, "
            "or a larger `max_len`; `.pack(...)` splits long documents across rows instead"
        ),
        stacklevel=2,
    )


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
        self.store: dict[Key, Doc] = {}
        self.carry: list[Key] = []  # documents waiting for the next window, in stream order
        self.out: list[list[Key]] = []  # batches formed, in emission order
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
            wanted=set(self._held_keys()),
        )

    # -- state ----------------------------------------------------------------------

    def _held_keys(self) -> list[Key]:
        return [*self.carry, *(key for batch in self.out for key in batch)]

    def _held_docs(self) -> dict[Key, int]:
        # documents are never cut: a held document's tokens are all still to come
        return dict.fromkeys(self._held_keys(), 0)

    _shared = ("out",)  # a formed batch never changes

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
                if self.p.warn_long and not self.ledger.counts.get("long_docs_truncated"):
                    _warn_truncated(key, n, limit)
                self.ledger.add("long_docs_truncated", 1)
                self.ledger.add("truncated_tokens", n - limit)
            self.store[key] = doc
            held.append(key)
        return held

    def _form(self, pool: list[Key], *, final: bool = False, ramping: bool = False) -> None:
        """Cut ``pool`` into batches, queue them in a shuffled order, keep the leftovers.

        A ramp-up window (``ramping``) emits only its best-filled batch and
        carries the other documents on to the next, larger pool, where they
        sort among more documents.
        """
        lengths = [self._size(key) for key in pool]
        batches, left = self.p.plan(lengths, final=final)
        if ramping and not final and batches:
            padded = [len(b) * self.p.padded(max(lengths[i] for i in b)) for b in batches]
            filled = [sum(lengths[i] for i in b) / max(1, w) for b, w in zip(batches, padded)]
            best = {min(range(len(batches)), key=lambda k: (-filled[k], k))}
            left = sorted(left + [i for k, b in enumerate(batches) if k not in best for i in b])  # stream order
            batches = [b for k, b in enumerate(batches) if k in best]
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
