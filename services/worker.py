"""A worker: runs the engines of its assigned keyed partitions.

One consumer group over the keyed topic; per assigned partition, one StreamEngines per
route (PARTITION BY list) holding the live queries of that route. Event frames are decoded
into Batch columns (Arrow -> BatchEncoder.from_arrow, no dict per event); at each `upto`
the engines are punctuated with the stream time and the partition's composite events go to
the same partition of the match topic, stamped "processed up to seq `upto`". Control
frames switch queries at exactly their seq; end frames flush every engine.

Checkpoints: every `checkpoint_ms` (or `checkpoint_batches` consumed batches), and on
revoke, each changed partition's state (queries, engine snapshots, the next keyed-topic
offset, composites not yet sent, the last event seq per route) goes to the compacted state
topic (key = partition) after the match frames it covers are flushed; only then are the
offsets committed. On assign, the newest snapshot is restored and consumption resumes at its
offset, so a killed worker's partitions replay from there: the replay sends the same
composite events again (same seqs), and the coordinator drops what it has released.
Events at or below the last seq a partition processed on a route (a restarted splitter
sends its last batches again) are dropped, and so is a repeated end of input.
"""

from __future__ import annotations

import os
import struct
import time

import orjson
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.engine import StreamEngines
import pyarrow as pa
import pyarrow.compute as pc

from cep_core.control_message import STREAM, LiveSet, horizon
from cep_core.schema import units_per_ms
from services import frames
from services.checkpoint import read_latest
from services.control import StatusWriter, learned_live
from services.frames import Frame
from services.kafka import (BOUNDED_CONSUMER, BOUNDED_PRODUCER, Deliveries, KafkaSettings,
                            Topics, consume_batch, produce)
from services.metrics import Metrics
from services.serve import log, profiled


class PartitionState:
    """The engines of one keyed partition."""

    def __init__(self, partition: int, stream: str, registry,
                 idle_timeout_ms: int | None = None):
        self.partition = partition
        self.idle_timeout_ms = idle_timeout_ms
        self.queries = LiveSet(stream, registry)
        self.routes: dict[str, tuple[StreamEngines, BatchEncoder]] = {}
        self.upto = -1
        self.ts = None
        self.offset = OFFSET_BEGINNING
        self.out: list[dict] = []
        self.seen: dict[str, int] = {}  # route -> last event seq processed
        self.end_at = -1  # upto of the last end of input
        self.saved_offset = None  # offset of the last snapshot written

    def engines(self, route: str) -> tuple[StreamEngines, BatchEncoder]:
        pair = self.routes.get(route)
        if pair is None:
            strings = StringDictionary()
            schema = self.queries.registry.get(self.queries.stream)
            pair = self.routes[route] = (StreamEngines([], strings),
                                         BatchEncoder(schema, strings))
        return pair

    def start(self, entry) -> None:
        self.engines(entry.route)[0].add(entry.checked, **self.engine_options(entry))

    def engine_options(self, entry) -> dict:
        """Idle-key eviction: the configured timeout in the stream's time units, at least
        twice the query's horizon (its window), so eviction drops only state no match uses."""
        if self.idle_timeout_ms is None or entry.checked.query.kind == "window":
            return {}
        timeout = max(1, round(self.idle_timeout_ms * units_per_ms(
            entry.checked.schema.time_unit)))
        window = horizon(entry.checked)
        return {"idle_timeout": max(timeout, 2 * window) if window else timeout}

    def stop(self, name: str) -> None:
        for route, (engines, _) in list(self.routes.items()):
            if name in engines.queries:
                engines.remove(name)
                if not engines.queries:
                    del self.routes[route]

    def reconcile(self, entries: list[dict]) -> None:
        """Make the live set equal to `entries`; queries whose text is unchanged keep
        their state."""
        wanted = {e["name"]: e for e in entries}
        for name, live in list(self.queries.live.items()):
            if name not in wanted or wanted[name]["text"] != live.text:
                self.stop(name)
                del self.queries.live[name]
        fresh = [e for e in entries if e["name"] not in self.queries.live]
        kept = [q.to_json() for q in self.queries.live.values()]
        self.queries.load(kept + fresh)
        for entry in fresh:
            self.start(self.queries.live[entry["name"]])

    def restart_engines(self) -> None:
        entries = self.queries.to_json()
        self.routes = {}
        self.queries.live = {}
        self.reconcile(entries)

    def new_schema(self) -> None:
        """The stream's schema changed (a compatible update): decode frames with it."""
        schema = self.queries.registry.get(self.queries.stream)
        for _, encoder in self.routes.values():
            encoder.schema = schema

    def compact_strings(self) -> int:
        """Drop the strings no engine holds any more (see StreamEngines.compact_strings);
        how many were dropped."""
        return sum(engines.compact_strings() for engines, _ in self.routes.values())

    def strings(self) -> int:
        return sum(len(encoder.strings) for _, encoder in self.routes.values())

    # ------------------------------------------------------------ snapshots

    def snapshot(self) -> bytes:
        blobs = {route: engines.snapshot() for route, (engines, _) in self.routes.items()}
        meta = {"partition": self.partition, "offset": self.offset, "upto": self.upto,
                "ts": self.ts, "queries": self.queries.to_json(),
                "routes": {r: len(b) for r, b in blobs.items()}, "out": self.out,
                "seen": self.seen, "end_at": self.end_at}
        head = orjson.dumps(meta)
        return struct.pack(">I", len(head)) + head + b"".join(blobs.values())

    def restore(self, data: bytes) -> None:
        (size,) = struct.unpack(">I", data[:4])
        meta = orjson.loads(data[4:4 + size])
        self.offset, self.upto, self.ts = meta["offset"], meta["upto"], meta["ts"]
        self.out, self.seen = meta.get("out", []), meta.get("seen", {})
        self.end_at = meta.get("end_at", -1)
        self.saved_offset = self.offset
        self.reconcile(meta["queries"])
        at = 4 + size
        for route, length in meta["routes"].items():
            self.engines(route)[0].restore(data[at:at + length])
            at += length


class Worker:
    def __init__(self, settings: KafkaSettings, topics: Topics, registry=None,
                 batch_size: int = 2000, metrics: Metrics | None = None,
                 idle_timeout_ms: int | None = 3_600_000, max_queued_output: int = 20000,
                 slow_down_s: float = 0.0,
                 checkpoint_ms: int | None = None, checkpoint_batches: int | None = None):
        from cep_core.schema import SchemaRegistry

        self.settings = settings
        self.topics = topics
        self.registry = registry or SchemaRegistry()
        self.status = StatusWriter(topics.status, "worker")
        self.batch_size = batch_size
        self.metrics = metrics or Metrics("worker", 0)
        self.parts: dict[int, PartitionState] = {}
        # backpressure: composite-event frames waiting in the producer's queue beyond
        # which consumption pauses; slow_down_s: a sleep per batch (backpressure tests)
        self.idle_timeout_ms = idle_timeout_ms
        self.max_queued_output = max_queued_output
        self.slow_down_s = slow_down_s
        self.pauses = 0
        self.checkpoint_s = (checkpoint_ms or int(os.environ.get("CEP_CHECKPOINT_MS", 1000))) / 1000
        self.checkpoint_batches = checkpoint_batches or int(
            os.environ.get("CEP_CHECKPOINT_BATCHES", 100))
        self.batches_since = 0
        self.last_checkpoint = time.monotonic()
        self.deliveries = Deliveries()

    def run(self, stopping) -> None:
        # the control topic's streams, and its queries checked once for all partitions
        self.registry = learned_live(self.settings, self.topics.control, self.topics.stream,
                                     self.registry).registry
        # a match frame or snapshot that failed to reach the broker stops the worker before
        # its checkpoint commits past it: the restart runs again from the last checkpoint
        self.producer = self.settings.producer(on_delivery=self.deliveries, **BOUNDED_PRODUCER)
        self.status.presence(self.producer, "up")
        self.consumer = self.settings.consumer(self.topics.group("workers"),
                                               **BOUNDED_CONSUMER)
        self.consumer.subscribe([self.topics.keyed], on_assign=self._on_assign,
                                on_revoke=self._on_revoke, on_lost=self._on_lost)
        log("worker_started", stream=self.topics.stream)
        last_lag = 0.0
        try:
            with profiled("worker"):
                while not stopping.is_set():
                    messages = consume_batch(self.consumer, self.batch_size, 0.05)
                    if time.monotonic() - last_lag > 1:
                        self.observe()
                        last_lag = time.monotonic()
                    if not messages:
                        continue
                    started = time.perf_counter()
                    for message in messages:
                        if not message.error():
                            self.handle(message)
                    self.producer.poll(0)
                    self.batches_since += 1
                    if self.batches_since >= self.checkpoint_batches or \
                            time.monotonic() - self.last_checkpoint >= self.checkpoint_s:
                        self.checkpoint()
                    self.metrics.batch_seconds.observe(time.perf_counter() - started)
                    if self.slow_down_s:
                        time.sleep(self.slow_down_s)
                    self._backpressure(stopping)
        finally:
            self.consumer.close()  # revokes: snapshots and commits
            self.status.presence(self.producer, "down")
            self.producer.flush(30)
            log("worker_stopped")

    def _check_deliveries(self) -> None:
        if self.deliveries.failed is not None:
            log("delivery_failed", level="error", error=self.deliveries.failed)
            self.deliveries.check()

    def _backpressure(self, stopping) -> None:
        """While the output queue is over its bound, stop fetching (pause every assigned
        partition) and let the producer drain; the consumer's prefetch is bounded by
        BOUNDED_CONSUMER."""
        if len(self.producer) <= self.max_queued_output:
            return
        self.consumer.pause(self.consumer.assignment())
        self.pauses += 1
        self.metrics.paused.inc()
        try:
            while len(self.producer) > self.max_queued_output // 2 and not stopping.is_set():
                self.producer.flush(0.05)  # send now: lingering only holds the drain
                message = self.consumer.poll(0)  # serves rebalances while paused
                if message is not None and not message.error():
                    self.handle(message)  # fetched just before the pause took hold
        finally:
            self.consumer.resume(self.consumer.assignment())

    def observe(self) -> None:
        """Refresh the gauges: lag, partitions, live queries, the engines' counts."""
        self.metrics.observe_lag(self.consumer)
        self.metrics.partitions.set(len(self.parts))
        by_query: dict[str, list] = {}
        for state in self.parts.values():
            for engines, _ in state.routes.values():
                for engine in engines.engines:
                    by_query.setdefault(engine.checked.name, []).append(engine)
        names = {n for state in self.parts.values() for n in state.queries.live}
        self.metrics.queries.set(len(names))
        self.metrics.strings.set(sum(state.strings() for state in self.parts.values()))
        self.metrics.observe_engines(by_query)

    # ------------------------------------------------------------ rebalance

    def checkpoint(self, parts: list[int] | None = None) -> None:
        """Snapshot the partitions whose offset moved since their last snapshot (after the
        match frames they cover are flushed), then commit their offsets."""
        self.batches_since = 0
        self.last_checkpoint = time.monotonic()
        changed = [state for p, state in self.parts.items() if (parts is None or p in parts)
                   and state.offset >= 0 and state.offset != state.saved_offset]
        if not changed:
            return
        self.producer.flush(30)
        self._check_deliveries()
        for state in changed:
            self.metrics.strings_dropped.inc(state.compact_strings())
            produce(self.producer, self.topics.state, state.snapshot(),
                    key=str(state.partition).encode())
        if self.producer.flush(30):
            log("checkpoint_not_flushed", level="warning")
            return
        self._check_deliveries()
        for state in changed:
            state.saved_offset = state.offset
        try:
            self.consumer.commit(offsets=[TopicPartition(self.topics.keyed, s.partition,
                                                         s.offset) for s in changed],
                                 asynchronous=False)
        except Exception as e:  # the snapshot holds the offset; the commit is advisory
            log("commit_failed", level="warning", error=str(e))

    def _on_assign(self, consumer, partitions) -> None:
        started = time.perf_counter()
        snapshots = read_latest(self.settings, self.topics.state)
        for tp in partitions:
            state = PartitionState(tp.partition, self.topics.stream, self.registry,
                                   self.idle_timeout_ms)
            data = snapshots.get(str(tp.partition).encode())
            if data:
                state.restore(data)
            tp.offset = state.offset
            self.parts[tp.partition] = state
        consumer.assign(partitions)
        self._report_partitions()
        self.metrics.readiness.joined = True
        self.metrics.partitions.set(len(self.parts))
        log("partitions_assigned", partitions=[tp.partition for tp in partitions],
            offsets=[tp.offset for tp in partitions],
            restore_ms=round((time.perf_counter() - started) * 1000, 1))

    def _report_partitions(self) -> None:
        self.status.presence(self.producer, "up", partitions={
            str(p): state.queries.summary() for p, state in self.parts.items()})

    def _on_revoke(self, consumer, partitions) -> None:
        self._hand_over(consumer, partitions, commit=True)

    def _on_lost(self, consumer, partitions) -> None:
        self._hand_over(consumer, partitions, commit=False)

    def _hand_over(self, consumer, partitions, commit: bool) -> None:
        if commit:
            self.checkpoint([tp.partition for tp in partitions])
        for tp in partitions:
            self.parts.pop(tp.partition, None)
        consumer.unassign()
        self._report_partitions()
        self.metrics.partitions.set(len(self.parts))
        log("partitions_revoked", partitions=[tp.partition for tp in partitions])

    # ------------------------------------------------------------ frames

    def handle(self, message) -> None:
        state = self.parts.get(message.partition())
        if state is None:
            return
        frame = frames.frame_of(message)
        state.offset = message.offset() + 1
        if frame is None:
            return
        if frame.kind == frames.EVENTS:
            self._events(state, frame)
        elif frame.kind == frames.CONTROL:
            self._control(state, frame)
        upto = frame.get("upto")
        if upto is None or upto < state.upto:
            return
        if frame.kind == frames.END:
            if upto <= state.end_at:
                return  # a restarted splitter sent this end of input again
            state.end_at = upto
        self._complete(state, frame, upto)

    def _events(self, state: PartitionState, frame: Frame) -> None:
        route = frame.get("route", "")
        if route not in state.routes:
            return  # no live query reads this route (a change raced the frame)
        engines, encoder = state.routes[route]
        seen = state.seen.get(route, -1)
        last = frame.get("last")
        if last is not None and last <= seen:
            return  # sent again by a restarted splitter
        table = frames.decode_table(frame.payload)
        if table.num_rows and (frame.get("first") is None or frame.get("first") <= seen):
            table = table.filter(pc.greater(table.column("seq"), pa.scalar(seen, pa.int64())))
        if not table.num_rows:
            return
        state.seen[route] = table.column("seq")[-1].as_py()
        batch = encoder.from_arrow(table)
        self.metrics.events_in.inc(len(batch))
        state.out.extend(engines.process(batch))

    def _control(self, state: PartitionState, frame: Frame) -> None:
        """Apply a change the splitter checked (queries are parsed again from their
        canonical text by the same function, once per process: the registry's cache)."""
        change = frames.json_payload(frame)
        stream_changed = False
        if change["op"] == "set":
            before = self.registry.get(self.topics.stream)
            state.queries.load_streams(change.get("streams", []))
            stream_changed = self.registry.get(self.topics.stream) != before
            state.reconcile(change["queries"])
        elif change.get("kind") == STREAM:
            self.registry.learn(change["name"], change["text"], change["version"])
            stream_changed = change["name"] == self.topics.stream
        elif change["op"] == "remove":
            if change["name"] in state.queries.live:
                state.stop(change["name"])
                del state.queries.live[change["name"]]
        else:
            state.stop(change["name"])
            state.queries.live.pop(change["name"], None)
            state.queries.load(state.queries.to_json() + [
                {k: change[k] for k in ("name", "text", "index")}])
            state.start(state.queries.live[change["name"]])
        if stream_changed:
            state.new_schema()
        if "key" in change:
            self.status.outcome(self.producer, {k: change[k] for k in (
                "key", "offset", "kind", "op", "name")}, "applied", at=frame.get("at"),
                partition=state.partition, live=state.queries.summary())
        self._send(state, Frame(frames.CONTROL, {**frame.headers, "part": state.partition},
                                frame.payload))

    def _complete(self, state: PartitionState, frame: Frame, upto: int) -> None:
        ts = frame.get("ts")
        for engines, _ in state.routes.values():
            if ts is not None and (state.ts is None or ts > state.ts):
                state.out.extend(engines.punctuate(ts))
        if ts is not None and (state.ts is None or ts > state.ts):
            state.ts = ts
        kind = frames.MATCHES
        if frame.kind == frames.END:
            for engines, _ in state.routes.values():
                state.out.extend(engines.flush())
            state.restart_engines()
            state.ts = None
            kind = frames.END
        state.upto = upto
        self._dead_letters(state)
        out, state.out = state.out, []
        self.metrics.events_out.inc(len(out))
        self._send(state, Frame(kind, {"part": state.partition, "upto": upto, "ts": ts},
                                orjson.dumps(out) if out else b""))

    def _dead_letters(self, state: PartitionState) -> None:
        for engines, _ in state.routes.values():
            rejected = engines.take_dead_letters()
            for q, seq, reason in rejected:
                produce(self.producer, self.topics.dead_letters, orjson.dumps(
                    {"source": f"query {q.name}", "position": seq, "reason": reason,
                     "raw": None}))
            self.metrics.dead_letters.inc(len(rejected))

    def _send(self, state: PartitionState, frame: Frame) -> None:
        produce(self.producer, self.topics.matches, frame.payload, partition=state.partition,
                headers=frame.kafka_headers())
