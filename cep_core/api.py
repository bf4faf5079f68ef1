"""The engine as a library: `cep.compile(text, schema=...)` -> QuerySet, then `run(data)`
for a finite input or `stream()` for batches as they come (docs/python.md).

Input is read into one Arrow table with the same decoding and dead letters as `cep run`
(`cep_core.event_reader`); composite events come back as a pyarrow Table
(`Composites.to_arrow()`, columns in docs/semantics.md).
"""

from __future__ import annotations

# Deferred imports: the query parser (lark) loads at the first `compile`, pyarrow, numpy and the
# event reader when data is first read, so that `import cep_core` and its names import none of them.

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from cep_core import snapshot_format
from cep_core.errors import QueryError, QueryErrors
from cep_core.event_io import DeadLetter
from cep_core.runner import EngineName, events_json, new_engines, run_checked
from cep_core.schema import ATTRIBUTE_TYPES, AttrType, SchemaError, SchemaRegistry, StreamSchema
from cep_core.schema_import import stream_schema_from_json_schema
from cep_core.time_guard import TimeGuard, wall_clock_units

if TYPE_CHECKING:
    import pyarrow as pa

    from cep_core.checked import CheckedQuery
    from cep_core.composites import Composites
    from cep_core.event_io import DeadLetter
    from cep_core.explain import Explanation
    from cep_core.stream_engines import QueryFailure

__all__ = ["QueryError", "QuerySet", "Result", "Stream", "compile", "read_events"]

_INFERRED = {"int": "int", "uint": "int", "float": "float", "double": "float",
             "halffloat": "float", "string": "string", "large_string": "string",
             "bool": "bool"}


def compile(text: str, schema: Any = None, *, time: str | None = None,  # noqa: A001
            time_unit: str = "ms", name: str = "<query>") -> QuerySet:
    """Parse and check the queries of `text` (one or more `QUERY ...;`).

    `schema` describes the stream the queries read, as any of: a `StreamSchema`; a dict in
    the schema file format (`{"stream", "attributes", "time", ...}`); a JSON Schema of one
    event (a dict with `"properties"`); a path to a JSON file holding either; a
    `pyarrow.Schema` (or anything with `.schema`, e.g. a Table) whose column types are
    mapped (timestamp columns to `timestamp`); or a plain mapping attribute -> type
    (`{"symbol": "string", "price": "int", "ts": "timestamp"}`). Left out (None): the
    built-in streams and those of `CEP_SCHEMA_PATH`. Where the description does not name
    the stream, it is the one the queries read; `time` names the event-time attribute
    where it cannot be told (default: the one timestamp attribute, or `ts`).

    Raises QueryError (`.line`, `.column`, `.source_line`, `.errors` for all of them) when
    the text does not parse or check, SchemaError for a schema that does not make sense."""
    from cep_core.checker import load_query_text
    from cep_core.parser import parse

    registry = SchemaRegistry()
    try:
        if schema is not None:
            streams = sorted({q.stream for q in parse(text, name).queries})
            registry.add(_stream_schema(schema, streams, time, time_unit))
        queries = load_query_text(text, registry, name)
    except QueryErrors as e:
        first = e.errors[0]
        first.errors = e.errors
        raise first from None
    except QueryError as e:
        if e.source is None:
            e.with_source(text)
        raise e from None
    return QuerySet(text, queries)


def _stream_schema(schema: Any, streams: list[str], time: str | None,
                   time_unit: str) -> StreamSchema:
    if isinstance(schema, StreamSchema):
        return schema
    stream = streams[0] if len(streams) == 1 else None
    if isinstance(schema, (str, Path)):
        try:
            schema = orjson.loads(Path(schema).read_bytes())
        except orjson.JSONDecodeError as e:
            raise SchemaError(f"{schema}: not valid JSON: {e}") from None
    if hasattr(schema, "schema") and not isinstance(schema, Mapping):
        schema = schema.schema  # a Table, a RecordBatch, a Parquet file
    if isinstance(schema, Mapping):
        if "attributes" in schema:
            return StreamSchema.from_dict({"stream": stream, **schema})
        if "properties" in schema:
            return stream_schema_from_json_schema(dict(schema), schema.get("title", stream),
                                                  time, time_unit)
        return _from_attributes(stream, dict(schema), time, time_unit)
    import pyarrow as pa

    if isinstance(schema, pa.Schema):
        attributes: dict[str, str] = {}
        for f in schema:
            if f.name == "seq":
                continue
            t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
            kind = "timestamp" if pa.types.is_timestamp(t) else _INFERRED.get(
                str(t).rstrip("0123456789"))
            if kind is None:
                raise SchemaError(f"column {f.name!r}: no stream attribute type for Arrow "
                                  f"type {f.type} (one of {', '.join(ATTRIBUTE_TYPES)})")
            attributes[f.name] = kind
        return _from_attributes(stream, attributes, time, time_unit)
    raise SchemaError(f"cannot make a stream schema of {type(schema).__name__}")


def _from_attributes(stream: str | None, attributes: dict[str, str], time: str | None,
                     time_unit: str) -> StreamSchema:
    if stream is None:
        raise SchemaError("the queries read several streams: give a StreamSchema or a "
                          "schema dict naming its stream")
    if time is None:
        stamps = [a for a, kind in attributes.items() if kind == AttrType.TIMESTAMP]
        time = stamps[0] if len(stamps) == 1 else "ts" if "ts" in attributes else None
        if time is None:
            raise SchemaError(f"stream {stream}: which attribute is the event time? "
                              "Pass time=NAME")
    return StreamSchema(stream, attributes, time, time_unit)


def read_events(data: Any, schema: StreamSchema, fmt: str | None = None,
                first_position: int = 0, *, prev_max: int = -1,
                guard: TimeGuard | None = None) -> tuple[pa.Table, list[DeadLetter]]:
    """Events of any input the API takes, as one table (`seq`, then the attributes) and
    the dead letters, decoded as `cep run` decodes them: a path (JSON lines, CSV,
    Parquet; `fmt` names the format where the suffix does not), a pyarrow Table or
    RecordBatch, a pandas DataFrame, anything with `to_arrow()` (polars) or the Arrow
    stream interface, or an iterable of dicts. Records are numbered from
    `first_position`; seqs must be above `prev_max`; events too far ahead of the stream's
    time go to the dead letters (`guard`: the bounds and the time so far; default the
    schema's, cep_core/time_guard.py)."""
    import pyarrow as pa

    from cep_core import event_reader

    if isinstance(data, (str, Path)):
        return event_reader.read_table(data, schema, fmt, first_position=first_position,
                                       prev_max=prev_max, guard=guard)
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    elif type(data).__module__.startswith("pandas"):
        data = _whole_floats_as_ints(pa.Table.from_pandas(data, preserve_index=False), schema)
    elif hasattr(data, "to_arrow"):
        data = data.to_arrow()
    elif hasattr(data, "__arrow_c_stream__") and not isinstance(data, pa.Table):
        data = pa.table(data)
    if isinstance(data, pa.Table):
        return event_reader.read_arrow(data, schema, "<table>", first_position, prev_max,
                                       guard)
    if isinstance(data, Mapping):
        raise TypeError("one event: pass a list of dicts")
    return event_reader.read_records(data, schema, "<records>", first_position, prev_max,
                                     guard)


def _whole_floats_as_ints(table: pa.Table, schema: StreamSchema) -> pa.Table:
    """pandas holds an integer column with a missing value as floats (NaN): such a column
    of an int or timestamp attribute is read as integers when every value is whole."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name, kind in schema.attributes.items():
        if kind not in (AttrType.INT, AttrType.TIMESTAMP) or name not in table.column_names:
            continue
        column = table.column(name)
        if not pa.types.is_floating(column.type):
            continue
        whole = pc.all(pc.equal(column, pc.floor(column))).as_py()
        biggest = pc.max(pc.abs(column)).as_py()
        if whole is not False and (biggest is None or biggest < 2.0**53):
            table = table.set_column(table.column_names.index(name), name,
                                     column.cast(pa.int64()))
    return table



class QueryFailedError(RuntimeError):
    """`run` could not answer for every query: `failures` says which and why
    (`cep_core.stream_engines.QueryFailure`)."""

    def __init__(self, message: str, failures: list[QueryFailure]):
        super().__init__(message)
        self.failures = failures


@dataclass
class Result:
    """What `QuerySet.run` gives: the composite events in output order and the dead
    letters (records that could not be read, events an engine rejected)."""

    composites: Composites
    dead_letters: list[DeadLetter]
    events: int  # how many events were read
    timings: dict[str, float] = field(default_factory=dict)

    @cached_property
    def table(self) -> pa.Table:
        """The composite events as one Arrow table (columns in docs/semantics.md)."""
        return self.composites.to_arrow()

    def to_dicts(self) -> list[dict[str, Any]]:
        """The composite events as dicts, as `cep run` writes them in JSON lines."""
        return self.composites.to_dicts()

    def to_pandas(self) -> Any:  # a pandas.DataFrame (pandas: not a dependency)
        return self.table.to_pandas()

    def dead_letters_table(self) -> pa.Table:
        """The dead letters as a table (source, line, position, reason, raw, ...)."""
        return _dead_letters_table(self.dead_letters)

    def __len__(self) -> int:
        return len(self.composites)


def _dead_letters_table(letters: list[DeadLetter]) -> pa.Table:
    import pyarrow as pa

    names = ["source", "line", "position", "reason", "raw"]
    types = [pa.string(), pa.int64(), pa.int64(), pa.string(), pa.string()]
    rows = [letter.to_json() for letter in letters]
    return pa.table({n: pa.array([r.get(n) for r in rows], t) for n, t in zip(names, types)})


class QuerySet:
    """Checked queries over one stream, ready to run (`cep.compile` makes them)."""

    def __init__(self, text: str, queries: list[CheckedQuery]):
        self.text = text
        self.queries = queries

    @property
    def names(self) -> list[str]:
        return [q.name for q in self.queries]

    @property
    def schema(self) -> StreamSchema:
        """The schema of the stream the queries read."""
        streams = {q.schema.stream for q in self.queries}
        if not streams:
            raise ValueError("no queries")
        if len(streams) != 1:
            raise ValueError(f"the queries read several streams ({', '.join(sorted(streams))})"
                             "; compile each stream's queries apart")
        return self.queries[0].schema

    def __repr__(self) -> str:
        return f"QuerySet({', '.join(self.names)} over {self.schema.stream})"

    def explain(self) -> list[Explanation]:
        """What each query compiled to (`cep_core.explain.Explanation`: `.text()`,
        `.dot()`, `.svg()`), as `cep explain` shows it."""
        from cep_core.explain import explain

        return [explain(q) for q in self.queries]

    def run(self, data: Any, *, engine: str = EngineName.JIT, placement: str | None = None,
            fmt: str | None = None, max_ahead: int | str | None = None,
            max_ahead_of_clock: int | str | None = None) -> Result:
        """Every composite event of the queries over `data` (see `read_events` for what
        it may be), with `engine` "jit" (numba kernels) or "reference" (the interpreter,
        the oracle) and, for jit, `placement` "cpu", "gpu" or "auto" (docs/gpu.md).
        `max_ahead` / `max_ahead_of_clock` (an int in the stream's time unit, a duration
        such as "1 day", or "none") replace the schema's bounds on events too far ahead
        (docs/semantics.md). A query whose engine fails (a MATCH_RECOGNIZE query whose
        AFTER MATCH SKIP TO finds no row to go to, as Flink stops it) raises
        QueryFailedError, naming it and why."""
        schema = self.schema
        table, dead = read_events(data, schema, fmt, guard=TimeGuard.of(
            schema, max_ahead, max_ahead_of_clock))
        timings: dict[str, float] = {}
        failures: list[QueryFailure] = []
        composites, rejected = run_checked(self.queries, table, engine, placement, timings,
                                           failures=failures)
        if failures:  # the others' answers are whole, but a caller asked for all of them
            raise QueryFailedError("; ".join(str(f) for f in failures), failures)
        return Result(composites, dead + rejected, table.num_rows, timings)

    def stream(self, *, placement: str | None = None, max_ahead: int | str | None = None,
               max_ahead_of_clock: int | str | None = None) -> Stream:
        """A stateful runner of the jitted engines: `push(batch)` each batch as it comes,
        `flush()` at the end of input (`max_ahead`, `max_ahead_of_clock`: as `run`)."""
        return Stream(self, placement, max_ahead=max_ahead,
                      max_ahead_of_clock=max_ahead_of_clock)


_HEADER = struct.Struct("<qq")  # a Stream snapshot: events read, last seq; then engines'


class Stream:
    """The queries running over a stream given batch by batch: `push` returns the
    composite events each batch completes; `advance_time(ts)` those released by event time
    reaching ts (a punctuation); `flush()` those pending at the end of input.
    The pushes and the flush together give what one `QuerySet.run` over all the batches
    gives (events too far ahead of the stream's time included: the time goes on across
    pushes, and `advance_time` moves it too). `snapshot()`/`restore()` save and put back
    the whole state (engines, string dictionary, where seqs are) but the stream's time for
    that bound, which a restored Stream takes from its next event."""

    def __init__(self, queries: QuerySet, placement: str | None = None, *,
                 max_ahead: int | str | None = None,
                 max_ahead_of_clock: int | str | None = None):
        self.queries = queries
        self.schema = queries.schema
        self._guard = TimeGuard.of(self.schema, max_ahead, max_ahead_of_clock)
        self._engines, self._encoder = new_engines(queries.queries, placement)
        self._position = 0  # records read so far: the default seq of the next
        self._last_seq = -1
        self.dead_letters: list[DeadLetter] = []

    def push(self, data: Any, fmt: str | None = None) -> pa.Table:
        """Run one batch (anything `QuerySet.run` takes); the new composite events in
        output order. Bad records and rejected events go to `dead_letters`."""
        return self._push(data, fmt).to_arrow()

    def advance_time(self, ts: int) -> pa.Table:
        """A punctuation: event time has reached `ts` (in the stream's time unit) with no
        event; the composite events that releases (windows that end before it, SEQ
        matches waiting on their WITHIN, timed-out partial matches)."""
        return self._advance_time(ts).to_arrow()

    def flush(self) -> pa.Table:
        """The end of input: what is still pending (open windows, ...)."""
        return self._flush().to_arrow()

    def _push(self, data: Any, fmt: str | None = None) -> Composites:
        if self._guard.ahead_of_clock is not None:  # the wall clock of this push
            self._guard.now = wall_clock_units(self.schema.time_unit)
        table, dead, self._position, self._last_seq = read_batch(
            data, self.schema, fmt, self._position, self._last_seq, self._guard)
        self.dead_letters.extend(dead)
        found = []
        for start in range(0, table.num_rows, 65536):
            found.extend(self._engines.process_columns(
                self._encoder.from_arrow(table.slice(start, 65536))))
        self._take_rejected(table)
        return self._engines.composites(found)

    def _advance_time(self, ts: int) -> Composites:
        self._guard.advance(int(ts))
        out = self._engines.composites(self._engines.punctuate_columns(int(ts)))
        self._take_rejected(None)
        return out

    def _flush(self) -> Composites:
        out = self._engines.composites(self._engines.flush_columns())
        self._take_rejected(None)
        return out

    def _take_rejected(self, table: pa.Table | None) -> None:
        rejected = self._engines.take_dead_letters()
        if not rejected:
            return
        raws = events_json(table, [seq for _, seq, _ in rejected]) if table is not None \
            else [b""] * len(rejected)
        self.dead_letters.extend(DeadLetter(f"query {q.name}", seq, raw, reason)
                                 for (q, seq, reason), raw in zip(rejected, raws))

    def take_dead_letters(self) -> list[DeadLetter]:
        """`dead_letters` so far, then forgotten (for a long-running stream)."""
        taken, self.dead_letters = self.dead_letters, []
        return taken

    def snapshot(self) -> bytes:
        """The whole state as bytes (for `restore` on a Stream of the same queries)."""
        return snapshot_format.pack("stream", _HEADER.pack(self._position, self._last_seq)
                                    + self._engines.snapshot(), stream=self.schema.stream)

    def restore(self, data: bytes) -> None:
        """Put back a `snapshot()`; this Stream must be fresh (nothing pushed yet). Bytes
        changed since the snapshot was taken (its checksum) or a snapshot of another
        stream raise `cep_core.snapshot_format.SnapshotError`, before anything changes."""
        payload = snapshot_format.unpack("stream", data, stream=self.schema.stream)
        self._position, self._last_seq = _HEADER.unpack_from(payload)
        self._engines.restore(payload[_HEADER.size:])


def read_batch(data: Any, schema: StreamSchema, fmt: str | None = None, position: int = 0,
               last_seq: int = -1, guard: TimeGuard | None = None
               ) -> tuple[pa.Table, list[DeadLetter], int, int]:
    """One batch of a stream given batch by batch (`Stream.push`): its events as
    `read_events` reads them, its first record at `position`, its seqs checked against
    `last_seq` (the largest of the batches before) and its times against `guard` (the
    stream's bounds and its time so far, which moves on; None: a fresh one of the
    schema's). (table, dead letters in position order, the next batch's position, the
    largest seq accepted)."""
    table, dead = read_events(data, schema, fmt, position, prev_max=last_seq, guard=guard)
    end = position + table.num_rows + len(dead)  # every record counts as a position
    seq = table.column("seq")
    return table, dead, end, seq[-1].as_py() if len(seq) else last_seq

