"""Finding a dataset's files: a path, glob, list of files or URI, on any filesystem.

:func:`discover` resolves the filesystem (``pyarrow.fs``, an fsspec
filesystem, or one inferred from a URI), lists directories recursively (hidden
``.``/``_`` entries skipped), matches globs segment by segment (``*`` within
one segment, ``**`` across any number) and returns every Parquet file with its
size, sorted by its path relative to the common root of the sources.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from arrowstream.errors import ConfigError, ShardError
from arrowstream.io.failures import error_text, retried

__all__ = ["discover", "relpath", "resolve_filesystem"]

_GLOB_CHARS = "*?["


def resolve_filesystem(
    source: str | os.PathLike[str], filesystem: Any = None
) -> tuple[pafs.FileSystem, str]:
    """Return a ``pyarrow.fs`` filesystem and the path inside it for ``source``.

    ``filesystem`` may be a ``pyarrow.fs.FileSystem``, an fsspec filesystem
    (wrapped through ``pyarrow.fs.FSSpecHandler``) or ``None``, in which case a
    URI such as ``s3://bucket/prefix`` picks its filesystem and a plain path is
    local.

    Examples
    --------
    >>> fs, path = resolve_filesystem("/tmp")
    >>> type(fs).__name__, path
    ('LocalFileSystem', '/tmp')
    """
    text = os.fspath(source)
    if filesystem is None:
        if "://" in text:
            try:
                return pafs.FileSystem.from_uri(text)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
                raise ConfigError(
                    f"cannot resolve a filesystem for {text!r}: {exc}; pass `filesystem=` "
                    "(a pyarrow.fs.FileSystem or an fsspec filesystem)"
                ) from exc
        return pafs.LocalFileSystem(), os.path.abspath(text)
    if isinstance(filesystem, pafs.FileSystem):
        return filesystem, text
    if hasattr(filesystem, "ls") and hasattr(filesystem, "open"):  # an fsspec filesystem
        # fsspec paths carry no protocol and local ones are absolute
        return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem)), filesystem._strip_protocol(text)
    raise ConfigError(
        f"`filesystem` must be a pyarrow.fs.FileSystem or an fsspec filesystem, got "
        f"{type(filesystem).__name__!r}"
    )


def discover(
    sources: Sequence[str | os.PathLike[str]], filesystem: Any
) -> tuple[pafs.FileSystem, str, list[tuple[str, int, int | None]]]:
    """Return the filesystem, the common root of ``sources`` and (path, size, mtime in ns) of every Parquet file.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> d = tempfile.mkdtemp()
    >>> for name in ["b.parquet", "a/c.parquet", "_hidden/x.parquet", "notes.txt"]:
    ...     (pathlib.Path(d) / name).parent.mkdir(parents=True, exist_ok=True)
    ...     _ = (pathlib.Path(d) / name).write_bytes(b"PAR1")
    >>> fs, root, files = discover([d], None)
    >>> [relpath(path, root) for path, _, _ in files]
    ['a/c.parquet', 'b.parquet']
    """
    fs: pafs.FileSystem | None = None
    found: dict[str, tuple[int, int | None]] = {}
    roots: list[str] = []
    for item in sources:
        item_fs, path = resolve_filesystem(item, filesystem)
        if fs is None:
            fs = item_fs
        elif type(item_fs) is not type(fs):
            raise ConfigError(
                "all sources must live on one filesystem; got "
                f"{type(fs).__name__!r} and {type(item_fs).__name__!r}"
            )
        if any(c in path for c in _GLOB_CHARS):
            base = _glob_base(path)
            roots.append(base)
            for info in _list_files(fs, base, original=path):
                if _glob_match(info.path, path):
                    found[info.path] = (info.size, info.mtime_ns)
            continue
        try:
            info = retried(lambda: fs.get_file_info(path))  # type: ignore[union-attr]
        except Exception as exc:  # unreachable storage, bad credentials, a malformed path, a client's own class
            if isinstance(exc, MemoryError):
                raise
            raise ShardError(
                f"cannot look up {os.fspath(item)!r}: {error_text(exc)}; check the path or URI and the storage's "
                "credentials"
            ) from exc
        if info.type == pafs.FileType.NotFound:
            raise ShardError(f"path {os.fspath(item)!r} does not exist: check the path or URI")
        if info.type == pafs.FileType.Directory:
            roots.append(path.rstrip("/") or "/")
            for sub in _list_files(fs, path, original=path):
                if sub.path.endswith(".parquet") and not _is_hidden(sub.path, path):
                    found[sub.path] = (sub.size, sub.mtime_ns)
        else:
            roots.append(_parent(path))
            found[info.path] = (info.size, info.mtime_ns)
    assert fs is not None
    root = _common_root(roots)
    return fs, root, sorted(((p, *v) for p, v in found.items()), key=lambda kv: relpath(kv[0], root))


def _list_files(fs: pafs.FileSystem, base: str, *, original: str) -> list[pafs.FileInfo]:
    try:
        infos = retried(lambda: fs.get_file_info(pafs.FileSelector(base, recursive=True)))
    except Exception as exc:  # a transient error is tried again first; a client may raise a class of its own
        if isinstance(exc, MemoryError):
            raise
        raise ShardError(f"cannot list {original!r}: {error_text(exc)}") from exc
    if isinstance(fs, pafs.LocalFileSystem):
        _check_links(base)
    return [i for i in infos if i.type == pafs.FileType.File]


def _check_links(base: str) -> None:
    """Raise for a ``*.parquet`` symbolic link whose target is gone (the listing leaves it out silently)."""
    for folder, _, names in os.walk(base):
        for name in names:
            path = os.path.join(folder, name)
            broken = os.path.islink(path) and not os.path.exists(path)
            if name.endswith(".parquet") and broken and not _is_hidden(path, base):
                raise ShardError(
                    f"{path!r} is a symbolic link to {os.readlink(path)!r}, which does not exist: fix or "
                    "remove the link (its rows would be missing from the dataset)"
                )


def _is_hidden(path: str, base: str) -> bool:
    return any(_hidden(part) for part in relpath(path, base).split("/"))


def _glob_base(pattern: str) -> str:
    parts = pattern.split("/")
    keep = []
    for part in parts:
        if any(c in part for c in _GLOB_CHARS):
            break
        keep.append(part)
    return "/".join(keep) or "/"


def _parent(path: str) -> str:
    head = path.rsplit("/", 1)[0] if "/" in path else ""
    return head or "/"


def _common_root(roots: list[str]) -> str:
    split = [r.rstrip("/").split("/") for r in roots]
    common = split[0]
    for parts in split[1:]:
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    return "/".join(common) or "/"


def relpath(path: str, root: str) -> str:
    """Return ``path`` relative to ``root`` (both as the filesystem spells them)."""
    p, r = path.lstrip("/"), root.strip("/")
    if not r:
        return p
    return p[len(r) + 1 :] if p.startswith(r + "/") else p


def _glob_match(path: str, pattern: str) -> bool:
    """Match ``path`` against ``pattern`` segment by segment: ``*`` stays inside one
    segment, ``**`` spans any number; hidden (``.``/``_``) segments match only when
    the pattern spells them."""
    return _match_parts(path.strip("/").split("/"), pattern.strip("/").split("/"))


def _match_parts(parts: list[str], pats: list[str]) -> bool:
    if not pats:
        return not parts
    if pats[0] == "**":
        return any(
            _match_parts(parts[i:], pats[1:])
            for i in range(len(parts) + 1)
            if not any(_hidden(p) for p in parts[:i])
        )
    if not parts:
        return False
    if _hidden(parts[0]) and not _hidden(pats[0]):
        return False
    return fnmatch.fnmatchcase(parts[0], pats[0]) and _match_parts(parts[1:], pats[1:])


def _hidden(segment: str) -> bool:
    return segment.startswith((".", "_"))
