"""Prometheus metrics of one service (prometheus-client, a private registry per service so
threads in one process each have theirs), served on `--metrics-port` (0: off).

Every role: events in/out, dead letters, batch seconds, consumer lag (from the fetch
high-watermarks, not ListOffsets: see docs/broker.md), partitions held, live queries.
Workers also export, per query, the engines' own counts (`cep_engine_state`, from each
engine's metrics) and its live partial matches (`cep_partial_matches`) where the engine
has a count: SEQ by incremental automata: live instances; SEQ by delayed processing:
pending matches; MATCH: keys holding partial matches.
"""

from __future__ import annotations

from services.serve import log


class Metrics:
    def __init__(self, role: str, port: int = 0):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        labels = {"registry": self.registry}
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
        self.port = port
        self.server = None
        if port:
            from prometheus_client import start_http_server
            self.server, _ = start_http_server(port, registry=self.registry)
            log("metrics_listening", port=port, role=role)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def observe_lag(self, consumer) -> None:
        """Lag from the high-watermarks cached from fetches (not ListOffsets)."""
        total = 0
        assignment = consumer.assignment()
        for tp in consumer.position(assignment):
            try:
                _, high = consumer.get_watermark_offsets(tp, cached=True)
            except Exception:
                continue
            if high >= 0 and tp.offset >= 0:
                total += max(0, high - tp.offset)
        self.lag.set(total)
        self.partitions.set(len(assignment))

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
            for measure, value in measures.items():
                self.engine_state.labels(name, measure).set(value)
            evicted += measures.get("evicted_keys", 0)
            if partial is not None:
                self.partial_matches.labels(name).set(partial)
        self.evicted_keys.set(evicted)


def engine_counts(engine) -> dict[str, int]:
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


def match_slots_in_use(engine) -> int | None:
    """MATCH: slots taken (one per key holding partial matches; slot 0 is reserved)."""
    arrays = getattr(engine, "arrays", None)
    program = getattr(engine, "program", None)
    if not isinstance(arrays, dict) or "ctr" not in arrays or program is None:
        return None
    from cep_core.compiler.match import CTR

    try:  # the engine's counter layout (read, never written); None if it changes
        ctr = arrays["ctr"]
        return int(ctr[CTR.index("high")]) - 1 - int(ctr[CTR.index("free_top")])
    except (ValueError, IndexError):
        return None


def partial_matches(engine, counts: dict[str, int]) -> int | None:
    for measure in ("instances", "pending", "keys_with_partials"):
        if measure in counts:
            return counts[measure]
    return None
