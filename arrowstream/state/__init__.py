"""The checkpoint format: positions as small coordinates, never data.

A state is a JSON-able ``dict`` with the same keys at every step (a part
that is empty now is ``null``; every counter the pipeline can move is there
from the first state on, at 0)::

    {
      "format": "arrowstream.state", "version": 6,
      "dataset": {"fingerprint": ..., "num_files": ..., "num_shards": ..., "num_rows": ...},
      "options_hash": ..., "options": {...},
      "position": {"epoch": 0, "segment": 0, "seq": 1234, "token_offset": 17,
                   "stream": 0, "file": "part-0.parquet", "row_group": 2, "row": 210},
      "work": {"num_streams": 1, "by": "rows", "segments": [[0, 0, 5000, 0]]},
      "consumer": {"index": 0, "count": 1},
      "stats": {"rows": ..., "docs": ..., "tokens": ..., "batches": ..., ...},
      "packer": {},
      "held": null,       # documents a look-ahead packer holds back, as references
      "next_work": null,  # the next epoch's share, when a merge re-dealt it
      "later_work": [],   # the shares of the epochs after that (a mixture's drifted sources)
    }

Version 2 states (which left empty parts out) load too.

``work`` lists the consumer's segments of the epoch (``[stream, start, end,
skip]`` rows of the epoch's streams, read in order, with a fifth number,
``take``, when the last row is only partly this consumer's); ``position.segment``,
``position.seq`` (row sequence number in that segment's stream) and
``position.token_offset`` (tokens of that document already emitted) are
authoritative; ``stream``, ``file``, ``row_group`` and ``row`` name the same
place for people and are checked on load. A *global* state from
:func:`~arrowstream.distributed.topology.merge_states` holds every consumer's state
instead. See ``docs/state-format.md``.
"""

from arrowstream.state.envelope import (
    READABLE_VERSIONS,
    STATE_FORMAT,
    STATE_VERSION,
    WHERE_KEYS,
    State,
    check_identity,
    check_state,
    hash_options,
)
from arrowstream.state.packers import (
    BestFitState,
    BucketState,
    DocKey,
    Progress,
    SegmentRef,
)
from arrowstream.state.parts import STREAMS_BY, Held, Position, RowRange, Work

__all__ = [
    "STREAMS_BY",
    "READABLE_VERSIONS",
    "STATE_FORMAT",
    "STATE_VERSION",
    "WHERE_KEYS",
    "BestFitState",
    "BucketState",
    "DocKey",
    "Held",
    "SegmentRef",
    "Position",
    "Progress",
    "RowRange",
    "State",
    "Work",
    "check_identity",
    "check_state",
    "hash_options",
]
