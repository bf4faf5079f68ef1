"""Decoding records held in Arrow columns into event columns, with the reasons of bad rows.

The columnar counterpart of `cep_core.event_io.decode_record` (for Parquet and other typed
sources): a column whose Arrow type already fits the schema is taken as a whole (no Python
object per row); the rows it cannot vouch for (nulls, non-finite floats, negative seqs,
unknown event types, columns of another type) go through `decode_record` one by one, so a
bad row gets exactly the reason `cep run` gives it. Used by the Spark backfill; the
streaming service can use it for any Arrow input. Columns go to numpy through
`cep_core.arrow_numpy` and nulls are filled in numpy: pyarrow's `to_numpy` and any Python
scalar (`fill_null(0)`) import pandas, ~0.3 s of CPU of a `cep run` from Parquet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cep_core.arrow_numpy import is_null, strings, to_numpy
from cep_core.errors import EventError
from cep_core.event_io import INT64_MAX, decode_record
from cep_core.events import Event
from cep_core.schema import AttrType, NANOS_PER_UNIT, StreamSchema

Int64s = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

ARROW_TYPES = {"int": pa.int64(), "timestamp": pa.int64(), "float": pa.float64(),
               "bool": pa.bool_(), "string": pa.string()}


@dataclass
class DecodedColumns:
    """`seq` (int64, every row), `attributes` (Arrow arrays in schema order, types of
    ARROW_TYPES; null on bad rows), `errors` (None on good rows, else the reason), `raw`
    (None on good rows, else the record as read) and `bad` (True where `errors` is not
    None: no Python loop over the rows needed to find them)."""

    seq: Int64s
    attributes: dict[str, pa.Array]
    errors: list[str | None]
    raw: list[str | None]
    bad: Mask


def decode_table(table: pa.Table, schema: StreamSchema, positions: Int64s) -> DecodedColumns:
    """Every row of `table` (typed columns, field name -> value) as event columns; a row's
    default seq is its entry in `positions`."""
    n = table.num_rows
    slow = np.zeros(n, dtype=bool)
    seq = _seq_column(table, positions, slow)
    columns: dict[str, pa.Array | None] = {}
    for name, kind in schema.attributes.items():
        columns[name] = _attribute_column(table, name, kind, schema, slow)
    if schema.type_attribute is not None and schema.types is not None \
            and columns[schema.type_attribute] is not None:
        known = pc.is_in(columns[schema.type_attribute],
                         strings(list(schema.types)))
        slow |= ~to_numpy(known) & ~is_null(known)  # a null: not for this check
    if any(c is None for c in columns.values()):
        slow[:] = True
    errors: list[str | None] = [None] * n
    raw: list[str | None] = [None] * n
    bad = np.zeros(n, dtype=bool)
    rows = np.flatnonzero(slow)
    if len(rows) == 0:
        return DecodedColumns(seq, columns, errors, raw, bad)
    records = _records(table.take(pa.array(rows)), schema)
    values = {name: (c.to_pylist() if c is not None else [None] * n)
              for name, c in columns.items()}
    for row, record in zip(rows.tolist(), records):
        try:
            if isinstance(record, str):
                raise EventError(record)
            event = decode_record(record, schema, int(positions[row]))
        except EventError as e:
            errors[row] = str(e)
            bad[row] = True
            raw[row] = orjson.dumps(_row_as_read(table, row), default=str).decode()
            for column in values.values():
                column[row] = None
            continue
        seq[row] = event.seq
        for name, column in values.items():
            column[row] = event.attrs[name]
    attributes = {name: pa.array(values[name], type=ARROW_TYPES[kind])
                  for name, kind in schema.attributes.items()}
    return DecodedColumns(seq, attributes, errors, raw, bad)


def events_to_columns(events: list[Event | None], schema: StreamSchema) -> dict[str, pa.Array]:
    """Attribute columns of decoded events (None: a bad row, null in every column)."""
    return {name: pa.array([e.attrs[name] if e is not None else None for e in events],
                           type=ARROW_TYPES[kind])
            for name, kind in schema.attributes.items()}


def _records(rows: pa.Table, schema: StreamSchema) -> list[dict[str, Any] | str]:
    """The rows as dicts; a row Python cannot hold (a time beyond the years 1-9999) is
    the reason instead."""
    try:
        records: list[dict[str, Any] | str] = rows.to_pylist()
        return records
    except (OverflowError, ValueError, pa.ArrowException):
        pass
    out: list[dict[str, Any] | str] = []
    for i in range(rows.num_rows):
        try:
            out.extend(rows.slice(i, 1).to_pylist())
        except (OverflowError, ValueError, pa.ArrowException):
            out.append(f"a time of the row is out of range (stream {schema.stream})")
    return out


def _row_as_read(table: pa.Table, row: int) -> dict[str, Any]:
    """One row as field -> value; times Python cannot hold as their integer ticks."""
    one = table.slice(row, 1)
    try:
        found: dict[str, Any] = one.to_pylist()[0]
        return found
    except (OverflowError, ValueError, pa.ArrowException):
        return {name: (column.cast(pa.int64()) if pa.types.is_timestamp(column.type)
                       else column)[0].as_py()
                for name, column in zip(one.column_names, one.columns)}


def _seq_column(table: pa.Table, positions: Int64s, slow: Mask) -> Int64s:
    seq = positions.astype(np.int64, copy=True)
    if "seq" not in table.column_names:
        return seq
    column = table.column("seq").combine_chunks()
    if not pa.types.is_integer(column.type) or column.type == pa.uint64():
        slow[:] = True  # strings, floats, beyond int64: decode_record decides row by row
        return seq
    valid = to_numpy(column.is_valid())
    values = np.where(valid, to_numpy(column), 0).astype(np.int64)
    seq[valid] = values[valid]
    slow |= valid & (values < 0)
    return seq


def _attribute_column(table: pa.Table, name: str, kind: str, schema: StreamSchema,
                      slow: Mask) -> pa.Array | None:
    """The column as ARROW_TYPES[kind], marking rows it cannot vouch for in `slow`;
    None when the column is missing or of another type (every row goes the slow way)."""
    if name not in table.column_names:
        return None
    column = table.column(name).combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    t = column.type
    if kind == AttrType.STRING:
        fits = pa.types.is_string(t) or pa.types.is_large_string(t)
    elif kind == AttrType.BOOL:
        fits = pa.types.is_boolean(t)
    elif kind == AttrType.FLOAT:
        fits = pa.types.is_integer(t) or pa.types.is_floating(t)
    elif kind == AttrType.INT:
        fits = pa.types.is_integer(t)
    else:  # timestamp: integers in the schema's unit, or Arrow timestamps
        fits = pa.types.is_integer(t) or (pa.types.is_timestamp(t)
                                          and schema.time_unit in NANOS_PER_UNIT)
    if not fits:
        return None
    slow |= ~to_numpy(column.is_valid())
    if pa.types.is_timestamp(t):
        return _timestamps_in_unit(column, schema.time_unit, slow)
    if t == pa.uint64() and kind != AttrType.FLOAT:
        too_big = pc.greater(column, pa.scalar(INT64_MAX, t)).fill_null(False)
        slow |= to_numpy(too_big)
        column = pc.if_else(too_big, pa.scalar(0, t), column)
    column = column.cast(ARROW_TYPES[kind])
    if kind == AttrType.FLOAT:
        finite = pc.is_finite(column)
        slow |= ~to_numpy(finite) & ~is_null(finite)
    return column


def _timestamps_in_unit(column: pa.Array, time_unit: str, slow: Mask) -> pa.Array:
    """Arrow timestamps (UTC values) in the stream's unit, truncated to microseconds first
    as `decode_record` does with Python datetimes; rows whose value overflows 64 bits on
    the way are marked slow (decode_record gives their reason)."""
    ticks = np.where(to_numpy(column.is_valid()), to_numpy(column.cast(pa.int64())), 0)
    micros, overflow = _scaled(ticks, NANOS_PER_UNIT[column.type.unit], 1_000)
    out, more = _scaled(micros, 1_000, NANOS_PER_UNIT[time_unit])
    overflow |= more
    slow |= overflow
    valid = to_numpy(column.is_valid()) & ~overflow
    return pa.array(np.where(overflow, 0, out), type=pa.int64(), mask=~valid)


def _scaled(values: Int64s, unit_nanos: int, to_nanos: int) -> tuple[Int64s, Mask]:
    """`values` in units of `unit_nanos` ns as units of `to_nanos` ns (floor), and where
    the result does not fit in int64."""
    if unit_nanos <= to_nanos:
        return values // (to_nanos // unit_nanos), np.zeros(len(values), dtype=bool)
    factor = unit_nanos // to_nanos
    overflow = np.abs(values) > INT64_MAX // factor
    return np.where(overflow, 0, values) * factor, overflow
