"""Reading a stream of an epoch as chunks, from any position.

A stream (see :mod:`arrowstream.io.layout`) is a run of windows; a window is a
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

from arrowstream.io.arrays import from_numpy
from arrowstream.io.chunk import Chunk
from arrowstream.io.layout import Layout, ShuffleWindow
from arrowstream.io.reader import ShardReader, innermost

__all__ = ["iter_stream"]

#: Windows whose shards a read-ahead reader is told about (it reads as many as its depth).
_HINT_WINDOWS = 8


def iter_stream(
    reader: ShardReader,
    layout: Layout,
    stream: int,
    *,
    start_seq: int,
    end_seq: int | None = None,
    batch_rows: int,
    segment: int = 0,
) -> Iterator[Chunk]:
    """Yield ``stream``'s rows ``start_seq..end_seq-1`` as chunks of at most ``batch_rows`` rows.

    Chunks carry ``segment`` so positions name the consumer's segment.
    """
    windows = layout.windows(stream)
    end = layout.stream_rows(stream) if end_seq is None else end_seq
    if not windows or start_seq >= end:
        return
    first = layout.find_window(stream, start_seq)
    hint = getattr(reader, "hint", None)  # a reader that reads ahead: tell it what comes next
    for k, window in enumerate(windows[first:], start=first):
        if window.start >= end:
            return
        if hint is not None:
            hint(int(s) for w in windows[k : k + _HINT_WINDOWS] if w.start < end for s in w.shards)
        offset = max(0, start_seq - window.start)
        stop = min(window.num_rows, end - window.start)
        if offset < stop:
            yield from _iter_window(reader, window, layout.epoch, offset, stop, batch_rows, segment)


def _iter_window(
    reader: ShardReader,
    window: ShuffleWindow,
    epoch: int,
    offset: int,
    n: int,
    batch_rows: int,
    segment: int,
) -> Iterator[Chunk]:
    unreadable = _unreadable(reader)
    if window.order is None:
        # natural order: one piece per window; read it and slice from the offset
        shard, lo = int(window.shards[0]), int(window.row_lo[0])
        batch = _read_piece(reader, shard, lo, int(window.row_hi[0]))
        mixed: tuple[int, ...] = ()
        skipped = np.zeros(batch.num_rows, dtype=bool) | (shard in unreadable)
    else:
        # shuffled: every piece is needed, since the window's rows are interleaved
        parts = [
            _read_piece(reader, int(s), int(a), int(b))
            for s, a, b in zip(window.shards, window.row_lo, window.row_hi)
        ]
        batch = pa.concat_batches(parts) if len(parts) > 1 else parts[0]
        shard, lo = int(window.shards[0]), 0
        mixed = tuple(int(s) for s in window.shards)
        bad = np.array([int(s) in unreadable for s in window.shards])
        skipped = np.repeat(bad, [p.num_rows for p in parts])[window.order]
    a = offset
    while a < n:
        b = min((a // batch_rows + 1) * batch_rows, n)
        if window.order is None:
            rows = batch.slice(a, b - a)
        else:
            rows = batch.take(from_numpy(window.order[a:b]))
        chunk = Chunk(
            epoch=epoch,
            shard=shard,
            seq_start=window.start + a,
            seq_end=window.start + b,
            row_start=lo + a,
            seq=np.arange(window.start + a, window.start + b, dtype=np.int64),
            batch=rows,
            mixed=mixed,
            segment=segment,
        )
        # rows of a row group skipped as unreadable (on_error="skip"): counted, never emitted
        yield chunk.with_rows(~skipped[a:b], "unreadable") if unreadable else chunk
        a = b


def _read_piece(reader: ShardReader, shard: int, lo: int, hi: int) -> pa.RecordBatch:
    # shards are non-empty row groups (the manifest leaves empty ones out)
    return reader.read(shard).combine_chunks().to_batches()[0].slice(lo, hi - lo)


def _unreadable(reader: ShardReader) -> dict[int, str]:
    """Return the shards the innermost reader skipped as unreadable (a stage may wrap it)."""
    return getattr(innermost(reader, "unreadable"), "unreadable", {})
