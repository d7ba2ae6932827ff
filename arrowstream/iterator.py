"""The stateful side of a pipeline: iteration, ``state_dict`` and ``load_state_dict``.

A :class:`DatasetIterator` rebuilds everything it buffers from its position,
so a fresh start and a resume run the same code (``_reset(state | None)``).
Its state is coordinates only (see :mod:`arrowstream.state`); loading one
reads just the row group the position points at and the ones after it.

Not thread-safe: one iterator belongs to one consumer.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from arrowstream.chunk import Chunk, Ledger
from arrowstream.errors import StateError
from arrowstream.pack import PackRun
from arrowstream.prefetch import Prefetcher
from arrowstream.reader import ShardReader
from arrowstream.state import STATE_FORMAT, STATE_VERSION, Position, check_state

if TYPE_CHECKING:
    from arrowstream.dataset import Dataset

__all__ = ["DatasetIterator"]


class DatasetIterator:
    """Iterate a :class:`~arrowstream.dataset.Dataset` with checkpointable state.

    Parameters
    ----------
    dataset
        The pipeline description.
    state
        A state from :meth:`state_dict` to resume from, or ``None``.

    Examples
    --------
    >>> import json, tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> from arrowstream import read_parquet
    >>> d = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"n": list(range(6))}), f"{d}/a.parquet", row_group_size=2)
    >>> ds = read_parquet(d)
    >>> it = ds.iter()
    >>> first = next(it)
    >>> saved = json.loads(json.dumps(it.state_dict()))
    >>> rest = [b.column("n").to_pylist() for b in it]
    >>> [b.column("n").to_pylist() for b in ds.iter(saved)] == rest
    True
    """

    def __init__(self, dataset: Dataset, state: dict[str, Any] | None = None) -> None:
        self.dataset = dataset
        self._reader = ShardReader(dataset.manifest, dataset.read_columns())
        self._chunks: Prefetcher[Chunk] | _Inline | None = None
        self._pool: ThreadPoolExecutor | None = None
        if dataset.num_inflight > 1:
            self._pool = ThreadPoolExecutor(dataset.num_inflight, thread_name_prefix="arrowstream-encode")
            weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        self._reset(state)

    # -- state --------------------------------------------------------------------

    def _reset(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            check_state(
                state,
                dataset=self.dataset.manifest.describe(),
                options=self.dataset.options(),
                options_hash=self.dataset.options_hash,
            )
            self._check_position(state["position"])
        if self._chunks is not None:
            self._chunks.close()
        self._run: PackRun | None = None
        if self.dataset.packer is not None:
            self._run = self.dataset.packer.start(state)
            start = self._run.upstream_position()
        elif state is None:
            start = Position(0, 0, 0)
        else:
            pos = state["position"]
            if pos["token_offset"]:
                raise StateError(
                    f"state position has token_offset {pos['token_offset']}, but an unpacked "
                    "pipeline only stops between documents: the state was edited or comes from "
                    "a packed pipeline"
                )
            start = Position(int(pos["epoch"]), int(pos["seq"]), 0)
        self._pos = start
        self._ledger = Ledger(None if state is None else state["stats"])
        produce = functools.partial(self.dataset.iter_chunks, self._reader, start, self._pool)
        if self.dataset.prefetch > 0:
            self._chunks = Prefetcher(produce, depth=self.dataset.prefetch)
        else:
            self._chunks = _Inline(produce())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (as returned by :meth:`state_dict`, possibly via JSON).

        Raises
        ------
        StateMismatchError
            The state comes from other data or other pipeline options.
        StateError
            The state is malformed or of another format version.
        """
        self._reset(state)

    def state_dict(self) -> dict[str, Any]:
        """Return the position after the last item yielded, as a small JSON-able dict."""
        if self._run is not None:
            inner = self._run.state_dict()
            pos = inner["position"]
            position = Position(pos["epoch"], pos["seq"], pos["token_offset"])
            stats, extra = inner["stats"], inner.get("packer", {})
        else:
            position, stats, extra = self._pos, self._ledger.snapshot(), {}
        pruned = self.dataset.num_pruned_rows
        if pruned:  # derived, so it is exact at any position: epochs begun times rows pruned
            stats["pruned_rows"] = pruned * (position.epoch + 1)
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "dataset": self.dataset.manifest.describe(),
            "options_hash": self.dataset.options_hash,
            "options": self.dataset.options(),
            "position": {
                "epoch": position.epoch,
                "seq": position.seq,
                "token_offset": position.token_offset,
                **self._where(position),
            },
            "stats": stats,
            "packer": extra,
        }

    @property
    def stats(self) -> dict[str, int]:
        """Counters up to the current position: rows, docs, skips by reason, tokens, padding."""
        return self.state_dict()["stats"]

    def _where(self, pos: Position) -> dict[str, Any]:
        layout = self.dataset.layout(pos.epoch)
        if pos.seq >= layout.stream_rows(0):
            return {"file": None, "row_group": None, "row": None}
        shard, row = layout.locate(0, pos.seq)
        manifest = self.dataset.manifest
        return {
            "file": manifest.relpaths[int(manifest.shard_file[shard])],
            "row_group": int(manifest.shard_row_group[shard]),
            "row": row,
        }

    def _check_position(self, pos: dict[str, Any]) -> None:
        position = Position(pos["epoch"], pos["seq"], pos["token_offset"])
        num_epochs = self.dataset.num_epochs
        if num_epochs is not None and position.epoch >= num_epochs:
            raise StateError(
                f"the state is in epoch {position.epoch} but this pipeline runs {num_epochs} "
                f"epoch(s): nothing would be left to read; raise `num_epochs` to continue"
            )
        num_rows = self.dataset.layout(position.epoch).stream_rows(0)
        if position.seq > num_rows:
            raise StateError(
                f"state position seq {position.seq} is outside the epoch's {num_rows} rows: "
                "the state was edited or comes from other data"
            )
        where = self._where(position)
        saved = {k: pos.get(k) for k in where if k in pos}
        if saved and saved != {k: where[k] for k in saved}:
            raise StateError(
                f"state position seq {position.seq} names {saved!r} but that sequence number is "
                f"{where!r} in this dataset: the state was edited or comes from other data"
            )

    # -- iteration ----------------------------------------------------------------

    def __iter__(self) -> DatasetIterator:
        return self

    def __next__(self) -> Any:
        assert self._chunks is not None
        if self._run is not None:
            return self._run.next_batch(self._chunks)
        while True:
            # One record batch per source chunk (a cell of the batch_rows grid), however
            # the stages sliced it, so outputs after a resume fall on the same grid.
            pieces = [next(self._chunks)]  # StopIteration ends the stream
            while not pieces[-1].source_end:
                pieces.append(next(self._chunks))
            chunk = Chunk.concat(pieces)
            self._ledger.commit(chunk)
            self._pos = Position(chunk.epoch, chunk.seq_end, 0)
            if chunk.num_docs:
                self._ledger.add("batches", 1)
                return _to_record_batch(chunk)

    def close(self) -> None:
        """Release open files."""
        if self._chunks is not None:
            self._chunks.close()
            self._chunks = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._reader.close()


class _Inline:
    """The synchronous stand-in for :class:`Prefetcher` (``prefetch=0``)."""

    def __init__(self, gen: Generator[Chunk, None, None]) -> None:
        self._gen = gen

    def __iter__(self) -> _Inline:
        return self

    def __next__(self) -> Chunk:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()


def _to_record_batch(chunk: Chunk) -> pa.RecordBatch:
    assert chunk.batch is not None
    return chunk.batch
