"""The small core every row stage implements.

A stage maps one :class:`~arrowstream.chunk.Chunk` to zero or more chunks that
together cover the same sequence range, so positions stay exact. Stages are
immutable descriptions: :meth:`Stage.spec` gives the JSON-able options that
enter the pipeline's options hash, :meth:`Stage.check` validates them against
the dataset schema when the pipeline is built (before any data is read).
Stages hold no per-iterator state, so a resume needs nothing from them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from arrowstream.chunk import Chunk
from arrowstream.manifest import Manifest

__all__ = ["Stage"]


class Stage(ABC):
    """A row stage: filter, tokenize, and the like."""

    #: Short name used in options and errors.
    name: str = "stage"

    @abstractmethod
    def spec(self) -> dict[str, Any]:
        """Return the JSON-able options that define this stage's output."""

    def columns(self) -> set[str] | None:
        """Return the columns this stage reads, or ``None`` if it may read any column."""
        return set()

    def check(self, manifest: Manifest, schema: pa.Schema) -> pa.Schema:
        """Validate against the incoming schema; return the outgoing schema."""
        return schema

    @abstractmethod
    def apply(self, chunk: Chunk) -> Iterable[Chunk]:
        """Transform one chunk into chunks covering the same sequence range."""
