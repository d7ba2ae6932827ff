"""Running a plan: a consumer's processed chunks, epoch after epoch.

:func:`iter_chunks` walks a consumer's work (its row ranges of each epoch's
layout), reads the rows, runs the stages over them and trims the documents a
range shares with another consumer or with the run before a resume: the
first ``skip`` tokens of a range's first row went out elsewhere, and with a
``take`` only the tokens of its last row before it are this consumer's.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Executor

from arrowstream.core.execute import run_stages
from arrowstream.distributed.topology import Consumer
from arrowstream.errors import ConfigError
from arrowstream.io.chunk import Chunk
from arrowstream.io.reader import ShardReader, innermost
from arrowstream.io.source import iter_stream
from arrowstream.pipeline.plan import Plan
from arrowstream.state import Position, Work

__all__ = ["iter_chunks"]


def iter_chunks(
    plan: Plan,
    reader: ShardReader,
    start: Position,
    deals: dict[int, Work],
    consumer: Consumer,
    pool: Executor | None = None,
) -> Iterator[Chunk]:
    """Yield ``consumer``'s processed chunks of ``plan`` from ``start`` on.

    ``deals`` maps an epoch to the consumer's work in it (with the
    layout's streams it refers to), where that is not a fresh share (a resumed
    epoch, and maybe the next, re-dealt); other epochs are fresh. Token
    offsets are the packer's business. ``pool`` runs expensive stages a
    few pieces at once.
    """
    epoch, segment, seq = start.epoch, start.segment, start.seq
    head_skip = start.token_offset
    deal = deals.get(epoch) or plan.fresh_deal(epoch, consumer)
    while plan.num_epochs is None or epoch < plan.num_epochs:
        layout = plan.layout(epoch, deal.num_streams, deal.by)
        work = list(deal.segments)
        if layout.num_rows == 0 and plan.num_epochs is None:
            raise ConfigError(
                "the filter leaves no row group to read, so an endless stream would never "
                "yield: loosen the filter"
            )
        docs = 0
        for k in range(segment, len(work)):
            stream, lo, hi, skip, take = work[k]
            first, skip = (seq, head_skip) if k == segment else (lo, skip)
            source = iter_stream(
                reader,
                layout,
                stream,
                start_seq=first,
                end_seq=hi,
                batch_rows=plan.batch_rows,
                segment=k,
            )
            for out in run_stages(
                plan.stages, source, where=plan.where, pool=pool, in_flight=plan.num_inflight
            ):
                if skip and first < hi:  # tokens of the first document already emitted
                    out, skip = out.trim_head(first, skip), 0
                if take and out.seq_end == hi:  # the last document's rest is another consumer's
                    out = out.trim_tail(hi - 1, take)
                docs += out.num_docs
                yield out
        fresh = segment == 0 and work and seq == work[0][1]
        if docs == 0 and fresh and plan.num_epochs is None:
            raise ConfigError(
                f"epoch {epoch} kept no document for consumer {consumer.index} of "
                f"{consumer.count} (all filtered, null or empty, or fewer rows than "
                "consumers), so an endless stream would never yield: check the filter and "
                "the data"
            )
        epoch += 1
        # each epoch opens its files again, after checking them: a file replaced since is seen (size, ETag, mtime)
        innermost(reader, "recheck").recheck()
        deal = deals.get(epoch) or plan.fresh_deal(epoch, consumer)
        work = list(deal.segments)
        segment = 0
        seq, head_skip = (work[0][1], work[0][3]) if work else (0, 0)

