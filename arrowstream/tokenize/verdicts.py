"""The verdict store: whether tiktoken was proven to give a tokenizer's ids, remembered.

A verdict (``ok``, the ``reason`` when not, what was ``checked``, and how many
bytes of real ``documents`` were encoded by both backends with equal ids) of
the checks of :mod:`arrowstream.tokenize.encoders` is kept under a key made of
the tokenizer's hash, its options, the library versions and
:data:`_CHECKS_VERSION`: in this process, and on disk (one small JSON file per
key) so that a later process, a DataLoader worker or a restart skips the
proof. The directory is :func:`default_verdict_dir` unless the encoder names
another: ``$ARROWSTREAM_CACHE_DIR/encoders``, else
``$XDG_CACHE_HOME/arrowstream/encoders``, else
``~/.cache/arrowstream/encoders``; ``ARROWSTREAM_CACHE_DIR=off`` keeps verdicts
in the process only. A mismatch seen on real documents is stored as a failed
verdict, so that tokenizer keeps the reference backend from then on.

Invariants: a file is written to a temporary name then renamed, so readers
never see half a verdict; a file that is missing, unreadable or for another
key counts as no verdict; a cache that cannot be written warns and costs time,
never correctness. Thread safety: the in-process store holds a lock, and a
process writes its verdicts to disk one at a time, in the order it took them.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import tiktoken
import tokenizers

from arrowstream.errors import EncoderFallbackWarning, warn_user
from arrowstream.io.cachedir import CACHE_ENV, default_cache_root
from arrowstream.io.forksafe import new_locks_in_forked_children

__all__ = ["CACHE_ENV", "default_verdict_dir"]

#: Bump when the probe set or the checks change: cached verdicts then no longer apply.
_CHECKS_VERSION = 2

_lock = threading.Lock()
_verdicts: dict[str, dict[str, Any]] = {}
#: Held while a verdict is stored, in the process then on disk, so the file takes the process's
#: verdicts in the order the process took them: the checks' thread, still writing its verdict, could
#: otherwise put it back over the one the stream had made of it with the sample's size, and every
#: later process sampled again.
_store_lock = threading.Lock()
new_locks_in_forked_children(globals(), "_lock", "_store_lock")


def default_verdict_dir() -> Path | None:
    """Return where verdicts are kept by default, from the environment; ``None`` when turned off.

    Examples
    --------
    >>> import os
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"ARROWSTREAM_CACHE_DIR": "/scratch/me/arrowstream"}):
    ...     print(default_verdict_dir())
    /scratch/me/arrowstream/encoders
    >>> with mock.patch.dict(os.environ, {"ARROWSTREAM_CACHE_DIR": "off"}):
    ...     print(default_verdict_dir())
    None
    """
    root = default_cache_root()
    return None if root is None else root / "encoders"


def _cached_verdict(key: str, cache_dir: Path | None, *, documents: int = 0) -> dict[str, Any] | None:
    """Return the verdict stored for ``key`` (in the process, else on disk), or ``None``.

    With ``documents``, a verdict from the process that records fewer bytes
    of documents is looked up on disk again (another process, a DataLoader
    worker say, may have finished its sample since).
    """
    with _lock:
        hit = _verdicts.get(key)
    if cache_dir is None or (hit is not None and (not hit["ok"] or hit.get("documents", 0) >= documents)):
        return hit
    try:
        verdict = json.loads((cache_dir / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(verdict, dict) or verdict.get("key") != key or "ok" not in verdict:
        return hit
    with _lock:
        _verdicts[key] = verdict
    return verdict


def _store_verdict(key: str, verdict: dict[str, Any], cache_dir: Path | None, *, warn: bool = True) -> str:
    """Keep ``verdict`` in the process and in ``cache_dir``; return why the directory could not be written, if not.

    Without ``warn`` the reason is only returned (a thread of the checks:
    the stream warns it).
    """
    verdict = {
        "key": key,
        **verdict,
        "versions": {"tiktoken": tiktoken.__version__, "tokenizers": tokenizers.__version__, "checks": _CHECKS_VERSION},
    }
    with _store_lock:
        with _lock:
            _verdicts[key] = verdict
        message = "" if cache_dir is None else _write(key, verdict, cache_dir)
    if message and warn:
        warn_user(message, EncoderFallbackWarning)
    return message


def _write(key: str, verdict: dict[str, Any], cache_dir: Path) -> str:
    """Write ``verdict`` to ``cache_dir`` under a temporary name, then rename it; return why it could not be, if not."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache_dir / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(json.dumps(verdict, indent=1), encoding="utf-8")
        os.replace(tmp, cache_dir / f"{key}.json")
    except OSError as exc:  # a cache that cannot be written costs time, not correctness
        return (
            f"cannot write the encoder check cache in {str(cache_dir)!r}: {exc}; the checks run "
            "again next time: pass a writable `cache_dir` or None"
        )
    return ""


def _store_checked(key: str, verdict: dict[str, Any], cache_dir: Path | None) -> str:
    """Store the verdict of checks run beside the stream, unless a failure was stored meanwhile; never warn.

    A mismatch another process (or this one's stream) found on a document
    while the checks ran stands: the checks do not vouch for documents.
    Returns what :func:`_store_verdict` returns.
    """
    stored = _cached_verdict(key, cache_dir)
    if stored is not None and not stored["ok"]:
        return ""
    if stored is not None and not stored.get("tokie", {"ok": True})["ok"] and "tokie" in verdict:
        verdict = {**verdict, "tokie": stored["tokie"]}
    return _store_verdict(key, verdict, cache_dir, warn=False)


def _forget_verdict(key: str, reason: str, cache_dir: Path | None, *, tokie: bool = False) -> None:
    """Record a mismatch on real documents, so this tokenizer keeps `tokenizers` (or, with ``tokie``, drops tokie) from now on."""
    with _lock:
        old = dict(_verdicts.get(key, {}))
    if tokie:
        if "ok" not in old:  # no verdict yet: the encoder puts the failure in the one its checks make
            return
        verdict = {**old, "tokie": {"ok": False, "reason": reason}}
    else:
        verdict = {"ok": False, "reason": reason, "checked": dict(old.get("checked", {}))}
    _store_verdict(key, verdict, cache_dir)


def documents_vouched(verdict: dict[str, Any], *, tokie: bool) -> int:
    """Bytes of documents a stored verdict vouches for, for an encoder with (``tokie``) or without tokie.

    A sample taken while tokie encoded showed tiktoken only the texts tokie
    routes: it vouches for tiktoken alone on no documents. A verdict without
    ``documents_by`` had every backend encode every document.

    Examples
    --------
    >>> documents_vouched({"ok": True, "documents": 4096, "documents_by": "tokie"}, tokie=True)
    4096
    >>> documents_vouched({"ok": True, "documents": 4096, "documents_by": "tokie"}, tokie=False)
    0
    """
    if verdict.get("documents_by") == "tokie" and not tokie:
        return 0
    return int(verdict.get("documents", 0))
