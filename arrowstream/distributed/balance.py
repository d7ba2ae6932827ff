"""Even batches, estimated: how many batches every consumer emits in an epoch.

When the pipeline can tell every consumer's tokens before the epoch (token
ids, a length index, a complete read-only cache), the number is counted
instead (see :mod:`arrowstream.distributed.tokens`); this module estimates
it otherwise.

With several consumers (ranks x DataLoader workers) and finite epochs, DDP
hangs at an epoch end if one rank runs out of batches before the others.
Every row group gets an estimate of its tokens (:func:`token_estimates`: its
Parquet bytes times a token rate), each epoch is cut into shares of equal
estimated tokens (:func:`byte_cut` over those weights; equal rows when a
batch takes a fixed number of documents), and every consumer emits the same
number of batches, computed identically everywhere from information all of
them share:

    estimate(part) = estimated tokens of the part's rows
    target = floor(min over parts of estimate * (1 - slack) / (seq_len * batch_size))

The token rates come from a fixed sample (the first rows of up to 16 row
groups spread over the epoch, run through the pipeline's stages, weighed by
their share of their row group's bytes): the overall rate, or a sampled row
group's own rate for the row groups nearest it where that differs from the
overall one by more than :data:`LOCAL_RATE_MARGIN` (a corpus whose files
differ in tokens per byte). Parquet bytes are the uncompressed sizes of the
columns the pipeline reads, from the footers (columns it does not read do
not count, however large). The packer carries what a consumer has beyond the
target into the next epoch's count (drops and counts it, with a warning, in
the last epoch) and pads with all-padding batches when it runs short.

Length bucketing (:mod:`arrowstream.pack.bucket`) emits batches of varying tokens, so
it divides by what a batch consumes instead, simulated on the same sample's
document lengths: with ``max_tokens``, the tokens read per batch (the estimate
above); with ``batch_size``, the documents read per batch, against the part's
rows (exact from the footers) times the sample's documents per row
(:func:`doc_target`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from arrowstream.core.execute import run_stages
from arrowstream.core.stage import Stage
from arrowstream.core.urgency import before_first_batch
from arrowstream.distributed.topology import RowRange, held_left
from arrowstream.errors import ShardError
from arrowstream.io.chunk import Chunk
from arrowstream.io.failures import skippable
from arrowstream.io.layout import Layout
from arrowstream.io.manifest import Manifest
from arrowstream.io.reader import ShardReader

__all__ = [
    "EVEN_BATCHES_SLACK",
    "LOCAL_RATE_MARGIN",
    "Sample",
    "batch_target",
    "byte_cut",
    "doc_target",
    "measure_sample",
    "token_estimates",
]

#: Fraction taken off the smallest share's estimate. Shares are cut by equal Parquet bytes
#: (:func:`byte_cut`), so their estimates agree and the smallest is the estimate itself:
#: no slack is taken (measured on 1 GB of text, 16 consumers: 0 dropped, 0.1 % padding;
#: with 1 % off, 0.9 % was dropped). A consumer beyond it drops the rest, with a warning.
EVEN_BATCHES_SLACK = 0.0

_SAMPLE_ROWS = 1024
_SAMPLE_SHARDS = 16

#: A sampled row group's own token rate is used for its part of the corpus only where it
#: differs from the overall rate by more than this share (measured on 1 GB of one kind of
#: text: local rates everywhere dropped 0.097 %, the overall rate 0.023 %; on prose and
#: identifiers in separate files, the overall rate dropped 24 %).
LOCAL_RATE_MARGIN = 0.1


@dataclass(frozen=True, slots=True)
class Sample:
    """What the pipeline's stages make of a fixed sample of rows."""

    rows: int  # rows read
    nbytes: float  # their share of the Parquet bytes of the columns read
    num_tokens: int  # tokens made
    lengths: np.ndarray  # tokens per document kept
    shards: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # the row groups sampled
    rates: np.ndarray = field(default_factory=lambda: np.empty(0))  # tokens per Parquet byte of each

    @property
    def token_rate(self) -> float:
        """Tokens per Parquet byte."""
        return self.num_tokens / self.nbytes if self.nbytes else 0.0

    @property
    def docs_per_row(self) -> float:
        """Documents kept per row read (filters, null and empty rows leave fewer)."""
        return self.lengths.size / self.rows if self.rows else 0.0


def measure_sample(
    manifest: Manifest,
    columns: Sequence[str],
    shards: np.ndarray,
    stages: Sequence[Stage],
    where: Callable[[Chunk], str],
    shard_bytes: np.ndarray,
    *,
    skip_unreadable: bool = False,
) -> Sample:
    """Run rows spread over ``shards`` through ``stages``; return the rows, bytes and lengths.

    Reads the first rows of up to 16 row groups evenly spaced over the epoch's
    shards, 1,024 rows in all, so a corpus whose parts differ (sources in
    turn, sorted files) is measured across them, not by its first row group;
    each sampled row group's own token rate is kept too (see
    :func:`token_estimates`). With ``skip_unreadable`` (``on_error="skip"``)
    a row group whose bytes do not decode is left out of the sample, as the
    run leaves it out (and warns there).
    """
    reader = ShardReader(manifest, columns)
    rows_read, tokens, nbytes = 0, 0, 0.0
    lengths: list[np.ndarray] = []
    sampled, rates = [], []
    picks = np.unique(np.linspace(0, shards.size - 1, min(_SAMPLE_SHARDS, shards.size)).round().astype(np.int64))
    per_shard = -(-_SAMPLE_ROWS // max(picks.size, 1))
    try:
        for shard in shards[picks].tolist():
            total = int(manifest.shard_rows[shard])
            rows = min(per_shard, total)
            try:
                table = reader.read(shard)
            except ShardError as exc:
                if skip_unreadable and exc.__cause__ is not None and skippable(exc.__cause__):
                    continue
                raise
            batch = table.slice(0, rows).combine_chunks().to_batches()[0]
            chunk = Chunk(
                epoch=0, shard=shard, seq_start=0, seq_end=rows, row_start=0,
                seq=np.arange(rows, dtype=np.int64), batch=batch,
            )
            with before_first_batch():  # the encoder's one-off checks may wait for the first batch
                outs = list(run_stages(stages, [chunk], where=where, pool=None, in_flight=1))
            made = sum(int(out.tokens.size) for out in outs if out.tokens is not None)
            tokens += made
            lengths += [np.diff(out.offsets) for out in outs if out.offsets is not None]
            rows_read += rows
            # the rows' share of the row group's Parquet bytes, as their share of its Arrow bytes
            # (a heavy-tailed row group's first rows are not its average rows)
            share = float(shard_bytes[shard]) * (batch.nbytes / table.nbytes if table.nbytes else rows / total)
            nbytes += share
            sampled.append(shard)
            rates.append(made / share if share else 0.0)
    finally:
        reader.close()
    sizes = np.concatenate(lengths or [np.empty(0, np.int64)]).astype(np.int64)
    return Sample(rows_read, nbytes, tokens, sizes, np.asarray(sampled, np.int64), np.asarray(rates, np.float64))


def token_estimates(
    shards: np.ndarray, sample: Sample, shard_bytes: np.ndarray, shard_file: np.ndarray | None = None
) -> np.ndarray:
    """Return every shard's estimated tokens: its Parquet bytes times the token rate of the nearest sampled shard.

    "Nearest" is by place among the epoch's ``shards`` in manifest order,
    within the same file when that file was sampled (``shard_file``), so a
    corpus whose files differ in tokens per byte (prose and code, several
    languages, sorted by source) is estimated with each part's own rate, not
    one rate for all. A sampled rate within :data:`LOCAL_RATE_MARGIN` of
    the overall one gives way to it. Shards not read every epoch (pruned)
    estimate to 0.

    Examples
    --------
    >>> s = Sample(8, 40.0, 60, np.ones(8), shards=np.array([0, 3]), rates=np.array([1.0, 2.0]))
    >>> token_estimates(np.arange(4), s, np.array([10.0, 10.0, 10.0, 10.0])).tolist()   # shards 0, 1 | 2, 3
    [10.0, 10.0, 20.0, 20.0]
    """
    out = np.zeros(shard_bytes.size, dtype=np.float64)
    if shards.size == 0:
        return out
    if sample.shards.size == 0:
        out[shards] = shard_bytes[shards] * sample.token_rate
        return out
    where = np.searchsorted(shards, sample.shards)  # the sampled shards' places among the epoch's
    place = np.arange(shards.size)
    after = np.clip(np.searchsorted(where, place), 0, where.size - 1)
    before = np.clip(after - 1, 0, where.size - 1)
    nearest = np.where(np.abs(where[before] - place) <= np.abs(where[after] - place), before, after)
    if shard_file is not None:  # a sample of the shard's own file beats a nearer one of another
        files = shard_file[shards]
        sampled_files = shard_file[sample.shards]
        for f in np.unique(sampled_files).tolist():
            own = np.flatnonzero(sampled_files == f)  # sample indices of file f
            mine = np.flatnonzero(files == f)  # epoch places of file f
            dist = np.abs(where[own][None, :] - mine[:, None])
            nearest[mine] = own[dist.argmin(axis=1)]
    overall = sample.token_rate
    # a few dozen rows measure a row group's rate to a few per cent: where it is that close to the
    # overall rate, the overall one (from every sampled row) is the better estimate
    rates = np.where(np.abs(sample.rates - overall) > LOCAL_RATE_MARGIN * overall, sample.rates, overall)
    out[shards] = shard_bytes[shards] * rates[nearest]
    return out


def batch_target(
    layout: Layout,
    shard_rows: np.ndarray,
    shard_bytes: np.ndarray,
    token_rate: float,
    parts: Sequence[Sequence[RowRange]],
    tokens_per_batch: float,
    *,
    left: Mapping[tuple[int, int], int] | None = None,
) -> int:
    """Return the batches every consumer emits, given every consumer's ``parts`` of ``layout``.

    A row weighs its share of its row group's estimate, except the documents
    a look-ahead packer held at an elastic resume, whose tokens still to come
    their states recorded (``left``, by ``(stream, seq)``). A held document
    of an older state (none recorded) weighs a fresh row's estimate: less
    what it already gave would undercount the long documents a packer holds,
    and a target below the data drops tokens.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.io.layout import Layout
    >>> rows, sizes = np.array([10, 10]), np.array([1000.0, 1000.0])  # 2 row groups
    >>> lay = Layout(np.arange(2), rows, epoch=0, seed=None, window=1, num_streams=2)
    >>> batch_target(lay, rows, sizes, 0.5, [[(0, 0, 10, 0, 0)], [(1, 0, 10, 0, 0)]], tokens_per_batch=100)
    5
    >>> held = [[(0, 0, 10, 0, 0)], [(1, 0, 1, 300, 0), (1, 1, 10, 0, 0)]]   # row 0 of stream 1: 20 tokens left
    >>> batch_target(lay, rows, sizes, 0.5, held, tokens_per_batch=100), batch_target(
    ...     lay, rows, sizes, 0.5, held, tokens_per_batch=100, left={(1, 0): 20})
    (5, 4)
    """
    row_bytes = shard_bytes / np.maximum(shard_rows, 1)
    known = left or {}
    estimates = [sum(_range_estimate(layout, row_bytes, token_rate, rng, known) for rng in part) for part in parts]
    return int(min(estimates, default=0.0) * (1.0 - EVEN_BATCHES_SLACK) // tokens_per_batch)


def _range_estimate(
    layout: Layout, row_bytes: np.ndarray, token_rate: float, rng: RowRange, left: Mapping[tuple[int, int], int]
) -> float:
    """The estimated tokens of a row range; a held document's as recorded, and a ``take`` as is."""
    stream, start, end, skip, take = rng
    held = held_left(left, rng)
    if held is not None:
        return float(held)
    tokens = token_rate * layout.range_bytes(stream, start, end, row_bytes)
    if take and end > start:
        tokens += take - token_rate * layout.range_bytes(stream, end - 1, end, row_bytes)
    return tokens


def doc_target(parts: Sequence[Sequence[RowRange]], docs_per_row: float, docs_per_batch: float) -> int:
    """Return the batches every consumer emits when a batch takes a fixed number of documents.

    A part's rows are exact (segment bounds); ``docs_per_row`` (from the
    sample) scales them to documents.

    Examples
    --------
    >>> doc_target([[(0, 0, 100, 0, 0)], [(1, 0, 90, 0, 0), (2, 5, 15, 0, 0)]], 1.0, 8.0)
    12
    """
    rows = [sum(end - start for _, start, end, _, _ in part) for part in parts]
    return int(min(rows, default=0) * docs_per_row * (1.0 - EVEN_BATCHES_SLACK) // docs_per_batch)


def byte_cut(layout: Layout, shard_rows: np.ndarray, shard_bytes: np.ndarray) -> np.ndarray:
    """Return where ``layout``'s streams should start and end for equal Parquet bytes, as row positions.

    A row group's bytes (of the columns read, from the footers) are taken as
    spread evenly over its rows, so no file is read. Shares of equal bytes hold
    nearly equal tokens when tokens per byte are alike across the data, which
    is what the estimate assumes anyway.

    Examples
    --------
    >>> import numpy as np
    >>> rows, sizes = np.array([10, 10]), np.array([1000.0, 3000.0])  # the second is 3x heavier
    >>> lay = Layout(np.arange(2), rows, epoch=0, seed=None, window=1, num_streams=2)
    >>> byte_cut(lay, rows, sizes).tolist()
    [0, 13, 20]
    """
    n = layout.num_streams
    row_bytes = shard_bytes / np.maximum(shard_rows, 1)
    per_row = row_bytes[layout.unit_shard]
    weights = np.zeros(layout.unit_shard.size + 1, dtype=np.float64)
    np.cumsum((layout.unit_hi - layout.unit_lo) * per_row, out=weights[1:])
    total = float(weights[-1])
    cut = [0]
    for k in range(1, n):
        want = total * k / n
        u = min(int(np.searchsorted(weights, want, side="right")) - 1, layout.unit_shard.size - 1)
        if u < 0:
            cut.append(cut[-1])
            continue
        inside = int(round((want - weights[u]) / per_row[u])) if per_row[u] > 0 else 0
        inside = min(max(inside, 0), int(layout.unit_hi[u] - layout.unit_lo[u]))
        cut.append(max(cut[-1], int(layout.cum[u]) + inside))
    cut.append(layout.num_rows)
    return np.array(cut, dtype=np.int64)
