"""A tokenizer and the facts a pipeline needs of it, loaded only when something must encode with it.

Before its first batch a pipeline needs a few facts of its tokenizer: its
hash (the key of the encoder's verdicts and kept compiled forms, of token
caches, length indexes and saved states), its special tokens (to find the
EOS), its number of entries (an ``eos_id`` below it is a real id), and
whether padding or truncation is on (both are refused). Reading them needs the tokenizer loaded, and loading a
``tokenizer.json`` takes time that grows with its vocabulary: 0.33 s for a
128k byte-level BPE on this machine, and 0.08 s more to hash its JSON. A
process whose encoder's verdict is on disk (a restart, an evaluation job, a
spawned DataLoader worker) then encodes with tokie or tiktoken, from their own
kept forms (:mod:`arrowstream.tokenize.compiled`), and never with the
tokenizer itself.

So a :class:`TokenizerSource` given a file keeps its facts in the verdicts'
directory, ``<key>.facts``, the key made of the file's SHA-256, the
``tokenizers`` version and :data:`_FORMAT`; a later process reads the file's
bytes (7 ms for 9 MB), finds the facts, and loads the tokenizer only when
something encodes with it (:meth:`TokenizerSource.get`).

The first process loads it to prove tokie and tiktoken against it; once
they are, the stream never uses it. Encoders hold their source while they
may still use the reference, and the last one to let go unloads a file's
tokenizer (:meth:`TokenizerSource.let_go`): at 128k tokens, about 40 MB
less for the rest of that process.

Invariants:

- the facts are those of the file's exact bytes: the key is their SHA-256,
  and a lazy load checks the bytes it parses have that digest, so a file
  changed after the pipeline was built is refused, never used with another
  tokenizer's facts;
- a facts file that is unreadable, for another key or of another shape
  counts as none: the tokenizer is loaded and the facts written again
  (under a temporary name, then renamed); a directory that cannot be
  written costs time, never correctness;
- a source given a ``tokenizers.Tokenizer`` (or a transformers fast
  tokenizer) holds it, and reads its facts from it at once.

Pipelines naming one file share one source per process while the file's
size and modification time stay the same, so a mixture of n sources parses
its tokenizer at most once. Thread safety: loading holds a module lock, made
anew in a forked child (a DataLoader worker).

Examples
--------
>>> import tempfile
>>> from pathlib import Path
>>> from arrowstream.testing.data import sample_tokenizer
>>> where = Path(tempfile.mkdtemp())
>>> sample_tokenizer(300).save(str(where / "tokenizer.json"))
>>> first = TokenizerSource.of(where / "tokenizer.json", where / "cache")   # loaded, facts kept
>>> first.loaded, first.facts.eos_id()
(True, 0)
>>> _forget_sources()                                        # as a new process
>>> later = TokenizerSource.of(where / "tokenizer.json", where / "cache")
>>> later.loaded, later.hash == first.hash                   # the facts, without the tokenizer
(False, True)
>>> later.get().token_to_id("<|endoftext|>"), later.loaded   # loaded when something encodes
(0, True)
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import weakref
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import Tokenizer

from arrowstream.core.allocator import release_freed_memory
from arrowstream.errors import ConfigError
from arrowstream.io.forksafe import new_locks_in_forked_children
from arrowstream.tokenize.tokenizer import (
    _EOS_NAMES,
    _load_tokenizer,
    _special_tokens,
    largest_id_past,
    refuse_settings,
    tokenizer_file,
    tokenizer_hash,
)

__all__ = ["TokenizerFacts", "TokenizerSource", "as_tokenizer"]

#: Bump when the facts kept or how they are found change: older files are then ignored.
_FORMAT = 1

_lock = threading.Lock()
#: Sources of files, by (real path, size, modification time), most recent last; see ``TokenizerSource.of``.
_sources: OrderedDict[tuple[str, int, int], TokenizerSource] = OrderedDict()
_MAX_SOURCES = 8


new_locks_in_forked_children(globals(), "_lock")


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenizerFacts:
    """What a pipeline needs of a tokenizer before encoding: hash, special tokens, id range, refused settings.

    Examples
    --------
    >>> from arrowstream.testing.data import sample_tokenizer
    >>> facts = TokenizerFacts.of(sample_tokenizer(300))
    >>> facts.eos_id(), facts.size
    (0, 300)
    """

    hash: str
    specials: dict[str, int] = field(hash=False)
    size: int  # entries, added tokens included: a lower bound of the largest id plus one (ids may have gaps)
    padding: bool
    truncation: int | None  # the length it truncates to, 0 when it names none; None: off

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> TokenizerFacts:
        """Read the facts of a loaded tokenizer."""
        truncation = tokenizer.truncation
        return cls(
            hash=tokenizer_hash(tokenizer),
            specials=_special_tokens(tokenizer),
            size=tokenizer.get_vocab_size(with_added_tokens=True),
            padding=tokenizer.padding is not None,
            truncation=None if truncation is None else int(truncation.get("max_length") or 0),
        )

    def check(self) -> None:
        """Refuse settings that make ids depend on batching or cut documents silently.

        Raises
        ------
        ConfigError
            Padding or truncation is enabled.
        """
        refuse_settings(padding=self.padding, truncation=self.truncation)

    def eos_id(self) -> int | None:
        """Return the id of the end-of-text special token by its usual names, or ``None``."""
        return next((self.specials[name] for name in _EOS_NAMES if name in self.specials), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> TokenizerFacts | None:
        """The facts from :meth:`to_json`'s output, or ``None`` if it has another shape."""
        try:
            facts = cls(**data)
        except TypeError:
            return None
        ints = (facts.size, *facts.specials.values())
        if (
            not isinstance(facts.hash, str) or len(facts.hash) != 32 or not isinstance(facts.specials, dict)
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in ints)
            or not all(isinstance(k, str) for k in facts.specials)
            or not isinstance(facts.padding, bool)
            or not (facts.truncation is None or isinstance(facts.truncation, int))
        ):
            return None
        return facts


class TokenizerSource:
    """A tokenizer, loaded now (given as an object) or when first needed (given as a file whose facts are kept).

    Build one with :meth:`of`. :attr:`facts` and :attr:`hash` never load a
    file's tokenizer; :meth:`get` does, once.
    """

    def __init__(
        self, *, facts: TokenizerFacts, tokenizer: Tokenizer | None = None, path: str | None = None, digest: str = ""
    ) -> None:
        self.facts = facts
        self.path = path
        self.digest = digest  # SHA-256 of the file's bytes ("" for a tokenizer given as an object)
        self._tokenizer = tokenizer
        self._holders: weakref.WeakSet[object] = weakref.WeakSet()  # see hold()

    @classmethod
    def of(
        cls, tokenizer: TokenizerSource | Tokenizer | Any | str | os.PathLike[str], cache_dir: Path | None
    ) -> TokenizerSource:
        """Return the source of ``tokenizer``: a ``tokenizers.Tokenizer``, a transformers fast tokenizer, or a ``tokenizer.json`` path (or the directory holding it).

        ``cache_dir`` is the verdicts' directory where a file's facts are kept
        (``None``: the file is loaded now, every time).

        Raises
        ------
        ConfigError
            The path does not exist or is not a tokenizers JSON file, or the
            object is not a tokenizer.
        """
        if isinstance(tokenizer, TokenizerSource):
            return tokenizer
        if not isinstance(tokenizer, (str, os.PathLike)):
            loaded = _load_tokenizer(tokenizer)
            return cls(facts=TokenizerFacts.of(loaded), tokenizer=loaded)
        path = tokenizer_file(os.fspath(tokenizer))
        st = os.stat(path)
        memo = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
        with _lock:
            if memo in _sources:
                _sources.move_to_end(memo)
                return _sources[memo]
        source = _from_file(path, cache_dir)
        with _lock:
            _sources[memo] = source
            while len(_sources) > _MAX_SOURCES:
                _sources.popitem(last=False)
        return source

    @property
    def hash(self) -> str:
        """The tokenizer's hash (:func:`~arrowstream.tokenize.tokenizer.tokenizer_hash`)."""
        return self.facts.hash

    @property
    def loaded(self) -> bool:
        """Whether the tokenizer itself is loaded in this process."""
        return self._tokenizer is not None

    def get(self) -> Tokenizer:
        """Return the tokenizer, loading its file now if not yet done.

        Raises
        ------
        ConfigError
            The file is gone, or its bytes are no longer those the facts
            were read from.
        """
        loaded = self._tokenizer
        if loaded is not None:
            return loaded
        with _lock:
            if self._tokenizer is None:
                assert self.path is not None  # a source given an object holds it
                self._tokenizer = _parse(self.path, _read(self.path), want=self.digest)
            return self._tokenizer

    def hold(self, user: object) -> None:
        """Keep the tokenizer loaded (once loaded) while ``user`` may still need it; see :meth:`let_go`."""
        with _lock:
            self._holders.add(user)

    def let_go(self, user: object) -> bool:
        """``user`` no longer needs the tokenizer: unload a file's tokenizer once no holder is left; return whether unloaded.

        An encoder holds its source while it proves tiktoken or tokie against
        the tokenizer, and lets go once they are proven: a 128k-token
        tokenizer is 50-90 MB that the rest of the stream never uses. Should
        something need it after all (a text the fast backends route to it),
        :meth:`get` loads it again. A tokenizer given as an object stays.

        Examples
        --------
        >>> import os, tempfile
        >>> from arrowstream.testing.data import sample_tokenizer
        >>> path = os.path.join(tempfile.mkdtemp(), "tokenizer.json")
        >>> sample_tokenizer(300).save(path)
        >>> class User: ...                         # holders are weakly referenced
        >>> source, a, b = TokenizerSource.of(path, None), User(), User()
        >>> source.hold(a); source.hold(b)
        >>> source.let_go(a), source.loaded      # b still holds it
        (False, True)
        >>> source.let_go(b), source.loaded
        (True, False)
        >>> source.get().token_to_id("<|endoftext|>"), source.loaded
        (0, True)
        """
        with _lock:
            self._holders.discard(user)
            if self._holders or self.path is None or self._tokenizer is None:
                return False
            self._tokenizer = None
        release_freed_memory(anytime=True)
        return True

    def largest_id_past(self, token_id: int) -> int | None:
        """Return the tokenizer's largest id when ``token_id`` is past it, else ``None`` (loads it only past :attr:`TokenizerFacts.size`)."""
        return None if token_id < self.facts.size else largest_id_past(self.get(), token_id)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self.path is not None:  # a file: the new process loads it only if it must, and checks it is the same
            state["_tokenizer"] = None
        del state["_holders"]  # the unpickled encoders hold it again
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._holders = weakref.WeakSet()

    def __repr__(self) -> str:
        return f"TokenizerSource({self.path or 'object'!r}, hash={self.hash[:12]!r}, loaded={self.loaded})"


def as_tokenizer(tokenizer: Tokenizer | TokenizerSource) -> Tokenizer:
    """Return ``tokenizer``, or the source's tokenizer (loaded now if need be)."""
    return tokenizer.get() if isinstance(tokenizer, TokenizerSource) else tokenizer


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read tokenizer file {path!r}: {exc}") from exc


def _parse(path: str, data: bytes, *, want: str = "") -> Tokenizer:
    """Load the tokenizer from ``data`` (the bytes of ``path``); with ``want``, refuse bytes of another digest."""
    if want and hashlib.sha256(data).hexdigest() != want:
        raise ConfigError(
            f"tokenizer file {path!r} changed after this pipeline was built from it (SHA-256 "
            f"{want[:12]}..., now {hashlib.sha256(data).hexdigest()[:12]}...): build the pipeline "
            "again, and keep a tokenizer file unchanged while pipelines use it"
        )
    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        raise ConfigError(f"cannot load tokenizer {path!r}: {exc}") from exc
    release_freed_memory(anytime=True)  # the parse's own garbage: 53 MB at 128k tokens, otherwise kept resident
    return tokenizer


def _from_file(path: str, cache_dir: Path | None) -> TokenizerSource:
    """The source of a tokenizer file: its facts from ``cache_dir`` if kept there, else read from it loaded (then kept)."""
    data = _read(path)
    digest = hashlib.sha256(data).hexdigest()
    key = hashlib.sha256(f"{digest} {tokenizers.__version__} {_FORMAT}".encode()).hexdigest()[:32]
    kept = None if cache_dir is None else cache_dir / f"{key}.facts"
    if kept is not None:
        facts = _read_facts(kept, key)
        if facts is not None:
            return TokenizerSource(facts=facts, path=path, digest=digest)
    tokenizer = _parse(path, data)
    facts = TokenizerFacts.of(tokenizer)
    if kept is not None:
        _write_facts(kept, key, facts)
    return TokenizerSource(facts=facts, tokenizer=tokenizer, path=path, digest=digest)


def _read_facts(path: Path, key: str) -> TokenizerFacts | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != _FORMAT or record.get("key") != key:
        return None
    return TokenizerFacts.from_json(record.get("facts"))


def _write_facts(path: Path, key: str, facts: TokenizerFacts) -> None:
    """Write the facts under a temporary name, then rename; never raises (a cache that cannot be written costs time)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"format": _FORMAT, "key": key, "facts": facts.to_json()}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


def _forget_sources() -> None:
    """Drop this process's sources, as a new process starts (tests, examples)."""
    with _lock:
        _sources.clear()
