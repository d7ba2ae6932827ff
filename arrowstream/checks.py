"""Checking options at the edge: one place for "an int of at least N".

Every option that takes a count goes through :func:`check_int`, so they all
refuse the same things (``True``, floats, strings, values too small), accept
numpy integers, and say so in the same words.
"""

from __future__ import annotations

import numpy as np

from arrowstream.errors import ConfigError

__all__ = ["check_choice", "check_int"]


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
