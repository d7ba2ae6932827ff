"""The tokie backend: a tokenizer.json loaded into tokie, with the texts it splits differently routed away.

`tokie <https://pypi.org/project/tokie/>`_ (an optional dependency:
``pip install arrowstream[fast]``) loads a ``tokenizer.json`` and encodes a
batch of texts into one flat id array in Rust, on all cores, with the GIL
released; measured 5-10 times faster than tiktoken here. It is not exact
everywhere: where a tab, a vertical tab or a form feed stands right before an
apostrophe (``"\\t's"``), its pre-tokenizer cuts the text other than the
tokenizer's split regex (``["\\t", "'", "s"]`` where ``tokenizers`` gives
``["\\t", "'s"]``). :class:`TokieBackend` sends every text that holds such a
pair (:func:`routed`, a substring test that costs little next to encoding) to
a fallback encoder, the next exact backend, and the others to tokie, and puts
the ids back in order.

Whether the rest is exact is not assumed: :mod:`arrowstream.tokenize.encoders`
proves it per tokenizer, as for tiktoken, on the vocabulary, the probe set
(with :func:`routing_probes`: contractions and apostrophes after every kind of
whitespace, digit runs) and the first documents, and refuses tokie for a
tokenizer where any text not routed gives other ids.

Thread safety: a :class:`TokieBackend` is not changed after it is built, and
tokie releases the GIL while it encodes, so several threads may encode at
once. Determinism: the routing depends on the text alone.

Examples
--------
>>> routed(["it's", "a\\t'b", "tab\\tthen 'quote'"])
[1]
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

try:  # optional: `pip install arrowstream[fast]`
    import tokie
except ImportError:  # pragma: no cover - exercised by a test that hides the module
    tokie = None

from tokenizers import Tokenizer

from arrowstream.tokenize.compiled import keep_tokie, load_tokie
from arrowstream.tokenize.fast import _flatten
from arrowstream.tokenize.probes import _WHITESPACE
from arrowstream.tokenize.source import TokenizerSource

__all__ = ["ROUTED_PAIRS", "ROUTED_TEXTS", "TokieBackend", "routed", "routing_probes", "tokie_version"]

#: Two-character sequences tokie pre-tokenizes differently from the split regex (found by probing
#: every whitespace character before every contraction and apostrophe on five tokenizers): a text
#: holding one goes to the fallback encoder.
ROUTED_PAIRS = ("\t'", "\x0b'", "\x0c'")

#: What tokie routes to the next exact backend, as :attr:`~arrowstream.tokenize.encoders.Encoder.reason` says it.
ROUTED_TEXTS = "texts with a tab, vertical tab or form feed before an apostrophe"

Encode = Callable[[Sequence[str]], "tuple[np.ndarray, np.ndarray]"]

_lock = threading.Lock()
#: One tokie call at a time in this process: a call already spreads its texts over every core,
#: so calls side by side (slices in flight, a mixture's sources) only crowd the cores. Measured
#: on the 85 MB text pipeline: 8 % less CPU time, about 3 % faster.
_one_call = threading.Lock()
_loaded: dict[str, object] = {}


def _fresh_locks_after_fork() -> None:
    """A child forked while another thread held a lock (a DataLoader worker) starts with free ones."""
    global _lock, _one_call
    _lock, _one_call = threading.Lock(), threading.Lock()


def _hold_before_fork() -> None:
    _one_call.acquire()


def _release_after_fork() -> None:
    _one_call.release()


# A fork waits for a tokie call in another thread to end (a call takes milliseconds): a child
# forked mid-call would inherit tokie's own state as that thread left it, locks included.
os.register_at_fork(
    before=_hold_before_fork, after_in_parent=_release_after_fork, after_in_child=_fresh_locks_after_fork
)
_MAX_LOADED = 4


def tokie_version() -> str | None:
    """Return the installed tokie's version, or ``None`` when it cannot be imported.

    Examples
    --------
    >>> tokie_version() is None or tokie_version().count(".") >= 1
    True
    """
    return None if tokie is None else _installed_version()


@functools.lru_cache(maxsize=1)
def _installed_version() -> str:
    """The installed tokie's version, looked up once per process (a metadata lookup takes about a millisecond)."""
    try:
        return importlib.metadata.version("tokie")
    except importlib.metadata.PackageNotFoundError:  # imported from a source tree
        return "unknown"


def routed(texts: Sequence[str]) -> list[int]:
    """Return the positions of the texts that hold a pair of :data:`ROUTED_PAIRS`.

    The whitespace characters are tested first: they are rare in prose, so
    most texts cost one pass of each substring test.

    Examples
    --------
    >>> routed(["\\x0b'", "\\x0c 'x", "' \\t", "\\f'"])
    [0, 3]
    """
    # Spelled out, not `any(...)`: a generator per text cost four times as much (3.5 against
    # 0.8 ms for 3.7 MB of documents).
    pairs = ROUTED_PAIRS
    if len(pairs) != 3:  # another set of pairs (a test turns routing off)
        return [i for i, t in enumerate(texts) if any(pair in t for pair in pairs)]
    pa, pb, pc = pairs
    a, b, c = pa[0], pb[0], pc[0]
    return [i for i, t in enumerate(texts) if (a in t or b in t or c in t) and (pa in t or pb in t or pc in t)]


def routing_probes() -> list[str]:
    """Return texts that put every whitespace character before contractions, apostrophes and digit runs.

    Both the routed pairs and their neighbours: a tokenizer whose tokie ids
    differ on a text that is not routed fails the check.

    Examples
    --------
    >>> probes = routing_probes()
    >>> "\\t's" in probes, "a\\u3000'll b" in probes, all(routed([p]) == [] for p in probes if "\\t" not in p and "\\x0b" not in p and "\\x0c" not in p)
    (True, True, True)
    """
    tails = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'", "'a", "'rose", "'very", "'tis", "’s", "'1", "12", "123456"]
    out = []
    for ws in _WHITESPACE + "\n\r" + "\r\n":
        for tail in tails:
            out += [f"{ws}{tail}", f"a{ws}{tail} b", f"x{ws * 2}{tail}y", f"{ws}{tail}{ws}{tail}"]
    out += ["\t" + "'s\t" * 50, "don't\twon't\t'cause\n'tis \t'em", "a\t\t'''b"]
    return out


class TokieBackend:
    """A tokenizer loaded into tokie, encoding the texts that are not routed.

    Parameters
    ----------
    tokenizer
        The ``tokenizers.Tokenizer``, or its source (its JSON is handed to
        tokie unless its binary form is kept).
    add_special_tokens
        Let the post-processor add its tokens, as in ``tokenizers``.
    key
        Caches the loaded tokenizer in the process (the encoder's verdict key).
    cache_dir
        The verdicts' directory: tokie's binary form of the tokenizer is
        loaded from there if kept (:func:`~arrowstream.tokenize.compiled.load_tokie`),
        and kept there by :meth:`keep`; ``None``: built from the JSON in
        every process.

    Raises
    ------
    ImportError
        tokie is not installed (``pip install arrowstream[fast]``).

    Examples
    --------
    >>> from arrowstream.testing.data import sample_tokenizer
    >>> tok = sample_tokenizer(300)
    >>> backend = TokieBackend(tok, add_special_tokens=True, key="doc")
    >>> def reference(texts):
    ...     return _flatten([np.array(e.ids, np.int32) for e in tok.encode_batch(list(texts))])
    >>> flat, lens = backend.encode(["a b", "x\\t's"], reference)
    >>> lens.tolist(), flat.dtype.name
    ([2, 4], 'int32')
    """

    __slots__ = ("add_special_tokens", "cache_dir", "key", "tokenizer")

    def __init__(
        self, tokenizer: Tokenizer | TokenizerSource, *, add_special_tokens: bool, key: str, cache_dir: Path | None = None
    ) -> None:
        if tokie is None:
            raise ImportError("the tokie backend needs tokie: `pip install arrowstream[fast]`")
        self.add_special_tokens = add_special_tokens
        self.key, self.cache_dir = key, cache_dir
        with _lock:
            hit = _loaded.get(key)
        if hit is None:
            hit = load_tokie(tokenizer, key, cache_dir)
            with _lock:
                while len(_loaded) >= _MAX_LOADED:
                    _loaded.pop(next(iter(_loaded)))
                _loaded[key] = hit
        self.tokenizer = hit

    def keep(self) -> None:
        """Keep tokie's binary form of the tokenizer in ``cache_dir`` for later processes, unless this process loaded it from there.

        Called once the tokenizer's verdict proves tokie, so no file is written for a tokenizer tokie fails,
        and once the encoder has let go of the reference (the first process's peak was the reference,
        tokie and the copy that keeping loads back, together).
        """
        keep_tokie(self.tokenizer, self.key, self.cache_dir)

    def encode(self, texts: Sequence[str], fallback: Encode) -> tuple[np.ndarray, np.ndarray]:
        """Encode ``texts``: the routed ones by ``fallback``, the others by tokie; ids in order."""
        away = routed(texts)
        if not away:
            return self._tokie(texts)
        keep = np.ones(len(texts), dtype=bool)
        keep[away] = False
        near = self._tokie([t for t, k in zip(texts, keep) if k])
        far = fallback([texts[i] for i in away])
        lens = np.empty(len(texts), dtype=np.int64)
        lens[keep], lens[~keep] = near[1], far[1]
        # Each text's ids from its own side: one gather over both flat arrays.
        source = np.concatenate([near[0], far[0]])
        starts = np.empty(len(texts), dtype=np.int64)
        starts[keep] = np.cumsum(near[1]) - near[1]
        starts[~keep] = near[0].size + np.cumsum(far[1]) - far[1]
        ends = np.cumsum(lens)
        index = np.arange(int(ends[-1]) if len(lens) else 0, dtype=np.int64) + np.repeat(starts - (ends - lens), lens)
        return source[index], lens

    def _tokie(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        texts = list(texts)
        with _one_call:
            ids, lens = self.tokenizer.encode_batch_flat(texts, self.add_special_tokens)
        return ids.view(np.int32), lens.astype(np.int64)
