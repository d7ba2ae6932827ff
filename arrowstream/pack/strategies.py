"""The packing strategies by name, as ``.pack(strategy=...)`` takes them."""

from __future__ import annotations

from typing import Any

from arrowstream.checks import check_options
from arrowstream.errors import ConfigError
from arrowstream.pack import ConcatPacker, Packer
from arrowstream.pack.bestfit import BestFitPacker

__all__ = ["STRATEGIES", "make_packer"]

#: Strategy name to packer class.
STRATEGIES: dict[str, type[Packer]] = {"concat": ConcatPacker, "best_fit": BestFitPacker}

#: The options every strategy takes.
_COMMON = {"seq_len", "batch_size", "drop_last", "pad_id", "even_batches"}


def make_packer(strategy: str, **options: Any) -> Packer:
    """Return the packer registered under ``strategy``, built from its ``options`` (validated there).

    A strategy's own option passed as ``None`` takes its default.

    Raises
    ------
    ConfigError
        ``strategy`` is not a known strategy, or ``concat`` is given an option
        only ``best_fit`` takes.

    Examples
    --------
    >>> make_packer("best_fit", seq_len=8, batch_size=2, pad_id=0).spec()["window"]
    1024
    """
    cls = STRATEGIES.get(strategy)
    if cls is None:
        raise ConfigError(
            f"unknown packing strategy {strategy!r}: expected one of {sorted(STRATEGIES)!r}"
        )
    check_options(".pack", options, BestFitPacker, also=("strategy",))  # a typo: best_fit takes concat's and more
    # a strategy option given as None means "the strategy's default" (so one call can switch strategies)
    options = {k: v for k, v in options.items() if v is not None or k in _COMMON}
    extra = sorted(set(options) - _COMMON)
    if cls is ConcatPacker and extra:
        raise ConfigError(
            f"strategy 'concat' takes no {extra!r}: those are options of strategy='best_fit'"
        )
    check_options(".pack", options, cls)  # `seq_len` and `batch_size` given
    return cls(**options)
