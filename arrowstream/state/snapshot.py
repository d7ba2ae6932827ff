"""A state taken now and written out later.

A producer that makes batches ahead of its consumer (``to_torch()``'s
``prefetch``) needs the state after every batch it makes, since any of them
may be the last one handed out when a checkpoint asks; yet only that one is
ever written. Building a state costs tens of microseconds for ``concat``
(the position's file and row group, the options) and milliseconds for a
look-ahead window's thousand document references. A :class:`Snapshot`
captures what will change (counters, positions, the packer's rows) by copying
containers, and builds the dict ``state_dict()`` would have returned at that
moment only when :meth:`Snapshot.to_dict` is called.

Examples
--------
>>> from arrowstream import read_parquet
>>> from arrowstream.testing import example_dir
>>> it = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0).pack(seq_len=4, batch_size=2).iter()
>>> first = next(it)
>>> taken = take_snapshot(it)
>>> expected = it.state_dict()
>>> rest = list(it)
>>> taken.to_dict() == expected
True
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Sealed", "Snapshot", "Taken", "opened", "take_snapshot"]


class Snapshot(Protocol):
    """A state captured at one position; ``to_dict()`` builds it (a new dict at each call)."""

    def to_dict(self) -> dict[str, Any]:
        """Return the state as ``state_dict()`` returned it when the snapshot was taken."""
        ...


@dataclass(frozen=True, slots=True)
class Taken:
    """A snapshot whose state was built when it was taken (where building it is cheap, or not deferred yet).

    Examples
    --------
    >>> snap = Taken({"position": {"epoch": 0}})
    >>> a = snap.to_dict()
    >>> a["position"]["epoch"] = 5
    >>> snap.to_dict()
    {'position': {'epoch': 0}}
    """

    state: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """Return a copy of the state (changing it leaves the snapshot as it was)."""
        return copy.deepcopy(self.state)


def take_snapshot(iterator: Any) -> Snapshot:
    """Return ``iterator.snapshot()``, or a :class:`Taken` of its ``state_dict()`` where it has none."""
    take = getattr(iterator, "snapshot", None)
    return take() if take is not None else Taken(iterator.state_dict())


class Sealed:
    """A snapshot that crosses to another process as bytes and is unpickled there only when its state is asked for.

    A DataLoader worker sends a snapshot with every batch
    (:class:`~arrowstream.pytorch.StatefulLoader`), and the main process
    keeps only each worker's latest, built into a state when a checkpoint
    asks. A ``best_fit`` snapshot names the look-ahead window's documents
    (about 26 KB pickled for a thousand): unpickling it in the main process
    with every batch, and freeing the one before, took that process 0.4 ms a
    batch. Sealed, it is pickled once in the worker, crosses as one ``bytes``
    object, and :meth:`open` unpickles it on first use. In the process that
    made it, nothing is pickled: :meth:`open` returns the snapshot itself.

    Examples
    --------
    >>> import pickle
    >>> sealed = Sealed(Taken({"position": {"epoch": 1}}))
    >>> crossed = pickle.loads(pickle.dumps(sealed))
    >>> crossed.is_open, crossed.to_dict(), crossed.is_open
    (False, {'position': {'epoch': 1}}, True)
    """

    __slots__ = ("_pickled", "_snapshot")

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot: Snapshot | None = snapshot
        self._pickled: bytes | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the snapshot's own pickle, kept as bytes on the other side."""
        return (_received, (pickle.dumps(self.open(), protocol=pickle.HIGHEST_PROTOCOL),))

    @property
    def is_open(self) -> bool:
        """Whether the snapshot is unpickled (always, in the process that sealed it)."""
        return self._snapshot is not None

    def open(self) -> Snapshot:
        """Return the snapshot, unpickled on first use."""
        if self._snapshot is None:
            assert self._pickled is not None
            self._snapshot, self._pickled = pickle.loads(self._pickled), None
        return self._snapshot

    def to_dict(self) -> dict[str, Any]:
        """Return the snapshot's state (see :meth:`Snapshot.to_dict`)."""
        return self.open().to_dict()


def _received(pickled: bytes) -> Sealed:
    """Rebuild a :class:`Sealed` on the receiving side: the bytes only."""
    sealed = Sealed.__new__(Sealed)
    sealed._snapshot, sealed._pickled = None, pickled
    return sealed


def opened(snapshot: Snapshot | None) -> Snapshot | None:
    """Return ``snapshot``, or the one it seals.

    Examples
    --------
    >>> snap = Taken({})
    >>> opened(Sealed(snap)) is snap, opened(snap) is snap, opened(None)
    (True, True, None)
    """
    return snapshot.open() if isinstance(snapshot, Sealed) else snapshot
