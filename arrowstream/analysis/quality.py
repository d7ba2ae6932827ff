"""Shuffle quality: how far an output order is from the input order.

Both measures take, for each emitted document in output order, its position
in the input (manifest) order and its source (file) index:

- :func:`position_correlation`: the rank correlation between output position
  and input position. 1 for reading in order, about 0 for a uniform shuffle.
- :func:`source_imbalance`: the mean total-variation distance between the mix
  of sources in each run of ``window`` consecutive documents and the mix over
  the whole epoch. Near 1 when runs come from one file, near 0 when every run
  looks like the whole dataset (a uniform shuffle leaves only sampling noise,
  about ``sqrt(num_sources / window) / 2``).

Examples
--------
>>> import numpy as np
>>> order = np.arange(1000)
>>> round(position_correlation(order), 3), round(source_imbalance(order // 100, window=100), 3)
(1.0, 0.9)
"""

from __future__ import annotations

import numpy as np

__all__ = ["position_correlation", "shuffle_report", "source_imbalance"]


def position_correlation(input_positions: np.ndarray) -> float:
    """Spearman correlation between output index and input position."""
    x = np.asarray(input_positions)
    if x.size < 2:
        return 0.0
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[np.argsort(x, kind="stable")] = np.arange(x.size)
    return float(np.corrcoef(np.arange(x.size, dtype=np.float64), ranks)[0, 1])


def source_imbalance(sources: np.ndarray, *, window: int) -> float:
    """Mean total-variation distance between each window's source mix and the overall mix."""
    s = np.asarray(sources, dtype=np.int64)
    num_windows = s.size // window
    if num_windows == 0:
        return 0.0
    k = int(s.max()) + 1
    overall = np.bincount(s, minlength=k) / s.size
    runs = s[: num_windows * window].reshape(num_windows, window)
    counts = np.zeros((num_windows, k), dtype=np.float64)
    np.add.at(counts, (np.repeat(np.arange(num_windows), window), runs.ravel()), 1.0)
    return float((0.5 * np.abs(counts / window - overall).sum(axis=1)).mean())


def shuffle_report(
    input_positions: np.ndarray, sources: np.ndarray, *, window: int = 1000
) -> dict[str, float]:
    """Return both measures as a dict (``position_correlation``, ``source_imbalance``)."""
    return {
        "position_correlation": position_correlation(input_positions),
        "source_imbalance": source_imbalance(sources, window=window),
    }
