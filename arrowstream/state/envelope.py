"""The envelope of a state: identity, coordinates and counters, read and written in one place.

:class:`State` is what :meth:`~arrowstream.pipeline.iterator.DatasetIterator.state_dict`
returns, typed: :meth:`State.from_dict` validates every part (naming the
field that is wrong) and :meth:`State.to_dict` writes the same keys at every
step. :func:`check_identity` compares a state's data and options with a
pipeline's before anything in it is used.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from arrowstream.errors import StateError, StateMismatchError
from arrowstream.state.checksum import verify_checksum
from arrowstream.state.parts import Held, Position, Work, count

__all__ = [
    "READABLE_VERSIONS",
    "STATE_FORMAT",
    "STATE_VERSION",
    "WHERE_KEYS",
    "State",
    "check_identity",
    "check_counters",
    "check_state",
    "hash_options",
]

STATE_FORMAT = "arrowstream.state"
STATE_VERSION = 10
#: Versions this release loads. Version 2 left out empty parts (``held``, ``next_work``,
#: counters not moved yet); version 3 has the same keys at every step; version 4 says how
#: each epoch's streams were cut (``work.by``: by rows before, the only way then); version 5
#: carries data past an estimated target into the next epoch's count (``packer.data_epoch``,
#: counters ``carried_docs`` and ``carried_tokens``; none before); version 6 deals counted
#: ``concat`` shares of whole batches (``work.by`` ``"batches"``), whose row ranges may end
#: inside a document (a fifth number, ``take``); version 7 starts the look-ahead packers'
#: epochs with smaller windows (``packer.ramp``, and ``packer.windows`` for ``best_fit``;
#: an older state has none and its run never ramps); version 8 always carries its checksum
#: (``checksum``, as every state since 2026-11-27 has: one of version 8 without it is refused);
#: version 9 records how many tokens each held document has left (a fourth number in
#: ``held.docs``; an older state's are estimated when an elastic resume re-deals them);
#: version 10 keeps a ``best_fit`` split document's full rows as one entry (a row of one
#: five-number reference in ``packer.ready`` and ``packer.out``; older states list each row),
#: counts a long document as its first piece leaves (an older state's held ones were counted
#: when read: taken back on resume), and after a re-deal consumer 0 carries the merged
#: counters (``earlier``).
READABLE_VERSIONS = (2, 3, 4, 5, 6, 7, 8, 9, 10)
#: The keys of ``position`` that name its place for people (checked on load, not used).
WHERE_KEYS = ("stream", "file", "row_group", "row")


@dataclass(frozen=True, slots=True)
class State:
    """One consumer's state, typed.

    Attributes
    ----------
    dataset, options_hash, options
        The identity of the data and of the pipeline (see :func:`check_identity`).
    position
        Where the consumer continues; ``where`` names the same place for
        people (``stream``, ``file``, ``row_group``, ``row``; ``None`` where
        there is none).
    work, next_work
        The consumer's share of the position's epoch, and of the next epoch
        when a merge re-dealt it (else ``None``).
    consumer
        ``(index, count)`` of the consumer among all of them.
    stats
        The counters, by name.
    packer
        The packer's own part (see :mod:`arrowstream.state.packers`); ``{}``
        without a packer or for a share re-dealt by a merge.
    held
        Documents a look-ahead packer holds back, by reference, or ``None``.
    epoch_stats
        The packer's counters per epoch begun (the epoch whose batches were
        counted), each ``{"epoch": e, "tokens": ..., ...}``; empty without a
        packer, before version 5, or for a share re-dealt by a merge.

    Examples
    --------
    >>> state = State(dataset={"fingerprint": "f"}, options_hash="h", options={},
    ...               position=Position(0, 0, 5), work=Work(1, ((0, 0, 9, 0, 0),)), consumer=(0, 1),
    ...               stats={"rows": 5})
    >>> again = State.from_dict(state.to_dict())
    >>> again == state, sorted(state.to_dict())[:4]
    (True, ['consumer', 'dataset', 'epoch_stats', 'format'])
    """

    dataset: dict[str, Any]
    options_hash: str
    options: dict[str, Any]
    position: Position
    work: Work
    consumer: tuple[int, int]
    stats: dict[str, int]
    where: dict[str, Any] = field(default_factory=lambda: dict.fromkeys(WHERE_KEYS))
    packer: dict[str, Any] = field(default_factory=dict)
    held: Held | None = None
    next_work: Work | None = None
    epoch_stats: tuple[dict[str, int], ...] = ()
    later_work: tuple[Work, ...] = ()
    num_workers: int | None = None  # DataLoader workers a rank, when more than one (counted even batches per rank)
    version: int = STATE_VERSION  # the version it was saved with (it is always written as this release's)
    earlier: dict[str, Any] | None = None  # counters from before the last re-deal that this consumer carries

    @classmethod
    def from_dict(cls, data: Any) -> State:
        """Read and validate a consumer's state (version 2 to 5).

        Raises
        ------
        StateError
            Not a state, another version, or a malformed part (named).
        """
        _check_envelope(data)
        for key in ("position", "stats", "work", "consumer"):
            if not isinstance(data.get(key), dict):
                raise StateError(
                    f"state `{key}` should be a dict, got {type(data.get(key)).__name__}: "
                    "the state is truncated or was edited; pass what `state_dict()` returned"
                )
        check_counters(data["stats"], "stats")
        consumer = data["consumer"]
        index, total = count(consumer.get("index"), "consumer.index"), count(consumer.get("count"), "consumer.count")
        workers = data.get("num_workers")
        if workers is not None and (count(workers, "num_workers") < 2 or total % workers):
            raise StateError(f"state `num_workers` {workers} does not split {total} consumers into ranks: the state was edited")
        packer = data.get("packer") or {}
        if not isinstance(packer, dict):
            raise StateError(f"state `packer` should be a dict, got {type(packer).__name__}: the state was edited")
        held, nxt = data.get("held"), data.get("next_work")
        later = data.get("later_work") or []  # epochs after next_work's, dealt by a merge (mixtures)
        if not isinstance(later, list) or (later and nxt is None):
            raise StateError(
                f"state `later_work` should be a list of shares following `next_work`, got {later!r}: "
                "the state was edited"
            )
        epochs = data.get("epoch_stats") or []  # version 5 on
        _check_epoch_rows(epochs, "epoch_stats")
        earlier = data.get("earlier")  # version 10, after a re-deal: consumer 0's
        if earlier is not None:
            if not isinstance(earlier, dict) or set(earlier) != {"stats", "epoch_stats"}:
                raise StateError(
                    f"state `earlier` should be {{'stats': {{...}}, 'epoch_stats': [...]}}, got {earlier!r}: "
                    "the state was edited"
                )
            check_counters(earlier["stats"], "earlier.stats")
            _check_epoch_rows(earlier["epoch_stats"], "earlier.epoch_stats")
        return cls(
            dataset=data["dataset"],
            options_hash=data.get("options_hash"),  # type: ignore[arg-type]
            options=data.get("options"),  # type: ignore[arg-type]
            position=Position.from_dict(data["position"]),
            where={k: data["position"][k] for k in WHERE_KEYS if k in data["position"]},
            work=Work.from_dict(data["work"]),
            consumer=(index, total),
            stats=dict(data["stats"]),
            packer=packer,
            held=None if held is None else Held.from_dict(held),
            next_work=None if nxt is None else Work.from_dict(nxt, field="next_work"),
            epoch_stats=tuple(dict(e) for e in epochs),
            later_work=tuple(Work.from_dict(w, field="later_work") for w in later),
            num_workers=workers,
            version=data["version"],
            earlier=earlier,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the state as JSON-able data, with the same keys at every step."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "dataset": self.dataset,
            "options_hash": self.options_hash,
            "options": self.options,
            "position": {**self.position.to_dict(), **dict.fromkeys(WHERE_KEYS), **self.where},
            "work": self.work.to_dict(),
            "consumer": {"index": self.consumer[0], "count": self.consumer[1]},
            "stats": self.stats,
            "packer": self.packer,
            "held": None if self.held is None else self.held.to_dict(),
            "next_work": None if self.next_work is None else self.next_work.to_dict(with_target=True),
            "epoch_stats": [dict(e) for e in self.epoch_stats],
            "later_work": [w.to_dict(with_target=True) for w in self.later_work],
            **({} if self.num_workers is None else {"num_workers": self.num_workers}),
            **({} if self.earlier is None else {"earlier": self.earlier}),
        }


def check_counters(stats: Any, name: str) -> dict[str, int]:
    """Return ``stats``, a state's counters (``name`` in it), refusing anything but a dict of ints."""
    if not isinstance(stats, dict):
        raise StateError(f"state `{name}` should be a dict of int counters, got {type(stats).__name__}: the state was edited")
    bad = {k: v for k, v in stats.items() if isinstance(v, bool) or not isinstance(v, int)}
    if bad:
        raise StateError(f"state `{name}` should hold int counters, got {bad!r}")
    return dict(stats)


def _check_epoch_rows(epochs: Any, name: str) -> None:
    if not isinstance(epochs, list) or not all(
        isinstance(e, dict) and "epoch" in e and all(isinstance(v, int) and not isinstance(v, bool) for v in e.values())
        for e in epochs
    ):
        raise StateError(
            f"state `{name}` should be a list of {{'epoch': int, counter: int, ...}}, got {epochs!r}: "
            "the state was edited"
        )


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
) -> State:
    """Return ``state`` typed, if it is a well-formed state for this data and these options.

    Raises
    ------
    StateError
        ``state`` is not an arrowstream state or has another format version.
    StateMismatchError
        ``state`` was saved from other data or other pipeline options; the
        message says what differs.
    """
    check_identity(state, dataset=dataset, options=options, options_hash=options_hash)
    return State.from_dict(state)


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
    _check_envelope(state)
    saved = state["dataset"]
    if saved.get("fingerprint") != dataset["fingerprint"]:
        raise StateMismatchError(
            "the state was saved from other data: it has "
            f"{_describe(saved)}, this pipeline reads {_describe(dataset)}; resume on the same "
            "files (same relative paths, sizes and row groups) or start without the state"
        )
    if saved.get("contents") is not None and dataset.get("contents") not in (None, saved["contents"]):
        raise StateMismatchError(
            "the state was saved from other data: files with the same relative paths, sizes and row counts "
            f"({_describe(dataset)}) but other contents (their Parquet footers differ: statistics, page "
            "layout or writer); resume on the files it was saved on, or start without the state"
        )
    if state.get("options_hash") != options_hash:
        saved_opts = state.get("options", {})
        diffs = sorted(_diff(saved_opts, options), key=_weight)  # what a user set first
        if not diffs:  # the options agree: the hash was changed (or dropped) by hand
            raise StateError(
                f"the state's `options_hash` is {state.get('options_hash')!r} but its options, the same as "
                f"this pipeline's, hash to {options_hash!r}: the state was edited; pass what `state_dict()` returned"
            )
        shown = diffs[:_SHOWN] + ([f"and {len(diffs) - _SHOWN} more"] if len(diffs) > _SHOWN else [])
        raise StateMismatchError(
            "the state was saved with other pipeline options: "
            + "; ".join(shown)
            + ". Rebuild the pipeline with the saved options or start without the state"
        )


def _check_envelope(state: Any) -> None:
    """Raise unless ``state`` is a dict naming this format, a readable version and a dataset, as saved."""
    verify_checksum(state, missing_ok=True)  # a derived share has none: its source was checked coming in
    if isinstance(state, dict) and str(state.get("kind", "")).startswith("mixture"):
        raise StateError(
            f"this is a mixture's state (kind {state['kind']!r}, from `mix(...)`): load it into the same "
            "mixture's iterator, not a single pipeline's"
        )
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        got = type(state).__name__ if not isinstance(state, dict) else sorted(state)[:6] or "an empty dict"
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
    if not isinstance(state.get("dataset"), dict):
        raise StateError(
            f"state `dataset` should be a dict, got {type(state.get('dataset')).__name__}: the state "
            "is truncated or was edited; pass what `state_dict()` returned"
        )


def _describe(d: dict[str, Any]) -> str:
    return (
        f"{d.get('num_files')} file(s), {d.get('num_shards')} row group(s), "
        f"{d.get('num_rows')} row(s), fingerprint {str(d.get('fingerprint'))[:12]}"
    )


#: Differences of options a mismatch message lists (the rest are counted).
_SHOWN = 4
#: Option names users set themselves, listed first when options differ.
_FIRST = ("strategy", "seq_len", "batch_size", "tokenizer", "column", "seed", "expr", "drop_last", "num_epochs")


def _weight(diff: str) -> int:
    """Where a difference is listed: options users set (``pack.strategy`` first) before those they imply."""
    name = diff.split("`")[1].rsplit(".", 1)[-1] if "`" in diff else ""
    return _FIRST.index(name) if name in _FIRST else len(_FIRST)


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
