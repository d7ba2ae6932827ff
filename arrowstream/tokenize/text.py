"""The text column a tokenizer reads: its documents as strings, and what to say when it is not text or not UTF-8.

Parquet stores strings as bytes and does not check that they are UTF-8; a
writer other than pyarrow may have stored any bytes, which only fail when a
document becomes a Python string for the tokenizer. :func:`invalid_utf8`
turns that failure into an error naming the column and the row (the
pipeline adds the file and row group), and :func:`text_advice` tells what to
do with a column of another type.
"""

from __future__ import annotations

import pyarrow as pa

from arrowstream.errors import SchemaError
from arrowstream.io.chunk import Chunk

__all__ = ["invalid_utf8", "text_advice", "texts_of"]


def texts_of(chunk: Chunk, column: str) -> list[str | None]:
    """The documents of ``column`` in ``chunk`` as Python strings, for the tokenizer; an error names bytes that are not UTF-8."""
    assert chunk.batch is not None
    values = chunk.batch.column(column)
    try:
        return values.to_pylist()
    except UnicodeDecodeError as exc:  # Parquet does not check UTF-8: a writer may have stored any bytes
        raise invalid_utf8(column, values, chunk, exc) from exc


def text_advice(dtype: pa.DataType) -> str:
    """How to give a tokenizer text when its column has type ``dtype`` instead of ``string``.

    Examples
    --------
    >>> text_advice(pa.list_(pa.int32()))
    'for a column of token ids use `.tokenize(None, column=...)`'
    >>> text_advice(pa.large_binary())
    'the column holds bytes, not text: write it as a string column (UTF-8 text) or cast it when writing'
    >>> text_advice(pa.dictionary(pa.int32(), pa.string()))
    'the column is dictionary-encoded (a categorical): write it as a plain string column'
    """
    if (pa.types.is_list(dtype) or pa.types.is_large_list(dtype)) and pa.types.is_integer(dtype.value_type):
        return "for a column of token ids use `.tokenize(None, column=...)`"
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype) or pa.types.is_fixed_size_binary(dtype):
        return "the column holds bytes, not text: write it as a string column (UTF-8 text) or cast it when writing"
    if pa.types.is_dictionary(dtype):
        return "the column is dictionary-encoded (a categorical): write it as a plain string column"
    return "pass the name of a text column with `column=`"


def invalid_utf8(column: str, values: pa.Array | pa.ChunkedArray, chunk: Chunk, exc: UnicodeDecodeError) -> SchemaError:
    """The error for ``values`` (column ``column`` of ``chunk``) holding a document that is not valid UTF-8.

    Names the first such row: within its row group, or, in a shuffle window
    (rows of several row groups mixed), its place among the window's rows
    at hand. Made only on the error path: it looks at the rows one by one.

    Examples
    --------
    >>> import numpy as np
    >>> from arrowstream.io.chunk import Chunk
    >>> raw = [b"fine", b"bad \\xff"]
    >>> offsets = pa.py_buffer(np.array([0, 4, 9], np.int32).tobytes())
    >>> arr = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"".join(raw))])
    >>> chunk = Chunk(epoch=0, shard=0, seq_start=0, seq_end=2, row_start=10, seq=np.arange(2), batch=None)
    >>> try:
    ...     arr.to_pylist()
    ... except UnicodeDecodeError as exc:
    ...     print(invalid_utf8("text", arr, chunk, exc))
    column `text` holds bytes that are not UTF-8 text in row 11 (byte 4 of the document: invalid start byte); \
write the files again with the text as UTF-8 (in Python, `raw.decode('utf-8', errors='replace')` keeps the rest \
of a broken document)
    """
    row, detail = None, f"{exc.reason}"
    for i, value in enumerate(values.cast(pa.binary()).to_pylist()):
        if value is None:
            continue
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as bad:
            row, detail = i, f"byte {bad.start} of the document: {bad.reason}"
            break
    if row is None:
        where = ""
    elif chunk.mixed:
        where = f" in document {row} of those read together from a shuffle window"
    else:
        where = f" in row {chunk.row_start + row}"
    return SchemaError(
        f"column `{column}` holds bytes that are not UTF-8 text{where} ({detail}); write the files again "
        "with the text as UTF-8 (in Python, `raw.decode('utf-8', errors='replace')` keeps the rest of a "
        "broken document)"
    )
