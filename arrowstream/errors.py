"""Exception and warning classes of arrowstream.

Every error the library raises derives from :class:`ArrowStreamError`, so a
trainer can catch the whole family at once. Configuration mistakes also derive
from :class:`ValueError`, so ``except ValueError`` keeps working.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable

__all__ = [
    "ArrowStreamError",
    "CacheError",
    "CacheWarning",
    "ConfigError",
    "DataLossWarning",
    "EncoderFallbackWarning",
    "PerformanceWarning",
    "SchemaError",
    "ShardError",
    "StateError",
    "StateMismatchError",
    "forward_warnings",
    "warn_user",
    "warnings_sink",
]


class ArrowStreamError(Exception):
    """Root of every error raised by arrowstream."""


class ConfigError(ArrowStreamError, ValueError):
    """An option or argument has a value the library cannot use."""


class SchemaError(ArrowStreamError, ValueError):
    """A column is missing, has the wrong type, or differs between files."""


class ShardError(ArrowStreamError):
    """A file or row group could not be found, opened or read."""


class StateError(ArrowStreamError, ValueError):
    """A saved state is malformed or from an unsupported format version."""


class StateMismatchError(StateError):
    """A saved state comes from other data or other pipeline options."""


class CacheError(ArrowStreamError):
    """A token cache or length index entry does not match the data or setting, or is missing where required."""


class CacheWarning(UserWarning):
    """A stale token cache entry is being rebuilt, or a stale length index is not used."""


class DataLossWarning(UserWarning):
    """Documents of an epoch were dropped, counted, to keep batch counts even (an estimated target)."""


class PerformanceWarning(UserWarning):
    """The pipeline works but is configured in a way that wastes time or memory."""


class EncoderFallbackWarning(PerformanceWarning):
    """A faster encoder backend was refused or failed its equivalence check: `tokenizers` is used."""


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_thread_sink = threading.local()

#: Where a library thread's warnings go: a callable taking ``(message, category)``.
Sink = Callable[[tuple[Warning | str, "type[Warning] | None"]], None]


def warnings_sink() -> Sink | None:
    """The sink this thread's warnings go to (``None``: they are warned here)."""
    return getattr(_thread_sink, "sink", None)


def forward_warnings(sink: Sink | None) -> None:
    """Send this thread's :func:`warn_user` warnings to ``sink`` from now on (``None``: warn them here)."""
    _thread_sink.sink = sink


def warn_user(message: Warning | str, category: type[Warning] | None = None) -> None:
    """Warn at the first line outside arrowstream on the stack: the user's line that led here.

    What ``warnings.warn(..., skip_file_prefixes=...)`` does from Python 3.12
    on. In a thread of the library's own (a prefetch thread, an encoder
    thread), whose stack holds no line of the user's, the warning goes to the
    thread's sink (:func:`forward_warnings`) and the thread it works for
    warns again, as its items come out.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_user("careful", UserWarning)
    >>> caught[0].filename == __file__ or not caught[0].filename.startswith(_PACKAGE)
    True
    """
    sink = getattr(_thread_sink, "sink", None)
    if sink is not None:  # a thread of the library's: its consumer warns at the user's line
        sink((message, category))
        return
    level, frame = 1, sys._getframe(0)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)

