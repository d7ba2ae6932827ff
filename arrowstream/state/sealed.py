"""Snapshots that cross to another process as bytes, unpickled there only when a state is asked for.

A DataLoader worker of :class:`~arrowstream.pytorch.StatefulLoader` sends
the snapshot of its state with every batch, and the main process keeps only
each worker's latest, built into a state when a checkpoint asks.

- :class:`Sealed` pickles the snapshot once in the worker; it crosses as one
  ``bytes`` object and :meth:`Sealed.open` unpickles it on first use.
  Unpickling a ``best_fit`` snapshot (about 26 KB for the thousand documents
  of its window) with every batch, and freeing the one before, took the main
  process 0.4 ms a batch. In the process that sealed it, :meth:`Sealed.open`
  returns the snapshot itself.
- A :class:`SealStream` (one per worker iterator) sends most snapshots as a
  difference: a look-ahead run's formed rows do not change once formed, and
  consecutive snapshots share most of them, so a snapshot names the rows it
  shares with the stream's last whole one (its *base*) by their place there
  (:func:`shared_rows`) and pickles only the rest. Pickling a whole
  ``best_fit`` snapshot in the worker with every batch cost it 0.3 ms a
  batch. A snapshot is sent whole when it shares less than half its rows
  with the base. The receiving side links each difference to its base on
  arrival (they arrive in the order sent) and resolves it when opened.

A snapshot type takes part by giving ``shared_rows()``: the lists, in a
fixed order, that a later snapshot may hold unchanged (the same objects);
a run's :meth:`~arrowstream.pack.frozen.FrozenRun.__reduce__` replaces those
the base has by their places (``int``; a row is a ``list``) while a stream
sends (:func:`sending_base`) and puts them back while one is opened
(:func:`resolve`).
"""

from __future__ import annotations

import itertools
import os
import pickle
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from arrowstream.errors import StateError
from arrowstream.state.snapshot import Snapshot

__all__ = ["SealStream", "Sealed", "opened", "resolve", "sending_base", "shared_rows"]

_PROTOCOL = pickle.HIGHEST_PROTOCOL
_local = threading.local()  # the base of the snapshot being pickled or unpickled in this thread
# receiving side: each stream's last whole snapshot, which the differences after it need (streams of ended
# iterators fall out, oldest first)
_bases: OrderedDict[tuple[int, int], tuple[int, Sealed]] = OrderedDict()
_BASES_KEPT = 256
_bases_lock = threading.Lock()


def shared_rows(snapshot: Any) -> list[Any]:
    """Return the lists ``snapshot`` holds that a later snapshot may hold unchanged, in a fixed order (none if it says none)."""
    rows = getattr(snapshot, "shared_rows", None)
    return [] if rows is None else list(rows())


@contextmanager
def _base(kind: str, value: Any) -> Iterator[None]:
    setattr(_local, kind, value)
    try:
        yield
    finally:
        setattr(_local, kind, None)


def sending_base() -> dict[int, int] | None:
    """While a :class:`SealStream` pickles a difference: the base's rows, ``id`` to place; else ``None``."""
    return getattr(_local, "sending", None)  # type: ignore[no-any-return]


def resolve(rows: list[Any]) -> list[Any]:
    """Return ``rows`` (lists) with each ``int``, a row's place in the base, replaced by that row (while a difference is opened)."""
    base: list[Any] | None = getattr(_local, "receiving", None)
    if base is None:
        if any(type(row) is int for row in rows):
            raise StateError("a snapshot sent as a difference was unpickled without its base: open it with `Sealed.open()`")
        return rows
    return [base[row] if type(row) is int else row for row in rows]


class SealStream:
    """One worker iterator's snapshots on their way to the main process, pickled in the order sent.

    Examples
    --------
    >>> import pickle
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> ds = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0)
    >>> it = ds.pack(seq_len=4, batch_size=1, strategy="best_fit").iter()
    >>> stream, sent, states = SealStream(), [], []
    >>> for _ in it:
    ...     sent.append(pickle.dumps(Sealed(it.snapshot(), stream)))
    ...     states.append(it.state_dict())
    >>> received = [pickle.loads(b) for b in sent]  # in order, as a DataLoader delivers them
    >>> "".join("d" if r.is_difference else "w" for r in received)  # whole ones, and differences from them
    'wdddddddddw'
    >>> [r.open().with_plan(it.plan).to_dict() for r in reversed(received)] == states[::-1]
    True
    """

    _streams = itertools.count()

    def __init__(self) -> None:
        self.key = (os.getpid(), next(SealStream._streams))
        self._sent = 0
        self._base_seq: int | None = None
        self._base_rows: list[Any] = []  # held, so their ids stay theirs
        self._base_index: dict[int, int] = {}

    def encode(self, snapshot: Snapshot) -> tuple[int | None, int, bytes]:
        """Pickle ``snapshot`` as the stream's next: ``(base it refers to or None, its number, bytes)``."""
        seq, self._sent = self._sent, self._sent + 1
        rows = shared_rows(snapshot)
        index = self._base_index
        if self._base_seq is not None and rows and 2 * sum(id(row) in index for row in rows) >= len(rows):
            with _base("sending", index):
                return self._base_seq, seq, pickle.dumps(snapshot, protocol=_PROTOCOL)
        self._base_seq, self._base_rows = seq, rows
        self._base_index = {id(row): i for i, row in enumerate(rows)}
        return None, seq, pickle.dumps(snapshot, protocol=_PROTOCOL)


class Sealed:
    """A snapshot that crosses to another process as bytes and is unpickled there by :meth:`open`, on first use.

    With a ``stream``, it may cross as a difference from the stream's last
    whole snapshot (see the module's notes); without, it crosses whole.

    Examples
    --------
    >>> import pickle
    >>> from arrowstream.state.snapshot import Taken
    >>> sealed = Sealed(Taken({"position": {"epoch": 1}}))
    >>> crossed = pickle.loads(pickle.dumps(sealed))
    >>> crossed.is_open, crossed.to_dict(), crossed.is_open
    (False, {'position': {'epoch': 1}}, True)
    """

    __slots__ = ("_base", "_pickled", "_snapshot", "_stream")

    def __init__(self, snapshot: Snapshot, stream: SealStream | None = None) -> None:
        self._snapshot: Snapshot | None = snapshot
        self._stream = stream
        self._pickled: bytes | None = None
        self._base: Sealed | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the snapshot's own pickle (or its difference from the stream's base), kept as bytes on the other side."""
        if self._stream is None:
            return (_received, (pickle.dumps(self.open(), protocol=_PROTOCOL),))
        base, seq, data = self._stream.encode(self.open())
        return (_received, (data, self._stream.key, seq, base))

    @property
    def is_difference(self) -> bool:
        """Whether it crossed as a difference from an earlier snapshot of its stream (until opened)."""
        return self._base is not None

    @property
    def is_open(self) -> bool:
        """Whether the snapshot is unpickled (always, in the process that sealed it)."""
        return self._snapshot is not None

    def open(self) -> Snapshot:
        """Return the snapshot, unpickled on first use (its base first, if it is a difference)."""
        if self._snapshot is None:
            assert self._pickled is not None
            if self._base is None:
                self._snapshot = pickle.loads(self._pickled)
            else:
                with _base("receiving", shared_rows(self._base.open())):
                    self._snapshot = pickle.loads(self._pickled)
            self._pickled, self._base = None, None
        return self._snapshot

    def to_dict(self) -> dict[str, Any]:
        """Return the snapshot's state (see :meth:`Snapshot.to_dict`)."""
        return self.open().to_dict()


def _received(pickled: bytes, stream: tuple[int, int] | None = None, seq: int = 0, base: int | None = None) -> Sealed:
    """Rebuild a :class:`Sealed` on the receiving side: the bytes, and the base a difference refers to."""
    sealed = Sealed.__new__(Sealed)
    sealed._snapshot, sealed._stream, sealed._pickled, sealed._base = None, None, pickled, None
    if stream is None:
        return sealed
    with _bases_lock:
        if base is None:  # whole: the base of the differences that follow
            _bases[stream] = (seq, sealed)
            _bases.move_to_end(stream)
            if len(_bases) > _BASES_KEPT:
                _bases.popitem(last=False)
            return sealed
        kept = _bases.get(stream)
    sealed._base = kept[1] if kept is not None and kept[0] == base else None
    if sealed._base is None:
        raise StateError(
            f"a snapshot of stream {stream} arrived as a difference from snapshot {base}, which this process "
            "never received or no longer holds: snapshots of a stream must be unpickled in the order sent"
        )
    return sealed


def opened(snapshot: Snapshot | None) -> Snapshot | None:
    """Return ``snapshot``, or the one it seals.

    Examples
    --------
    >>> from arrowstream.state.snapshot import Taken
    >>> snap = Taken({})
    >>> opened(Sealed(snap)) is snap, opened(snap) is snap, opened(None)
    (True, True, None)
    """
    return snapshot.open() if isinstance(snapshot, Sealed) else snapshot
