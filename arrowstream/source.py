"""Reading a stream of an epoch as chunks, from any position.

A stream (see :mod:`arrowstream.order`) is a run of windows; a window is a
few shard pieces whose rows are emitted in natural or shuffled order. Reading
from position ``seq`` reads only the window holding it and the ones after
(with natural order, only the pieces from ``seq`` on). Chunks are cut on a
fixed grid of ``batch_rows`` rows counted from each window's start, so the
chunks after a position are the same whether the stream started there or
earlier.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from arrowstream.chunk import Chunk
from arrowstream.order import Layout, Window
from arrowstream.reader import ShardReader

__all__ = ["iter_stream"]


def iter_stream(
    reader: ShardReader, layout: Layout, stream: int, *, start_seq: int, batch_rows: int
) -> Iterator[Chunk]:
    """Yield ``stream``'s rows from ``start_seq`` on, as chunks of at most ``batch_rows`` rows."""
    windows = layout.windows(stream)
    if not windows:
        return
    for window in windows[layout.find_window(stream, start_seq) :]:
        offset = max(0, start_seq - window.start)
        if offset < window.num_rows:
            yield from _iter_window(reader, window, layout.epoch, offset, batch_rows)


def _iter_window(
    reader: ShardReader, window: Window, epoch: int, offset: int, batch_rows: int
) -> Iterator[Chunk]:
    n = window.num_rows
    if window.order is None:
        # natural order: one piece per window; read it and slice from the offset
        shard, lo = int(window.shards[0]), int(window.row_lo[0])
        batch = _read_piece(reader, shard, lo, int(window.row_hi[0]))
        mixed: tuple[int, ...] = ()
    else:
        # shuffled: every piece is needed, since the window's rows are interleaved
        parts = [
            _read_piece(reader, int(s), int(a), int(b))
            for s, a, b in zip(window.shards, window.row_lo, window.row_hi)
        ]
        batch = pa.concat_batches(parts) if len(parts) > 1 else parts[0]
        shard, lo = int(window.shards[0]), 0
        mixed = tuple(int(s) for s in window.shards)
    a = offset
    while a < n:
        b = min((a // batch_rows + 1) * batch_rows, n)
        if window.order is None:
            rows = batch.slice(a, b - a)
        else:
            rows = batch.take(pa.array(window.order[a:b]))
        yield Chunk(
            epoch=epoch,
            shard=shard,
            seq_start=window.start + a,
            seq_end=window.start + b,
            row_start=lo + a,
            seq=np.arange(window.start + a, window.start + b, dtype=np.int64),
            batch=rows,
            mixed=mixed,
        )
        a = b


def _read_piece(reader: ShardReader, shard: int, lo: int, hi: int) -> pa.RecordBatch:
    table = reader.read(shard).combine_chunks()
    batch = table.to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema=table.schema)
    return batch.slice(lo, hi - lo)
