"""The Spark job's sequencer: records of a micro-batch -> events with seqs, dead letters,
ends of input; the same stamping and checks as the splitter and `cep run`.

A micro-batch is one *step* of the splitter's model (docs/semantics.md, "Several source
partitions"): its records are taken source partition by source partition, in ascending
partition order, each partition's records in offset order (files: in name order). A
record's seq is its `seq` field, else its position: the records stamped before it (bad
ones included). Then, as everywhere, "seq must increase" and the bound on events too far
ahead (`cep_core.time_guard`), with the largest seq and the stream's time carried from
step to step in a `Carry`. Spark's offset log keeps each step's offsets, so a step run
again after a restart reads the same records in the same order from the same `Carry`
(stored beside the job's checkpoint, keyed by the step's start: `CarryStore`) and stamps
the same seqs.

Rows leave as Arrow batches of `row_schema`: `__cep_kind` (event, dead, end), `seq`, the
stream's attributes (type defaults on rows that are not events) and `__cep_dead` (a dead
letter's JSON).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.fs as pafs

from cep_core.arrow_numpy import arrow_schema, from_numpy, to_numpy
from cep_core.event_io import DeadLetter
from cep_core.json_batch import decode_messages
from cep_core.schema import StreamSchema
from cep_core.time_guard import TimeGuard

EVENT, DEAD, END = "event", "dead", "end"
# the row columns beside seq and the attributes (named so that no attribute is one)
KIND, DEAD_LETTER = "__cep_kind", "__cep_dead"
_DEFAULTS = {"int": 0, "timestamp": 0, "float": 0.0, "bool": False, "string": ""}


def stream_schema(options: dict) -> StreamSchema:
    """The stream's schema as the job passes it to its sources (option `schema`: JSON)."""
    return StreamSchema.from_dict(orjson.loads(options["schema"]))


def row_schema(schema: StreamSchema) -> pa.Schema:
    events = arrow_schema(schema)
    return pa.schema([pa.field(KIND, pa.string()), *events,
                      pa.field(DEAD_LETTER, pa.string())])


def spark_row_schema(schema: StreamSchema) -> str:
    """`row_schema` as Spark DDL (attribute names quoted: any name the schema allows)."""
    types = {"int": "long", "timestamp": "long", "float": "double", "bool": "boolean",
             "string": "string"}
    attributes = ", ".join(f"`{name}` {types[kind]}" for name, kind in schema.attributes.items())
    return f"{KIND} string, seq long, {attributes}, {DEAD_LETTER} string"


@dataclass
class Carry:
    """What one step hands the next: records stamped so far, the largest seq accepted,
    the stream's time, and the source partitions whose end of input came since the last
    end."""

    position: int = 0
    last_seq: int = -1
    time: int | None = None
    ended: list = field(default_factory=list)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> Carry:
        return cls(**orjson.loads(data))


class CarryStore:
    """Carries in `<checkpoint>/sequencer/`, one file per step start (a JSON offset):
    written when a step has been read, read by the step after it. A step read twice writes
    the same file (the same records, the same carry)."""

    def __init__(self, checkpoint: str):
        self.fs, root = pafs.FileSystem.from_uri(checkpoint)
        self.root = f"{root.rstrip('/')}/sequencer"

    def _path(self, offset: dict) -> str:
        digest = hashlib.blake2b(orjson.dumps(offset, option=orjson.OPT_SORT_KEYS),
                                 digest_size=16).hexdigest()
        return f"{self.root}/{digest}.json"

    def get(self, offset: dict) -> Carry:
        path = self._path(offset)
        try:
            with self.fs.open_input_stream(path) as f:
                return Carry.from_json(f.read())
        except FileNotFoundError:
            raise RuntimeError(f"the sequencer's carry for offset {offset} is missing "
                               f"({path}): the checkpoint was damaged or moved") from None

    def put(self, offset: dict, carry: Carry) -> None:
        self.fs.create_dir(self.root, recursive=True)
        path = self._path(offset)
        with self.fs.open_output_stream(path + ".tmp") as f:
            f.write(carry.to_json())
        self.fs.move(path + ".tmp", path)


class Sequencer:
    """Stamps the records of one step, run by run, from a `Carry`."""

    def __init__(self, schema: StreamSchema, carry: Carry):
        self.schema = schema
        self.carry = carry
        self.rows = row_schema(schema)
        self.guard = TimeGuard.of(schema)
        self.guard.time = carry.time

    def messages(self, raws: list[bytes], offsets: np.ndarray, partition: int,
                 source: str) -> pa.RecordBatch:
        """One run: the records of `partition` at `offsets`, one JSON event each."""
        positions = self.carry.position + np.arange(len(raws), dtype=np.int64)
        decoded = decode_messages(raws, self.schema, positions, offsets=offsets,
                                  partition=partition, source=source)
        table, dead = self._checked(decoded.table, lambda r: raws[decoded.rows[r]],
                                    lambda r: int(positions[decoded.rows[r]]),
                                    lambda r: (int(offsets[decoded.rows[r]]), partition),
                                    source)
        self.carry.position += len(raws)
        return self.batch(table, decoded.dead + dead)

    def table(self, table: pa.Table, dead: list[DeadLetter], records: int) -> pa.RecordBatch:
        """A block read and checked by `cep run`'s reader (`event_reader.iter_tables`,
        from this carry) holding `records` records."""
        self.carry.position += records
        if table.num_rows:
            self.carry.last_seq = max(self.carry.last_seq, int(to_numpy(table.column("seq")).max()))
        self.carry.time = self.guard.time
        return self.batch(table, dead)

    def _checked(self, table: pa.Table, raw: Callable[[int], bytes],
                 position: Callable[[int], int], where: Callable[[int], tuple[int, int]],
                 source: str) -> tuple[pa.Table, list[DeadLetter]]:
        if not table.num_rows:
            return table, []
        keep, refused, self.carry.last_seq = self.guard.accept(
            to_numpy(table.column(self.schema.time)), to_numpy(table.column("seq")),
            self.carry.last_seq)
        self.carry.time = self.guard.time
        dead = [DeadLetter(source, position(r), raw(r), reason, *where(r))
                for r, reason in refused.items()]
        return (table.filter(from_numpy(keep)) if refused else table), dead

    def end(self, partition: int, partitions: int) -> pa.RecordBatch | None:
        """An end-of-input marker of `partition`; the input has ended (a row of kind end,
        seq: the last position) once every one of the `partitions` has sent one."""
        if partition not in self.carry.ended:
            self.carry.ended.append(partition)
        if len(self.carry.ended) < partitions:
            return None
        self.carry.ended = []
        return self.marker(END)

    def marker(self, kind: str) -> pa.RecordBatch:
        n = 1
        columns = [pa.array([kind] * n, pa.string()),
                   pa.array([self.carry.position], pa.int64())]
        columns += [pa.array([_DEFAULTS[k]] * n, self.rows.field(name).type)
                    for name, k in self.schema.attributes.items()]
        columns.append(pa.nulls(n, pa.string()))
        return pa.RecordBatch.from_arrays(columns, schema=self.rows)

    def batch(self, table: pa.Table, dead: list[DeadLetter]) -> pa.RecordBatch:
        """Events (`table`: seq, then the attributes) and dead letters as rows."""
        n, d = table.num_rows, len(dead)
        columns = [pa.concat_arrays([pa.repeat(pa.scalar(EVENT), n),
                                     pa.repeat(pa.scalar(DEAD), d)]),
                   pa.concat_arrays([_array(table.column("seq"), pa.int64()),
                                     pa.array([letter.position for letter in dead], pa.int64())])]
        for name, kind in self.schema.attributes.items():
            type_ = self.rows.field(name).type
            columns.append(pa.concat_arrays([_array(table.column(name), type_),
                                             pa.repeat(pa.scalar(_DEFAULTS[kind], type_), d)]))
        columns.append(pa.concat_arrays([pa.nulls(n, pa.string()), pa.array(
            [orjson.dumps(letter.to_json()).decode() for letter in dead], pa.string())]))
        return pa.RecordBatch.from_arrays(columns, schema=self.rows)


def sequence_run(sequencer: Sequencer, partition: int, values: list[bytes], offsets: np.ndarray,
                 ends: np.ndarray, partitions: int, source: str) -> Iterator[pa.RecordBatch]:
    """The batches of one source partition's records of a step, in offset order: runs of
    JSON events between end-of-input markers (`ends`: which records are markers; the input
    ends once each of the `partitions` has sent one)."""
    start = 0
    for i in [*np.flatnonzero(ends), len(values)]:
        if i > start:
            yield sequencer.messages(values[start:i], offsets[start:i], partition, source)
        if i < len(values):
            marker = sequencer.end(partition, partitions)
            if marker is not None:
                yield marker
        start = i + 1


def _array(column: pa.ChunkedArray, type_: pa.DataType) -> pa.Array:
    column = column.cast(type_)
    return pa.concat_arrays(column.chunks) if column.num_chunks else pa.array([], type_)
