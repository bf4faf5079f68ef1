"""The chained pipeline: splitter, workers and coordinator of one stream in one process,
with Kafka only at the edges (`cep serve chained`, the default of `cep serve all`).

`Chained` is the splitter (services/stream/splitter.py: the same consumer, control
handling, kernel warming, Faust app and pulses) whose keyed frames, instead of going to
the keyed topic, go straight to the partition cores (services/stream/partition.py, one
per keyed partition, as the workers run them), whose match frames go straight to the
coordinators' merge (services/stream/coordinator.py `Coordinator.handle`, one per shard),
which writes the composite events to the INTO topics. Dead letters, late events, status
records and control write-backs go to their topics as in the distributed pipeline. No
internal topic is read (the state topic holds the checkpoints; the keyed topic only each
step's consumption order, with several source partitions), so a composite event is out in
the step that took its last event.

Checkpoints are one consistent cut, taken between two steps: every partition core's
snapshot (key `chained.<p>`), every coordinator shard's merge state (`chained.coordinator`,
`chained.coordinator.<k>`), then the seq state and source offsets (`chained`, a splitter
checkpoint naming the cut), all of one generation, written in that order to the
one-partition state topic; as every service's, even generations under the key, odd ones
under `<key>.alt` (services/stream/checkpoint.py). A restart restores the newest cut whose
every piece is good and of its generation (else the one before it), reads each INTO topic
after the cut's delivered offsets for what it wrote since (`cep.pipeline` header: the
coordinator's dedupe), and consumes the source again from the cut's offsets: replayed
steps give the same seqs and the composite events already out are dropped, so the INTO
topics get each one once. With one source partition the consumption order is the
partition's; with several, each step's order is logged on the keyed topic (an empty
pulse with the splitter's `order` header, acknowledged before anything the step sends)
and a restart takes the logged steps again as the splitter does
(services/stream/splitter_order.py).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING

from cep_core import snapshot_format
from cep_core.schema import SchemaRegistry
from cep_core.snapshot_format import Envelope, SnapshotError
from cep_service.stream import frames
# Deliberately like services/stream/splitter.py's: an import list of the checkpoint helpers both
# use, not code
from cep_service.stream.checkpoint import (
    PIPELINE_HEADER,
    AskOnce,
    AskWatermarks,
    Offset,
    Saved,
    check_offsets,
    logged_steps,
    read_latest,
    restore_newest,
    saved_checkpoints,
    slot_key,
)
from cep_service.stream.control import StatusWriter
from cep_service.stream.status import Presence
from cep_service.stream.coordinator import Coordinator
from cep_service.stream.merge import Merger
from cep_service.stream.kafka import KafkaSettings, produce
from cep_service.stream.topics import Topics
from cep_service.stream.metrics import Metrics, counted, engines_by_query
from cep_service.stream.partition import PartitionState
from cep_service.stream.reorder_checkpoint import saved_state
from cep_service.stream.routing import message
from cep_service.stream.serve import log
from cep_service.stream.splitter import Splitter
from cep_service.stream.splitter_order import ORDER_HEADER, LoggedOrder

CHAINED_KEY = b"chained"  # the cut's seq state and source offsets (a splitter checkpoint)
STAGE_HEADER = "cep.taken_ms"  # on INTO records: when the step that released them began


# The clients at the edges are tuned for latency, not for the broker's batches: the chain
# makes one produce request per 5 ms at most (tansu's 200 ms default linger is there to
# bound the batches of every internal hop, docs/broker.md; the chain has none), and a
# fetch of the source waits at most 20 ms for records. CEP_KAFKA_LINGER_MS and
# CEP_KAFKA_FETCH_WAIT_MAX_MS (or --kafka-config) still win.
EDGE_PRODUCER = {"linger.ms": 5}
EDGE_CONSUMER = {"fetch.wait.max.ms": 20}


@dataclasses.dataclass
class EdgeSettings(KafkaSettings):
    """KafkaSettings whose clients take EDGE_PRODUCER and EDGE_CONSUMER under the user's."""

    def producer_config(self, **overrides: Any) -> dict:
        return {**super().producer_config(), **_unset(EDGE_PRODUCER, self.extra), **overrides}

    def consumer_config(self, group: str | None = None, **overrides: Any) -> dict:
        return {**super().consumer_config(group), **_unset(EDGE_CONSUMER, self.extra),
                **overrides}


def _unset(defaults: dict, extra: dict) -> dict:
    return {k: v for k, v in defaults.items() if k not in extra}


def edge_settings(settings: KafkaSettings) -> EdgeSettings:
    return EdgeSettings(**{f.name: getattr(settings, f.name)
                           for f in dataclasses.fields(settings)})


def part_key(partition: int) -> bytes:
    return CHAINED_KEY + b".%d" % partition


def merge_key(name: str) -> bytes:
    return CHAINED_KEY + b"." + name.encode()


class IntoProducer:
    """The producer the coordinators write with: the chain's, and INTO records get the
    time their step began (STAGE_HEADER, for `cep bench e2e`'s stages)."""

    def __init__(self, chained: Chained):
        self.chained = chained
        self.taken_ms = b"0"

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                partition: int | None = None, headers: Any = None) -> None:
        if headers and headers[0][0] == PIPELINE_HEADER:
            headers = [*headers, (STAGE_HEADER, self.taken_ms)]
        produce(self.chained.producer, topic, value, key=key, partition=partition,
                headers=headers)

    def flush(self, timeout_s: float = 30) -> int:
        return self.chained.producer.flush(timeout_s)

    def poll(self, timeout_s: float = 0) -> int:
        return self.chained.producer.poll(timeout_s)


class Chained(Splitter):
    """The whole pipeline of one stream in one process (see the module's docstring)."""

    def __init__(self, settings: KafkaSettings, topics: Topics, partitions: int = 4,
                 pulse_ms: int = 100, registry: SchemaRegistry | None = None,
                 metrics: Metrics | None = None,
                 idle_timeout_ms: int | None = 3_600_000, **splitter_options: Any) -> None:
        super().__init__(edge_settings(settings), topics, partitions, pulse_ms,
                         registry=registry, metrics=metrics, **splitter_options)
        self.idle_timeout_ms = idle_timeout_ms
        self.worker_metrics = Metrics("worker", 0)
        self.worker_status = StatusWriter(topics.status, "worker")
        self._make_cores()
        self.metrics.stages(self.status_writer.service, {
            "routing": [self.status_writer.service],
            "partitions": [self.worker_status.service],
            "merge": [c.status.service for c in self.coordinators]}, self.stage_counts)
        self.edge = IntoProducer(self)
        self.logged_order: bytes | None = None  # the last step order logged (_log_order)
        self.core.encode_frames = False  # keyed frames hold their tables: no IPC in memory

    # ------------------------------------------------------------ the cores

    def _new_part(self, partition: int) -> PartitionState:
        return PartitionState(partition, self.topics.stream, self.queries.registry,
                              self.idle_timeout_ms, self.topics, self.worker_metrics,
                              self.worker_status)

    def _make_cores(self) -> None:
        self.parts = [self._new_part(p) for p in range(self.partitions)]
        self.coordinators = [
            Coordinator(self.settings, self.topics, self.partitions, self.queries.registry,
                        Metrics("coordinator", 0), shard=k)
            for k in range(self.topics.shards)]
        self.by_matches = {self.topics.matches_of(k): c
                           for k, c in enumerate(self.coordinators)}

    def take(self, messages: list) -> None:
        self.edge.taken_ms = str(int(time.time() * 1000)).encode()
        super().take(messages)

    def pulse_if_due(self) -> bool:
        self.edge.taken_ms = str(int(time.time() * 1000)).encode()
        return super().pulse_if_due()

    def _forward(self) -> None:
        """Keyed frames to their partition cores, their match frames to the merge; the
        rest (dead letters, late events, status) to the producer."""
        if not len(self.core.out):
            return
        records = self.core.out.take()
        self._log_order(records)
        matches: dict[str, list] = {}
        for topic, value, key, partition, headers in records:
            if topic != self.topics.keyed:
                produce(self.producer, topic, value, key=key, partition=partition,
                        headers=headers)
                continue
            state = self.parts[partition]
            fields = frames.parse_headers(headers)
            state.handle(frames.Frame(fields.pop("kind"), fields, value), max(state.offset, 0))
            self._sent(state, matches)
        self._merge(matches)
        self.producer.poll(0)

    def _log_order(self, records: list[tuple]) -> None:
        """With several source partitions, a step's consumption order goes to the keyed
        topic (an empty pulse frame with its `order` header, services/stream/splitter_order.py)
        and is acknowledged before anything the step sends: a restart takes the logged
        steps again as they were, so every record keeps its seq (one source partition needs
        none: its order is the partition's)."""
        if len(self.source_partitions) < 2:
            return
        logged = self.logged_order
        for topic, *_, headers in records:  # one take may hold several steps
            for name, value in headers or () if topic == self.topics.keyed else ():
                if name == ORDER_HEADER and value != self.logged_order:
                    self.logged_order = value
                    produce(self.producer, self.topics.keyed, b"", partition=0, headers=[
                        ("kind", frames.PULSE.encode()), (ORDER_HEADER, value)])
        if self.logged_order != logged and self.producer.flush(30):
            raise RuntimeError("the consumption order of a step was not acknowledged")

    def _sent(self, state: PartitionState, matches: dict[str, list]) -> None:
        """What a partition core sent: match frames to `matches` (per match topic, at the
        next offsets of their partition), the rest to the producer."""
        for topic, value, key, partition, headers in state.sent.take():
            coordinator = self.by_matches.get(topic)
            if coordinator is None:
                produce(self.producer, topic, value, key=key, partition=partition,
                        headers=headers)
                continue
            found = matches.setdefault(topic, [])
            at = max(coordinator.offsets[partition], 0) + \
                sum(1 for m in found if m.partition() == partition)
            found.append(message(partition, at, value, headers))

    def _merge(self, matches: dict[str, list]) -> None:
        for topic, found in matches.items():
            self.by_matches[topic].handle(found, self.edge)

    def _drain_parts(self) -> None:
        """What the partition cores sent outside a step (a restore's or a snapshot's
        status records)."""
        matches: dict[str, list] = {}
        for state in self.parts:
            self._sent(state, matches)
        self._merge(matches)

    def _delivered(self, err: Any, message_: Any) -> None:
        super()._delivered(err, message_)
        for coordinator in self.coordinators:
            coordinator.deliveries(err, message_)

    def observe(self) -> None:
        """The splitter's gauges, and on the same endpoint what its cores would export as
        workers and coordinators (partial matches, state bytes, the merge: the console's
        pipeline view, docs/console.md); each stage's counts are read when scraped
        (stage_counts) and the cut's checkpoint when written (commit)."""
        super().observe()
        self.metrics.observe_engines(engines_by_query(self.parts))
        self.metrics.observe_merger(*(c.merger for c in self.coordinators))

    def stage_counts(self) -> dict[str, tuple[float, float]]:
        """Events in and out of each stage (the counters its core keeps: the splitter's,
        the partition cores' shared ones, the coordinator shards' summed), read when the
        endpoint is scraped."""
        merge = [(counted(c.metrics.events_in), counted(c.metrics.events_out))
                 for c in self.coordinators]
        return {"routing": (counted(self.metrics.events_in), counted(self.metrics.events_out)),
                "partitions": (counted(self.worker_metrics.events_in),
                               counted(self.worker_metrics.events_out)),
                "merge": (sum(m[0] for m in merge), sum(m[1] for m in merge))}

    # ------------------------------------------------------------ start and stop

    def start(self, stopping: threading.Event | None = None) -> bool:
        if not super().start(stopping):
            return False
        for coordinator in self.coordinators:
            coordinator.status.presence(self.producer, Presence.UP,
                                        live=coordinator.merger.summary())
        self._report_partitions()
        log("chained_started", stream=self.topics.stream, partitions=self.partitions,
            shards=self.topics.shards, generation=self.generation)
        return True

    def _report_partitions(self) -> None:
        self.worker_status.presence(self.producer, Presence.UP, partitions={
            str(s.partition): s.queries.summary() for s in self.parts})

    def close(self) -> None:
        if self.started:
            for coordinator in self.coordinators:
                coordinator.status.presence(self.producer, Presence.DOWN)
            self.worker_status.presence(self.producer, Presence.DOWN)
        super().close()

    # ------------------------------------------------------------ checkpoints

    def _resume_at(self, tps: list) -> list:
        """Where each source partition resumes: at the newest good cut (every core put
        back from it), else at the beginning with fresh cores."""
        located: dict = {}
        latest = read_latest(self.settings, self.topics.state, located)
        saved = saved_checkpoints(latest, CHAINED_KEY, self.topics.state, located)
        marks = None if self.watermarks is None else AskOnce(self.watermarks)
        found = restore_newest("splitter", saved,
                               lambda one: self._cut(one, latest, located, marks), log,
                               stream=self.topics.stream)
        offsets: dict[int, int] = {}
        if found is not None:
            (envelope, state, parts, merges), _ = found
            offsets = {int(p): o for p, o in state["offsets"].items()}
            self.load(envelope, state)
            self.parts = parts
            for coordinator, (merger, merge) in zip(self.coordinators, merges):
                coordinator.merger = merger
                coordinator.offsets = merge["offsets"]
                coordinator.delivered = merge["delivered"]
                coordinator.reported_ends = merge["reported_ends"]
                coordinator.saved = list(coordinator.offsets)
                coordinator.generation = self.generation
        for tp in tps:
            tp.offset = offsets.get(tp.partition, OFFSET_BEGINNING)
        for coordinator in self.coordinators:
            coordinator._scan_outputs()
        self.logged = LoggedOrder(logged_steps(
            self.settings, self.topics.keyed, self.partitions, self.keyed_next, self.steps)
            if len(tps) > 1 else [])
        if self.logged.holding:
            log("splitter_replaying", steps=len(self.logged.pending), after_step=self.steps)
        self._drain_parts()  # what a restore reports (failed queries)
        log("chained_restored", checkpoint=found is not None, generation=self.generation,
            offsets={str(p): o for p, o in offsets.items()})
        return tps

    def _cut(self, one: Saved, latest: dict, located: dict,
             marks: AskWatermarks | None) -> tuple:
        """(envelope, seq state, partition cores, [(merger, state)] per shard) of a cut
        whose every piece is good, of its generation, and whose offsets are plausible;
        SnapshotError naming the piece otherwise."""
        envelope, state = snapshot_format.read_json("splitter", one.value, one.where(),
                                                    stream=self.topics.stream)
        shape = state.get("chained") or {}
        if shape.get("partitions") != self.partitions or \
                shape.get("shards") != self.topics.shards:
            raise SnapshotError(
                f"{one.where()}: a cut of {shape.get('partitions')} partitions and "
                f"{shape.get('shards')} coordinator shards; this pipeline has "
                f"{self.partitions} and {self.topics.shards} (run it with those)")
        check_offsets(marks, [Offset(self.topics.source, int(p), o, name="source offset")
                              for p, o in state["offsets"].items() if o >= 0]
                      + [Offset(self.topics.keyed, int(p), o, name="keyed offset")
                         for p, o in (state.get("keyed") or {}).items() if o >= 0],
                      one.where())
        generation = envelope.generation or 0
        parts = []
        for p in range(self.partitions):
            piece = self._piece(latest, located, part_key(p), generation, one)
            part = self._new_part(p)
            self._same_generation(part.restore(piece.value, piece.where()), generation,
                                  piece, one)
            parts.append(part)
        merges = []
        for k, coordinator in enumerate(self.coordinators):
            piece = self._piece(latest, located, merge_key(coordinator.name), generation, one)
            found, merge = snapshot_format.read_json("coordinator", piece.value, piece.where(),
                                                     stream=self.topics.stream, shard=k)
            self._same_generation(found, generation, piece, one)
            merger = Merger(self.partitions, self.topics.stream, self.queries.registry)
            merger.load_state(merge["merger"])
            merges.append((merger, merge))
        return envelope, state, parts, merges

    def _piece(self, latest: dict, located: dict, key: bytes, generation: int,
               cut: Saved) -> Saved:
        wanted = slot_key(key, generation)
        for piece in saved_checkpoints(latest, key, self.topics.state, located):
            if piece.key == wanted:
                return piece
        raise SnapshotError(f"{cut.where()}: its piece {wanted.decode()!r} is not on "
                            f"{self.topics.state}")

    @staticmethod
    def _same_generation(envelope: Envelope, generation: int, piece: Saved, cut: Saved) -> None:
        if (envelope.generation or 0) != generation:
            raise SnapshotError(f"{piece.where()} is of generation {envelope.generation}, "
                                f"not of the cut's ({generation}, {cut.where()}): written "
                                "by a cut that did not complete")

    def commit(self) -> None:
        """Checkpoint the cut between two steps: once everything produced so far is
        delivered, every core's state and the source offsets, as one generation."""
        started = time.perf_counter()
        if self.refill is not None or self.logged.holding or self.producer.flush(30):
            return  # not while logged steps are taken again (messages are held for them)
        if self.undelivered is not None:  # a checkpoint would skip what it held: stop
            raise RuntimeError(f"not delivered: {self.undelivered}")
        for coordinator in self.coordinators:
            coordinator.deliveries.check("composite events")
        assignment = self.source.position(self.source.assignment())
        consumed = {str(tp.partition): tp.offset for tp in assignment if tp.offset >= 0}
        if not consumed or (consumed, self.position) == self.saved:
            return
        offsets, reorder = consumed, None
        if self.reorder is not None:  # resume where the oldest waiting event was read
            offsets, reorder = saved_state(self.reorder, consumed)
        generation = self.generation + 1
        state_topic = self.topics.state
        for part in self.parts:
            self.worker_metrics.strings_dropped.inc(part.compact_strings())
            produce(self.producer, state_topic, part.snapshot(generation),
                    key=slot_key(part_key(part.partition), generation))
        for k, coordinator in enumerate(self.coordinators):
            merge = {"offsets": coordinator.offsets, "merger": coordinator.merger.state(),
                     "delivered": coordinator.delivered,
                     "reported_ends": coordinator.reported_ends}
            produce(self.producer, state_topic, snapshot_format.pack_json(
                "coordinator", merge, stream=self.topics.stream, shard=k,
                generation=generation), key=slot_key(merge_key(coordinator.name), generation))
        cut = {**self.seq_state(offsets, reorder),
               "chained": {"partitions": self.partitions, "shards": self.topics.shards}}
        produce(self.producer, state_topic, snapshot_format.pack_json(
            "splitter", cut, stream=self.topics.stream, generation=generation),
            key=slot_key(CHAINED_KEY, generation))
        self._drain_parts()  # the failures a snapshot reports
        snapshotted = time.perf_counter()
        if self.producer.flush(30):
            log("checkpoint_not_flushed", level="warning")
            return
        log("checkpointed", level="debug", generation=generation,
            snapshot_ms=round((snapshotted - started) * 1000, 1),
            ms=round((time.perf_counter() - started) * 1000, 1))
        self.saved = (consumed, self.position)
        self.generation = generation
        self.metrics.checkpointed(generation, took_s=time.perf_counter() - started)
        for part in self.parts:
            part.saved_offset, part.generation = part.offset, generation
        for coordinator in self.coordinators:
            coordinator.saved, coordinator.generation = list(coordinator.offsets), generation
        self.source.commit(offsets=[tp for tp in assignment if tp.offset >= 0],
                           asynchronous=False)
