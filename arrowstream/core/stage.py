"""The small core every row stage implements.

A stage maps one :class:`~arrowstream.io.chunk.Chunk` to zero or more chunks that
together cover the same sequence range, so positions stay exact. It does so in
two steps: :meth:`Stage.split` cuts a chunk into pieces (cheap, in order) and
:meth:`Stage.run` does the work on one piece; an ``expensive`` stage's pieces
run concurrently in the iterator's thread pool (see :mod:`arrowstream.core.execute`),
so ``run`` must not depend on other pieces. Stages are
immutable descriptions: :meth:`Stage.spec` gives the JSON-able options that
enter the pipeline's options hash, :meth:`Stage.check` validates them against
the dataset schema when the pipeline is built (before any data is read).
Stages hold no per-iterator state, so a resume needs nothing from them.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from arrowstream.errors import DataLossWarning, ShardError, warn_user
from arrowstream.io.chunk import Chunk
from arrowstream.io.failures import skippable
from arrowstream.io.manifest import Manifest
from arrowstream.io.reader import Reader, ShardReader

__all__ = ["KnownTokens", "Stage"]


@dataclass(frozen=True)
class KnownTokens:
    """How a stage tells, before an epoch, the tokens each row will give the packer.

    Attributes
    ----------
    lengths
        Reads a shard's tokens per row (0 for a row the stage drops).
    per_shard
        Tokens per shard as footers tell them (no read), or ``None``.
    source
        Where the counts come from, for people (``"token ids"``).
    rows_from
        Where rows' lengths come from when they differ from ``source``, for
        people (``", from a length index where there is one, else read"``).
    """

    lengths: Callable[[int], np.ndarray]
    per_shard: np.ndarray | None = None
    source: str = "token ids"
    rows_from: str = ""

    def skipping_unreadable(self, manifest: Manifest) -> KnownTokens:
        """These counts, with no token for each row of a row group whose bytes do not decode (``on_error="skip"``).

        A refusal, a timeout or a changed file still raises, naming the row
        group. A skipped row group is said (a ``DataLossWarning``) here too:
        a share may then hold no token of it, and so no read of it either.
        """
        lengths, warned = self.lengths, set()

        def read(shard: int) -> np.ndarray:
            try:
                return lengths(shard)
            except ShardError as exc:
                if exc.__cause__ is None or not skippable(exc.__cause__):
                    raise
                if shard not in warned:
                    warned.add(shard)
                    info = manifest.shard(shard)
                    warn_user(
                        f"counting tokens skipped the unreadable row group {info.row_group} of {info.path!r} "
                        f"({info.num_rows:,} rows: no token), as on_error='skip' asks: {exc.__cause__}",
                        DataLossWarning,
                    )
                return np.zeros(int(manifest.shard_rows[shard]), dtype=np.int64)

        return dataclasses.replace(self, lengths=read)


class Stage(ABC):
    """A row stage: filter, tokenize, and the like."""

    #: Short name used in options and errors.
    name: str = "stage"
    #: Whether pieces are worth running concurrently (the tokenizer is).
    expensive: bool = False
    #: How many pieces of this stage may run at once when ``expensive``.
    num_inflight: int = 1
    #: The counters this stage adds to ``stats`` (its skip reasons), in every state from the first.
    counters: tuple[str, ...] = ()
    #: Whether the stage reads token ids rather than making them (then reading is the work,
    #: and prefetching in a background thread pays).
    reads_token_ids: bool = False
    #: Whether the stage keeps every row it is given, unchanged in tokens (then the tokens a
    #: pipeline emits can be known before an epoch; see :meth:`known_tokens`).
    keeps_rows: bool = False

    @abstractmethod
    def spec(self) -> dict[str, Any]:
        """Return the JSON-able options that define this stage's output."""

    def columns(self) -> set[str] | None:
        """Return the columns this stage reads, or ``None`` if it may read any column."""
        return set()

    def check(self, manifest: Manifest, schema: pa.Schema) -> pa.Schema:
        """Validate against the incoming schema; return the outgoing schema."""
        return schema

    def prune(self, manifest: Manifest) -> np.ndarray | None:
        """Return a mask over ``manifest``'s shards, false where this stage provably keeps no row.

        ``None`` (the default): the stage cannot tell, every shard is read.
        """
        return None

    def known_tokens(self, manifest: Manifest) -> KnownTokens | None:
        """Return how this stage tells each row's tokens before an epoch, or ``None`` (the default).

        The tokenize stage over a column of token ids can: a row's tokens are
        its ids (plus EOS). With such a stage, and every other stage keeping
        its rows (:attr:`keeps_rows`), a packer that counts its batches from
        tokens (:meth:`~arrowstream.pack.base.Packer.exact_batches`) gives
        every consumer the exact number of batches to emit.
        """
        return None

    def wrap_reader(self, reader: ShardReader, *, keep_text: bool) -> Reader:
        """Return the reader this stage's input comes through: ``reader`` itself (the default) or a wrapper.

        The tokenize stage with a token cache wraps it to bring each row
        group's cached ids along. ``keep_text``: another stage, or the output,
        still needs the columns this stage reads.
        """
        return reader

    def split(self, chunk: Chunk, *, warm: int = 0) -> Iterable[Chunk]:
        """Cut ``chunk`` into pieces that :meth:`run` handles one at a time.

        ``warm`` counts the pieces this stage already cut in the current stream
        (it restarts at 0 after a start or resume).
        """
        return [chunk]

    @abstractmethod
    def run(self, piece: Chunk) -> Chunk:
        """Transform one piece into a chunk covering the same sequence range."""

    def apply(self, chunk: Chunk) -> Iterable[Chunk]:
        """Split and run ``chunk`` in order, in this thread."""
        return (self.run(piece) for piece in self.split(chunk))
