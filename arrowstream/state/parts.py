"""The coordinates a state is made of: a position, a share of work, held documents.

Each is a frozen dataclass that reads itself from a state's JSON
(``from_dict``, raising :class:`~arrowstream.errors.StateError` naming the
field) and writes itself back (``to_dict``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from arrowstream.errors import StateError

__all__ = ["STREAMS_BY", "Held", "Position", "RowRange", "Work", "count"]

#: How an epoch's layout cuts its streams: equal rows, equal tokens (counted, at document
#: boundaries), whole batches of tokens (counted, a document split between two streams where
#: a batch ends, version 6 on), equal Parquet bytes of the columns read (estimated, states
#: before version 5), or equal estimated tokens (each row group's bytes times a nearby sampled
#: row group's token rate).
STREAMS_BY = ("rows", "tokens", "batches", "bytes", "estimate")


#: A row range, the unit of work: ``(stream, start, end, skip, take)``, rows ``start..end-1``
#: of a stream in its order, the first ``skip`` tokens of row ``start`` already emitted
#: elsewhere, and of row ``end - 1`` only its tokens before ``take`` (0: all of them; the
#: rest goes to another consumer). A state writes ``take`` only when it is not 0. (The
#: state's JSON keeps its first name for them: ``work.segments``, ``position.segment``.)
RowRange = tuple[int, int, int, int, int]


def count(value: Any, field: str) -> int:
    """Return ``value`` as an int >= 0, or raise :class:`StateError` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StateError(f"state `{field}` should be an int >= 0, got {value!r}: the state was edited")
    return value


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """Where a consumer continues: epoch, segment of its work, row sequence number, tokens emitted.

    Examples
    --------
    >>> Position(0, 0, 10, 3) < Position(1, 0, 0, 0)
    True
    >>> Position.from_dict({"epoch": 1, "segment": 0, "seq": 7, "token_offset": 2, "file": "a.parquet"})
    Position(epoch=1, segment=0, seq=7, token_offset=2)
    >>> Position(1, 0, 7, 2).to_dict()
    {'epoch': 1, 'segment': 0, 'seq': 7, 'token_offset': 2}
    """

    epoch: int
    segment: int
    seq: int
    token_offset: int = 0

    @classmethod
    def from_dict(cls, data: Any, *, field: str = "position") -> Position:
        """Read a state's ``position`` (its informative keys are left to the caller).

        Raises
        ------
        StateError
            Not a dict, or a coordinate that is not an int >= 0 (named).
        """
        if not isinstance(data, dict):
            raise StateError(
                f"state `{field}` should be a dict, got {type(data).__name__}: the state is truncated "
                "or was edited; pass what `state_dict()` returned"
            )
        return cls(*(count(data.get(k), f"{field}.{k}") for k in ("epoch", "segment", "seq", "token_offset")))

    def to_dict(self) -> dict[str, int]:
        """Return the coordinates as a state holds them."""
        return {"epoch": self.epoch, "segment": self.segment, "seq": self.seq, "token_offset": self.token_offset}


@dataclass(frozen=True, slots=True)
class Work:
    """A consumer's share of an epoch: the epoch's streams and its row ranges, read in order.

    The epoch's layout is cut into ``num_streams`` streams of equal rows
    (``by="rows"``) or of equal tokens (``by="tokens"``, when every row's
    tokens are known before the epoch); the row ranges refer to it. A
    version-2 or -3 state's streams are by rows. ``target`` is set only for
    the next epoch's share after a re-deal (``next_work``): the batches every
    consumer emits in it, or ``None``.

    Examples
    --------
    >>> Work.from_dict({"num_streams": 2, "segments": [[1, 0, 6, 0], [0, 3, 4, 0, 5]]})
    Work(num_streams=2, segments=((1, 0, 6, 0, 0), (0, 3, 4, 0, 5)), target=None, by='rows', target_known=False, left=())
    >>> Work.from_dict({"num_streams": 1, "segments": [[0, 7, 8, 40], [0, 9, 20, 0]], "left": [[0, 7, 40, 12]]}).left
    ((0, 7, 40, 12),)
    """

    num_streams: int
    segments: tuple[RowRange, ...]
    target: int | None = None
    by: str = "rows"
    #: Whether the state stated ``target`` (a version-2 ``next_work`` may not).
    target_known: bool = field(default=False, compare=False)
    #: ``(stream, seq, skip, left)`` of rows that were held documents when a merge dealt them: from ``skip``
    #: on, ``left`` tokens (version 9; for the estimates of a later re-deal).
    left: tuple[tuple[int, int, int, int], ...] = field(default=(), compare=False)

    @classmethod
    def from_dict(cls, data: Any, *, field: str = "work") -> Work:
        """Read a state's ``work`` or ``next_work``.

        Raises
        ------
        StateError
            Malformed, naming ``field``.
        """
        try:
            streams = int(data["num_streams"])
            # ``take`` is written only when not 0 (and not at all before version 6)
            segments = tuple(tuple(int(v) for v in (*seg, 0)[: max(len(seg), 5)]) for seg in data["segments"])
            target = data.get("target")
            known = "target" in data
            by = data.get("by", "rows")
            left = tuple(_left_row(item) for item in data.get("left") or ())
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(f"state `{field}` is malformed ({exc!r}): the state was edited") from exc
        if streams < 1:
            raise StateError(f"state `{field}.num_streams` must be >= 1, got {streams}: the state was edited")
        if any(len(seg) != 5 or min(seg) < 0 for seg in segments):
            raise StateError(
                f"state `{field}.segments` should be [stream, start, end, skip] or [stream, start, end, "
                f"skip, take] lists of ints >= 0, got "
                f"{data['segments']!r}: the state was edited"
            )
        if target is not None:
            target = count(target, f"{field}.target")
        if by not in STREAMS_BY:
            raise StateError(f"state `{field}.by` must be one of {list(STREAMS_BY)!r}, got {by!r}: the state was edited")
        return cls(streams, segments, target, by, known, left)  # type: ignore[arg-type]

    def to_dict(self, *, with_target: bool = False) -> dict[str, Any]:
        """Return the share as a state holds it (``target`` only for ``next_work``)."""
        out: dict[str, Any] = {
            "num_streams": self.num_streams,
            "by": self.by,
            "segments": [list(s[:4]) if not s[4] else list(s) for s in self.segments],
        }
        if with_target:
            out["target"] = self.target
        if self.left:
            out["left"] = [list(row) for row in self.left]
        return out


@dataclass(frozen=True, slots=True)
class Held:
    """Documents a look-ahead packer holds back, by reference, and how far it has read.

    ``read`` is ``(segment, seq)`` of the first document not read yet; each of
    ``docs`` is ``(segment, seq, skip, left)``: a held document, whose tokens
    from ``skip`` on are not emitted yet, ``left`` of them (``-1``: not
    recorded, a state of version 8 or older).

    Examples
    --------
    >>> Held.from_dict({"read": [0, 9], "docs": [[0, 4, 0, 12], [0, 7, 3, 5]]}).docs
    ((0, 4, 0, 12), (0, 7, 3, 5))
    >>> Held.from_dict({"read": [0, 9], "docs": [[0, 4, 0]]}).docs   # version 8
    ((0, 4, 0, -1),)
    """

    read: tuple[int, int]
    docs: tuple[tuple[int, int, int, int], ...]

    @classmethod
    def from_dict(cls, data: Any, *, field: str = "held") -> Held:
        """Read a state's ``held``.

        Raises
        ------
        StateError
            Malformed, naming ``field``.
        """
        try:
            segment, seq = (int(v) for v in data["read"])
            docs = tuple(_held_doc(d) for d in data["docs"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"state `{field}` is malformed ({exc!r}): the state was edited") from exc
        return cls((segment, seq), docs)

    def to_dict(self) -> dict[str, Any]:
        """Return the references as a state holds them."""
        return {"read": list(self.read), "docs": [list(d) if d[3] >= 0 else list(d[:3]) for d in self.docs]}


def _held_doc(item: Any) -> tuple[int, int, int, int]:
    """One held document ``[segment, seq, skip, left]`` (``left`` absent before version 9: ``-1``)."""
    if not isinstance(item, (list, tuple)) or len(item) not in (3, 4):
        raise ValueError(f"a held document is [segment, seq, skip, left], got {item!r}")
    values = [int(v) for v in item]
    if min(values) < 0:
        raise ValueError(f"a held document's numbers are >= 0, got {item!r}")
    return (values[0], values[1], values[2], values[3] if len(values) == 4 else -1)


def _left_row(item: Any) -> tuple[int, int, int, int]:
    """One ``[stream, seq, skip, left]`` of a share's ``left``."""
    values = tuple(int(v) for v in item)
    if len(values) != 4 or min(values) < 0:
        raise ValueError(f"a share's `left` row is [stream, seq, skip, left] of ints >= 0, got {item!r}")
    return values  # type: ignore[return-value]
