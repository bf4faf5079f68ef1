"""Reading a file of events into one Arrow table, a block of records at a time.

`read_table(path, schema)` gives what `event_io.read_events` gives (the same accepted
values, the same dead letters: reason, line, position, raw) as one table with
`arrow_numpy.arrow_schema(schema)` (`seq`, then the stream's attributes) and no Python
object per event:

- JSON lines are cut into blocks of whole lines and parsed by `pyarrow.json` with the
  stream's column types (`_JsonParser`). A block the fast parser cannot vouch for as a
  whole (a parse error, a line that is not one object, text orjson would refuse: NaN,
  numbers beyond a double, invalid UTF-8, a BOM, deep nesting) is read again record by
  record by `event_io`'s reader, so every reason is the one `cep run` always gave; rows
  the vectorised checks doubt (nulls, non-finite floats, negative seqs, unknown types)
  are decoded one by one the same way.
- CSV blocks are parsed by `pyarrow.csv` straight into the stream's types where every
  text of the block is one pyarrow and `decode_record` read alike (`_parse_csv_typed`);
  other blocks are parsed as text and coerced column by column where the text is in a
  form whose value cannot differ from `decode_record`'s (plain integers, plain decimals,
  `true`/`false`); other rows go through `decode_record`.
- Parquet row groups are decoded by `event_columns.decode_table`.

Seqs are checked for order, vectorised, when rows are drained (at the end of the file for
`read_table`, after every block for `iter_tables`, which reads a file a block at a time): a
row is accepted when its seq is above every seq accepted before it, and then when its time
is not too far ahead of the stream's (cep_core/time_guard.py: the same rule as the record
reader's).
"""

from __future__ import annotations

# Deferred imports: pyarrow's json, csv and parquet readers, and the Parquet decoder
# (event_columns), load with the first file of their format: a JSON lines run imports neither the
# CSV nor the Parquet reader.

import contextlib
import csv
import io
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cep_core.arrow_numpy import (
    ARROW_TYPES,
    arrow_schema,
    empty_table,
    from_numpy,
    is_null,
    strings,
    to_numpy,
)
from cep_core.batch import NUMPY_TYPES
from cep_core.errors import EventError
from cep_core.event_io import (
    STDIN,
    STDIN_SOURCE,
    DeadLetter,
    DecodedEvent,
    EventFormat,
    InputError,
    _csv_records,
    _jsonl_records,
    decode_record,
    decode_records,
    event_format,
)
from cep_core.events import Event
from cep_core.iso_times import iso_times
from cep_core.schema import AttrType, StreamSchema
from cep_core.time_guard import TimeGuard

if TYPE_CHECKING:
    import pyarrow.json as pa_json

    from cep_core.event_io import RawRecord

Int64s = npt.NDArray[np.int64]
# Each row's line in the file, 1-based (None: lines mean nothing for the rows).
Lines = list[int | None] | Int64s

BLOCK_BYTES = 4 << 20
_WHITESPACE = np.zeros(256, dtype=bool)  # what bytes.strip() strips
_WHITESPACE[list(b" \t\n\r\x0b\x0c")] = True
_MAX_OPENINGS = 1000  # orjson refuses nesting deeper than 1024; pyarrow takes any depth
# Lines: a refused block this small is read record by record (a parse costs ~150 us of
# pyarrow's set-up, what ~40 records cost orjson and decode_record); the size under which
# two refused halves mean bad records are dense.
_SMALLEST_HALF = 256
_DENSE_BELOW = 16384


def read_table(path: str | Path, schema: StreamSchema, fmt: str | None = None, *,
               block_bytes: int = BLOCK_BYTES, first_position: int = 0, prev_max: int = -1,
               guard: TimeGuard | None = None) -> tuple[pa.Table, list[DeadLetter]]:
    """The good events of a file (or of standard input, "-") as one table, and the dead
    letters, exactly as `event_io.read_events` reads them. `first_position`, `prev_max`
    and `guard` (the bound on events too far ahead and the stream's time so far; default:
    the schema's, from no time) continue a stream, as `iter_tables` says."""
    parts = list(read_blocks(path, schema, fmt, block_bytes=block_bytes,
                             first_position=first_position, prev_max=prev_max, guard=guard))
    return (pa.concat_tables([table for table, _ in parts]),
            sorted((letter for _, letters in parts for letter in letters), key=_position))


def read_blocks(path: str | Path, schema: StreamSchema, fmt: str | None = None, *,
                block_bytes: int = BLOCK_BYTES, first_position: int = 0, prev_max: int = -1,
                guard: TimeGuard | None = None) -> Iterator[tuple[pa.Table, list[DeadLetter]]]:
    """`read_table` a block at a time (`iter_tables` over the file or standard input):
    for a reader that hands each block on as it is read (`cep run` runs the engines on
    one while the next is read). An unreadable input raises at the first item."""
    fmt = event_format(path, fmt)
    if str(path) == STDIN:
        source = STDIN_SOURCE
        opened: contextlib.AbstractContextManager[IO[bytes]] = contextlib.nullcontext(
            io.BytesIO(sys.stdin.buffer.read()) if fmt is EventFormat.PARQUET else sys.stdin.buffer)
    else:
        path = Path(path)
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        source, opened = str(path), path.open("rb")
    with opened as f:  # block by block: what a block's dead letters need of it goes with it
        yield from iter_tables(f, schema, fmt, source, first_position=first_position,
                               prev_max=prev_max, block_bytes=block_bytes, guard=guard)


def iter_tables(f: IO[bytes], schema: StreamSchema, fmt: EventFormat, source: str, *,
                first_position: int = 0, prev_max: int = -1,
                block_bytes: int = BLOCK_BYTES,
                guard: TimeGuard | None = None) -> Iterator[tuple[pa.Table, list[DeadLetter]]]:
    """`read_table` a block at a time, for readers that keep no more than a block: the
    good events of each block and its dead letters, in file order. `first_position`: the
    position of the file's first record (a file that continues a stream); `prev_max`: the
    largest seq accepted before it; `guard`: the bound on events too far ahead with the
    stream's time before it (it moves on as rows are accepted; default: the schema's
    bound, from no time). The last item's table is empty; its dead letters may not be.
    Together the items are what `read_table` gives (positions and seqs shifted by
    `first_position`, seqs checked against `prev_max` too)."""
    rows = _Rows(schema, source, first_position, prev_max, guard)
    for _ in _READERS[fmt](f, rows, block_bytes):
        yield rows.drain()
    yield rows.drain()


def events_from_table(table: pa.Table, schema: StreamSchema) -> list[Event]:
    """Events of a table read by `read_table` (for the reference interpreter)."""
    names = list(schema.attributes)
    columns = [table.column(name).to_pylist() for name in names]
    times = table.column(schema.time).to_pylist()
    return [Event(seq, ts, dict(zip(names, values))) for seq, ts, *values in
            zip(table.column("seq").to_pylist(), times, *columns)]


def row_json(table: pa.Table, row: int) -> bytes:
    """One row of such a table as the JSON of its event (`seq`, then the attributes)."""
    return orjson.dumps(table.slice(row, 1).to_pylist()[0])


# ------------------------------------------------------------------ the rows read so far


@dataclass
class _Piece:
    table: pa.Table  # good rows: seq, then the attributes
    positions: Int64s  # each row's record index in the file
    lines: Lines | None  # each row's line (None: lines mean nothing)
    raw: Callable[[int], bytes | str]  # row -> the record as read


class _Rows:
    """Good rows in file order, piece by piece, and dead letters; `finish` checks seqs."""

    def __init__(self, schema: StreamSchema, source: str, first_position: int = 0,
                 prev_max: int = -1, guard: TimeGuard | None = None) -> None:
        self.schema = schema
        self.source = source
        self.arrow_schema = arrow_schema(schema)
        self.pieces: list[_Piece] = []
        self.dead: list[DeadLetter] = []
        self.first_position = first_position  # the readers number records from here
        self.prev_max = prev_max  # the largest seq accepted so far
        self._guard = guard  # the bound on events too far ahead (made when first needed)

    @property
    def guard(self) -> TimeGuard:
        if self._guard is None:
            self._guard = TimeGuard.of(self.schema)
        return self._guard

    def add(self, table: pa.Table, positions: Int64s, lines: Lines | None,
            raw: Callable[[int], bytes | str]) -> None:
        if table.num_rows:
            self.pieces.append(_Piece(table, positions, lines, raw))

    def add_records(self, records: Iterable[RawRecord], first_position: int,
                    text: bool = False) -> int:
        """Records as `event_io`'s readers give them, decoded one by one; returns how many."""
        good: list[DecodedEvent] = []
        count = 0
        for item in decode_records(records, self.schema, self.source, text, first_position):
            count += 1
            if isinstance(item, DeadLetter):
                self.dead.append(item)
            else:
                good.append(item)
        self.add_decoded(good)
        return count

    def add_decoded(self, good: list[DecodedEvent]) -> None:
        columns = [from_numpy(np.array([d.event.seq for d in good], dtype=np.int64))]
        for name, kind in self.schema.attributes.items():
            values = [d.event.attrs[name] for d in good]
            columns.append(strings(values) if kind == AttrType.STRING else
                           from_numpy(np.array(values, dtype=NUMPY_TYPES[kind])))
        raws = [d.raw for d in good]
        self.add(pa.Table.from_arrays(columns, schema=self.arrow_schema),
                 np.array([d.position for d in good], dtype=np.int64),
                 [d.line for d in good], raws.__getitem__)

    def finish(self) -> tuple[pa.Table, list[DeadLetter]]:
        return self.drain()

    def drain(self) -> tuple[pa.Table, list[DeadLetter]]:
        """The rows and dead letters gathered since the last drain, the rows whose seq is
        not above every seq accepted before them (`prev_max` included), then those too far
        ahead of the stream's time (`guard`), moved to the dead letters."""
        pieces, dead = self.pieces, self.dead
        self.pieces, self.dead = [], []
        if not pieces:
            return empty_table(self.arrow_schema), sorted(dead, key=_position)
        table = pa.concat_tables([p.table for p in pieces])
        keep, refused, self.prev_max = self.guard.accept(
            to_numpy(table.column(self.schema.time)), to_numpy(table.column("seq")),
            self.prev_max)
        if refused:
            starts = np.cumsum([0] + [p.table.num_rows for p in pieces])
            for row, reason in refused.items():
                k = int(np.searchsorted(starts, row, side="right")) - 1
                piece, i = pieces[k], row - int(starts[k])
                line = None if piece.lines is None else piece.lines[i]
                dead.append(DeadLetter(self.source, int(piece.positions[i]), piece.raw(i),
                                       reason, line=None if line is None else int(line)))
            table = table.filter(from_numpy(keep))
        return table, sorted(dead, key=_position)


def _position(letter: DeadLetter) -> int:
    return letter.position


# ------------------------------------------------------------------ blocks of lines


def _blocks(f: IO[bytes], size: int) -> Iterator[bytes]:
    """Blocks of about `size` bytes, each ending at the end of a line."""
    while True:
        block = f.read(size)
        if not block:
            return
        if not block.endswith(b"\n"):
            block += f.readline()
        yield block


@dataclass
class _Lines:
    """The lines of a block that are not blank: their (start, end) in the block, their
    index among all lines of the block, and their first byte that is not whitespace."""

    starts: npt.NDArray[np.intp]
    ends: npt.NDArray[np.intp]
    index: npt.NDArray[np.intp]
    opening: npt.NDArray[np.uint8]
    newlines: int  # in the block

    @classmethod
    def of(cls, block: bytes, blank: Callable[[bytes], bool]) -> _Lines:
        data = np.frombuffer(block, dtype=np.uint8)
        newlines = np.flatnonzero(data == 10)
        starts = np.concatenate(([0], newlines + 1))
        ends = np.concatenate((newlines, [len(block)]))
        filled = starts < ends
        keep = filled.copy()
        opening = np.zeros(len(starts), dtype=np.uint8)
        opening[filled] = data[starts[filled]]
        for i in np.flatnonzero(filled & _WHITESPACE[opening]).tolist():  # rare: the line
            line = block[starts[i]:ends[i]]
            keep[i] = not blank(line)
            opening[i] = line.lstrip()[0] if line.strip() else 32
        index = np.flatnonzero(keep)
        return cls(starts[index], ends[index], index, opening[index], len(newlines))

    def __len__(self) -> int:
        return len(self.index)

    def raw(self, block: bytes, i: int) -> bytes:
        """Line i as `event_io` keeps a JSON record: stripped."""
        return block[self.starts[i]:self.ends[i]].strip()


# ------------------------------------------------------------------ JSON lines


def _read_jsonl(f: IO[bytes], rows: _Rows, block_bytes: int) -> Iterator[None]:
    parser = _JsonParser(rows.schema)
    line, position, first = 1, rows.first_position, True
    for block in _blocks(f, block_bytes):
        if first:
            start = block.lstrip()
            if start.startswith(b"["):  # a .json file holding one array: read it whole
                rows.add_records(_jsonl_records(io.BytesIO(block + f.read()), rows.source,
                                                line), position)
                return
            first = not start
        position += _jsonl_block(block, line, position, rows, parser)
        line += block.count(b"\n")
        yield


class _JsonParser:
    """pyarrow.json with the stream's columns, trusted only where it agrees with orjson.

    Records holding only the stream's fields are parsed strictly (another field is an
    error): a NaN or Infinity, which pyarrow takes and orjson refuses, can then only land
    in a float column, where the finite check sends its row to orjson. Once a block has
    other fields, they are ignored, and a block must first be free of NaN and Infinity
    literals and of nesting deeper than orjson takes.

    Timestamp attributes are read as numbers or, once a block holds them as text, as text
    (`iso`: the kind the last block had), converted by `iso_times` with the record
    decoder's rules; a text it does not take is a null there, so its row goes to orjson."""

    def __init__(self, schema: StreamSchema):
        import pyarrow.json as pj

        self.read_json = pj.read_json
        columns = _json_schema(schema)
        self.times = [n for n, kind in schema.attributes.items() if kind == AttrType.TIMESTAMP]
        self.time_unit = schema.time_unit
        texts = pa.schema([pa.field(f.name, pa.string()) if f.name in self.times else f
                           for f in columns])
        self.options = {iso: tuple(pj.ParseOptions(explicit_schema=cols,
                                                   unexpected_field_behavior=behaviour)
                                   for behaviour in ("error", "infer", "ignore"))
                        for iso, cols in ((False, columns), (True, texts))}
        self.names = columns.names
        self.fields = set(columns.names)
        self.iso = False
        self.other_fields = False
        self.guessed = False
        self.dense = False  # the last refused block had bad records everywhere
        self.threads = pj.ReadOptions(use_threads=True)
        self.one_thread = pj.ReadOptions(use_threads=False)  # less set-up for small blocks

    def parse(self, block: bytes, lines: _Lines) -> pa.Table | None:
        """The block, one row per line, or None where it needs orjson."""
        if not len(lines) or not (lines.opening == ord("{")).all():
            return None  # not objects (and pyarrow 26 crashes on a line `null`)
        if not block.isascii():
            if b"\xef\xbb\xbf" in block:  # pyarrow skips a BOM
                return None
            try:
                block.decode("utf-8")
            except UnicodeDecodeError:
                return None
        if not self.guessed:
            self._guess(block, lines)
        table, why = self._parsed(block, lines, self.iso)
        if table is None and why in self.times:  # times of the other kind (text, numbers)
            table, _ = self._parsed(block, lines, not self.iso)
            if table is not None:
                self.iso = not self.iso
        if table is None or table.num_rows != len(lines):
            return None
        if not self.iso:
            return table
        for name in self.times:
            table = table.set_column(table.schema.get_field_index(name), name,
                                     iso_times(table.column(name), self.time_unit))
        return table

    def _guess(self, block: bytes, lines: _Lines) -> None:
        """`iso` and `other_fields` as the first record has them, so that the first parse
        is the right one (a wrong guess costs a parse, as no guess would)."""
        self.guessed = True
        try:
            first = orjson.loads(block[lines.starts[0]:lines.ends[0]])
        except orjson.JSONDecodeError:
            return
        if isinstance(first, dict):
            self.iso = any(isinstance(first.get(name), str) for name in self.times)
            self.other_fields = not first.keys() <= self.fields

    def _parsed(self, block: bytes, lines: _Lines, iso: bool) -> tuple[pa.Table | None, str]:
        """The block with the stream's columns: strictly, or where it has other fields,
        with those read too (`infer`) and trusted where orjson would read them (every float
        in them finite: a NaN, an Infinity or a number beyond a double is not) and nesting
        cannot be too deep; where pyarrow cannot give them one type, ignored, once the
        bytes show nothing orjson refuses (`_orjson_takes_what_is_ignored`)."""
        strict, infer, ignore = self.options[iso]
        table, why = (None, _OTHER_FIELDS) if self.other_fields else self._read(block, strict)
        if table is not None or why != _OTHER_FIELDS:
            return table, why
        table, why = self._read(block, infer)
        if table is not None:
            self.other_fields = True
            others = [table.column(name) for name in table.column_names
                      if name not in self.fields]
            if not (_all_finite(others) and _shallow(block, lines)):
                return None, ""
            return table.select(self.names), ""
        if why in self.fields or not _orjson_takes_what_is_ignored(block, lines):
            return None, why
        table, why = self._read(block, ignore)
        self.other_fields = table is not None
        return table, why

    def _read(self, block: bytes, options: pa_json.ParseOptions) -> tuple[pa.Table | None, str]:
        """The table, or None and why: _OTHER_FIELDS (a field beyond the stream's), the
        column whose values pyarrow could not take, or ''."""
        threads = self.threads if len(block) > 1 << 20 else self.one_thread
        try:
            return self.read_json(pa.py_buffer(block), parse_options=options,
                                  read_options=threads), ""
        except (pa.ArrowException, ValueError, OverflowError) as e:
            text = str(e)
            if "unexpected field" in text:
                return None, _OTHER_FIELDS
            column = _COLUMN_IN_ERROR.search(text)
            return None, column.group(1) if column else ""


_OTHER_FIELDS = "\0other fields"
_COLUMN_IN_ERROR = re.compile(r"Column\(/([^)]*)\)")
def json_messages_table(raws: list[bytes], schema: StreamSchema,
                        positions: Int64s) -> pa.Table | None:
    """Messages of one JSON object each (a Kafka batch) as a table, parsed as one block of
    lines by pyarrow, or None where any message needs orjson and `decode_record` (a
    newline or blank in a message, anything the block and row checks doubt)."""
    block = b"\n".join(raws) + b"\n"
    if block.count(b"\n") != len(raws):
        return None
    lines = _Lines.of(block, _blank)
    if len(lines) != len(raws):
        return None
    table = _JsonParser(schema).parse(block, lines)
    if table is None or len(_doubtful_rows(table, schema)):
        return None
    return _with_seq(table, np.asarray(positions, dtype=np.int64), arrow_schema(schema))


def _json_schema(schema: StreamSchema) -> pa.Schema:
    return pa.schema([("seq", pa.int64())] + [(name, ARROW_TYPES[kind])
                                              for name, kind in schema.attributes.items()])


def _jsonl_block(block: bytes, first_line: int, first_position: int, rows: _Rows,
                 parser: _JsonParser) -> int:
    """One block of JSON lines into `rows`; returns how many records it held."""
    lines = _Lines.of(block, _blank)
    table = parser.parse(block, lines)
    if table is None and parser.dense:  # as the block before: not worth halving
        return rows.add_records(_jsonl_records(io.BytesIO(block), rows.source, first_line,
                                               array=False), first_position)
    if table is None:
        return _refused_block(block, lines, first_line, first_position, rows, parser)
    parser.dense = False
    return _parsed_block(block, lines, table, first_line, first_position, rows)


def _blank(line: bytes) -> bool:
    return not line.strip()


def _refused_block(block: bytes, lines: _Lines, first_line: int, first_position: int,
                   rows: _Rows, parser: _JsonParser) -> int:
    """A block the parser refused, halved at a line and each half parsed again, so that a
    bad record costs its neighbourhood, not its block. A half refused again is halved in
    turn; record by record when it is small, or when both halves were refused while their
    block was under _DENSE_BELOW lines (bad records everywhere: halving would not pay)."""
    if len(lines) <= _SMALLEST_HALF:
        return rows.add_records(_jsonl_records(io.BytesIO(block), rows.source, first_line,
                                               array=False), first_position)
    cut = int(lines.starts[len(lines) // 2])
    halves = []
    line, position = first_line, first_position
    for part in (block[:cut], block[cut:]):
        part_lines = _Lines.of(part, _blank)
        halves.append((part, part_lines, parser.parse(part, part_lines), line, position))
        line, position = line + part.count(b"\n"), position + len(part_lines)
    dense = len(lines) < _DENSE_BELOW and all(half[2] is None for half in halves)
    parser.dense = parser.dense or dense
    for part, part_lines, table, line, position in halves:
        if table is not None:
            _parsed_block(part, part_lines, table, line, position, rows)
        elif dense:
            rows.add_records(_jsonl_records(io.BytesIO(part), rows.source, line, array=False),
                             position)
        else:
            _refused_block(part, part_lines, line, position, rows, parser)
    return len(lines)


def _parsed_block(block: bytes, lines: _Lines, table: pa.Table, first_line: int,
                  first_position: int, rows: _Rows) -> int:
    """A block pyarrow parsed: its rows, the doubtful ones decoded by orjson and
    `decode_record`."""
    positions = np.arange(first_position, first_position + len(lines), dtype=np.int64)
    line_numbers = lines.index + first_line
    doubtful = _doubtful_rows(table, rows.schema)
    if len(doubtful):
        good = []
        for i in doubtful.tolist():
            raw = lines.raw(block, i)
            try:
                good.append(DecodedEvent(decode_record(orjson.loads(raw), rows.schema,
                                                       int(positions[i])),
                                         int(positions[i]), raw, int(line_numbers[i])))
            except orjson.JSONDecodeError as e:  # not expected: pyarrow parsed it
                rows.dead.append(DeadLetter(rows.source, int(positions[i]), raw,
                                            f"not valid JSON: {e}", line=int(line_numbers[i])))
            except EventError as e:
                rows.dead.append(DeadLetter(rows.source, int(positions[i]), raw, str(e),
                                            line=int(line_numbers[i])))
        _add_rows_with_doubtful(rows, table, positions, line_numbers, doubtful, good,
                                lambda i: lines.raw(block, i))
        return len(lines)
    rows.add(_with_seq(table, positions, rows.arrow_schema), positions, line_numbers,
             lambda i: lines.raw(block, i))
    return len(lines)


def _all_finite(columns: list[pa.ChunkedArray]) -> bool:
    """Whether every float in the columns (nested ones too) is finite."""
    arrays = [chunk for column in columns for chunk in column.chunks]
    while arrays:
        array = arrays.pop()
        kind = array.type
        if pa.types.is_floating(kind):
            values = to_numpy(array)  # nulls come out as NaN: left out
            if array.null_count:
                values = values[~is_null(array)]
            if not np.isfinite(values).all():
                return False
        elif pa.types.is_struct(kind):
            arrays.extend(array.field(i) for i in range(kind.num_fields))
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            arrays.append(array.flatten())
    return True


def _shallow(block: bytes, lines: _Lines) -> bool:
    """Whether no line can nest deeper than orjson takes: only a line that long can."""
    long = np.flatnonzero(lines.ends - lines.starts >= _MAX_OPENINGS)
    if not len(long):
        return True
    data = np.frombuffer(block, dtype=np.uint8)
    opening = ((data == ord("{")) | (data == ord("["))).astype(np.int32)
    bounds = np.stack((lines.starts[long], lines.ends[long]), axis=1).ravel()
    deepest: int = np.add.reduceat(np.append(opening, 0), bounds)[::2].max()
    return deepest < _MAX_OPENINGS


def _orjson_takes_what_is_ignored(block: bytes, lines: _Lines) -> bool:
    """Whether nothing in the block is what orjson refuses but pyarrow takes in a field it
    ignores: a NaN or Infinity literal, a number beyond a double (200 digits in a row, or
    an exponent of three digits that is not negative), nesting deeper than orjson takes.
    Vectorised and conservative: what looks like one of these is looked at only to see
    whether it lies inside a string; a block it doubts goes to orjson."""
    data = np.frombuffer(block, dtype=np.uint8)
    if len(data) < 3:
        return True
    suspects = []
    for first, second, third in (b"NaN", b"Inf"):
        at = np.flatnonzero(data[:-2] == first)
        suspects.append(at[(data[at + 1] == second) & (data[at + 2] == third)])
    digit = (data - np.uint8(48)) < 10
    runs = digit[:len(digit) // 100 * 100].reshape(-1, 100)  # 200 in a row fill one
    suspects.append(np.flatnonzero(runs.all(axis=1)) * 100)
    after_digit = np.flatnonzero(((data[1:] == ord("e")) | (data[1:] == ord("E"))) & digit[:-1])
    if len(after_digit):  # an exponent: a digit, e, maybe +, then three digits
        padded = np.concatenate((data, np.zeros(4, np.uint8)))
        at = after_digit + 2  # the byte after the e
        at = at + (padded[at] == ord("+"))
        three = (padded[at[:, None] + np.arange(3)] - np.uint8(48) < 10).all(axis=1)
        suspects.append(after_digit[three])
    found = np.concatenate(suspects)
    return not (len(found) and not _in_strings(data, found).all()) and \
        _shallow(block, lines)


def _in_strings(data: npt.NDArray[np.uint8], at: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
    """Whether each byte `at` lies inside a JSON string: after an odd number of quotes
    that no backslash escapes (counted from the block's start: every line of JSON holds
    whole strings; a line that does not is refused by pyarrow anyway)."""
    quotes = np.flatnonzero(data == ord('"'))
    escaped = quotes[(quotes > 0) & (data[np.maximum(quotes - 1, 0)] == ord("\\"))]
    if len(escaped):
        real = np.ones(len(quotes), dtype=bool)
        for i in np.flatnonzero(np.isin(quotes, escaped)).tolist():
            back = int(quotes[i]) - 1
            while back >= 0 and data[back] == ord("\\"):
                back -= 1
            real[i] = (int(quotes[i]) - 1 - back) % 2 == 0  # an even run escapes itself
        quotes = quotes[real]
    inside: npt.NDArray[np.bool_] = np.searchsorted(quotes, at) % 2 == 1
    return inside


def _doubtful_rows(table: pa.Table, schema: StreamSchema,
                   text_checks: npt.NDArray[np.bool_] | None = None) -> npt.NDArray[np.intp]:
    """Rows that `decode_record` must look at: a null, a non-finite float, a negative seq,
    an unknown event type. (Numpy does the comparisons: Arrow's, with a Python value,
    would import pandas.)"""
    doubt = np.zeros(table.num_rows, dtype=bool) if text_checks is None else text_checks
    for name, kind in schema.attributes.items():
        column = table.column(name)
        if column.null_count:
            doubt |= is_null(column)
        if kind == AttrType.FLOAT:  # nulls come out as NaN: doubtful already
            doubt |= ~np.isfinite(to_numpy(column))
    seq = table.column("seq")
    if seq.null_count < len(seq) and pc.min(seq).as_py() < 0:
        doubt |= (to_numpy(seq) < 0) & ~is_null(seq)
    if schema.type_attribute is not None and schema.types is not None:
        known = pc.is_in(table.column(schema.type_attribute), strings(list(schema.types)))
        doubt |= ~to_numpy(known)  # a null is not in the set: doubtful
    return np.flatnonzero(doubt)


def _with_seq(table: pa.Table, positions: Int64s, schema: pa.Schema) -> pa.Table:
    """`table` (seq null where the record has none) with the default seqs filled in."""
    seq = table.column("seq")
    if seq.null_count == len(seq):
        seq = from_numpy(positions)
    elif seq.null_count:
        seq = pc.coalesce(seq, from_numpy(positions))
    columns = [seq] + [table.column(name) for name in schema.names[1:]]
    return pa.Table.from_arrays(columns, schema=schema)


def _add_rows_with_doubtful(rows: _Rows, table: pa.Table, positions: Int64s,
                            lines: Int64s | None, doubtful: npt.NDArray[np.intp],
                            good: list[DecodedEvent],
                            raw: Callable[[int], bytes | str]) -> None:
    """The fast rows of a block and its doubtful rows decoded one by one, in file order."""
    if not len(doubtful):
        rows.add(_with_seq(table, positions, rows.arrow_schema), positions, lines, raw)
        return
    fine = np.ones(table.num_rows, dtype=bool)
    fine[doubtful] = False
    fast = np.flatnonzero(fine)
    fast_table = _with_seq(table.take(from_numpy(fast)), positions[fast], rows.arrow_schema)
    if not good:
        rows.add(fast_table, positions[fast], None if lines is None else lines[fast],
                 lambda i: raw(int(fast[i])))
        return
    slow = _Rows(rows.schema, rows.source)
    slow.add_decoded(good)
    merged = pa.concat_tables([fast_table, slow.pieces[0].table]).combine_chunks()
    slow_positions = slow.pieces[0].positions
    all_positions = np.concatenate((positions[fast], slow_positions))
    order = np.argsort(all_positions, kind="stable")
    source_row = np.concatenate((fast, np.searchsorted(positions, slow_positions)))[order]
    rows.add(merged.take(from_numpy(order)), all_positions[order],
             None if lines is None else np.asarray(lines)[source_row],
             lambda i: raw(int(source_row[i])))


# ------------------------------------------------------------------ CSV


def _read_csv(f: IO[bytes], rows: _Rows, block_bytes: int) -> Iterator[None]:
    first = f.readline()
    text = first.decode("utf-8", "replace")
    if not _ONE_LINE_RECORD.fullmatch(text) or not text.strip("\r\n"):
        rows.add_records(_csv_records(_text(first + f.read()), rows.source),
                         rows.first_position, text=True)
        return
    header = [h.strip() for h in next(csv.reader([text]))]
    line, position = 2, rows.first_position
    times_as_text = False  # as the last block had its timestamp attributes
    unquoted = True  # whether quoted blocks are tried unquoted (until that fails once)
    for block in _blocks(f, block_bytes):
        lines = _Lines.of(block, _csv_blank)
        typed = None
        quoted = b'"' in block
        if b"\r" in block and block.count(b"\r") != block.count(b"\r\n"):
            simple = False
        elif quoted:
            if unquoted:
                typed, times_as_text = _csv_typed(block, header, lines, rows.schema,
                                                  times_as_text, unquoted=True)
            simple = typed is not None or _simply_quoted(block)
        else:
            simple = True
        if not simple:
            # A quoted field may span lines, a lone CR ends one: from here on, records
            # and lines are the csv module's to find.
            rows.add_records(_csv_records(_text(block + f.read()), rows.source, header, line),
                             position, text=True)
            return
        if typed is None:
            typed, times_as_text = _csv_typed(block, header, lines, rows.schema,
                                              times_as_text)
            unquoted = unquoted and not (quoted and typed is not None)  # quotes that split
        position += _csv_rows(block, lines, typed, header, line, position, rows)
        line += lines.newlines
        yield


def _simply_quoted(block: bytes) -> bool:
    """Whether every quote of a CSV block opens or closes a whole field holding no quote,
    CR or newline (`"AMZN"`, `"Mozilla/5.0 (KHTML, like Gecko)"`, as pyarrow writes
    strings): read alike by the csv module and pyarrow, one record per line."""
    data = np.frombuffer(block, dtype=np.uint8)
    quotes = np.flatnonzero(data == ord('"'))
    if len(quotes) % 2:
        return False
    opens, closes = quotes[0::2], quotes[1::2]
    before = data[np.maximum(opens - 1, 0)]  # the block's edges count as line ends
    after = data[np.minimum(closes + 1, len(data) - 1)]
    if not (((before == ord(",")) | (before == ord("\n")) | (opens == 0)).all() and
            ((after == ord(",")) | (after == ord("\n")) | (after == ord("\r")) |
             (closes == len(data) - 1)).all()):
        return False
    ends = np.flatnonzero((data == ord("\n")) | (data == ord("\r")))  # of lines
    return not (np.searchsorted(quotes, ends) % 2).any()  # none inside quotes


# A CSV line that is one whole record: fields plain, or quoted whole ("" for a quote).
_CSV_FIELD = r'(?:"(?:[^"\r\n]|"")*"|[^"\r\n,]*)'
_ONE_LINE_RECORD = re.compile(rf"{_CSV_FIELD}(?:,{_CSV_FIELD})*\r?\n?")


def _text(data: bytes) -> io.StringIO:
    return io.StringIO(data.decode("utf-8", "replace"), newline="")


def _csv_blank(line: bytes) -> bool:
    return line in (b"", b"\r")


def _csv_typed(block: bytes, header: list[str], lines: _Lines, schema: StreamSchema,
               times_as_text: bool, unquoted: bool = False) -> tuple[pa.Table | None, bool]:
    """`_parse_csv_typed`, with timestamp attributes read as the last block had them
    (`times_as_text`), then the other way; and the kind that worked, for the next block."""
    typed = _parse_csv_typed(block, header, lines, schema, times_as_text, unquoted)
    if typed is None and any(kind is AttrType.TIMESTAMP
                             for kind in schema.attributes.values()):
        typed = _parse_csv_typed(block, header, lines, schema, not times_as_text, unquoted)
        times_as_text = times_as_text if typed is None else not times_as_text
    return typed, times_as_text


def _csv_rows(block: bytes, lines: _Lines, typed: pa.Table | None, header: list[str],
              first_line: int, first_position: int, rows: _Rows) -> int:
    positions = np.arange(first_position, first_position + len(lines), dtype=np.int64)
    line_numbers = lines.index + first_line
    if typed is not None and not len(_doubtful_rows(typed, rows.schema)):

        def line_raw(i: int) -> str:
            line = block[lines.starts[i]:lines.ends[i]].decode("utf-8").rstrip("\r")
            return _csv_raw(next(csv.reader([line])))

        rows.add(_with_seq(typed, positions, rows.arrow_schema), positions, line_numbers,
                 line_raw)
        return len(lines)
    table = _parse_csv_block(block, header, lines)
    if table is None:
        return rows.add_records(_csv_records(_text(block), rows.source, header, first_line),
                                first_position, text=True)
    typed, doubt = _coerce_text(table, rows.schema)
    doubtful = _doubtful_rows(typed, rows.schema, doubt)
    fields = None
    good = []
    if len(doubtful):
        fields = [table.column(i).to_pylist() for i in range(table.num_columns)]
        for i in doubtful.tolist():
            row = [column[i] for column in fields]
            raw = _csv_raw(row)
            position = int(positions[i])
            try:
                good.append(DecodedEvent(decode_record(dict(zip(header, row)), rows.schema,
                                                       position, text=True),
                                         position, raw, int(line_numbers[i])))
            except EventError as e:
                rows.dead.append(DeadLetter(rows.source, position, raw, str(e),
                                            line=int(line_numbers[i])))

    def raw_of(i: int) -> str:
        return _csv_raw([table.column(c)[i].as_py() for c in range(table.num_columns)])

    _add_rows_with_doubtful(rows, typed, positions, line_numbers, doubtful, good, raw_of)
    return len(lines)


def _csv_raw(row: list[str]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(row)
    return out.getvalue()


def _parse_csv_typed(block: bytes, header: list[str], lines: _Lines, schema: StreamSchema,
                     times_as_text: bool = False, unquoted: bool = False) -> pa.Table | None:
    """The block parsed by pyarrow straight into the stream's types (seq null where the
    file has none), or None where that could differ from `decode_record`'s reading of the
    texts. pyarrow refuses every text that `decode_record` reads otherwise (`+5` or `1_0`
    for an int, `TRUE` for a bool: the block then goes the text way) except hexadecimal
    ints (`0x1f`), so a block with `0x` goes the text way too; an empty field is null,
    and a null, NaN or infinity is doubtful (`_doubtful_rows`): the caller then reads the
    block as text. `times_as_text`: timestamp attributes are read as text and converted
    by `iso_times` (a text it does not take is a null there).

    `unquoted`: quotes are read as any other character (quoting costs pyarrow nothing,
    but `_simply_quoted`, which makes a quoted parse safe, costs more than the parse), and
    the table is kept only where every quote of the block encloses a whole field of a
    column read as text (the stream's strings, text times, the fields it does not name),
    holding no quote (`"AMZN"`, as pyarrow writes strings): those
    fields lose their quotes, and the block is then simply quoted, read alike by pyarrow
    with quoting and by the csv module (a field with a comma inside quotes splits, a
    quoted number is no number: None)."""
    import pyarrow.csv as pcsv

    if (not len(lines) or b"\0" in block or _hex_prefix(block)
            or len(set(header)) != len(header)
            or any(name not in header for name in schema.attributes)):
        return None
    wanted = {"seq": pa.int64()} if "seq" in header else {}
    wanted.update({name: pa.string() if kind == AttrType.TIMESTAMP and times_as_text
                   else ARROW_TYPES[kind] for name, kind in schema.attributes.items()})
    column = {name: f"f{i}" for i, name in enumerate(header)}
    # Unquoted, the fields the stream does not name are read too, as text: their quotes
    # are looked at with the others'.
    read = wanted | {name: pa.string() for name in header if name not in wanted} \
        if unquoted else wanted
    try:
        table = pcsv.read_csv(
            pa.py_buffer(block),
            read_options=pcsv.ReadOptions(column_names=[f"f{i}" for i in range(len(header))]),
            parse_options=pcsv.ParseOptions(ignore_empty_lines=True,
                                            quote_char=False if unquoted else '"'),
            convert_options=pcsv.ConvertOptions(
                column_types={column[name]: kind for name, kind in read.items()},
                include_columns=[column[name] for name in read], null_values=[""],
                true_values=["true"], false_values=["false"], strings_can_be_null=False))
    except (pa.ArrowException, ValueError):
        return None
    if table.num_rows != len(lines):
        return None
    columns = [table.column(column[name]) for name in read]
    if unquoted:
        texts = [i for i, kind in enumerate(read.values()) if kind == pa.string()]
        found = _unquoted(columns, texts)
        if found is None or found != np.count_nonzero(np.frombuffer(block, np.uint8) == 34):
            return None
    columns = [iso_times(column_, schema.time_unit)
               if times_as_text and schema.attributes.get(name) == AttrType.TIMESTAMP
               else column_ for name, column_ in zip(wanted, columns[:len(wanted)])]
    if "seq" not in wanted:
        columns.insert(0, pa.nulls(table.num_rows, pa.int64()))
    return pa.Table.from_arrays(columns, names=["seq", *schema.attributes])


def _unquoted(columns: list[pa.ChunkedArray], texts: list[int]) -> int | None:
    """The text columns (indexes into `columns`) with the quotes around whole values
    taken off, in place, where every quote they hold is one of those; how many quotes
    that makes (None where a text column's quotes are not: the block then holds more
    quotes than this count)."""
    found = 0
    for i in texts:
        chunks = []
        for chunk in columns[i].chunks:
            if chunk.null_count:
                return None
            offsets = np.frombuffer(chunk.buffers()[1], np.int32,
                                    len(chunk) + 1, chunk.offset * 4)
            data = np.frombuffer(chunk.buffers()[2] or b"", np.uint8)
            starts, ends = offsets[:-1], offsets[1:]
            quoted = ends - starts >= 2
            at = np.flatnonzero(quoted)
            quoted[at] = (data[starts[at]] == 34) & (data[ends[at] - 1] == 34)
            count = int(np.count_nonzero(quoted))
            found += 2 * count
            if not count:
                chunks.append(chunk)
                continue
            text = data[offsets[0]:offsets[-1]]
            text = text[text != 34]  # the ends of quoted values, if the count is right
            if len(text) != offsets[-1] - offsets[0] - 2 * count:
                return None
            cut = np.empty(len(offsets), np.int32)
            cut[0] = 0
            np.cumsum(quoted, out=cut[1:])
            chunks.append(pa.Array.from_buffers(
                pa.string(), len(chunk),
                [None, pa.py_buffer(offsets - offsets[0] - 2 * cut), pa.py_buffer(text)]))
        columns[i] = pa.chunked_array(chunks, pa.string())
    return found


def _hex_prefix(block: bytes) -> bool:
    """Whether `0x` or `0X` occurs in `block` (`b"0x" in block` stops at every 0: 4 ms for
    4 MiB of numbers; a search for the letter and a look at the bytes before it, <1 ms)."""
    data = np.frombuffer(block, dtype=np.uint8)
    for letter in b"xX":
        if bytes((letter,)) in block:
            after_zero = np.flatnonzero(data[1:] == letter)
            if (data[after_zero] == ord("0")).any():
                return True
    return False


def _parse_csv_block(block: bytes, header: list[str], lines: _Lines) -> pa.Table | None:
    """The block's fields as text, one row per line, or None where the Python csv reader
    might see other fields (NUL bytes, duplicate names)."""
    import pyarrow.csv as pcsv

    if not len(lines) or b"\0" in block or len(set(header)) != len(header):
        return None
    names = [f"f{i}" for i in range(len(header))]
    try:
        table = pcsv.read_csv(
            pa.py_buffer(block),
            read_options=pcsv.ReadOptions(column_names=names),
            parse_options=pcsv.ParseOptions(ignore_empty_lines=True),
            convert_options=pcsv.ConvertOptions(
                column_types={n: pa.string() for n in names}, strings_can_be_null=False,
                quoted_strings_can_be_null=False))
    except (pa.ArrowException, ValueError):
        return None
    if table.num_rows != len(lines):
        return None
    return table.rename_columns(header)


_PLAIN_INT = r"^-?[0-9]{1,18}$"  # fits in 64 bits, means the same to int() and to Arrow
# Plain decimals small enough to stay finite: Arrow's and Python's parsers both round
# them correctly, so they give the same double.
_PLAIN_FLOAT = r"^-?[0-9]{1,20}(\.[0-9]{1,40})?([eE][-+]?[0-9]{1,2})?$"


def _plain(text: pa.ChunkedArray, kind: str) -> pa.ChunkedArray:
    """Whether each text is a plain int (or float, by `kind`), as _PLAIN_INT / _PLAIN_FLOAT
    say. First a check that accepts only a subset of those (unsigned digits, at most one
    dot inside, short enough): about 10x faster than the regex, and the regex runs only
    on a column where some text fails it (a minus sign, an exponent, a bad value)."""
    body = text if kind != AttrType.FLOAT else \
        pc.replace_substring(text, ".", "", max_replacements=1)
    short = pc.less_equal(pc.binary_length(text), 18 if kind != AttrType.FLOAT else 20)
    fast = pc.and_(pc.ascii_is_decimal(body), short)
    if kind == AttrType.FLOAT:
        fast = pc.and_(fast, pc.invert(pc.or_(pc.starts_with(text, "."),
                                              pc.ends_with(text, "."))))
    if pc.all(fast).as_py() is not False:
        return fast
    return pc.match_substring_regex(text, _PLAIN_FLOAT if kind == AttrType.FLOAT else _PLAIN_INT)


def _only_plain(text: pa.ChunkedArray, plain: npt.NDArray[np.bool_]) -> pa.ChunkedArray:
    """The texts, null where not plain (no copy where every one is)."""
    if plain.all():
        return text
    return pc.if_else(from_numpy(plain), text, pa.nulls(len(text), pa.string()))


def _coerce_text(table: pa.Table, schema: StreamSchema) -> tuple[pa.Table, npt.NDArray[np.bool_]]:
    """CSV text columns as the stream's types where the text is plain; the rows with any
    other text (or a missing column) are marked for `decode_record` (their values here
    are null)."""
    n = table.num_rows
    doubt = np.zeros(n, dtype=bool)
    columns = [pa.nulls(n, pa.int64())]  # seq
    if "seq" in table.column_names:
        seq_text = table.column("seq")
        plain = to_numpy(_plain(seq_text, "int"))
        empty = to_numpy(pc.binary_length(seq_text)) == 0
        doubt |= ~(plain | empty)
        columns[0] = _only_plain(seq_text, plain).cast(pa.int64())
    for name, kind in schema.attributes.items():
        if name not in table.column_names:
            doubt[:] = True
            columns.append(pa.nulls(n, ARROW_TYPES[kind]))
            continue
        text = table.column(name)
        if kind == AttrType.STRING:
            columns.append(text)
            continue
        plain = to_numpy(pc.is_in(text, strings(["true", "false"])) if kind == AttrType.BOOL
                         else _plain(text, kind))
        kept = _only_plain(text, plain)
        column = pc.starts_with(kept, "t") if kind == AttrType.BOOL else \
            kept.cast(ARROW_TYPES[kind])
        if kind == AttrType.TIMESTAMP and not plain.all():  # ISO-8601 texts, as iso_times reads
            column = pc.coalesce(column, iso_times(text, schema.time_unit))
            plain = ~is_null(column)
        doubt |= ~plain
        columns.append(column)
    return pa.Table.from_arrays(columns, names=["seq", *schema.attributes]), doubt


# ------------------------------------------------------------------ Parquet


_PARQUET_BATCH_ROWS = 1 << 20  # 64Ki (pyarrow's default): 0.47 s for 10M rows; 1Mi: 0.34 s


def _read_parquet(f: IO[bytes], rows: _Rows, block_bytes: int) -> Iterator[None]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(f)
    except (OSError, ValueError, pa.ArrowException) as e:
        raise InputError(f"{rows.source}: not a readable Parquet file: {e}") from None
    position = rows.first_position
    for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
        table = pa.Table.from_batches([batch])
        add_arrow(rows, table, position)
        position += table.num_rows
        yield


def add_arrow(rows: _Rows, table: pa.Table, first_position: int) -> None:
    """Rows of a typed table (field name -> value, as Parquet or a DataFrame holds them)
    decoded by `event_columns.decode_table`: good rows to `rows`, bad ones to its dead
    letters; record indexes count from `first_position`."""
    from cep_core.event_columns import decode_table

    positions = np.arange(first_position, first_position + table.num_rows, dtype=np.int64)
    decoded = decode_table(table, rows.schema, positions)
    for i in np.flatnonzero(decoded.bad).tolist():
        raw, error = decoded.raw[i], decoded.errors[i]
        assert raw is not None and error is not None  # a bad row has both
        rows.dead.append(DeadLetter(rows.source, int(positions[i]), raw.encode(), error))
    good = np.flatnonzero(~decoded.bad)
    attributes = [decoded.attributes[name] for name in rows.schema.attributes]
    if len(good) < table.num_rows:
        take = from_numpy(good)
        attributes = [column.take(take) for column in attributes]

    def raw_of(i: int) -> bytes:
        return orjson.dumps(table.slice(int(good[i]), 1).to_pylist()[0], default=str)

    rows.add(pa.Table.from_arrays([from_numpy(decoded.seq[good]), *attributes],
                                  schema=rows.arrow_schema), positions[good], None, raw_of)


_READERS = {EventFormat.JSONL: _read_jsonl, EventFormat.CSV: _read_csv,
            EventFormat.PARQUET: _read_parquet}


def read_arrow(table: pa.Table, schema: StreamSchema, source: str = "<table>",
               first_position: int = 0, prev_max: int = -1,
               guard: TimeGuard | None = None) -> tuple[pa.Table, list[DeadLetter]]:
    """`read_table` for a table already in memory (a DataFrame's, a Parquet file's)."""
    rows = _Rows(schema, source, prev_max=prev_max, guard=guard)
    add_arrow(rows, table, first_position)
    return rows.finish()


def read_records(records: Iterable[object], schema: StreamSchema, source: str = "<records>",
                 first_position: int = 0, prev_max: int = -1,
                 guard: TimeGuard | None = None) -> tuple[pa.Table, list[DeadLetter]]:
    """`read_table` for records already in memory (dicts, as JSON lines would give), each
    decoded by `event_io.decode_record`; a record's raw is its JSON."""
    rows = _Rows(schema, source, prev_max=prev_max, guard=guard)
    rows.add_records(((orjson.dumps(r, default=str), r, None, None) for r in records),
                     first_position)
    return rows.finish()
