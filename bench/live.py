"""`cep bench live`: adding queries to a running pipeline, into an empty kernel cache.

Everything runs here: the embedded broker (unless --bootstrap), `cep serve all` (the
chained pipeline, its default, with a fresh CEP_KERNEL_CACHE; figures from before
2026-11-28 14:00 UTC are of splitter, workers and coordinator as processes) and the load. `live`
query shapes go live first (their kernels compile while nothing else runs); then the
trades stream is produced at `rate` events/s, and after a quiet stretch `adds` new shapes
are added one at a time (each the moment the previous one is live). Measured:

- `accepted_to_live_s`: p50 / p99 / max of the time from a change's control record to the
  coordinator's `applied` record (every keyed partition switched): kernels compiled off
  the data path, then applied;
- `live_before_ms` / `live_during_ms` (p50, p99, max): produce time of a composite
  event's last event to its Kafka timestamp, for the MATCH queries that were live from the
  start (a WINDOW composite also waits for its window to end), before and during the adds:
  the adds must not stall them;
- `warm_kernels`: whether the splitter compiled off the data path (CEP_WARM_KERNELS), so
  the two ways can be run side by side.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

from cep_core.control_ops import Op
from cep_service.bench.e2e import _status
from cep_service.stream.broker import EmbeddedBroker
from cep_service.stream.control import ControlMessage, publish
from cep_service.stream.demo import STREAM, start_services, stop_services, trade_lines
# Deliberately like services/stream/demo.py's: an import list, not code
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
from cep_service.stream.status import Role, StatusEvent

AGGREGATES = ["Max(price)", "Min(price)", "Sum(volume)", "Max(volume)", "Min(volume)",
              "Avg(price)", "Avg(volume)"]


def shapes(n: int) -> list[tuple[str, str]]:
    """`n` distinct query shapes over trades: MATCH runs with different predicates and
    aggregates, and WINDOW aggregates with different windows (each its own kernels)."""
    out = []
    for i in range(n):
        name = f"q{i}"
        if i % 3 == 2:
            slide = 1 + i % 4
            out.append((name, f"QUERY {name} INTO live_{name}\n"
                        f"SELECT count(*) AS n, max(price) AS hi, sum(volume) AS v{i}\n"
                        f"FROM trades [RANGE {slide * (5 + i)} seconds SLIDE {slide} "
                        f"seconds]\nWHERE volume > {i * 10};"))
            continue
        op = ">" if i % 2 else "<"
        k = 4 + i % 3
        aggregate = AGGREGATES[i % len(AGGREGATES)]
        out.append((name, f"QUERY {name} FROM trades INTO live_{name} PARTITION BY symbol\n"
                    f"PATTERN ( . {' '.join(['up'] * k)} )\nDEFINE up AS price {op} Last(price)"
                    f"{' AND volume > ' + str(i * 10) if i >= 8 else ''}\n"
                    f"EMIT symbol = symbol, n = Count(), a{i} = {aggregate};"))
    return out


class LiveBench:
    def __init__(self, bootstrap: str, workers: int, shapes_: list[tuple[str, str]]):
        self.settings = KafkaSettings(bootstrap, session_timeout_ms=2000)
        self.topics = Topics(STREAM, source=f"bench.{STREAM}.{os.getpid()}",
                             prefix=f"benchlive-{os.getpid()}")
        self.shapes = shapes_
        create_topics(self.settings, self.topics, 4, [f"live_{n}" for n, _ in shapes_])
        self.deliveries = Deliveries()
        self.producer = self.settings.producer(on_delivery=self.deliveries)
        self.status_seen = 0
        self.workers = workers

    def start(self, live: int, kernel_cache: str) -> None:
        for name, text in self.shapes[:live]:
            publish(self.settings, self.topics.control, ControlMessage(Op.ADD, name, text))
        log_path = Path(tempfile.gettempdir()) / f"cep-bench-live-{os.getpid()}.log"
        os.environ["CEP_KERNEL_CACHE"] = kernel_cache
        self.services = start_services(self.settings.bootstrap, self.workers, log_path,
                                       self.topics)

    def records(self) -> list[tuple[int, dict, int]]:
        found = _status(self.settings, self.topics.status, self.status_seen)
        if found:
            self.status_seen = found[-1][0] + 1
        return found

    def wait(self, match: Callable[[dict], bool], timeout_s: float) -> tuple[dict, int]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for _, record, ts in self.records():
                if match(record):
                    return record, ts
            time.sleep(0.02)
        raise TimeoutError("no such status record in time")


def run_live_bench(live: int = 10, adds: int = 10, rate: float = 2000, quiet_s: float = 5,
                   workers: int = 1, bootstrap: str | None = None) -> dict:
    broker = None
    if not bootstrap:
        broker = EmbeddedBroker().start()
        bootstrap = broker.bootstrap
    cache = tempfile.mkdtemp(prefix="cep-bench-kernels-")
    kept = os.environ.get("CEP_KERNEL_CACHE")
    try:
        bench = LiveBench(bootstrap, workers, shapes(live + adds))
        bench.start(live, cache)
        # The live queries' kernels compile on the first events (nothing else runs yet).
        lines = trade_lines(max(int(rate * (quiet_s * 2 + adds * 60)), 20000))
        for line in lines[:2000]:
            produce(bench.producer, bench.topics.source, line)
        produce_end(bench.producer, bench.topics.source)
        flush_all(bench.producer, 60, bench.deliveries, "warm-up events")
        bench.wait(lambda r: r.get("event") == StatusEvent.END_OF_INPUT, 600)
        # seq of the next record: the warm-up's events and its end marker
        result = _adds(bench, lines[1:], 2001, rate, quiet_s, live, adds)
        stop_services(bench.services)
    finally:
        if kept is None:
            os.environ.pop("CEP_KERNEL_CACHE", None)
        else:
            os.environ["CEP_KERNEL_CACHE"] = kept
        if broker is not None:
            broker.kill()
    return {"live": live, "adds": adds, "rate": rate, "workers": workers,
            "warm_kernels": os.environ.get("CEP_WARM_KERNELS", "1") != "0", **result}


def _adds(bench: LiveBench, lines: list[bytes], base: int, rate: float, quiet_s: float,
          live: int, adds: int) -> dict:
    """Produce at `rate` from seq `base` on; after `quiet_s`, a second thread adds the
    shapes one by one (each once the previous one is live); then `quiet_s` more."""
    sent = np.full(len(lines), np.nan)
    waits: list[float] = []
    phase: list[float] = []  # start and end of the adds
    done = threading.Event()

    def adder() -> None:
        time.sleep(quiet_s)
        phase.append(time.time())
        for name, text in bench.shapes[live:live + adds]:
            t0 = time.time()
            offset = publish(bench.settings, bench.topics.control,
                             ControlMessage(Op.ADD, name, text))
            key = f"query/{name}"

            def applied(r: dict, key: str = key, offset: int = offset) -> bool:
                return (r.get("event") == StatusEvent.CHANGE and
                        r.get("role") == Role.COORDINATOR and
                        r.get("key") == key and r.get("offset") == offset)

            _, ts = bench.wait(applied, 600)
            waits.append(ts / 1000 - t0)
        phase.append(time.time())
        done.set()

    thread = threading.Thread(target=adder, daemon=True)
    started = time.time()
    thread.start()
    at, stop_at = base, len(lines)
    chunk = max(1, int(rate / 200))
    while at < stop_at:
        due = started + (at - base) / rate
        while time.time() < due:
            time.sleep(0.0005)
        now = time.time()
        for line in lines[at:at + chunk]:
            produce(bench.producer, bench.topics.source, line)
        sent[at:at + chunk] = now
        at += chunk
        bench.producer.poll(0)
        if done.is_set() and stop_at == len(lines):
            stop_at = min(len(lines), at + int(rate * quiet_s))
    thread.join(1)
    flush_all(bench.producer, 60, bench.deliveries, "benchmark events")
    time.sleep(2)
    start, end = (phase + [None, None])[:2]
    matches = [n for n, text in bench.shapes[:live] if "PATTERN" in text]
    before, during = _latencies(bench, matches, sent, start, end)
    return {"accepted_to_live_s": _percentiles(waits, 1.0, digits=2),
            "live_before_ms": _percentiles(before), "live_during_ms": _percentiles(during),
            "added": len(waits)}


def _latencies(bench: LiveBench, names: list[str], sent: np.ndarray, start: float | None,
               end: float | None) -> tuple[list[float], list[float]]:
    before, during = [], []
    for name in names:
        for message in read_all(bench.settings, f"live_{name}", idle_s=2.0, timeout_s=120):
            seq = orjson.loads(message.value())["seq"]
            if seq >= len(sent) or np.isnan(sent[seq]):
                continue
            delay = message.timestamp()[1] / 1000 - sent[seq]
            if start is None or sent[seq] < start:
                before.append(delay)
            elif end is None or sent[seq] <= end:
                during.append(delay)
    return before, during


def _percentiles(values: list[float], scale: float = 1000.0, digits: int = 1) -> dict | None:
    if not values:
        return None
    array = np.asarray(values) * scale
    return {"p50": round(float(np.percentile(array, 50)), digits),
            "p99": round(float(np.percentile(array, 99)), digits),
            "max": round(float(array.max()), digits), "n": len(values)}
