"""A look-ahead run's held documents by key, with their sizes and skips kept as they change.

A ``best_fit`` or ``bucket`` state records, for every held document, the
tokens it has left (``held.docs``), which needs each document's size, and
the tokens removed from its front upstream (``skip``, rarely not 0). A
snapshot is taken after every batch (:mod:`~arrowstream.pack.frozen`):
rebuilding those from the documents each time cost ~0.1 ms a batch for a
window of two thousand documents, and sending the documents' tokens with a
snapshot would cost far more. :class:`HeldStore` keeps both as documents
come and go, so a snapshot copies two small dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["HeldStore"]


class HeldStore(dict):  # type: ignore[type-arg]
    """Held documents by key (a dict), keeping each one's size and its nonzero ``skip`` beside it.

    Only item assignment, ``del`` and :meth:`update` change it (what the
    runs use); anything else that would change it is refused.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.pack.lookahead import Doc
    >>> store = HeldStore()
    >>> store[(0, 1)] = Doc(np.arange(5), None, 0)
    >>> store.update({(0, 2): Doc(np.arange(3), None, 2)})
    >>> del store[(0, 1)]
    >>> store.sizes, store.skips
    ({(0, 2): 3}, {(0, 2): 2})
    """

    __slots__ = ("sizes", "skips")

    def __init__(self) -> None:
        super().__init__()
        self.sizes: dict[Any, int] = {}  # each held document's tokens (those removed upstream left out)
        self.skips: dict[Any, int] = {}  # each held document's tokens removed upstream, where not 0

    def __setitem__(self, key: Any, doc: Any) -> None:
        super().__setitem__(key, doc)
        self.sizes[key] = int(doc.tokens.size)
        if doc.skip:
            self.skips[key] = int(doc.skip)
        else:
            self.skips.pop(key, None)

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        del self.sizes[key]
        self.skips.pop(key, None)

    def update(self, other: Mapping[Any, Any]) -> None:  # type: ignore[override]
        """Hold every document of ``other``."""
        for key, doc in other.items():
            self[key] = doc

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a HeldStore changes only by item assignment, del and update (its sizes follow them)")

    pop = popitem = clear = setdefault = __ior__ = _refuse  # type: ignore[assignment]
