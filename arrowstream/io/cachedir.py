"""arrowstream's per-user cache directory, from the environment, for what a later process can reuse.

``$ARROWSTREAM_CACHE_DIR``, else ``$XDG_CACHE_HOME/arrowstream``, else
``~/.cache/arrowstream``; ``ARROWSTREAM_CACHE_DIR=off`` (or ``none``, ``0``,
``false``, ``no``, empty) turns it off. Its users each take a subdirectory:
the encoders' verdicts and kept forms (``encoders/``,
:mod:`arrowstream.tokenize.verdicts`), a pickled dataset's file records
(``footers/``, :mod:`arrowstream.io.footerfile`).

Examples
--------
>>> import os
>>> from unittest import mock
>>> with mock.patch.dict(os.environ, {"ARROWSTREAM_CACHE_DIR": "/scratch/me/arrowstream"}):
...     print(default_cache_root())
/scratch/me/arrowstream
>>> with mock.patch.dict(os.environ, {"ARROWSTREAM_CACHE_DIR": "off"}):
...     print(default_cache_root())
None
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "default_cache_root"]

#: The environment variable naming arrowstream's per-user cache directory (``off`` for none).
CACHE_ENV = "ARROWSTREAM_CACHE_DIR"

#: Values of :data:`CACHE_ENV` that turn the on-disk cache off.
_OFF = ("", "off", "none", "0", "false", "no")


def default_cache_root() -> Path | None:
    """Return arrowstream's cache directory, from the environment; ``None`` when turned off."""
    root = os.environ.get(CACHE_ENV)
    if root is not None:
        return None if root.strip().lower() in _OFF else Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "arrowstream"
