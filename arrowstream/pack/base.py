"""Packing: from a stream of tokenized chunks to fixed-shape batches.

A :class:`Packer` is an immutable description; :meth:`Packer.start` gives a
:class:`PackRun` that holds the per-iterator state. A run tells the pipeline
where upstream reading must start (:meth:`PackRun.upstream_position`) and
describes its state as references (positions), never as held tokens, so a
checkpoint stays small and a resume re-reads only what the state points at.

The strategies: :mod:`~arrowstream.pack.concat`, :mod:`~arrowstream.pack.bestfit`
and :mod:`~arrowstream.pack.bucket`.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from arrowstream.checks import check_int
from arrowstream.errors import ConfigError, DataLossWarning, warn_user
from arrowstream.io.chunk import Chunk, Ledger
from arrowstream.pack.assemble import BATCH_KEYS
from arrowstream.state import Position
from arrowstream.state.snapshot import Snapshot, Taken

__all__ = ["EVEN_BATCHES", "PackRun", "Packer", "check_even_batches", "drop_at_target"]


def drop_at_target(ledger: Ledger, epoch: int, drop: Callable[[], None]) -> None:
    """Run ``drop`` (which drops and counts what is left of ``epoch`` at the batch target); warn if it dropped.

    The target was estimated (a counted one leaves nothing beyond it), and
    the data could not be carried into a next epoch's count (the last epoch,
    or ``even_batches="drop"``): the warning names what was lost and how to
    lose nothing.
    """
    docs, tokens = ledger.counts.get("dropped_docs", 0), ledger.counts.get("dropped_tokens", 0)
    drop()
    docs = ledger.counts.get("dropped_docs", 0) - docs
    tokens = ledger.counts.get("dropped_tokens", 0) - tokens
    if docs or tokens:
        warn_user(
            DataLossWarning(
                f"this consumer reached its estimated batch count for epoch {epoch} with data left "
                "that it cannot carry into a later epoch (the last epoch, or even_batches='drop'): "
                f"{tokens:,} token(s) dropped ({docs:,} whole document(s); other tokens dropped are the ends of "
                "documents whose beginning was emitted, cut short), counted in stats "
                "`dropped_docs`/`dropped_tokens`. To drop nothing, let batch counts be counted "
                "(token ids, a length index from `arrowstream index`, or a complete read-only "
                "token cache, and no filter; `ds.balance` says which applies), or pass "
                "even_batches=False"
            ),
        )


#: The values of ``even_batches``.
EVEN_BATCHES = (True, "drop", False)


def check_even_batches(value: object) -> bool | str:
    """Return ``value`` if it is one of :data:`EVEN_BATCHES`, else raise ``ConfigError``.

    Examples
    --------
    >>> check_even_batches("drop")
    'drop'
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if value == "drop":
        return "drop"
    raise ConfigError(
        f"`even_batches` must be True (carry what an estimate leaves over into the next epoch), "
        f"'drop' (drop it every epoch) or False (unequal counts), got {value!r}"
    )


class PackRun(ABC):
    """The stateful side of a packer inside one iterator."""

    @abstractmethod
    def upstream_position(self) -> Position:
        """Return where upstream reading must start (tokens of that document to skip included)."""

    @abstractmethod
    def next_batch(self, chunks: Iterator[Chunk]) -> dict[str, np.ndarray]:
        """Return the next batch, pulling chunks as needed; raise ``StopIteration`` at the end."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Return ``{"position": {...}, "stats": {...}, "packer": {...}}``, JSON-able."""

    def snapshot(self) -> Snapshot:
        """Capture :meth:`state_dict` now; built at once unless the run defers it (look-ahead runs do)."""
        return Taken(self.state_dict())


class Packer(ABC):
    """Description of a packing strategy.

    Parameters
    ----------
    seq_len
        Tokens per row.
    batch_size
        Rows per batch.
    drop_last
        Drop (and count) the last incomplete batch of an epoch instead of padding it.
    pad_id
        Token id on padding.
    even_batches
        With several consumers and finite epochs, emit the same number of
        batches per epoch on every rank (see :meth:`Dataset.pack
        <arrowstream.Dataset.pack>`). ``True``: where the number is estimated,
        a consumer's data beyond it is carried into the next epoch's count
        (dropped, counted and warned about only in the last epoch);
        ``"drop"``: it is dropped in every epoch; ``False``: counts are left
        unequal.
    """

    name = "packer"
    #: The arrays and counts of every batch (see :mod:`arrowstream.pack.assemble`).
    batch_keys: tuple[str, ...] = BATCH_KEYS
    #: The counters the packer adds to ``stats``, in every state from the first.
    counters: tuple[str, ...] = (
        "tokens", "padding_tokens", "batches", "padding_batches", "dropped_docs", "dropped_tokens",
        "carried_docs", "carried_tokens",
    )

    def __init__(
        self,
        *,
        seq_len: int,
        batch_size: int,
        drop_last: bool = False,
        pad_id: int = 0,
        even_batches: bool | str = True,
    ) -> None:
        check_int("seq_len", seq_len)
        check_int("batch_size", batch_size)
        if (
            isinstance(pad_id, bool)
            or not isinstance(pad_id, (int, np.integer))
            or not 0 <= pad_id <= np.iinfo(np.int32).max
        ):
            raise ConfigError(f"`pad_id` must be an int in [0, 2**31), got {pad_id!r}")
        self.seq_len = int(seq_len)
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.pad_id = int(pad_id)
        self.even_batches = check_even_batches(even_batches)

    def per_batch(self, lengths: np.ndarray, *, num_docs: float, docs_per_read: float = 1.0) -> tuple[float | None, float]:
        """Return the documents per batch, when batches are counted in documents (else ``None``), and the tokens read per batch.

        Used for even batches, from a sample's document ``lengths``: here every
        batch holds ``seq_len * batch_size`` tokens, whatever the documents.
        """
        return None, float(self.seq_len * self.batch_size)

    @property
    def carries(self) -> bool:
        """Whether data beyond an estimated target is carried into the next epoch (``even_batches=True``)."""
        return self.even_batches is True

    @property
    def counts_documents(self) -> bool:
        """Whether a batch takes a fixed number of documents (then shares of equal rows keep counts even)."""
        return False

    def exact_batches(self, num_tokens: int) -> int | None:
        """Return the batches this packer makes of ``num_tokens`` tokens, or ``None`` if tokens do not tell.

        Known before an epoch (see :meth:`~arrowstream.core.stage.Stage.known_tokens`),
        it gives every consumer its exact batch count; ``None`` (the default)
        leaves the count to a run of the packer over the documents' lengths
        (:meth:`count_batches`), or to an estimate when lengths are unknown.
        """
        return None

    def count_batches(self, chunks: Iterator[Chunk]) -> int:
        """Return the batches this packer makes of one epoch's ``chunks``, as a run with a target would.

        Where :meth:`exact_batches` cannot tell (the packing decides the
        count), the even-batches target runs the packer itself over stand-in
        chunks of the known lengths: the decisions are the pipeline's, so the
        count is exact. The last partial batch counts whatever ``drop_last``
        says, since a run with a target pads it.

        Examples
        --------
        >>> import numpy as np
        >>> from arrowstream.io.chunk import Chunk
        >>> from arrowstream.pack import ConcatPacker
        >>> chunk = Chunk(epoch=0, shard=0, seq_start=0, seq_end=3, row_start=0, seq=np.arange(3),
        ...               tokens=np.zeros(9, np.int32), offsets=np.array([0, 2, 5, 9]))
        >>> ConcatPacker(seq_len=4, batch_size=2, drop_last=True).count_batches(iter([chunk]))
        2
        """
        packer = self
        if self.drop_last:
            packer = copy.copy(self)
            packer.drop_last = False
        run = packer.start(None)
        count = 0
        while True:
            try:
                run.next_batch(chunks)
            except StopIteration:
                return count
            count += 1

    def spec(self) -> dict[str, Any]:
        """Return the JSON-able options that define the packer's output."""
        return {
            "strategy": self.name,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "pad_id": self.pad_id,
            "even_batches": self.even_batches,
        }

    @abstractmethod
    def start(
        self,
        state: dict[str, Any] | None,
        *,
        targets: Callable[[int], int | None] | None = None,
        origin: Position | None = None,
    ) -> PackRun:
        """Return a run starting fresh (``None``) or from a saved state.

        ``targets(epoch)`` gives the number of batches to emit in ``epoch`` (the
        same for every consumer, so no rank waits for another), or ``None`` for
        as many as the data gives; for an epoch past the last it must be ``None``.
        ``origin`` is where a fresh run's share starts when that is not its
        first row's first token (``concat`` over shares of whole batches,
        which may begin inside a document); a fresh run's state says it until
        the first chunk is read.
        """
