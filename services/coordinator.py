"""The coordinator: merges the workers' composite events by sequence number.

It reads every partition of the match topic (one per keyed partition, in order) and
tracks, per partition, `upto` (processed up to that seq) and the stream time `ts` there.
A composite event with seq s is final once no partition can still produce one with a
smaller sort key:

- MATCH (horizon 0): every partition has passed s.
- Queries that report late (SEQ windows, time windows; horizon H in time units): the
  slowest partition's stream time T is such that every event up to s had time < T - H.
- Unbounded horizons (count windows, windows over another attribute): end of input.

Final composite events go out in `cep_core.composite.sort_key` order (with the query's
index in the live query set) to their query's INTO topic, one JSON per message, key = the
composite's key as JSON. Content and order do not depend on the number of workers.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque

import orjson
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cep_core.composite import sort_key
from services import frames
from services.control import INFINITE, horizon
from services.frames import Frame
from services.kafka import KafkaSettings, Topics, consume_batch, produce
from services.metrics import Metrics
from services.serve import log, profiled


class QueryInfo:
    def __init__(self, name: str, index: int, output: str, horizon_: int | None):
        self.name, self.index, self.output, self.horizon = name, index, output, horizon_


class Merger:
    """The release logic, without Kafka: feed frames, take what is final."""

    def __init__(self, partitions: int, stream: str, registry=None):
        from cep_core.schema import SchemaRegistry

        self.partitions = partitions
        self.stream = stream
        self.registry = registry or SchemaRegistry()
        self.upto = [-1] * partitions
        self.pulses: deque[tuple[int, int]] = deque()  # (upto, ts), increasing upto
        self.ends: dict[int, set[int]] = {}  # end-of-input seq -> partitions that reached it
        self.queries: dict[str, QueryInfo] = {}
        self.pending: dict[str, list] = {}  # output topic -> heap
        self.counter = itertools.count()
        self.control_seen: dict[tuple, set[int]] = {}
        self.live_events: list[dict] = []  # (name, op, at, latency) once all partitions had it
        self.ended: list[int] = []  # ends of input whose composite events are all released
        self.received = 0  # composite events fed

    def feed(self, frame: Frame) -> None:
        part = frame.get("part")
        if frame.kind == frames.CONTROL:
            self._control(frame, part)
            return
        if frame.payload:
            composites = orjson.loads(frame.payload)
            self.received += len(composites)
            for composite in composites:
                info = self.queries.get(composite["query"])
                if info is None:
                    continue
                key = sort_key(composite, info.index)
                heapq.heappush(self.pending.setdefault(info.output, []),
                               (key, next(self.counter), composite))
        upto, ts = frame.get("upto"), frame.get("ts")
        if upto is None or upto < self.upto[part]:
            return
        self.upto[part] = upto
        if ts is not None and (not self.pulses or upto > self.pulses[-1][0]):
            self.pulses.append((upto, ts))
        if frame.kind == frames.END:
            self.ends.setdefault(upto, set()).add(part)

    def _control(self, frame: Frame, part: int) -> None:
        change = frames.json_payload(frame)
        entries = change["queries"] if change["op"] == "set" else [change]
        for entry in entries:
            if entry.get("text"):
                from services.control import check_query_text
                checked = check_query_text(entry["name"], entry["text"], self.registry)
                self.queries[entry["name"]] = QueryInfo(
                    entry["name"], entry["index"], checked.query.output, horizon(checked))
        marker = (change["op"], change.get("name"), frame.get("at"))
        seen = self.control_seen.setdefault(marker, set())
        seen.add(part)
        if len(seen) == self.partitions:
            del self.control_seen[marker]
            sent = frame.get("sent_ms")
            self.live_events.append({"op": change["op"], "name": change.get("name"),
                                     "at": frame.get("at"), "latency_ms": None if sent is None
                                     else round(time.time() * 1000 - sent, 1)})

    def bound(self, output: str) -> int:
        """The largest seq up to which composite events for `output` are final."""
        low = min(self.upto)
        ended = max(self.ended, default=-1)
        horizons = [q.horizon for q in self.queries.values() if q.output == output]
        if any(h is INFINITE for h in horizons):
            return ended
        widest = max(horizons, default=0)
        if widest == 0:
            return max(low, ended)
        now = next((ts for upto, ts in reversed(self.pulses) if upto <= low), None)
        if now is None:
            return ended
        final = max([upto for upto, ts in self.pulses if upto <= low and ts < now - widest],
                    default=-1)
        return max(final, ended)

    def release(self) -> list[tuple[str, dict]]:
        for end in sorted(e for e, parts in self.ends.items() if len(parts) == self.partitions):
            del self.ends[end]
            self.ended.append(end)
        out = []
        for output, heap in self.pending.items():
            if not heap:
                continue
            limit = self.bound(output)
            while heap and heap[0][0][0] <= limit:
                out.append((output, heapq.heappop(heap)[2]))
        self._prune()
        return out

    def _prune(self) -> None:
        """Keep the pulses a bound can still need."""
        widest = max([q.horizon or 0 for q in self.queries.values()], default=0)
        low = min(self.upto)
        now = next((ts for upto, ts in reversed(self.pulses) if upto <= low), None)
        if now is None:
            return
        while len(self.pulses) > 2 and self.pulses[1][0] <= low and \
                self.pulses[1][1] < now - widest:
            self.pulses.popleft()


class Coordinator:
    def __init__(self, settings: KafkaSettings, topics: Topics, partitions: int = 4,
                 registry=None, metrics: Metrics | None = None, on_output=None):
        self.settings = settings
        self.topics = topics
        self.partitions = partitions
        self.merger = Merger(partitions, topics.stream, registry)
        self.metrics = metrics or Metrics("coordinator", 0)
        self.on_output = on_output
        self.reported_ends = 0
        self.lived: list[dict] = []  # every query change once all partitions switched

    def run(self, stopping) -> None:
        producer = self.settings.producer()
        consumer = self.settings.consumer(self.topics.group("coordinator"))
        consumer.assign([TopicPartition(self.topics.matches, p, OFFSET_BEGINNING)
                         for p in range(self.partitions)])
        log("coordinator_started", stream=self.topics.stream, partitions=self.partitions)
        last_lag = 0.0
        try:
            with profiled("coordinator"):
                while not stopping.is_set():
                    messages = consume_batch(consumer, 5000, 0.05)
                    if time.monotonic() - last_lag > 1:
                        self.metrics.observe_lag(consumer)
                        self.metrics.queries.set(len(self.merger.queries))
                        last_lag = time.monotonic()
                    if not messages:
                        continue
                    started = time.perf_counter()
                    received = self.merger.received
                    for message in messages:
                        if message.error():
                            continue
                        frame = frames.frame_of(message)
                        if frame is not None:
                            self.merger.feed(frame)
                    released = self.merger.release()
                    for output, composite in released:
                        produce(producer, output, orjson.dumps(composite),
                                key=orjson.dumps(composite.get("key")))
                    if self.on_output is not None and released:
                        self.on_output(released)
                    for event in self.merger.live_events:
                        self.lived.append(event)
                        log("query_live", **event)
                        produce(producer, self.topics.status, orjson.dumps(
                            {"event": "query_live", **event}))
                    self.merger.live_events.clear()
                    for end in self.merger.ended[self.reported_ends:]:
                        log("end_of_input_released", upto=end)
                        produce(producer, self.topics.status, orjson.dumps(
                            {"event": "end_of_input", "upto": end}))
                    self.reported_ends = len(self.merger.ended)
                    self.metrics.events_in.inc(self.merger.received - received)
                    self.metrics.events_out.inc(len(released))
                    producer.poll(0)
                    self.metrics.batch_seconds.observe(time.perf_counter() - started)
        finally:
            producer.flush(30)
            consumer.close()
            log("coordinator_stopped")
