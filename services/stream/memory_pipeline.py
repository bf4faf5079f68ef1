"""A whole pipeline in memory: the routing core, one partition core per keyed partition
and the coordinator's `Merger`, wired by lists instead of topics (no broker, no threads).

What the splitter, workers and coordinator do to records, without Kafka (with `shards`
coordinator shards: one `Merger` per shard on its own match topic): for tests that
need no broker (the broker tests keep what only a broker shows: rebalances, kills,
restarts) and for benches of each core alone (bench/cores.py).

    pipeline = MemoryPipeline("trades", partitions=4)
    pipeline.control(ControlMessage("add", name, text))
    pipeline.send(lines)          # one JSON event per message
    pipeline.send_table(table)    # a framed Arrow batch
    pipeline.end()                # end-of-input marker of each source partition
    pipeline.pulse()              # the splitter's timer: a pulse (an idle stream's time)
    pipeline.outputs              # INTO topic -> composite events, as released

`router_options` go to the routing core (`max_ahead`, `idleness`, `clock`, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pyarrow as pa

from cep_core.control_message import ControlMessage
from cep_core.schema import SchemaRegistry
from cep_service.stream import frames
from cep_service.stream.merge import Merger
from cep_service.stream.partition import PartitionState
from cep_service.stream.routing import Outbox, Router, message, records
from cep_service.stream.topics import Topics

END = [("kind", b"end")]
EVENTS = [("kind", b"events")]


class MemoryPipeline:
    def __init__(self, stream: str, partitions: int = 4, registry: SchemaRegistry | None = None,
                 allowed_lateness_ms: int = 0, source_partitions: int = 1,
                 idle_timeout_ms: int | None = 3_600_000, shards: int = 1,
                 **router_options: Any) -> None:
        self.topics = Topics(stream, source=f"src.{stream}", shards=shards)
        self.router = Router(self.topics, partitions, registry,
                             allowed_lateness_ms=allowed_lateness_ms, **router_options)
        self.router.source_partitions = frozenset(range(source_partitions))
        self.registry = self.router.queries.registry
        self.parts = [PartitionState(p, stream, self.registry, idle_timeout_ms, self.topics)
                      for p in range(partitions)]
        self.mergers = [Merger(partitions, stream, self.registry) for _ in range(shards)]
        self.merger = self.mergers[0]
        self.next_offset = [0] * source_partitions
        self.keyed_offset = [0] * partitions
        self.control_offset = 0
        self.started = False
        self.outputs: dict[str, list[dict]] = {}
        self.sent: dict[str, list[tuple]] = {}  # other topics: (value, key, partition, headers)

    def control(self, change: ControlMessage) -> None:
        """A ControlMessage, as the control topic would hand it to the splitter."""
        self.router.apply_control(message(0, self.control_offset, change.to_json(), None,
                                          change.key), announce=self.started)
        self.control_offset += 1
        self._deliver()

    def send(self, values: list[bytes], partition: int = 0, headers: Any = None) -> None:
        """Messages on one source partition, taken as one step."""
        self._start()
        first = self.next_offset[partition]
        self.next_offset[partition] += len(values)
        self.router.take(records(values, partition, first, headers))
        self._deliver()

    def send_table(self, table: pa.Table, partition: int = 0) -> None:
        self.send([frames.encode_table(table)], partition, EVENTS)

    def end(self) -> None:
        for p in range(len(self.next_offset)):
            self.send([b""], p, END)

    def pulse(self) -> None:
        """What the splitter's timer does when no batch went out for a while."""
        self._start()
        self.router.pulse()
        self._deliver()

    def _start(self) -> None:
        if not self.started:
            self.router.setup_schema()
            self.router.announce()
            self.started = True

    def _deliver(self) -> None:
        """Keyed frames to their partition cores, match frames to the merger."""
        self._route(self.router.out, {self.topics.keyed: None}, self._keyed)

    def _keyed(self, _: object, value: bytes | None, partition: int, headers: Any) -> None:
        frame = frames.frame_of(message(partition, 0, value, headers))
        state = self.parts[partition]
        state.handle(frame, self.keyed_offset[partition])
        self.keyed_offset[partition] += 1
        shards = {self.topics.matches_of(k): merger for k, merger in enumerate(self.mergers)}
        self._route(state.sent, shards, self._matches)

    def _matches(self, merger: Merger, value: bytes | None, partition: int,
                 headers: Any) -> None:
        frame = frames.frame_of(message(partition, 0, value, headers))
        if frame is not None:  # as the coordinator does: a match topic holds only frames
            merger.feed(frame)
        for output, composite in merger.release():
            self.outputs.setdefault(output, []).append(composite)

    def _route(self, box: Outbox, to: dict, handle: Callable[..., None]) -> None:
        """Records for a topic in `to` go to `handle(to[topic], ...)`, others to `sent`."""
        for record_topic, value, key, partition, headers in box.take():
            if record_topic in to:
                handle(to[record_topic], value, partition, headers)
            else:
                self.sent.setdefault(record_topic, []).append((value, key, partition, headers))

    def records_of(self, topic: str) -> list[dict]:
        """The JSON records sent to another topic (dead letters, late events, status)."""
        return [orjson.loads(value) for value, *_ in self.sent.get(topic, [])]
