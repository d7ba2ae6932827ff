"""Checking options at the edge: one place for "an int of at least N".

Every option that takes a count goes through :func:`check_int`, so they all
refuse the same things (``True``, floats, strings, values too small), accept
numpy integers, and say so in the same words.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable

import numpy as np

from arrowstream.errors import ConfigError

__all__ = ["check_choice", "check_int", "check_options"]


def check_int(name: str, value: object, *, low: int = 1, none_ok: bool = False, hint: str = "") -> int | None:
    """Return ``value`` as an int ``>= low`` (or ``None`` when ``none_ok``), or raise :class:`ConfigError`.

    ``hint`` follows the expectation in the message, in parentheses.

    Examples
    --------
    >>> check_int("window", np.int64(4))
    4
    >>> check_int("prefetch", None, low=0, none_ok=True) is None
    True
    >>> check_int("window", True, hint="row groups mixed")
    Traceback (most recent call last):
    ...
    arrowstream.errors.ConfigError: `window` must be a positive int (row groups mixed), got True
    """
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        expected = "a positive int" if low == 1 else f"an int >= {low}"
        expected += " or None" if none_ok else ""
        expected += f" ({hint})" if hint else ""
        raise ConfigError(f"`{name}` must be {expected}, got {value!r}")
    return int(value)


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """Raise :class:`~arrowstream.errors.ConfigError` unless ``value`` is one of ``choices``.

    Examples
    --------
    >>> check_choice("on_error", "skip", ("raise", "skip"))
    >>> check_choice("on_error", "ignore", ("raise", "skip"))
    Traceback (most recent call last):
    ...
    arrowstream.errors.ConfigError: `on_error` should be 'raise' or 'skip', got 'ignore'
    """
    if value not in choices:
        raise ConfigError(f"`{name}` should be {' or '.join(map(repr, choices))}, got {value!r}")


def check_options(method: str, options: dict[str, object], target: Callable[..., object], *, also: tuple[str, ...] = ()) -> None:
    """Raise :class:`ConfigError` when ``options`` name one ``target`` does not take, or leave out one it needs.

    ``method`` is what the user called (``".tokenize"``); ``also``: names the
    method takes itself. The message names the nearest option for a typo.
    A target taking ``**kwargs`` accepts any name.

    Examples
    --------
    >>> def pack(*, seq_len: int, batch_size: int, drop_last: bool = False) -> None: ...
    >>> check_options(".pack", {"seq_len": 8, "batch_size": 2}, pack)
    >>> check_options(".pack", {"seqlen": 8, "batch_size": 2}, pack)
    Traceback (most recent call last):
    ...
    arrowstream.errors.ConfigError: `.pack` has no option `seqlen` (did you mean `seq_len`?); its options are batch_size, drop_last, seq_len
    >>> check_options(".pack", {"seq_len": 8}, pack)
    Traceback (most recent call last):
    ...
    arrowstream.errors.ConfigError: `.pack` needs `batch_size`, which was not given
    """
    params = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = sorted({n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL} | set(also))
    for name in options:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            guess = f" (did you mean `{near[0]}`?)" if near else ""
            raise ConfigError(f"`{method}` has no option `{name}`{guess}; its options are {', '.join(known)}")
    for name, p in params.items():
        needed = p.default is inspect.Parameter.empty and p.kind is inspect.Parameter.KEYWORD_ONLY
        if needed and name not in options:
            raise ConfigError(f"`{method}` needs `{name}`, which was not given")
