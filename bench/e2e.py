"""`cep bench e2e`: the pipeline's throughput and latency on this machine, the chained
pipeline and the distributed one side by side in one run.

Everything runs here together: the embedded broker (unless --bootstrap), `cep serve all`
(chained: one process; distributed: splitter, workers, coordinator as processes) and the
load generator. The modes run one after the other on the same broker, each on its own
topics. Measured, per mode:

- `raw_consume_events_per_s`: a bare confluent-kafka consumer reading the source topic.
- `events_per_s`: source topic to composite-event topic, M-shape query: N JSON events
  (one per message) produced before the clock starts are taken in by the running pipeline;
  time from the splitter's first read to the coordinator's release of end of input.
- `framed_events_per_s`: the same with framed input (Arrow batches of 10k events).
- `p50_ms`/`p99_ms`: produce to composite event (its Kafka timestamp) at `latency_rate`
  events/s (`--latency-rate`; default half of the mode's `events_per_s`), JSON input,
  written by a producer tuned for latency (linger.ms 5: a load generator that wants its
  events seen soon; the broker's 200 ms default linger on tansu would be the first hop).
- `hops_ms`: p50 and p99 of each stage of that latency. Distributed (bench/hops.py):
  splitter (produce -> keyed frame), worker (-> match frame), coordinator (-> INTO
  record). Chained (the INTO records' `cep.taken_ms` header): source (produce -> the
  step that took the event began), chain (-> INTO record).
- `load`: the load average (1 minute) before the mode ran.

`--workload NAME` (`workload`): the events and queries. finance1 (the default): synthetic
trades, the M-shape query alone (INTO double_tops). A realistic workload (iot, activity,
clicks; cep_core/workloads.py): its events as `cep gen` writes them (`Workload.written`:
JSON lines without seq, ISO-8601 times, fields and nested objects the schema does not
name), one a message, and every query of its file (MATCH, SEQ and WINDOW) registered;
the framed run sends its events in the schema's columns (`Workload.generate`: times in
epoch ms, no extra field), and the latency is that of its MATCH query's composite events
(the first query of the file). Its runs (warm-up, JSON, framed, latency) are consecutive
slices of one stream, so event time never goes back (a WINDOW query would send a repeated
stream's events to the dead letters as late); finance1's runs repeat the same trades.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cep_service.bench.cores import written_lines
from cep_service.bench import doc_record
from cep_service.bench.hops import hops
from cep_core.control_message import check_query
from cep_core.control_ops import Op
from cep_service.stream.chained import STAGE_HEADER
from cep_service.stream.checkpoint import PIPELINE_HEADER
from cep_core.workloads import WORKLOADS
from cep_service.stream.broker import EmbeddedBroker
from cep_service.stream.control import ControlMessage, publish, split_query_file
from cep_service.stream.demo import STREAM, demo_queries, start_services, stop_services, trade_lines
from cep_service.stream.status import StatusEvent
from cep_service.stream.frames import encode_table
from cep_service.stream.kafka import (Deliveries, KafkaSettings, Topics, flush_all, produce,
                                      produce_end)
from cep_service.stream.pipeline import create_topics


def _frames(lines_table: pa.Table, size: int) -> list[bytes]:
    return [encode_table(lines_table.slice(i, size)) for i in range(0, lines_table.num_rows,
                                                                   size)]


def _status(settings: KafkaSettings, topic: str,
            since: int) -> list[tuple[int, Any, int]]:
    """(offset, record) of the status records from offset `since` on."""
    consumer = settings.consumer()
    consumer.assign([TopicPartition(topic, 0, since)])
    out = []
    quiet = time.monotonic()
    while time.monotonic() - quiet < 0.05:
        for m in consumer.consume(1000, 0.02):
            offset, value = m.offset(), m.value()
            if not m.error():
                assert offset is not None and value is not None  # a consumed JSON record
                out.append((offset, orjson.loads(value), m.timestamp()[1]))
                quiet = time.monotonic()
    consumer.close()
    return out


MODES = ("chained", "distributed")
LATENCY_PRODUCER = {"linger.ms": 5}
DEFAULT_WORKLOAD = "finance1"
WARM_UP = 2000  # events sent (and ended) before the clock runs: joins, kernels loaded


@dataclass(frozen=True)
class Streamed:
    """What a run sends and registers: the JSON lines of the warm-up, of the measured run
    and of the latency run (one event a message), the framed run's events as a table, the
    queries (name, text), their INTO topics, and the INTO topic whose composite events
    the latency run times."""

    workload: str
    stream: str
    warm: list[bytes]
    lines: list[bytes]
    table: object
    latency_lines: list[bytes]
    queries: list[tuple[str, str]]
    outputs: list[str]
    timed: str


def streamed(workload: str, events: int) -> Streamed:
    """finance1: the trades and M-shape query of `cep demo` (as before --workload); any
    other workload: its events as users write them and its whole query file."""
    chosen = WORKLOADS[workload]
    if workload == DEFAULT_WORKLOAD:
        lines = trade_lines(events)
        table = chosen.generate(events, 1).drop_columns(["seq"])
        return Streamed(workload, STREAM, lines[:WARM_UP], lines, table, lines,
                        demo_queries()[:1], ["double_tops"], "double_tops")
    # one stream: warm-up, JSON run, framed run, latency run, in this order
    total = WARM_UP + 3 * events
    lines = written_lines(workload, total)
    table = chosen.generate(total, 1).drop_columns(["seq"])
    framed_at = WARM_UP + events
    queries = split_query_file(chosen.query_text(seed=1), f"{workload}.cep")
    outputs = [check_query(name, text).query.output for name, text in queries]
    return Streamed(workload, chosen.stream, lines[:WARM_UP], lines[WARM_UP:framed_at],
                    table.slice(framed_at, events), lines[framed_at + events:], queries,
                    list(dict.fromkeys(outputs)), outputs[0])


class Bench:
    def __init__(self, bootstrap: str, workers: int, coordinators: int = 1,
                 mode: str = "chained", run: Streamed | None = None):
        self.settings = KafkaSettings(bootstrap, session_timeout_ms=2000)
        self.mode = mode
        self.run = run or streamed(DEFAULT_WORKLOAD, 0)
        stream = self.run.stream
        name = f"{mode}-{os.getpid()}"
        self.topics = Topics(stream, source=f"bench.{stream}.{name}",
                             prefix=f"bench-{name}", shards=coordinators)
        create_topics(self.settings, self.topics, 4, self.run.outputs)
        self.deliveries = Deliveries()
        self.producer = self.settings.producer(on_delivery=self.deliveries)
        self.status_seen = 0
        self.last_seq = -1
        self.workers = workers

    def start(self) -> None:
        for name, text in self.run.queries:
            publish(self.settings, self.topics.control, ControlMessage(Op.ADD, name, text))
        log_path = Path(tempfile.gettempdir()) / f"cep-bench-{self.mode}-{os.getpid()}.log"
        self.services = start_services(self.settings.bootstrap, self.workers, log_path,
                                       self.topics, distributed=self.mode == "distributed")

    def stop(self) -> None:
        stop_services(self.services)

    def send(self, values: list[bytes], framed: bool = False, end: bool = True) -> None:
        headers = [("kind", b"events")] if framed else None
        for value in values:
            produce(self.producer, self.topics.source, value, headers=headers)
        if end:
            produce_end(self.producer, self.topics.source)
        flush_all(self.producer, 60, self.deliveries, "benchmark events")

    def wait_end(self, timeout_s: float = 120) -> float:
        """Wall time at which the last coordinator shard announced the next end of input."""
        deadline = time.monotonic() + timeout_s
        ended: set[int] = set()
        while time.monotonic() < deadline:
            for offset, record, ts in _status(self.settings, self.topics.status,
                                              self.status_seen):
                self.status_seen = offset + 1
                if record.get("event") == StatusEvent.END_OF_INPUT:
                    ended.add(record.get("shard", 0))
                    if len(ended) == self.topics.shards:
                        return ts / 1000
            time.sleep(0.02)
        raise TimeoutError("end of input not released")


def raw_consume(settings: KafkaSettings, topic: str, n: int) -> float:
    consumer = settings.consumer()
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got = 0
    started = finished = None
    while got < n:
        messages = consumer.consume(10000, 1.0)
        if not messages and started is not None:
            break  # the topic holds fewer than n records
        if started is None and messages:
            started = time.perf_counter()
        got += len(messages)
        finished = time.perf_counter()
    assert started is not None and finished is not None  # (n > 0 records were read)
    rate = got / (finished - started)
    consumer.close()
    return rate


def run_bench(events: int, workers: int, bootstrap: str | None, latency_s: float,
              latency_rate: float = 0, coordinators: int = 1,
              modes: tuple[str, ...] = MODES,
              workload: str = DEFAULT_WORKLOAD) -> dict:
    """Every mode of `modes` measured on one broker, one after the other, on `workload`'s
    events and queries."""
    run = streamed(workload, events)
    broker = None
    if not bootstrap:
        broker = EmbeddedBroker().start()
        bootstrap = broker.bootstrap
    try:
        measured = {mode: run_mode(Bench(bootstrap, workers, coordinators, mode, run),
                                   latency_s, latency_rate)
                    for mode in modes}
    finally:
        if broker is not None:
            broker.kill()
    return {"workload": workload, "queries": [name for name, _ in run.queries],
            "latency_of": run.timed, "events": events, "workers": workers,
            "coordinators": coordinators, **measured}


def record_result(result: dict, command: str) -> None:
    """The run's table into docs/benchmarks.md (section e2e), one row per mode."""
    header = ["mode", "workload", "events", "JSON events/s", "of a bare consume",
              "framed events/s", "latency at (events/s)", "p50 ms", "p99 ms"]
    rows = [[mode, result["workload"], f"{result['events']:,}",
             f"{m['events_per_s']:,}", f"{m['ratio']}x", f"{m['framed_events_per_s']:,}",
             f"{m['latency_rate']:,}", str(m["p50_ms"]), str(m["p99_ms"])]
            for mode, m in result.items() if mode in MODES]
    doc_record.record("e2e", f"{doc_record.provenance(command)}\n\n"
                      f"{doc_record.markdown_table(header, rows)}")


def run_mode(bench: Bench, latency_s: float, latency_rate: float) -> dict:
    run = bench.run
    events = len(run.lines)
    load = round(os.getloadavg()[0], 2)
    bench.start()
    try:
        bench.send(run.warm)  # warm-up: joins, kernels compiled or loaded
        bench.wait_end()
        # The load is produced as fast as possible; the clock runs from its first record.
        started = time.time()
        bench.send(run.lines)
        json_s = bench.wait_end() - started
        started = time.time()
        bench.send(_frames(run.table, 10000), framed=True)
        framed_s = bench.wait_end() - started
        # seq of the next record: warm-up + JSON run (one each) + framed run (one per event)
        base = len(run.warm) + 2 * events
        rate = latency_rate or 0.5 * events / json_s
        p50, p99, hops_ms = latency(bench, run.latency_lines, rate, latency_s, base)
        raw = raw_consume(bench.settings, bench.topics.source, 2 * events)
    finally:
        bench.stop()
    measured = events / json_s
    return {"events_per_s": round(measured),
            "raw_consume_events_per_s": round(raw), "ratio": round(measured / raw, 3),
            "framed_events_per_s": round(events / framed_s), "latency_rate": round(rate),
            "p50_ms": p50, "p99_ms": p99, "hops_ms": hops_ms, "load": load}


def latency(bench: Bench, lines: list[bytes], rate: float, seconds: float,
            base: int) -> tuple[float | None, float | None, dict | None]:
    """Produce at `rate` for `seconds`; latency of each composite event from the produce
    time of its last event."""
    consumer = bench.settings.consumer()
    consumer.assign([TopicPartition(bench.run.timed, 0, OFFSET_BEGINNING)])
    while consumer.consume(10000, 0.2):
        pass  # skip the earlier runs' output
    n = min(len(lines), int(rate * seconds))
    chunk = max(1, int(rate / 200))
    sent = np.zeros(n)
    producer = bench.settings.producer(on_delivery=bench.deliveries, **LATENCY_PRODUCER)
    started = time.time()
    for i in range(0, n, chunk):
        due = started + i / rate
        while time.time() < due:
            time.sleep(0.0005)
        now = time.time()
        for line in lines[i:i + chunk]:
            produce(producer, bench.topics.source, line)
        sent[i:i + chunk] = now
        producer.poll(0)
    produce_end(producer, bench.topics.source)
    flush_all(producer, 30, bench.deliveries, "benchmark events")
    bench.wait_end()
    delays = []
    # (value, create time ms, produce time ms of its last event)
    released: list[tuple[bytes, float, float]] = []
    taken = []  # chained: (produce time ms of its last event, taken ms, create time ms)
    mine = (PIPELINE_HEADER, bench.topics.group("coordinator").encode())
    for m in iter(lambda: consumer.consume(10000, 0.3), []):
        for message in m:
            headers = message.headers() or []
            value = message.value()
            if mine not in headers or value is None:
                continue  # another mode's run (composites are never tombstones)
            c = orjson.loads(value)
            index = c["seq"] - base
            if 0 <= index < n:
                delays.append(message.timestamp()[1] / 1000 - sent[index])
                released.append((value, message.timestamp()[1],
                                 sent[index] * 1000))
                stage = dict(headers).get(STAGE_HEADER)
                if stage is not None:
                    taken.append((sent[index] * 1000, int(stage), message.timestamp()[1]))
    consumer.close()
    if not delays:
        return None, None, None
    stages = _stages(taken) if bench.mode == "chained" else \
        hops(bench.settings, bench.topics, 4, bench.run.timed, released)
    return (round(float(np.percentile(delays, 50)) * 1000, 1),
            round(float(np.percentile(delays, 99)) * 1000, 1), stages)


def _stages(taken: list[tuple]) -> dict:
    """p50 and p99 (ms) of the chained pipeline's stages: source (produce -> the step
    that took the event began), chain (-> the INTO record)."""
    times = np.array(taken, dtype=float)

    def pct(values: np.ndarray) -> list[float]:
        return [round(float(np.percentile(values, q)), 1) for q in (50, 99)]

    return {"source": pct(times[:, 1] - times[:, 0]), "chain": pct(times[:, 2] - times[:, 1])}
