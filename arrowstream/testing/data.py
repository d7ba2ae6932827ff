"""Synthetic, seeded sample data: Parquet files of English-like documents, and where to import it all.

The rest of arrowstream reads Parquet, tokenizes and packs; its tests and
benchmarks need data that looks like a real pretraining corpus without
downloading one. This module makes it offline, and is the one place to import
the sample data from:

- :func:`make_texts` (from :mod:`arrowstream.testing.texts`) draws
  English-like documents with heavy-tailed lengths.
- :func:`write_dataset` (here) writes such documents as ``part-NNNNN.parquet``
  files (columns ``id``, ``text``, ``source``) with either pyarrow or polars,
  and can stream a corpus of a given size in bytes with bounded memory.
- :func:`train_tokenizer` and :func:`sample_tokenizer` (from
  :mod:`arrowstream.testing.tokenizer`) give a small GPT-2-style byte-level BPE
  tokenizer trained on that text.

Determinism invariant: every output is a pure function of the arguments. The
same arguments (``seed`` included) give the same texts and byte-identical
Parquet files, with the same library versions (numpy's generators are stable
in practice but do not promise stream compatibility across releases), and
different seeds give different data. Nothing reads the clock, the environment
or a global random state.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from arrowstream.errors import ConfigError

# Re-exported (redundant aliases): tests read these tables from this module.
from arrowstream.testing.texts import _WORDS as _WORDS
from arrowstream.testing.texts import _check_int, _check_lengths, _generate, make_texts
from arrowstream.testing.tokenizer import _SAMPLE_TOKENIZERS as _SAMPLE_TOKENIZERS
from arrowstream.testing.tokenizer import sample_tokenizer, train_tokenizer

__all__ = [
    "SCHEMA",
    "SOURCES",
    "make_texts",
    "sample_tokenizer",
    "train_tokenizer",
    "write_dataset",
]

#: Values of the ``source`` column, their probabilities, and the shift each
#: applies to the mean of the log length in words (books run longer, news and
#: code shorter).
SOURCES: tuple[str, ...] = ("web", "books", "news", "code")
_SOURCE_PROBS: tuple[float, ...] = (0.55, 0.10, 0.25, 0.10)
_SOURCE_LOG_SHIFT: tuple[float, ...] = (0.0, 0.7, -0.3, -0.5)

#: Parquet schema written by :func:`write_dataset`.
SCHEMA: pa.Schema = pa.schema(
    [("id", pa.int64()), ("text", pa.string()), ("source", pa.string())]
)

# Stream tag mixed into seeds so that the writer never shares draws with
# make_texts (whose tag is `_TEXTS_STREAM` in arrowstream.testing.texts).
_DATASET_STREAM = 0xDA7A5E7
_WRITERS: tuple[str, ...] = ("pyarrow", "polars")


def write_dataset(
    directory: str | os.PathLike[str],
    *,
    num_files: int = 4,
    docs_per_file: int = 2000,
    rows_per_group: int = 500,
    seed: int = 0,
    writer: str = "pyarrow",
    target_bytes: int | None = None,
    mean_log_words: float = 5.0,
    sigma_log_words: float = 1.0,
) -> list[pathlib.Path]:
    """Write a synthetic corpus as Parquet files ``part-00000.parquet``, ...

    Each file has the columns of :data:`SCHEMA`: ``id`` (``int64``, 0, 1, 2,
    ... increasing across the files in order), ``text`` (a document from the
    same generator as :func:`make_texts`) and ``source`` (one of
    :data:`SOURCES`, drawn with fixed probabilities; the mean log length
    shifts a little per source). Files use snappy compression and row groups
    of ``rows_per_group`` rows; only a file's last row group may be shorter.

    Parameters
    ----------
    directory : str or os.PathLike
        Where to write; created (with parents) if missing. Existing files of
        the same names are overwritten; other files are left alone.
    num_files : int, optional
        Number of files, 1 or more.
    docs_per_file : int, optional
        Documents per file, 1 or more. Ignored when ``target_bytes`` is given.
    rows_per_group : int, optional
        Rows per Parquet row group, 1 or more.
    seed : int, optional
        Seed (0 or more). The same arguments give byte-identical files.
    writer : {"pyarrow", "polars"}, optional
        ``"pyarrow"`` streams each row group through
        :class:`pyarrow.parquet.ParquetWriter`. ``"polars"`` writes the same
        rows with :meth:`polars.DataFrame.write_parquet`; it holds one whole
        file in memory at a time.
    target_bytes : int or None, optional
        If given, overrides ``docs_per_file``: each file receives documents
        until its text reaches its share of ``target_bytes`` (split evenly),
        so the corpus holds ``target_bytes`` of text plus less than one
        document per file. With ``writer="pyarrow"`` memory stays bounded by
        one row group, whatever the target.
    mean_log_words, sigma_log_words : float, optional
        Length distribution, as in :func:`make_texts`.

    Returns
    -------
    list of pathlib.Path
        The written files, in order.

    Raises
    ------
    ValueError
        If an argument is out of range or ``writer`` is unknown.

    Examples
    --------
    >>> import tempfile
    >>> import pyarrow.parquet as pq
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     paths = write_dataset(tmp, num_files=2, docs_per_file=10, rows_per_group=4)
    ...     table = pq.read_table(paths[1])
    ...     groups = pq.read_metadata(paths[1]).num_row_groups
    >>> [path.name for path in paths]
    ['part-00000.parquet', 'part-00001.parquet']
    >>> table.column("id").to_pylist(), groups
    ([10, 11, 12, 13, 14, 15, 16, 17, 18, 19], 3)
    >>> table.schema.names
    ['id', 'text', 'source']
    """
    _check_int("num_files", num_files, minimum=1, hint="pass 1 or more files")
    _check_int("docs_per_file", docs_per_file, minimum=1, hint="pass 1 or more")
    _check_int("rows_per_group", rows_per_group, minimum=1, hint="pass 1 or more")
    _check_int("seed", seed, minimum=0, hint="pass a non-negative integer seed")
    if target_bytes is not None:
        _check_int(
            "target_bytes",
            target_bytes,
            minimum=1,
            hint="pass a positive byte count, or None to use `docs_per_file`",
        )
    if writer not in _WRITERS:
        raise ConfigError(
            f"`writer` must be one of {', '.join(map(repr, _WRITERS))}, "
            f"got {writer!r}; pick one of those"
        )
    _check_lengths(mean_log_words, sigma_log_words)

    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[pathlib.Path] = []
    next_id = 0
    for file_index in range(num_files):
        if target_bytes is None:
            budget = None
        else:  # split evenly; the first files take the remainder
            budget = target_bytes // num_files + (file_index < target_bytes % num_files)
        groups = _file_groups(
            seed=seed,
            file_index=file_index,
            first_id=next_id,
            docs=docs_per_file,
            budget=budget,
            rows_per_group=rows_per_group,
            mean_log_words=float(mean_log_words),
            sigma_log_words=float(sigma_log_words),
        )
        path = out / f"part-{file_index:05d}.parquet"
        if writer == "pyarrow":
            with pq.ParquetWriter(path, SCHEMA, compression="snappy") as parquet:
                for group in groups:
                    parquet.write_table(group, row_group_size=rows_per_group)
                    next_id += group.num_rows
        else:
            table = pa.concat_tables(list(groups))
            next_id += table.num_rows
            pl.from_arrow(table).write_parquet(
                path, compression="snappy", row_group_size=rows_per_group
            )
        paths.append(path)
    return paths


def _file_groups(
    *,
    seed: int,
    file_index: int,
    first_id: int,
    docs: int,
    budget: int | None,
    rows_per_group: int,
    mean_log_words: float,
    sigma_log_words: float,
) -> Iterator[pa.Table]:
    """Yield one file's row groups as tables of :data:`SCHEMA`.

    With ``budget`` (bytes of text), stop at the first document that reaches
    it; otherwise write ``docs`` documents. Each row group has its own random
    stream, keyed by seed, file and group, so memory never exceeds one group.
    """
    probs = np.asarray(_SOURCE_PROBS)
    shifts = np.asarray(_SOURCE_LOG_SHIFT)
    sources = pa.array(SOURCES, type=pa.string())
    written_docs = 0
    written_bytes = 0
    group_index = 0
    while True:
        if budget is None:
            n = min(rows_per_group, docs - written_docs)
            if n <= 0:
                return
        else:
            n = rows_per_group
        rng = np.random.default_rng([seed, file_index, group_index, _DATASET_STREAM])
        source = rng.choice(len(SOURCES), size=n, p=probs)
        texts = _generate(rng, mean_log_words + shifts[source], sigma_log_words)
        if budget is not None:
            sizes = np.cumsum([len(t) for t in texts]) + written_bytes
            keep = int(np.searchsorted(sizes, budget, side="left")) + 1
            if keep <= n:  # this group reaches the budget: cut it there
                texts, source, n = texts[:keep], source[:keep], keep
            written_bytes = int(sizes[n - 1])
        ids = np.arange(first_id + written_docs, first_id + written_docs + n, dtype=np.int64)
        yield pa.table(
            [
                pa.array(ids, type=pa.int64()),
                pa.array(texts, type=pa.string()),
                sources.take(pa.array(source)),
            ],
            schema=SCHEMA,
        )
        written_docs += n
        group_index += 1
        if budget is not None and written_bytes >= budget:
            return
