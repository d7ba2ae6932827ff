"""A state's checksum: a state changed after it was saved is refused, not resumed from.

A state is references (row ranges, offsets, documents a packer holds), so an
edit that keeps it well-formed (a held document taken out, a read position
moved on, a share cut short) would resume without an error and lose or
repeat data silently; so would a corrupted digit. Every state the library
makes carries ``checksum``: 32 hex digits of SHA-256 over the rest of the
state as canonical JSON (sorted keys, no spaces), which a JSON round trip,
indentation or key order leave as they are. Loading checks it. A state of
format version 8 on without one is refused (the key was removed, or the
state rebuilt by hand); an older one (saved before 2026-11-27) is read as
before.

Examples
--------
>>> state = with_checksum({"format": "arrowstream", "position": {"seq": 5}})
>>> verify_checksum(state)          # as saved: fine
>>> state["position"]["seq"] = 6
>>> verify_checksum(state)
Traceback (most recent call last):
...
arrowstream.errors.StateError: the state was changed after it was saved: its checksum ... does not match its \
contents (...); load the state as `state_dict()` returned it, or start without it
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from arrowstream.errors import StateError

__all__ = ["CHECKSUM_KEY", "SEALED_FROM", "checksum_of", "verify_checksum", "with_checksum"]

#: The key a state's checksum is stored under.
CHECKSUM_KEY = "checksum"
#: The first format version whose states always carry their checksum.
SEALED_FROM = 8


def checksum_of(state: dict[str, Any]) -> str:
    """The checksum of ``state``'s contents (every key but ``checksum``)."""
    body = {k: v for k, v in state.items() if k != CHECKSUM_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def with_checksum(state: dict[str, Any]) -> dict[str, Any]:
    """Set ``state``'s checksum (the last key) and return it."""
    state.pop(CHECKSUM_KEY, None)
    state[CHECKSUM_KEY] = checksum_of(state)
    return state


def verify_checksum(state: Any, *, missing_ok: bool = False) -> None:
    """Raise :class:`StateError` when ``state``'s checksum does not match its contents, or is missing.

    A state of format version 8 on always carries one as saved; an older
    state without one passes, as does anything not a dict (other checks name
    that). ``missing_ok``: for the states the library derives itself (a
    consumer's share of a merged state), checked where they came in.
    """
    if not isinstance(state, dict):
        return
    if CHECKSUM_KEY not in state:
        version = state.get("version")
        if not missing_ok and isinstance(version, int) and not isinstance(version, bool) and version >= SEALED_FROM:
            raise StateError(
                f"the state has no `{CHECKSUM_KEY}`, which every state of format version {SEALED_FROM} on "
                f"carries (this one says version {version}): it was removed or the state rebuilt by hand, so "
                "an edit cannot be told from a state as saved; load the state as `state_dict()` returned it, "
                "or seal an intended edit with `arrowstream.state.checksum.with_checksum(state)`"
            )
        return
    saved = state[CHECKSUM_KEY]
    try:
        actual = checksum_of(state)
    except (TypeError, ValueError) as exc:  # something JSON cannot hold: not a state as saved
        raise StateError(f"the state holds a value JSON cannot: {exc}; load the state as `state_dict()` returned it") from exc
    if saved != actual:
        raise StateError(
            f"the state was changed after it was saved: its checksum {saved!r} does not match its contents "
            f"({actual!r}); load the state as `state_dict()` returned it, or start without it"
        )
