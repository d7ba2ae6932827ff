"""The checkpoint format: positions as small coordinates, never data.

A state is a JSON-able ``dict`` with the same keys at every step (a part
that is empty now is ``null``; every counter the pipeline can move is there
from the first state on, at 0)::

    {
      "format": "arrowstream.state", "version": 3,
      "dataset": {"fingerprint": ..., "num_files": ..., "num_shards": ..., "num_rows": ...},
      "options_hash": ..., "options": {...},
      "position": {"epoch": 0, "segment": 0, "seq": 1234, "token_offset": 17,
                   "stream": 0, "file": "part-0.parquet", "row_group": 2, "row": 210},
      "work": {"num_streams": 1, "segments": [[0, 0, 5000, 0]]},
      "consumer": {"index": 0, "count": 1},
      "stats": {"rows": ..., "docs": ..., "tokens": ..., "batches": ..., ...},
      "packer": {},
      "held": null,       # documents a look-ahead packer holds back, as references
      "next_work": null,  # the next epoch's share, when a merge re-dealt it
    }

Version 2 states (which left empty parts out) load too.

``work`` lists the consumer's segments of the epoch (``[stream, start, end]``
rows of the epoch's streams, read in order); ``position.segment``,
``position.seq`` (row sequence number in that segment's stream) and
``position.token_offset`` (tokens of that document already emitted) are
authoritative; ``stream``, ``file``, ``row_group`` and ``row`` name the same
place for people and are checked on load. A *global* state from
:func:`~arrowstream.distributed.topology.merge_states` holds every consumer's state
instead. See ``docs/state-format.md``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from arrowstream.errors import StateError, StateMismatchError

__all__ = [
    "READABLE_VERSIONS",
    "STATE_FORMAT",
    "STATE_VERSION",
    "Held",
    "Position",
    "Segment",
    "Work",
    "check_identity",
    "check_state",
    "hash_options",
]

STATE_FORMAT = "arrowstream.state"
STATE_VERSION = 3
#: Versions this release loads. Version 2 left out empty parts (``held``, ``next_work``,
#: counters not moved yet); version 3 has the same keys at every step.
READABLE_VERSIONS = (2, 3)


#: ``(stream, start, end, skip)``: rows ``start..end-1`` of a stream, in its order,
#: the first ``skip`` tokens of row ``start`` already emitted.
Segment = tuple[int, int, int, int]


def _count(value: Any, field: str) -> int:
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
        return cls(*(_count(data.get(k), f"{field}.{k}") for k in ("epoch", "segment", "seq", "token_offset")))

    def to_dict(self) -> dict[str, int]:
        """Return the coordinates as a state holds them."""
        return {"epoch": self.epoch, "segment": self.segment, "seq": self.seq, "token_offset": self.token_offset}


@dataclass(frozen=True, slots=True)
class Work:
    """A consumer's share of an epoch: the epoch's stream count and its segments, read in order.

    ``target`` is set only for the next epoch's share after a re-deal
    (``next_work``): the batches every consumer emits in it, or ``None``.

    Examples
    --------
    >>> Work.from_dict({"num_streams": 2, "segments": [[1, 0, 6, 0]]})
    Work(num_streams=2, segments=((1, 0, 6, 0),), target=None)
    """

    num_streams: int
    segments: tuple[Segment, ...]
    target: int | None = None

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
            segments = tuple(tuple(int(v) for v in seg) for seg in data["segments"])
            target = data.get("target")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(f"state `{field}` is malformed ({exc!r}): the state was edited") from exc
        if streams < 1:
            raise StateError(f"state `{field}.num_streams` must be >= 1, got {streams}: the state was edited")
        if any(len(seg) != 4 or min(seg) < 0 for seg in segments):
            raise StateError(
                f"state `{field}.segments` should be [stream, start, end, skip] lists of ints >= 0, got "
                f"{data['segments']!r}: the state was edited"
            )
        if target is not None:
            target = _count(target, f"{field}.target")
        return cls(streams, segments, target)  # type: ignore[arg-type]

    def to_dict(self, *, with_target: bool = False) -> dict[str, Any]:
        """Return the share as a state holds it (``target`` only for ``next_work``)."""
        out: dict[str, Any] = {"num_streams": self.num_streams, "segments": [list(s) for s in self.segments]}
        if with_target:
            out["target"] = self.target
        return out


@dataclass(frozen=True, slots=True)
class Held:
    """Documents a look-ahead packer holds back, by reference, and how far it has read.

    ``read`` is ``(segment, seq)`` of the first document not read yet; each of
    ``docs`` is ``(segment, seq, skip)``: a held document, whose tokens from
    ``skip`` on are not emitted yet.

    Examples
    --------
    >>> Held.from_dict({"read": [0, 9], "docs": [[0, 4, 0], [0, 7, 3]]}).docs
    ((0, 4, 0), (0, 7, 3))
    """

    read: tuple[int, int]
    docs: tuple[tuple[int, int, int], ...]

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
            docs = tuple((int(a), int(b), int(c)) for a, b, c in data["docs"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"state `{field}` is malformed ({exc!r}): the state was edited") from exc
        return cls((segment, seq), docs)

    def to_dict(self) -> dict[str, Any]:
        """Return the references as a state holds them."""
        return {"read": list(self.read), "docs": [list(d) for d in self.docs]}


def hash_options(options: dict[str, Any]) -> str:
    """Return a stable short hash of JSON-able pipeline options.

    Examples
    --------
    >>> hash_options({"a": 1}) == hash_options({"a": 1})
    True
    """
    text = json.dumps(options, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def check_state(
    state: Any, *, dataset: dict[str, Any], options: dict[str, Any], options_hash: str
) -> None:
    """Raise unless ``state`` is a well-formed state for this data and these options.

    Raises
    ------
    StateError
        ``state`` is not an arrowstream state or has another format version.
    StateMismatchError
        ``state`` was saved from other data or other pipeline options; the
        message says what differs.
    """
    check_identity(state, dataset=dataset, options=options, options_hash=options_hash)
    for key, kind in (
        ("dataset", dict), ("position", dict), ("stats", dict), ("work", dict), ("consumer", dict)
    ):
        if not isinstance(state.get(key), kind):
            raise StateError(
                f"state `{key}` should be a {kind.__name__}, got {type(state.get(key)).__name__}: "
                "the state is truncated or was edited; pass what `state_dict()` returned"
            )
    Position.from_dict(state["position"])
    bad = {k: v for k, v in state["stats"].items() if isinstance(v, bool) or not isinstance(v, int)}
    if bad:
        raise StateError(f"state `stats` should hold int counters, got {bad!r}")


def check_identity(
    state: Any, *, dataset: dict[str, Any], options: dict[str, Any], options_hash: str
) -> None:
    """Raise unless ``state`` (a consumer's or a global one) names this format, data and options.

    Checked before anything in the state is used, so a state from other data
    is reported as such, never as a malformed one.

    Raises
    ------
    StateError
        Not an arrowstream state, or another format version.
    StateMismatchError
        Other data or other pipeline options; the message says what differs.
    """
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        got = type(state).__name__ if not isinstance(state, dict) else sorted(state)[:6]
        raise StateError(
            f"expected an arrowstream state (a dict with format={STATE_FORMAT!r}), got {got!r}: "
            "pass what `state_dict()` returned"
        )
    if state.get("version") not in READABLE_VERSIONS:
        raise StateError(
            f"state format version {state.get('version')!r} is not supported (this arrowstream "
            f"reads versions {', '.join(map(str, READABLE_VERSIONS))}): resume with the arrowstream "
            "release that saved it"
        )
    saved = state.get("dataset")
    if not isinstance(saved, dict):
        raise StateError(
            f"state `dataset` should be a dict, got {type(saved).__name__}: the state is truncated "
            "or was edited; pass what `state_dict()` returned"
        )
    if saved.get("fingerprint") != dataset["fingerprint"]:
        raise StateMismatchError(
            "the state was saved from other data: it has "
            f"{_describe(saved)}, this pipeline reads {_describe(dataset)}; resume on the same "
            "files (same relative paths, sizes and row groups) or start without the state"
        )
    if state.get("options_hash") != options_hash:
        saved_opts = state.get("options", {})
        diffs = _diff(saved_opts, options)
        raise StateMismatchError(
            "the state was saved with other pipeline options: "
            + "; ".join(diffs)
            + ". Rebuild the pipeline with the saved options or start without the state"
        )


def _describe(d: dict[str, Any]) -> str:
    return (
        f"{d.get('num_files')} file(s), {d.get('num_shards')} row group(s), "
        f"{d.get('num_rows')} row(s), fingerprint {str(d.get('fingerprint'))[:12]}"
    )


def _diff(saved: Any, current: Any, prefix: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current)):
            out += _diff(saved.get(key), current.get(key), f"{prefix}{key}.")
        return out
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        out = []
        for i, (a, b) in enumerate(zip(saved, current)):
            out += _diff(a, b, f"{prefix}{i}.")
        return out
    if saved != current:
        return [f"`{prefix.rstrip('.')}` was {saved!r}, now {current!r}"]
    return []
