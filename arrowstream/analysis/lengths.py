"""Length distributions: documents counted per distinct length, and summarised exactly.

Characters and bytes are counted with polars' lazy ``scan_parquet`` and its
streaming engine, reduced at once to counts per distinct length (per group
too), so memory depends on the number of distinct lengths, not of documents.
Token lengths come from the same pipeline a run uses, in the order it reads
them (4 bytes per document), or from a seeded Bernoulli sample of documents
with 95 % confidence intervals. Summaries (quantiles, means, power-of-two
histograms, per-group rows) are computed from the counts, and are exact:
:func:`quantiles_from_counts` gives ``numpy.quantile``'s numbers without
expanding the counts.

Determinism: the same data, options and ``seed`` give the same counts, sample
and summaries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from arrowstream.errors import ConfigError, SchemaError, ShardError
from arrowstream.io.reader import ShardReader
from arrowstream.tokenize.encoders import Encoder

__all__ = ["QUANTILES", "quantiles_from_counts"]

#: Quantiles reported for every length measure.
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)

_Z95 = 1.959963984540054


def quantiles_from_counts(values: np.ndarray, counts: np.ndarray, qs: Sequence[float]) -> list[float]:
    """Return the quantiles of a multiset given as distinct ``values`` and their ``counts``.

    The same numbers as ``numpy.quantile`` (linear interpolation) on the
    expanded array, without expanding it.

    Examples
    --------
    >>> quantiles_from_counts(np.array([1, 5, 9]), np.array([2, 1, 1]), [0.0, 0.5, 1.0])
    [1.0, 3.0, 9.0]
    """
    order = np.argsort(values, kind="stable")
    values = np.asarray(values, dtype=np.float64)[order]
    cum = np.cumsum(np.asarray(counts, dtype=np.int64)[order])
    n = int(cum[-1]) if cum.size else 0
    if n == 0:
        return [math.nan for _ in qs]
    out = []
    for q in qs:
        pos = q * (n - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        v_lo = values[int(np.searchsorted(cum, lo, side="right"))]
        v_hi = values[int(np.searchsorted(cum, hi, side="right"))]
        out.append(float(v_lo + (v_hi - v_lo) * (pos - lo)))
    return out


def _length_counts(
    ds: Any, column: str, by: str | None, is_text: bool, *, skip: bool = False
) -> tuple[pl.DataFrame, list[int]]:
    """Count documents per distinct length (and group), streaming over every file; also the shards skipped.

    polars reads all files at once. When it fails, each file is read again
    alone, and a file it cannot read is measured row group by row group
    (read by the run's own reader), so the error names the row group, or,
    with ``skip``, a row group that does not decode is left out and
    returned, as a run with ``on_error="skip"`` leaves it out.
    """
    manifest = ds.manifest
    if isinstance(manifest.filesystem, pafs.LocalFileSystem):
        sources: Any = list(manifest.paths)
    else:  # polars reaches object stores by URI
        sources = [f"{manifest.filesystem.type_name}://{p}" for p in manifest.paths]
    frame: pl.DataFrame | None = None
    skipped: list[int] = []
    try:
        frame = _count_lengths(pl.scan_parquet(sources, include_file_paths="__file", missing_columns="insert",
                                               extra_columns="ignore"),
                               column, by, is_text)
    except pl.exceptions.PolarsError:
        pass  # measured again below, outside this handler: an error there is not one raised while handling this
    if frame is None:
        frame, skipped = _count_each(ds, sources, column, by, is_text, skip)
    if by == "file":  # relative paths read better than absolute ones
        rel = dict(zip(sources, manifest.relpaths))
        frame = frame.with_columns(pl.col("group").replace_strict(rel, default=pl.col("group")))
    return frame, skipped


def _count_each(
    ds: Any, sources: list[str], column: str, by: str | None, is_text: bool, skip: bool
) -> tuple[pl.DataFrame, list[int]]:
    """:func:`_length_counts` file by file, and row group by row group in a file polars cannot read."""
    manifest = ds.manifest
    columns = [column] + ([by] if by not in (None, "file", column) else [])
    reader = ShardReader(manifest, columns, skip_unreadable=skip)
    frames, skipped = [], []
    try:
        for f, source in enumerate(sources):
            try:
                frames.append(_count_lengths(pl.scan_parquet(source, include_file_paths="__file"), column, by, is_text))
                continue
            except pl.exceptions.PolarsError:
                pass
            for shard in np.flatnonzero(manifest.shard_file == f).tolist():
                try:
                    table = reader.read(shard)  # names what does not decode, unless skipped
                except ShardError as exc:
                    raise ShardError(f"{exc}; or pass on_error=\"skip\" to leave row groups that do not decode "
                                     "out of the analysis, listed") from exc.__cause__
                if shard in reader.unreadable:
                    skipped.append(shard)
                    continue
                try:
                    if is_text:  # polars counts bytes that are not UTF-8 as characters once it is handed them
                        table.column(column).validate(full=True)
                    lf = pl.from_arrow(table.append_column("__file", pa.array([source] * table.num_rows))).lazy()
                    frames.append(_count_lengths(lf, column, by, is_text))
                except (pl.exceptions.PolarsError, pa.ArrowInvalid) as exc:
                    info = manifest.shard(shard)
                    raise _named(exc, f"{info.path!r}, row group {info.row_group}", column) from exc
    finally:
        reader.close()
    keys = ["chars", "bytes"] if is_text else ["tokens"]
    if not frames:  # every row group skipped
        return pl.DataFrame(schema={k: pl.Int64 for k in [*keys, "n"]}), skipped
    keys += ["group"] if by is not None else []
    merged = pl.concat(frames, how="vertical_relaxed").group_by(keys).agg(pl.col("n").sum())
    return merged.sort(keys), skipped


def _named(exc: Exception, where: str, column: str) -> SchemaError:
    """The error measuring ``column`` at ``where`` gave, with advice where it names bytes that are not UTF-8."""
    hint = (" (the column holds bytes that are not UTF-8 text: write the files again with the text as UTF-8)"
            if "utf8" in str(exc).lower() or "utf-8" in str(exc).lower() else "")
    reader = "polars could not read it: " if isinstance(exc, pl.exceptions.PolarsError) else ""
    return SchemaError(f"cannot measure column `{column}` of {where}: {reader}{exc}{hint}")


def _count_lengths(lf: pl.LazyFrame, column: str, by: str | None, is_text: bool) -> pl.DataFrame:
    """Documents per distinct length (and group) in ``lf``, with polars' streaming engine."""
    col = pl.col(column)
    if is_text:
        lengths = [col.str.len_chars().alias("chars"), col.str.len_bytes().alias("bytes")]
        keep = col.is_not_null() & (col.str.len_bytes() > 0)
    else:
        lengths = [col.list.len().alias("tokens")]
        keep = col.is_not_null() & (col.list.len() > 0)
    keys = ["chars", "bytes"] if is_text else ["tokens"]
    group: list[pl.Expr] = []
    if by == "file":
        group = [pl.col("__file").alias("group")]
    elif by is not None:
        group = [pl.col(by).cast(pl.String).alias("group")]
    return (
        lf.filter(keep)
        .select([*lengths, *group])
        .group_by([*keys, *(["group"] if group else [])])
        .agg(pl.len().alias("n"))
        .collect(engine="streaming")
    )


def _summary_row(name: str, counts: pl.DataFrame, key: str, seq_len: int | None) -> dict[str, Any]:
    agg = counts.group_by(key).agg(pl.col("n").sum()) if counts.width > 2 else counts
    values = agg[key].to_numpy()
    n = agg["n"].to_numpy()
    total = int(n.sum())
    qs = quantiles_from_counts(values, n, QUANTILES)
    row: dict[str, Any] = {
        "measure": name,
        "num_docs": total,
        "total": int((values * n).sum()),
        "mean": float((values * n).sum() / total) if total else math.nan,
    }
    row.update({f"p{round(q * 100)}": v for q, v in zip(QUANTILES, qs)})
    row["above_seq_len"] = float(n[values > seq_len].sum() / total) if seq_len and total else None
    return row


def _histogram(name: str, counts: pl.DataFrame, key: str) -> pl.DataFrame:
    agg = counts.group_by(key).agg(pl.col("n").sum())
    values = agg[key].to_numpy().astype(np.int64)
    n = agg["n"].to_numpy()
    exp = np.floor(np.log2(np.maximum(values, 1))).astype(np.int64)
    top = int(exp.max()) if exp.size else 0
    binned = np.bincount(exp, weights=n, minlength=top + 1).astype(np.int64)
    lower = 2 ** np.arange(top + 1)
    return pl.DataFrame(
        {"measure": [name] * (top + 1), "lower": lower, "upper": lower * 2, "count": binned}
    )


def _by_rows(counts: pl.DataFrame, measures: list[str], seq_len: int) -> pl.DataFrame:
    rows = []
    for group in sorted(counts["group"].unique().to_list(), key=str):
        part = counts.filter(pl.col("group").is_null() if group is None else pl.col("group") == group)
        for m in measures:
            row = _summary_row(m, part.select([m, "n"]), m, seq_len if m == "tokens" else None)
            rows.append({"group": group, **row})
    return pl.DataFrame(rows)


def _pipeline_lengths(ds: Any, by: str | None = None) -> tuple[np.ndarray, np.ndarray, list[Any]]:
    """Token lengths of every document, in the order a run without shuffle reads them.

    Also returns the documents per source chunk (one record batch each), so
    that predictions cut look-ahead windows where the run does, and each
    document's value of column ``by`` (empty without one).
    """
    out, sizes, groups = [], [], []
    it = ds.iter()
    for batch in it:
        ids = batch.column("input_ids")
        out.append(pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int32))
        sizes.append(batch.num_rows)
        if by is not None:
            groups += batch.column(by).cast(pa.string()).to_pylist()
    it.close()
    lengths = np.concatenate(out) if out else np.zeros(0, np.int32)
    return lengths, np.asarray(sizes, dtype=np.int64), groups


def _token_group_rows(lengths: np.ndarray, groups: list[Any], seq_len: int) -> pl.DataFrame:
    """The per-group summary of token lengths."""
    frame = (
        pl.DataFrame({"group": groups, "tokens": lengths})
        .group_by(["group", "tokens"])
        .agg(pl.len().alias("n"))
    )
    return _by_rows(frame, ["tokens"], seq_len)


def _sample_lengths(
    ds: Any, enc: Encoder, column: str, sample: int, seed: int, *, skip: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize a seeded Bernoulli sample of documents; return token and char lengths (``skip``: unreadable row groups left out)."""
    manifest = ds.manifest
    p = min(1.0, sample / max(1, manifest.num_rows))
    reader = ShardReader(manifest, [column], skip_unreadable=skip)
    tokens, chars = [], []
    for shard in range(manifest.num_shards):
        f, rg = int(manifest.shard_file[shard]), int(manifest.shard_row_group[shard])
        n = int(manifest.shard_rows[shard])
        pick = np.random.default_rng([seed, f, rg]).random(n) < p
        if not pick.any():
            continue
        table = reader.read(shard)
        if shard in reader.unreadable:
            continue
        col = table.column(column).combine_chunks().filter(pa.array(pick))
        texts = [t for t in col.to_pylist() if t]
        if not texts:
            continue
        tokens.append(enc.encode(texts)[1].astype(np.int32))
        chars.append(np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts)))
    reader.close()
    if not tokens:
        raise ConfigError(f"the sample of {sample} documents drew none: raise `sample`")
    return np.concatenate(tokens), np.concatenate(chars)


def _sample_info(
    lengths: np.ndarray, chars: np.ndarray, docs: int, counts: pl.DataFrame, seed: int, add_eos: bool
) -> dict[str, Any]:
    n = lengths.size
    mean = float(lengths.mean())
    half = _Z95 * float(lengths.std(ddof=1)) / math.sqrt(n) if n > 1 else math.inf
    ratio = float((lengths.sum() - (n if add_eos else 0)) / chars.sum())  # the text's own tokens: EOS apart
    total_chars = int(counts.group_by("chars").agg(pl.col("n").sum()).select(pl.col("chars") * pl.col("n")).sum().item())
    sorted_len = np.sort(lengths)
    quant = {}
    for q in (0.5, 0.9, 0.99):  # order-statistic bounds: ranks n q -+ z sqrt(n q (1-q))
        spread = _Z95 * math.sqrt(n * q * (1 - q))
        lo = int(max(0, math.floor(n * q - spread)))
        hi = int(min(n - 1, math.ceil(n * q + spread)))
        quant[f"p{round(q * 100)}"] = [int(sorted_len[lo]), int(sorted_len[hi])]
    return {
        "counted": "sample",
        "add_eos": add_eos,
        "seed": seed,
        "sample_docs": n,
        "mean_ci95": [mean - half, mean + half],
        "quantile_ci95": quant,
        "tokens_per_char": ratio,
        "estimated_total_tokens": int(round(total_chars * ratio + (docs if add_eos else 0))),
    }


def _scale(info: dict[str, Any], docs: int) -> float:
    tokens = info.get("tokens")
    if tokens and tokens.get("counted") == "sample":
        return docs / tokens["sample_docs"]
    return 1.0
