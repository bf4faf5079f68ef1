"""JSON records in batches -> Arrow columns, with the dead letters `decode_record` gives.

A Kafka source delivers one JSON event per message. `decode_json_batch` turns a batch of
such messages into one Arrow table (column `seq`, then the stream's attributes) without
building an Event per record: columns are gathered and type-checked a whole column at a
time. A batch where anything needs a closer look (a missing or mistyped attribute, an ISO
time, a record carrying its own `seq`, bad JSON) falls back to `decode_record` record by
record, so reasons and accepted values are exactly those of `cep run`.
"""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cep_core.errors import EventError
from cep_core.event_io import DeadLetter, decode_record
from cep_core.schema import StreamSchema

ARROW_TYPES = {"int": pa.int64(), "timestamp": pa.int64(), "float": pa.float64(),
               "bool": pa.bool_(), "string": pa.string()}
# Python types a column may hold for the fast path to accept it as is.
_FAST_TYPES = {"int": {int}, "timestamp": {int}, "float": {int, float}, "bool": {bool},
               "string": {str}}


def arrow_schema(schema: StreamSchema) -> pa.Schema:
    return pa.schema([("seq", pa.int64())] + [(name, ARROW_TYPES[kind])
                                              for name, kind in schema.attributes.items()])


def decode_json_batch(raws: list[bytes], schema: StreamSchema, positions: np.ndarray,
                      source: str = "source") -> tuple[pa.Table, list[DeadLetter]]:
    """Records `raws` whose default seqs are `positions` -> (table of the good ones, dead
    letters). Seqs taken from records are not checked for order here."""
    records = _loads(raws)
    if records is not None:
        table = _fast_columns(records, schema, positions)
        if table is not None:
            return table, []
    return _slow(raws, schema, positions, source)


def _loads(raws: list[bytes]) -> list | None:
    try:
        return [orjson.loads(raw) for raw in raws]
    except orjson.JSONDecodeError:
        return None


def _fast_columns(records: list, schema: StreamSchema, positions: np.ndarray) -> pa.Table | None:
    if set(map(type, records)) - {dict}:
        return None
    if any("seq" in r for r in records):
        return None
    arrays = [pa.array(positions, pa.int64())]
    for name, kind in schema.attributes.items():
        values = [r.get(name) for r in records]
        if set(map(type, values)) - _FAST_TYPES[kind]:
            return None
        try:
            array = pa.array(values, ARROW_TYPES[kind])
        except (OverflowError, pa.ArrowException):
            return None
        if kind == "float" and len(values) and not np.isfinite(
                array.to_numpy(zero_copy_only=False)).all():
            return None
        if name == schema.type_attribute and schema.types is not None and len(values) \
                and not pc.all(pc.is_in(array, pa.array(list(schema.types)))).as_py():
            return None
        arrays.append(array)
    return pa.Table.from_arrays(arrays, schema=arrow_schema(schema))


def _slow(raws: list[bytes], schema: StreamSchema, positions: np.ndarray,
          source: str) -> tuple[pa.Table, list[DeadLetter]]:
    good = []
    dead: list[DeadLetter] = []
    for raw, position in zip(raws, positions.tolist()):
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            dead.append(DeadLetter(source, position, raw, f"not valid JSON: {e}"))
            continue
        try:
            good.append(decode_record(record, schema, position))
        except EventError as e:
            dead.append(DeadLetter(source, position, raw, str(e)))
    columns = {"seq": pa.array([e.seq for e in good], pa.int64())}
    for name, kind in schema.attributes.items():
        columns[name] = pa.array([e.attrs[name] for e in good], ARROW_TYPES[kind])
    return pa.Table.from_pydict(columns, schema=arrow_schema(schema)), dead


def conform_table(table: pa.Table, schema: StreamSchema) -> pa.Table:
    """A framed batch from a producer cast to the stream's column types (seq optional);
    raises EventError with the reason when a column is missing, null or of another type."""
    columns = {}
    if "seq" in table.column_names:
        columns["seq"] = table.column("seq")
    for name, kind in schema.attributes.items():
        if name not in table.column_names:
            raise EventError(f"missing attribute '{name}'")
        column = table.column(name)
        if column.null_count:
            raise EventError(f"missing attribute '{name}'")
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.int64())
        try:
            column = column.cast(ARROW_TYPES[kind])
        except pa.ArrowException:
            raise EventError(f"attribute '{name}': expected {kind}, got {column.type}") \
                from None
        if kind == "float" and len(column) and not np.isfinite(
                column.to_numpy()).all():
            raise EventError(f"attribute '{name}': not a finite number")
        columns[name] = column
    return pa.table(columns)
