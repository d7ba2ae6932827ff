"""The epoch's row order and reading it as chunks from any position.

Every row of every shard in an epoch has a sequence number ``seq`` in the
epoch's order: shard after shard in the epoch plan, rows in file order. A
position is ``(epoch, seq)``; :func:`iter_chunks` starts reading exactly there,
reading only the row group that holds ``seq`` and the ones after it. Chunks are
cut on a fixed grid of ``batch_rows`` rows inside each row group, so the chunks
after a position are the same whether the stream started there or earlier.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from arrowstream.chunk import Chunk
from arrowstream.manifest import Manifest
from arrowstream.reader import ShardReader

__all__ = ["EpochPlan", "iter_chunks"]


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """The shards of one epoch in reading order, with cumulative row counts.

    Examples
    --------
    >>> import numpy as np
    >>> plan = EpochPlan(np.array([3, 1]), np.array([0, 10, 15]))
    >>> plan.num_rows, plan.locate(12)
    (15, (1, 2))
    """

    shards: np.ndarray
    cum_rows: np.ndarray

    @classmethod
    def from_manifest(cls, manifest: Manifest, shards: np.ndarray) -> EpochPlan:
        """Plan reading ``shards`` (manifest indices) in the given order."""
        cum = np.zeros(shards.size + 1, dtype=np.int64)
        np.cumsum(manifest.shard_rows[shards], out=cum[1:])
        return cls(shards.astype(np.int64), cum)

    @property
    def num_rows(self) -> int:
        """Rows in the epoch."""
        return int(self.cum_rows[-1])

    def locate(self, seq: int) -> tuple[int, int]:
        """Return (index into :attr:`shards`, row inside that shard) of ``seq``."""
        k = int(np.searchsorted(self.cum_rows, seq, side="right")) - 1
        return k, int(seq - self.cum_rows[k])


def iter_chunks(
    reader: ShardReader, plan: EpochPlan, *, epoch: int, start_seq: int, batch_rows: int
) -> Iterator[Chunk]:
    """Yield the epoch's rows from ``start_seq`` on, as chunks of at most ``batch_rows`` rows."""
    if start_seq >= plan.num_rows:
        return
    k, row = plan.locate(start_seq)
    for i in range(k, plan.shards.size):
        shard = int(plan.shards[i])
        table = reader.read(shard).combine_chunks()
        batch = table.to_batches()[0] if table.num_rows else None
        n = table.num_rows
        base = int(plan.cum_rows[i])
        a = row if i == k else 0
        while a < n:
            b = min((a // batch_rows + 1) * batch_rows, n)
            yield Chunk(
                epoch=epoch,
                shard=shard,
                seq_start=base + a,
                seq_end=base + b,
                row_start=a,
                seq=np.arange(base + a, base + b, dtype=np.int64),
                batch=batch.slice(a, b - a),
            )
            a = b
