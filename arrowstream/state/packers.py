"""Each packer's own part of a state (``state["packer"]``), typed.

Every packer keeps its :class:`Progress` through the epoch (``concat`` keeps
nothing else). The look-ahead packers also keep where their reading has got
to (``read``) and their pending rows or batches as references to documents,
never tokens: ``best_fit`` its open, ready and outgoing rows
(:class:`BestFitState`), ``bucket`` its carried documents and formed
batches (:class:`BucketState`). A share re-dealt by a merge starts with an
empty part (``{}``): nothing held, read from the position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arrowstream.errors import StateError
from arrowstream.state.parts import count

__all__ = ["BestFitState", "BucketState", "DocKey", "SegmentRef", "Progress"]

#: A document by reference: ``(range, seq)``, its row range's index in the epoch's work
#: (``position.segment``'s kind of index) and its row sequence number.
DocKey = tuple[int, int]
#: A document segment in a packed row: ``(range, seq)`` for a whole document, or
#: ``(range, seq, start, length)`` for a cut part of one; in ``ready`` and ``out``, a row
#: of one ``(range, seq, start, length, rows)`` stands for ``rows`` full rows of a split
#: document, tokens ``start`` onward, ``length`` a row (version 10).
SegmentRef = tuple[int, ...]


def _malformed(exc: Exception) -> StateError:
    return StateError(f"state `packer` is malformed ({exc!r}): the state was edited")


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a packer is in its epoch.

    ``epoch`` is the epoch whose batches are being counted, ``epoch_batches``
    how many it has emitted. ``target`` is the batches every consumer emits in
    the epoch (``None``: as many as the data gives); ``target_known`` is false
    when the state did not say (then it is worked out again, identically).
    ``data_epoch`` is set while a consumer that reached an estimated target
    with data left carries that data into the next epoch's count: the epoch
    still being read (``None``: ``epoch`` itself, or for ``concat`` the
    position's).

    Examples
    --------
    >>> Progress.from_dict({"epoch": 1, "epoch_batches": 4, "target": None})
    Progress(epoch=1, epoch_batches=4, target=None, target_known=True, data_epoch=None)
    >>> Progress(2, 3, 10, data_epoch=1).to_dict()   # reading epoch 1, counting toward epoch 2's target
    {'epoch': 2, 'epoch_batches': 3, 'target': 10, 'data_epoch': 1}
    """

    epoch: int
    epoch_batches: int
    target: int | None = None
    target_known: bool = True
    data_epoch: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, epoch: int | None = None) -> Progress:
        """Read the progress keys of a ``packer`` part; ``epoch`` stands in for a missing one."""
        if "epoch" not in data and epoch is not None:
            data = {**data, "epoch": epoch}
        target = data.get("target")
        reading = data.get("data_epoch")
        progress = cls(
            count(data.get("epoch"), "packer.epoch"),
            count(data.get("epoch_batches", 0), "packer.epoch_batches"),
            None if target is None else count(target, "packer.target"),
            "target" in data,
            None if reading is None else count(reading, "packer.data_epoch"),
        )
        if progress.data_epoch is not None and progress.data_epoch >= progress.epoch:
            raise StateError(
                f"state `packer.data_epoch` ({progress.data_epoch}) must come before `packer.epoch` "
                f"({progress.epoch}): the state was edited"
            )
        return progress

    def to_dict(self) -> dict[str, Any]:
        """Return the progress keys (``data_epoch`` is ``None`` unless data is carried)."""
        carried = self.data_epoch is not None and self.data_epoch != self.epoch
        return {
            "epoch": self.epoch,
            "epoch_batches": self.epoch_batches,
            "target": self.target,
            "data_epoch": self.data_epoch if carried else None,
        }


def _read(data: dict[str, Any]) -> tuple[int, int, int]:
    mark = tuple(int(v) for v in data["read"])
    if len(mark) != 3:
        raise StateError(f"state `packer.read` must be [epoch, segment, seq], got {list(mark)!r}")
    return mark  # type: ignore[return-value]


def _segment_ref(item: Any) -> SegmentRef:
    if not isinstance(item, list) or len(item) not in (2, 4):
        raise ValueError(f"a document segment is [range, seq] or [range, seq, start, length], got {item!r}")
    return tuple(int(v) for v in item)


def _queued_row(row: Any) -> tuple[SegmentRef, ...]:
    """A ready or outgoing row; or, one reference of five numbers, a split document's full rows."""
    if isinstance(row, list) and len(row) == 1 and isinstance(row[0], list) and len(row[0]) == 5:
        run = tuple(int(v) for v in row[0])
        if run[3] < 1 or run[4] < 1:
            raise ValueError(f"full rows are [range, seq, start, length, rows] with length and rows >= 1, got {row[0]!r}")
        return (run,)
    return tuple(map(_segment_ref, row))


def _key(item: Any) -> DocKey:
    if not isinstance(item, list) or len(item) != 2:
        raise ValueError(f"a held document is [range, seq], got {item!r}")
    return int(item[0]), int(item[1])


def _piece(item: Any) -> tuple[int, ...]:
    if not isinstance(item, list) or len(item) not in (2, 3):
        raise ValueError(f"a held document is [range, seq] or, a split one's piece, [range, seq, start], got {item!r}")
    return tuple(int(v) for v in item)


@dataclass(frozen=True, slots=True)
class BestFitState:
    """The ``packer`` part of ``best_fit``: progress, reading mark and pending rows as references.

    ``open`` rows carry their age (look-ahead windows seen) and document segments;
    ``ready`` rows wait for their block of batches to be shuffled; ``out``
    rows are shuffled and go out next. ``windows`` counts the look-ahead
    windows read in the epoch and ``ramp`` says whether the first ones are
    smaller (version 7; a state saved before has neither: no ramp, which the
    run keeps). A ``ready`` or ``out`` row of one five-number reference
    ``[range, seq, start, length, rows]`` stands for ``rows`` full rows of a
    split document, so a long document costs one entry (version 10).

    Examples
    --------
    >>> part = {"epoch": 0, "epoch_batches": 2, "target": None, "data_epoch": None, "read": [0, 0, 40], "block": 1,
    ...         "flushed": False, "open": [[1, [[0, 3]]]], "ready": [], "out": [[[0, 5, 0, 8]]], "windows": 2,
    ...         "ramp": True}
    >>> BestFitState.from_dict(part).to_dict() == part
    True
    """

    progress: Progress
    read: tuple[int, int, int]
    block: int
    flushed: bool
    open: tuple[tuple[int, tuple[SegmentRef, ...]], ...]
    ready: tuple[tuple[SegmentRef, ...], ...]
    out: tuple[tuple[SegmentRef, ...], ...]
    windows: int = 0
    ramp: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BestFitState:
        """Read a ``best_fit`` part (not an empty one)."""
        try:
            return cls(
                Progress.from_dict(data),
                _read(data),
                int(data["block"]),
                bool(data["flushed"]),
                tuple((int(age), tuple(map(_segment_ref, row))) for age, row in data["open"]),
                tuple(map(_queued_row, data["ready"])),
                tuple(map(_queued_row, data["out"])),
                count(data.get("windows", 0), "packer.windows"),
                bool(data.get("ramp", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise _malformed(exc) from exc

    def to_dict(self) -> dict[str, Any]:
        """Return the part as a state holds it."""
        return {
            **self.progress.to_dict(),
            "read": list(self.read),
            "block": self.block,
            "flushed": self.flushed,
            "open": [[age, [list(p) for p in row]] for age, row in self.open],
            "ready": [[list(p) for p in row] for row in self.ready],
            "out": [[list(p) for p in row] for row in self.out],
            "windows": self.windows,
            "ramp": self.ramp,
        }


@dataclass(frozen=True, slots=True)
class BucketState:
    """The ``packer`` part of ``bucket``: progress, reading mark, carried documents and formed batches.

    ``window`` counts the windows formed in the epoch; ``ramp`` says whether
    the first ones are smaller (version 7; a state saved before has no
    ``ramp``: no ramp, which the run keeps).

    Examples
    --------
    >>> part = {"epoch": 0, "epoch_batches": 1, "target": 3, "data_epoch": None, "read": [0, 0, 9], "window": 2,
    ...         "flushed": False, "carry": [[0, 7]], "out": [[[0, 1], [0, 4]]], "ramp": True}
    >>> BucketState.from_dict(part).to_dict() == part
    True
    """

    progress: Progress
    read: tuple[int, int, int]
    window: int
    flushed: bool
    carry: tuple[tuple[int, ...], ...]
    out: tuple[tuple[tuple[int, ...], ...], ...]
    ramp: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BucketState:
        """Read a ``bucket`` part (not an empty one)."""
        try:
            return cls(
                Progress.from_dict(data),
                _read(data),
                int(data["window"]),
                bool(data["flushed"]),
                tuple(map(_piece, data["carry"])),
                tuple(tuple(map(_piece, batch)) for batch in data["out"]),
                bool(data.get("ramp", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise _malformed(exc) from exc

    def to_dict(self) -> dict[str, Any]:
        """Return the part as a state holds it."""
        return {
            **self.progress.to_dict(),
            "read": list(self.read),
            "window": self.window,
            "flushed": self.flushed,
            "carry": [list(k) for k in self.carry],
            "out": [[list(k) for k in batch] for batch in self.out],
            "ramp": self.ramp,
        }
