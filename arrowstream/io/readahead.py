"""Reading row groups ahead, several at once: storage latency hidden behind the row groups in use.

On object storage every row group read waits for a round trip or more; read
one after the other, a consumer's throughput is bounded by the latency, not
the bandwidth. :class:`ReadAhead` is told which shards come next
(:meth:`ReadAhead.hint`, from the stream's layout) and reads up to ``depth``
of them in a small thread pool, each thread with its own
:class:`~arrowstream.io.reader.ShardReader`; :meth:`ReadAhead.read` hands
back the table read ahead, or reads in the calling thread what was not.

Nothing changes but timing: a read returns the same table, or raises the same
error, as a plain reader would; warnings (a skipped row group) are given in
the calling thread. Memory: at most ``depth`` row groups beyond the ones in
use. Used for remote filesystems (``ARROWSTREAM_READ_AHEAD`` row groups,
default 4; 0 turns it off); local disks read fast enough without it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa
import pyarrow.fs as pafs

from arrowstream.errors import ConfigError
from arrowstream.io.manifest import Manifest
from arrowstream.io.niceness import producer_pool
from arrowstream.io.reader import ShardReader, warn_skipped

__all__ = ["ReadAhead", "read_ahead_depth"]


def read_ahead_depth(manifest: Manifest) -> int:
    """Return how many row groups to read ahead: ``ARROWSTREAM_READ_AHEAD`` (default 4), 0 on a local disk."""
    if isinstance(manifest.filesystem, (pafs.LocalFileSystem, pafs.PyFileSystem)):
        return 0  # a local disk is fast enough; a Python filesystem (fsspec) reads in the calling thread
    try:
        depth = int(os.environ.get("ARROWSTREAM_READ_AHEAD", "4"))
    except ValueError as exc:
        raise ConfigError(f"ARROWSTREAM_READ_AHEAD should be a whole number: {exc}") from exc
    return max(0, depth)


class ReadAhead:
    """A reader of shards that reads the ones hinted at ahead, ``depth`` at a time.

    Examples
    --------
    >>> from arrowstream.io.manifest import read_manifest
    >>> from arrowstream.testing import example_dir
    >>> m = read_manifest(example_dir())
    >>> reader = ReadAhead(m, ["text"], depth=2)
    >>> reader.hint([1, 2])
    >>> reader.read(1).column("text").to_pylist() == ShardReader(m, ["text"]).read(1).column("text").to_pylist()
    True
    >>> reader.close()
    """

    def __init__(self, manifest: Manifest, columns: Sequence[str], *, depth: int, skip_unreadable: bool = False) -> None:
        self.manifest = manifest
        self.columns = list(columns)
        self.skip_unreadable = skip_unreadable
        self.depth = depth
        self.unreadable: dict[int, str] = {}  # shared by every thread's reader
        self._warned: set[int] = set()
        self._own = self._new_reader()
        self._readers = [self._own]
        self._local = threading.local()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: OrderedDict[int, Future[pa.Table]] = OrderedDict()

    def _new_reader(self) -> ShardReader:
        reader = ShardReader(self.manifest, self.columns, skip_unreadable=self.skip_unreadable, warn=False)
        reader.unreadable = self.unreadable
        return reader

    def _thread_reader(self) -> ShardReader:
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = self._new_reader()
            with self._lock:
                self._readers.append(reader)
        return reader

    @property
    def retries(self) -> int:
        """Reads tried again after a transient storage error, in every thread."""
        with self._lock:
            return sum(r.retries for r in self._readers)

    def hint(self, shards: Iterable[int]) -> None:
        """Start reading the first of ``shards`` (the next ones, in order) not read or being read, up to ``depth`` in all."""
        if self.depth <= 0:
            return
        if self._pool is None:
            self._pool = producer_pool(self.depth, "arrowstream-read")
        for shard in shards:
            if len(self._pending) >= self.depth:
                return
            if shard not in self._pending:
                self._pending[shard] = self._pool.submit(lambda s=shard: self._thread_reader().read(s))

    def read(self, shard: int) -> pa.Table:
        """Return every row of ``shard``: read ahead, or now."""
        future = self._pending.pop(shard, None)
        table = future.result() if future is not None else self._own.read(shard)
        warn_skipped(self.manifest, shard, self.unreadable, self._warned)
        return table

    def read_columns(self, shard: int, columns: list[str]) -> pa.Table:
        """Return ``columns`` of ``shard``, read now (not ahead)."""
        return self._own.read_columns(shard, columns)

    def without(self, column: str) -> ShardReader:
        """Return a plain reader of the same manifest that does not read ``column``."""
        return self._own.without(column)

    def recheck(self) -> None:
        """Check every thread's open files are still the ones discovered (see :meth:`ShardReader.recheck`)."""
        with self._lock:
            readers = list(self._readers)
        for reader in readers:
            reader.recheck()

    def close(self) -> None:
        """Stop reading ahead and close every thread's files."""
        if self._pool is not None:
            for future in self._pending.values():
                future.cancel()
            if not sys.is_finalizing():  # at exit its threads are joined and its module torn down
                self._pool.shutdown(wait=True)
            self._pool = None
        self._pending.clear()
        with self._lock:
            for reader in self._readers:
                reader.close()
