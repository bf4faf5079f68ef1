"""JSON records in batches -> Arrow columns, with the dead letters `decode_record` gives.

A Kafka source delivers one JSON event per message. `decode_json_batch` turns a batch of
such messages into one Arrow table (column `seq`, then the stream's attributes) without
building an Event per record: orjson parses each record and columns are gathered and
type-checked a whole column at a time (times written as ISO-8601 text by
`cep_core.iso_times`, fields beside the schema's left aside). A batch where anything needs
a closer look (a missing or mistyped attribute, a time `iso_times` does not read, a record
carrying its own `seq`, bad JSON) falls back to `decode_record` record by record, so
reasons and accepted values are exactly those of `cep run`.

Large batches are first parsed as one block of JSON lines by `event_reader`'s pyarrow
parser, with the same checks and the same fallback as `cep run`'s reader.

`decode_messages` is the full form for a Kafka source: it takes each message's offset (and
the partition) so dead letters say where the original lies, rejects messages over a size
limit before parsing them, and says which message each good row came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cep_core import event_reader
from cep_core.arrow_numpy import ARROW_TYPES, arrow_schema
from cep_core.errors import EventError
from cep_core.event_io import DeadLetter, decode_record
from cep_core.iso_times import iso_times
from cep_core.schema import AttrType, StreamSchema

# Python types a column may hold for the fast path to accept it as is.
_FAST_TYPES: dict[str, set[type]] = {
    "int": {int}, "timestamp": {int}, "float": {int, float}, "bool": {bool}, "string": {str}}


DEFAULT_MAX_MESSAGE_BYTES = 1 << 20  # Kafka's default message.max.bytes
# Batches of this many messages or more are parsed as one block by pyarrow (the reader of
# `cep run`, cep_core.event_reader) before the orjson path: 1.5x faster at 20k messages,
# no faster below a few thousand.
COLUMNAR_FROM = 4096


@dataclass
class DecodedMessages:
    """`table`: the good records (column `seq`, then the stream's attributes); `rows`: for
    each table row, the index of its message in the batch; `dead`: the bad messages."""

    table: pa.Table
    rows: npt.NDArray[np.int64]
    dead: list[DeadLetter]


def decode_messages(raws: list[bytes], schema: StreamSchema, positions: npt.NDArray[np.int64], *,
                    offsets: npt.NDArray[np.int64] | None = None, partition: int | None = None,
                    source: str = "source",
                    max_bytes: int | None = DEFAULT_MAX_MESSAGE_BYTES) -> DecodedMessages:
    """Messages `raws` whose default seqs are `positions` and whose source offsets are
    `offsets` -> good columns and dead letters (original bytes, offset, reason).

    A message longer than `max_bytes` is not parsed; its dead letter holds its first
    `max_bytes` bytes (the whole message stays in the source at its offset)."""
    positions = np.asarray(positions, dtype=np.int64)
    if offsets is not None:
        offsets = np.asarray(offsets, dtype=np.int64)
    if len(positions) != len(raws) or (offsets is not None and len(offsets) != len(raws)):
        raise ValueError("decode_messages: raws, positions and offsets differ in length")
    oversized = max_bytes is not None and len(raws) and max(map(len, raws)) > max_bytes
    if not oversized and len(raws) >= COLUMNAR_FROM:
        table = event_reader.json_messages_table(raws, schema, positions)
        if table is not None:
            return DecodedMessages(table, np.arange(len(raws), dtype=np.int64), [])
    if not oversized:
        records = _loads(raws)
        if records is not None:
            table = _fast_columns(records, schema, positions)
            if table is not None:
                return DecodedMessages(table, np.arange(len(raws), dtype=np.int64), [])
    return _slow(raws, schema, positions, offsets, partition, source, max_bytes)


def decode_json_batch(raws: list[bytes], schema: StreamSchema, positions: npt.NDArray[np.int64],
                      source: str = "source", *, offsets: npt.NDArray[np.int64] | None = None,
                      partition: int | None = None,
                      max_bytes: int | None = DEFAULT_MAX_MESSAGE_BYTES,
                      ) -> tuple[pa.Table, list[DeadLetter]]:
    """Records `raws` whose default seqs are `positions` -> (table of the good ones, dead
    letters). Seqs taken from records are not checked for order here."""
    decoded = decode_messages(raws, schema, positions, offsets=offsets, partition=partition,
                              source=source, max_bytes=max_bytes)
    return decoded.table, decoded.dead


def _loads(raws: list[bytes]) -> list[Any] | None:
    try:
        return list(map(orjson.loads, raws))
    except orjson.JSONDecodeError:
        return None


def _fast_columns(records: list[Any], schema: StreamSchema,
                  positions: npt.NDArray[np.int64]) -> pa.Table | None:
    if set(map(type, records)) - {dict}:
        return None
    if any(map(dict.__contains__, records, repeat("seq"))):
        return None
    arrays = [pa.array(positions, pa.int64())]
    for name, kind in schema.attributes.items():
        values = list(map(dict.get, records, repeat(name)))
        types = set(map(type, values))
        if kind == AttrType.TIMESTAMP and types == {str}:  # ISO-8601 texts, as decode_record reads
            array = iso_times(pa.array(values, pa.string()), schema.time_unit)
            if array.null_count:
                return None
            arrays.append(array)
            continue
        if types - _FAST_TYPES[kind]:
            return None
        try:
            array = pa.array(values, ARROW_TYPES[kind])
        except (OverflowError, pa.ArrowException):
            return None
        if kind == AttrType.FLOAT and len(values) and not np.isfinite(
                array.to_numpy(zero_copy_only=False)).all():
            return None
        if name == schema.type_attribute and schema.types is not None and len(values) \
                and not pc.all(pc.is_in(array, pa.array(list(schema.types)))).as_py():
            return None
        arrays.append(array)
    return pa.Table.from_arrays(arrays, schema=arrow_schema(schema))


def _slow(raws: list[bytes], schema: StreamSchema, positions: npt.NDArray[np.int64],
          offsets: npt.NDArray[np.int64] | None, partition: int | None, source: str,
          max_bytes: int | None) -> DecodedMessages:
    good = []
    rows = []
    dead: list[DeadLetter] = []
    for i, (raw, position) in enumerate(zip(raws, positions.tolist())):
        reason = None
        if max_bytes is not None and len(raw) > max_bytes:
            reason = f"message of {len(raw)} bytes is over the limit of {max_bytes} bytes"
            raw = bytes(raw[:max_bytes])
        else:
            try:
                good.append(decode_record(orjson.loads(raw), schema, position))
                rows.append(i)
            except orjson.JSONDecodeError as e:
                reason = f"not valid JSON: {e}"
            except EventError as e:
                reason = str(e)
        if reason is not None:
            offset = int(offsets[i]) if offsets is not None else None
            dead.append(DeadLetter(source, position, bytes(raw), reason, offset, partition))
    columns = {"seq": pa.array([e.seq for e in good], pa.int64())}
    for name, kind in schema.attributes.items():
        columns[name] = pa.array([e.attrs[name] for e in good], ARROW_TYPES[kind])
    table = pa.Table.from_pydict(columns, schema=arrow_schema(schema))
    return DecodedMessages(table, np.array(rows, dtype=np.int64), dead)


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
            raise EventError(f"null attribute '{name}'")
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.int64())
        try:
            column = column.cast(ARROW_TYPES[kind])
        except pa.ArrowException:
            raise EventError(f"attribute '{name}': expected {kind}, got {column.type}") \
                from None
        if kind == AttrType.FLOAT and len(column) and not np.isfinite(
                column.to_numpy()).all():
            raise EventError(f"attribute '{name}': not a finite number")
        columns[name] = column
    return pa.table(columns)
