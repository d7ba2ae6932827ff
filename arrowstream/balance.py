"""Even batches: how many batches every consumer emits in an epoch.

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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow.parquet as pq

from arrowstream.chunk import Chunk
from arrowstream.execute import run_stages
from arrowstream.manifest import Manifest
from arrowstream.order import Layout
from arrowstream.reader import ShardReader
from arrowstream.stage import Stage
from arrowstream.topology import Segment

__all__ = ["EVEN_BATCHES_SLACK", "batch_target", "column_bytes", "measure_token_rate"]

#: Fraction taken off the smallest share's estimate, so a slightly optimistic
#: estimate drops a little data rather than padding many batches.
EVEN_BATCHES_SLACK = 0.01

_SAMPLE_ROWS = 1024
_SAMPLE_SHARDS = 8


def column_bytes(manifest: Manifest, columns: Sequence[str]) -> np.ndarray:
    """Return, per shard, the uncompressed bytes of ``columns`` (footers read again, in threads)."""
    wanted = set(columns)

    def per_file(path: str) -> list[int]:
        with manifest.filesystem.open_input_file(path) as handle:
            meta = pq.ParquetFile(handle).metadata
        out = []
        for i in range(meta.num_row_groups):
            rg = meta.row_group(i)
            out.append(
                sum(
                    rg.column(j).total_uncompressed_size
                    for j in range(rg.num_columns)
                    if rg.column(j).path_in_schema.split(".")[0] in wanted
                )
            )
        return out

    with ThreadPoolExecutor(max_workers=min(16, manifest.num_files)) as pool:
        sizes = list(pool.map(per_file, manifest.paths))
    return np.array(
        [sizes[int(f)][int(rg)] for f, rg in zip(manifest.shard_file, manifest.shard_row_group)],
        dtype=np.float64,
    )


def measure_token_rate(
    manifest: Manifest,
    columns: Sequence[str],
    shards: np.ndarray,
    stages: Sequence[Stage],
    where: Callable[[Chunk], str],
    shard_bytes: np.ndarray,
) -> float:
    """Return tokens made by ``stages`` per Parquet byte, on the first rows of ``shards``.

    Reads up to 1,024 rows of one row group, or of up to 8 while no token shows up.
    """
    reader = ShardReader(manifest, columns)
    tokens, nbytes = 0, 0.0
    try:
        for shard in shards[:_SAMPLE_SHARDS].tolist():
            total = int(manifest.shard_rows[shard])
            rows = min(_SAMPLE_ROWS, total)
            batch = reader.read(shard).slice(0, rows).combine_chunks().to_batches()[0]
            chunk = Chunk(
                epoch=0, shard=shard, seq_start=0, seq_end=rows, row_start=0,
                seq=np.arange(rows, dtype=np.int64), batch=batch,
            )
            outs = run_stages(stages, [chunk], where=where, pool=None, in_flight=1)
            tokens += sum(int(out.tokens.size) for out in outs if out.tokens is not None)
            nbytes += rows / total * float(shard_bytes[shard])
            if tokens:
                break
    finally:
        reader.close()
    return tokens / nbytes if nbytes else 0.0


def batch_target(
    layout: Layout,
    shard_rows: np.ndarray,
    shard_bytes: np.ndarray,
    token_rate: float,
    parts: Sequence[Sequence[Segment]],
    tokens_per_batch: int,
) -> int:
    """Return the batches every consumer emits, given every consumer's ``parts`` of ``layout``.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.order import Layout
    >>> rows, sizes = np.array([10, 10]), np.array([1000.0, 1000.0])  # 2 row groups
    >>> lay = Layout(np.arange(2), rows, epoch=0, seed=None, window=1, num_streams=2)
    >>> batch_target(lay, rows, sizes, 0.5, [[(0, 0, 10, 0)], [(1, 0, 10, 0)]], tokens_per_batch=100)
    4
    """
    row_bytes = shard_bytes / np.maximum(shard_rows, 1)
    estimates = [
        token_rate * sum(layout.segment_bytes(s, a, b, row_bytes) for s, a, b, _ in part)
        for part in parts
    ]
    return int(min(estimates, default=0.0) * (1.0 - EVEN_BATCHES_SLACK) // tokens_per_batch)
