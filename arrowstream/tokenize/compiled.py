"""A tokenizer's compiled forms, kept beside the verdicts so that a later process loads them at once.

Both fast backends start from work that grows with the vocabulary and that
every process paid: every restart, evaluation job and spawned DataLoader
worker. Measured here for a 128k byte-level BPE: tokie builds its encoder
from the ``tokenizer.json`` in about 0.6 s, and converting the tokenizer for
tiktoken (:func:`~arrowstream.tokenize.bytelevel.to_bytelevel_bpe`) takes
about 1 s (a few thousand tokens: 0.01 and 0.05 s). This module keeps what
they make in the verdicts' directory, under the encoder's key (the
tokenizer's hash, its options and the library versions: see
:mod:`arrowstream.tokenize.verdicts`):

- ``<key>.tkz``: tokie's own binary form (its ``save``), loaded in about a
  twentieth of the time (:func:`load_tokie`), kept once the tokenizer's
  verdict proves tokie (:func:`keep_tokie`, after the built-in checks, off
  the path to the first batch);
- ``<key>.bpe.npz``: the conversion's token bytes, values and id map, the
  rest of it in the meta file (:func:`load_bytelevel`);

each with ``<file>.meta`` beside it: a JSON record of the format, the key,
the file's size and SHA-256, and for the conversion its other fields.

Invariants:

- a compiled form is kept only if, read back, it equals what was made from
  the JSON (tokie's: the same ids on every probe text of
  :func:`~arrowstream.tokenize.probes.probe_texts`; the conversion: equal
  fields);
- a file is written under a temporary name and renamed, then its meta file,
  so a reader finds a whole pair, or a pair that does not match and is
  ignored;
- a file whose size or SHA-256 is not the recorded one is never read (a cut
  ``.tkz`` makes tokie's loader panic): the pair is deleted, the form made
  from the JSON again and kept anew;
- with no cache directory (``ARROWSTREAM_CACHE_DIR=off``), or one that
  cannot be written, nothing is kept and every process makes the forms
  from the JSON: slower, never wrong.

Examples
--------
>>> import tempfile
>>> from pathlib import Path
>>> from arrowstream.testing.data import sample_tokenizer
>>> tok, where = sample_tokenizer(300), Path(tempfile.mkdtemp())
>>> first = load_tokie(tok, "doc-example", where)           # built from the JSON
>>> keep_tokie(first, "doc-example", where)                 # kept (an encoder does so once tokie is proven)
>>> sorted(p.name for p in where.iterdir())
['doc-example.tkz', 'doc-example.tkz.meta']
>>> again = load_tokie(tok, "doc-example", where)           # loaded from the kept file
>>> again.encode("The river is quiet.", True).ids == first.encode("The river is quiet.", True).ids
True
>>> spec = load_bytelevel(tok, "doc-example", where, add_special_tokens=True)   # converted, then kept
>>> load_bytelevel(tok, "doc-example", where, add_special_tokens=True).ranks == spec.ranks
True
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from arrowstream.core.allocator import release_freed_memory
from arrowstream.io.forksafe import new_locks_in_forked_children
from arrowstream.tokenize.bytelevel import ByteLevelBPE, to_bytelevel_bpe
from arrowstream.tokenize.source import TokenizerSource, as_tokenizer

try:  # optional: `pip install arrowstream[fast]`
    import tokie
except ImportError:  # pragma: no cover - load_tokie's callers check first
    tokie = None

__all__ = ["conversion_kept", "keep_tokie", "load_bytelevel", "load_tokie"]

#: Bump when what is kept, how it is checked, or the conversion changes: older files are then ignored.
_FORMAT = 1

_lock = threading.Lock()
#: ``(key, path)`` of the tokie forms this process loaded from a kept file or kept itself.
_kept_here: set[tuple[str, Path]] = set()


new_locks_in_forked_children(globals(), "_lock")


def load_tokie(tokenizer: Tokenizer | TokenizerSource, key: str, cache_dir: Path | None) -> Any:
    """Return ``tokenizer`` loaded into tokie: from the file kept under ``key`` in ``cache_dir`` if whole, else from its JSON.

    ``cache_dir`` is the verdicts' directory, or ``None``: build from the JSON.
    A source's tokenizer is loaded only to build from the JSON. Nothing is written here: :func:`keep_tokie` keeps the form once the
    tokenizer's verdict proves tokie.
    """
    binary = None if cache_dir is None else cache_dir / f"{key}.tkz"
    if binary is not None and _read_kept(binary, key) is not None:
        try:
            loaded = tokie.Tokenizer.from_file(str(binary))
        except BaseException as exc:  # tokie reports a bad file as TokieError, or a Rust panic (a BaseException)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            _discard(binary)
        else:
            with _lock:
                _kept_here.add((key, binary))
            return loaded
    with _lock:  # none kept there now, whatever this process did before: keep_tokie writes it again
        _kept_here.discard((key, binary))
    built = _from_json(as_tokenizer(tokenizer))
    release_freed_memory(anytime=True)  # the build's own garbage: about 60 MB at 128k tokens, otherwise kept resident
    return built


def keep_tokie(built: Any, key: str, cache_dir: Path | None) -> None:
    """Keep ``built`` (tokie's encoder for the tokenizer of ``key``) in ``cache_dir``, unless loaded from there or kept already; never raises.

    It is kept only if, saved and loaded back, it encodes every probe text
    as ``built`` does. Costs about 0.15 s (the probes encoded twice, the
    probe set made if no check made it yet); once per key and directory in
    a process. The copy loaded back is handed back to the kernel after.
    """
    if cache_dir is None:
        return
    binary = cache_dir / f"{key}.tkz"
    with _lock:
        if (key, binary) in _kept_here:
            return
        _kept_here.add((key, binary))
    _keep_tokie(built, binary, key)
    release_freed_memory(anytime=True)  # the copy loaded back to check it: tens of MB at 128k tokens


def conversion_kept(key: str, cache_dir: Path | None) -> bool:
    """Whether the tiktoken conversion of ``key`` is kept in ``cache_dir``, for :func:`load_bytelevel` to read back.

    Examples
    --------
    >>> conversion_kept("0123abcd", None)
    False
    """
    return cache_dir is not None and _bytelevel_path(key, cache_dir).is_file()


def _bytelevel_path(key: str, cache_dir: Path) -> Path:
    return Path(cache_dir) / f"{key}.bpe.npz"


def load_bytelevel(
    tokenizer: Tokenizer | TokenizerSource, key: str, cache_dir: Path | None, *, add_special_tokens: bool
) -> ByteLevelBPE:
    """Return ``tokenizer`` converted for tiktoken: the conversion kept under ``key`` if whole, else made now (then kept).

    A source's tokenizer is loaded only to convert it.

    Raises
    ------
    Unconvertible
        As :func:`~arrowstream.tokenize.bytelevel.to_bytelevel_bpe` (a
        refusal is not kept: it is found again, quickly, by the next process).
    """
    path = None if cache_dir is None else _bytelevel_path(key, cache_dir)
    if path is not None:
        kept = _read_kept(path, key)
        if kept is not None:
            try:
                return _bytelevel_from(*kept)
            except (ValueError, KeyError, TypeError, OSError):
                _discard(path)
    release_freed_memory(anytime=True)  # what the stream freed first: the conversion's transients would come on top
    spec = to_bytelevel_bpe(as_tokenizer(tokenizer), add_special_tokens=add_special_tokens)
    data, fields = _bytelevel_to(spec)
    back = _bytelevel_from(data, fields)
    if not _same(back, spec):
        return spec
    if path is not None:
        _write_kept(path, key, data, fields)
    # The conversion's objects sit among its garbage (a parsed JSON, merge tables) and keep those
    # arenas resident: use the spec read back from its compact form instead, 25 MB fewer at 128k
    # tokens (docs/encoders.md, the first process's memory).
    del spec
    release_freed_memory(anytime=True)
    return back


# -- tokie ---------------------------------------------------------------------------------


def _from_json(tokenizer: Tokenizer) -> Any:
    """Build tokie's encoder from ``tokenizer``'s JSON (tokie's ``from_json`` takes a path only)."""
    fd, path = tempfile.mkstemp(prefix="arrowstream-tokie-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(tokenizer.to_str())
        return tokie.Tokenizer.from_json(path)
    finally:
        os.unlink(path)


def _keep_tokie(built: Any, binary: Path, key: str) -> None:
    """Keep ``built`` if, loaded back, it encodes the probe texts as ``built`` does; never raises."""
    from arrowstream.tokenize.probes import probe_texts  # the probe set is built on first use

    tmp = binary.with_name(f".{binary.name}.{os.getpid()}.{threading.get_ident()}.save")
    try:
        binary.parent.mkdir(parents=True, exist_ok=True)
        built.save(str(tmp))
        back = tokie.Tokenizer.from_file(str(tmp))
        texts = list(probe_texts())
        mine, theirs = built.encode_batch_flat(texts, True), back.encode_batch_flat(texts, True)
        if mine[0].tobytes() == theirs[0].tobytes() and mine[1].tobytes() == theirs[1].tobytes():
            _write_kept(binary, key, tmp.read_bytes(), {})
        # else: tokie's own round trip changed the ids; build from the JSON every time
    except BaseException as exc:  # a cache that cannot be written costs time, never correctness (tokie may panic)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
    finally:
        _discard_quietly(tmp)


# -- the tiktoken conversion -------------------------------------------------------------------


def _bytelevel_to(spec: ByteLevelBPE) -> tuple[bytes, dict[str, Any]]:
    """``spec`` as the bytes of an ``.npz`` (token bytes, lengths, values, id map) and the fields of its meta file."""
    tokens = list(spec.ranks)
    arrays = {
        "token_bytes": np.frombuffer(b"".join(tokens), dtype=np.uint8),
        "lengths": np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens)),
        "values": np.fromiter(spec.ranks.values(), dtype=np.int64, count=len(tokens)),
    }
    if spec.rank_to_id is not None:
        arrays["rank_to_id"] = np.asarray(spec.rank_to_id)
    out = io.BytesIO()
    np.savez(out, **arrays)
    fields = {
        "pattern": spec.pattern, "specials": spec.specials, "prefix": list(spec.prefix),
        "suffix": list(spec.suffix), "dropped": spec.dropped,
    }
    return out.getvalue(), fields


def _same(a: ByteLevelBPE, b: ByteLevelBPE) -> bool:
    """Whether two conversions are equal, field by field (the id maps as arrays, dtype included)."""
    maps = (a.rank_to_id, b.rank_to_id)
    if (maps[0] is None) != (maps[1] is None) or (
        maps[0] is not None and (maps[0].dtype != maps[1].dtype or not np.array_equal(*maps))
    ):
        return False
    return (a.pattern, a.ranks, a.specials, a.prefix, a.suffix, a.dropped) == (
        b.pattern, b.ranks, b.specials, b.prefix, b.suffix, b.dropped
    )


def _bytelevel_from(data: bytes, fields: dict[str, Any]) -> ByteLevelBPE:
    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        blob = arrays["token_bytes"].tobytes()
        ends = np.cumsum(arrays["lengths"]).tolist()
        values = arrays["values"].tolist()
        rank_to_id = arrays["rank_to_id"] if "rank_to_id" in arrays.files else None
    starts = [0, *ends[:-1]]
    return ByteLevelBPE(
        pattern=fields["pattern"],
        ranks={blob[a:b]: v for a, b, v in zip(starts, ends, values)},
        specials=dict(fields["specials"]),
        rank_to_id=rank_to_id,
        prefix=tuple(fields["prefix"]),
        suffix=tuple(fields["suffix"]),
        dropped=int(fields["dropped"]),
    )


# -- kept files ------------------------------------------------------------------------------------


def _meta(path: Path) -> Path:
    return path.with_name(path.name + ".meta")


def _read_kept(path: Path, key: str) -> tuple[bytes, dict[str, Any]] | None:
    """Return the kept file's bytes and its meta record's fields if both are whole and for ``key``; else ``None`` (a damaged pair is deleted)."""
    try:
        record = json.loads(_meta(path).read_text(encoding="utf-8"))
        data = path.read_bytes()
    except (OSError, ValueError):
        return None
    if (
        not isinstance(record, dict)
        or record.get("format") != _FORMAT
        or record.get("key") != key
        or record.get("size") != len(data)
        or record.get("sha256") != hashlib.sha256(data).hexdigest()
    ):
        _discard(path)
        return None
    return data, record.get("fields", {})


def _write_kept(path: Path, key: str, data: bytes, fields: dict[str, Any]) -> None:
    """Write ``data`` to ``path``, then its meta record, each under a temporary name renamed; never raises."""
    tag = f".{os.getpid()}.{threading.get_ident()}.tmp"
    tmp, tmp_meta = path.with_name(path.name + tag), _meta(path).with_name(_meta(path).name + tag)
    record = {"format": _FORMAT, "key": key, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "fields": fields}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        tmp_meta.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, path)
        os.replace(tmp_meta, _meta(path))
    except OSError:  # a cache that cannot be written costs time, never correctness
        pass
    finally:
        _discard_quietly(tmp)
        _discard_quietly(tmp_meta)


def _discard(path: Path) -> None:
    """Delete a kept file and its meta record (either may be gone already)."""
    _discard_quietly(path)
    _discard_quietly(_meta(path))


def _discard_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
