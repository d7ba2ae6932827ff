"""Know the data before training: length distributions and what each batching strategy costs.

:func:`analyze` makes two passes, both streaming:

1. **Characters and bytes** of every document, with polars' lazy
   ``scan_parquet`` and its streaming engine. Lengths are reduced at once to
   counts per distinct length (per group too), so memory depends on the
   number of distinct lengths, not of documents, and quantiles computed from
   the counts are exact.
2. **Tokens**, when a tokenizer is given (or the column already holds token
   ids): of every document through the same pipeline a training run uses
   (``read_parquet(...).tokenize(...)``, so the counts are the run's), or of
   a seeded sample of documents, reported with its size and 95 % confidence
   intervals. Token lengths take 4 bytes per document analysed.

The token lengths, in the order a run reads them, then go through the real
packing code (:mod:`arrowstream.analysis.simulate`) to predict each strategy's
padding, batches and cut documents.

The result, :class:`Analysis`, holds polars DataFrames, prints as a report
and converts to JSON.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from tokenizers import Tokenizer

from arrowstream.pack.bestfit import BestFitPacker
from arrowstream.pack.bucket import BucketPacker
from arrowstream.checks import check_int
from arrowstream.pipeline.dataset import read_parquet
from arrowstream.tokenize.encoders import Encoder
from arrowstream.errors import ConfigError, SchemaError
from arrowstream.pack import ConcatPacker
from arrowstream.io.reader import ShardReader
from arrowstream.analysis.report import plot_analysis, render_analysis
from arrowstream.analysis.simulate import Prediction, simulate_packer, simulate_padded
from arrowstream.tokenize import find_eos_id, load_tokenizer

__all__ = ["QUANTILES", "Analysis", "analyze", "quantiles_from_counts"]

#: Quantiles reported for every length measure.
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)

_Z95 = 1.959963984540054


@dataclass
class Analysis:
    """The result of :func:`analyze`.

    Attributes
    ----------
    summary : polars.DataFrame
        One row per measure (``chars``, ``bytes``, ``tokens``): documents,
        mean, quantiles ``p0`` ... ``p100`` and the share above ``seq_len``
        (tokens only).
    by : polars.DataFrame or None
        The same per group (a column's values, or files), when asked.
    histogram : polars.DataFrame
        Counts per power-of-two length bin (``lower <= length < upper``), per measure.
    strategies : polars.DataFrame
        Predicted ``padding_fraction``, ``num_batches``, ``cut_docs`` and
        ``dropped_tokens`` per batching strategy (needs token lengths).
    info : dict
        Source, column, options, document counts, and the token sample's size
        and confidence intervals when sampled.
    """

    summary: pl.DataFrame
    histogram: pl.DataFrame
    strategies: pl.DataFrame
    by: pl.DataFrame | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return everything as JSON-able Python values."""
        out: dict[str, Any] = {**self.info}
        for row in self.summary.iter_rows(named=True):
            measure = row.pop("measure")
            out[measure] = row
        out["histogram"] = self.histogram.to_dicts()
        out["strategies"] = self.strategies.to_dicts()
        if self.by is not None:
            out["by"] = self.by.to_dicts()
        return out

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """Return the JSON text, and write it to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=1, default=float)
        if path is not None:
            Path(path).write_text(text + "\n", encoding="utf-8")
        return text

    def __str__(self) -> str:
        return render_analysis(self)

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """Write a PNG: the length histogram with ``seq_len`` marked, and the strategies compared.

        Needs matplotlib (``pip install 'arrowstream[plot]'``).
        """
        return plot_analysis(self, Path(path))


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


def analyze(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    column: str = "text",
    tokenizer: Tokenizer | Encoder | str | os.PathLike[str] | None = None,
    seq_len: int = 2048,
    batch_size: int = 8,
    by: str | None = None,
    sample: int | None = None,
    seed: int = 0,
    add_eos: bool = True,
    window: int = 1024,
) -> Analysis:
    """Measure document lengths and predict what each batching strategy costs.

    Parameters
    ----------
    source
        What :func:`~arrowstream.read_parquet` opens: a directory, glob, list
        of files or a URI.
    column
        A text column, or a column of token ids (then tokens need no tokenizer).
    tokenizer
        A ``tokenizers.Tokenizer``, the path of a ``tokenizer.json`` or an
        :class:`~arrowstream.tokenize.encoders.Encoder`, for token lengths (encoded by
        the fastest backend proven to give the tokenizer's ids); ``None`` measures characters and bytes only (unless
        ``column`` holds token ids).
    seq_len, batch_size
        The training shape the strategies are predicted for.
    by
        Also summarise per value of this column, or per file with ``"file"``.
    sample
        Tokenize about this many documents, drawn with ``seed``, instead of
        all of them (faster; figures then carry confidence intervals).
    add_eos
        Count one EOS token per document, as ``.tokenize`` does by default.
    window
        Look-ahead of the best-fit and bucketing predictions.

    Raises
    ------
    SchemaError
        ``column`` or ``by`` is missing, or ``column`` is neither text nor token ids.
    ConfigError
        The dataset has no document, or an option is out of range.

    Examples
    --------
    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> d = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"text": ["a bc", "def", None, "ghij kl"]}), f"{d}/a.parquet")
    >>> a = analyze(d)
    >>> a.info["num_docs"], a.summary.filter(pl.col("measure") == "chars")["p50"].item()
    (3, 4.0)
    """
    for key, value in (("seq_len", seq_len), ("batch_size", batch_size), ("window", window)):
        check_int(key, value)
    check_int("sample", sample, none_ok=True, hint="documents to tokenize")
    tok = None if tokenizer is None else load_tokenizer(tokenizer)
    columns = [column] + ([by] if by not in (None, "file", column) else [])
    ds = read_parquet(source, columns=columns)
    manifest = ds.manifest
    dtype = manifest.schema.field(column).type
    is_text = pa.types.is_string(dtype) or pa.types.is_large_string(dtype)
    is_ids = (pa.types.is_list(dtype) or pa.types.is_large_list(dtype)) and pa.types.is_integer(
        dtype.value_type
    )
    if not (is_text or is_ids):
        raise SchemaError(
            f"column `{column}` has type {dtype} (first file {manifest.paths[0]!r}), but analysis "
            "needs text (string) or token ids (list of integers): pass `column=` the text column"
        )
    if is_ids and tok is not None:
        raise ConfigError(
            f"column `{column}` already holds token ids: leave `tokenizer` unset to analyse it"
        )
    counts = _length_counts(ds, column, by, is_text)
    if is_ids and add_eos:  # count the EOS a run appends, as for tokenized text
        counts = counts.with_columns(pl.col("tokens") + 1)
    docs = int(counts["n"].sum())
    if docs == 0:
        raise ConfigError(
            f"the dataset at {manifest.root!r} has no non-empty document in column `{column}` "
            f"({manifest.num_rows} rows, all null or empty): nothing to analyse"
        )
    info: dict[str, Any] = {
        "source": manifest.root,
        "column": column,
        "num_files": manifest.num_files,
        "num_rows": manifest.num_rows,
        "num_docs": docs,
        "null_or_empty": manifest.num_rows - docs,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "add_eos": add_eos,
    }
    measures = ["chars", "bytes"] if is_text else ["tokens"]
    rows = [_summary_row(m, counts, m, seq_len if m == "tokens" else None) for m in measures]
    hist = [_histogram(m, counts, m) for m in measures]
    by_rows = _by_rows(counts, measures, seq_len) if by is not None else None

    token_lengths: np.ndarray | None = None
    chunk_sizes: np.ndarray | None = None
    if is_ids:
        token_lengths, chunk_sizes, _ = _pipeline_lengths(ds.tokenize(None, column=column, add_eos=False))
        token_lengths = token_lengths + int(add_eos)
        info["tokens"] = {"counted": "all", "add_eos": add_eos}
    elif tok is not None:
        eos = find_eos_id(tok)
        info["tokenizer_eos_id"] = eos
        enc = tokenizer if isinstance(tokenizer, Encoder) else Encoder(tok)
        if sample is None or sample >= docs:
            group_by = by if by not in (None, "file") else None
            if by == "file":  # one pipeline per file: the same order, windows and ids as one run
                parts = [
                    _pipeline_lengths(
                        read_parquet(path, columns=[column], filesystem=manifest.filesystem)
                        .tokenize(enc, column=column, add_eos=False)
                    )
                    for path in manifest.paths
                ]
                token_lengths = np.concatenate([p[0] for p in parts])
                chunk_sizes = np.concatenate([p[1] for p in parts])
                groups = [rel for rel, p in zip(manifest.relpaths, parts) for _ in range(p[0].size)]
                group_by = "file"
            else:
                token_lengths, chunk_sizes, groups = _pipeline_lengths(
                    ds.tokenize(enc, column=column, add_eos=False), group_by
                )
            token_lengths = token_lengths + int(add_eos)
            info["tokens"] = {"counted": "all", "add_eos": add_eos}
            if group_by is not None and by_rows is not None:
                by_rows = pl.concat(
                    [by_rows, _token_group_rows(token_lengths, groups, seq_len)], how="vertical_relaxed"
                )
                by_rows = by_rows.sort(["group", "measure"], descending=[False, False])
        else:
            token_lengths, chars = _sample_lengths(ds, enc, column, sample, seed)
            token_lengths = token_lengths + int(add_eos)
            info["tokens"] = _sample_info(token_lengths, chars, docs, counts, seed, add_eos)
        tvals, tcounts = np.unique(token_lengths, return_counts=True)
        tframe = pl.DataFrame({"tokens": tvals, "n": tcounts})
        rows.append(_summary_row("tokens", tframe, "tokens", seq_len))
        hist.append(_histogram("tokens", tframe, "tokens"))
    summary = pl.DataFrame(rows)
    strategies = _strategies(
        token_lengths, chunk_sizes, seq_len, batch_size, window, seed, scale=_scale(info, docs)
    )
    return Analysis(
        summary=summary,
        histogram=pl.concat(hist),
        strategies=strategies,
        by=by_rows,
        info=info,
    )


def _length_counts(ds: Any, column: str, by: str | None, is_text: bool) -> pl.DataFrame:
    """Count documents per distinct length (and group), streaming over every file."""
    manifest = ds.manifest
    if isinstance(manifest.filesystem, pafs.LocalFileSystem):
        sources: Any = list(manifest.paths)
    else:  # polars reaches object stores by URI
        sources = [f"{manifest.filesystem.type_name}://{p}" for p in manifest.paths]
    lf = pl.scan_parquet(sources, include_file_paths="__file", missing_columns="insert")
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
    frame = (
        lf.filter(keep)
        .select([*lengths, *group])
        .group_by([*keys, *(["group"] if group else [])])
        .agg(pl.len().alias("n"))
        .collect(engine="streaming")
    )
    if by == "file":  # relative paths read better than absolute ones
        rel = dict(zip(sources, manifest.relpaths))
        frame = frame.with_columns(pl.col("group").replace_strict(rel, default=pl.col("group")))
    return frame


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
        part = counts.filter(pl.col("group") == group)
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
    ds: Any, enc: Encoder, column: str, sample: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize a seeded Bernoulli sample of documents; return token and char lengths."""
    manifest = ds.manifest
    p = min(1.0, sample / max(1, manifest.num_rows))
    reader = ShardReader(manifest, [column])
    tokens, chars = [], []
    for shard in range(manifest.num_shards):
        f, rg = int(manifest.shard_file[shard]), int(manifest.shard_row_group[shard])
        n = int(manifest.shard_rows[shard])
        pick = np.random.default_rng([seed, f, rg]).random(n) < p
        if not pick.any():
            continue
        col = reader.read(shard).column(column).combine_chunks().filter(pa.array(pick))
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
    ratio = float(lengths.sum() / chars.sum())
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


def _strategies(
    lengths: np.ndarray | None,
    chunk_sizes: np.ndarray | None,
    seq_len: int,
    batch_size: int,
    window: int,
    seed: int,
    *,
    scale: float,
) -> pl.DataFrame:
    names: list[tuple[str, Prediction]] = []
    if lengths is not None and lengths.size:
        common = {"seq_len": seq_len, "batch_size": batch_size, "drop_last": False, "pad_id": 0}
        names = [
            ("pad to seq_len", simulate_padded(lengths, seq_len=seq_len, batch_size=batch_size, dynamic=False)),
            ("random batches, dynamic padding", simulate_padded(
                lengths, seq_len=seq_len, batch_size=batch_size, dynamic=True, seed=seed)),
            ("concat", simulate_packer(lengths, ConcatPacker(**common), chunk_sizes=chunk_sizes)),
            (f"bucketing (window {window})", simulate_packer(
                lengths,
                BucketPacker(batch_size=batch_size, window=window, max_len=seq_len, seed=seed),
                chunk_sizes=chunk_sizes,
            )),
            (f"best_fit (window {window})", simulate_packer(
                lengths, BestFitPacker(**common, window=window, seed=seed), chunk_sizes=chunk_sizes)),
        ]
    return pl.DataFrame(
        {
            "name": [n for n, _ in names],
            "padding_fraction": [p.padding_fraction for _, p in names],
            "num_batches": [int(round(p.num_batches * scale)) for _, p in names],
            "cut_docs": [int(round(p.cut_docs * scale)) for _, p in names],
            "dropped_tokens": [int(round(p.dropped_tokens * scale)) for _, p in names],
        },
        schema={
            "name": pl.String,
            "padding_fraction": pl.Float64,
            "num_batches": pl.Int64,
            "cut_docs": pl.Int64,
            "dropped_tokens": pl.Int64,
        },
    )
