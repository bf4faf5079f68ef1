"""Reading simple events from files and writing composite events as JSON lines.

Input formats, chosen by extension or named (`fmt`; standard input, the path "-", has no
extension): JSON lines (`.jsonl`, `.ndjson`, `.json`; a `.json` file may also hold one JSON
array of objects), CSV with a header row (`.csv`) and Parquet (`.parquet`). Every record is
validated against the stream's schema:

- `seq` is the record's field `seq` when present, else its 0-based position in the file
  (bad records count as positions too, blank lines do not); seqs must strictly increase.
- `ts` is the schema's time attribute: an integer in the schema's time unit, or (for a
  `timestamp` attribute) an ISO-8601 string, converted to that unit since the epoch
  (naive times are UTC).
- Attributes are coerced by type: CSV text becomes int / float / bool (`true`/`false`);
  an integer is accepted where a float belongs; nothing else is guessed.
- Integers (ints, timestamps, seq) must fit in 64 signed bits; floats must be finite (JSON
  has no NaN or infinity, so a non-finite float is rejected, never passed on).
- With a schema listing its event `types`, a type attribute naming any other type is an
  unknown event type.
- An attribute the record lacks is a `missing attribute`; one that is there but `null`
  (JSON null, a Parquet null) a `null attribute`. CSV has no null: an empty field of a
  non-string attribute is missing.

A bad record never stops reading: it becomes a `DeadLetter` with the reason, its position
(the 0-based record index, its default seq) and, for JSON lines and CSV, its line as
editors number lines (from 1, blank lines and the CSV header counted; a CSV record spanning
lines: its first line).
"""

from __future__ import annotations

# Deferred imports: pyarrow, for Parquet input only: `cep run --engine reference` on JSON lines or
# CSV never imports it.

import base64
import contextlib
import csv
import io
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, NamedTuple

import orjson

from cep_core.errors import EventError
from cep_core.events import Event
from cep_core.schema import AttrType, NANOS_PER_UNIT, StreamSchema
from cep_core.time_guard import TimeGuard
from cep_core.time_guard import seq_not_increasing as seq_not_increasing  # also the backfill's



class EventFormat(StrEnum):
    """An events file's format; its value is the name `--format` and the APIs take."""

    JSONL = "jsonl"
    CSV = "csv"
    PARQUET = "parquet"


JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
FORMATS = {**{s: EventFormat.JSONL for s in JSON_SUFFIXES}, ".csv": EventFormat.CSV,
           ".parquet": EventFormat.PARQUET}
FORMAT_NAMES = tuple(EventFormat)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_INT_TEXT = re.compile(r"[+-]?[0-9]+")
# A record as the readers give it: (raw, record, error, line). `record` is the value as
# parsed (anything JSON, CSV or Parquet gives: `decode_record` checks it); `error` None or
# why it is unreadable; `line` its first line in the file (None where lines mean nothing).
RawRecord = tuple[bytes | str, Any, str | None, int | None]


@dataclass(frozen=True)
class DeadLetter:
    """A record that could not become an event: where it came from, as read, and why."""

    source: str  # file or topic name (or a query name for events an engine rejected)
    position: int  # 0-based record index in the source: its default seq (or the event's seq)
    raw: bytes | str
    reason: str
    offset: int | None = None  # the record's offset in its source partition (Kafka)
    partition: int | None = None  # that source partition
    line: int | None = None  # JSON lines and CSV: the record's line, 1-based as editors count

    def to_json(self) -> dict[str, Any]:
        """`source`, `line` when known, `position`, `reason`, `raw` (as text), then `offset`
        and `partition` when known, and `raw_base64` (the exact bytes) when `raw` is not
        valid UTF-8."""
        out: dict[str, Any] = {"source": self.source}
        if self.line is not None:
            out["line"] = self.line
        out.update(position=self.position, reason=self.reason)
        if isinstance(self.raw, bytes):
            out["raw"] = self.raw.decode("utf-8", "replace")
            try:
                self.raw.decode("utf-8")
            except UnicodeDecodeError:
                out["raw_base64"] = base64.b64encode(self.raw).decode("ascii")
        else:
            out["raw"] = self.raw
        if self.offset is not None:
            out["offset"] = self.offset
        if self.partition is not None:
            out["partition"] = self.partition
        return out

    def where(self) -> str:
        """`file:line` where the line is known, else the source and the record index."""
        if self.line is not None:
            return f"{self.source}:{self.line}"
        return f"{self.source}, record {self.position}"


class InputError(ValueError):
    """The input file as a whole cannot be read (missing, unknown format, bad header)."""


# ------------------------------------------------------------------ decoding one record


def decode_record(record: object, schema: StreamSchema, seq: int, text: bool = False) -> Event:
    """One record (field name -> value) as an Event, or EventError with the reason.

    `seq` is used when the record has no `seq` field. `text`: the values are strings
    (CSV) and are parsed by the attribute types."""
    if not isinstance(record, dict):
        raise EventError("not a JSON object")
    if "seq" in record and record["seq"] not in (None, ""):
        seq = _coerce_int("seq", record["seq"], text)
        if seq < 0:
            raise EventError(f"seq must not be negative, got {seq}")
    attrs: dict[str, Any] = {}
    for name, kind in schema.attributes.items():
        value = record.get(name)
        if value is None:
            raise EventError(f"null attribute '{name}'" if name in record
                             else f"missing attribute '{name}'")
        if text and value == "" and kind != AttrType.STRING:  # CSV: an empty field is missing
            raise EventError(f"missing attribute '{name}'")
        attrs[name] = _coerce(name, kind, value, text, schema.time_unit)
    if schema.type_attribute is not None and schema.types is not None:
        event_type = attrs[schema.type_attribute]
        if event_type not in schema.types:
            raise EventError(f"unknown event type '{event_type}' for stream {schema.stream} "
                             f"(one of {', '.join(schema.types)})")
    return Event(seq, attrs[schema.time], attrs)


def _coerce(name: str, kind: str, value: object, text: bool,
            time_unit: str) -> str | float | int | bool:
    if kind == AttrType.STRING:
        if not isinstance(value, str):
            raise EventError(f"attribute '{name}': expected string, got {_describe(value)}")
        return value
    if kind == AttrType.BOOL:
        if isinstance(value, bool):
            return value
        if text and isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise EventError(f"attribute '{name}': expected bool, got {_describe(value)}")
    if kind == AttrType.FLOAT:
        if text and isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise EventError(f"attribute '{name}': expected float, got "
                                 f"{_describe(value)}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise EventError(f"attribute '{name}': expected float, got {_describe(value)}")
        if not math.isfinite(value):
            raise EventError(f"attribute '{name}': not a finite number ({value})")
        return float(value)
    if kind == AttrType.TIMESTAMP:
        if isinstance(value, datetime):  # Parquet timestamp columns
            return _datetime_to_units(name, value, time_unit)
        if isinstance(value, str) and not (text and _is_int_text(value)):
            return _iso_to_units(name, value, time_unit)
    return _coerce_int(name, value, text)  # int, and timestamps given as numbers


def _coerce_int(name: str, value: object, text: bool) -> int:
    if text and isinstance(value, str) and _is_int_text(value):
        return _in_int64(name, int(value))
    if isinstance(value, float) and not math.isfinite(value):
        raise EventError(f"attribute '{name}': not a finite number ({value})")
    if isinstance(value, bool) or not isinstance(value, int):
        raise EventError(f"attribute '{name}': expected int, got {_describe(value)}")
    return _in_int64(name, value)


def _in_int64(name: str, value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise EventError(f"attribute '{name}': integer {value} does not fit in 64 bits")
    return value


def _is_int_text(value: str) -> bool:
    return _INT_TEXT.fullmatch(value.strip()) is not None


def _iso_to_units(name: str, value: str, time_unit: str) -> int:
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise EventError(f"attribute '{name}': expected an integer time or an ISO-8601 "
                         f"time, got {_describe(value)}") from None
    return _datetime_to_units(name, when, time_unit)


def _datetime_to_units(name: str, when: datetime, time_unit: str) -> int:
    if time_unit not in NANOS_PER_UNIT:
        raise EventError(f"attribute '{name}': a stream timed in {time_unit} takes integer "
                         "times, not dates")
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = when - _EPOCH  # exact integer arithmetic, no float rounding
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    per_second = NANOS_PER_UNIT["s"] // NANOS_PER_UNIT[time_unit]
    return _in_int64(name, micros * per_second // 1_000_000)


def _describe(value: object) -> str:
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"a string ({shown!r})"
    if isinstance(value, bool):
        return f"a bool ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


# ------------------------------------------------------------------ reading files


STDIN = "-"  # the path that names standard input
STDIN_SOURCE = "<stdin>"  # how dead letters and messages name it


def event_format(path: str | Path, fmt: str | None = None) -> EventFormat:
    """The format named by `fmt` ("jsonl", "csv" or "parquet") when given, else by the
    file's suffix."""
    if fmt is not None:
        try:
            return EventFormat(fmt)
        except ValueError:
            raise InputError(f"unknown event format '{fmt}' "
                             f"(use {', '.join(FORMAT_NAMES)})") from None
    if str(path) == STDIN:
        raise InputError(f"{STDIN_SOURCE}: standard input has no file suffix; name its "
                         f"format ({', '.join(FORMAT_NAMES)})")
    path = Path(path)
    found = FORMATS.get(path.suffix.lower())
    if found is None:
        raise InputError(f"{path}: unknown event file format '{path.suffix}' "
                         f"(use {', '.join(FORMATS)})")
    return found


def iter_events(path: str | Path, schema: StreamSchema, fmt: str | None = None,
                guard: TimeGuard | None = None) -> Iterator[Event | DeadLetter]:
    """Events and dead letters of a file (or of standard input: path "-"), in file order.
    `fmt` ("jsonl", "csv" or "parquet") overrides the format the suffix implies; standard
    input needs it. After the seq check, events too far ahead of the stream's time go to
    the dead letters (`guard`: the bounds and the time so far; default the schema's,
    cep_core/time_guard.py)."""
    fmt = event_format(path, fmt)
    if guard is None:
        guard = TimeGuard.of(schema)
    if str(path) == STDIN:
        source = STDIN_SOURCE
        opened: contextlib.AbstractContextManager[Any] = _stdin(fmt)
    else:
        path = Path(path)
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        source = str(path)
        opened = (path.open("rb") if fmt is EventFormat.JSONL else
                  path.open(newline="", encoding="utf-8", errors="replace")
                  if fmt is EventFormat.CSV
                  else contextlib.nullcontext(str(path)))  # pyarrow opens it itself
    with opened as f:
        records = _RECORD_READERS[fmt](f, source)
        last_seq: int | None = None
        for item in decode_records(records, schema, source, text=fmt is EventFormat.CSV):
            if isinstance(item, DecodedEvent):
                if last_seq is not None and item.seq <= last_seq:
                    yield DeadLetter(source, item.position, item.raw, seq_not_increasing(
                        item.seq, last_seq), line=item.line)
                    continue
                too_far = guard.check(item.event.ts)
                if too_far is not None:
                    yield DeadLetter(source, item.position, item.raw, too_far, line=item.line)
                    continue
                last_seq = item.seq
                yield item.event
            else:
                yield item


class DecodedEvent(NamedTuple):
    """An event as `decode_records` yields it, with where it came from (record index, line,
    the record as read) for the seq check that follows."""

    event: Event
    position: int
    raw: bytes | str
    line: int | None

    @property
    def seq(self) -> int:
        return self.event.seq


def decode_records(records: Iterable[RawRecord], schema: StreamSchema, source: str,
                   text: bool = False, first_position: int = 0
                   ) -> Iterator[DecodedEvent | DeadLetter]:
    """Records as the readers give them, (raw, record, error, line), decoded one by one:
    a DeadLetter, or the event with its position, raw and line (its seq not yet checked
    against the seqs before it). Positions count from `first_position`."""
    for position, (raw, record, error, line) in enumerate(records, first_position):
        if error is None:
            try:
                yield DecodedEvent(decode_record(record, schema, position, text), position,
                                   raw, line)
                continue
            except EventError as e:
                error = str(e)
        yield DeadLetter(source, position, raw, error, line=line)


def read_events(path: str | Path, schema: StreamSchema, fmt: str | None = None,
                guard: TimeGuard | None = None) -> tuple[list[Event], list[DeadLetter]]:
    """All events of a file (or of standard input: "-") and its dead letters."""
    events: list[Event] = []
    dead: list[DeadLetter] = []
    for item in iter_events(path, schema, fmt, guard):
        if isinstance(item, DeadLetter):
            dead.append(item)
        else:
            events.append(item)
    return events, dead


def _stdin(fmt: EventFormat) -> contextlib.AbstractContextManager[IO[bytes] | IO[str]]:
    """Standard input, opened for `fmt`'s reader; leaving the `with` keeps sys.stdin open."""
    binary = sys.stdin.buffer
    if fmt is EventFormat.CSV:
        return _Detaching(io.TextIOWrapper(binary, encoding="utf-8", errors="replace",
                                           newline=""))
    if fmt is EventFormat.PARQUET:  # Parquet is read from its end: standard input is read whole
        return io.BytesIO(binary.read())
    return contextlib.nullcontext(binary)


class _Detaching:
    """A text wrapper over standard input that detaches from it instead of closing it."""

    def __init__(self, wrapper: io.TextIOWrapper) -> None:
        self.wrapper = wrapper

    def __enter__(self) -> io.TextIOWrapper:
        return self.wrapper

    def __exit__(self, *exc: object) -> None:
        self.wrapper.detach()


# Each reader yields (raw, record, error, line): error is None or why the record is
# unreadable; line is the record's first line in the file (1-based, blank lines and a CSV
# header counted, as editors number lines), None where lines mean nothing (Parquet, the
# items of a JSON array).


def _jsonl_records(f: IO[bytes], source: str, first_line: int = 1,
                   array: bool = True) -> Iterator[RawRecord]:
    """`first_line`: the number of f's first line in the file; `array`: f is the file's
    start, where one JSON array may stand for the whole file."""
    number, first = first_line - 1, array
    for data in f:
        number += 1
        line = data.strip()
        if not line:
            continue
        if first and line.startswith(b"["):  # a .json file holding one array
            yield from _json_array(data + f.read(), source)
            return
        first = False
        try:
            yield line, orjson.loads(line), None, number
        except orjson.JSONDecodeError as e:
            yield line, None, f"not valid JSON: {e}", number


def _json_array(data: bytes, source: str) -> Iterator[RawRecord]:
    try:
        items = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise InputError(f"{source}: not valid JSON: {e}") from None
    for item in items:
        yield orjson.dumps(item), item, None, None


def _csv_records(f: IO[str], source: str = "", header: list[str] | None = None,
                 first_line: int = 1) -> Iterator[RawRecord]:
    """`header`: the (stripped) header when f is a part of the file after it, whose first
    line is the file's line `first_line`."""
    reader = csv.reader(f)
    base = first_line
    if header is None:
        header, base = next(reader, None), 1
        if header is None:
            return
        header = [h.strip() for h in header]
    while True:
        line = reader.line_num + base  # where the next record starts
        row = next(reader, None)
        if row is None:
            return
        if not row or row == [""]:
            continue
        raw = io.StringIO()
        csv.writer(raw, lineterminator="").writerow(row)
        if len(row) != len(header):
            yield raw.getvalue(), None, (f"{len(row)} fields where the header has "
                                         f"{len(header)}"), line
        else:
            yield raw.getvalue(), dict(zip(header, row)), None, line


def _parquet_records(f: str | IO[bytes], source: str) -> Iterator[RawRecord]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(f)
    except (OSError, ValueError, pa.ArrowException) as e:
        raise InputError(f"{source}: not a readable Parquet file: {e}") from None
    for batch in parquet.iter_batches():
        for record in batch.to_pylist():
            yield orjson.dumps(record, default=str), record, None, None


# The reader of each format, over what `iter_events` opens for it (binary lines, text, the
# path: pyarrow opens a Parquet file itself).
_RECORD_READERS: dict[EventFormat, Callable[[Any, str], Iterator[RawRecord]]] = {
    EventFormat.JSONL: _jsonl_records, EventFormat.CSV: _csv_records,
    EventFormat.PARQUET: _parquet_records}


# ------------------------------------------------------------------ writing JSON lines


def write_jsonl(objects: Iterable[dict[str, Any]],
                out: str | Path | IO[bytes] | None = None) -> int:
    """One orjson line per object, field order kept; `out` a path, a binary stream, or
    None / "-" for stdout. Returns the number of lines."""
    if out is None or str(out) == "-":
        return _write_lines(objects, sys.stdout.buffer)
    if isinstance(out, (str, Path)):
        with open(out, "wb") as f:
            return _write_lines(objects, f)
    return _write_lines(objects, out)


def _write_lines(objects: Iterable[dict[str, Any]], f: IO[bytes]) -> int:
    n = 0
    for obj in objects:
        f.write(orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE))
        n += 1
    f.flush()
    return n


def write_composites_jsonl(composites: Iterable[dict[str, Any]],
                           out: str | Path | IO[bytes] | None = None) -> int:
    """Composite events as JSON lines; `cep_core.composites.Composites` are written from
    their columns (the same bytes)."""
    write_columns = getattr(composites, "write_jsonl", None)
    if write_columns is not None:
        written: int = write_columns(out)
        return written
    return write_jsonl(composites, out)


def write_dead_letters_jsonl(dead_letters: Iterable[DeadLetter],
                             out: str | Path | IO[bytes] | None = None) -> int:
    return write_jsonl((d.to_json() for d in dead_letters), out)
