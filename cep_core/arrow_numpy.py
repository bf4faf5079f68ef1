"""Arrow columns to numpy and back, sharing memory, without importing pandas (`array`:
`pa.array` for the columns of composite events).

pyarrow's own conversions (`Array.to_numpy`, `pa.array(ndarray)`, comparisons with a
Python value) look for pandas objects first, which imports pandas: 0.1-0.2 s of a
`cep run` that otherwise never needs it. These cover the fixed-width columns the engines
use; anything else is left to pyarrow. `segment_rows` is the row gather that engines,
composite batches and the CSV reader share.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

if TYPE_CHECKING:
    from cep_core.schema import StreamSchema

# The Arrow type of each attribute kind of a stream schema.
ARROW_TYPES = {"int": pa.int64(), "timestamp": pa.int64(), "float": pa.float64(),
               "bool": pa.bool_(), "string": pa.string()}


def arrow_schema(schema: StreamSchema) -> pa.Schema:
    """A stream's events as an Arrow table: `seq`, then the stream's attributes."""
    return pa.schema([("seq", pa.int64())] + [(name, ARROW_TYPES[kind])
                                              for name, kind in schema.attributes.items()])

_NUMPY = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32,
          pa.int64(): np.int64, pa.uint8(): np.uint8, pa.uint16(): np.uint16,
          pa.uint32(): np.uint32, pa.uint64(): np.uint64, pa.float32(): np.float32,
          pa.float64(): np.float64}


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of no rows (`Schema.empty_table()` imports pandas: ~0.2 s of a start)."""
    return pa.Table.from_batches([], schema=schema)


def to_numpy(column: pa.Array | pa.ChunkedArray) -> npt.NDArray[Any]:
    """The values of a numeric or bool column (read-only where memory is shared); a null
    slot holds whatever Arrow left there (a float column: NaN, as pyarrow gives)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if array.type == pa.bool_():
        if not len(array):
            return np.zeros(0, dtype=bool)
        bits = np.frombuffer(array.buffers()[1], dtype=np.uint8)
        values = np.unpackbits(bits, count=array.offset + len(array), bitorder="little")
        return values[array.offset:].view(bool)
    dtype = _NUMPY.get(array.type)
    if dtype is None:
        converted: npt.NDArray[Any] = array.to_numpy(zero_copy_only=False)
        return converted
    if not len(array):
        return np.zeros(0, dtype=dtype)
    values = np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array),
                           offset=array.offset * np.dtype(dtype).itemsize)
    if array.null_count and values.dtype.kind == "f":
        values = np.where(is_null(array), np.nan, values)
    return values


def is_null(column: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    return to_numpy(column.is_null())


def from_numpy(values: npt.NDArray[Any]) -> pa.Array:
    """An int64, float64 or bool numpy column as an Arrow array, sharing its memory (bools
    are packed to bits)."""
    if values.dtype == np.bool_:
        bits = np.packbits(values, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])
    arrow_type, dtype = (pa.float64(), np.float64) if values.dtype.kind == "f" \
        else (pa.int64(), np.int64)
    values = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def strings(values: list[str]) -> pa.Array:
    """A few strings as an Arrow array."""
    data = [v.encode() for v in values]
    offsets = np.concatenate(([0], np.cumsum([len(d) for d in data]))).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(values),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


def array(values: npt.NDArray[Any] | Sequence[Any], arrow_type: pa.DataType,
          mask: npt.NDArray[np.bool_] | None = None) -> pa.Array:
    """`pa.array(values, arrow_type, mask=mask)` without pandas, for numpy columns of a
    fixed-width type (or bool) and lists of strings (None: null); `mask` marks nulls."""
    if pa.types.is_string(arrow_type) and not isinstance(values, np.ndarray):
        nulls = np.array([v is None for v in values], dtype=bool)
        data = [b"" if v is None else v.encode() for v in values]
        offsets = np.zeros(len(data) + 1, dtype=np.int64)
        np.cumsum([len(d) for d in data], out=offsets[1:])
        if offsets[-1] >= 1 << 31:  # beyond 32-bit offsets: pyarrow's own error
            return pa.array(values, arrow_type, mask=mask)
        buffers = [pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(data))]
        return _with_validity(arrow_type, len(data), buffers, nulls if mask is None
                              else nulls | np.asarray(mask, dtype=bool))
    values = np.asarray(values)
    if arrow_type == pa.bool_():
        data = pa.py_buffer(np.packbits(values.astype(bool), bitorder="little"))
    elif arrow_type in _NUMPY:
        data = pa.py_buffer(np.ascontiguousarray(values, dtype=_NUMPY[arrow_type]))
    else:
        return pa.array(values, arrow_type, mask=mask)
    return _with_validity(arrow_type, len(values), [data], mask)


def _with_validity(arrow_type: pa.DataType, n: int, buffers: list[pa.Buffer],
                   nulls: npt.NDArray[np.bool_] | None) -> pa.Array:
    if nulls is None or not nulls.any():
        return pa.Array.from_buffers(arrow_type, n, [None, *buffers])
    valid = pa.py_buffer(np.packbits(~np.asarray(nulls, dtype=bool), bitorder="little"))
    return pa.Array.from_buffers(arrow_type, n, [valid, *buffers],
                                 null_count=int(np.count_nonzero(nulls)))


def segment_rows(base: npt.ArrayLike, count: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The rows base[p] .. base[p] + count[p] - 1 of every p, concatenated."""
    count = np.asarray(count, np.int64)
    total = int(count.sum())
    starts = np.repeat(np.asarray(base, np.int64) - np.cumsum(count) + count, count)
    return starts + np.arange(total, dtype=np.int64)
