"""The splitter: the single point of order of a stream's pipeline.

It consumes the source topic in batches (one JSON event per message, or framed batches
with header kind=events, or an end-of-input marker with header kind=end), stamps each
record with its sequence number, and writes the events as frames to the keyed topic: once
per route (distinct PARTITION BY list among the live queries) to partition
`stable_hash(key) % N` (unkeyed queries: partition 0). Each partition's last frame of a
batch says `upto` (every event up to that seq has been sent to it); partitions that got
nothing get a pulse, and when no batch went out for `pulse_ms` all partitions get one
(`cep serve splitter`: the Faust app's timer, services/splitter_app.py; in-process
pipelines: the loop itself). Batches are taken as soon as a record is there, plus
`linger_ms` for more, so a trickle of records makes few frames.

Sequence numbers follow `cep run`: a record's position (records consumed so far, bad ones
included; a framed batch counts one per event) unless it carries `seq`, which must
increase. Across source partitions the order is the order of consumption (one partition
per source topic gives produce order). Control messages hold from the next seq on.

That order is logged, so that a restarted splitter stamps every record it stamped before
with the same seq: each batch taken from the source is a numbered *step*, and every frame
the step sends (every keyed partition gets at least a pulse) carries the header `order`:
the step's number and its runs of source messages, `[partition, first offset, last
offset]` in consumption order. A restart reads the keyed topic after the checkpoint's
keyed offsets and takes the steps again from those runs before taking new ones
(services/splitter_order.py).
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cep_core.batch import Batch
from cep_core.errors import EventError
from cep_core.event_io import DeadLetter
from cep_core.json_batch import (DEFAULT_MAX_MESSAGE_BYTES, arrow_schema, conform_table,
                                 decode_messages)
from cep_core.reorder import ReorderBuffer
from services import frames
from services.checkpoint import read_latest
from cep_core.control_message import (STREAM, ControlMessageError, LiveSet, OtherStream,
                                      validate)
from cep_core.schema import units_per_ms
from services.control import StatusWriter, change_of
from services.frames import Frame
from services.kafka import KafkaSettings, Topics, consume_batch, produce
from services.reorder_checkpoint import Refill, saved_state
from services.splitter_order import ORDER_HEADER, LoggedOrder, logged_steps, runs_of
from services.metrics import Metrics
from services.serve import log, profiled


SPLITTER_KEY = b"splitter"  # the splitter's checkpoint on the state topic


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


class Splitter:
    def __init__(self, settings: KafkaSettings, topics: Topics, partitions: int = 4,
                 pulse_ms: int = 100, batch_size: int = 20000, registry=None,
                 metrics: Metrics | None = None, linger_ms: float = 5,
                 allowed_lateness_ms: int = 0, max_reorder_buffered: int = 100_000,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 checkpoint_ms: int | None = None):
        self.settings = settings
        self.topics = topics
        self.partitions = partitions
        self.pulse_s = pulse_ms / 1000
        self.checkpoint_s = (checkpoint_ms or int(os.environ.get("CEP_CHECKPOINT_MS", 1000))) / 1000
        self.batch_size = batch_size
        # after a batch's first record, wait this long for more: fewer, larger frames when
        # the input trickles (each frame costs every worker and the coordinator ~1-2 ms)
        self.linger_s = linger_ms / 1000
        self.queries = LiveSet(topics.stream, registry)
        self.status_writer = StatusWriter(topics.status, "splitter")
        self._initial_changes: list[dict] = []  # applied before the first `set` frame
        self.schema = None
        self.metrics = metrics or Metrics("splitter", 0)
        self.position = 0  # records consumed (the default seq of the next one)
        self.last_seq = -1
        self.max_ts = 0
        self.last_pulse = 0.0
        self.started = False
        # Held while a batch is stamped and sent: a pulse from another thread (the Faust
        # timer) must not claim an `upto` whose events are not all produced yet.
        self.lock = threading.Lock()
        self.sent_events = [0] * partitions
        self.sent_frames = [0] * partitions
        self.pulses = 0
        self.saved = None  # (source offsets, position) of the last checkpoint
        self.max_message_bytes = max_message_bytes
        # allowed_lateness_ms > 0: events are put back in time order per source partition
        # (services/reordering.py); 0: no buffer, as `cep run` (engines reject time going
        # backwards per query partition into the dead-letter topic)
        self.allowed_lateness_ms = allowed_lateness_ms
        self.reorder = (ReorderBuffer(0, max_reorder_buffered) if allowed_lateness_ms > 0
                        else None)
        self.refill: Refill | None = None  # after a restart: waiting events to put back
        self.late_events = 0
        self.steps = 0  # batches taken from the source so far (the last step's number)
        self.keyed_next: dict[int, int] = {}  # keyed partition -> offset after the last sent
        self.logged = LoggedOrder()  # after a restart: steps to take again as they were
        self._order: str | None = None  # the `order` header of the step being sent
        self._step_sent: set[int] = set()
        self.source_partitions: frozenset[int] = frozenset()  # of the source topic (start)
        self.ended: set[int] = set()  # source partitions whose end-of-input marker was taken
        self.undelivered: str | None = None  # the first record the broker never took

    # ------------------------------------------------------------ setup

    def _schema(self):
        from cep_core.schema import SchemaError

        try:
            return self.queries.registry.get(self.topics.stream)
        except SchemaError:
            return None

    def setup_schema(self) -> None:
        """The stream's schema, and the lateness in its time unit."""
        self.schema = self._schema()
        if self.schema is None:
            raise RuntimeError(f"no schema for stream {self.topics.stream!r}")
        if self.reorder is not None:
            self.reorder.allowed_lateness = round(
                self.allowed_lateness_ms * units_per_ms(self.schema.time_unit))

    def start(self, stopping=None) -> bool:
        """Learn the live set from the control topic (waiting, until `stopping`, for the
        stream's schema when none is known yet), then resume the source. False when
        stopped before the stream was known."""
        self.producer = self.settings.producer(on_delivery=self._delivered)
        self.control = self.settings.consumer()
        self.control.assign([TopicPartition(self.topics.control, 0, -2)])
        self._drain_control(initial=True)
        if self._schema() is None:  # up: changes get their outcome, as soon as it starts
            log("waiting_for_stream", stream=self.topics.stream, control=self.topics.control)
            self.status_writer.presence(self.producer, "up", waiting_for_stream=True)
        while self._schema() is None and not (stopping is not None and stopping.is_set()):
            self._drain_control(initial=True)
        if self._schema() is None:
            self.status_writer.presence(self.producer, "down")
            self.producer.flush(10)
            self.control.close()
            return False
        self.setup_schema()
        self.source = self.settings.consumer(self.topics.group("splitter"))
        metadata = self.source.list_topics(self.topics.source, timeout=10).topics[
            self.topics.source]
        tps = [TopicPartition(self.topics.source, p) for p in sorted(metadata.partitions)]
        self.source_partitions = frozenset(tp.partition for tp in tps)
        self.source.assign(self._resume_at(tps))
        self._send_all(frames.json_frame(frames.CONTROL, {
            "op": "set", "queries": self.queries.to_json(),
            "streams": self.queries.registry.to_json(), "changes": self._initial_changes},
            at=self.last_seq + 1, upto=self.last_seq, ts=self.max_ts))
        self._initial_changes = []
        self.status_writer.presence(self.producer, "up", live=self.queries.summary())
        self.started = True
        log("splitter_started", stream=self.topics.stream, partitions=self.partitions,
            queries=list(self.queries.live), next_position=self.position)
        return True

    # ------------------------------------------------------------ the loop

    def run(self, stopping, pulses: bool = True) -> None:
        """Start, then move batches until `stopping` is set. `pulses=False` when another
        thread calls `pulse_if_due` (the Faust app's timer)."""
        if self.start(stopping):
            self.loop(stopping, pulses)

    def loop(self, stopping, pulses: bool = True) -> None:
        last_commit = time.monotonic()
        try:
            with profiled("splitter"):
                while not stopping.is_set():
                    self.step()
                    if pulses:
                        self.pulse_if_due()
                    if time.monotonic() - last_commit > self.checkpoint_s:
                        self.commit()
                        self.metrics.observe_lag(self.source)
                        self.metrics.queries.set(len(self.queries.live))
                        last_commit = time.monotonic()
        finally:
            self.close()

    def step(self, timeout_s: float = 0.01) -> int:
        """Apply pending control messages, then stamp and send one batch of the source."""
        with self.lock:
            self._drain_control()
        messages = consume_batch(self.source, self.batch_size, timeout_s, self.linger_s)
        if messages or self.logged.holding:
            started = time.perf_counter()
            with self.lock:
                self.take(messages)
            self.metrics.batch_seconds.observe(time.perf_counter() - started)
        return len(messages)

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

    def pulse_if_due(self) -> bool:
        """Pulse every partition unless a batch or pulse went out within the cadence (a
        batch in flight will say its `upto` itself)."""
        if not self.started or time.monotonic() - self.last_pulse < self.pulse_s * 0.9:
            return False
        if not self.lock.acquire(blocking=False):
            return False
        try:
            self._pulse()
            return True
        finally:
            self.lock.release()

    def status(self) -> dict:
        """What the splitter's status view shows (taken under the batch lock)."""
        with self.lock:
            return self._status()

    def _status(self) -> dict:
        return {"stream": self.topics.stream, "source": self.topics.source,
                "keyed_topic": self.topics.keyed, "started": self.started,
                "position": self.position, "last_seq": self.last_seq, "max_ts": self.max_ts,
                "pulses": self.pulses, "pulse_ms": round(self.pulse_s * 1000),
                "ended_source_partitions": sorted(self.ended),
                "partitions": [{"partition": p, "events": self.sent_events[p],
                                "frames": self.sent_frames[p]}
                               for p in range(self.partitions)],
                "queries": [{"name": q.name, "index": q.index, "route": q.route,
                             "output": q.output} for q in self.queries.live.values()]}

    def close(self) -> None:
        with self.lock:
            self.started = False
        try:
            self.status_writer.presence(self.producer, "down")
            self.producer.flush(30)
            self.commit()
        finally:
            self.source.close()
            self.control.close()
        log("splitter_stopped", position=self.position, last_seq=self.last_seq)

    def _resume_at(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        """Where each source partition resumes, with the seq state there: the splitter's
        checkpoint on the state topic (tansu drops commit metadata), else committed offsets
        with their metadata, else the beginning. Records after that point are stamped again
        with the same seqs (a seq is the record's position in consumption order)."""
        saved = read_latest(self.settings, self.topics.state).get(SPLITTER_KEY)
        if saved is not None:
            state = orjson.loads(saved)
            offsets = {int(p): o for p, o in state["offsets"].items()}
            for tp in tps:
                tp.offset = offsets.get(tp.partition, OFFSET_BEGINNING)
        else:
            committed = self.source.committed(tps, timeout=10)
            state = next((orjson.loads(tp.metadata) for tp in committed if tp.metadata), None)
            for tp, done in zip(tps, committed):
                tp.offset = done.offset if state is not None and done.offset >= 0 \
                    else OFFSET_BEGINNING
        if state is not None:
            self.position, self.last_seq = state["position"], state["last_seq"]
            self.max_ts = state["max_ts"]
            self.saved = (state.get("offsets"), self.position)
            if self.reorder is not None and state.get("reorder") is not None:
                refill = Refill(self.reorder, state["reorder"])
                self.refill = None if refill.done else refill
            self.steps = state.get("steps", 0)
            self.ended = set(state.get("ended", ()))
            self.keyed_next = {int(p): o for p, o in (state.get("keyed") or {}).items()}
        self.logged = LoggedOrder(logged_steps(self.settings, self.topics.keyed,
                                               self.partitions, self.keyed_next, self.steps))
        if self.logged.holding:
            log("splitter_replaying", steps=len(self.logged.pending), after_step=self.steps)
        return tps

    def commit(self) -> None:
        """Checkpoint: once the keyed frames of everything consumed are flushed, the source
        offsets with the seq state go to the state topic (key `splitter`), then to the
        group's committed offsets (their metadata too)."""
        if self.refill is not None or self.logged.holding or self.producer.flush(30):
            return  # not while events that waited at the last checkpoint are put back,
            # nor while logged steps are taken again (messages are held for them)
        if self.undelivered is not None:  # a checkpoint would skip what it held: stop, and
            # let the restart stamp and send again from the last checkpoint
            raise RuntimeError(f"not delivered: {self.undelivered}")
        assignment = self.source.position(self.source.assignment())
        offsets = {str(tp.partition): tp.offset for tp in assignment if tp.offset >= 0}
        if not offsets or (offsets, self.position) == self.saved:
            return
        reorder = None
        consumed = offsets
        if self.reorder is not None:  # resume where the oldest waiting event was read
            offsets, reorder = saved_state(self.reorder, consumed)
        state = orjson.dumps({"position": self.position, "last_seq": self.last_seq,
                              "max_ts": self.max_ts, "offsets": offsets, "reorder": reorder,
                              "steps": self.steps, "ended": sorted(self.ended),
                              "keyed": {str(p): o for p, o in self.keyed_next.items()}})
        produce(self.producer, self.topics.state, state, key=SPLITTER_KEY)
        if self.producer.flush(30):
            log("checkpoint_not_flushed", level="warning")
            return
        self.saved = (consumed, self.position)
        self.source.commit(offsets=[TopicPartition(self.topics.source, int(p), o,
                                                   metadata=state.decode())
                                    for p, o in offsets.items()], asynchronous=False)

    def _drain_control(self, initial: bool = False) -> None:
        """Apply pending control messages; at start, all of the topic up to its fetch
        high-watermark."""
        deadline = time.monotonic() + 10
        tp = TopicPartition(self.topics.control, 0)
        while True:
            messages = self.control.consume(1000, 0.05 if initial else 0)
            for message in messages:
                if not message.error():
                    self._apply_control(message, announce=not initial)
            if not initial or time.monotonic() > deadline:
                return
            _, high = self.control.get_watermark_offsets(tp, cached=True)
            position = self.control.position([tp])[0].offset
            if high >= 0 and (high == 0 or position >= high) and not messages:
                return

    def _apply_control(self, message, announce: bool) -> None:
        """Check and apply one control record (once: what goes downstream is the checked
        change), and say on the status topic what became of it."""
        key, offset = message.key(), message.offset()
        change = None
        try:
            change = validate(message.value(), key, self.queries.registry, self.topics.stream)
            if change.kind == STREAM and change.name == self.topics.stream and \
                    change.op == "remove" and self.schema is not None:
                raise ControlMessageError(f"stream {change.name!r} is read by this running "
                                          "pipeline: stop it before removing the stream")
            if change.kind == STREAM and change.name == self.topics.stream and \
                    self.reorder is not None and self.schema is not None:
                raise ControlMessageError(f"stream {change.name!r}: this pipeline reorders "
                                          "late events, and cannot change its schema while "
                                          "it runs")
            entry = self.queries.apply(change)
        except OtherStream:
            return
        except ControlMessageError as e:
            if change is not None and change.kind == STREAM and \
                    change.name != self.topics.stream:
                return  # another pipeline's stream: not ours to report
            log("change_refused", level="warning", reason=str(e),
                key=(key or b"").decode(errors="replace"), offset=offset)
            self.status_writer.outcome(self.producer, change_of(key, offset, change), "refused",
                                       reason=str(e), live=self.queries.summary())
            return
        if change.kind == STREAM and change.name != self.topics.stream:
            return  # learnt for the registry; the pipeline reads another stream
        named = change_of(key, offset, change)
        log("change_applied", **named, at=self.last_seq + 1)
        self.status_writer.outcome(self.producer, named, "applied", at=self.last_seq + 1,
                                   live=self.queries.summary(), starting=not announce)
        if change.kind == STREAM and self.schema is not None:
            self.setup_schema()  # decode with the new version from the next seq on
        if not announce:
            self._initial_changes.append(named)
            return
        body = {"op": change.op, "name": change.name, **named}
        if entry is not None:
            body.update(entry.to_json())
        sent_ms = message.timestamp()[1]
        self._send_all(frames.json_frame(frames.CONTROL, body, at=self.last_seq + 1,
                                         upto=self.last_seq, ts=self.max_ts, sent_ms=sent_ms))

    # ------------------------------------------------------------ a batch

    def process(self, messages) -> None:
        """Stamp and send one step: `messages` in the order they were consumed (or logged)."""
        runs = runs_of(messages)
        if not runs:
            return
        self.steps += 1
        self._order = orjson.dumps({"step": self.steps, "runs": runs}).decode()
        self._step_sent = set()
        try:
            self._process(messages)
            for p in range(self.partitions):  # every partition logs every step
                if p not in self._step_sent:
                    self._send(p, Frame(frames.PULSE, {"upto": self.last_seq,
                                                       "ts": self.max_ts}))
        finally:
            self._order = None

    def _process(self, messages) -> None:
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
            if frame.kind == frames.EVENTS:
                rows.append(self._framed(frame, message, dead))
            elif frame.kind == frames.END and self._input_ended(message.partition()):
                self._route(rows, end=True)
                rows = []
                self._send_all(Frame(frames.END, {"upto": self.last_seq, "ts": self.max_ts}))
                log("end_of_input", upto=self.last_seq)
        self._flush_run(run, rows, dead)
        self._route(rows)
        if dead:
            self.metrics.dead_letters.inc(len(dead))
            for letter in dead:
                produce(self.producer, self.topics.dead_letters, orjson.dumps(letter.to_json()))

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

    def _put_back(self, messages) -> list:
        """After a restart: messages consumed before the checkpoint put their waiting
        events back into the reorder buffer (services/reorder_checkpoint.py); the rest
        are returned to be processed."""
        refill, position = self.refill, self.position
        later, rows, run = [], [], []
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
            elif frame.kind == frames.EVENTS:
                self._flush_run(run, rows, [])
                run = []
                rows.append(self._framed(frame, message, []))
            if refill.last_replayed(partition, offset):
                self._flush_run(run, rows, [])
                run = []
                for part in rows:
                    self._refill_rows(part)
                rows = []
                refill.passed(partition)
        self._flush_run(run, rows, [])
        for part in rows:
            self._refill_rows(part)
        self.position = position  # re-read events keep their old arrival positions
        if refill.done:
            self.refill = None
            log("reorder_buffer_restored", waiting=len(self.reorder))
        return later

    def _refill_rows(self, part: Rows) -> None:
        names = arrow_schema(self.schema).names[1:]
        self.refill.put_back(part.as_batch(self.schema.time, names), part.partition)

    def _flush_run(self, run: list, rows: list, dead: list) -> None:
        """Decode a run of one-event messages of one source partition."""
        if not run:
            return
        raws = [m.value() or b"" for m in run]
        offsets = np.fromiter((m.offset() for m in run), np.int64, len(run))
        positions = np.arange(self.position, self.position + len(run), dtype=np.int64)
        self.position += len(run)
        decoded = decode_messages(raws, self.schema, positions, offsets=offsets,
                                  partition=run[0].partition(), source=self.topics.source,
                                  max_bytes=self.max_message_bytes)
        dead.extend(decoded.dead)
        rows.append(self._in_order(Rows(decoded.table, [raws[i] for i in decoded.rows],
                                        offsets[decoded.rows], positions[decoded.rows],
                                        run[0].partition(),
                                        np.zeros(len(decoded.rows), np.int64)), dead))

    def _framed(self, frame: Frame, message, dead: list) -> Rows:
        """A framed batch: its rows share the frame's offset; a bad frame is one letter."""
        try:
            table = conform_table(frames.decode_table(frame.payload), self.schema)
        except (EventError, frames.FrameError) as e:
            dead.append(DeadLetter(self.topics.source, self.position, message.value() or b"",
                                   str(e), message.offset(), message.partition()))
            self.position += 1
            table = arrow_schema(self.schema).empty_table()
            return Rows(table, [], np.zeros(0, np.int64), np.zeros(0, np.int64),
                        message.partition(), np.zeros(0, np.int64))
        positions = np.arange(self.position, self.position + table.num_rows, dtype=np.int64)
        self.position += table.num_rows
        if "seq" not in table.column_names:
            table = table.add_column(0, "seq", pa.array(positions, pa.int64()))
        table = table.select(arrow_schema(self.schema).names)
        n = table.num_rows
        return self._in_order(Rows(table, [b"<framed batch>"] * n,
                                   np.full(n, message.offset(), np.int64), positions,
                                   message.partition(), np.arange(n, dtype=np.int64)), dead)

    def _in_order(self, rows: Rows, dead: list) -> Rows:
        """Drop events whose seq does not increase (dead letters, as `cep run` does). With
        reordering, seqs are given on release (`_reordered`) and this check is not needed."""
        seq = rows.table.column("seq").to_numpy()
        if len(seq) == 0 or self.reorder is not None:
            return rows
        previous = np.concatenate([[self.last_seq], seq[:-1]])
        if (seq > previous).all():
            self.last_seq = int(seq[-1])
            return rows
        keep = np.zeros(len(seq), dtype=bool)
        last = self.last_seq
        for i, s in enumerate(seq.tolist()):
            if s > last:
                keep[i] = True
                last = s
            else:
                dead.append(DeadLetter(self.topics.source, int(s), rows.raws[i],
                                       f"seq {s} does not increase (previous seq {last})",
                                       int(rows.offsets[i]), rows.partition))
        self.last_seq = last
        return rows.take(np.flatnonzero(keep))

    def _reordered(self, rows: list[Rows], end: bool) -> pa.Table | None:
        """Push the rows through the reorder buffer (key: source partition); late ones go
        to the late-events topic; released ones get the next seqs in release order."""
        names = arrow_schema(self.schema).names[1:]
        released: list[Batch] = []
        for part in rows:
            if not part.table.num_rows:
                continue
            out = self.reorder.push(part.as_batch(self.schema.time, names),
                                    np.full(part.table.num_rows, part.partition, np.int64))
            released.append(out.released)
            if len(out.late):
                self._send_late(out.late, out.late_keys)
        if end:
            released.append(self.reorder.flush()[0])
        released = [b for b in released if len(b)]
        if not released:
            return None
        columns = {k: np.concatenate([b.columns[k] for b in released])
                   for k in released[0].columns}
        n = len(columns["_offset"])
        seq = np.arange(self.last_seq + 1, self.last_seq + 1 + n, dtype=np.int64)
        self.last_seq += n
        schema = arrow_schema(self.schema)
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
            produce(self.producer, self.topics.late, orjson.dumps(letter.to_json()))

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
        ts = table.column(self.schema.time).to_numpy()
        self.max_ts = max(self.max_ts, int(ts.max()))
        self.metrics.events_in.inc(table.num_rows)
        by_partition: dict[int, list[Frame]] = {}
        for route in sorted(self.queries.routes()):
            attrs = route.split(",") if route else []
            parts = partition_ids(table, attrs, self.partitions)
            order = np.argsort(parts, kind="stable")
            bounds = np.searchsorted(parts[order], np.arange(self.partitions + 1))
            for p in range(self.partitions):
                a, b = bounds[p], bounds[p + 1]
                if a == b:
                    continue
                rows = table.take(pa.array(order[a:b])) if b - a < table.num_rows else table
                by_partition.setdefault(p, []).append(frames.events_frame(rows, route))
        for p in range(self.partitions):
            sent = by_partition.get(p, [])
            if not sent:
                sent = [Frame(frames.PULSE)]
            sent[-1].headers.update(upto=self.last_seq, ts=self.max_ts)
            for frame in sent:
                self._send(p, frame)
        self.metrics.events_out.inc(table.num_rows * len(self.queries.routes()))
        self.last_pulse = time.monotonic()
        self.producer.poll(0)

    def _pulse(self) -> None:
        self.pulses += 1
        self._send_all(Frame(frames.PULSE, {"upto": self.last_seq, "ts": self.max_ts}))

    def _send_all(self, frame: Frame) -> None:
        for p in range(self.partitions):
            self._send(p, frame)
        self.last_pulse = time.monotonic()
        self.producer.poll(0)

    def _send(self, partition: int, frame: Frame) -> None:
        self.sent_frames[partition] += 1
        self.sent_events[partition] += frame.get("count", 0)
        headers = frame.kafka_headers()
        if self._order is not None:
            headers.append((ORDER_HEADER, self._order.encode()))
            self._step_sent.add(partition)
        produce(self.producer, self.topics.keyed, frame.payload, partition=partition,
                headers=headers)

    def _delivered(self, err, message) -> None:
        if err is not None:
            if self.undelivered is None:
                self.undelivered = f"{message.topic()} [{message.partition()}]: {err}"
                log("delivery_failed", level="error", topic=message.topic(),
                    partition=message.partition(), error=str(err))
            return
        if message.topic() == self.topics.keyed:
            p = message.partition()
            self.keyed_next[p] = max(self.keyed_next.get(p, 0), message.offset() + 1)
