"""The packing strategies by name, as ``.pack(strategy=...)`` takes them."""

from __future__ import annotations

from typing import Any

from arrowstream.errors import ConfigError
from arrowstream.pack import ConcatPacker, Packer
from arrowstream.pack.bestfit import BestFitPacker

__all__ = ["STRATEGIES", "make_packer"]

#: Strategy name to packer class.
STRATEGIES: dict[str, type[Packer]] = {"concat": ConcatPacker, "best_fit": BestFitPacker}


def make_packer(
    strategy: str,
    *,
    seq_len: int,
    batch_size: int,
    drop_last: bool,
    pad_id: int,
    even_batches: bool = True,
    **options: Any,
) -> Packer:
    """Return the packer registered under ``strategy``, with its own ``options``.

    Raises
    ------
    ConfigError
        ``strategy`` is not a known strategy, or takes none of ``options``.
    """
    cls = STRATEGIES.get(strategy)
    if cls is None:
        raise ConfigError(
            f"unknown packing strategy {strategy!r}: expected one of {sorted(STRATEGIES)!r}"
        )
    if cls is ConcatPacker and options:
        raise ConfigError(
            f"strategy 'concat' takes no {sorted(options)!r}: those are options of "
            "strategy='best_fit'"
        )
    return cls(
        seq_len=seq_len,
        batch_size=batch_size,
        drop_last=drop_last,
        pad_id=pad_id,
        even_batches=even_batches,
        **options,
    )
