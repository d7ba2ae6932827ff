"""Exception and warning classes of arrowstream.

Every error the library raises derives from :class:`ArrowStreamError`, so a
trainer can catch the whole family at once. Configuration mistakes also derive
from :class:`ValueError`, so ``except ValueError`` keeps working.
"""

from __future__ import annotations

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
