"""Data mixtures: several tokenized sources by token weight, on a deterministic global schedule.

See :func:`arrowstream.mix` and ``docs/mixtures.md``.
"""

from arrowstream.mixture.iterator import MixtureIterator
from arrowstream.mixture.mix import Mixture, PackedMixture, mix

__all__ = ["Mixture", "MixtureIterator", "PackedMixture", "mix"]
