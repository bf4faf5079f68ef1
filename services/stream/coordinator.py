"""The coordinator: the Kafka shell of the `Merger` (services/stream/merge.py, the
release rules), one per shard.

It reads every partition of the match topic (one per keyed partition, in order) and feeds
the merger, which releases each composite event once it is final.

Final composite events go out in `cep_core.composite.sort_key` order (with the query's
index in the live query set) to their query's INTO topic, one JSON per message, key = the
composite's key as JSON. Content and order do not depend on the number of workers.

Effectively once: each INTO topic is written in sort-key order, so the last key released
to it is its position; a composite at or below it is a repeat (a worker replaying from its
checkpoint) and is dropped. Every `checkpoint_ms` the coordinator flushes its output, then
writes its whole merge state (match-topic offsets, pending composites, per-partition
watermarks, the released position and delivered offset of each INTO topic) to the state
topic under the key `coordinator` (even generations; odd ones under `coordinator.alt`: the
last two survive compaction, services/stream/checkpoint.py). A restarted coordinator loads
the newest good one (a damaged one, or one whose offsets the broker cannot have given, is
logged and the one before it loaded), reads each INTO topic
after the checkpointed offset for records it wrote later (header `cep.pipeline`), moves the
released position past them, and resumes the match topic at the checkpointed offsets. No
Kafka transactions: tansu delivers aborted records (docs/broker.md).

Shards (`Topics.shards`, docs/scaling.md): shard k of S reads its own match topic
(`Topics.matches_of(k)`), to which the workers send the composites of the INTO topics
`Topics.shard_of` gives k, and every pulse, end and control frame. Each INTO topic thus has
one writer, so the order and no-repeat reasoning above holds per shard unchanged; each shard
checkpoints under its own key (`coordinator.<k>`). Shard 0 alone reports applied changes and
live queries; each shard reports its end of input (`shard` in the record).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cep_core import snapshot_format
from cep_service.stream import frames
# Deliberately like services/stream/worker.py's: an import list of the checkpoint helpers both
# shells use, not code
from cep_service.stream.checkpoint import (
    PIPELINE_HEADER,
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
    written_since,
)
from cep_core.control_message import STREAM
from cep_core.control_ops import Outcome
from cep_core.schema import SchemaRegistry
from cep_service.stream.control import StatusWriter, learned_live
from cep_service.stream.kafka import (BOUNDED_CONSUMER, BOUNDED_PRODUCER, Deliveries, KafkaSettings,
                                      Topics, consume_batch, ensure_topics, produce)
from cep_service.stream.merge import Merger
from cep_service.stream.status import Presence, StatusEvent
from cep_service.stream.metrics import Metrics
from cep_service.stream.serve import log, profiled


STATE_KEY = b"coordinator"  # the checkpoint key with one shard (Topics.coordinator_name)


class Coordinator:
    def __init__(self, settings: KafkaSettings, topics: Topics, partitions: int = 4,
                 registry: SchemaRegistry | None = None, metrics: Metrics | None = None,
                 on_output: Callable[[list[tuple[str, dict]]], object] | None = None,
                 checkpoint_ms: int | None = None, max_pending: int = 200_000,
                 shard: int = 0) -> None:
        if not 0 <= shard < topics.shards:
            raise ValueError(f"shard {shard} of {topics.shards}: not in 0..{topics.shards - 1}")
        self.settings = settings
        self.topics = topics
        self.partitions = partitions
        self.shard = shard
        self.name = topics.coordinator_name(shard)
        self.matches = topics.matches_of(shard)
        self.state_key = self.name.encode()
        self.merger = Merger(partitions, topics.stream, registry)
        self.status = StatusWriter(topics.status, "coordinator")
        self.metrics = metrics or Metrics("coordinator", 0)
        self.metrics.identify(self.status.service)
        self.metrics.shard.labels(str(topics.shards)).set(shard)
        self.on_output = on_output
        self.reported_ends = 0
        self.lived: list[dict] = []  # every query change once all partitions switched
        # backpressure: beyond this many composite events waiting to be final, partitions
        # ahead of the slowest pause until it catches up (the slowest is never paused)
        self.max_pending = max_pending
        self.paused: set[int] = set()
        self.pauses = 0
        self.checkpoint_s = (checkpoint_ms or int(os.environ.get("CEP_CHECKPOINT_MS",
                                                                 1000))) / 1000
        self.pipeline = topics.group("coordinator")
        self.offsets = [OFFSET_BEGINNING] * partitions  # next match-topic offset per partition
        self.delivered: dict[str, int] = {}  # output topic -> offset of its last record
        self.scanned: set[str] = set()  # outputs whose released position is known
        self.saved: list[int] | None = None  # offsets of the last checkpoint
        self.generation = -1  # of the last checkpoint written or loaded (-1: none)
        # (topic, partition)s -> their watermarks on the broker, to check restored offsets
        # with (checkpoint.broker_watermarks, set by `run`; None: not checked)
        self.watermarks: AskWatermarks | None = None
        self.deliveries = Deliveries(also=self._delivered)

    def _delivered(self, err: Any, message: Any) -> None:
        if err is None and message.topic() in self.scanned:
            self.delivered[message.topic()] = max(self.delivered.get(message.topic(), -1),
                                                  message.offset())

    def restore(self) -> None:
        """Load the newest good checkpoint, if any: of the last two, a damaged one,
        another shard's or one whose offsets the broker cannot have given is refused and
        the one before it loaded; SnapshotError when every one is refused."""
        started = time.perf_counter()
        located: dict = {}
        saved = saved_checkpoints(read_latest(self.settings, self.topics.state, located),
                                  self.state_key, self.topics.state, located)
        marks = None if self.watermarks is None else AskOnce(self.watermarks)
        found = restore_newest("coordinator", saved, lambda one: self._loaded(one, marks),
                               log, stream=self.topics.stream, shard=self.shard)
        if found is not None:
            (envelope, state, merger), _ = found
            self.merger = merger
            self.offsets = state["offsets"]
            self.delivered = state["delivered"]
            self.reported_ends = state["reported_ends"]
            self.saved = list(self.offsets)
            self.generation = envelope.generation if envelope.generation is not None else 0
            if not envelope.checked:
                log("checkpoint_unchecked", level="warning", kind="coordinator",
                    format=envelope.version, key=self.state_key.decode())
        self._scan_outputs()
        log("coordinator_restored", shard=self.shard, checkpoint=found is not None,
            generation=self.generation, offsets=self.offsets,
            restore_ms=round((time.perf_counter() - started) * 1000, 1))

    def _loaded(self, one: Saved, marks: AskWatermarks | None) -> tuple:
        """(envelope, state, merger) of a checkpoint whose offsets are plausible."""
        envelope, state = snapshot_format.read_json(
            "coordinator", one.value, one.where(), stream=self.topics.stream, shard=self.shard)
        # (the INTO topics' delivered offsets are not checked: such a topic may have
        # several partitions, its offsets then mixed, and its retention is the user's)
        check_offsets(marks, [Offset(self.matches, p, o, name="match-topic offset")
                              for p, o in enumerate(state["offsets"]) if o >= 0],
                      one.where())
        merger = Merger(self.partitions, self.topics.stream, self.merger.registry)
        merger.load_state(state["merger"])
        return envelope, state, merger

    def _scan_outputs(self) -> None:
        """Find the released position of outputs not scanned yet: what this pipeline wrote
        to them after the last checkpoint."""
        mine = {q.output for q in self.merger.queries.values()
                if self.topics.shard_of(q.output) == self.shard}
        for output in mine - self.scanned:
            self._ensure_output(output)
            found = written_since(self.settings, output, self.delivered.get(output, -1),
                                  self.pipeline)
            for message in found:
                index = int(dict(message.headers())["cep.index"])
                self.merger.mark_released(output, orjson.loads(message.value()), index)
                self.delivered[output] = message.offset()
            self.scanned.add(output)

    def _ensure_output(self, output: str) -> None:
        """An INTO topic that does not exist yet is made with one partition (left to the
        broker's auto-creation it gets the broker's default: 4 on tansu). A restart reads
        back partition 0 alone (`written_since`), so a topic of several partitions loses the
        no-repeat guarantee for composites released since the last checkpoint: warn."""
        count = ensure_topics(self.settings, {output: 1}, any_count=(output,))[output]
        if count > 1:
            log("into_topic_partitions", level="warning", topic=output, partitions=count,
                detail="after a coordinator restart, composites released since its last "
                "checkpoint to partitions other than 0 may be written again")

    def checkpoint(self, producer: Any) -> None:
        if self.offsets == self.saved:
            return
        producer.flush(30)
        if self.deliveries.failed is not None:  # stop before the checkpoint skips them
            log("delivery_failed", level="error", error=self.deliveries.failed)
            self.deliveries.check()
        state = {"offsets": self.offsets, "merger": self.merger.state(),
                 "delivered": self.delivered, "reported_ends": self.reported_ends}
        generation = self.generation + 1
        produce(producer, self.topics.state, snapshot_format.pack_json(
            "coordinator", state, stream=self.topics.stream, shard=self.shard,
            generation=generation), key=slot_key(self.state_key, generation))
        if producer.flush(30):
            log("checkpoint_not_flushed", level="warning")
            return
        self.saved = list(self.offsets)
        self.generation = generation
        self.metrics.checkpointed(generation)

    def run(self, stopping: threading.Event) -> None:
        producer = self.settings.producer(on_delivery=self.deliveries, **BOUNDED_PRODUCER)
        # the control topic's streams before the checkpoint's queries that read them
        self.merger.registry = learned_live(self.settings, self.topics.control,
                                            self.topics.stream, self.merger.registry).registry
        self.watermarks = functools.partial(broker_watermarks, self.settings)
        self.restore()
        self.status.presence(producer, Presence.UP, live=self.merger.summary())
        consumer = self.settings.consumer(self.topics.group(self.name), **BOUNDED_CONSUMER)
        consumer.assign([TopicPartition(self.matches, p, self.offsets[p])
                         for p in range(self.partitions)])
        log("coordinator_started", stream=self.topics.stream, partitions=self.partitions,
            shard=self.shard, shards=self.topics.shards)
        last_lag = 0.0
        last_checkpoint = time.monotonic()
        try:
            with profiled("coordinator"):
                while not stopping.is_set():
                    messages = consume_batch(consumer, 5000, 0.05)
                    if time.monotonic() - last_lag > 1:
                        self.metrics.observe_lag(consumer)
                        self.metrics.queries.set(len(self.merger.queries))
                        self.metrics.observe_merger(self.merger)
                        last_lag = time.monotonic()
                    if time.monotonic() - last_checkpoint > self.checkpoint_s:
                        self.checkpoint(producer)
                        last_checkpoint = time.monotonic()
                    if not messages:
                        continue
                    started = time.perf_counter()
                    self.handle(messages, producer)
                    self.metrics.batch_seconds.observe(time.perf_counter() - started)
                    self._backpressure(consumer)
            self.checkpoint(producer)
        finally:
            self.status.presence(producer, Presence.DOWN)
            producer.flush(30)
            consumer.close()
            log("coordinator_stopped", repeats_dropped=self.merger.repeats)

    def pending(self) -> int:
        return sum(len(heap) for heap in self.merger.pending.values())

    def _backpressure(self, consumer: Any) -> None:
        """Pause the partitions ahead of the slowest while too many composite events wait;
        resume those that fell back to the slowest, and all once half the bound is left."""
        low = min(self.merger.upto)
        waiting = self.pending()
        behind = set(self.paused) if waiting <= self.max_pending // 2 else \
            {p for p in self.paused if self.merger.upto[p] <= low}
        if behind:
            consumer.resume([TopicPartition(self.matches, p) for p in behind])
            self.paused -= behind
        if waiting > self.max_pending:
            ahead = {p for p, upto in enumerate(self.merger.upto) if upto > low} - self.paused
            if ahead:
                consumer.pause([TopicPartition(self.matches, p) for p in ahead])
                self.paused |= ahead
                self.pauses += 1
                self.metrics.paused.inc()

    def handle(self, messages: list[Any], producer: Any) -> None:
        received = self.merger.received
        for message in messages:
            if message.error():
                continue
            self.offsets[message.partition()] = message.offset() + 1
            frame = frames.frame_of(message)
            if frame is not None:
                self.merger.feed(frame)
        self._scan_outputs()
        released = self.merger.release()
        for output, composite in released:
            index = self.merger.queries[composite["query"]].index
            produce(producer, output, orjson.dumps(composite),
                    key=orjson.dumps(composite.get("key")),
                    headers=[(PIPELINE_HEADER, self.pipeline.encode()),
                             ("cep.index", str(index).encode())])
        if self.on_output is not None and released:
            self.on_output(released)
        for event in self.merger.live_events:
            self.lived.append(event)
            changes = event.pop("changes")
            if self.shard != 0:  # every shard sees every change: one of them says so
                continue
            if event["kind"] != STREAM:
                log("query_live", **event)
                produce(producer, self.topics.status, orjson.dumps(
                    {"event": StatusEvent.QUERY_LIVE, **event}))
            for change in changes:
                self.status.outcome(producer, change, Outcome.APPLIED, at=event["at"],
                                    partitions=self.partitions,
                                    latency_ms=event["latency_ms"], live=self.merger.summary())
        self.merger.live_events.clear()
        shard: dict[str, Any] = {"shard": self.shard, "shards": self.topics.shards} \
            if self.topics.shards > 1 else {}
        for end in self.merger.ended[self.reported_ends:]:
            log("end_of_input_released", upto=end, **shard)
            produce(producer, self.topics.status, orjson.dumps(
                {"event": StatusEvent.END_OF_INPUT, "upto": end, **shard}))
        ended = len(self.merger.ended) != self.reported_ends
        self.reported_ends = len(self.merger.ended)
        self.metrics.events_in.inc(self.merger.received - received)
        self.metrics.events_out.inc(len(released))
        if ended:  # the end's composite events and status now, not after the linger
            producer.flush(30)
        producer.poll(0)
