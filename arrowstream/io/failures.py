"""Storage errors: which are worth another attempt, and what to tell the user of them.

Errors come from pyarrow's own clients (an ``OSError`` whose text names the
AWS error or HTTP status) and from Python filesystems (fsspec's s3fs, gcsfs,
adlfs and the like), whose clients raise their own classes, often chained:
s3fs turns a read timeout into ``FSTimeoutError`` and, on its way out, into
an ``IndexError`` raised while handling it. So both questions are asked of
the whole chain (``__cause__``, else ``__context__``), not of the last error
alone.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import TypeVar

import pyarrow as pa

from arrowstream.errors import ConfigError

T = TypeVar("T")

__all__ = [
    "READ_ERRORS", "changed_under", "error_text", "pause", "refused", "retried", "retry_settings", "skippable",
    "transient",
]

#: What reading a file raises when the file is bad or unreachable: pyarrow's errors, ``OSError``
#: (fsspec's too), and ``IndexError``, which s3fs raises in place of a timed-out read (it looks
#: at the timeout's ``args[0]``, which is empty). Only these may skip a row group
#: (``on_error="skip"``, see :func:`skippable`); any other error of a read is still named (a
#: ``ShardError``), never skipped.
READ_ERRORS = (pa.ArrowInvalid, pa.ArrowIOError, OSError, IndexError)

#: Words of the errors worth another attempt: throttling, server errors, connections reset or timed out.
_TRANSIENT = (
    "SLOW_DOWN", "SlowDown", "SERVICE_UNAVAILABLE", "INTERNAL_FAILURE", "NETWORK_CONNECTION",
    "REQUEST_TIMEOUT", "Timeout was reached", "timed out", "Connection reset", "Broken pipe",
    "HTTP status 500", "HTTP status 502", "HTTP status 503", "HTTP status 504",
    # botocore's error codes (s3fs, through a ClientError it turns into an OSError)
    "(SlowDown)", "(ServiceUnavailable)", "(InternalError)", "(RequestTimeout)", "(Throttling)",
)

#: Classes of Python storage clients (by name, anywhere in an error's class hierarchy) worth
#: another attempt: botocore's and aiohttp's timeouts, dropped connections and cut bodies.
_TRANSIENT_CLASSES = frozenset({
    "ReadTimeoutError", "ConnectTimeoutError", "EndpointConnectionError", "ConnectionClosedError",
    "ResponseStreamingError", "IncompleteReadError", "ClientPayloadError", "ServerDisconnectedError",
    "ServerTimeoutError", "ClientConnectionError",
})

#: How far down a chain of errors to look.
_DEPTH = 8


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised from or while handling, outermost first."""
    out = [exc]
    while len(out) < _DEPTH and (nxt := out[-1].__cause__ or out[-1].__context__) is not None:
        out.append(nxt)
    return out


def transient(exc: BaseException) -> bool:
    """Return whether a storage error is worth retrying (throttling, a 5xx, a reset or timed-out connection).

    Any error of the chain may say so: a timeout or dropped connection
    (``TimeoutError``, ``ConnectionError`` or a storage client's class of
    them), or a text that names throttling or a server error (pyarrow's
    words, botocore's codes: s3fs turns a 503 SlowDown into ``OSError(EBUSY)``
    raised from botocore's ``ClientError``).

    Examples
    --------
    >>> transient(OSError("AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate."))
    True
    >>> transient(OSError("Parquet magic bytes not found in footer"))
    False
    >>> try:                        # as s3fs does with a read that timed out
    ...     try:
    ...         raise TimeoutError()
    ...     except TimeoutError:
    ...         raise IndexError("tuple index out of range")
    ... except IndexError as exc:
    ...     transient(exc)
    True
    >>> transient(PermissionError("Forbidden"))
    False
    """
    for link in _chain(exc):
        if isinstance(link, (TimeoutError, ConnectionError)):
            return True
        if _TRANSIENT_CLASSES.intersection(c.__name__ for c in type(link).__mro__):
            return True
        if any(word in str(link) for word in _TRANSIENT):
            return True
    return False


#: Words of a refusal: the object is not there or not ours to read (pyarrow's clients, botocore's).
_REFUSED = (
    "ACCESS_DENIED", "AccessDenied", "Forbidden", "HTTP status 403", "NoSuchKey", "NoSuchBucket", "NOT_FOUND",
    "NO_SUCH_KEY", "NO_SUCH_BUCKET", "RESOURCE_NOT_FOUND", "HTTP status 404",  # pyarrow's spellings of them
)


def refused(exc: BaseException) -> bool:
    """Return whether a storage error is a refusal (access denied, no such object): never a file's bad bytes.

    Examples
    --------
    >>> refused(PermissionError("Forbidden")), refused(OSError("AWS Error ACCESS_DENIED during GetObject"))
    (True, True)
    >>> refused(OSError("AWS Error NO_SUCH_KEY during GetObject operation: The specified key does not exist."))
    True
    >>> refused(OSError("Corrupt snappy compressed data."))
    False
    """
    for link in _chain(exc):
        if isinstance(link, (PermissionError, FileNotFoundError)):
            return True
        if isinstance(link, (OSError, pa.ArrowIOError)) and any(word in str(link) for word in _REFUSED):
            return True
    return False


def changed_under(exc: BaseException) -> bool:
    """Return whether a read error says the object changed while it was read (fsspec's ``FileExpired``).

    Examples
    --------
    >>> class FileExpired(OSError): ...
    >>> changed_under(FileExpired("the ETag changed")), changed_under(OSError("Corrupt snappy compressed data."))
    (True, False)
    """
    return any(type(link).__name__ == "FileExpired" for link in _chain(exc))


def skippable(exc: BaseException) -> bool:
    """Return whether an error reading a row group may skip it (``on_error="skip"``): its bytes do not decode.

    Not a transient error (it is tried again), not a refusal (access denied,
    no such object: the storage's or the credentials' doing, which skipping
    would turn into a whole file lost), not an error of another kind (a bug).

    Examples
    --------
    >>> skippable(OSError("Corrupt snappy compressed data.")), skippable(PermissionError("Forbidden"))
    (True, False)
    >>> skippable(OSError("AWS Error SLOW_DOWN during GetObject")), skippable(KeyError("x"))
    (False, False)
    """
    return isinstance(exc, READ_ERRORS) and not transient(exc) and not refused(exc)


def error_text(exc: BaseException) -> str:
    """Return ``str(exc)``, and what it was raised while handling, when a chained error says more.

    Examples
    --------
    >>> error_text(OSError("Parquet magic bytes not found in footer"))
    'Parquet magic bytes not found in footer'
    >>> try:
    ...     try:
    ...         raise ConnectionResetError("Connection reset by peer")
    ...     except ConnectionResetError:
    ...         raise IndexError("tuple index out of range")
    ... except IndexError as exc:
    ...     error_text(exc)
    'tuple index out of range (IndexError, raised while handling ConnectionResetError: Connection reset by peer)'
    """
    text = str(exc) or type(exc).__name__
    said = next((link for link in _chain(exc)[1:] if str(link) and str(link) not in text), None)
    if said is None:
        return text
    return f"{text} ({type(exc).__name__}, raised while handling {type(said).__name__}: {said})"


def retry_settings() -> tuple[int, float]:
    """Return (attempts, first backoff in seconds) of a read: ``ARROWSTREAM_READ_ATTEMPTS`` (3), ``ARROWSTREAM_READ_BACKOFF`` (0.5)."""
    try:
        attempts = int(os.environ.get("ARROWSTREAM_READ_ATTEMPTS", "3"))
        backoff = float(os.environ.get("ARROWSTREAM_READ_BACKOFF", "0.5"))
    except ValueError as exc:
        raise ConfigError(f"ARROWSTREAM_READ_ATTEMPTS and ARROWSTREAM_READ_BACKOFF should be numbers: {exc}") from exc
    if attempts < 1 or backoff < 0:
        raise ConfigError(
            f"ARROWSTREAM_READ_ATTEMPTS should be at least 1 and ARROWSTREAM_READ_BACKOFF at least 0, got "
            f"{attempts} and {backoff}"
        )
    return attempts, backoff


def pause(backoff: float, attempt: int) -> None:
    """Wait before attempt ``attempt + 1``: exponential from ``backoff`` seconds, with jitter."""
    time.sleep(backoff * 2 ** (attempt - 1) * (0.5 + random.random()))


def retried(call: Callable[[], T]) -> T:
    """Return ``call()``, called again after a transient error as the read settings allow; the last error raises.

    Examples
    --------
    >>> tries = []
    >>> def flaky():
    ...     tries.append(1)
    ...     if len(tries) < 2:
    ...         raise ConnectionResetError("Connection reset by peer")
    ...     return "listed"
    >>> import os; os.environ["ARROWSTREAM_READ_BACKOFF"] = "0"
    >>> retried(flaky), len(tries)
    ('listed', 2)
    >>> del os.environ["ARROWSTREAM_READ_BACKOFF"]
    """
    attempts, backoff = retry_settings()
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except Exception as exc:
            if isinstance(exc, MemoryError) or attempt == attempts or not transient(exc):
                raise
            pause(backoff, attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")
