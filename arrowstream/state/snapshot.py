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
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Snapshot", "Taken", "take_snapshot"]


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

