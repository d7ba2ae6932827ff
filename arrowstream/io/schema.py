"""Schemas across files: one spelling per type, and the columns that agree in every file.

:func:`normalize_type` maps equivalent Arrow types to one (``large_string``
reads as ``string``); :func:`check_schemas` finds the selected columns'
common schema and names the file where a column goes missing or changes type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from arrowstream.errors import ConfigError, SchemaError

__all__ = ["check_schemas", "normalize_type"]


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


def check_schemas(
    files: Sequence[Any], columns: Sequence[str] | None
) -> tuple[pa.Schema, dict[str, str]]:
    """Return the schema of the selected columns and, for ``columns=None``, the drifted ones.

    With explicit ``columns`` any difference is an error. With ``columns=None``
    a column that is missing from a file or changes type is left out of the
    schema and described in the returned dict; using it later is an error.
    ``files`` have a ``path`` and a ``schema`` (the manifest's file records).
    """
    first = files[0]
    names = list(columns) if columns is not None else list(first.schema.names)
    if columns is not None and len(set(names)) != len(names):
        raise ConfigError(f"`columns` lists a column twice: {names!r}")
    fields, drift = [], {}
    for name in names:
        idx = first.schema.get_field_index(name)
        if idx < 0:
            raise SchemaError(
                f"column `{name}` is missing from {first.path!r}; it has columns "
                f"{first.schema.names!r}: fix `columns=` or the data"
            )
        field = pa.field(name, normalize_type(first.schema.field(idx).type))
        problem = _drift(field, first, files[1:])
        if problem is None:
            fields.append(field)
        elif columns is not None:
            raise SchemaError(problem)
        else:
            drift[name] = problem
    return pa.schema(fields), drift


def _drift(field: pa.Field, first: Any, others: Sequence[Any]) -> str | None:
    for info in others:
        idx = info.schema.get_field_index(field.name)
        if idx < 0:
            return (
                f"column `{field.name}` is in {first.path!r} but missing from {info.path!r} "
                "(schema drift): select common columns with `columns=` or fix the files"
            )
        other = normalize_type(info.schema.field(idx).type)
        if other != field.type:
            return (
                f"column `{field.name}` has type {field.type} in {first.path!r} but {other} in "
                f"{info.path!r} (schema drift): rewrite the files with one type"
            )
    return None
