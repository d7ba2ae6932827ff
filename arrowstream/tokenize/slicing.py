"""How text is cut into encoder calls: slices by bytes of text, small first, then full size.

A tokenize stage hands its encoder one slice of rows at a time. The first
slice after a start, a resume or an epoch start is small, so the first batch
waits for one short call; each next slice doubles, up to the full size,
which depends on the backend: a call of tokie is several times quicker than
one of tiktoken, so its per-call costs weigh more and its slices are larger.
Slicing never changes the output: a document's ids depend only on its text.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["SLICE_BYTES", "TOKIE_SLICE_BYTES", "slice_bounds", "slice_budgets"]

#: Text per encoder call by default (``slice_bytes=None``), and while tokie encodes.
SLICE_BYTES = 1 << 18
TOKIE_SLICE_BYTES = 1 << 21


def slice_budgets(first: int, most: int, warm: int) -> Iterator[int]:
    """Yield byte budgets: ``first`` doubling per slice (``warm`` already cut), capped at ``most``.

    Examples
    --------
    >>> import itertools
    >>> list(itertools.islice(slice_budgets(10, 50, 0), 5)), next(slice_budgets(10, 50, 1))
    ([10, 20, 40, 50, 50], 20)
    """
    step = warm
    while True:
        yield most if step >= 32 else min(most, first << step)
        step += 1


def slice_bounds(sizes: np.ndarray, budgets: Iterator[int]) -> np.ndarray:
    """Return row indices that cut rows of ``sizes`` bytes into runs of about the next budget's bytes (greedy).

    A rest under a quarter of the budget joins the run before it rather than
    making a call of its own (a row group of 1.2 MB is one call of a 1 MiB
    budget, not two).

    Examples
    --------
    >>> import numpy as np
    >>> slice_bounds(np.array([4, 4, 4, 4, 4]), iter([5, 5, 100])).tolist()
    [2, 4]
    >>> slice_bounds(np.array([4, 4, 4, 4, 1]), iter([16, 16])).tolist()
    []
    """
    cum = np.cumsum(sizes)
    bounds = []
    start_bytes = 0
    while True:
        budget = next(budgets)
        i = int(np.searchsorted(cum, start_bytes + budget, side="left")) + 1
        if i >= sizes.size or (cum[-1] - cum[i - 1]) * 4 < budget:
            break
        bounds.append(i)
        start_bytes = int(cum[i - 1])
    return np.asarray(bounds, dtype=np.int64)
