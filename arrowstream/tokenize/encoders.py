"""Encoders: texts to token ids, through the fastest backend proven to give the tokenizer's ids.

An :class:`Encoder` wraps a ``tokenizers.Tokenizer`` and turns a list of texts
into one flat ``int32`` id array plus one length per text. It has three backends:

- ``"tokenizers"``: the tokenizer's own batch encoder, the reference;
- ``"tiktoken"``: for byte-level BPE tokenizers, the same vocabulary, merges,
  split pattern and added tokens loaded into tiktoken
  (:mod:`arrowstream.tokenize.bytelevel`), several times faster;
- ``"tokie"`` (when tokie is installed, ``arrowstream[fast]``): the same
  tokenizer.json loaded into tokie, faster again, for the tokenizers tiktoken
  takes; the few texts it splits differently go to tiktoken
  (:mod:`arrowstream.tokenize.tokie_backend`).

With ``backend="auto"`` tokie and tiktoken are used only when shown to give
the reference's ids, each in the same three steps (tokie on the texts it does
not route); a failure of tokie keeps tiktoken, one of tiktoken ``tokenizers``:

1. **conversion**: a tokenizer that is not byte-level BPE keeps ``tokenizers``
   quietly; a byte-level one with a setting tiktoken cannot reproduce (a
   normalizer, dropout, an unsupported pre-tokenizer, ...) keeps it with an
   :class:`~arrowstream.errors.EncoderFallbackWarning` that says which;
2. **built-in checks**: the text of every vocabulary token and a probe set
   (every code point of the Basic Multilingual Plane and a sample of the others
   in several contexts, so every byte that UTF-8 can hold; a few of every
   Unicode category; runs of every kind of whitespace and of digits;
   contractions; punctuation; many scripts; every added token, alone and in
   text; the empty string) must encode to the same ids with both backends.
   The verdict is cached by the tokenizer's hash (and the library versions) in
   the process and, with ``cache_dir``, on disk. Unless a verdict is cached,
   the checks run when step 3 is done (off the path to the first batch,
   whose ids come from the reference anyway), or at :meth:`Encoder.verify`;
3. **your documents**: the first ``sample_bytes`` of text the encoder sees are
   encoded by both backends and the reference's ids are the ones returned, so
   a mismatch is caught before any id from tiktoken leaves; after the sample
   passes, tiktoken alone encodes. With tokie, the sample has tiktoken encode
   only the texts tokie routes to it; should tokie be dropped, tiktoken gets
   a sample of its own (:mod:`arrowstream.tokenize.sampling`).

``backend="tiktoken"`` forces tiktoken (a refused conversion or a failed
built-in check raises :class:`~arrowstream.errors.ConfigError`; there is no
sample step) and ``backend="tokenizers"`` never converts. :attr:`Encoder.backend`
says which backend encodes now, :attr:`Encoder.reason` why.

Thread safety: :meth:`Encoder.encode` may run in several threads at once; both
backends release the GIL while encoding, and the sample bookkeeping holds a
lock. Determinism: a text's ids depend only on the text, never on the backend
(that is what the checks are for), so a pipeline's options hash and its saved
states are the same under either backend.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tiktoken
import tokenizers
from tokenizers import Tokenizer

from arrowstream.checks import check_int
from arrowstream.core.allocator import release_freed_memory
from arrowstream.errors import ConfigError
from arrowstream.tokenize.bytelevel import ByteLevelBPE, Unconvertible, check_bytelevel
from arrowstream.tokenize.checking import ChecksRun
from arrowstream.tokenize.fast import _convert, _Deferred, _encoding, _Fast, _flatten, reference_calls
from arrowstream.tokenize.probes import probe_texts
from arrowstream.tokenize.proof import check_backends
from arrowstream.tokenize.sampling import SAMPLE_DOC_CHARS, DocumentSample, _warn
from arrowstream.tokenize.tokie_backend import ROUTED_TEXTS, TokieBackend, tokie_version
from arrowstream.tokenize.source import TokenizerSource
from arrowstream.tokenize.tokenizer import load_tokenizer, tokenizer_hash
from arrowstream.tokenize.verdicts import _CHECKS_VERSION, _cached_verdict, _store_verdict, default_verdict_dir, documents_vouched

__all__ = ["BACKENDS", "REFERENCE_CALL_BYTES", "SAMPLE_DOC_CHARS", "Encoder", "load_tokenizer", "probe_texts", "reference_calls", "tokenizer_hash"]

#: The values of ``backend``.
BACKENDS = ("auto", "tiktoken", "tokenizers", "tokie")
#: Text per call of ``tokenizers``' batch encoder. Its ``Encoding`` objects hold about 25 bytes
#: per byte of text, and the C heap keeps what a call used: one call on a 2 MiB slice left the
#: process 50 MB larger for good, sixteen calls on 64 KiB 5 MB. The process that proves an
#: encoder (85 MB corpus, tiktoken) peaked at 460 MB with whole slices, 393 with 32 KiB calls
#: (356 for one that finds the verdict); the ``tokenizers`` backend streamed 2.0-2.1 M tokens/s
#: either way (2 cores).
REFERENCE_CALL_BYTES = 32 << 10


class Encoder(DocumentSample):
    """Encode texts with the tokenizer's ids, through tokie or tiktoken when that is proven identical.

    Parameters
    ----------
    tokenizer
        A ``tokenizers.Tokenizer``, the path of a ``tokenizer.json``, or its
        :class:`~arrowstream.tokenize.source.TokenizerSource`. A file is
        parsed only when something encodes with it once its facts are kept
        in ``cache_dir`` (:attr:`source`, :attr:`tokenizer`).
    backend
        ``"auto"`` (the fastest backend proven identical: tokie, with the
        texts it splits differently routed to tiktoken, then tiktoken, else
        ``tokenizers``), ``"tokie"`` or ``"tiktoken"`` (forced: raise if it
        cannot be built or fails the built-in checks) or ``"tokenizers"``.
    add_special_tokens
        Let the post-processor add its tokens (a BOS, say), as in
        ``tokenizer.encode(..., add_special_tokens=...)``.
    cache_dir
        Directory for the verdicts (the built-in checks' and the document
        sample's), one small JSON file per tokenizer hash, so that only the
        first process on a machine pays for the proof. ``"auto"``:
        :func:`~arrowstream.tokenize.verdicts.default_verdict_dir`
        (``~/.cache/arrowstream/encoders``, moved by ``ARROWSTREAM_CACHE_DIR``,
        turned off by ``ARROWSTREAM_CACHE_DIR=off``); ``None`` keeps them in
        this process only.
    sample_bytes
        Text of the first documents encoded by both backends before tiktoken
        alone is trusted (``backend="auto"``); the built-in checks run when it
        is done (or at :meth:`verify`). 0 skips this step and runs the checks
        when the encoder is built. A stored verdict whose sample was at least
        this long skips it (tiktoken encodes from the first document).

    Raises
    ------
    ConfigError
        An unknown ``backend`` or a bad option, or ``backend="tiktoken"`` or
        ``"tokie"`` for a tokenizer that cannot be converted or fails the checks
        (or ``"tokie"`` where tokie is not installed).

    Examples
    --------
    >>> from arrowstream.testing.data import sample_tokenizer
    >>> enc = Encoder(sample_tokenizer(300))
    >>> enc.backend  # "tiktoken" where tokie is not installed
    'tokie'
    >>> flat, lens = enc.encode(["The river is quiet.", "", "42<|endoftext|>"])
    >>> lens.tolist(), flat.dtype.name
    ([15, 0, 3], 'int32')
    >>> Encoder(sample_tokenizer(300), backend="tokenizers").encode(["42<|endoftext|>"])[0].tolist()
    [20, 18, 0]
    """

    def __init__(
        self,
        tokenizer: Tokenizer | TokenizerSource | str | os.PathLike[str],
        *,
        backend: str = "auto",
        add_special_tokens: bool = True,
        cache_dir: str | os.PathLike[str] | None = "auto",
        sample_bytes: int = 1 << 20,
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigError(f"`backend` must be one of {BACKENDS!r}, got {backend!r}")
        check_int("sample_bytes", sample_bytes, low=0)
        self.add_special_tokens = bool(add_special_tokens)
        self.requested = backend
        self.cache_dir = (
            default_verdict_dir() if cache_dir == "auto" else None if cache_dir is None else Path(cache_dir).expanduser()
        )
        self.source = TokenizerSource.of(tokenizer, self.cache_dir)
        self.sample_bytes = sample_bytes
        self.hash = self.source.hash
        self._lock = threading.Lock()
        self._spec: ByteLevelBPE | None = None  # set while tiktoken encodes
        self._fast: _Fast | _Deferred | None = None  # _Deferred: converted at its first text
        self._tokie: TokieBackend | None = None  # set while tokie encodes (the texts it does not route)
        self._tokie_failed = ""  # tokie's mismatch on a document seen before the checks ran
        self._checks_lock = threading.Lock()  # a document's mismatch against the checks' verdict being stored
        self._run: ChecksRun | None = None  # the built-in checks running beside the stream
        self._beside_bytes = self._grace = 0  # text the reference encoded beside the running checks, and may
        self._unstored = ""  # why the checks' verdict could not be written to disk, warned by the stream
        self._sample_left = self._sampled = 0
        self._pending = False  # built-in checks deferred to the end of the document sample
        self._earlier = False  # the document sample was done by an earlier process
        self._sampled_by = "tiktoken"  # "tokie": tiktoken saw only the sample's texts tokie routed to it
        self._pool_started = False  # this process used the tokenizer's batch encoder (its thread pool runs)
        self._keep_owed = False  # tokie proven here: its binary form is to be kept (sampling.py, _let_go_if_proven)
        self.checked: dict[str, int] = {}
        self._reason = "backend='tokenizers' was asked for"
        if backend != "tokenizers":
            self._choose(forced=backend in ("tiktoken", "tokie"))
        self._hold_reference()

    @property
    def tokenizer(self) -> Tokenizer:
        """The reference tokenizer, loaded now if it was given as a file and not loaded yet (see :attr:`source`)."""
        return self.source.get()

    # -- choosing -----------------------------------------------------------------

    def _key(self) -> str:
        parts = [self.hash, self.add_special_tokens, tiktoken.__version__, tokenizers.__version__, _CHECKS_VERSION]
        if self.requested != "tiktoken" and tokie_version() is not None:
            parts.append(f"tokie {tokie_version()}")
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]

    def _choose(self, *, forced: bool) -> None:
        key = self._key()
        if self._proven_tokie(key, forced=forced) or self._unproven_tokie(key, forced=forced):
            return
        try:
            spec, encoding = _convert(key, self.source, self.add_special_tokens, self.cache_dir)
        except Unconvertible as exc:
            self._refuse(exc, forced=forced)
            return
        self._spec, self._fast = spec, _Fast(spec, encoding)
        if self.requested == "tokie" and tokie_version() is None:
            raise ConfigError("`backend='tokie'` cannot be used: tokie is not installed; `pip install arrowstream[fast]`")
        if self.requested != "tiktoken" and tokie_version() is not None:
            self._tokie = self._load_tokie(key)
            self._sampled_by = "tokie"
        self._sample_left = 0 if forced else self.sample_bytes
        verdict = _cached_verdict(key, self.cache_dir, documents=self._sample_left)
        if verdict is not None and verdict["ok"] and documents_vouched(verdict, tokie=self._tokie is not None) >= self._sample_left:
            self._sample_left = 0  # an earlier process checked as many documents: trust tiktoken from the start
            self._sampled = int(verdict.get("documents", 0))
            self._earlier = True
        if verdict is None and self._sample_left:
            # Deferred: the reference's ids are emitted until the sample is done anyway,
            # so the checks run then, off the path to the first batch.
            self._pending = True
            return
        self._settle(verdict, forced=forced)

    def _proven_tokie(self, key: str, *, forced: bool) -> bool:
        """Take tokie at once where a stored verdict proves it (and tiktoken, for the texts it routes); return whether.

        tiktoken is then converted only when a routed text comes (:class:`~arrowstream.tokenize.fast._Deferred`).
        """
        if self.requested == "tiktoken" or tokie_version() is None:
            return False
        sample = 0 if forced else self.sample_bytes
        verdict = _cached_verdict(key, self.cache_dir, documents=sample)
        if verdict is None or not verdict["ok"] or not verdict.get("tokie", {}).get("ok"):
            return False
        if verdict.get("documents", 0) < sample:
            return False
        self._tokie = self._load_tokie(key)
        self._fast = _Deferred(key, self.source, self.add_special_tokens, self.cache_dir)
        self._sample_left, self._sampled, self._earlier = 0, int(verdict.get("documents", 0)), True
        return self._settle(verdict, forced=forced)

    def _unproven_tokie(self, key: str, *, forced: bool) -> bool:
        """The first process with tokie: load it and sample; tiktoken is converted by the built-in checks. Taken?

        The conversion (about 1.5 s at 128k tokens) is the one step of the proof the first
        batch does not need: the sample compares tokie, and tiktoken encodes only the texts
        tokie routes (:class:`~arrowstream.tokenize.fast._Deferred`). The settings are
        checked now (:func:`~arrowstream.tokenize.bytelevel.check_bytelevel`); a refusal
        for the merges comes at the checks, before any id but the reference's has left.
        """
        if forced or self.requested != "auto" or tokie_version() is None or not self.sample_bytes:
            return False
        if _cached_verdict(key, self.cache_dir) is not None:
            return False
        try:
            check_bytelevel(self.tokenizer, add_special_tokens=self.add_special_tokens)
        except Unconvertible as exc:
            self._refuse(exc, forced=False)
            return True
        self._fast = _Deferred(key, self.source, self.add_special_tokens, self.cache_dir)
        self._tokie, self._sampled_by = self._load_tokie(key), "tokie"
        self._sample_left, self._pending = self.sample_bytes, True
        return True

    def _refuse(self, exc: Unconvertible, *, forced: bool) -> None:
        """The conversion was refused: keep ``tokenizers`` (warn where it is a byte-level BPE), or raise when forced."""
        self._fast = self._spec = self._tokie = self._run = None
        self._pending = False
        self._reason = f"not converted to tiktoken: {exc.reason}"
        if forced:
            raise ConfigError(f"`backend={self.requested!r}` cannot be used: {exc.reason}; use `backend='auto'`") from exc
        if exc.byte_level:
            _warn(f"this byte-level BPE tokenizer keeps the slower `tokenizers` backend: {exc.reason}")

    def _tiktoken_side(self) -> _Fast | None:
        """tiktoken's side, converted now if it waited (:meth:`_unproven_tokie`); ``None`` (and ``tokenizers``) if refused."""
        fast = self._fast
        if not isinstance(fast, _Deferred):
            return fast
        try:
            return fast.convert()
        except Unconvertible as exc:
            self._refuse(exc, forced=False)
            return None

    def _load_tokie(self, key: str) -> TokieBackend:
        """tokie's side: loaded once per process, from the binary form kept beside the verdicts where there is one."""
        return TokieBackend(self.source, add_special_tokens=self.add_special_tokens, key=key, cache_dir=self.cache_dir)

    def _settle(self, verdict: dict[str, Any] | None, *, forced: bool = False) -> bool:
        """Run the built-in checks unless ``verdict`` is given; keep or drop tiktoken and tokie by it."""
        self._pending, self._run = False, None
        if self._fast is None:
            return self._tokie is not None
        if verdict is None or (self._tokie is not None and "tokie" not in verdict):
            side = self._tiktoken_side()
            if side is None:
                return False
            verdict = {**(verdict or {}), **self._check(side.spec, side.encoding, tiktoken_too=verdict is None, tokie=self._tokie)}
            _store_verdict(self._key(), verdict, self.cache_dir)
        self.checked = dict(verdict.get("checked", {}))
        counts = ", ".join(f"{v:,} {k}" for k, v in self.checked.items())
        tokie_ok = verdict.get("tokie", {"ok": False})
        refused = f"; tokie not used: {self._tokie_failed}" if self._tokie_failed else ""
        if self._tokie is not None and not tokie_ok["ok"]:
            self._tokie = None
            self._restart_sample()
            refused = f"; tokie not used, it gave other ids on {tokie_ok['reason']}"
            if self.requested == "tokie":
                raise ConfigError(f"`backend='tokie'` cannot be used: {tokie_ok['reason']}; use `backend='auto'`")
        elif self._tokie is not None:  # proven: kept for later processes once the reference is let go
            self._keep_owed = True
        if not verdict["ok"]:
            # `_sample_left` stays as it is: a thread that read `_fast` before this line
            # must still see the sample unfinished, and return the reference's ids.
            self._fast = self._spec = None
            self._reason = f"tiktoken failed the equivalence check: {verdict['reason']}{refused}"
            if self.requested == "tiktoken":
                raise ConfigError(f"`backend='tiktoken'` cannot be used: {verdict['reason']}")
            if self._tokie is None:
                _warn(f"the tokenizer keeps the slower `tokenizers` backend: {verdict['reason']}")
                return False
            self._reason = f"tokie ({ROUTED_TEXTS} go to `tokenizers`: {self._reason}); identical ids on {counts}"
            return True
        self._reason = ("forced; " if forced else "") + f"identical ids on {counts}"
        if self._tokie is not None:
            self._reason = f"tokie, {ROUTED_TEXTS} encoded by tiktoken; " + self._reason
        self._reason += refused
        return True

    def verify(self) -> Encoder:
        """Run the built-in checks now if they have not run yet; return this encoder.

        With ``backend="auto"`` they otherwise run once the first
        ``sample_bytes`` of documents have been checked, so that building a
        pipeline and its first batch do not wait for them; call this to learn
        the verdict up front (a failure warns and keeps ``tokenizers``).

        Examples
        --------
        >>> from arrowstream.testing.data import sample_tokenizer
        >>> enc = Encoder(sample_tokenizer(317), cache_dir=None)  # a tokenizer no verdict is known for yet
        >>> enc.describe()["checks_pending"]
        True
        >>> enc.verify().describe()["checks_pending"], enc.backend in ("tokie", "tiktoken")
        (False, True)
        """
        with self._lock:
            if self._pending:
                waited = self._run is not None  # the sample is done, and waits for them
                self._await_checks()
                left = self._settle_sample(_cached_verdict(self._key(), self.cache_dir))
                if waited:
                    self._close_sample(left)
        return self

    def _check(
        self, spec: ByteLevelBPE, encoding: tiktoken.Encoding, *, tiktoken_too: bool, tokie: TokieBackend | None
    ) -> dict[str, Any]:
        """The built-in checks (:func:`~arrowstream.tokenize.proof.check_backends`) of tiktoken and ``tokie``."""
        # The batch encoder (twice as fast) starts the tokenizer's thread pool: only where the stream did.
        ref = self._reference_checks if self._pool_started else self._reference_serial
        release_freed_memory()  # what the document sample's calls left (core/allocator.py)
        try:
            return check_backends(spec, encoding, ref, tokie=tokie, tiktoken_too=tiktoken_too,
                                  tokie_failed=self._tokie_failed)
        finally:
            release_freed_memory()  # the checks' threads allocate no more

    # -- encoding -----------------------------------------------------------------

    @property
    def reason(self) -> str:
        """Why this backend: what was refused or differed, or what tiktoken was checked on."""
        if not self._alive() or not self.sample_bytes or self.requested != "auto":
            return self._reason
        if self._pending and self._run is not None:
            where = "in this process" if self._run.here else "in another process, which holds their lock"
            return (
                f"built-in checks running {where}, beside the stream; until they pass, the reference's ids "
                f"are returned and compared ({self._sampled:,} bytes of documents so far)"
            )
        if self._pending:
            return (
                "built-in checks pending (they run when the document sample is done); "
                f"{self._sampled:,} of the first {self.sample_bytes:,} bytes of documents checked so far"
            )
        if self._earlier:
            return self._reason + f" and {self._sampled:,} bytes of documents (checked by an earlier process)"
        if not self._sample_left:
            return self._reason + f" and the first {self._sampled:,} bytes of documents"
        return self._reason + f"; {self._sampled:,} of the first {self.sample_bytes:,} bytes of documents checked so far"

    @property
    def backend(self) -> str:
        """The backend that encodes now: ``"tokie"``, ``"tiktoken"`` or ``"tokenizers"``."""
        return "tokie" if self._tokie is not None else "tokenizers" if self._fast is None else "tiktoken"

    def _alive(self) -> bool:
        return self._fast is not None or self._tokie is not None

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encode ``texts``; return the flat ``int32`` ids and the ``int64`` length of each text.

        Examples
        --------
        >>> from arrowstream.testing.data import sample_tokenizer
        >>> flat, lens = Encoder(sample_tokenizer(300)).encode(["a b", "c"])
        >>> [flat[:lens[0]].tolist(), flat[lens[0]:].tolist()]
        [[65, 267], [67]]
        """
        fast, tok = self._fast, self._tokie
        if fast is None and tok is None:
            return self._reference(texts)
        if not self._sample_left or self._proven_elsewhere():
            return self._backend_encode(fast, tok, texts)
        huge = [i for i, t in enumerate(texts) if len(t) > SAMPLE_DOC_CHARS]
        out = self._sample(texts) if not huge else self._sample_around(texts, huge)
        if self._run is not None:  # the sample is done, and its checks run beside the stream
            self._hold_for_checks()
        return out

    def _backend_encode(self, fast: Any, tok: Any, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encode with tokie or tiktoken (``fast``), the texts they route to the reference aside."""
        if tok is None:
            return fast.encode(texts, self._reference)  # type: ignore[no-any-return]
        return tok.encode(texts, self._reference if fast is None else lambda sub: fast.encode(sub, self._reference))

    def _reference(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        self._pool_started = True
        return self._reference_checks(texts)

    def _reference_checks(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        # The batch encoder (also for the built-in checks, not counted as documents encoded), in
        # calls of at most REFERENCE_CALL_BYTES of text: see there. One int32 array per text, then
        # one concatenation: measured faster than flattening the id lists through an iterator chain.
        encode, special = self.tokenizer.encode_batch_fast, self.add_special_tokens
        arrays: list[np.ndarray] = []
        for part in reference_calls(texts, REFERENCE_CALL_BYTES):
            arrays += [np.array(e.ids, dtype=np.int32) for e in encode(part, add_special_tokens=special)]
        return _flatten(arrays)

    def _reference_serial(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        # One text at a time: the batch encoder would start the tokenizer's thread pool in
        # this process, and a DataLoader worker forked from it would lose its own (or hang).
        encode, special = self.tokenizer.encode, self.add_special_tokens
        return _flatten([np.array(encode(t, add_special_tokens=special).ids, dtype=np.int32) for t in texts])

    def describe(self) -> dict[str, Any]:
        """Return the backend, why it was chosen and what was checked, as JSON-able data.

        Examples
        --------
        >>> from arrowstream.testing.data import sample_tokenizer
        >>> info = Encoder(sample_tokenizer(300), backend="tokenizers").describe()
        >>> info["backend"], info["reason"]
        ('tokenizers', "backend='tokenizers' was asked for")
        """
        return {
            "backend": self.backend,
            "requested": self.requested,
            "reason": self.reason,
            "checked": dict(self.checked),
            "checks_pending": self._pending,
            "checks_running": None if self._run is None else "here" if self._run.here else "another process",
            "sample_bytes_left": self._sample_left if self._alive() else 0,
            "tokenizer": self.hash,
            "versions": {"tiktoken": tiktoken.__version__, "tokenizers": tokenizers.__version__, "tokie": tokie_version()},
        }

    def __repr__(self) -> str:
        return f"Encoder(backend={self.backend!r}, tokenizer={self.hash[:12]!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"], state["_fast"], state["_checks_lock"]  # rebuilt (the spec is cached per process)
        state["_run"] = None  # the unpickled encoder waits for the verdict, or runs the checks
        if isinstance(self._fast, _Deferred):  # not converted yet: the unpickled one converts when it must
            converted = self._fast.converted
            state["_spec"] = None if converted is None else converted.spec
            state["_deferred"] = converted is None
        state["_tokie"] = self._tokie is not None  # rebuilt from the tokenizer (cached per process)
        state["_pool_started"] = False  # a new process has no thread pool yet
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        deferred = state.pop("_deferred", False)
        self.__dict__.update(state)
        self._lock, self._checks_lock = threading.Lock(), threading.Lock()
        self._fast = None if self._spec is None else _Fast(self._spec, _encoding(self._key(), self._spec))
        if deferred:
            self._fast = _Deferred(self._key(), self.source, self.add_special_tokens, self.cache_dir)
        # tokie must be importable where a process that used it is unpickled
        self._tokie = self._load_tokie(self._key()) if self._tokie else None
        self._hold_reference()
