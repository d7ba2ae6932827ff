"""The one small table the examples in the docs and docstrings share.

Every example that needs a Parquet dataset reads this table instead of writing
its own, so a reader learns one table once and every output is easy to check
by eye. Its twelve rows name themselves: row ``i`` has ``n == i``, ``text`` the
English word for ``i``, and token ids ``(i + 1) * 10 + k`` for ``k`` in
``0 .. len - 1``, with lengths cycling 3, 1, 2, 4 (30 tokens in all).

Determinism invariant: :func:`example_table` is a constant and
:func:`example_dir` writes the same bytes on every call (same pyarrow), each
time into a new temporary directory, so examples never share or race on files.
Only pyarrow and the standard library are imported: importing this module
stays cheap.
"""

from __future__ import annotations

import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["example_dir", "example_table"]

_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
)
_LANGS = ("en", "de", "en", "fr")
_LENGTHS = (3, 1, 2, 4)


def example_table() -> pa.Table:
    """Return the shared example table: 12 rows of ``n``, ``text``, ``lang`` and ``ids``.

    Returns
    -------
    pyarrow.Table
        Columns ``n`` (int64, 0 to 11), ``text`` (``"zero"`` to ``"eleven"``),
        ``lang`` (``"en"``, ``"de"``, ``"en"``, ``"fr"``, repeating) and ``ids``
        (``list<int32>``: row ``i`` holds ``(i + 1) * 10 + k``, of length 3, 1,
        2, 4, repeating).

    Examples
    --------
    >>> t = example_table()
    >>> t.num_rows, t.schema.names
    (12, ['n', 'text', 'lang', 'ids'])
    >>> t.slice(0, 4).to_pydict()
    {'n': [0, 1, 2, 3], 'text': ['zero', 'one', 'two', 'three'], 'lang': ['en', 'de', 'en', 'fr'],
     'ids': [[10, 11, 12], [20], [30, 31], [40, 41, 42, 43]]}
    """
    rows = range(len(_WORDS))
    ids = [[(i + 1) * 10 + k for k in range(_LENGTHS[i % len(_LENGTHS)])] for i in rows]
    return pa.table(
        {
            "n": pa.array(rows, pa.int64()),
            "text": pa.array(_WORDS, pa.string()),
            "lang": pa.array([_LANGS[i % len(_LANGS)] for i in rows], pa.string()),
            "ids": pa.array(ids, pa.list_(pa.int32())),
        }
    )


def example_dir(row_group_size: int = 4) -> str:
    """Write :func:`example_table` to a new temporary directory as ``a.parquet``; return the directory.

    Parameters
    ----------
    row_group_size
        Rows per row group (the last one may be shorter): 4 gives three
        row groups of 4 rows.

    Returns
    -------
    str
        The path of the new directory, which holds ``a.parquet`` only. The
        caller owns it (examples leave it to the system's temporary files).

    Examples
    --------
    >>> import os, pyarrow.parquet as pq
    >>> d = example_dir(row_group_size=5)
    >>> os.listdir(d)
    ['a.parquet']
    >>> meta = pq.read_metadata(f"{d}/a.parquet")
    >>> [meta.row_group(r).num_rows for r in range(meta.num_row_groups)]
    [5, 5, 2]
    """
    directory = tempfile.mkdtemp()
    pq.write_table(example_table(), f"{directory}/a.parquet", row_group_size=row_group_size)
    return directory
