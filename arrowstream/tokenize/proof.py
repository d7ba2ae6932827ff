"""The built-in checks of an encoder's fast backends: the vocabulary and the probe set, against the reference.

:func:`check_backends` encodes the text of every vocabulary token and every
probe (:mod:`arrowstream.tokenize.probes`, the routing probes of
:mod:`arrowstream.tokenize.tokie_backend`, the added-token probes) with the
reference (``tokenizers``) and with each candidate, and returns the verdict
that :class:`~arrowstream.tokenize.encoders.Encoder` stores: whether
tiktoken and tokie gave the same ids everywhere, and if not, the first text
where they did not. tokie is checked on the texts it does not route (the
routed ones take the fallback's ids), so its verdict holds whatever the
routed texts go to. Pure: it reads nothing and stores nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tiktoken

from arrowstream.tokenize.bytelevel import ByteLevelBPE
from arrowstream.tokenize.fast import _Fast, _first_difference, reference_calls
from arrowstream.tokenize.probes import added_token_probes, probe_texts, token_texts
from arrowstream.tokenize.tokie_backend import TokieBackend, routing_probes

__all__ = ["check_backends", "sample_differences"]

Encode = Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]


#: Text per call of each backend in the built-in checks. In one call each, the 0.4 M characters
#: of probes took the first process 50 MB above its size (tokie and ``tokenizers`` keep what a
#: call used); in calls of 64 KiB, 25 MB (32k BPE, tokie, tiktoken and ``tokenizers``).
CHECK_CALL_CHARS = 64 << 10


def check_backends(
    spec: ByteLevelBPE,
    encoding: tiktoken.Encoding,
    reference: Encode,
    *,
    tokie: TokieBackend | None,
    tiktoken_too: bool = True,
    tokie_failed: str = "",
) -> dict[str, Any]:
    """Compare tiktoken (unless not ``tiktoken_too``) and ``tokie`` with ``reference`` on the vocabulary and the probes.

    Returns
    -------
    dict
        ``checked`` (texts per kind); with ``tiktoken_too``, ``ok`` and
        ``reason`` (the first difference, ``""`` if none); with ``tokie``
        (or ``tokie_failed``, a difference already seen on documents),
        ``tokie``: ``{"ok", "reason"}``.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.testing.data import sample_tokenizer
    >>> from arrowstream.tokenize.fast import _convert, _flatten
    >>> tok = sample_tokenizer(300)
    >>> spec, encoding = _convert("doc-proof", tok, True)
    >>> def reference(texts):
    ...     return _flatten([np.array(e.ids, np.int32) for e in tok.encode_batch(list(texts))])
    >>> verdict = check_backends(spec, encoding, reference, tokie=None)
    >>> verdict["ok"], sorted(verdict["checked"])
    (True, ['probe texts', 'vocabulary tokens'])
    """
    fast = _Fast(spec, encoding)
    vocab = [t for t in token_texts(spec) if t]
    probes = list(probe_texts()) + routing_probes() + added_token_probes(spec.specials)
    checked = {"vocabulary tokens": len(vocab), "probe texts": len(probes)}
    found: dict[str, str | None] = {"tiktoken": None if tiktoken_too else "", "tokie": tokie_failed or None}
    for name, texts in (("vocabulary token", vocab), ("probe", probes)):
        done = 0  # texts of this kind before the part
        for part in reference_calls(texts, CHECK_CALL_CHARS):
            if found["tiktoken"] is not None and (tokie is None or found["tokie"] is not None):
                break  # every backend has failed: nothing left to compare
            want = reference(part)
            if found["tiktoken"] is None:
                if bad := _first_difference(part, want, fast.encode(part, reference), first=done):
                    found["tiktoken"] = f"{name} text {bad}"
            if tokie is not None and found["tokie"] is None:  # None: not failed yet
                if bad := _first_difference(part, want, tokie.encode(part, reference), "tokie", first=done):
                    found["tokie"] = f"{name} text {bad}"
            done += len(part)
    verdict: dict[str, Any] = {"checked": checked}
    if tiktoken_too:
        verdict.update(ok=found["tiktoken"] is None, reason=found["tiktoken"] or "")
    if tokie is not None or tokie_failed:
        verdict["tokie"] = {"ok": found["tokie"] is None, "reason": found["tokie"] or ""}
    return verdict


def sample_differences(
    texts: Sequence[str],
    ref: tuple[np.ndarray, np.ndarray],
    fast: Any,
    tokie: TokieBackend | None,
    reference: Encode,
) -> tuple[str | None, str | None]:
    """During the document sample: where tiktoken (``fast``) and ``tokie`` first differ from the reference's ids ``ref``.

    While tokie is in use, tiktoken encodes only the texts tokie routes to
    it, as they would encode after the sample, so the sample costs the
    reference and tokie per document; only if that differs are the two told
    apart. Without tokie, tiktoken encodes every text.

    Returns
    -------
    tuple of (str or None, str or None)
        tiktoken's first difference and tokie's (``None``: none, or not checked).
    """
    if tokie is None:
        return None if fast is None else _first_difference(texts, ref, fast.encode(texts, reference)), None
    routed = reference if fast is None else lambda sub: fast.encode(sub, reference)
    if _first_difference(texts, ref, tokie.encode(texts, routed), "tokie") is None:
        return None, None
    bad = None if fast is None else _first_difference(texts, ref, fast.encode(texts, reference))
    return bad, _first_difference(texts, ref, tokie.encode(texts, reference), "tokie")
