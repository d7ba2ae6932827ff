"""Arrow arrays over numpy arrays, made without ``pyarrow.array``.

``pyarrow.array`` imports pandas the first time it runs, whatever it is given
(to ask whether the input is a pandas object): about 0.15 s of a fresh
process where pandas is installed. The hot path only ever turns flat numpy
arrays of numbers or booleans into Arrow, which needs no inference, so
:func:`from_numpy` builds the array on the numpy buffer directly (booleans
are packed into Arrow's bitmap). The result is the array ``pyarrow.array``
gives.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["from_numpy"]


def from_numpy(values: np.ndarray, type: pa.DataType | None = None) -> pa.Array:
    """Return ``values`` (a 1-d numpy array of numbers or booleans) as an Arrow array, without nulls.

    ``type`` converts first (``pa.int32()`` turns ``int64`` values into
    ``int32``); the default is the numpy dtype's Arrow type. Numbers are not
    copied when they are contiguous and of that type already.

    Examples
    --------
    >>> import numpy as np, pyarrow as pa
    >>> from_numpy(np.array([3, 1, 2])).to_pylist()
    [3, 1, 2]
    >>> from_numpy(np.array([True, False, True])).equals(pa.array([True, False, True]))
    True
    >>> from_numpy(np.arange(3), pa.int32()).type
    DataType(int32)
    """
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-d numpy array, got shape {arr.shape}")
    if type is not None:
        arr = arr.astype(type.to_pandas_dtype(), copy=False)
    if arr.dtype == np.bool_:
        bits = np.packbits(arr, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), arr.size, [None, pa.py_buffer(bits)])
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"expected numbers or booleans, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr)
    return pa.Array.from_buffers(pa.from_numpy_dtype(arr.dtype), arr.size, [None, pa.py_buffer(arr)])


def bools_to_numpy(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Return an Arrow boolean array (``is_valid()``, say) as a numpy ``bool`` array; nulls are false.

    ``to_numpy(zero_copy_only=False)`` on booleans goes through pyarrow's
    pandas conversion (and imports pandas); this unpacks the bitmap instead.

    Examples
    --------
    >>> import pyarrow as pa
    >>> bools_to_numpy(pa.array(["a", None, "b"]).is_valid()).tolist()
    [True, False, True]
    >>> bools_to_numpy(pa.chunked_array([[True], [None, True]])).tolist()
    [True, False, True]
    """
    if isinstance(values, pa.ChunkedArray):
        parts = [bools_to_numpy(c) for c in values.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
    if not pa.types.is_boolean(values.type):
        raise TypeError(f"expected a boolean array, got {values.type}")
    n, offset = len(values), values.offset
    _, data = values.buffers()[:2]
    if n == 0 or data is None:
        return np.zeros(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), count=offset + n, bitorder="little")
    out = bits[offset:].astype(bool)
    if values.null_count:
        out &= bools_to_numpy(values.is_valid())
    return out


def numbers_to_numpy(values: pa.Array | pa.ChunkedArray, null: int | float = 0) -> np.ndarray:
    """Return an Arrow array of integers or floats as a numpy array (a view when it can be); nulls become ``null``.

    ``to_numpy(zero_copy_only=False)`` goes through pyarrow's pandas
    conversion (and imports pandas); this reads the values buffer instead.

    Examples
    --------
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> numbers_to_numpy(pc.binary_length(pa.array(["ab", None, ""]))).tolist()
    [2, 0, 0]
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if values.null_count:
        values = values.fill_null(null)
    kind = values.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise TypeError(f"expected integers or floats, got {kind}")
    dtype = np.dtype(kind.to_pandas_dtype())
    data = values.buffers()[1]
    if data is None or len(values) == 0:
        return np.zeros(len(values), dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=values.offset + len(values))[values.offset :]
