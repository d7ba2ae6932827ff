"""A look-ahead run's held documents by key, with the sizes and skips its state needs, kept as they change.

A ``best_fit`` or ``bucket`` state records every held document's ``skip``
(tokens removed upstream, rarely not 0) and the tokens it has left
(``held.docs``), which needs its size. A snapshot is taken after every
batch (:mod:`~arrowstream.pack.frozen`), and a DataLoader worker pickles it
with every batch: copying every held document's size into it made it five
times larger (2.7 -> 13.6 KB a batch for ``best_fit``), and sending the
documents' tokens would cost far more.

:class:`HeldStore` keeps the sizes in one dict per window of documents
(:attr:`HeldStore.windows`), each filled as its documents come and never
changed after the snapshot that follows (:meth:`HeldStore.seal`), and drops
a window's dict once none of its documents is held. A snapshot copies the
list of them; consecutive snapshots share the dicts themselves, which a
stream of snapshots sends as their place in the one before
(:class:`~arrowstream.state.sealed.SealStream`), so each window's sizes
cross once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["HeldStore", "size_in"]


class HeldStore(dict):  # type: ignore[type-arg]
    """Held documents by key (a dict), with each one's size in :attr:`windows` and its nonzero ``skip``.

    A size is at most ``cap`` (a document truncated there gives no more).
    Only item assignment, ``del``, :meth:`update`, :meth:`hold` and
    :meth:`let_go` change the store (what the runs use); anything else that
    would change it is refused.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.pack.windows import Doc
    >>> store = HeldStore()
    >>> store[(0, 1)] = Doc(np.arange(5), None, 0)
    >>> store.seal()   # a snapshot shares the first window's dict: later documents go to a new one
    >>> store.update({(0, 2): Doc(np.arange(3), None, 2)})
    >>> store.windows, store.skips
    ([{(0, 1): 5}, {(0, 2): 3}], {(0, 2): 2})
    >>> del store[(0, 1)]   # the first window holds no document any more
    >>> store.windows, size_in(store.windows, (0, 2))
    ([{(0, 2): 3}], 3)
    """

    __slots__ = ("_live", "_open", "_window_of", "cap", "skips", "windows")

    def __init__(self, *, cap: int | None = None) -> None:
        super().__init__()
        self.cap = cap
        self.skips: dict[Any, int] = {}  # each held document's tokens removed upstream, where not 0
        self.windows: list[dict[Any, int]] = []  # sizes (tokens it gives in all), a dict per window; never rebound
        self._open: dict[Any, int] | None = None  # the last window's, while documents may still join it
        self._window_of: dict[Any, dict[Any, int]] = {}
        self._live: dict[int, int] = {}  # id of a window's dict -> its documents still held

    def __setitem__(self, key: Any, doc: Any) -> None:
        if key in self:
            self._let_go(key)
        super().__setitem__(key, doc)
        window = self._window()
        n = int(doc.tokens.size)
        window[key] = n if self.cap is None else min(n, self.cap)
        self._window_of[key] = window
        self._live[id(window)] += 1
        if doc.skip:
            self.skips[key] = int(doc.skip)
        else:
            self.skips.pop(key, None)

    def __delitem__(self, key: Any) -> None:
        self.let_go((key,))

    def hold(self, keys: Sequence[Any], docs: Sequence[Any], sizes: Sequence[int] | None = None) -> None:
        """Hold ``docs[i]`` as ``keys[i]``, in order: what assigning each one does, at a fraction of the cost.

        ``sizes``, if given, are the documents' token counts (``docs[i].tokens.size``), known to the caller.
        """
        fresh = dict(zip(keys, docs))
        if not fresh:
            return
        if len(fresh) != len(keys) or not self.keys().isdisjoint(fresh):  # a key twice, or held already
            for key, doc in zip(keys, docs):
                self[key] = doc
            return
        super().update(fresh)
        window, cap = self._window(), self.cap
        if sizes is None:
            sizes = [doc.tokens.size for doc in docs]
        window.update(zip(keys, sizes if cap is None else [min(n, cap) for n in sizes]))
        self._window_of.update(dict.fromkeys(keys, window))
        self._live[id(window)] += len(fresh)
        if any([doc.skip for doc in docs]):  # rarely: only a re-dealt document's tail has one
            self.skips.update((key, int(doc.skip)) for key, doc in zip(keys, docs) if doc.skip)

    def let_go(self, keys: Iterable[Any]) -> None:
        """Stop holding every one of ``keys``, in order: what ``del`` of each one does, at a fraction of the cost."""
        delete, window_of, live, skips = super().__delitem__, self._window_of.pop, self._live, self.skips
        for key in keys:  # _let_go's work inlined: one call per key costs as much as the rest
            delete(key)
            window = window_of(key)
            left = live[id(window)] - 1
            if left:
                live[id(window)] = left
            else:
                self._drop_window(window)
            if skips:
                skips.pop(key, None)

    def _window(self) -> dict[Any, int]:
        """The dict of sizes that documents held now join (a new one after a snapshot sealed the last)."""
        if self._open is None:
            self._open = {}
            self.windows.append(self._open)
            self._live[id(self._open)] = 0
        return self._open

    def _let_go(self, key: Any) -> None:
        window = self._window_of.pop(key)
        self._live[id(window)] -= 1
        if not self._live[id(window)]:
            self._drop_window(window)

    def _drop_window(self, window: dict[Any, int]) -> None:
        """Forget ``window``, none of whose documents is held any more."""
        del self._live[id(window)]
        self.windows[:] = [w for w in self.windows if w is not window]  # in place: runs hold this list
        if window is self._open:
            self._open = None

    def seal(self) -> None:
        """Let no document join the dicts of :attr:`windows` from now on (a snapshot shares them)."""
        self._open = None

    def update(self, other: Mapping[Any, Any]) -> None:  # type: ignore[override]
        """Hold every document of ``other``."""
        self.hold(list(other), list(other.values()))

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle would set the items before the attributes; rebuild through __setitem__ instead
        return (_rebuilt, (self.cap, dict(self)))

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a HeldStore changes only by item assignment, del, update, hold and let_go (its sizes follow them)")

    pop = popitem = clear = setdefault = __ior__ = _refuse  # type: ignore[assignment]


def size_in(windows: Sequence[Mapping[Any, int]], key: Any) -> int:
    """Return held document ``key``'s size from a store's :attr:`~HeldStore.windows` (the newest that has it)."""
    for window in reversed(windows):
        size = window.get(key)
        if size is not None:
            return size
    raise KeyError(key)


def _rebuilt(cap: int | None, docs: dict[Any, Any]) -> HeldStore:
    store = HeldStore(cap=cap)
    store.update(docs)
    return store
