"""The document sample of an :class:`~arrowstream.tokenize.encoders.Encoder`: its end, its verdict, its restarts.

Until ``sample_bytes`` of documents have given the reference's ids with the
backends that would encode them, an encoder returns the reference's ids
(:meth:`~arrowstream.tokenize.encoders.Encoder.encode`). This mixin holds
what happens around that: at the sample's end the built-in checks run
(:meth:`DocumentSample._end_sample`); a passed sample is stored with the
verdict, saying which backend saw the documents, so later processes skip it
(:meth:`DocumentSample._remember_sample`); a verdict another process stores
meanwhile ends it early (:meth:`DocumentSample._proven_elsewhere`); and when
tokie is dropped, tiktoken, which saw only the texts tokie routed, gets a
sample of its own (:meth:`DocumentSample._restart_sample`). Every method
runs under the encoder's lock.
"""

from __future__ import annotations

import threading
from typing import Any

from arrowstream.tokenize.verdicts import _cached_verdict, _store_verdict, documents_vouched

__all__ = ["DocumentSample"]


class DocumentSample:
    """The document-sample methods of :class:`~arrowstream.tokenize.encoders.Encoder`.

    A mixin: the state is the encoder's (annotated below), and it calls the
    encoder's ``_key``, ``_alive`` and ``_settle`` (a verdict taken, or the
    built-in checks run).
    """

    _lock: threading.Lock
    sample_bytes: int
    cache_dir: Any
    _sample_left: int
    _sampled: int
    _sampled_by: str
    _earlier: bool
    _pending: bool
    _fast: Any
    _spec: Any
    _tokie: Any

    def _end_sample(self) -> int:
        """At the sample's end: settle by the stored verdict, or run the built-in checks now; return the bytes left.

        Other threads keep encoding with both backends until this is settled;
        where tokie is dropped here, tiktoken's own sample begins (its bytes
        are returned). Run beside the pipeline in a thread of their own, the
        checks measured slower in all: the texts meanwhile go through the
        reference and every backend, on the same two cores.
        """
        self._settle(_cached_verdict(self._key(), self.cache_dir))
        return self._sample_left if not self._sampled else 0  # a restarted sample, or done

    def _close_sample(self, left: int) -> None:
        """Record the bytes of the sample ``left``; at 0, remember that it passed (under the lock)."""
        if not left and self._alive():
            self._remember_sample()
        if self._alive():
            self._sample_left = left

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
