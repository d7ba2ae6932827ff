"""Shuffle-quality measures on orders whose answers are known."""

from __future__ import annotations

import numpy as np

from arrowstream.analysis.quality import (
    position_correlation,
    shuffle_report,
    source_imbalance,
)


def test_in_order_reading_scores_worst() -> None:
    order = np.arange(10_000)
    assert abs(position_correlation(order) - 1.0) < 1e-12
    assert abs(source_imbalance(order // 1000, window=500) - 0.9) < 1e-9


def test_uniform_shuffle_scores_near_zero() -> None:
    order = np.random.default_rng(0).permutation(10_000)
    report = shuffle_report(order, order // 1000, window=500)
    assert abs(report["position_correlation"]) < 0.05
    assert report["source_imbalance"] < 0.1  # sampling noise only


def test_reversed_order_is_perfectly_anticorrelated() -> None:
    assert abs(position_correlation(np.arange(100)[::-1]) + 1.0) < 1e-12
