"""Schemas across files: one spelling per type, and the columns that agree in every file.

:func:`normalize_type` maps equivalent Arrow types to one (``large_string``
reads as ``string``); :func:`check_schemas` finds the selected columns'
common schema and names the file where a column goes missing or changes type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowstream.errors import ConfigError, SchemaError

__all__ = ["MAX_BATCH_VALUES", "check_batch_size", "check_schemas", "normalize_type", "unview"]


def normalize_type(dtype: pa.DataType) -> pa.DataType:
    """Map equivalent Arrow types to one spelling (large/view strings and lists).

    Examples
    --------
    >>> normalize_type(pa.large_list(pa.int64()))
    ListType(list<item: int64>)
    """
    if pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return pa.string()
    if pa.types.is_large_binary(dtype) or pa.types.is_binary_view(dtype):
        return pa.binary()
    if (
        pa.types.is_large_list(dtype)
        or pa.types.is_list_view(dtype)
        or pa.types.is_large_list_view(dtype)
        or pa.types.is_list(dtype)
    ):
        return pa.list_(normalize_type(dtype.value_type))
    return dtype


#: Bytes of values one string, binary or list array can hold (32-bit offsets): a row group is read as one batch.
MAX_BATCH_VALUES = 2**31 - 1


def check_batch_size(table: pa.Table, path: str, row_group: int, *, limit: int | None = None) -> None:
    """Raise :class:`SchemaError` when a variable-width column of ``table`` holds more values than one array can.

    Every row group is read as one batch whose text and list columns have
    32-bit offsets (``large_string`` reads as ``string``), which count bytes
    in a text column and elements in a list column: past ``limit`` (2 GiB
    of text, or 2**31 - 1 ids) in one row group the rows cannot be held in
    one array, and the reader would see part of them. Said up front, naming
    the file, row group and column, with the fix (smaller row groups).

    Examples
    --------
    >>> t = pa.table({"text": ["abc", "defg"], "ids": [[1, 2, 3], [4, 5]]})
    >>> check_batch_size(t, "a.parquet", 0)
    >>> check_batch_size(t.select(["ids"]), "a.parquet", 0, limit=5)
    >>> check_batch_size(t, "a.parquet", 3, limit=5)
    Traceback (most recent call last):
    ...
    arrowstream.errors.SchemaError: 'a.parquet', row group 3, column `text`: 7 bytes of values, more than one batch holds (5 bytes, 32-bit offsets); rewrite the file with smaller row groups (`row_group_size=` of pyarrow's or polars' writer), a few hundred MB of text each
    >>> check_batch_size(t.select(["ids"]), "a.parquet", 3, limit=4)
    Traceback (most recent call last):
    ...
    arrowstream.errors.SchemaError: 'a.parquet', row group 3, column `ids`: 5 list elements, more than one batch holds (4 list elements, 32-bit offsets); rewrite the file with smaller row groups (`row_group_size=` of pyarrow's or polars' writer), a few hundred MB of text each
    """
    limit = MAX_BATCH_VALUES if limit is None else limit
    for field, column in zip(table.schema, table.columns):
        dtype = field.type
        lists = pa.types.is_list(dtype) or pa.types.is_large_list(dtype)
        if not (lists or pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_binary(dtype)
                or pa.types.is_large_binary(dtype)):
            continue
        if column.nbytes <= limit:  # offsets and validity included: within the limit, the values are too
            continue
        values = sum(
            len(chunk.values) if lists else int(chunk.buffers()[2].size if chunk.buffers()[2] is not None else 0)
            for chunk in column.chunks
        )
        if values > limit:
            unit = "list elements" if lists else "bytes"
            raise SchemaError(
                f"{path!r}, row group {row_group}, column `{field.name}`: {values:,} {unit}{'' if lists else ' of values'}, "
                f"more than one batch holds ({limit:,} {unit}, 32-bit offsets); rewrite the file with smaller row "
                "groups (`row_group_size=` of pyarrow's or polars' writer), a few hundred MB of text each"
            )


def unview(table: pa.Table) -> pa.Table:
    """Return ``table`` with its list-view columns as large lists of the same values, ready to cast.

    :func:`normalize_type` reads ``list_view`` as ``list``, but pyarrow's
    casts of a list view (26 at least) are unsound: straight to a list the
    offsets buffer comes out one entry short, and to a large list rows can
    come out empty. The lists are built from the views' values and lengths
    instead.

    Examples
    --------
    >>> t = pa.table({"ids": pa.array([[1, 2], [3], None, []], pa.list_view(pa.int32()))})
    >>> unview(t).cast(pa.schema([("ids", pa.list_(pa.int32()))])).column("ids").to_pylist()
    [[1, 2], [3], None, []]
    """
    for i, field in enumerate(table.schema):
        dtype = field.type
        if pa.types.is_list_view(dtype) or pa.types.is_large_list_view(dtype):
            wide = pa.large_list(dtype.value_field)
            chunks = [_unview_chunk(chunk, wide) for chunk in table.column(i).chunks]
            table = table.set_column(i, field.with_type(wide), pa.chunked_array(chunks, type=wide))
    return table


def _unview_chunk(chunk: pa.Array, wide: pa.DataType) -> pa.Array:
    """One list-view array as a large list: its values in row order, offsets from its lengths."""
    lengths = pc.fill_null(chunk.value_lengths(), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.zeros(len(chunk) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    mask = chunk.is_null() if chunk.null_count else None
    out = pa.LargeListArray.from_arrays(pa.array(offsets), chunk.flatten(), mask=mask)
    return out.cast(wide)


def check_schemas(
    files: Sequence[Any], columns: Sequence[str] | None
) -> tuple[pa.Schema, dict[str, str]]:
    """Return the schema of the selected columns and, for ``columns=None``, the drifted ones.

    Types that hold the same values agree: integers of several widths read
    as the widest (token ids written as ``list<int32>`` in one file and
    ``list<int64>`` in another), and a column of type ``null`` (what pandas
    writes for a column that is all ``None``) as the other files' type; the
    reader casts each file's columns to it. With explicit ``columns`` any
    other difference is an error. With ``columns=None`` (every column of any
    file) a column that is missing from a file or changes type is left out of
    the schema and described in the returned dict; using it later is an error.
    ``files`` have a ``path`` and a ``schema`` (the manifest's file records).

    Examples
    --------
    >>> from types import SimpleNamespace as File
    >>> a = File(path="a.parquet", schema=pa.schema([("ids", pa.list_(pa.int32())), ("note", pa.null())]))
    >>> b = File(path="b.parquet", schema=pa.schema([("ids", pa.list_(pa.int64())), ("note", pa.string())]))
    >>> schema, drift = check_schemas([a, b], None)
    >>> schema.types, drift
    ([ListType(list<item: int64>), DataType(string)], {})
    """
    if isinstance(columns, (str, bytes)):
        raise ConfigError(f"`columns` should be a list of column names, got the string {columns!r}: pass [{columns!r}]")
    first = files[0]
    if columns is not None:
        names = list(columns)
        if len(set(names)) != len(names):
            raise ConfigError(f"`columns` lists a column twice: {names!r}")
        for name in names:
            if first.schema.get_field_index(name) < 0:
                raise SchemaError(
                    f"column `{name}` is missing from {first.path!r}; it has columns "
                    f"{first.schema.names!r}: fix `columns=` or the data"
                )
    else:  # every column of any file, the first file's in its order
        names = list(dict.fromkeys(name for info in files for name in info.schema.names))
    fields, drift = [], {}
    for name in names:
        field, problem = _common_field(name, files)
        if problem is None:
            fields.append(field)
        elif columns is not None:
            raise SchemaError(problem)
        else:
            drift[name] = problem
    return pa.schema(fields), drift


def _common_field(name: str, files: Sequence[Any]) -> tuple[pa.Field | None, str | None]:
    """The type column ``name`` reads as in every file, or why there is none (missing from one, types that differ)."""
    have = [info for info in files if info.schema.get_field_index(name) >= 0]
    if len(have) < len(files):
        missing = next(info for info in files if info.schema.get_field_index(name) < 0)
        return None, (
            f"column `{name}` is in {have[0].path!r} but missing from {missing.path!r} "
            "(schema drift): every file must have the columns read: read the others only (`columns=`), add it "
            "to the files that lack it, or read those files apart"
        )
    dtype, since = normalize_type(have[0].schema.field(name).type), have[0]
    for info in have[1:]:
        other = normalize_type(info.schema.field(name).type)
        common = _common_type(dtype, other)
        if common is None:
            return None, (
                f"column `{name}` has type {dtype} in {since.path!r} but {other} in "
                f"{info.path!r} (schema drift): rewrite the files with one type"
            )
        if common != dtype:
            dtype, since = common, info
    return pa.field(name, dtype), None


def _common_type(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type both ``a`` and ``b`` cast to without loss (``None`` when there is none).

    Examples
    --------
    >>> _common_type(pa.int32(), pa.int64()), _common_type(pa.uint32(), pa.int16())
    (DataType(int64), DataType(int64))
    >>> _common_type(pa.null(), pa.string()), _common_type(pa.string(), pa.int64())
    (DataType(string), None)
    """
    if a == b:
        return a
    if pa.types.is_null(a) or pa.types.is_null(b):
        return b if pa.types.is_null(a) else a
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        signed = pa.types.is_signed_integer(a) or pa.types.is_signed_integer(b)
        bits = max(_bits(a, signed), _bits(b, signed))
        if bits > 64:
            return None  # uint64 beside a signed type: no integer type holds both
        return {8: pa.int8(), 16: pa.int16(), 32: pa.int32(), 64: pa.int64()}[bits] if signed else {
            8: pa.uint8(), 16: pa.uint16(), 32: pa.uint32(), 64: pa.uint64()}[bits]
    if pa.types.is_list(a) and pa.types.is_list(b):
        inner = _common_type(a.value_type, b.value_type)
        return None if inner is None else pa.list_(inner)
    return None


def _bits(dtype: pa.DataType, signed: bool) -> int:
    """Bits a signed (``signed``) or unsigned integer type needs to hold every value of ``dtype``."""
    return dtype.bit_width * 2 if signed and pa.types.is_unsigned_integer(dtype) else dtype.bit_width
