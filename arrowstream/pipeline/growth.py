"""Continuing a state on a corpus that has grown: files added after it was saved.

A state names the data it was saved on by a fingerprint of every file (paths,
sizes, rows per row group). With ``read_parquet(..., added_files="next_epoch")``
a state whose fingerprint is that of the corpus's *first* files (in path
order: files were only added, and their paths sort after the old ones)
continues: every epoch the state had begun is cut, dealt and read over the
old files, exactly as it would have been, and the added files join from the
epoch after (:class:`GrownPlan`).

That epoch is worked out from everything the given state holds (all DataLoader
workers of a loader's rank state, all consumers of a merged state): one past
the last epoch any of them had begun. States saved while those epochs run
carry it (``dataset.until_epoch``), so resuming again agrees, whichever side
of it each consumer is on. Consumers saved
at one training step agree on it too, as even batches keep their epochs in
step.

Invariants: a state on unchanged files never takes this path; nothing of an
added file is read before the epoch it joins at.
"""

from __future__ import annotations

import copy
from typing import Any

from arrowstream.distributed.topology import Consumer, Left, RowRange
from arrowstream.errors import StateMismatchError
from arrowstream.io.layout import Layout
from arrowstream.pipeline.plan import Plan
from arrowstream.state import Work

__all__ = ["ADDED_FILES", "GrownPlan", "resume_plan"]

#: What ``read_parquet(added_files=...)`` accepts.
ADDED_FILES = ("refuse", "next_epoch")


class GrownPlan(Plan):
    """A plan whose epochs before ``until_epoch`` are cut over its first ``num_files`` files only.

    Shares everything else (stages, packer, reader, options) with ``plan``;
    shard indices agree, as the old files come first.

    Examples
    --------
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> plan = GrownPlan(Plan.of(read_parquet(example_dir())), num_files=1, until_epoch=1)
    >>> plan.at(0).manifest.num_files, plan.at(1) is plan
    (1, True)
    """

    def __init__(self, plan: Plan, *, num_files: int, until_epoch: int) -> None:
        self.__dict__.update(plan.__dict__)  # its caches too: from until_epoch on, the same files
        old = copy.copy(plan)
        old.manifest = plan.manifest.head(num_files)
        old._clear()
        self.old, self.until_epoch = old, until_epoch

    def at(self, epoch: int) -> Plan:
        """Return the old files' plan before :attr:`until_epoch`, this one from it on."""
        return self.old if epoch < self.until_epoch else self

    def layout(self, epoch: int, num_streams: int = 1, by: str = "rows") -> Layout:
        if epoch < self.until_epoch:
            return self.old.layout(epoch, num_streams, by)
        return super().layout(epoch, num_streams, by)

    def fresh_deal(self, epoch: int, consumer: Consumer) -> Work:
        if epoch < self.until_epoch:
            return self.old.fresh_deal(epoch, consumer)
        return super().fresh_deal(epoch, consumer)

    def recut(
        self, epoch: int, num_streams: int, by: str, pooled: list[RowRange], parts: int, left: Left | None = None
    ) -> list[list[RowRange]] | None:
        if epoch < self.until_epoch:
            return self.old.recut(epoch, num_streams, by, pooled, parts, left)
        return super().recut(epoch, num_streams, by, pooled, parts, left)

    def batch_targets(
        self,
        epoch: int,
        parts: list[list[RowRange]],
        num_streams: int,
        by: str = "rows",
        per_rank: int = 1,
        left: Left | None = None,
    ) -> list[int]:
        if epoch < self.until_epoch:
            return self.old.batch_targets(epoch, parts, num_streams, by, per_rank, left)
        return super().batch_targets(epoch, parts, num_streams, by, per_rank, left)

    def describe(self, epoch: int) -> dict[str, Any]:
        """Return the data identity a state saved in ``epoch`` carries."""
        if epoch < self.until_epoch:
            return {**self.old.manifest.describe(), "until_epoch": self.until_epoch}
        return self.manifest.describe()


def resume_plan(plan: Plan, state: Any) -> Plan:
    """Return the plan to continue ``state`` with: ``plan``, or a :class:`GrownPlan` of it.

    Raises
    ------
    StateMismatchError
        The state was saved on the first files of this corpus (files were
        added since) and ``added_files`` is ``"refuse"``: the message says how
        to continue.
    """
    saved = _old_dataset(state, plan.manifest.fingerprint)
    manifest = plan.manifest
    if saved is None:
        return plan
    num = saved.get("num_files")
    if not isinstance(num, int) or not 1 <= num < manifest.num_files:
        return plan
    if manifest.head(num).fingerprint != saved.get("fingerprint"):
        if plan.added_files == "next_epoch":  # asked to continue: say why it cannot
            raise StateMismatchError(
                f"the state was saved on {num} file(s) and there are {manifest.num_files} now, but the "
                f"first {num} in path order are not the files it was saved on: a state continues on "
                "a grown corpus only when files were added after the old ones in path order (name "
                "them to sort last) and none was renamed, rewritten or removed; or start without "
                "the state"
            )
        return plan  # not a prefix: other data, which the identity check reports
    if plan.added_files != "next_epoch":
        raise StateMismatchError(
            f"the state was saved on the first {num} of these {manifest.num_files} files: "
            f"{manifest.num_files - num} file(s) were added since, from {manifest.relpaths[num]!r} "
            "on. To finish the state's epoch over the old files and read the added ones from the "
            "next epoch on, pass `added_files=\"next_epoch\"` to read_parquet; or start without "
            "the state"
        )
    until = saved.get("until_epoch")  # a grown run's state says, its consumers may be past it
    if not isinstance(until, int):
        until = _last_epoch(state, saved["fingerprint"]) + 1
    return GrownPlan(plan, num_files=num, until_epoch=until)


def _old_dataset(state: Any, fingerprint: str) -> dict[str, Any] | None:
    """Return the first data identity in ``state`` that is not ``fingerprint``'s, if any."""
    for own in _owns(state):
        saved = own.get("dataset")
        if isinstance(saved, dict) and saved.get("fingerprint") != fingerprint:
            return saved
    return None


def _owns(state: Any) -> list[dict[str, Any]]:
    """Return the consumer states (or the merged state) ``state`` holds."""
    if not isinstance(state, dict):
        return []
    if state.get("kind") == "rank":
        return [s for s in state.get("states") or [] if isinstance(s, dict)]
    return [state]


def _last_epoch(state: dict[str, Any], fingerprint: str) -> int:
    """Return the last epoch begun by any consumer ``state`` holds on the old files."""
    last = 0
    for own in _owns(state):
        if (own.get("dataset") or {}).get("fingerprint") != fingerprint:
            continue
        entries = own.get("consumers") if own.get("kind") == "global" else [own]
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict):
                continue
            position = entry.get("position")
            epoch = position.get("epoch") if isinstance(position, dict) else None
            if isinstance(epoch, int):
                ahead = (1 + len(entry.get("later_work") or [])) if entry.get("next_work") else 0
                last = max(last, epoch + ahead)
        if isinstance(own.get("epoch"), int):
            last = max(last, own["epoch"])
    return last
