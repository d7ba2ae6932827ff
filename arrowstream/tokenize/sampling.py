"""The document sample of an :class:`~arrowstream.tokenize.encoders.Encoder`: its end, its verdict, its restarts.

Until ``sample_bytes`` of documents have given the reference's ids with the
backends that would encode them, an encoder returns the reference's ids
(:meth:`~arrowstream.tokenize.encoders.Encoder.encode`). This mixin holds
what happens around that: at the sample's end the built-in checks run in a
thread of their own, by one process of a machine at a time, while the
stream waits for them (before its first batch, after a little more through
the reference: :meth:`DocumentSample._end_sample`,
:mod:`arrowstream.tokenize.checking`); a passed sample is stored with the
verdict, saying which backend saw the documents, so later processes skip it
(:meth:`DocumentSample._remember_sample`); a verdict another process stores
meanwhile ends it early (:meth:`DocumentSample._proven_elsewhere`); and when
tokie is dropped, tiktoken, which saw only the texts tokie routed, gets a
sample of its own (:meth:`DocumentSample._restart_sample`). Every method
runs under the encoder's lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from arrowstream.core.allocator import release_freed_memory
from arrowstream.core.urgency import is_before_first_batch
from arrowstream.errors import EncoderFallbackWarning, warn_user
from arrowstream.tokenize.checking import ChecksRun, checks_beside
from arrowstream.tokenize.bytelevel import Unconvertible
from arrowstream.tokenize.fast import _Deferred, _flatten
from arrowstream.tokenize.proof import sample_differences
from arrowstream.tokenize.source import TokenizerSource
from arrowstream.tokenize.verdicts import _cached_verdict, _forget_verdict, _store_checked, _store_verdict, documents_vouched

__all__ = ["GRACE_BYTES", "SAMPLE_DOC_CHARS", "DocumentSample"]

#: Text the reference encodes beside the built-in checks before the stream waits for them, where
#: the sample ended before the consumer's first batch (the plan's token sample of each DataLoader
#: worker): enough for its first batches (its first slices). Elsewhere the stream waits at once,
#: and the cores go to the checks: at a 128k vocabulary the reference encodes about 0.5 M tokens/s
#: a core, so the 2-3 s of the checks cost less than a megabyte of text through it.
GRACE_BYTES = 1 << 18
_POLL_S = 0.02
#: During the document sample, a longer document joins it by this many first characters, and the
#: backend encodes it whole (the reference's ``Encoding`` of a 20 MB document took 2.6 GB).
SAMPLE_DOC_CHARS = 64 << 10


class DocumentSample:
    """The document-sample methods of :class:`~arrowstream.tokenize.encoders.Encoder`.

    A mixin: the state is the encoder's (annotated below), and it calls the
    encoder's ``_key``, ``_alive`` and ``_settle`` (a verdict taken, or the
    built-in checks run).
    """

    _lock: threading.Lock
    _checks_lock: threading.Lock
    _run: ChecksRun | None
    _unstored: str
    _beside_bytes: int
    _grace: int
    _tokie_failed: str
    sample_bytes: int
    cache_dir: Any
    _sample_left: int
    _sampled: int
    _sampled_by: str
    _earlier: bool
    _pending: bool
    _keep_owed: bool
    _fast: Any
    _spec: Any
    _tokie: Any
    source: TokenizerSource

    def _end_sample(self) -> int:
        """At the sample's end: settle by the stored verdict, or have the built-in checks run; return the bytes left.

        With no verdict stored, the checks run beside the stream
        (:func:`~arrowstream.tokenize.checking.checks_beside`: in a thread of
        this process, or in another process that holds their lock) and the
        sample goes on, one byte at a time, returning the reference's ids and
        comparing the backends, until their verdict is in: 1 is returned.
        Where tokie is dropped by the verdict, tiktoken's own sample begins
        (its bytes are returned); else 0, the sample is done.
        """
        verdict = _cached_verdict(self._key(), self.cache_dir)
        if self._fast is not None and (verdict is None or (self._tokie is not None and "tokie" not in verdict)):
            run = self._run
            if run is not None and run.done() and isinstance(run.error, Unconvertible):
                self._refuse(run.error, forced=False)  # tiktoken's conversion, done by the checks, was refused
                return 0
            if run is not None and run.done() and run.error is not None:
                raise run.error
            if self._run is None:  # the reference goes on beside them only where the first batch waits
                self._beside_bytes, self._grace = 0, GRACE_BYTES if is_before_first_batch() else 0
            self._run = checks_beside(self._key(), self.cache_dir, self._checks_work(verdict))
            return 1
        return self._settle_sample(verdict)

    def _settle_sample(self, verdict: dict[str, Any] | None) -> int:
        """Settle by ``verdict`` (the checks run now if it is ``None``); return the sample's bytes left."""
        self._settle(verdict)
        if self._unstored:
            warn_user(self._unstored, EncoderFallbackWarning)
            self._unstored = ""
        return self._sample_left if not self._sampled else 0  # a restarted sample, or done

    def _checks_work(self, stored: dict[str, Any] | None) -> Callable[[], None]:
        """The built-in checks as run beside the stream: compute the verdict, store it unless the stream failed meanwhile."""
        key, fast, tokie = self._key(), self._fast, self._tokie

        def work() -> None:
            side = fast.convert() if isinstance(fast, _Deferred) else fast  # may raise Unconvertible: see _end_sample
            checked = self._check(side.spec, side.encoding, tiktoken_too=stored is None, tokie=tokie)
            verdict = {**(stored or {}), **checked}
            with self._checks_lock:  # the stream records a document's mismatch under it
                if self._fast is None:
                    return  # tiktoken gave other ids on a document meanwhile: that verdict is stored
                if self._tokie_failed and "tokie" in verdict:
                    verdict["tokie"] = {"ok": False, "reason": self._tokie_failed}
                self._unstored = _store_checked(key, verdict, self.cache_dir)

        return work

    def _hold_for_checks(self) -> None:
        """After a call of the sample: once its grace (:data:`GRACE_BYTES` or 0) went through the reference, wait for the checks.

        Waits without the encoder's lock, polling: this process's run (which
        stores its verdict), or the verdicts' directory, where another
        process that holds the lock stores it (and runs them here, should
        that process end first or take longer than
        :data:`~arrowstream.tokenize.checking.WAIT_S`).
        """
        while self._pending and self._run is not None and self._beside_bytes >= self._grace:
            run = self._run
            if not run.wait(_POLL_S):
                time.sleep(0 if run.here else _POLL_S)
            with self._lock:
                if self._pending and self._run is not None:
                    self._close_sample(self._end_sample())

    def _await_checks(self) -> None:
        """:meth:`verify`: wait for the checks running in this process, if any, so they are not run twice."""
        run = self._run
        if run is not None and run.wait() and isinstance(run.error, Unconvertible):
            self._refuse(run.error, forced=False)
        elif run is not None and run.done() and run.error is not None:
            raise run.error

    def _close_sample(self, left: int) -> None:
        """Record the bytes of the sample ``left``; at 0, remember that it passed (under the lock)."""
        if not left and self._alive():
            self._remember_sample()
        if self._alive():
            self._sample_left = left
        self._let_go_if_proven()

    def _hold_reference(self) -> None:
        """Hold the tokenizer's source while this encoder may use the reference (:meth:`~arrowstream.tokenize.source.TokenizerSource.let_go`)."""
        self.source.hold(self)
        self._let_go_if_proven()

    def _let_go_if_proven(self) -> None:
        """Once tokie or tiktoken is proven (no sample left, no checks pending), let go of the tokenizer's source.

        The first process of a tokenizer loads it to prove them; the stream
        then never uses it, unless a text is routed to it (loaded again then).
        An encoder left with ``tokenizers`` holds it for good.
        """
        if self._pending or self._sample_left:
            return  # still proving: the reference's ids are the ones returned
        if self._alive():
            self.source.let_go(self)
        if self._keep_owed and self._tokie is not None:
            # Only now, the reference unloaded: keeping loads tokie's form back to check it, and
            # the reference, tokie and its copy together made the first process's peak.
            self._keep_owed = False
            self._tokie.keep()
            if isinstance(self._fast, _Deferred) and self._fast.forget():
                release_freed_memory(anytime=True)  # tiktoken's side waits for a routed text, as in a later process

    def _restart_sample(self) -> None:
        """tokie is dropped: tiktoken, which saw only the texts tokie routed, needs a document sample of its own."""
        if self._sampled_by == "tokie":
            self._sampled_by = "tiktoken"
            if self._sampled:  # documents were sampled with tokie: start over (a sample not begun goes on)
                self._sample_left, self._sampled = self.sample_bytes, 0

    def _proven_elsewhere(self) -> bool:
        """During the sample: whether another process (a DataLoader worker, say) has since stored a full proof.

        If so, the sample ends here and tiktoken encodes (True); a failure
        stored there switches to ``tokenizers`` (False, the sample goes on
        returning the reference's ids until :meth:`encode` sees the backend gone).
        """
        verdict = _cached_verdict(self._key(), self.cache_dir, documents=self.sample_bytes)
        if verdict is None or (verdict["ok"] and documents_vouched(verdict, tokie=self._tokie is not None) < self.sample_bytes):
            return False
        with self._lock:
            if not self._alive() or not self._sample_left:
                return self._alive()
            if self._pending or not verdict["ok"] or (self._tokie is not None and not verdict.get("tokie", {}).get("ok")):
                self._settle(verdict)
            if not self._alive() or documents_vouched(verdict, tokie=self._tokie is not None) < self.sample_bytes:
                return False  # fell back, or tokie dropped and tiktoken not shown on those documents
            self._sample_left, self._earlier = 0, True
            self._sampled = int(verdict.get("documents", 0))
            self._let_go_if_proven()
            return True

    def _remember_sample(self) -> None:
        """Store that the sample passed, with its size, so later processes skip it (under the lock)."""
        key = self._key()
        verdict = _cached_verdict(key, self.cache_dir)
        if verdict is not None and verdict["ok"]:
            mine = {"documents": self._sampled, "documents_by": self._sampled_by}
            if int(verdict.get("documents", 0)) >= self._sampled and verdict.get("documents_by") == self._sampled_by:
                mine = {}  # an earlier record says as much
            _store_verdict(key, {**verdict, **mine}, self.cache_dir)

    def _sample_around(self, texts: Sequence[str], huge: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """During the sample, texts of which some are longer than :data:`SAMPLE_DOC_CHARS`.

        The reference would hold about 25 bytes a byte of such a document
        (a 20 MB one took a process to 2.6 GB): the built-in checks run now,
        the document's first :data:`SAMPLE_DOC_CHARS` characters join the
        sample (compared, counted), and the backend encodes it whole, as it
        will every document once the sample is done. Should the checks or
        the sample find a difference, the reference encodes it after all.
        """
        self.verify()
        long = set(huge)
        cut = [t[:SAMPLE_DOC_CHARS] if i in long else t for i, t in enumerate(texts)]
        flat, lens = self._sample(cut) if self._sample_left else (None, None)
        fast, tok = self._fast, self._tokie
        if fast is None and tok is None:
            return self._reference(texts)
        if flat is None:  # the checks ended the sample (a verdict another process stored)
            return self._backend_encode(fast, tok, texts)
        big_flat, big_lens = self._backend_encode(fast, tok, [texts[i] for i in huge])
        pieces = np.split(flat, np.cumsum(lens)[:-1])
        for i, ids in zip(huge, np.split(big_flat, np.cumsum(big_lens)[:-1])):
            pieces[i] = ids
        return _flatten(pieces)

    def _sample(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Still checking: return the reference's ids, comparing the backends that would encode with them."""
        fast, tok = self._fast, self._tokie
        ref = self._reference(texts)
        bad, bad_tokie = sample_differences(texts, ref, fast, tok, self._reference)
        with self._lock, self._checks_lock:  # the checks' thread stores its verdict under the second
            if bad_tokie is not None and self._tokie is not None:
                self._tokie = None
                self._reason = self._tokie_failed = f"tokie gave other ids than `tokenizers` on a document: {bad_tokie}"
                _forget_verdict(self._key(), self._reason, self.cache_dir, tokie=True)
                _warn(f"the tokenizer falls back from tokie: {self._reason}")
                self._restart_sample()  # tiktoken takes over, once shown equal on documents of its own
            if bad is not None and self._fast is not None:
                self._fast = self._spec = self._tokie = self._run = None
                self._pending = False
                self._reason = f"tiktoken gave other ids than `tokenizers` on a document: {bad}"
                _forget_verdict(self._key(), self._reason, self.cache_dir)
                _warn(f"the tokenizer falls back to the slower `tokenizers` backend: {self._reason}")
            elif bad is None and bad_tokie is None and self._sample_left:
                size = sum(len(t.encode()) for t in texts)
                self._sampled += size
                self._beside_bytes += size if self._run is not None else 0
                left = max(0, self._sample_left - size)
                if not left and self._pending:
                    left = self._end_sample()
                self._close_sample(left)
        return ref


def _warn(message: str) -> None:
    warn_user(
        f"{message}; ids stay exact. Force a backend with `Encoder(tokenizer, backend=...)` and "
        "pass it to `.tokenize(...)`",
        EncoderFallbackWarning,
    )
