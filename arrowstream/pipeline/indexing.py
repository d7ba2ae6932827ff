"""Building a length index for a dataset: every document's token count, once, so even batches are exact.

See :mod:`arrowstream.tokenize.lengths` for what the index holds and where it
lives. Building tokenizes every row group of the text column with the same
encoder a pipeline would use (the same proof of exactness, the same threads),
keeps only the counts, and skips the files an earlier build already covered.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from tokenizers import Tokenizer

from arrowstream.pipeline.dataset import read_parquet
from arrowstream.tokenize import Tokenize
from arrowstream.tokenize.encoders import Encoder
from arrowstream.tokenize.lengths import IndexSummary, LengthIndex

__all__ = ["build_length_index"]


def build_length_index(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    tokenizer: Tokenizer | Encoder | str | os.PathLike[str] | None,
    *,
    column: str = "text",
    add_special_tokens: bool = True,
    length_index: str | os.PathLike[str] | None = None,
    filesystem: Any = None,
    progress: Callable[[int], None] | None = None,
    shard: tuple[int, int] = (0, 1),
) -> IndexSummary:
    """Count the tokens of every document of ``source`` and keep them in a length index.

    A pipeline over the same data with the same tokenizer, ``column`` and
    ``add_special_tokens`` then finds the index and splits every epoch
    between consumers by exact token counts (``ds.balance`` starts with
    ``"counted"``). Run it again after adding files: only the files not yet
    covered (or changed) are tokenized.

    Parameters
    ----------
    source, filesystem
        The dataset, as for :func:`~arrowstream.read_parquet`.
    tokenizer, column, add_special_tokens
        As for ``.tokenize``: they define the ids counted. ``tokenizer``
        ``None``: ``column`` holds token ids, and the index keeps each
        row's count of them (what a plan over ``.shuffle``'s half row
        groups would otherwise read every row group's ids for).
    length_index
        The directory to keep the index in; ``None``: beside the data, in
        ``<root>/_arrowstream_index``, where pipelines look by default
        (elsewhere, pass the same directory as ``.tokenize(..., length_index=...)``).
    progress
        Called with the number of row groups done, after each (a progress bar's ``update``).
    shard
        ``(i, n)``: count only every ``n``-th file from the ``i``-th, one
        process of ``n`` sharing the work (entries are per file, written
        whole; the union is the one-process index).

    Returns
    -------
    IndexSummary
        The index directory, files covered and built, documents, ids, seconds.

    Raises
    ------
    SchemaError
        ``column`` is missing or not text.
    CacheError
        The index directory states another setting.

    Examples
    --------
    >>> import shutil, tempfile
    >>> from arrowstream import read_parquet
    >>> from arrowstream.testing import example_dir
    >>> from arrowstream.testing.data import sample_tokenizer
    >>> d = shutil.copytree(example_dir(), tempfile.mkdtemp() + "/data")
    >>> tok = sample_tokenizer(300)
    >>> summary = build_length_index(d, tok)
    >>> summary.num_files, summary.num_built, summary.num_docs
    (1, 1, 12)
    >>> ds = read_parquet(d).tokenize(tok).pack(seq_len=16, batch_size=2)
    >>> ds.balance
    'counted: a length index (whole row groups from the footers)'
    >>> build_length_index(d, tok).num_built   # every file already covered
    0
    """
    ds = read_parquet(source, columns=[column], filesystem=filesystem).tokenize(
        tokenizer,
        column=column,
        add_eos=False,
        add_special_tokens=add_special_tokens,
        length_index=length_index,
    )
    stage = ds.stages[-1]
    assert isinstance(stage, Tokenize)
    index = LengthIndex(ds.manifest, stage.setting, length_index)
    if stage.encoder is None:  # token ids: their lists' lengths
        return index.build(None, column=column, progress=progress, shard=shard)
    return index.build(
        stage.encoder.encode,
        column=column,
        slice_bytes=stage.slice_budget,
        num_threads=stage.num_inflight,
        progress=progress,
        shard=shard,
    )
