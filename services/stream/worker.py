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
offsets committed. Snapshots alternate between two keys (`p` and `p.alt`: the last two
survive compaction, services/stream/checkpoint.py). On assign, the newest good snapshot is
restored (a damaged one, or one whose offset the broker cannot have given, is logged and
the one before it restored) and consumption resumes at its offset, so a killed worker's
partitions replay from there: the replay sends the same
composite events again (same seqs), and the coordinator drops what it has released.
Events at or below the last seq a partition processed on a route (a restarted splitter
sends its last batches again) are dropped, and so is a repeated end of input.

All of that but Kafka is the partition core, `PartitionState` (services/stream/partition.py):
this shell consumes, assigns, checkpoints and produces what each partition sends.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any

from confluent_kafka import TopicPartition

from cep_core.schema import SchemaRegistry
from cep_service.stream import frames
# Deliberately like services/stream/coordinator.py's: an import list of the checkpoint helpers
# both shells use, not code
from cep_service.stream.checkpoint import (
    AskOnce,
    AskWatermarks,
    Offset,
    Saved,
    broker_watermarks,
    check_offsets,
    read_latest,
    restore_newest,
    saved_checkpoints,
    slot_key,
)
from cep_service.stream.control import StatusWriter, learned_live
from cep_service.stream.status import Presence
from cep_service.stream.kafka import (
    BOUNDED_CONSUMER,
    BOUNDED_PRODUCER,
    Deliveries,
    KafkaSettings,
    Topics,
    consume_batch,
    produce,
)
from cep_service.stream.metrics import Metrics, engines_by_query
from cep_service.stream.partition import PartitionState
from cep_service.stream.serve import log, profiled


class Worker:
    def __init__(self, settings: KafkaSettings, topics: Topics,
                 registry: SchemaRegistry | None = None,
                 batch_size: int = 2000, metrics: Metrics | None = None,
                 idle_timeout_ms: int | None = 3_600_000, max_queued_output: int = 20000,
                 slow_down_s: float = 0.0,
                 checkpoint_ms: int | None = None,
                 checkpoint_batches: int | None = None) -> None:
        self.settings = settings
        self.topics = topics
        self.registry = registry or SchemaRegistry()
        self.status = StatusWriter(topics.status, "worker")
        self.batch_size = batch_size
        self.metrics = metrics or Metrics("worker", 0)
        self.metrics.identify(self.status.service)
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
        self.ended = False  # an end of input was handled in this batch
        self.deliveries = Deliveries()
        # (topic, partition)s -> their watermarks on the broker, to check restored offsets
        # with (checkpoint.broker_watermarks, set by `run`; None: not checked)
        self.watermarks: AskWatermarks | None = None

    def run(self, stopping: threading.Event) -> None:
        # the control topic's streams, and its queries checked once for all partitions
        self.registry = learned_live(self.settings, self.topics.control, self.topics.stream,
                                     self.registry).registry
        # a match frame or snapshot that failed to reach the broker stops the worker before
        # its checkpoint commits past it: the restart runs again from the last checkpoint
        self.producer = self.settings.producer(on_delivery=self.deliveries, **BOUNDED_PRODUCER)
        self.watermarks = functools.partial(broker_watermarks, self.settings)
        self.status.presence(self.producer, Presence.UP)
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
                    if self.ended:  # nothing more to batch the end's frames with: send now
                        self.producer.flush(30)
                        self.ended = False
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
            self.status.presence(self.producer, Presence.DOWN)
            self.producer.flush(30)
            log("worker_stopped")

    def _check_deliveries(self) -> None:
        if self.deliveries.failed is not None:
            log("delivery_failed", level="error", error=self.deliveries.failed)
            self.deliveries.check()

    def _backpressure(self, stopping: threading.Event) -> None:
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
        names = {n for state in self.parts.values() for n in state.queries.live}
        self.metrics.queries.set(len(names))
        self.metrics.strings.set(sum(state.strings() for state in self.parts.values()))
        self.metrics.observe_engines(engines_by_query(self.parts.values()))

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
            generation = state.generation + 1
            produce(self.producer, self.topics.state, state.snapshot(generation),
                    key=slot_key(str(state.partition).encode(), generation))
        if self.producer.flush(30):
            log("checkpoint_not_flushed", level="warning")
            return
        self._check_deliveries()
        for state in changed:
            state.saved_offset = state.offset
            state.generation += 1
        self.metrics.checkpointed(max(state.generation for state in changed))
        try:
            self.consumer.commit(offsets=[TopicPartition(self.topics.keyed, s.partition,
                                                         s.offset) for s in changed],
                                 asynchronous=False)
        except Exception as e:  # the snapshot holds the offset; the commit is advisory
            log("commit_failed", level="warning", error=str(e))

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        started = time.perf_counter()
        self.parts.update(self.restore([tp.partition for tp in partitions]))
        for tp in partitions:
            tp.offset = self.parts[tp.partition].offset
        consumer.assign(partitions)
        self._report_partitions()
        self.metrics.readiness.joined = True
        self.metrics.partitions.set(len(self.parts))
        log("partitions_assigned", partitions=[tp.partition for tp in partitions],
            offsets=[tp.offset for tp in partitions],
            restore_ms=round((time.perf_counter() - started) * 1000, 1))

    def restore(self, partitions: list[int]) -> dict[int, PartitionState]:
        """The state of each partition from its newest good snapshot on the state topic
        (fresh where there is none): of the last two, a damaged one, another partition's
        or one whose keyed offset the broker cannot have given is refused and the one
        before it restored; SnapshotError when every one is refused."""
        located: dict = {}
        snapshots = read_latest(self.settings, self.topics.state, located)
        marks = None if self.watermarks is None else \
            AskOnce(self.watermarks, [(self.topics.keyed, p) for p in partitions])
        out = {}
        for p in partitions:
            saved = saved_checkpoints(snapshots, str(p).encode(), self.topics.state, located)

            def restored(one: Saved, p: int = p) -> PartitionState:
                state = self._new_state(p)
                envelope = state.restore(one.value, one.where())
                if not envelope.checked:
                    log("checkpoint_unchecked", level="warning", kind="partition",
                        partition=p, format=envelope.version, key=one.key.decode())
                check_offsets(marks, [Offset(self.topics.keyed, p, state.offset,
                                             name="keyed offset")], one.where())
                return state

            found = restore_newest("partition", saved, restored, log,
                                   stream=self.topics.stream, partition=p)
            out[p] = found[0] if found else self._new_state(p)
        return out

    def _new_state(self, partition: int) -> PartitionState:
        return PartitionState(partition, self.topics.stream, self.registry,
                              self.idle_timeout_ms, self.topics, self.metrics, self.status)

    def _report_partitions(self) -> None:
        self.status.presence(self.producer, Presence.UP, partitions={
            str(p): state.queries.summary() for p, state in self.parts.items()})

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._hand_over(consumer, partitions, commit=True)

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._hand_over(consumer, partitions, commit=False)

    def _hand_over(self, consumer: Any, partitions: list[TopicPartition], commit: bool) -> None:
        if commit:
            self.checkpoint([tp.partition for tp in partitions])
        for tp in partitions:
            self.parts.pop(tp.partition, None)
        consumer.unassign()
        self._report_partitions()
        self.metrics.partitions.set(len(self.parts))
        log("partitions_revoked", partitions=[tp.partition for tp in partitions])

    # ------------------------------------------------------------ frames

    def handle(self, message: Any) -> None:
        state = self.parts.get(message.partition())
        if state is None:
            return
        end_at, live_sets = state.end_at, state.live_sets
        state.handle(frames.frame_of(message), message.offset())
        state.sent.to(self.producer)
        self.ended = self.ended or state.end_at != end_at
        if state.live_sets != live_sets:  # the splitter's start-up queries: say they are live
            self._report_partitions()

