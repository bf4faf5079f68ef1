"""The splitter: the single point of order of a stream's pipeline.

It consumes the source topic in batches (one JSON event per message, or framed batches
with header kind=events, or an end-of-input marker with header kind=end), stamps each
record with its sequence number, and writes the events as frames to the keyed topic: once
per route (distinct PARTITION BY list among the live queries) to partition
`stable_hash(key) % N` (unkeyed queries: partition 0). Each partition's last frame of a
batch says `upto` (every event up to that seq has been sent to it); partitions that got
nothing get a pulse, and when no batch went out for `pulse_ms` all partitions get one
(`cep serve splitter`: the Faust app's timer, services/stream/splitter_app.py; in-process
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
(services/stream/splitter_order.py).

All of that but Kafka is the routing core, `Router` (services/stream/routing.py): this shell
consumes, hands it messages and control records, produces what it sends, and checkpoints.

Kernels compile off the data path: a running splitter holds a query's add or update back
(and every control record after it, so changes keep their order) while a child process
compiles the query's kernels into the machine's kernel cache (cep_core/kernel_warmer.py);
events keep flowing meanwhile. Then it applies the change at the seq it has reached, and
the workers load the kernels instead of compiling them between two batches of the live
queries. `warm_kernels=False` (or CEP_WARM_KERNELS=0) applies changes at once. Held
changes are not lost to a restart: a starting splitter reads the whole control topic.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any
from concurrent.futures import Future

import orjson
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cep_core import snapshot_format
from cep_core.control_message import (
    QUERY,
    ControlMessageError,
    ControlRecord,
    OtherStream,
    compacted,
    validate,
)
from cep_core.control_ops import Op
from cep_core.json_batch import DEFAULT_MAX_MESSAGE_BYTES
from cep_core.schema import SchemaRegistry, StreamSchema
from cep_core.snapshot_format import Envelope
from cep_core.kernel_warmer import KernelWarmer
# Deliberately like services/stream/chained.py's: an import list of the checkpoint helpers both
# use, not code
from cep_service.stream.checkpoint import (
    AskOnce,
    AskWatermarks,
    Offset,
    Saved,
    broker_watermarks,
    check_offsets,
    logged_steps,
    read_latest,
    restore_newest,
    saved_checkpoints,
    slot_key,
)
from cep_service.stream.control import StatusWriter
from cep_service.stream.status import Presence
from cep_service.stream.kafka import KafkaSettings, Topics, consume_batch, produce
from cep_service.stream.reorder_checkpoint import Refill, saved_state
from cep_service.stream.splitter_order import LoggedOrder
from cep_service.stream.metrics import Metrics
from cep_service.stream.routing import Router, partition_ids, stable_hash  # noqa: F401 (their home was here)
from cep_service.stream.serve import log, profiled


# the splitter's checkpoints on the state topic: the even generations (the odd ones under
# `splitter.alt`, services/stream/checkpoint.py slot_key)
SPLITTER_KEY = b"splitter"


def _routed(name: str) -> property:
    return property(lambda self: getattr(self.core, name),
                    lambda self, value: setattr(self.core, name, value))


class Splitter:
    def __init__(self, settings: KafkaSettings, topics: Topics, partitions: int = 4,
                 pulse_ms: int = 100, batch_size: int = 20000,
                 registry: SchemaRegistry | None = None,
                 metrics: Metrics | None = None, linger_ms: float = 5,
                 allowed_lateness_ms: int = 0, max_reorder_buffered: int = 100_000,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 checkpoint_ms: int | None = None, warm_kernels: bool | None = None,
                 warm_timeout_s: float = 600, max_ahead: int | str | None = None,
                 max_ahead_of_clock: int | str | None = None,
                 idleness: int | str | None = None) -> None:
        self.settings = settings
        self.topics = topics
        self.partitions = partitions
        self.pulse_s = pulse_ms / 1000
        self.checkpoint_s = (checkpoint_ms or int(os.environ.get("CEP_CHECKPOINT_MS", 1000))) / 1000
        self.batch_size = batch_size
        # after a batch's first record, wait this long for more: fewer, larger frames when
        # the input trickles (each frame costs every worker and the coordinator ~1-2 ms)
        self.linger_s = linger_ms / 1000
        self.status_writer = StatusWriter(topics.status, "splitter")
        self.metrics = metrics or Metrics("splitter", 0)
        self.metrics.identify(self.status_writer.service)
        # max_ahead, max_ahead_of_clock, idleness: the stream's time rules (None: the
        # schema's; services/stream/routing.py)
        self.core = Router(topics, partitions, registry, self.metrics, allowed_lateness_ms,
                           max_reorder_buffered, max_message_bytes, self.status_writer,
                           max_ahead=max_ahead, max_ahead_of_clock=max_ahead_of_clock,
                           idleness=idleness)
        self.started = False
        # Held while a batch is stamped and sent: a pulse from another thread (the Faust
        # timer) must not claim an `upto` whose events are not all produced yet.
        self.lock = threading.Lock()
        # (source offsets, position) of the last checkpoint
        self.saved: tuple[Any, int] | None = None
        self.generation = -1  # of the last checkpoint written or restored (-1: none)
        # (topic, partition)s -> their watermarks on the broker, to check restored offsets
        # with (checkpoint.broker_watermarks, set by `start`; None: not checked)
        self.watermarks: AskWatermarks | None = None
        self.keyed_next: dict[int, int] = {}  # keyed partition -> offset after the last sent
        self.undelivered: str | None = None  # the first record the broker never took
        if warm_kernels is None:
            warm_kernels = os.environ.get("CEP_WARM_KERNELS", "1") != "0"
        self.warmer = KernelWarmer() if warm_kernels else None
        self.warm_timeout_s = warm_timeout_s
        self.held: list = []  # control messages not applied yet, in topic order
        self.warming: tuple[Future, float] | None = None  # the head's: (future, started)

    # the router's state, as the shell's checkpoint and status read and restore it
    queries = _routed("queries")
    schema = _routed("schema")
    position = _routed("position")
    last_seq = _routed("last_seq")
    max_ts = _routed("max_ts")
    reorder = _routed("reorder")
    refill = _routed("refill")
    steps = _routed("steps")
    logged = _routed("logged")
    ended = _routed("ended")
    source_partitions = _routed("source_partitions")
    max_message_bytes = _routed("max_message_bytes")
    late_events = _routed("late_events")
    pulses = _routed("pulses")
    last_pulse = _routed("last_pulse")

    # ------------------------------------------------------------ setup

    def _schema(self) -> StreamSchema | None:
        return self.core.known_schema()

    def setup_schema(self) -> None:
        self.core.setup_schema()

    def _forward(self) -> None:
        """Produce what the router sent."""
        if len(self.core.out):
            self.core.out.to(self.producer)
            self.producer.poll(0)

    def start(self, stopping: threading.Event | None = None) -> bool:
        """Learn the live set from the control topic (waiting, until `stopping`, for the
        stream's schema when none is known yet), then resume the source. False when
        stopped before the stream was known."""
        self.producer = self.settings.producer(on_delivery=self._delivered)
        self.control = self.settings.consumer()
        self.control.assign([TopicPartition(self.topics.control, 0, -2)])
        self._drain_control(initial=True)
        if self._schema() is None:  # up: changes get their outcome, as soon as it starts
            log("waiting_for_stream", stream=self.topics.stream, control=self.topics.control)
            self.status_writer.presence(self.producer, Presence.UP, waiting_for_stream=True)
        while self._schema() is None and not (stopping is not None and stopping.is_set()):
            self._drain_control(initial=True)
        if self._schema() is None:
            self.status_writer.presence(self.producer, Presence.DOWN)
            self.producer.flush(10)
            self.control.close()
            return False
        self.setup_schema()
        self.watermarks = functools.partial(broker_watermarks, self.settings)
        self.source = self.settings.consumer(self.topics.group("splitter"))
        metadata = self.source.list_topics(self.topics.source, timeout=10).topics[
            self.topics.source]
        tps = [TopicPartition(self.topics.source, p) for p in sorted(metadata.partitions)]
        self.source_partitions = frozenset(tp.partition for tp in tps)
        self.source.assign(self._resume_at(tps))
        self.core.announce()
        self._forward()
        self.status_writer.presence(self.producer, Presence.UP, live=self.queries.summary())
        self.started = True
        log("splitter_started", stream=self.topics.stream, partitions=self.partitions,
            queries=list(self.queries.live), next_position=self.position)
        return True

    # ------------------------------------------------------------ the loop

    def run(self, stopping: threading.Event, pulses: bool = True) -> None:
        """Start, then move batches until `stopping` is set. `pulses=False` when another
        thread calls `pulse_if_due` (the Faust app's timer)."""
        if self.start(stopping):
            self.loop(stopping, pulses)

    def loop(self, stopping: threading.Event, pulses: bool = True) -> None:
        last_commit = time.monotonic()
        try:
            with profiled("splitter"):
                while not stopping.is_set():
                    self.step()
                    if pulses:
                        self.pulse_if_due()
                    if time.monotonic() - last_commit > self.checkpoint_s:
                        self.commit()
                        self.observe()
                        last_commit = time.monotonic()
        finally:
            self.close()

    def observe(self) -> None:
        """Refresh the gauges (from the loop, once a checkpoint period)."""
        self.metrics.observe_lag(self.source)
        self.metrics.queries.set(len(self.queries.live))

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
        """Stamp and send what was consumed (Router.take), then produce it; at an end of
        input, send it now (nothing more will come to batch it with: the producer's
        linger would only delay the end's results)."""
        ended = self.core.inputs_ended
        self.core.take(messages)
        self._forward()
        if self.core.inputs_ended != ended:
            self.producer.flush(30)

    def pulse_if_due(self) -> bool:
        """Pulse every partition unless a batch or pulse went out within the cadence (a
        batch in flight will say its `upto` itself)."""
        if not self.started or time.monotonic() - self.last_pulse < self.pulse_s * 0.9:
            return False
        if not self.lock.acquire(blocking=False):
            return False
        try:
            self.core.pulse()
            self._forward()
            return True
        finally:
            self.lock.release()

    def status(self) -> dict:
        """What the splitter's status view shows (taken under the batch lock)."""
        with self.lock:
            return self._status()

    def _status(self) -> dict:
        return self.core.status(self.started, round(self.pulse_s * 1000))

    def close(self) -> None:
        with self.lock:
            self.started = False
        try:
            self.status_writer.presence(self.producer, Presence.DOWN)
            self.producer.flush(30)
            self.commit()
        finally:
            self.source.close()
            self.control.close()
            if self.warmer is not None:
                self.warmer.close()
        log("splitter_stopped", position=self.position, last_seq=self.last_seq)

    def _resume_at(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        """Where each source partition resumes, with the seq state there: the splitter's
        newest good checkpoint on the state topic (tansu drops commit metadata; of the last
        two, a damaged one or one whose offsets the broker cannot have given is refused and
        the one before it restored), else committed offsets with their metadata, else the
        beginning. Records after that point are stamped again with the same seqs (a seq is
        the record's position in consumption order)."""
        located: dict = {}
        saved = saved_checkpoints(read_latest(self.settings, self.topics.state, located),
                                  SPLITTER_KEY, self.topics.state, located)
        marks = None if self.watermarks is None else AskOnce(self.watermarks)
        found = restore_newest("splitter", saved, lambda one: self._checked(one, marks), log,
                               stream=self.topics.stream)
        envelope = None
        if found is not None:
            (envelope, state), _ = found
            offsets = {int(p): o for p, o in state["offsets"].items()}
            for tp in tps:
                tp.offset = offsets.get(tp.partition, OFFSET_BEGINNING)
        else:
            committed = self.source.committed(tps, timeout=10)
            state = None
            for tp in committed:
                if tp.metadata:
                    envelope, state = snapshot_format.read_json(
                        "splitter", tp.metadata, f"the metadata of the splitter group's "
                        f"committed offset of {tp.topic} partition {tp.partition}",
                        stream=self.topics.stream)
                    break
            for tp, done in zip(tps, committed):
                tp.offset = done.offset if state is not None and done.offset >= 0 \
                    else OFFSET_BEGINNING
        self.load(envelope, state)
        self.logged = LoggedOrder(logged_steps(self.settings, self.topics.keyed,
                                               self.partitions, self.keyed_next, self.steps))
        if self.logged.holding:
            log("splitter_replaying", steps=len(self.logged.pending), after_step=self.steps)
        return tps

    def load(self, envelope: Envelope | None, state: dict | None) -> None:
        """Take the seq state of a restored checkpoint (its envelope and state; None:
        none)."""
        if envelope is not None:
            self.generation = envelope.generation if envelope.generation is not None else 0
            if not envelope.checked:
                log("checkpoint_unchecked", level="warning", kind="splitter",
                    format=envelope.version)
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

    def _checked(self, one: Saved, marks: AskWatermarks | None) -> tuple:
        """(envelope, state) of a checkpoint whose offsets are plausible: its source
        offsets and the keyed offsets its logged steps are read after."""
        envelope, state = snapshot_format.read_json("splitter", one.value, one.where(),
                                                    stream=self.topics.stream)
        check_offsets(marks, [Offset(self.topics.source, int(p), o, name="source offset")
                              for p, o in state["offsets"].items() if o >= 0]
                      + [Offset(self.topics.keyed, int(p), o, name="keyed offset")
                         for p, o in (state.get("keyed") or {}).items() if o >= 0],
                      one.where())
        return envelope, state

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
        generation = self.generation + 1
        state = snapshot_format.pack_json("splitter", self.seq_state(offsets, reorder),
                                          stream=self.topics.stream, generation=generation)
        produce(self.producer, self.topics.state, state,
                key=slot_key(SPLITTER_KEY, generation))
        if self.producer.flush(30):
            log("checkpoint_not_flushed", level="warning")
            return
        self.saved = (consumed, self.position)
        self.generation = generation
        self.metrics.checkpointed(generation)
        self.source.commit(offsets=[TopicPartition(self.topics.source, int(p), o,
                                                   metadata=state.decode())
                                    for p, o in offsets.items()], asynchronous=False)

    def seq_state(self, offsets: dict, reorder: Any) -> dict:
        """What a checkpoint holds of the seq state, resuming the source at `offsets`."""
        return {"position": self.position, "last_seq": self.last_seq, "max_ts": self.max_ts,
                "offsets": offsets, "reorder": reorder, "steps": self.steps,
                "ended": sorted(self.ended),
                "keyed": {str(p): o for p, o in self.keyed_next.items()}}

    def _drain_control(self, initial: bool = False) -> None:
        """Apply pending control messages; at start, all of the topic up to its fetch
        high-watermark, as what compaction leaves of it (the last record of each key,
        streams first: cep_core/control_message.py `compacted`), so that a start gives the
        same live set on the whole log and on the compacted one."""
        deadline = time.monotonic() + 10
        tp = TopicPartition(self.topics.control, 0)
        pending = []
        while True:
            messages = self.control.consume(1000, 0.05 if initial else 0)
            for message in messages:
                if message.error():
                    continue
                if initial:
                    pending.append(ControlRecord.of(message))
                else:
                    self.held.append(message)
            if not initial:
                self._apply_held()
                self._forward()
                return
            _, high = self.control.get_watermark_offsets(tp, cached=True)
            position = self.control.position([tp])[0].offset
            if time.monotonic() > deadline or \
                    high >= 0 and (high == 0 or position >= high) and not messages:
                break
        for record in compacted(pending):
            self.core.apply_control(record, announce=False)
        self._forward()

    def _apply_held(self) -> None:
        """Apply the held control messages in order, up to the first whose kernels are
        still compiling (or until `warm_timeout_s`: then it is applied all the same)."""
        while self.held:
            head = self.held[0]
            text = self._to_warm(head)
            if text is not None:
                if self.warming is None:
                    assert self.warmer is not None  # (_to_warm gives a text only with one)
                    schema = self.core.known_schema()
                    self.warming = (self.warmer.submit(text, orjson.dumps(
                        schema.to_dict()).decode() if schema else None), time.monotonic())
                    log("kernels_warming", key=(head.key() or b"").decode(errors="replace"),
                        offset=head.offset())
                future, started = self.warming
                waited = time.monotonic() - started
                if not future.done() and waited < self.warm_timeout_s:
                    return
                self.warming = None
                try:
                    done = future.result(timeout=0)
                    log("kernels_warm", offset=head.offset(), seconds=round(waited, 3),
                        compile_s=round(done["compile_s"], 3), failed=done["failed"])
                except Exception as e:  # noqa: BLE001 - the workers will contain it
                    log("kernels_not_warm", level="warning", offset=head.offset(),
                        seconds=round(waited, 3), reason=f"{type(e).__name__}: {e}")
            self.held.pop(0)
            self.core.apply_control(head, announce=True)

    def _to_warm(self, message: Any) -> str | None:
        """The query text whose kernels to compile before `message` applies: a query add
        or update of this stream that checks (others apply at once, refusals included)."""
        if self.warmer is None or not message.value():
            return None
        try:
            change = validate(message.value(), message.key(), self.queries.registry,
                              self.topics.stream)
        except (ControlMessageError, OtherStream):
            return None
        if change.kind is not QUERY or change.op is Op.REMOVE or \
                self.queries.unchanged(change):
            return None
        return change.text

    def _delivered(self, err: Any, message: Any) -> None:
        if err is not None:
            if self.undelivered is None:
                self.undelivered = f"{message.topic()} [{message.partition()}]: {err}"
                log("delivery_failed", level="error", topic=message.topic(),
                    partition=message.partition(), error=str(err))
            return
        if message.topic() == self.topics.keyed:
            p = message.partition()
            self.keyed_next[p] = max(self.keyed_next.get(p, 0), message.offset() + 1)
