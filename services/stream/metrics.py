"""Prometheus metrics of one service (prometheus-client, a private registry per service so
threads in one process each have theirs), served on `--metrics-port` (0: off).

Every role: events in/out, dead letters, batch seconds, consumer lag (from the fetch
high-watermarks, not ListOffsets: see docs/broker.md), partitions held, live queries.
Workers also export, per query, the engines' own counts (`cep_engine_state`, from each
engine's metrics) and its live partial matches (`cep_partial_matches`) where the engine
has a count: SEQ by incremental automata: live instances; SEQ by delayed processing:
pending matches; MATCH: keys holding partial matches.

The same port answers `GET /healthz` (200 while the process serves) and `GET /readyz`
(200 once connected, assigned and caught up, else 503; both JSON): see `Readiness`.
"""

from __future__ import annotations

# Deferred imports: prometheus_client loads when metrics are first made or served, and the MATCH
# compiler (numba) only when match slots are counted: a process that keeps no metrics imports
# neither.

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson

from cep_core.control_message import INFINITE
from cep_service.stream.serve import log

READY_MAX_LAG_ENV = "CEP_READY_MAX_LAG"


@dataclass
class Readiness:
    """What `/readyz` reports, from the service's periodic lag observation: `connected`
    (a fetch of every assigned partition was answered), `assigned` (it holds partitions,
    or, for a worker in a group, its group gave it an assignment even if empty), `lag`
    (messages behind the fetch high-watermarks; caught up: at most `max_lag`,
    CEP_READY_MAX_LAG, default 10000)."""

    connected: bool = False
    assigned: bool = False
    joined: bool = False  # a group member's assignment came (it may hold no partition)
    lag: int | None = None
    observed_at: float | None = None
    max_lag: int = 10_000

    def ready(self) -> bool:
        return self.connected and self.assigned and self.lag is not None and \
            self.lag <= self.max_lag

    def to_json(self) -> dict:
        age = None if self.observed_at is None else round(time.monotonic() - self.observed_at,
                                                          3)
        return {"ready": self.ready(), "connected": self.connected, "assigned": self.assigned,
                "lag": self.lag, "max_lag": self.max_lag, "observed_s_ago": age}


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:  # scrapes and probes are not worth a log line
        pass


def serve_http(port: int, registry: Any, readiness: Readiness, role: str) -> WSGIServer:
    """Prometheus metrics, /healthz and /readyz on 0.0.0.0:port in a daemon thread."""
    from prometheus_client import make_wsgi_app

    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in ("/healthz", "/readyz"):
            return metrics_app(environ, start_response)
        body = {"role": role, "alive": True} if path == "/healthz" else \
            {"role": role, **readiness.to_json()}
        ok = path == "/healthz" or body["ready"]
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "application/json")])
        return [orjson.dumps(body)]

    server = make_server("0.0.0.0", port, app, _Server, _QuietHandler)
    threading.Thread(target=server.serve_forever, name=f"metrics-{role}", daemon=True).start()
    return server


class Metrics:
    def __init__(self, role: str, port: int = 0):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        labels: dict[str, Any] = {"registry": self.registry}
        self.events_in = Counter("cep_events_in", "Events taken in", **labels)
        self.events_out = Counter("cep_events_out", "Composite events (splitter: events "
                                  "routed to keyed partitions) sent", **labels)
        self.dead_letters = Counter("cep_dead_letters", "Records sent to dead letters",
                                    **labels)
        self.late_events = Counter("cep_late_events", "Events later than the allowed "
                                   "lateness, sent to the late-events topic", **labels)
        self.evicted_keys = Gauge("cep_evicted_keys", "Idle keys whose state the engines "
                                  "evicted (summed over queries and partitions)", **labels)
        self.strings = Gauge("cep_strings", "Strings in the workers' string dictionaries "
                             "(summed over partitions and routes)", **labels)
        self.strings_dropped = Counter("cep_strings_dropped", "Strings dropped from the "
                                       "dictionaries at checkpoints (keys gone for good)",
                                       **labels)
        self.paused = Counter("cep_consumer_pauses", "Times consumption paused for "
                              "backpressure (output queue or pending results full)", **labels)
        self.batch_seconds = Histogram(
            "cep_batch_seconds", "Time to handle one consumed batch", **labels,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        self.lag = Gauge("cep_consumer_lag", "Messages behind the fetch high-watermark",
                         **labels)
        self.partitions = Gauge("cep_partitions", "Partitions held (worker: assigned keyed "
                                "partitions; splitter, coordinator: partitions read)",
                                **labels)
        self.queries = Gauge("cep_live_queries", "Live queries", **labels)
        self.partial_matches = Gauge("cep_partial_matches", "Live partial matches of a "
                                     "query, summed over partitions", ["query"], **labels)
        self.engine_state = Gauge("cep_engine_state", "An engine's own count (its metrics), "
                                  "summed over partitions", ["query", "measure"], **labels)
        # Deliberately like services/stream/metrics.py's other gauges above and below: metric
        # declarations, each its own name, help and labels
        self.failed_queries = Gauge("cep_failed_queries", "1 for a query whose engine "
                                    "failed in some partition this process holds (the query "
                                    "stopped alone; the reason is on the status topic)",
                                    ["query"], **labels)
        self.shard = Gauge("cep_coordinator_shard", "coordinator: this process's shard (the "
                           "value) of how many (`shards` label); every other metric of the "
                           "process is that shard's own", ["shards"], **labels)
        # the pipeline view (GET /api/pipeline, docs/console.md)
        self.service = Gauge("cep_service", "1, labelled with the service's name on the status "
                             "topic and its role", ["service", "role"], **labels)
        self.partition_lag = Gauge("cep_partition_lag", "Messages behind the fetch "
                                   "high-watermark, per partition read",
                                   ["topic", "partition"], **labels)
        self.checkpoint_time = Gauge("cep_checkpoint_time_seconds", "Unix time of the last "
                                     "checkpoint written (0: none yet)", **labels)
        self.checkpoint_generation = Gauge("cep_checkpoint_generation", "Generation of the "
                                           "last checkpoint written", **labels)
        self.checkpoint_seconds = Gauge("cep_checkpoint_seconds", "How long the last "
                                        "checkpoint took to write (chained: the whole cut, "
                                        "until the broker acknowledged it)", **labels)
        self.merged_seq = Gauge("cep_merged_seq", "coordinator: the seq each keyed partition "
                                "has been processed up to", ["partition"], **labels)
        self.merged_time = Gauge("cep_merged_event_time", "coordinator: the stream time (in "
                                 "the stream's unit) of each keyed partition's last pulse",
                                 ["partition"], **labels)
        self.merged_frame = Gauge("cep_merged_frame_time_seconds", "coordinator: Unix time "
                                  "a frame (pulse or composite events) last came from each "
                                  "keyed partition", ["partition"], **labels)
        self.withheld = Gauge("cep_withheld_composites", "coordinator: composite events not "
                              "final yet, per INTO topic, with what the oldest waits for",
                              ["output", "waits_for"], **labels)
        self.withheld_seq = Gauge("cep_withheld_seq", "coordinator: the seq of the oldest "
                                  "composite event withheld, per INTO topic", ["output"],
                                  **labels)
        self.stage_service = Gauge("cep_stage_service", "chained: 1 for each name a stage of "
                                   "this process writes as on the status topic",
                                   ["stage", "service"], **labels)
        self.role = role
        self.service.labels("", role).set(1)
        self.port = port
        self.readiness = Readiness(max_lag=int(os.environ.get(READY_MAX_LAG_ENV, 10_000)))
        self.server = None
        if port:
            self.server = serve_http(port, self.registry, self.readiness, role)
            log("metrics_listening", port=port, role=role)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def observe_lag(self, consumer: Any) -> None:
        """Lag from the high-watermarks cached from fetches (not ListOffsets)."""
        total = 0
        answered = True
        assignment = consumer.assignment()
        self.partition_lag.clear()  # partitions given up go
        for tp in consumer.position(assignment):
            try:
                _, high = consumer.get_watermark_offsets(tp, cached=True)
            except Exception:
                answered = False
                continue
            answered = answered and high >= 0
            if high >= 0 and tp.offset >= 0:
                total += max(0, high - tp.offset)
                self.partition_lag.labels(tp.topic, str(tp.partition)).set(
                    max(0, high - tp.offset))
        self.lag.set(total)
        self.partitions.set(len(assignment))
        ready = self.readiness
        ready.connected = answered and (bool(assignment) or ready.joined)
        ready.assigned = bool(assignment) or ready.joined
        ready.lag, ready.observed_at = total, time.monotonic()

    def identify(self, service: str) -> None:
        """The name this service writes on the status topic (the API joins its metrics
        with its status records by it)."""
        self.service.clear()
        self.service.labels(service, self.role).set(1)

    def checkpointed(self, generation: int, took_s: float | None = None) -> None:
        self.checkpoint_time.set(time.time())
        self.checkpoint_generation.set(generation)
        if took_s is not None:
            self.checkpoint_seconds.set(took_s)

    def stages(self, service: str, services: dict[str, list[str]],
               counted: Callable[[], dict[str, tuple[float, float]]]) -> None:
        """A chained process (services/stream/chained.py) named `service`: its role is
        `chained`; each stage's names on the status topic (`cep_stage_service{stage,
        service}`: routing the splitter's, partitions the workers', merge each coordinator
        shard's), and the
        events each stage took in and sent out (`cep_stage_events_in_total` and
        `cep_stage_events_out_total{stage}`), read when scraped from `counted()`: stage ->
        (in, out)."""
        self.role = "chained"
        self.identify(service)
        for stage, names in services.items():
            for name in names:
                self.stage_service.labels(stage, name).set(1)
        self.registry.register(_StageCollector(counted))

    def observe_merger(self, *mergers: Any) -> None:
        """coordinator (the mergers of a process's shards): per keyed partition the seq
        and stream time reached (the lowest of the shards) and when its last frame came;
        per INTO topic the composite events withheld and why."""
        seqs: dict[int, int] = {}
        times: dict[int, int] = {}
        frames: dict[int, float] = {}
        for merger in mergers:
            for part, upto in enumerate(merger.upto):
                seqs[part] = min(seqs.get(part, upto), upto)
            for part, (ts, at) in merger.frames.items():
                if ts is not None:
                    times[part] = min(times.get(part, ts), ts)
                frames[part] = max(frames.get(part, at), at)
        for gauge, values in ((self.merged_seq, seqs), (self.merged_time, times),
                              (self.merged_frame, frames)):
            for part, value in values.items():
                gauge.labels(str(part)).set(value)
        self.withheld.clear()
        self.withheld_seq.clear()
        for merger in mergers:
            for output, count, seq, waits_for in withheld(merger):
                self.withheld.labels(output, waits_for).set(count)
                self.withheld_seq.labels(output).set(seq)

    def observe_engines(self, engines_by_query: dict[str, list]) -> None:
        """Per query, the engines' counts summed over the partitions that run it."""
        evicted = 0
        for name, engines in engines_by_query.items():
            measures: dict[str, int] = {}
            partial = None
            for engine in engines:
                counts = engine_counts(engine)
                for measure, value in counts.items():
                    measures[measure] = measures.get(measure, 0) + value
                live = partial_matches(engine, counts)
                if live is not None:
                    partial = (partial or 0) + live
            measures["state_bytes"] = sum(state_bytes(engine) for engine in engines)
            for measure, value in measures.items():
                self.engine_state.labels(name, measure).set(value)
            evicted += measures.get("evicted_keys", 0)
            if partial is not None:
                self.partial_matches.labels(name).set(partial)
        self.evicted_keys.set(evicted)


def counted(counter: Any) -> float:
    """An unlabelled Counter's value."""
    return next(sample.value for family in counter.collect() for sample in family.samples
                if sample.name.endswith("_total"))


class _StageCollector:
    """cep_stage_events_{in,out}_total of a chained process, read from its stages'
    counters when scraped (exact rates whenever the API looks)."""

    def __init__(self, counted: Callable[[], dict[str, Any]]) -> None:
        self.counted = counted

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        found = self.counted()
        for i, (name, what) in enumerate((("in", "taken in"), ("out", "sent out"))):
            family = CounterMetricFamily(f"cep_stage_events_{name}", f"chained: events "
                                         f"each stage {what} (routing: source events in, "
                                         "events routed out; partitions: keyed events in, "
                                         "match composites out; merge: match composites in, "
                                         "composite events out)", labels=["stage"])
            for stage, values in found.items():
                family.add_metric([stage], values[i])
            yield family


def engines_by_query(states: Iterable[Any]) -> dict[str, list]:
    """The engines of keyed partition states (PartitionState), by query name."""
    found: dict[str, list] = {}
    for state in states:
        for engines, _ in state.routes.values():
            for engine in engines.engines:
                found.setdefault(engine.checked.name, []).append(engine)
    return found


def engine_counts(engine: Any) -> dict[str, int]:
    """The numeric entries of an engine's metrics (a dict or a method returning one)."""
    found = getattr(engine, "metrics", None)
    if callable(found):
        found = found()
    if not isinstance(found, dict):
        return {}
    counts = {k: int(v) for k, v in found.items() if isinstance(v, (int, float))}
    slots = match_slots_in_use(engine)
    if slots is not None:
        counts["keys_with_partials"] = slots
    return counts


def match_slots_in_use(engine: Any) -> int | None:
    """MATCH: slots taken (one per key holding partial matches; slot 0 is reserved)."""
    arrays = getattr(engine, "arrays", None)
    program = getattr(engine, "program", None)
    if not isinstance(arrays, dict) or "ctr" not in arrays or program is None:
        return None
    from cep_core.kernels.match_runtime import CTR

    try:  # the engine's counter layout (read, never written); None if it changes
        ctr = arrays["ctr"]
        return int(ctr[CTR.index("high")]) - 1 - int(ctr[CTR.index("free_top")])
    except (ValueError, IndexError):
        return None


def partial_matches(engine: Any, counts: dict[str, int]) -> int | None:
    for measure in ("instances", "pending", "keys_with_partials"):
        if measure in counts:
            return counts[measure]
    return None


def state_bytes(engine: Any) -> int:
    """Bytes of the numpy arrays an engine holds (its state as allocated: capacity, not
    only what is in use)."""
    total = 0
    for value in vars(engine).values():
        for array in value.values() if isinstance(value, dict) else (value,):
            total += getattr(array, "nbytes", 0) if type(array).__module__ == "numpy" else 0
    return total


def withheld(merger: Any) -> list[tuple[str, int, int, str]]:
    """(INTO topic, composite events withheld, seq of the oldest, what it waits for) of a
    coordinator's merger: `partition P` (a keyed partition short of its seq), `stream time`
    (every partition is past it, but the query's horizon has not passed yet), `end of
    input` (a query whose horizon is unbounded), `an earlier partial match in partition P`
    (a MATCH_RECOGNIZE match there waits behind one)."""
    out = []
    for output, heap in merger.pending.items():
        if not heap:
            continue
        seq = heap[0][0][0]
        behind = [p for p, upto in enumerate(merger.upto) if upto < seq]
        horizons = [q.horizon for q in merger.queries.values() if q.output == output]
        holding = [p for p, held in enumerate(merger.held) if held is not None and held <= seq]
        if any(h is INFINITE for h in horizons):
            waits_for = "end of input"
        elif holding and any(q.held for q in merger.queries.values() if q.output == output):
            waits_for = "an earlier partial match in partition " + ",".join(map(str, holding))
        elif behind:
            waits_for = "partition " + ",".join(map(str, behind))
        else:
            waits_for = "stream time"
        out.append((output, len(heap), seq, waits_for))
    return out
