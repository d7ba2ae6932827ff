"""The tiktoken backend: a converted tokenizer's tiktoken encoding, and batches encoded through it.

:func:`_encoding` builds the tiktoken encoding of a tokenizer converted by
:mod:`arrowstream.tokenize.bytelevel` (kept per process for the last few
tokenizers), and :class:`_Fast` encodes a batch of texts through it into the
tokenizer's ids: one flat ``int32`` array plus one length per text, with the
rank-to-id mapping and the post-processor's tokens applied. Texts that
tiktoken's regex engine cannot take go to the reference backend instead.
:class:`_Deferred` stands in for a :class:`_Fast` not converted yet: where
a stored verdict proves tokie, tiktoken only encodes the texts tokie routes,
and is converted when the first one comes. The
array helpers (:func:`_flatten`, :func:`_first_difference`) are shared with
the reference backend in :mod:`arrowstream.tokenize.encoders`, which decides
whether this backend may be trusted.

Thread safety: a :class:`_Fast` is not changed after it is built, and tiktoken
releases the GIL while encoding, so several threads may encode at once; the
cache of encodings holds a lock.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tiktoken
from tokenizers import Tokenizer

from arrowstream.tokenize.bytelevel import ByteLevelBPE, Unconvertible
from arrowstream.tokenize.compiled import conversion_kept, load_bytelevel
from arrowstream.tokenize.source import TokenizerSource

__all__: list[str] = []  # used by arrowstream.tokenize.encoders only

# fancy-regex (tiktoken's engine) gives up on a whitespace run of about a million
# characters (an error or a Rust panic); texts with a run past this length go to the
# reference, and so does any text on which the engine gives up.
_LONG_RUN = 1 << 17
_LONG_SPACE = re.compile(rf"(?<!\s)\s{{{_LONG_RUN}}}")

# A noncharacter (reserved for internal use by Unicode): joins the texts of a batch.
_SEP = "\ufdd0"

_lock = threading.Lock()
_converted: dict[str, tuple[ByteLevelBPE, tiktoken.Encoding]] = {}
_MAX_CACHED = 8


class _Fast:
    """tiktoken encoding of a batch, with the id mapping and post-processor tokens applied.

    A batch goes to tiktoken as one string, the texts joined by a separator
    that tiktoken knows as a special token (so no piece or merge crosses it)
    and that no text contains: one call, one release of the GIL, where a call
    per text made threads queue for the GIL. Otherwise, one call per text.
    """

    __slots__ = ("allowed", "encoding", "joinable", "sep", "spec", "with_sep")

    def __init__(self, spec: ByteLevelBPE, encoding: tiktoken.Encoding) -> None:
        self.spec, self.encoding = spec, encoding
        self.allowed = frozenset(spec.specials)
        self.sep = spec.separator_value
        self.joinable = not any(_SEP in s for s in spec.specials)
        self.with_sep = self.allowed | {_SEP}

    def encode(self, texts: Sequence[str], reference: Any) -> tuple[np.ndarray, np.ndarray]:
        if self.joinable and texts and not any(len(t) >= _LONG_RUN for t in texts):
            joined = _SEP.join(texts)
            if joined.count(_SEP) == len(texts) - 1:  # no text holds the separator itself
                ids = self._encode_one(joined, self.with_sep)
                if ids is not None:
                    is_sep = ids == self.sep
                    ends = np.flatnonzero(is_sep)
                    if ends.size == len(texts) - 1:
                        lens = np.diff(np.concatenate([[-1], ends, [ids.size]])) - 1
                        return self._finish(ids[~is_sep].view(np.int32), lens)
        return self._encode_each(texts, reference)

    def _encode_one(self, text: str, allowed: frozenset[str]) -> np.ndarray | None:
        """Return tiktoken's values for ``text``, or ``None`` if its regex engine gives up."""
        try:
            return self.encoding.encode_to_numpy(text, allowed_special=allowed, disallowed_special=())
        except BaseException as exc:  # a Rust panic is a BaseException
            regex_gave_up = isinstance(exc, ValueError) and "regex" in str(exc).lower()
            if not regex_gave_up and type(exc).__name__ != "PanicException":
                raise
            return None

    def _finish(self, flat: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.spec.rank_to_id is not None:
            flat = self.spec.rank_to_id[flat]
        if self.spec.prefix or self.spec.suffix:
            flat, lens = _wrap(flat, lens, self.spec.prefix, self.spec.suffix)
        return flat, lens

    def _encode_each(self, texts: Sequence[str], reference: Any) -> tuple[np.ndarray, np.ndarray]:
        arrays: list[np.ndarray] = []
        odd: list[int] = []  # texts tiktoken's regex engine cannot take: encoded by the reference
        for text in texts:
            ids = None
            if len(text) < _LONG_RUN or _LONG_SPACE.search(text) is None:
                ids = self._encode_one(text, self.allowed)
            if ids is None:
                odd.append(len(arrays))
                ids = _EMPTY
            arrays.append(ids)
        flat, lens = self._finish(*_flatten(arrays))
        if odd:
            flat, lens = _patch(flat, lens, odd, reference([texts[i] for i in odd]))
        return flat, lens


_EMPTY = np.zeros(0, np.uint32)


def _flatten(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lens = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
    if not arrays:
        return np.zeros(0, np.int32), lens
    flat = np.concatenate(arrays)
    return (flat.view(np.int32) if flat.dtype == np.uint32 else flat.astype(np.int32, copy=False)), lens


def _wrap(flat: np.ndarray, lens: np.ndarray, prefix: tuple[int, ...], suffix: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Put ``prefix`` before and ``suffix`` after every text's ids."""
    new_lens = lens + len(prefix) + len(suffix)
    out = np.empty(int(new_lens.sum()), dtype=np.int32)
    ends = np.cumsum(new_lens)
    starts = ends - new_lens
    body = np.ones(out.size, dtype=bool)
    for k, tid in enumerate(prefix):
        out[starts + k] = tid
        body[starts + k] = False
    for k, tid in enumerate(suffix):
        out[ends - len(suffix) + k] = tid
        body[ends - len(suffix) + k] = False
    out[body] = flat
    return out, new_lens


def _patch(
    flat: np.ndarray, lens: np.ndarray, where: list[int], ref: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Replace the texts at ``where`` (empty so far) with the reference's ids."""
    bounds = np.concatenate([[0], np.cumsum(lens)])
    docs = [flat[bounds[i] : bounds[i + 1]] for i in range(lens.size)]
    ref_bounds = np.concatenate([[0], np.cumsum(ref[1])])
    for k, i in enumerate(where):
        docs[i] = ref[0][ref_bounds[k] : ref_bounds[k + 1]]
    return _flatten(docs)


def _first_difference(
    texts: Sequence[str],
    a: tuple[np.ndarray, np.ndarray],
    b: tuple[np.ndarray, np.ndarray],
    name: str = "tiktoken",
    first: int = 0,
) -> str | None:
    """Describe the first text whose ids differ between ``a`` (reference) and ``b``, or ``None``.

    ``first`` is the number of ``texts[0]`` in the texts the caller names.
    """
    if np.array_equal(a[1], b[1]) and np.array_equal(a[0], b[0]):
        return None
    ea, eb = np.concatenate([[0], np.cumsum(a[1])]), np.concatenate([[0], np.cumsum(b[1])])
    for i, text in enumerate(texts):
        ida, idb = a[0][ea[i] : ea[i + 1]].tolist(), b[0][eb[i] : eb[i + 1]].tolist()
        if ida != idb:
            at = next((j for j, (x, y) in enumerate(zip(ida, idb)) if x != y), min(len(ida), len(idb)))
            shown = text if len(text) <= 60 else text[:60] + "..."
            return (
                f"#{first + i} {shown!r}: `tokenizers` gives {ida[max(0, at - 2) : at + 4]!r} and {name} "
                f"{idb[max(0, at - 2) : at + 4]!r} from token {at} on"
            )
    return None


def _convert(
    key: str, tokenizer: Tokenizer | TokenizerSource, add_special_tokens: bool, cache_dir: Path | None = None
) -> tuple[ByteLevelBPE, tiktoken.Encoding]:
    """Return the tokenizer converted for tiktoken and its encoding: from this process, the conversion kept in ``cache_dir``, or made now."""
    with _lock:
        hit = _converted.get(key)
    if hit is not None:
        return hit
    spec = load_bytelevel(tokenizer, key, cache_dir, add_special_tokens=add_special_tokens)
    return spec, _encoding(key, spec)


def _encoding(key: str, spec: ByteLevelBPE) -> tiktoken.Encoding:
    """Build (or reuse) the tiktoken encoding of a converted tokenizer."""
    with _lock:
        hit = _converted.get(key)
    if hit is not None:
        return hit[1]
    pair = (spec, spec.to_tiktoken(f"arrowstream-{key[:12]}", separator=_SEP))
    with _lock:
        while len(_converted) >= _MAX_CACHED:
            _converted.pop(next(iter(_converted)))
        _converted[key] = pair
    return pair[1]


class _Deferred:
    """The tiktoken side of an encoder, converted on its first use.

    Where tokie encodes, tiktoken encodes only the texts tokie routes to it,
    which most corpora never hold: whether a stored verdict already proves
    both, or the first process on a machine proves them (then the built-in
    checks convert it, beside the stream), the conversion (about 0.05 s for a few thousand tokens, 1 s
    for 128k; read back from the verdicts' directory in a fraction of that,
    :func:`~arrowstream.tokenize.compiled.load_bytelevel`) waits until one
    comes. The first process drops its conversion once tokie is proven and
    kept (:meth:`forget`, where the compact form is kept to read back), as
    a later process holds none. Same interface as :class:`_Fast`.
    A conversion that fails now (it passed when the verdict was stored) sends
    the texts to the reference.
    """

    __slots__ = ("_args", "_fast", "_lock")

    def __init__(
        self, key: str, tokenizer: Tokenizer | TokenizerSource, add_special_tokens: bool, cache_dir: Path | None = None
    ) -> None:
        self._args = (key, tokenizer, add_special_tokens, cache_dir)
        self._fast: _Fast | None = None
        self._lock = threading.Lock()

    @property
    def converted(self) -> _Fast | None:
        """The tiktoken side if it was converted, else ``None``."""
        return self._fast

    def get(self) -> _Fast | None:
        """Return the tiktoken side, converting it now if needed (``None``: the conversion failed)."""
        try:
            return self.convert()
        except Unconvertible:
            return None

    def convert(self) -> _Fast:
        """Return the tiktoken side, converting it now if needed; raise :class:`Unconvertible` if it cannot be."""
        with self._lock:
            if self._fast is None:
                self._fast = _Fast(*_convert(*self._args))
            return self._fast

    def forget(self) -> bool:
        """Drop the conversion if one was made and can be read back (kept in ``cache_dir``); the next text converts again. Dropped?"""
        key, _, _, cache_dir = self._args
        with self._lock:
            if self._fast is None or not conversion_kept(key, cache_dir):
                return False
            self._fast = None
        with _lock:
            _converted.pop(key, None)
        return True

    def encode(self, texts: Sequence[str], reference: Any) -> tuple[np.ndarray, np.ndarray]:
        fast = self.get()
        return reference(texts) if fast is None else fast.encode(texts, reference)


def reference_calls(texts: Sequence[str], limit: int) -> list[list[str]]:
    """Cut ``texts`` into consecutive runs of at most ``limit`` characters (a longer text alone), in order.

    The encoders' batch calls are cut so (see
    :data:`~arrowstream.tokenize.encoders.REFERENCE_CALL_BYTES`): a call's
    temporary objects grow with its text, and the C heap keeps what a call used.

    Examples
    --------
    >>> reference_calls(["aa", "bbb", "c", "dddddd"], limit=4)
    [['aa'], ['bbb', 'c'], ['dddddd']]
    >>> reference_calls([], limit=4)
    []
    """
    calls: list[list[str]] = []
    size = limit + 1
    for text in texts:
        if size + len(text) > limit:
            calls.append([])
            size = 0
        calls[-1].append(text)
        size += len(text)
    return calls
