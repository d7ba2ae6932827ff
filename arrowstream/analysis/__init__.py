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
padding, batches and cut documents. The length counting and its summaries
are in :mod:`arrowstream.analysis.lengths`.

The result, :class:`Analysis`, holds polars DataFrames, prints as a report
and converts to JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from tokenizers import Tokenizer

from arrowstream.analysis.lengths import (
    QUANTILES,
    _by_rows,
    _histogram,
    _length_counts,
    _pipeline_lengths,
    _sample_info,
    _sample_lengths,
    _scale,
    _summary_row,
    _token_group_rows,
    quantiles_from_counts,
)
from arrowstream.analysis.report import plot_analysis, render_analysis
from arrowstream.analysis.simulate import (
    SAMPLE_BUCKET_SLACK,
    Prediction,
    simulate_bucketer,
    simulate_packer,
    simulate_padded,
)
from arrowstream.checks import check_choice, check_int
from arrowstream.errors import ConfigError, SchemaError
from arrowstream.pack import ConcatPacker
from arrowstream.pack.bestfit import BestFitPacker
from arrowstream.pipeline.dataset import read_parquet
from arrowstream.tokenize import find_eos_id, load_tokenizer
from arrowstream.tokenize.encoders import Encoder

__all__ = ["QUANTILES", "Analysis", "analyze", "quantiles_from_counts"]


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
        Predicted ``padding_fraction`` (with ``padding_low`` and
        ``padding_high``: from a sample, a 95 % interval from the spread of
        what its four quarters predict; else equal to it), ``num_batches``, ``cut_docs`` (documents not
        emitted whole: split, cut across rows, truncated), ``dropped_tokens``
        and ``lost_fraction`` (the share of tokens not emitted: truncated or
        dropped, never split) per batching strategy (needs token lengths).
        From a sample, the epoch's last batch counts once for the whole
        corpus, not once per sample's worth.
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
            about = out.get(measure)  # how a measure was counted (tokens: a sample's figures) stays beside its row
            out[measure] = {**row, **about} if isinstance(about, dict) else row
        out["histogram"] = self.histogram.to_dicts()
        out["strategies"] = self.strategies.to_dicts()
        if self.by is not None:
            out["by"] = self.by.to_dicts()
        return out

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """Return the JSON text, and write it to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=1, default=float)
        if path is not None:
            try:
                Path(path).write_text(text + "\n", encoding="utf-8")
            except OSError as exc:
                raise ConfigError(
                    f"cannot write the analysis to {str(path)!r}: {exc.strerror or exc}; pass a path in "
                    "a writable directory"
                ) from exc
        return text

    def __str__(self) -> str:
        return render_analysis(self)

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """Write a PNG: the length histogram with ``seq_len`` marked, and the strategies compared.

        Needs matplotlib (``pip install 'arrowstream[plot]'``). It draws on a
        figure of its own and leaves ``pyplot`` and the process's backend (a
        notebook's, say) as they were.
        """
        return plot_analysis(self, Path(path))


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
    on_error: str = "raise",
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
    on_error
        ``"raise"``: a row group that does not decode is a
        :class:`~arrowstream.errors.ShardError` naming the file and row
        group. ``"skip"``: it is left out of every figure, as a run with
        ``read_parquet(..., on_error="skip")`` leaves it out, and listed in
        ``info["unreadable_row_groups"]`` (``info["unreadable_rows"]`` rows).

    Raises
    ------
    SchemaError
        ``column`` or ``by`` is missing, or ``column`` is neither text nor token ids.
    ConfigError
        The dataset has no document, or an option is out of range.
    ShardError
        A row group does not decode (with ``on_error="raise"``), naming
        the file and row group.

    Examples
    --------
    >>> from arrowstream.testing import example_dir
    >>> a = analyze(example_dir())
    >>> a.info["num_docs"], a.summary.filter(pl.col("measure") == "chars")["p50"].item()
    (12, 4.0)
    """
    for key, value in (("seq_len", seq_len), ("batch_size", batch_size), ("window", window)):
        check_int(key, value)
    check_int("sample", sample, none_ok=True, hint="documents to tokenize")
    check_choice("on_error", on_error, ("raise", "skip"))
    tok = None if tokenizer is None else load_tokenizer(tokenizer)
    columns = [column] + ([by] if by not in (None, "file", column) else [])
    ds = read_parquet(source, columns=columns, on_error=on_error)
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
    counts, skipped = _length_counts(ds, column, by, is_text, skip=on_error == "skip")
    lost = int(manifest.shard_rows[skipped].sum()) if skipped else 0
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
        "null_or_empty": manifest.num_rows - docs - lost,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "add_eos": add_eos,
    }
    if skipped:  # left out of every figure, as a run with on_error="skip" leaves them out
        info["unreadable_row_groups"] = [
            {"file": manifest.relpaths[int(manifest.shard_file[k])], "row_group": int(manifest.shard_row_group[k])}
            for k in skipped
        ]
        info["unreadable_rows"] = lost
    measures = ["chars", "bytes"] if is_text else ["tokens"]
    rows = [_summary_row(m, counts, m, seq_len if m == "tokens" else None) for m in measures]
    hist = [_histogram(m, counts, m) for m in measures]
    by_rows = _by_rows(counts, measures, seq_len) if by is not None else None

    token_lengths: np.ndarray | None = None
    chunk_sizes: np.ndarray | None = None
    read_chunks: np.ndarray | None = None  # a sample's: the documents of each chunk a run reads
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
                        read_parquet(path, columns=[column], filesystem=manifest.filesystem, on_error=on_error)
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
            token_lengths, chars = _sample_lengths(ds, enc, column, sample, seed, skip=on_error == "skip")
            token_lengths = token_lengths + int(add_eos)
            info["tokens"] = _sample_info(token_lengths, chars, docs, counts, seed, add_eos)
            read_chunks = _chunk_docs(ds, docs)
        tvals, tcounts = np.unique(token_lengths, return_counts=True)
        tframe = pl.DataFrame({"tokens": tvals, "n": tcounts})
        rows.append(_summary_row("tokens", tframe, "tokens", seq_len))
        hist.append(_histogram("tokens", tframe, "tokens"))
    summary = pl.DataFrame(rows)
    strategies = _strategies(
        token_lengths, chunk_sizes, seq_len, batch_size, window, seed, scale=_scale(info, docs),
        read_chunks=read_chunks,
    )
    return Analysis(
        summary=summary,
        histogram=pl.concat(hist),
        strategies=strategies,
        by=by_rows,
        info=info,
    )


def _chunk_docs(ds: Any, docs: int) -> np.ndarray:
    """About how many documents each chunk a run reads holds, in reading order (a row group's ``batch_rows`` at a time).

    A look-ahead window ends where a chunk ends, so a sample's bucketing is
    simulated over chunks of these sizes.
    """
    manifest = ds.manifest
    rows = manifest.shard_rows.astype(np.int64)
    step = int(ds.batch_rows)
    pieces = np.concatenate([np.r_[np.full(int(r) // step, step), [int(r) % step]] for r in rows]) if rows.size else rows
    pieces = pieces[pieces > 0]
    per_row = docs / max(1, int(rows.sum()))  # null and empty rows hold no document
    return np.maximum(1, np.rint(pieces * per_row)).astype(np.int64)


def _strategies(
    lengths: np.ndarray | None,
    chunk_sizes: np.ndarray | None,
    seq_len: int,
    batch_size: int,
    window: int,
    seed: int,
    *,
    scale: float,
    read_chunks: np.ndarray | None = None,
) -> pl.DataFrame:
    docs = None if lengths is None else int(round(scale * lengths.size))  # the corpus a sample stands for

    def predict(part: np.ndarray, sizes: np.ndarray | None) -> list[tuple[str, Prediction]]:
        common = {"seq_len": seq_len, "batch_size": batch_size, "drop_last": False, "pad_id": 0}
        return [
            ("pad to seq_len", simulate_padded(part, seq_len=seq_len, batch_size=batch_size, dynamic=False)),
            ("random batches, dynamic padding", simulate_padded(
                part, seq_len=seq_len, batch_size=batch_size, dynamic=True, seed=seed)),
            ("concat", simulate_packer(part, ConcatPacker(**common), chunk_sizes=sizes)),
            (f"bucketing (window {window})", simulate_bucketer(
                part, batch_size=batch_size, window=window, max_len=seq_len, seed=seed, chunk_sizes=sizes,
                num_docs=docs, read_chunks=read_chunks)),
            (f"best_fit (window {window})", simulate_packer(
                part, BestFitPacker(**common, window=window, seed=seed), chunk_sizes=sizes)),
        ]

    names: list[tuple[str, Prediction]] = []
    low: list[float] = []
    high: list[float] = []
    if lengths is not None and lengths.size:
        names = predict(lengths, chunk_sizes)
        low = high = [p.scaled_padding_fraction(scale) for _, p in names]
        if scale > 1 and lengths.size >= 8:
            # a sample: a 95 % interval from the spread of what its four quarters predict (their
            # mean's standard error, Student's t with 3 degrees of freedom)
            quarters = [predict(q, None) for q in np.array_split(lengths, 4)]
            each = np.array([[p.scaled_padding_fraction(4 * scale) for _, p in q] for q in quarters])
            half = 3.182 * each.std(axis=0, ddof=1) / 2
            low = [max(0.0, v - h) for v, h in zip(low, half.tolist())]
            high = [min(1.0, v + h) for v, h in zip(high, half.tolist())]
            at = [n for n, _ in names].index(f"bucketing (window {window})")  # a model a little under: see the slack
            high[at] = min(1.0, high[at] + SAMPLE_BUCKET_SLACK * names[at][1].scaled_padding_fraction(scale))
    return pl.DataFrame(
        {
            "name": [n for n, _ in names],
            "padding_fraction": [p.scaled_padding_fraction(scale) for _, p in names],
            "padding_low": low,
            "padding_high": high,
            "num_batches": [int(round(p.num_batches * scale)) for _, p in names],
            "cut_docs": [int(round(p.cut_docs * scale)) for _, p in names],
            "dropped_tokens": [int(round(p.dropped_tokens * scale)) for _, p in names],
            "lost_fraction": [p.lost_fraction for _, p in names],
        },
        schema={
            "name": pl.String,
            "padding_fraction": pl.Float64,
            "padding_low": pl.Float64,
            "padding_high": pl.Float64,
            "num_batches": pl.Int64,
            "cut_docs": pl.Int64,
            "dropped_tokens": pl.Int64,
            "lost_fraction": pl.Float64,
        },
    )
