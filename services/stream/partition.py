"""The partition core of a worker, without Kafka: the engines of one keyed partition.

`PartitionState.handle(frame, offset)` takes one frame of the keyed topic
(services/stream/frames.py) and appends what the worker sends to `sent` (an Outbox,
services/stream/routing.py): composite frames and pulses to the match topic (the same
partition), dead letters of the engines, the status records of applied changes. It drops
events a restarted splitter sends again (seq at or below the last one processed on their
route) and repeated ends of input, switches queries at the seq of a control frame, and
snapshots/restores itself (engines, live queries, keyed offset, composites not sent yet).
The `Worker` shell (services/stream/worker.py) consumes, checkpoints and produces the
outbox.

A query whose engine fails (`StreamEngines` contains it) is failed in this partition:
`failed` keeps it (in snapshots too) until a change gives it a new text or removes it, a
`query_failed` status record says where and why (again after a restore), and the other
queries go on untouched.
"""

from __future__ import annotations

import struct

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cep_core import snapshot_format
from cep_core.ast import QueryKind
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.control_message import LiveQuery, LiveSet, horizon
from cep_core.control_ops import Outcome
from cep_core.schema import SchemaRegistry, StreamSchema, units_per_ms
from cep_core.stream_engines import StreamEngines
from cep_service.stream import frames
from cep_service.stream.frames import ChangeFrame, Frame, LiveSetFrame
from cep_service.stream.metrics import Metrics
from cep_service.stream.routing import Outbox
from cep_service.stream.status import StatusWriter
from cep_service.stream.topics import OFFSET_BEGINNING, Topics, produce


class PartitionState:
    """The engines of one keyed partition."""

    def __init__(self, partition: int, stream: str, registry: SchemaRegistry | None,
                 idle_timeout_ms: int | None = None, topics: Topics | None = None,
                 metrics: Metrics | None = None, status: StatusWriter | None = None,
                 out: Outbox | None = None) -> None:
        self.partition = partition
        self.topics = topics or Topics(stream)
        self.metrics = metrics or Metrics("worker", 0)
        self.status = status or StatusWriter(self.topics.status, "worker")
        self.sent = out if out is not None else Outbox()  # what this partition sends
        self.idle_timeout_ms = idle_timeout_ms
        self.stream = stream
        self.queries = LiveSet(stream, registry)
        self.routes: dict[str, tuple[StreamEngines, BatchEncoder]] = {}
        self.upto = -1
        self.ts = None
        self.offset = OFFSET_BEGINNING
        self.out: list[dict] = []
        self.seen: dict[str, int] = {}  # route -> last event seq processed
        self.end_at = -1  # upto of the last end of input
        self.saved_offset: int | None = None  # offset of the last snapshot written
        self.live_sets = 0  # start-up `set` frames applied: the worker reports its live set
        self.outputs: dict[str, str] = {}  # query -> INTO topic, removed queries included
        self.failed: dict[str, dict] = {}  # query -> its failure and the text that failed
        self.generation = -1  # of the last checkpoint written or restored (-1: none)
        self._unreported: list[str] = []  # failed queries to report on the status topic

    def engines(self, route: str) -> tuple[StreamEngines, BatchEncoder]:
        pair = self.routes.get(route)
        if pair is None:
            strings = StringDictionary()
            pair = self.routes[route] = (StreamEngines([], strings),
                                         BatchEncoder(self._schema(), strings))
        return pair

    def start(self, entry: LiveQuery) -> None:
        failed = self.failed.get(entry.name)
        if failed is not None:
            if failed["text"] == entry.text:
                return  # failed with this text: it stays stopped until changed
            del self.failed[entry.name]
            self.metrics.failed_queries.labels(entry.name).set(0)
        engines = self.engines(entry.route)[0]
        engines.add(entry.checked, **self.engine_options(entry))
        self._failures(engines)

    def engine_options(self, entry: LiveQuery) -> dict:
        """Idle-key eviction: the configured timeout in the stream's time units, at least
        twice the query's horizon (its window), so eviction drops only state no match uses."""
        if self.idle_timeout_ms is None or entry.checked.query.kind is QueryKind.WINDOW:
            return {}
        timeout = max(1, round(self.idle_timeout_ms * units_per_ms(
            entry.checked.schema.time_unit)))
        window = horizon(entry.checked)
        return {"idle_timeout": max(timeout, 2 * window) if window else timeout}

    def stop(self, name: str) -> None:
        if self.failed.pop(name, None) is not None:
            self.metrics.failed_queries.labels(name).set(0)
        for route, (engines, _) in list(self.routes.items()):
            if name in engines.queries:
                engines.remove(name)
                if not engines.queries:
                    del self.routes[route]

    def reconcile(self, entries: list[dict]) -> None:
        """Make the live set equal to `entries`; queries whose text is unchanged keep
        their state (and a failed one stays failed)."""
        wanted = {e["name"]: e for e in entries}
        for name, live in list(self.queries.live.items()):
            if name not in wanted or wanted[name]["text"] != live.text:
                self.stop(name)
                self.queries.remove(name)
        for name in [n for n in self.failed if n not in wanted]:
            self.stop(name)
        fresh = [e for e in entries if e["name"] not in self.queries.live]
        kept = [q.to_json() for q in self.queries.live.values()]
        self.queries.load(kept + fresh)
        for entry in fresh:
            self.start(self.queries.live[entry["name"]])

    def restart_engines(self) -> None:
        entries = self.queries.to_json()
        self.routes = {}
        self.queries.clear()
        self.reconcile(entries)

    def _failures(self, engines: StreamEngines) -> None:
        """Record and report the queries `engines` failed since last asked."""
        for failure in engines.take_failures():
            live = self.queries.live.get(failure.query)
            self.failed[failure.query] = {**failure.to_json(),
                                          "text": live.text if live else None}
            self._unreported.append(failure.query)

    def _report_failures(self) -> None:
        """Status records of the failures not reported yet (after the outcome of the
        change being applied, which would otherwise read as clearing them)."""
        for name in self._unreported:
            if name in self.failed:
                failure = {k: v for k, v in self.failed[name].items() if k != "text"}
                self.metrics.failed_queries.labels(name).set(1)
                self.status.failure(self.sent, failure, partition=self.partition)
        self._unreported = []

    def new_schema(self) -> None:
        """The stream's schema changed (a compatible update): decode frames with it."""
        schema = self._schema()
        for _, encoder in self.routes.values():
            encoder.schema = schema

    def _schema(self) -> StreamSchema:
        schema = self.queries.registry.get(self.stream)
        if schema is None:
            raise LookupError(f"no schema of stream {self.stream!r} is live")
        return schema

    def compact_strings(self) -> int:
        """Drop the strings no engine holds any more (see StreamEngines.compact_strings);
        how many were dropped."""
        return sum(engines.compact_strings() for engines, _ in self.routes.values())

    def strings(self) -> int:
        return sum(len(encoder.strings) for _, encoder in self.routes.values())

    # ------------------------------------------------------------ snapshots

    def snapshot(self, generation: int | None = None) -> bytes:
        """The partition's state, with its stream, partition and `generation` (default:
        the one after the last written) in the envelope."""
        blobs = {}
        for route, (engines, _) in self.routes.items():
            blobs[route] = engines.snapshot()
            self._failures(engines)
        self._report_failures()
        meta = {"partition": self.partition, "offset": self.offset, "upto": self.upto,
                "ts": self.ts, "queries": self.queries.to_json(),
                "routes": {r: len(b) for r, b in blobs.items()}, "out": self.out,
                "seen": self.seen, "end_at": self.end_at, "outputs": self.outputs,
                "failed": self.failed}
        head = orjson.dumps(meta)
        return snapshot_format.pack(
            "partition", struct.pack(">I", len(head)) + head + b"".join(blobs.values()),
            stream=self.queries.stream, partition=self.partition,
            generation=self.generation + 1 if generation is None else generation)

    def restore(self, data: bytes, where: str | None = None) -> snapshot_format.Envelope:
        """Put back a snapshot of this stream's partition; SnapshotError (naming `where`,
        the record or file) before anything changes when its bytes were changed since it
        was written or it is another partition's. Its envelope."""
        envelope, body = snapshot_format.read("partition", data, where,
                                              stream=self.queries.stream,
                                              partition=self.partition)
        self.generation = envelope.generation if envelope.generation is not None else 0
        (size,) = struct.unpack(">I", body[:4])
        meta = orjson.loads(body[4:4 + size])
        self.offset, self.upto, self.ts = meta["offset"], meta["upto"], meta["ts"]
        self.out, self.seen = meta.get("out", []), meta.get("seen", {})
        self.end_at = meta.get("end_at", -1)
        self.saved_offset = self.offset
        self.failed = meta.get("failed", {})
        self.reconcile(meta["queries"])
        self.outputs = {**meta.get("outputs", {}), **self._live_outputs()}
        at = 4 + size
        for route, length in meta["routes"].items():
            engines = self.engines(route)[0]
            engines.restore(body[at:at + length])
            self._failures(engines)
            at += length
        self._unreported = list(self.failed)  # announced again: this process holds them
        self._report_failures()
        return envelope


    # ------------------------------------------------------------ frames

    def handle(self, frame: Frame | None, offset: int) -> None:
        """One frame of the keyed topic, read at `offset` (None: not a frame)."""
        self.offset = offset + 1
        if frame is None:
            return
        try:
            self._handle(frame)
        finally:
            self._report_failures()

    def _handle(self, frame: Frame) -> None:
        if frame.kind is frames.EVENTS:
            self._events(frame)
        elif frame.kind is frames.CONTROL:
            self._control(frame)
        upto = frame.get("upto")
        if upto is None or upto < self.upto:
            return
        if frame.kind is frames.END:
            if upto <= self.end_at:
                return  # a restarted splitter sent this end of input again
            self.end_at = upto
        self._complete(frame, upto)

    def _events(self, frame: Frame) -> None:
        route = frame.get("route", "")
        if route not in self.routes:
            return  # no live query reads this route (a change raced the frame)
        engines, encoder = self.routes[route]
        seen = self.seen.get(route, -1)
        last = frame.get("last")
        if last is not None and last <= seen:
            return  # sent again by a restarted splitter
        table = frames.decode_table(frame.payload)
        if table.num_rows and (frame.get("first") is None or frame.get("first") <= seen):
            table = table.filter(pc.greater(table.column("seq"), pa.scalar(seen, pa.int64())))
        if not table.num_rows:
            return
        self.seen[route] = table.column("seq")[-1].as_py()
        batch = encoder.from_arrow(table)
        self.metrics.events_in.inc(len(batch))
        self.out.extend(engines.process(batch))
        self._failures(engines)

    def _control(self, frame: Frame) -> None:
        """Apply a change the splitter checked (queries are parsed again from their
        canonical text by the same function, once per process: the registry's cache)."""
        change = frames.control_of(frame)
        stream_changed = False
        if isinstance(change, LiveSetFrame):
            before = self.queries.registry.get(self.stream)
            self.queries.load_streams(list(change.streams))
            stream_changed = self.queries.registry.get(self.stream) != before
            self.reconcile(list(change.queries))
            self.live_sets += 1
        elif change.of_stream:
            # a stream's change holds its text (empty once removed) and version
            assert change.text is not None and change.version is not None
            self.queries.registry.learn(change.name, change.text, change.version)
            stream_changed = change.name == self.queries.stream
        elif change.removes:
            if change.name in self.queries.live:
                self.stop(change.name)
                self.queries.remove(change.name)
        else:
            self.stop(change.name)
            self.start(self.queries.put(change.query_entry()))
        if stream_changed:
            self.new_schema()
        self.outputs.update(self._live_outputs())
        if isinstance(change, ChangeFrame) and change.key is not None:
            self.status.outcome(self.sent, change.named(), Outcome.APPLIED, at=frame.get("at"),
                                partition=self.partition, live=self.queries.summary())
        self._send(Frame(frames.CONTROL, {**frame.headers, "part": self.partition},
                         frame.payload))

    def _complete(self, frame: Frame, upto: int) -> None:
        ts = frame.get("ts")
        for engines, _ in self.routes.values():
            if ts is not None and (self.ts is None or ts > self.ts):
                self.out.extend(engines.punctuate(ts))
                self._failures(engines)
        if ts is not None and (self.ts is None or ts > self.ts):
            self.ts = ts
        kind = frames.MATCHES
        if frame.kind is frames.END:
            for engines, _ in self.routes.values():
                self.out.extend(engines.flush())
                self._failures(engines)
            self.restart_engines()
            self.ts = None
            kind = frames.END
        self.upto = upto
        self._dead_letters()
        out, self.out = self.out, []
        self.metrics.events_out.inc(len(out))
        headers = {"part": self.partition, "upto": upto, "ts": ts, "held": self._held()}
        if self.topics.shards == 1:
            self._send(Frame(kind, headers, orjson.dumps(out) if out else b""))
            return
        by_shard: list[list[dict]] = [[] for _ in range(self.topics.shards)]
        for composite in out:
            by_shard[self._shard(composite["query"])].append(composite)
        for shard, mine in enumerate(by_shard):  # every shard gets the pulse
            self._send(Frame(kind, headers, orjson.dumps(mine) if mine else b""), shard)

    def _held(self) -> int | None:
        """The smallest seq of a composite event the engines still hold back (a
        MATCH_RECOGNIZE match waiting behind an earlier partial one): the merge releases
        the queries that may hold some only below it."""
        held = [seq for engines, _ in self.routes.values() for seq in [engines.held()]
                if seq is not None]
        return min(held, default=None)

    def _live_outputs(self) -> dict[str, str]:
        return {name: q.checked.query.output for name, q in self.queries.live.items()}

    def _shard(self, query: str) -> int:
        """The shard whose merger releases this query's composites: that of the INTO topic
        the coordinator's merger will give it (the query's latest, as it learns changes
        from the control frames sent before these composites)."""
        output = self.outputs.get(query)
        if output is None:
            self.outputs.update(self._live_outputs())
            output = self.outputs[query]
        return self.topics.shard_of(output)

    def _dead_letters(self) -> None:
        for engines, _ in self.routes.values():
            rejected = engines.take_dead_letters()
            for q, seq, reason in rejected:
                produce(self.sent, self.topics.dead_letters, orjson.dumps(
                    {"source": f"query {q.name}", "position": seq, "reason": reason,
                     "raw": None}))
            self.metrics.dead_letters.inc(len(rejected))

    def _send(self, frame: Frame, shard: int | None = None) -> None:
        """To the match topic of `shard` (None: of every shard)."""
        shards = range(self.topics.shards) if shard is None else (shard,)
        for k in shards:
            produce(self.sent, self.topics.matches_of(k), frame.payload,
                    partition=self.partition, headers=frame.kafka_headers())
