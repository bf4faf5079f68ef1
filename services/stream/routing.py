"""The routing core of the splitter, without Kafka: consumed messages in, keyed frames
per partition out (with seqs, reordering, lateness and the logged consumption order),
plus dead letters, late events and status records.

`Router` is what services/stream/splitter.py did between the consumer and the producer: it
takes the messages of one step (`Message`: confluent-kafka's, or `message` makes one for
tests and benches) and appends what it sends to `out`, an `Outbox` of `(topic, value, key,
partition, headers)` records in send order. The `Splitter` shell consumes, hands messages
and control records to the router and produces the outbox; checkpoints (which need the
consumer's positions and the producer's delivery reports) stay in the shell. Semantics:
see services/stream/splitter.py.

Two rules of the stream's time live here, decided once for the whole pipeline:

- Events too far ahead (cep_core/time_guard.py, the rule of `cep run`'s readers): after the
  seq check, an event whose time is more than `max_ahead` after the stream's time (or more
  than `max_ahead_of_clock` after the wall clock) is a dead letter, as `cep run` writes it
  (its position, the message as raw), before it gets a seq or a place in the reorder
  buffer; it moves neither time nor seqs.
- Idle streams (`idleness`): when no event was accepted for that long by the wall clock
  (`clock`), each pulse advances the stream's time by the wall-clock time since the last
  event and carries it to every partition as its `ts`, so the workers emit the windows and
  time out the sequences that waited for later events (docs/semantics.md, "Idle streams").
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cep_core.batch import Batch
from cep_core.control_message import (
    STREAM,
    ControlMessageError,
    ControlRecord,
    LiveSet,
    OtherStream,
    validate,
)
from cep_core.arrow_numpy import arrow_schema, empty_table
from cep_core.control_ops import Op, Outcome
from cep_core.errors import Category, EventError
from cep_core.event_io import DeadLetter
from cep_core.json_batch import (
    DEFAULT_MAX_MESSAGE_BYTES,
    conform_table,
    decode_messages,
)
from cep_core.reorder import ReorderBuffer
from cep_core.schema import SchemaError, SchemaRegistry, StreamSchema, units_per_ms
from cep_core.time_guard import TOO_FAR_AHEAD, TimeGuard
from cep_service.stream import frames
from cep_service.stream.control_write_back import came_back, write_back
from cep_service.stream.frames import ChangeFrame, Frame, LiveSetFrame
from cep_service.stream.metrics import Metrics
from cep_service.stream.reorder_checkpoint import Refill
from cep_service.stream.serve import log
from cep_service.stream.splitter_order import ORDER_HEADER, LoggedOrder, runs_of
from cep_service.stream.status import StatusWriter, change_of
from cep_service.stream.stream_time import StreamTime
from cep_service.stream.topics import Topics, produce


class Message(Protocol):
    """A consumed message as the cores read it: a confluent_kafka Message (what the
    shells consume) has these methods, and so has `PlainMessage`."""

    def topic(self) -> str | None: ...

    def partition(self) -> int | None: ...

    def offset(self) -> int | None: ...

    def key(self) -> bytes | None: ...

    def value(self) -> bytes | None: ...

    def headers(self) -> list[tuple[str, bytes]] | None: ...

    def timestamp(self) -> tuple[int, int]: ...

    def error(self) -> object | None: ...


class PlainMessage:
    """A consumed message without a consumer (no error; timestamp type 1, create time)."""

    __slots__ = ("_topic", "_partition", "_offset", "_key", "_value", "_headers",
                 "_timestamp_ms")

    def __init__(self, topic: str, partition: int, offset: int, value: bytes | None,
                 headers: list[tuple[str, bytes]] | None = None, key: bytes | None = None,
                 timestamp_ms: int = 0):
        self._topic, self._partition, self._offset = topic, partition, offset
        self._value, self._headers, self._key = value, headers, key
        self._timestamp_ms = timestamp_ms

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp_ms)

    def error(self) -> None:
        return None

    def __len__(self) -> int:
        return len(self._value or b"")


def message(partition: int, offset: int, value: bytes | None,
            headers: list[tuple[str, bytes]] | None = None,
            key: bytes | None = None, timestamp_ms: int = 0) -> Message:
    """A consumed message without a consumer (for tests, benches and the chained
    pipeline's in-memory match frames)."""
    return PlainMessage("source", partition, offset, value, headers, key, timestamp_ms)


@dataclass
class PlainMessages:
    """A step of one-event messages (no headers, no errors) read in one pass each: their
    values, source partitions and offsets, and where each run of one partition begins."""

    values: list[bytes]
    partitions: np.ndarray
    offsets: np.ndarray
    bounds: list[int]  # each run's first index, then the end

    @classmethod
    def of(cls, messages: list) -> PlainMessages | None:
        n = len(messages)
        if not n or [m.headers() for m in messages].count(None) != n or \
                [m.error() for m in messages].count(None) != n:
            return None
        values = [m.value() for m in messages]
        if None in values:
            values = [v or b"" for v in values]
        partitions = np.array([m.partition() for m in messages], np.int64)
        offsets = np.array([m.offset() for m in messages], np.int64)
        bounds = [0, *(np.flatnonzero(np.diff(partitions)) + 1).tolist(), n]
        return cls(values, partitions, offsets, bounds)

    def runs(self) -> list[list[int]]:
        """As `runs_of` gives them: `[partition, first offset, last offset]`."""
        return [[int(self.partitions[a]), int(self.offsets[a]), int(self.offsets[b - 1])]
                for a, b in zip(self.bounds[:-1], self.bounds[1:])]


def records(values: list[bytes], partition: int = 0, first_offset: int = 0,
            headers: list[tuple[str, bytes]] | None = None) -> list[Message]:
    """Messages of one source partition at consecutive offsets."""
    return [message(partition, first_offset + i, v, headers) for i, v in enumerate(values)]


class Outbox:
    """What a core sends, in order: `(topic, value, key, partition, headers)`. It takes
    the producer's `produce` and `poll` calls, so code that writes to a producer writes
    here as well."""

    def __init__(self) -> None:
        self.records: list[tuple] = []

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                partition: int | None = None, headers: Any = None) -> None:
        self.records.append((topic, value, key, partition, headers))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def __len__(self) -> int:
        return len(self.records)

    def take(self) -> list[tuple]:
        out, self.records = self.records, []
        return out

    def to(self, producer: Any) -> None:
        """Produce everything here (in order) with `producer`, and empty the box."""
        for topic, value, key, partition, headers in self.take():
            produce(producer, topic, value, key=key, partition=partition, headers=headers)


def stable_hash(values: pa.Array) -> np.ndarray:
    """crc32 of each value's JSON text, per distinct value (uint32; stable across runs)."""
    encoded = pc.dictionary_encode(values)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    codes = np.fromiter((zlib.crc32(orjson.dumps(v)) for v in encoded.dictionary.to_pylist()),
                        np.uint64, len(encoded.dictionary))
    return codes[encoded.indices.to_numpy(zero_copy_only=False)]


def partition_ids(table: pa.Table, attrs: list[str], n: int) -> np.ndarray:
    if not attrs or n == 1:
        return np.zeros(table.num_rows, dtype=np.int64)
    h = np.zeros(table.num_rows, dtype=np.uint64)
    for name in attrs:
        h = (h * np.uint64(1_000_003) + stable_hash(table.column(name))) & np.uint64(0xFFFFFFFF)
    return (h % np.uint64(n)).astype(np.int64)


# Under the producer's message.max.bytes (services/stream/kafka.py) with room for Arrow's framing.
DEFAULT_MAX_FRAME_BYTES = 4 << 20


@dataclass
class Rows:
    """Decoded events with, per row, where they came from (for dead letters, late events)."""

    table: pa.Table
    raws: list[bytes]
    offsets: np.ndarray
    positions: np.ndarray
    partition: int
    indexes: np.ndarray  # each row's place in its message (framed batches hold many)

    def take(self, index: np.ndarray) -> Rows:
        return Rows(self.table.take(pa.array(index, pa.int64())),
                    [self.raws[i] for i in index.tolist()], self.offsets[index],
                    self.positions[index], self.partition, self.indexes[index])

    def as_batch(self, time: str, names: list[str]) -> Batch:
        """Numpy columns for the reorder buffer: seq = arrival position."""
        columns = {name: self.table.column(name).to_numpy(zero_copy_only=False)
                   for name in names}
        columns["_offset"] = self.offsets
        columns["_index"] = self.indexes
        columns["_raw"] = np.array(self.raws + [None], dtype=object)[:-1]
        return Batch(self.positions, self.table.column(time).to_numpy(), columns)


class KeyedSender:
    """The keyed frames of a router into its outbox: per partition, the frames and events
    sent; the `order` header of the step being sent (services/stream/splitter_order.py)
    and the partitions that step reached; when a frame last went to every partition."""

    def __init__(self, out: Outbox, topic: str, partitions: int):
        self.out, self.topic, self.partitions = out, topic, partitions
        self.sent_events = [0] * partitions
        self.sent_frames = [0] * partitions
        self.last_pulse = 0.0
        self.order: str | None = None  # the `order` header of the step being sent
        self.step_sent: set[int] = set()

    def begin_step(self, order: str) -> None:
        self.order, self.step_sent = order, set()

    def end_step(self) -> None:
        self.order = None

    def unsent(self) -> list[int]:
        """The partitions the step being sent has not reached (each logs every step)."""
        return [p for p in range(self.partitions) if p not in self.step_sent]

    def sent_to_all(self) -> None:
        self.last_pulse = time.monotonic()

    def send_all(self, frame: Frame) -> None:
        for p in range(self.partitions):
            self.send(p, frame)
        self.sent_to_all()

    def send(self, partition: int, frame: Frame) -> None:
        self.sent_frames[partition] += 1
        self.sent_events[partition] += frame.get("count", 0)
        headers = frame.kafka_headers()
        if self.order is not None:
            headers.append((ORDER_HEADER, self.order.encode()))
            self.step_sent.add(partition)
        produce(self.out, self.topic, frame.payload, partition=partition, headers=headers)


class Router:
    """Stamps and routes the steps of one stream's source (see services/stream/splitter.py)."""

    def __init__(self, topics: Topics, partitions: int = 4,
                 registry: SchemaRegistry | None = None,
                 metrics: Metrics | None = None, allowed_lateness_ms: int = 0,
                 max_reorder_buffered: int = 100_000,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 status_writer: StatusWriter | None = None,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 max_ahead: int | str | None = None,
                 max_ahead_of_clock: int | str | None = None,
                 idleness: int | str | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.topics = topics
        self.partitions = partitions
        self.out = Outbox()
        self.keyed = KeyedSender(self.out, topics.keyed, partitions)
        # False: keyed events frames carry their Arrow table, not its IPC bytes (the
        # chained pipeline hands them to its partition cores in memory)
        self.encode_frames = True
        self.queries = LiveSet(topics.stream, registry)
        self.status_writer = status_writer or StatusWriter(topics.status, "splitter")
        self._initial_changes: list[dict] = []  # applied before the first `set` frame
        self.schema: StreamSchema | None = None  # set by setup_schema
        self.metrics = metrics or Metrics("splitter", 0)
        self.position = 0  # records consumed (the default seq of the next one)
        self.last_seq = -1
        self.max_ts = 0
        self.pulses = 0
        self.max_message_bytes = max_message_bytes
        self.max_frame_bytes = max_frame_bytes  # of the events in one keyed frame, about
        # allowed_lateness_ms > 0: events are put back in time order per source partition
        # (cep_core/reorder.py); 0: no buffer, as `cep run` (engines reject time going
        # backwards per query partition into the dead-letter topic)
        self.allowed_lateness_ms = allowed_lateness_ms
        self.reorder = (ReorderBuffer(0, max_reorder_buffered) if allowed_lateness_ms > 0
                        else None)
        self.refill: Refill | None = None  # after a restart: waiting events to put back
        self.late_events = 0
        self.steps = 0  # batches taken from the source so far (the last step's number)
        self.logged = LoggedOrder()  # after a restart: steps to take again as they were
        self.source_partitions: frozenset[int] = frozenset()  # of the source topic (start)
        self.ended: set[int] = set()  # source partitions whose end-of-input marker was taken
        self.inputs_ended = 0  # ends of input sent
        # The stream's time rules (see the module's docstring)
        self.time = StreamTime(max_ahead, max_ahead_of_clock, idleness, clock, wall_clock)
        self._refilling = False  # putting back events accepted before a restart

    @property
    def last_pulse(self) -> float:
        return self.keyed.last_pulse

    @property
    def guard(self) -> TimeGuard | None:
        return self.time.guard

    @property
    def idleness(self) -> int | None:
        return self.time.idleness

    @property
    def idle_advances(self) -> int:
        return self.time.idle_advances

    # ------------------------------------------------------------ the stream and its queries

    def known_schema(self) -> StreamSchema | None:
        try:
            return self.queries.registry.get(self.topics.stream)
        except SchemaError:
            return None

    def setup_schema(self) -> None:
        """The stream's schema, and the lateness, the bounds on events too far ahead and
        the idleness in its time unit (a new version of the schema keeps the time)."""
        self.schema = self.known_schema()
        if self.schema is None:
            raise RuntimeError(f"no schema for stream {self.topics.stream!r}")
        if self.reorder is not None:
            self.reorder.allowed_lateness = round(
                self.allowed_lateness_ms * units_per_ms(self.schema.time_unit))
        self.time.setup(self.schema)

    @property
    def live_schema(self) -> StreamSchema:
        """The schema events are decoded with (setup_schema comes before any event)."""
        if self.schema is None:
            raise RuntimeError(f"no schema for stream {self.topics.stream!r} yet")
        return self.schema

    def _restored(self) -> int | None:
        """The time a restart takes the guard's from: the checkpoint's `max_ts` (which
        the splitter restores, not the guard's time): exact but where every event time
        was below 0, or an end of input came after the last event (the guard then starts
        from the ended input's time)."""
        return self.max_ts if self.last_seq >= 0 else None

    def _time_guard(self) -> TimeGuard:
        return self.time.guard_now(self.live_schema, self._restored())

    def apply_control(self, message: Any, announce: bool) -> None:
        """Check and apply one control record, a Message or a ControlRecord (once: what
        goes downstream is the checked change), and say on the status topic what became
        of it. `announce` False: while starting (a replay of the compacted topic, see
        cep_core/control_message.py: upserts, no-ops skipped silently)."""
        record = message if isinstance(message, ControlRecord) else ControlRecord.of(message)
        if record.republished and announce:  # at a start, it is the key's live record
            came_back(self, record)
            return
        key, offset = record.key, record.offset
        change = None
        try:
            change = validate(record.value, key, self.queries.registry, self.topics.stream)
            if not announce and self.queries.unchanged(change):
                return
            if change.kind is STREAM and change.name == self.topics.stream and \
                    change.op is Op.REMOVE and self.schema is not None:
                raise ControlMessageError(f"stream {change.name!r} is read by this running "
                                          "pipeline: stop it before removing the stream",
                                          Category.CONFLICT)
            if change.kind is STREAM and change.name == self.topics.stream and \
                    self.reorder is not None and self.schema is not None:
                raise ControlMessageError(f"stream {change.name!r}: this pipeline reorders "
                                          "late events, and cannot change its schema while "
                                          "it runs", Category.CONFLICT)
            entry = self.queries.apply(change, record.version, starting=not announce)
        except OtherStream:
            return
        except ControlMessageError as e:
            if change is not None and change.kind is STREAM and \
                    change.name != self.topics.stream:
                return  # another pipeline's stream: not ours to report
            log("change_refused", level="warning", reason=str(e),
                key=(key or b"").decode(errors="replace"), offset=offset)
            self.status_writer.outcome(self.out, change_of(key, offset, change), Outcome.REFUSED,
                                       reason=str(e), category=e.category,
                                       errors=[p.to_json() for p in e.problems],
                                       live=self.queries.summary())
            write_back(self, record)
            return
        if change.kind is STREAM and change.name != self.topics.stream:
            return  # learnt for the registry; the pipeline reads another stream
        named = change_of(key, offset, change)
        log("change_applied", **named, at=self.last_seq + 1)
        self.status_writer.outcome(self.out, named, Outcome.APPLIED, at=self.last_seq + 1,
                                   live=self.queries.summary(), starting=not announce)
        if change.kind is STREAM and self.schema is not None:
            self.setup_schema()  # decode with the new version from the next seq on
        if not announce:
            self._initial_changes.append(named)
            return
        sent_ms = None if isinstance(message, ControlRecord) else message.timestamp()[1]
        self._send_all(frames.control_frame(ChangeFrame.applied(named, entry),
                                            at=self.last_seq + 1, upto=self.last_seq,
                                            ts=self.max_ts, sent_ms=sent_ms))

    def announce(self) -> None:
        """The whole live set (and the changes applied before it) to every partition: the
        first frames after a start."""
        self._send_all(frames.control_frame(LiveSetFrame(
            tuple(self.queries.to_json()), tuple(self.queries.registry.to_json()),
            tuple(self._initial_changes)), at=self.last_seq + 1, upto=self.last_seq,
            ts=self.max_ts))
        self._initial_changes = []

    def pulse(self) -> None:
        """Pulse every partition (the splitter's timer, when no batch went out for a
        while), first advancing the time of an idle stream."""
        self._advance_if_idle()
        self._pulse()

    def _advance_if_idle(self) -> None:
        """When no event was accepted for `idleness` by `clock`: the stream's time becomes
        the time at the last event plus the wall-clock time since (in the time unit,
        rounded down), for the next pulse to carry. With a reorder buffer, not past an
        event still waiting in it (its time less one)."""
        schema = self.schema
        idle = self.time.idle_time(schema, self._restored())
        if idle is None or schema is None:  # (no idle time without a schema)
            return
        ts, elapsed_ms = idle
        if self.reorder is not None and len(self.reorder):
            waiting, _ = self.reorder.waiting()
            if waiting is not None:  # (some wait: len > 0)
                ts = min(ts, int(waiting.ts.min()) - 1)
        if ts <= self.max_ts:
            return
        self.max_ts = ts
        self.time.advanced(ts, schema, self._restored())
        log("idle_stream_advanced", ts=ts, idle_ms=round(elapsed_ms), upto=self.last_seq)

    def status(self, started: bool, pulse_ms: int) -> dict:
        return {"stream": self.topics.stream, "source": self.topics.source,
                "keyed_topic": self.topics.keyed, "started": started,
                "position": self.position, "last_seq": self.last_seq, "max_ts": self.max_ts,
                "pulses": self.pulses, "pulse_ms": pulse_ms,
                "idleness": self.idleness, "idle_advances": self.idle_advances,
                "ended_source_partitions": sorted(self.ended),
                "partitions": [{"partition": p, "events": self.keyed.sent_events[p],
                                "frames": self.keyed.sent_frames[p]}
                               for p in range(self.partitions)],
                "queries": [{"name": q.name, "index": q.index, "route": q.route,
                             "output": q.output} for q in self.queries.live.values()]}

    # ------------------------------------------------------------ a batch

    def take(self, messages: list) -> None:
        """Stamp and send what was consumed (a step's work without the consumer). After a
        restart, the events that waited in the reorder buffer at the checkpoint are put
        back first: every later message is held until each of them is back, since a step
        taken without them would release differently (an end of input would flush the
        buffer without them, and they would wait in it for ever). Then the logged steps
        are taken again, then new ones."""
        if self.refill is not None:
            messages = self._put_back(messages)
        for step in self.logged.steps(messages, hold=self.refill is not None):
            self.process(step)

    def process(self, messages: list[Any]) -> None:
        """Stamp and send one step: `messages` in the order they were consumed (or logged)."""
        plain = PlainMessages.of(messages)
        runs = plain.runs() if plain is not None else runs_of(messages)
        if not runs:
            return
        self.steps += 1
        self.keyed.begin_step(orjson.dumps({"step": self.steps, "runs": runs}).decode())
        try:
            if plain is not None:
                self._process_plain(plain)
            else:
                self._process(messages)
            for p in self.keyed.unsent():  # every partition logs every step
                self.keyed.send(p, Frame(frames.PULSE, {"upto": self.last_seq,
                                                        "ts": self.max_ts}))
        finally:
            self.keyed.end_step()

    def _process_plain(self, plain: PlainMessages) -> None:
        """A step of one-event messages only (the common case)."""
        rows: list[Rows] = []
        dead: list[DeadLetter] = []
        for a, b in zip(plain.bounds[:-1], plain.bounds[1:]):
            self._decode_run(plain.values[a:b], plain.offsets[a:b], int(plain.partitions[a]),
                             rows, dead)
        self._route(rows)
        self._dead_letters(dead)

    def _dead_letters(self, dead: list[DeadLetter]) -> None:
        if dead:
            self.metrics.dead_letters.inc(len(dead))
            for letter in dead:
                produce(self.out, self.topics.dead_letters, orjson.dumps(letter.to_json()))

    def _process(self, messages: list[Any]) -> None:
        rows: list[Rows] = []
        run: list = []
        dead: list[DeadLetter] = []
        for message in messages:
            if message.error():
                continue
            if run and run[-1].partition() != message.partition():
                self._flush_run(run, rows, dead)
                run = []
            if message.headers() is None:  # one JSON event (the common case)
                run.append(message)
                continue
            try:
                frame = frames.frame_of(message)
            except frames.FrameError as e:
                dead.append(DeadLetter(self.topics.source, self.position, message.value() or
                                       b"", str(e), message.offset(), message.partition()))
                self.position += 1
                continue
            if frame is None:
                run.append(message)
                continue
            self._flush_run(run, rows, dead)
            run = []
            if frame.kind is frames.EVENTS:
                rows.append(self._framed(frame, message, dead))
            elif frame.kind is frames.END and self._input_ended(message.partition()):
                self._route(rows, end=True)
                rows = []
                self._send_all(Frame(frames.END, {"upto": self.last_seq, "ts": self.max_ts}))
                self.inputs_ended += 1
                self.time.input_ended()
                log("end_of_input", upto=self.last_seq)
        self._flush_run(run, rows, dead)
        self._route(rows)
        self._dead_letters(dead)

    def _input_ended(self, partition: int) -> bool:
        """The end-of-input marker of one source partition: has every source partition
        now given its marker? One partition's marker says only that this partition is
        complete: records that other partitions received before it was written may still
        be consumed after it (the consumer returns partitions in any order, a restarted
        splitter reads a backlog partition by partition). Ending the input at the first
        marker stamped them after the end (lateness 0) or left them in the reorder buffer,
        flushed already, for ever (lost). Which partitions ended is in the checkpoint."""
        self.ended.add(partition)
        waiting = sorted(self.source_partitions - self.ended)
        if waiting:
            log("source_partition_ended", partition=partition, waiting=waiting)
            return False
        self.ended = set()
        return True

    def _put_back(self, messages: list[Any]) -> list:
        """After a restart: messages consumed before the checkpoint put their waiting
        events back into the reorder buffer (services/stream/reorder_checkpoint.py); the rest
        are returned to be processed."""
        refill, position = self.refill, self.position
        assert refill is not None  # (called while refilling)
        self._refilling = True  # accepted before the restart: they only move time
        later: list = []
        rows: list[Rows] = []
        run: list = []
        for message in messages:
            if message.error():
                continue
            partition, offset = message.partition(), message.offset()
            if not refill.replayed(partition, offset):
                refill.passed(partition)
                later.append(message)
                continue
            if run and run[-1].partition() != partition:
                self._flush_run(run, rows, [])
                run = []
            frame = None
            if message.headers() is not None:
                try:
                    frame = frames.frame_of(message)
                except frames.FrameError:
                    frame = Frame(frames.PULSE)  # was a dead letter: nothing to put back
            if frame is None:
                run.append(message)
            elif frame.kind is frames.EVENTS:
                self._flush_run(run, rows, [])
                run = []
                rows.append(self._framed(frame, message, []))
            if refill.last_replayed(partition, offset):
                self._flush_run(run, rows, [])
                run = []
                for part in rows:
                    self._refill_rows(refill, part)
                rows = []
                refill.passed(partition)
        self._flush_run(run, rows, [])
        for part in rows:
            self._refill_rows(refill, part)
        self.position = position  # re-read events keep their old arrival positions
        self._refilling = False
        if refill.done:
            self.refill = None
            log("reorder_buffer_restored",
                waiting=len(self.reorder) if self.reorder is not None else 0)
        return later

    def _refill_rows(self, refill: Refill, part: Rows) -> None:
        schema = self.live_schema
        names = arrow_schema(schema).names[1:]
        refill.put_back(part.as_batch(schema.time, names), part.partition)

    def _flush_run(self, run: list, rows: list, dead: list) -> None:
        """Decode a run of one-event messages of one source partition."""
        if not run:
            return
        raws = [m.value() or b"" for m in run]
        offsets = np.fromiter((m.offset() for m in run), np.int64, len(run))
        self._decode_run(raws, offsets, run[0].partition(), rows, dead)

    def _decode_run(self, raws: list[bytes], offsets: np.ndarray, partition: int, rows: list,
                    dead: list) -> None:
        positions = np.arange(self.position, self.position + len(raws), dtype=np.int64)
        self.position += len(raws)
        decoded = decode_messages(raws, self.live_schema, positions, offsets=offsets,
                                  partition=partition, source=self.topics.source,
                                  max_bytes=self.max_message_bytes)
        dead.extend(decoded.dead)
        every = len(decoded.rows) == len(raws)
        rows.append(self._in_order(Rows(
            decoded.table, raws if every else [raws[i] for i in decoded.rows],
            offsets if every else offsets[decoded.rows],
            positions if every else positions[decoded.rows], partition,
            np.zeros(len(decoded.rows), np.int64)), dead))

    def _framed(self, frame: Frame, message: Any, dead: list) -> Rows:
        """A framed batch: its rows share the frame's offset; a bad frame is one letter."""
        try:
            table = conform_table(frames.decode_table(frame.payload), self.live_schema)
        except (EventError, frames.FrameError) as e:
            dead.append(DeadLetter(self.topics.source, self.position, message.value() or b"",
                                   str(e), message.offset(), message.partition()))
            self.position += 1
            table = empty_table(arrow_schema(self.live_schema))
            return Rows(table, [], np.zeros(0, np.int64), np.zeros(0, np.int64),
                        message.partition(), np.zeros(0, np.int64))
        positions = np.arange(self.position, self.position + table.num_rows, dtype=np.int64)
        self.position += table.num_rows
        if "seq" not in table.column_names:
            table = table.add_column(0, "seq", pa.array(positions, pa.int64()))
        table = table.select(arrow_schema(self.live_schema).names)
        n = table.num_rows
        return self._in_order(Rows(table, [b"<framed batch>"] * n,
                                   np.full(n, message.offset(), np.int64), positions,
                                   message.partition(), np.arange(n, dtype=np.int64)), dead)

    def _in_order(self, rows: Rows, dead: list) -> Rows:
        """Drop events whose seq does not increase, then events too far ahead of the
        stream's time (dead letters, as `cep run` does: `TimeGuard.accept`). With
        reordering, seqs are given on release (`_reordered`) and only the time is checked.
        A seq's dead letter names the seq as its position, one too far ahead its
        position (both as `cep run` where the seq is the position)."""
        n = rows.table.num_rows
        if n == 0:
            return rows
        ts = rows.table.column(self.live_schema.time).to_numpy()
        guard = self._time_guard()
        if self._refilling:
            guard.advance(int(ts.max()))
            return rows
        seq = None if self.reorder is not None else rows.table.column("seq").to_numpy()
        keep, refused, last = guard.accept(ts, seq, self.last_seq)
        if seq is not None:
            self.last_seq = last
        if len(refused) < n:
            self.time.accepted()
        if not refused:
            return rows
        for i, reason in refused.items():
            position = int(rows.positions[i]) if reason.startswith(TOO_FAR_AHEAD) \
                else int(seq[i])  # type: ignore[index]  # (refused seqs: seq was read)
            dead.append(DeadLetter(self.topics.source, position, rows.raws[i], reason,
                                   int(rows.offsets[i]), rows.partition))
        return rows.take(np.flatnonzero(keep))

    def _reordered(self, rows: list[Rows], end: bool) -> pa.Table | None:
        """Push the rows through the reorder buffer (key: source partition); late ones go
        to the late-events topic; released ones get the next seqs in release order."""
        stream_schema, reorder = self.live_schema, self.reorder
        assert reorder is not None  # (called with a reorder buffer)
        names = arrow_schema(stream_schema).names[1:]
        released: list[Batch] = []
        for part in rows:
            if not part.table.num_rows:
                continue
            out = reorder.push(part.as_batch(stream_schema.time, names),
                                    np.full(part.table.num_rows, part.partition, np.int64))
            released.append(out.released)
            if len(out.late):
                self._send_late(out.late, out.late_keys)
        if end:
            released.append(reorder.flush()[0])
        released = [b for b in released if len(b)]
        if not released:
            return None
        columns = {k: np.concatenate([b.columns[k] for b in released])
                   for k in released[0].columns}
        n = len(columns["_offset"])
        seq = np.arange(self.last_seq + 1, self.last_seq + 1 + n, dtype=np.int64)
        self.last_seq += n
        schema = arrow_schema(stream_schema)
        return pa.Table.from_arrays([pa.array(seq, pa.int64())] + [
            pa.array(columns[name], schema.field(name).type) for name in names], schema=schema)

    def _send_late(self, late: Batch, keys: np.ndarray) -> None:
        self.late_events += len(late)
        self.metrics.late_events.inc(len(late))
        for i in range(len(late)):
            letter = DeadLetter(self.topics.source, int(late.seq[i]), late.columns["_raw"][i],
                                f"late: event time {int(late.ts[i])} is behind its source "
                                f"partition's watermark (allowed lateness "
                                f"{self.allowed_lateness_ms} ms)",
                                int(late.columns["_offset"][i]), int(keys[i]))
            produce(self.out, self.topics.late, orjson.dumps(letter.to_json()))

    def _route(self, rows: list[Rows], end: bool = False) -> None:
        if self.reorder is not None:
            table = self._reordered(rows, end)
            if table is None:
                return
        else:
            tables = [r.table for r in rows if r.table.num_rows]
            if not tables:
                return
            table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        ts = table.column(self.live_schema.time).to_numpy()
        self.max_ts = max(self.max_ts, int(ts.max()))
        self.metrics.events_in.inc(table.num_rows)
        by_partition: dict[int, list[Frame]] = {}
        # frames sized by bytes: a backlog of framed batches makes one large step
        rows_per_frame = max(1, self.max_frame_bytes * table.num_rows // max(1, table.nbytes))
        for route in sorted(self.queries.routes()):
            attrs = route.split(",") if route else []
            parts = partition_ids(table, attrs, self.partitions)
            order = np.argsort(parts, kind="stable")
            bounds = np.searchsorted(parts[order], np.arange(self.partitions + 1))
            grouped = table if bounds[1] == table.num_rows else table.take(pa.array(order))
            for p in range(self.partitions):
                a, b = bounds[p], bounds[p + 1]
                if a == b:
                    continue
                for at in range(a, b, rows_per_frame):
                    rows = grouped.slice(at, min(b, at + rows_per_frame) - at) \
                        if b - a < table.num_rows or rows_per_frame < b - a else grouped
                    by_partition.setdefault(p, []).append(
                        frames.events_frame(rows, route, self.encode_frames))
        for p in range(self.partitions):
            sent = by_partition.get(p, [])
            if not sent:
                sent = [Frame(frames.PULSE)]
            sent[-1].headers.update(upto=self.last_seq, ts=self.max_ts)
            for frame in sent:
                self.keyed.send(p, frame)
        self.metrics.events_out.inc(table.num_rows * len(self.queries.routes()))
        self.keyed.sent_to_all()

    def _pulse(self) -> None:
        self.pulses += 1
        self._send_all(Frame(frames.PULSE, {"upto": self.last_seq, "ts": self.max_ts}))

    def _send_all(self, frame: Frame) -> None:
        self.keyed.send_all(frame)

