"""`cep demo`: the whole pipeline on a synthetic trade stream.

Starts the embedded broker (unless KAFKA_BOOTSTRAP / --bootstrap names one), `cep serve
all` (the chained pipeline: one process; with --distributed splitter, K workers and
coordinator as processes), registers the M-shape and a WINDOW
query, produces trades (one JSON per message) and an end-of-input marker, and shows the
composite events as they arrive (rich), or with --verify compares the output topics with
`cep run --engine reference` on the same events and prints one summary line.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from rich.console import Console
from rich.live import Live
from rich.table import Table

from cep_core import reference
from cep_core.composite import sort_key
from cep_core.control_message import check_query
from cep_core.control_ops import Op
from cep_core.event_io import read_events
from cep_core.home import state_dir
from cep_core.workloads import WORKLOADS
from cep_service.stream.broker import EmbeddedBroker, free_port
from cep_service.stream.checkpoint import PIPELINE_HEADER, read_partitions
from cep_service.stream.control import ControlMessage, input_ended, publish
# Deliberately like bench/live.py's: an import list, not code
from cep_service.stream.kafka import (
    Deliveries,
    KafkaSettings,
    Topics,
    flush_all,
    produce,
    produce_end,
    read_all,
)
from cep_service.stream.pipeline import create_topics
from cep_service.stream.serve import die_with_parent

STREAM = "trades"
ACTIVITY = """QUERY activity FROM trades INTO trade_stats
SELECT symbol, count(*) AS trades, sum(volume) AS volume, max(price) AS hi
FROM trades [RANGE 5 seconds SLIDE 1 second]
WHERE volume > 100
GROUP BY symbol;"""


def demo_queries() -> list[tuple[str, str]]:
    mshape = WORKLOADS["finance1"].query_text(seed=1)
    mshape = mshape[mshape.index("QUERY"):].replace("QUERY finance1 FROM trades INTO "
                                                    "finance1", "QUERY mshape FROM trades "
                                                    "INTO double_tops")
    return [("mshape", mshape), ("activity", ACTIVITY)]


def trade_lines(events: int, seed: int = 1) -> list[bytes]:
    """Synthetic trades as JSON lines (no seq field: the splitter assigns positions)."""
    table = WORKLOADS["finance1"].generate(events, seed).drop_columns(["seq"])
    return [orjson.dumps(r) for r in table.to_pylist()]


def start_services(bootstrap: str, workers: int, log_path: Path, topics: Topics,
                   api_port: int = 0, distributed: bool = False) -> subprocess.Popen:
    """`cep serve all` for `topics` (its prefix, source and control topics; its shards:
    coordinators), chained or `distributed` (`workers` worker processes); the Faust web
    server on a free port; the API and console on `api_port` (0: none), with the services'
    metrics endpoints from a free port on, which the console reads (docs/console.md)."""
    log = open(log_path, "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "cep_service.cli.main", "serve", "all", "--workers", str(workers),
         "--stream", topics.stream, "--source", topics.source, "--control", topics.control,
         "--topic-prefix", topics.prefix, "--web-port", str(free_port()),
         "--api-port", str(api_port), "--coordinators", str(topics.shards)]
        + (["--distributed"] if distributed else [])
        + (["--metrics-port", str(free_port())] if api_port else []),
        env={**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "CEP_SESSION_TIMEOUT_MS": "2000"},
        stdout=log, stderr=log, start_new_session=True, preexec_fn=die_with_parent)


class ServiceFailed(RuntimeError):
    """A service of the demo died: the message holds the last lines of their log."""


def check_services(process: subprocess.Popen, log_path: Path, lines: int = 25) -> None:
    """ServiceFailed as soon as `cep serve all` has exited or logged a process's death."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    died = process.poll() is not None or '"event":"process_exited"' in text
    if died:
        tail = "\n".join(text.splitlines()[-lines:])
        raise ServiceFailed(f"a service failed to start (log: {log_path}); its last lines:"
                            f"\n{tail}")


def stop_services(process: subprocess.Popen, timeout_s: float = 60) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


def wait_status(settings: KafkaSettings, status: str, event: str, timeout_s: float,
                check: Callable[[], object] | None = None, **match: Any) -> dict:
    """The first status record of `event` with the `match` fields; `check()` is called
    between reads (to fail early)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check is not None:
            check()
        for message in read_all(settings, status, idle_s=0.1):
            record = orjson.loads(message.value())
            if record.get("event") == event and all(record.get(k) == v
                                                    for k, v in match.items()):
                return record
        time.sleep(0.2)
    raise TimeoutError(f"no {event} {match} on the status topic after {timeout_s} s")


def usable_port(port: int) -> int:
    """`port` if nothing listens on it on 127.0.0.1, else a free one."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            return free_port()


def run_demo(events: int, workers: int, verify: bool, bootstrap: str | None, rate: float,
             console: Console, api_port: int = 0, hold: bool = False, coordinators: int = 1,
             distributed: bool = False) -> bool:
    """The demo; with `api_port`, the API and web console there too (its URL printed),
    and with `hold` everything stays up after the trades until Ctrl-C or SIGTERM;
    `coordinators` coordinator shards; `distributed`: one process per role (`workers`
    workers), else the chained pipeline."""
    broker = None
    if not bootstrap:
        broker = EmbeddedBroker().start()
        bootstrap = broker.bootstrap
    settings = KafkaSettings(bootstrap, session_timeout_ms=2000)
    run_id = f"{os.getpid()}-{int(time.time())}"
    topics = Topics(STREAM, source=f"demo.{STREAM}.{run_id}", prefix=f"demo-{run_id}",
                    shards=coordinators)
    queries = demo_queries()
    log_path = state_dir("logs") / f"demo-{run_id}.log"
    create_topics(settings, topics, 4, ["double_tops", "trade_stats"])
    for name, text in queries:
        publish(settings, topics.control, ControlMessage(Op.ADD, name, text))
    api_port = usable_port(api_port) if api_port else 0
    services = start_services(bootstrap, workers, log_path, topics, api_port, distributed)
    try:
        wait_status(settings, topics.status, "query_live", 120, op="set",
                    check=lambda: check_services(services, log_path))
        if api_port:
            console.print(f"console: http://127.0.0.1:{api_port}/ (API: "
                          f"http://127.0.0.1:{api_port}/openapi.json)", markup=False)
        lines = trade_lines(events)
        output = _consumer(settings, ["double_tops", "trade_stats"])
        pipeline = topics.group("coordinator")  # INTO records of this run carry it
        deliveries = Deliveries()
        # at a rate, the trades go out at once (linger 5 ms, not tansu's 200): the view
        # shows composite events tens of milliseconds after their last trade
        producer = settings.producer(on_delivery=deliveries,
                                     **({"linger.ms": 5} if rate else {}))
        started = time.perf_counter()
        chunk = 1000 if rate else len(lines)
        received: list[tuple[str, int, dict]] = []
        view = _LiveView(console) if not verify else None
        for start in range(0, len(lines), chunk):
            for line in lines[start:start + chunk]:
                produce(producer, topics.source, line)
            producer.poll(0)
            if rate:
                time.sleep(chunk / rate)
            _collect(output, received, view, pipeline)
        produce_end(producer, topics.source)
        flush_all(producer, 30, deliveries, "trades")
        done = _collect_until_end(settings, output, received, view, pipeline, topics.status,
                                  len(lines) - 1, 300 + events / 1000, topics.shards)
        elapsed = time.perf_counter() - started
        if view is not None:
            view.stop()
        ok = True
        shape = f"{workers} worker{'s' if workers != 1 else ''}" if distributed else \
            "chained"
        summary = (f"demo: {events} events, {shape}, "
                   + (f"{coordinators} coordinator shards, " if coordinators > 1 else "") +
                   f"{len(received)} composite events, {events / elapsed:,.0f} events/s "
                   f"(produce to last composite event)")
        if verify:
            mismatches = _verify(queries, lines, received, settings)
            ok = not mismatches
            summary += "; verify: " + ("identical to cep run --engine reference" if ok
                                      else "DIFFERS: " + "; ".join(mismatches))
        print(summary)
        output.close()
        if not done:
            print(f"demo: no end of input on the status topic in time (log: {log_path})",
                  file=sys.stderr)
        if hold and api_port:
            print(f"demo: the pipeline and the console (http://127.0.0.1:{api_port}/) stay "
                  "up: add queries there; Ctrl-C stops everything", flush=True)
            try:
                while services.poll() is None:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass
        return ok and done
    finally:
        code = stop_services(services)
        if code != 0:
            print(f"services exited with code {code} (log: {log_path})", file=sys.stderr)
        if broker is not None:
            broker.stop()


def _consumer(settings: KafkaSettings, topics: list[str]) -> Consumer:
    """A consumer of every partition of the INTO topics, from the beginning."""
    consumer = settings.consumer()
    metadata = consumer.list_topics(timeout=10).topics
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics
                     for p in sorted(metadata[t].partitions)])
    return consumer


def _collect(consumer: Any, received: list, view: _LiveView | None,
             pipeline: str | None = None, messages: list[Any] | None = None) -> None:
    """Take what the consumer has (or `messages`): (topic, partition, composite) appended
    to `received`; records another pipeline wrote (a shared broker) are skipped."""
    tag = pipeline.encode() if pipeline else None
    for message in consumer.consume(10000, 0.05) if messages is None else messages:
        if message.error() or (tag and (PIPELINE_HEADER, tag) not in (message.headers()
                                                                      or ())):
            continue
        composite = orjson.loads(message.value())
        received.append((message.topic(), message.partition(), composite))
        if view is not None:
            view.add(message.topic(), composite)
    if view is not None:
        view.refresh()


def _collect_until_end(settings: KafkaSettings, consumer: Consumer, received: list,
                       view: _LiveView | None, pipeline: str | None,
                       status: str, last: int, timeout_s: float, shards: int = 1) -> bool:
    """Collect until every coordinator shard's end-of-input record for seq `last` is on
    the `status` topic (False if not within `timeout_s`), then read every partition assigned
    to `consumer` from its position up to the partition's fetch high-watermark: the
    coordinator writes every composite event before that record. The rest is read with a
    new consumer, whose high-watermarks come from fetches made after the end record
    (ListOffsets is wrong on tansu)."""
    deadline = time.monotonic() + timeout_s
    while not input_ended([orjson.loads(m.value()) for m in read_all(
            settings, status, idle_s=0.05)], shards, last):
        if time.monotonic() > deadline:
            return False
        _collect(consumer, received, view, pipeline)
    rest = [TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0
                           else OFFSET_BEGINNING)
            for tp in consumer.position(consumer.assignment())]
    messages: list = []
    read_partitions(settings, rest, messages.append, timeout_s=max(60.0, timeout_s),
                    idle_s=float("inf"))
    _collect(None, received, view, pipeline, messages)
    return True


def compare_outputs(expected: dict[str, list[dict]], received: list[tuple[str, int, dict]],
                    index: dict[str, int]) -> list[str]:
    """Each INTO topic against the reference (`expected`: topic -> composites in
    `sort_key` order; `index`: query name -> its place in the query set). The coordinator
    writes a topic in `sort_key` order and the producer places each composite by its key,
    so each partition must hold its composites in `sort_key` order, and all partitions
    merged by `sort_key` must equal the reference; there is no order across partitions."""
    problems = []
    for topic, want in expected.items():
        parts: dict[int, list] = {}
        for t, partition, composite in received:
            if t == topic:
                parts.setdefault(partition, []).append(composite)
        keyed = {p: [sort_key(c, index.get(c["query"], -1)) for c in got]
                 for p, got in parts.items()}
        for p, keys in sorted(keyed.items()):
            at = next((i for i in range(1, len(keys)) if keys[i] <= keys[i - 1]), None)
            if at is not None:
                problems.append(f"{topic}: partition {p} out of order at its record {at}")
        got = [c for _, c in sorted(((k, c) for p in parts for k, c in
                                     zip(keyed[p], parts[p])), key=lambda kc: kc[0])]
        if got != want:
            problems.append(f"{topic}: {len(got)} composite events in {len(parts)} "
                            f"partition(s), reference {len(want)}")
    return problems


def _verify(queries: list[tuple[str, str]], lines: list[bytes],
            received: list[tuple[str, int, dict]], settings: KafkaSettings) -> list[str]:
    checked = [check_query(name, text) for name, text in queries]
    for i, q in enumerate(checked):
        q.index = i
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as f:
        f.write(b"\n".join(lines) + b"\n")
    try:
        events, _ = read_events(f.name, checked[0].schema)
    finally:
        os.unlink(f.name)
    expected = reference.run(checked, events)
    outputs = {q.name: q.query.output for q in checked}
    return compare_outputs({o: [c for c in expected if outputs[c["query"]] == o]
                            for o in dict.fromkeys(outputs.values())}, received,
                           {q.name: q.index for q in checked})


class _LiveView:
    """Counts and the latest composite events of every output topic, redrawn in place (each
    topic keeps its own latest few, so a rare query's matches stay in view)."""

    def __init__(self, console: Console, per_topic: int = 6) -> None:
        self.per_topic = per_topic
        self.counts: dict[str, int] = {}
        self.recent: dict[str, deque] = {}
        self.live = Live(self._render(), console=console, refresh_per_second=8)
        self.live.start()

    def add(self, topic: str, composite: dict) -> None:
        self.counts[topic] = self.counts.get(topic, 0) + 1
        self.recent.setdefault(topic, deque(maxlen=self.per_topic)).append(composite)

    def _render(self) -> Table:
        table = Table(title=f"composite events (latest {self.per_topic} per topic)")
        table.add_column("topic", no_wrap=True)
        table.add_column("seq", justify="right", no_wrap=True)
        table.add_column("key", no_wrap=True)
        table.add_column("fields", overflow="fold")
        for topic, composites in self.recent.items():
            for i, c in enumerate(composites):
                fields = {k: v for k, v in c.items() if k not in ("query", "key", "seq",
                                                                  "start_seq", "events")}
                label = f"{topic} ({self.counts[topic]:,})" if i == 0 else ""
                table.add_row(label, str(c["seq"]), str(c.get("key")),
                              orjson.dumps(fields).decode(), end_section=i == len(composites) - 1)
        return table

    def refresh(self) -> None:
        self.live.update(self._render())

    def stop(self) -> None:
        self.refresh()
        self.live.stop()
        if not self.live.console.is_terminal:  # rich leaves the last line open there
            self.live.console.line()
