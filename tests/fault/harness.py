"""Real `cep serve` processes on a real broker, for fault tests: start, SIGKILL, restart,
and the reference composite events to compare the INTO topics with."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import zlib
from pathlib import Path

import orjson
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cep_core import reference
from cep_core.checker import load_query_text
from cep_core.event_io import read_events
from cep_core.events import Event
from services.broker import free_port
from services import frames
from services.control import ControlMessage, publish, split_query_file
from services.checkpoint import read_partitions
from services.kafka import KafkaSettings, Topics, produce, produce_end
from services.pipeline import create_topics, wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
QUERIES = EXAMPLES / "finance.cep"
EVENTS = EXAMPLES / "data" / "trades.jsonl"


class Pipeline:
    """Splitter, workers and coordinator of one stream as `cep serve` processes (each in its
    own session), with their own topic prefix, source topic and INTO topics."""

    def __init__(self, bootstrap: str, logs: Path, workers: int = 2, partitions: int = 4,
                 checkpoint_ms: int = 300, limit: int | None = None,
                 source_partitions: int = 1, **env: str):
        """`limit`: only the first so many events of the file; `source_partitions`: of the
        source topic (events keyed by symbol); `env`: more settings of the services
        (CEP_PULSE_MS, CEP_KAFKA_FETCH_WAIT_MAX_MS, ...)."""
        run = uuid.uuid4().hex[:8]
        self.settings = KafkaSettings(bootstrap, session_timeout_ms=2000)
        self.topics = Topics("trades", source=f"src.trades.{run}", prefix=f"f{run}")
        self.logs = logs
        self.partitions = partitions
        self.source_partitions = source_partitions
        self.roles = ["splitter"] + [f"worker{i}" for i in range(workers)] + ["coordinator"]
        self.processes: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap,
                    "CEP_SESSION_TIMEOUT_MS": "2000", "CEP_TOPIC_PREFIX": self.topics.prefix,
                    "CEP_SOURCE_TOPIC": self.topics.source, "CEP_STREAM": "trades",
                    "CEP_PARTITIONS": str(partitions), "CEP_CHECKPOINT_MS": str(checkpoint_ms),
                    "CEP_PULSE_MS": "100", **env}
        texts = []
        for name, text in split_query_file(QUERIES.read_text()):
            for output in ("double_tops", "trade_stats"):
                text = text.replace(f"INTO {output}", f"INTO {output}_{run}")
            texts.append((name, text))
        self.texts = texts
        self.queries = [q for _, text in texts for q in load_query_text(text)]
        events, _ = read_events(EVENTS, self.queries[0].schema)
        events = events[:limit]
        found = reference.run(self.queries, events)
        self.expected = {q.query.output: [c for c in found if c["query"] == q.name]
                         for q in self.queries}
        self.lines = [x for x in EVENTS.read_bytes().splitlines() if x.strip()][:limit]
        create_topics(self.settings, self.topics, partitions, list(self.expected),
                      source_partitions=source_partitions)
        for name, text in texts:
            publish(self.settings, self.topics.control, ControlMessage("add", name, text))

    # ------------------------------------------------------------ processes

    def start(self, role: str) -> subprocess.Popen:
        kind = role.rstrip("0123456789")
        log = open(self.logs / f"{role}.log", "ab")
        env = {**self.env, "CEP_ROLE": kind, "CEP_WEB_PORT": str(free_port())}
        process = subprocess.Popen([sys.executable, "-m", "services.cli", "serve", kind],
                                   env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        log.close()
        self.processes[role] = process
        return process

    def start_all(self) -> None:
        for role in self.roles:
            self.start(role)

    def kill(self, role: str) -> float:
        """SIGKILL the role's process group; the time of the kill."""
        process = self.processes[role]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return time.time()

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def log_events(self, role: str, event: str, since: float = 0) -> list[dict]:
        out = []
        for line in (self.logs / f"{role}.log").read_bytes().splitlines():
            if line.startswith(b"{") and f'"event":"{event}"'.encode() in line:
                record = orjson.loads(line)
                if record["ts"] >= since:
                    out.append(record)
        return out

    # ------------------------------------------------------------ data

    def produce_slowly(self, chunk: int = 40, pause_s: float = 0.15, start: int = 0,
                       stop: int | None = None, end: bool = True) -> threading.Thread:
        """Write events `start:stop` in chunks (then end of input) from a thread."""
        def body():
            producer = self.settings.producer()
            lines = self.lines[start:stop]
            for at in range(0, len(lines), chunk):
                for line in lines[at:at + chunk]:
                    symbol = orjson.loads(line)["symbol"]
                    produce(producer, self.topics.source, line, key=symbol.encode(),
                            partition=self.source_partition(symbol))
                producer.flush(30)
                time.sleep(pause_s)
            if end:
                produce_end(producer, self.topics.source)
            producer.flush(30)

        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        return thread

    def source_partition(self, symbol: str) -> int:
        """Symbols spread over the source partitions (murmur2 puts the file's four in
        one or two)."""
        return zlib.crc32(symbol.encode()) % self.source_partitions

    def values(self, topic: str) -> list[dict]:
        """Every record of partition 0 of `topic` up to its high-watermark, as JSON."""
        out = []
        read_partitions(self.settings, [TopicPartition(topic, 0, OFFSET_BEGINNING)],
                        lambda m: out.append(orjson.loads(m.value())))
        return out

    def stamped(self) -> list[Event]:
        """The events as the splitter stamped them, in seq order, read back from the keyed
        topic (every route's frames; an event sent again must be the same each time)."""
        by_seq: dict[int, dict] = {}

        def visit(message) -> None:
            frame = frames.frame_of(message)
            if frame is None or frame.kind != frames.EVENTS:
                return
            for row in frames.decode_table(frame.payload).to_pylist():
                seq = row.pop("seq")
                assert by_seq.setdefault(seq, row) == row, f"seq {seq} stamped twice"

        read_partitions(self.settings, [TopicPartition(self.topics.keyed, p, OFFSET_BEGINNING)
                                        for p in range(self.partitions)], visit)
        time_attr = self.queries[0].schema.time
        return [Event(seq, row[time_attr], row) for seq, row in sorted(by_seq.items())]

    def outputs(self) -> dict[str, list[dict]]:
        return {topic: self.values(topic) for topic in self.expected}

    def released(self) -> int:
        """Composite events on the INTO topics so far."""
        return sum(len(self.values(topic)) for topic in self.expected)

    def ended(self) -> bool:
        """The coordinator has released the end of input."""
        return any(r.get("event") == "end_of_input" for r in self.values(self.topics.status))

    def finished(self) -> bool:
        """End of input released, and every INTO topic holds at least what it should."""
        if not self.ended():
            return False
        got = self.outputs()
        return all(len(got[t]) >= len(want) for t, want in self.expected.items())


def restart(pipe: Pipeline, role: str, ready_event: str) -> float:
    """Kill and restart `role`; seconds from the kill until it is back (its ready event)."""
    killed = pipe.kill(role)
    pipe.start(role)
    wait_for(lambda: pipe.log_events(role, ready_event, killed), 60, f"{role} back")
    return pipe.log_events(role, ready_event, killed)[0]["ts"] - killed


def after_released(pipe: Pipeline, count: int) -> None:
    wait_for(lambda: pipe.released() >= count, 90, f"{count} composite events out",
             interval_s=0.2)


def assert_exact(pipe: Pipeline) -> None:
    wait_for(pipe.finished, 120, "end of input released", interval_s=0.5)
    time.sleep(1.0)  # anything repeated would land now
    got = pipe.outputs()
    assert sum(map(len, pipe.expected.values())) > 20
    for topic, want in pipe.expected.items():
        assert got[topic] == want, topic
