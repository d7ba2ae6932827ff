"""A mixture consumer's state at one position: its own counters copied now, its sources' snapshots built later.

:meth:`MixtureIterator.snapshot <arrowstream.mixture.iterator.MixtureIterator.snapshot>`
copies the consumer's own part (schedule stages, batches, counters) and
keeps a snapshot of each source's pipeline (:mod:`arrowstream.pipeline.snapshot`);
:meth:`MixtureSnapshot.to_dict` builds the mixture state from them. Pickled
(a DataLoader worker of :class:`~arrowstream.pytorch.StatefulLoader` sends
one with each batch), it leaves the mixture and the sources' plans behind;
:meth:`MixtureSnapshot.with_plan` takes them back from an iterator over the
same mixture and consumer (its :attr:`~arrowstream.mixture.iterator.MixtureIterator.plan`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from arrowstream.errors import ConfigError
from arrowstream.mixture.merge import KIND
from arrowstream.state import STATE_FORMAT, STATE_VERSION
from arrowstream.state.checksum import with_checksum
from arrowstream.state.sealed import shared_rows
from arrowstream.state.snapshot import Snapshot

__all__ = ["MixturePlans", "MixtureSnapshot"]


class MixturePlans(NamedTuple):
    """What a mixture snapshot leaves behind when pickled: the mixture, and each source's plan by name."""

    mixture: Any
    sources: dict[str, Any]


@dataclass(frozen=True, slots=True)
class MixtureSnapshot:
    """A mixture consumer's state at one position; :meth:`to_dict` builds it.

    ``mixture`` is ``None`` once unpickled, and so is each source snapshot's
    plan, until :meth:`with_plan` puts them back.

    Examples
    --------
    >>> import pickle
    >>> from arrowstream import mix, read_parquet
    >>> from arrowstream.testing import example_dir
    >>> ids = read_parquet(example_dir()).tokenize(None, column="ids", eos_id=0)
    >>> it = mix({"a": ids, "b": ids}, {"a": 0.5, "b": 0.5}).pack(seq_len=8, batch_size=2).iter()
    >>> first = next(it)
    >>> crossed = pickle.loads(pickle.dumps(it.snapshot()))
    >>> crossed.plan is None
    True
    >>> crossed.with_plan(it.plan).to_dict() == it.state_dict()
    True
    """

    mixture: Any
    own: dict[str, Any]
    sources: dict[str, Snapshot]
    dormant: dict[str, Any]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle without the mixture (the sources' snapshots leave their plans behind too)."""
        return (MixtureSnapshot, (None, self.own, self.sources, self.dormant))

    def shared_rows(self) -> list[Any]:
        """Every source's rows that a later snapshot may hold unchanged, source by source (see :mod:`arrowstream.state.sealed`)."""
        return [row for snap in self.sources.values() for row in shared_rows(snap)]

    @property
    def plan(self) -> MixturePlans | None:
        """The mixture and the sources' plans, ``None`` when pickled without them."""
        if self.mixture is None or any(getattr(s, "plan", True) is None for s in self.sources.values()):
            return None
        return MixturePlans(self.mixture, {name: getattr(s, "plan", None) for name, s in self.sources.items()})

    def with_plan(self, plan: MixturePlans) -> MixtureSnapshot:
        """Return this snapshot with ``plan``: the ``plan`` of an iterator over the same mixture, state and consumer."""
        sources = {
            name: snap.with_plan(plan.sources[name]) if getattr(snap, "plan", True) is None else snap  # type: ignore[attr-defined]
            for name, snap in self.sources.items()
        }
        return replace(self, mixture=plan.mixture, sources=sources)

    def to_dict(self) -> dict[str, Any]:
        """Return the mixture state at the position captured."""
        if self.mixture is None:
            raise ConfigError(
                "this mixture snapshot was pickled without its mixture: give it back the plan of an "
                "iterator over the same mixture, state and consumer with `snapshot.with_plan(iterator.plan)`"
            )
        own = copy.deepcopy(self.own)
        return with_checksum({
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "kind": KIND,
            "mixture": self.mixture.options(),
            "consumer": own["consumer"],
            "topology": own["topology"],
            "stages": own["stages"],
            "position": own["position"],
            "stats": own["stats"],
            "sources": {name: snap.to_dict() for name, snap in self.sources.items()},
            "dormant": copy.deepcopy(self.dormant),
            **({"prior": own["prior"]} if own.get("prior") else {}),
            **({"earlier": own["earlier"]} if own.get("earlier") else {}),
        })
