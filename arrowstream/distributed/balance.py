"""Even batches, estimated: how many batches every consumer emits in an epoch.

When the pipeline can tell every consumer's tokens before the epoch (token
ids and ``concat``), the number is counted instead (see
:mod:`arrowstream.distributed.tokens`); this module estimates it otherwise.

With several consumers (ranks x DataLoader workers) and finite epochs, DDP
hangs at an epoch end if one rank runs out of batches before the others.
Consumers get equal *rows*, not equal *tokens*, so their natural batch counts
differ a little. Every consumer therefore emits the same number of batches,
computed identically everywhere from information all of them share:

    estimate(part) = token_rate * Parquet bytes of the part's rows
    target = floor(min over parts of estimate * (1 - slack) / (seq_len * batch_size))

``token_rate`` is measured on a fixed sample (the first rows of the first row
groups, run through the pipeline's stages); Parquet bytes are the uncompressed
sizes of the columns the pipeline reads, from the footers (columns it does not
read do not count, however large). The packer drops and counts what a consumer has
beyond the target and pads with all-padding batches when it runs short.

Length bucketing (:mod:`arrowstream.pack.bucket`) emits batches of varying tokens, so
it divides by what a batch consumes instead, simulated on the same sample's
document lengths: with ``max_tokens``, the tokens read per batch (the estimate
above); with ``batch_size``, the documents read per batch, against the part's
rows (exact from the footers) times the sample's documents per row
(:func:`doc_target`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from arrowstream.core.execute import run_stages
from arrowstream.core.stage import Stage
from arrowstream.distributed.topology import RowRange
from arrowstream.io.chunk import Chunk
from arrowstream.io.layout import Layout
from arrowstream.io.manifest import Manifest
from arrowstream.io.reader import ShardReader

__all__ = [
    "EVEN_BATCHES_SLACK",
    "Sample",
    "batch_target",
    "doc_target",
    "measure_sample",
]

#: Fraction taken off the smallest share's estimate, so a slightly optimistic
#: estimate drops a little data rather than padding many batches.
EVEN_BATCHES_SLACK = 0.01

_SAMPLE_ROWS = 1024
_SAMPLE_SHARDS = 8


@dataclass(frozen=True, slots=True)
class Sample:
    """What the pipeline's stages make of a fixed sample of rows."""

    rows: int  # rows read
    nbytes: float  # their share of the Parquet bytes of the columns read
    num_tokens: int  # tokens made
    lengths: np.ndarray  # tokens per document kept

    @property
    def token_rate(self) -> float:
        """Tokens per Parquet byte."""
        return self.num_tokens / self.nbytes if self.nbytes else 0.0

    @property
    def docs_per_row(self) -> float:
        """Documents kept per row read (filters, null and empty rows leave fewer)."""
        return self.lengths.size / self.rows if self.rows else 0.0


def measure_sample(
    manifest: Manifest,
    columns: Sequence[str],
    shards: np.ndarray,
    stages: Sequence[Stage],
    where: Callable[[Chunk], str],
    shard_bytes: np.ndarray,
) -> Sample:
    """Run the first rows of ``shards`` through ``stages``; return the rows, bytes and lengths.

    Reads up to 1,024 rows of one row group, or of up to 8 while no token shows up.
    """
    reader = ShardReader(manifest, columns)
    rows_read, tokens, nbytes = 0, 0, 0.0
    lengths: list[np.ndarray] = []
    try:
        for shard in shards[:_SAMPLE_SHARDS].tolist():
            total = int(manifest.shard_rows[shard])
            rows = min(_SAMPLE_ROWS, total)
            batch = reader.read(shard).slice(0, rows).combine_chunks().to_batches()[0]
            chunk = Chunk(
                epoch=0, shard=shard, seq_start=0, seq_end=rows, row_start=0,
                seq=np.arange(rows, dtype=np.int64), batch=batch,
            )
            outs = list(run_stages(stages, [chunk], where=where, pool=None, in_flight=1))
            tokens += sum(int(out.tokens.size) for out in outs if out.tokens is not None)
            lengths += [np.diff(out.offsets) for out in outs if out.offsets is not None]
            rows_read += rows
            nbytes += rows / total * float(shard_bytes[shard])
            if tokens:
                break
    finally:
        reader.close()
    sizes = np.concatenate(lengths or [np.empty(0, np.int64)]).astype(np.int64)
    return Sample(rows_read, nbytes, tokens, sizes)


def batch_target(
    layout: Layout,
    shard_rows: np.ndarray,
    shard_bytes: np.ndarray,
    token_rate: float,
    parts: Sequence[Sequence[RowRange]],
    tokens_per_batch: float,
) -> int:
    """Return the batches every consumer emits, given every consumer's ``parts`` of ``layout``.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.io.layout import Layout
    >>> rows, sizes = np.array([10, 10]), np.array([1000.0, 1000.0])  # 2 row groups
    >>> lay = Layout(np.arange(2), rows, epoch=0, seed=None, window=1, num_streams=2)
    >>> batch_target(lay, rows, sizes, 0.5, [[(0, 0, 10, 0)], [(1, 0, 10, 0)]], tokens_per_batch=100)
    4
    """
    row_bytes = shard_bytes / np.maximum(shard_rows, 1)
    estimates = [
        token_rate * sum(layout.range_bytes(s, a, b, row_bytes) for s, a, b, _ in part)
        for part in parts
    ]
    return int(min(estimates, default=0.0) * (1.0 - EVEN_BATCHES_SLACK) // tokens_per_batch)


def doc_target(parts: Sequence[Sequence[RowRange]], docs_per_row: float, docs_per_batch: float) -> int:
    """Return the batches every consumer emits when a batch takes a fixed number of documents.

    A part's rows are exact (segment bounds); ``docs_per_row`` (from the
    sample) scales them to documents.

    Examples
    --------
    >>> doc_target([[(0, 0, 100, 0)], [(1, 0, 90, 0), (2, 5, 15, 0)]], 1.0, 8.0)
    12
    """
    rows = [sum(end - start for _, start, end, _ in part) for part in parts]
    return int(min(rows, default=0) * docs_per_row * (1.0 - EVEN_BATCHES_SLACK) // docs_per_batch)
