"""Row-group statistics kept from the one footer pass, and filter pruning with them.

The manifest reads every footer once. What filter pruning needs of it, the
minimum, maximum and null count of each top-level column in each row group,
is kept here in a small Arrow table (:class:`FileStatistics`). Pruning then
reads no file: it writes those statistics into a tiny Parquet file in memory,
one row group per source row group holding exactly the bounds the source
footer stated, and lets ``pyarrow.dataset`` decide which row groups an
expression can match. pyarrow's own rules decide, so the verdict is the one
it gives on the source files.

Floating-point columns rule nothing out: Parquet's bounds leave NaN out
(so does pyarrow's writer), and a filter true for NaN (``~(x > 0.5)``,
``x != 1``) would otherwise lose the rows that hold one, as pyarrow's own
``read_table(filters=...)`` does. Their filters still run on every row.

String and binary bounds longer than :data:`BOUND_BYTES` are cut to a
shorter bound that still holds (a prefix for the minimum, a prefix with its
last character raised for the maximum), so a text column's statistics stay
small; a row group is then kept where the full bound might have ruled it out
only when the literal compared with shares that whole prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["BOUND_BYTES", "FileStatistics", "matching_row_groups"]

#: Longest string or binary bound kept (in characters or bytes).
BOUND_BYTES = 64


@dataclass(frozen=True, slots=True)
class FileStatistics:
    """The statistics of one file's row groups, as pruning needs them.

    Attributes
    ----------
    table : pyarrow.Table
        Three rows per row group, for each top-level primitive column: the
        minimum, the maximum and a null if the row group has a null (else the
        minimum again); three nulls when every value is null.
    known : numpy.ndarray
        ``bool[row groups, columns]``: whether the footer stated the
        column's bounds in the row group (unknown bounds rule nothing out).
    """

    table: pa.Table
    known: np.ndarray

    @classmethod
    def of(cls, meta: pq.FileMetaData, schema: pa.Schema) -> FileStatistics:
        """Return the statistics a footer states for the top-level primitive columns of ``schema``.

        Examples
        --------
        >>> import io, pyarrow as pa, pyarrow.parquet as pq
        >>> sink = io.BytesIO()
        >>> pq.write_table(pa.table({"n": [1, 5, None, 7]}), sink, row_group_size=2)
        >>> meta = pq.ParquetFile(sink).metadata
        >>> stats = FileStatistics.of(meta, meta.schema.to_arrow_schema())
        >>> stats.table.column("n").to_pylist(), stats.known.tolist()
        ([1, 5, 1, 7, 7, None], [[True], [True]])
        """
        leaf = {meta.schema.column(j).path: j for j in range(meta.num_columns)}
        fields = [f for f in schema if f.name in leaf and not pa.types.is_nested(f.type)]
        groups = [meta.row_group(r) for r in range(meta.num_row_groups)]
        rows = len(groups)
        known = np.zeros((rows, len(fields)), dtype=bool)
        columns = []
        for c, field in enumerate(fields):
            if pa.types.is_floating(field.type):  # bounds leave NaN out: no bound holds for every row
                columns.append(pa.nulls(3 * rows, type=field.type))
                continue
            values: list[object] = []
            j = leaf[field.name]
            for r, group in enumerate(groups):
                triple = _triple(group.column(j).statistics, group.num_rows)
                known[r, c] = triple is not None
                values.extend(triple or (None, None, None))
            try:
                columns.append(pa.array(values, type=field.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
                known[:, c] = False  # a type the bounds do not convert back to: rule nothing out
                columns.append(pa.nulls(3 * rows, type=field.type))
        return cls(pa.Table.from_arrays(columns, schema=pa.schema(fields)), known)


def matching_row_groups(stats: FileStatistics, expr: pc.Expression) -> set[int]:
    """Return the row groups in which ``expr`` may be true, as pyarrow judges from their bounds.

    An expression pyarrow cannot judge (a column without statistics, a type
    mismatch) keeps every row group.

    Examples
    --------
    >>> import io, pyarrow as pa, pyarrow.parquet as pq, pyarrow.compute as pc
    >>> sink = io.BytesIO()
    >>> pq.write_table(pa.table({"n": [1, 2, 8, 9]}), sink, row_group_size=2)
    >>> meta = pq.ParquetFile(sink).metadata
    >>> stats = FileStatistics.of(meta, meta.schema.to_arrow_schema())
    >>> sorted(matching_row_groups(stats, pc.field("n") > 5))
    [1]
    """
    import pyarrow.dataset as pads  # here: importing it costs a process about 0.15 s (it imports pandas)

    rows = stats.known.shape[0]
    everything = set(range(rows))
    if rows == 0:
        return everything
    kept: set[int] = set()
    patterns, which = np.unique(stats.known, axis=0, return_inverse=True)
    for p, pattern in enumerate(patterns):
        groups = np.flatnonzero(which.reshape(-1) == p)
        take = (3 * groups[:, None] + np.arange(3)).reshape(-1)
        sub = stats.table.take(pa.array(take))
        with_bounds = [name for name, k in zip(sub.column_names, pattern) if k]
        sink = pa.BufferOutputStream()
        pq.write_table(sub, sink, row_group_size=3, write_statistics=with_bounds or False)
        fragment = pads.ParquetFileFormat().make_fragment(pa.BufferReader(sink.getvalue()))
        try:
            parts = fragment.split_by_row_group(expr, schema=fragment.physical_schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return everything
        kept.update(int(groups[rg.id]) for part in parts for rg in part.row_groups)
    return kept


def _triple(st: pq.Statistics | None, num_rows: int) -> tuple[object, object, object] | None:
    """Return the three rows standing for a column chunk's statistics, or ``None`` when unknown."""
    if st is None or not st.has_null_count:
        return None
    if st.null_count == num_rows:
        return (None, None, None)
    if not st.has_min_max:
        return None
    low, high = _lower(st.min), _upper(st.max)
    if low is None or high is None:
        return None
    return (low, high, None if st.null_count > 0 else low)


def _lower(value: object) -> object:
    if isinstance(value, (str, bytes)) and len(value) > BOUND_BYTES:
        return value[:BOUND_BYTES]
    return value


def _upper(value: object) -> object:
    """``value``, or a shorter value above it; ``None`` when there is none."""
    if not isinstance(value, (str, bytes)) or len(value) <= BOUND_BYTES:
        return value
    head = value[:BOUND_BYTES]
    for i in range(len(head) - 1, -1, -1):
        if isinstance(head, bytes):
            if head[i] < 0xFF:
                return head[:i] + bytes([head[i] + 1])
        elif ord(head[i]) < 0x10FFFF and not 0xD7FF <= ord(head[i]) < 0xDFFF:
            return head[:i] + chr(ord(head[i]) + 1)
    return None
