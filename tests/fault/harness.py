"""Real `cep serve` processes on a real broker, for fault tests: start, SIGKILL, restart,
and the reference composite events to compare the INTO topics with.

Faults are driven by the pipeline's own progress, never by how fast this machine is: the
source is written by a `SlowProducer` that stops at given points until the test lets it go
on (so "killed while the source is being written" holds by construction), and a test waits
for what the pipeline reports (composite events out, the splitter's logged steps and
checkpoints, log events). No wait has a fixed wall-clock budget: each goes on while the
pipeline makes progress (`Pipeline.progress`: the topics' offsets, the services' own
counters, the kernels compiled) and fails only after `STALL_S` seconds without any
(CEP_TEST_STALL_S, default 300), so a slow or loaded machine, or a cold kernel cache,
only makes a run longer. The end is checked after a graceful stop of every service, so
whatever they would still write has been written."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
import zlib
from pathlib import Path

import orjson
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cep_core import reference
from cep_core.checker import load_query_text
from cep_core.event_io import decode_record, read_events
from cep_core.events import Event
from cep_service.stream.broker import free_port
from cep_service.stream.chained import CHAINED_KEY
from cep_service.stream import frames
from cep_service.stream.control import (ControlMessage, horizon, input_ended, publish,
                                        split_query_file)
from cep_service.stream.checkpoint import ALT, read_latest, read_partitions
from cep_service.stream.kafka import KafkaSettings, Topics, produce, produce_end
from cep_service.stream.pipeline import (
    create_topics,
    flush_progressing,
    kernel_files,
    wait_progressing,
)
from cep_service.stream.splitter import SPLITTER_KEY
from cep_service.stream.splitter_order import ORDER_HEADER

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
QUERIES = EXAMPLES / "finance.cep"
EVENTS = EXAMPLES / "data" / "trades.jsonl"
# Seconds without any progress after which a wait fails (never a budget for the whole wait).
STALL_S = float(os.environ.get("CEP_TEST_STALL_S", 300))
# The services' counters that move only with the input (not with pulses or time).
COUNTERS = (b"cep_events_in_total", b"cep_events_out_total", b"cep_dead_letters_total",
            b"cep_late_events_total")


class Pipeline:
    """Splitter, workers and coordinator of one stream as `cep serve` processes (each in its
    own session), with their own topic prefix, source topic and INTO topics."""

    def __init__(self, bootstrap: str, logs: Path, workers: int = 2, partitions: int = 4,
                 checkpoint_ms: int = 300, limit: int | None = None,
                 source_partitions: int = 1, role_env: dict[str, dict] | None = None,
                 coordinators: int = 1, mode: str = "distributed", extra_queries: str = "",
                 **env: str):
        """`limit`: only the first so many events of the file; `source_partitions`: of the
        source topic (events keyed by symbol); `env`: more settings of the services
        (CEP_PULSE_MS, CEP_KAFKA_FETCH_WAIT_MAX_MS, ...); `role_env`: settings of one
        role only ({"splitter": {...}}); `coordinators`: coordinator shards (roles
        coordinator0, coordinator1, ... when more than one; the run's two INTO topics then
        go to different shards); `mode` "chained": one `cep serve chained` process (role
        chained) instead of the distributed roles; `extra_queries`: a query file's text
        added after examples/finance.cep's (`{run}` in it: this run's name, for its own
        INTO topics)."""
        self.settings = KafkaSettings(bootstrap, session_timeout_ms=2000)
        while True:
            run = uuid.uuid4().hex[:8]
            self.topics = Topics("trades", source=f"src.trades.{run}", prefix=f"f{run}",
                                 shards=coordinators)
            shards = {self.topics.shard_of(f"{o}_{run}") for o in ("double_tops", "trade_stats")}
            if len(shards) == min(2, coordinators):
                break
        self.logs = logs
        self.partitions = partitions
        self.source_partitions = source_partitions
        self.mode = mode
        self.roles = ["chained"] if mode == "chained" else \
            ["splitter"] + [f"worker{i}" for i in range(workers)] + \
            (["coordinator"] if coordinators == 1 else
             [f"coordinator{k}" for k in range(coordinators)])
        self.processes: dict[str, subprocess.Popen] = {}
        self.metrics_ports: dict[str, int] = {}  # role -> its Prometheus port
        self.ended_by_test: set[str] = set()  # roles killed or stopped (not started again)
        self._watch = None  # consumer for high-watermarks (progress)
        self.env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap,
                    "CEP_SESSION_TIMEOUT_MS": "2000", "CEP_TOPIC_PREFIX": self.topics.prefix,
                    "CEP_SOURCE_TOPIC": self.topics.source, "CEP_STREAM": "trades",
                    "CEP_PARTITIONS": str(partitions), "CEP_CHECKPOINT_MS": str(checkpoint_ms),
                    "CEP_PULSE_MS": "100", "CEP_COORDINATORS": str(coordinators), **env}
        self.role_env = role_env or {}
        texts = []
        file_text = QUERIES.read_text() + extra_queries.replace("{run}", run)
        for name, text in split_query_file(file_text):
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
        self.metrics_ports[role] = free_port()
        env = {**self.env, **self.role_env.get(kind, {}), "CEP_ROLE": kind,
               "CEP_WEB_PORT": str(free_port()),
               "CEP_METRICS_PORT": str(self.metrics_ports[role])}
        if kind == "coordinator" and role != kind:
            env["CEP_COORDINATOR_SHARD"] = role[len(kind):]
        process = subprocess.Popen([sys.executable, "-m", "cep_service.cli.main", "serve", kind],
                                   env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        log.close()
        self.processes[role] = process
        self.ended_by_test.discard(role)
        return process

    def start_all(self) -> None:
        for role in self.roles:
            self.start(role)

    def wait_up(self) -> None:
        """Until the pipeline takes input: worker0 has its partitions, or the chained
        process has started."""
        role, event = ("chained", "chained_started") if self.mode == "chained" else \
            ("worker0", "partitions_assigned")
        self.wait_until(lambda: self.log_events(role, event), f"{role} up")

    def kill(self, role: str) -> float:
        """SIGKILL the role's process group; the time of the kill."""
        process = self.processes[role]
        self.ended_by_test.add(role)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return time.time()

    def stop(self, role: str) -> int:
        """SIGTERM the role's process (finish the batch, flush, checkpoint, exit) and wait
        for it (while the pipeline makes progress); its exit code."""
        process = self.processes[role]
        assert process.poll() is None, f"{role} exited by itself ({process.returncode})"
        self.ended_by_test.add(role)
        os.killpg(process.pid, signal.SIGTERM)
        self.wait_until(lambda: process.poll() is not None, f"{role} to stop on SIGTERM")
        return process.returncode

    def stop_gracefully(self) -> None:
        """Stop every service with SIGTERM, in pipeline order: once they have exited,
        everything they were going to write is written. Each must still be running (none
        died by itself) and exit 0."""
        for role in self.roles:
            assert self.stop(role) == 0, f"{role} stopped with a non-zero exit code"

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

    # ------------------------------------------------------------ progress

    def wait_until(self, condition, what: str, interval_s: float = 0.2) -> None:
        """Wait until `condition()` holds, as long as the pipeline makes progress; a
        service that exited by itself meanwhile fails the wait at once, with its log."""

        def done() -> bool:
            if condition():
                return True
            self.check_alive(what)
            return False

        wait_progressing(done, self.progress, what, stall_s=STALL_S,
                         interval_s=interval_s, progress_every_s=2.0)

    def check_alive(self, what: str) -> None:
        for role, process in self.processes.items():
            if role not in self.ended_by_test and process.poll() is not None:
                tail = (self.logs / f"{role}.log").read_bytes()[-3000:].decode(errors="replace")
                raise AssertionError(f"{role} exited by itself ({process.returncode}) while "
                                     f"waiting for {what}; its log ends:\n{tail}")

    def progress(self) -> tuple:
        """What moves while the pipeline works through its input, all of it bounded by the
        input (and the restarts), none of it by pulses or time: the high-watermarks of the
        source, the INTO topics, the status, dead-letter and late topics; each running
        service's events in and out, dead letters and late events (its metrics, which a
        restart starts again); and the files in the kernel cache (kernels compiled so far,
        by any process)."""
        return self._high_watermarks(), self._counters(), kernel_files()

    def _high_watermarks(self) -> tuple:
        if self._watch is None:
            self._watch = self.settings.consumer()
        topics = [(self.topics.source, p) for p in range(self.source_partitions)] + \
            [(t, 0) for t in (*self.expected, self.topics.status, self.topics.dead_letters,
                              self.topics.late)]
        out = []
        for topic, partition in topics:
            try:
                out.append(self._watch.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=5)[1])
            except Exception:  # noqa: BLE001 - the broker is down or slow: nothing seen
                out.append(None)
        return tuple(out)

    def _counters(self) -> tuple:
        out = []
        for role, port in sorted(self.metrics_ports.items()):
            process = self.processes.get(role)
            if process is None or process.poll() is not None:
                continue
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=5) as response:
                    lines = response.read().splitlines()
            except OSError:  # not listening yet (starting), or busy
                out.append((role, process.pid, None))
                continue
            out.append((role, process.pid,
                        tuple(line for line in lines if line.startswith(COUNTERS))))
        return tuple(out)

    # ------------------------------------------------------------ data

    def produce_slowly(self, chunk: int = 40, pause_s: float = 0.15,
                       holds: list[int] = (), end: bool = True) -> SlowProducer:
        """Write the events in chunks `pause_s` apart (then the end of input) from a
        thread that stops after each of `holds` events until `release()`d."""
        producer = SlowProducer(self, chunk, pause_s, holds, end)
        producer.start()
        return producer

    def source_offsets(self, events: int) -> dict[int, int]:
        """The next offset of each source partition once the first `events` events are
        written (the source holds nothing else before them)."""
        out = {p: 0 for p in range(self.source_partitions)}
        for line in self.lines[:events]:
            out[self.source_partition(orjson.loads(line)["symbol"])] += 1
        return out

    def released_by(self, events: int) -> int:
        """How many composite events the pipeline releases, at least, once the first
        `events` events are stamped: those of queries that report on their last event
        (MATCH) with a seq below; windows wait for stream time to pass them."""
        now = {q.query.output for q in self.queries if horizon(q) == 0}
        return sum(1 for topic, found in self.expected.items() if topic in now
                   for c in found if c["seq"] < events)

    def taken(self) -> dict[int, int]:
        """Per source partition, the offset after the last message the splitter has taken
        and sent, from the consumption order its keyed frames log."""
        out: dict[int, int] = {}

        def visit(message) -> None:
            for key, value in message.headers() or ():
                if key == ORDER_HEADER:
                    for p, _, last in orjson.loads(value)["runs"]:
                        out[p] = max(out.get(p, 0), last + 1)

        read_partitions(self.settings, [TopicPartition(self.topics.keyed, p, OFFSET_BEGINNING)
                                        for p in range(self.partitions)], visit)
        return out

    def has_taken(self, events: int) -> bool:
        """The splitter has taken (stamped, or put in its reorder buffer) the first
        `events` events."""
        taken = self.taken()
        return all(taken.get(p, 0) >= o for p, o in self.source_offsets(events).items())

    def splitter_checkpoint(self) -> dict | None:
        """The splitter's (or the chain's cut's) newest checkpoint on the state topic (the
        newer generation of its two keys, services/stream/checkpoint.py)."""
        latest = read_latest(self.settings, self.topics.state)
        key = CHAINED_KEY if self.mode == "chained" else SPLITTER_KEY
        saved = [orjson.loads(latest[k]) for k in (key, key + ALT) if k in latest]
        return max(saved, key=lambda c: c.get("generation", 0), default=None)

    def snapshotted(self) -> set[int]:
        """The keyed partitions a worker has written a snapshot of (under either key)."""
        keys = {k.removesuffix(ALT) for k in read_latest(self.settings, self.topics.state)}
        return {int(k) for k in keys if k.isdigit()}

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
        topic (every route's frames; an event sent again must be the same each time; the
        chained pipeline's: the consumption order it logged, with several source
        partitions)."""
        if self.mode == "chained":
            return self._stamped_in_logged_order()
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

    def _stamped_in_logged_order(self) -> list[Event]:
        steps: dict[int, list] = {}

        def visit(message) -> None:
            for key, value in message.headers() or ():
                if key == ORDER_HEADER:
                    order = orjson.loads(value)
                    assert steps.setdefault(order["step"], order["runs"]) == order["runs"]

        read_partitions(self.settings, [TopicPartition(self.topics.keyed, 0,
                                                       OFFSET_BEGINNING)], visit)
        assert sorted(steps) == list(range(1, len(steps) + 1)), "a step not logged"
        by_partition: dict[int, list[bytes]] = {}
        for line in self.lines:
            by_partition.setdefault(self.source_partition(orjson.loads(line)["symbol"]),
                                    []).append(line)
        schema = self.queries[0].schema
        out = []
        for number in sorted(steps):
            for p, first, last in steps[number]:
                for line in by_partition.get(p, [])[first:last + 1]:  # markers are past them
                    out.append(decode_record(orjson.loads(line), schema, len(out)))
        return out

    def outputs(self) -> dict[str, list[dict]]:
        return {topic: self.values(topic) for topic in self.expected}

    def released(self) -> int:
        """Composite events on the INTO topics so far."""
        return sum(len(self.values(topic)) for topic in self.expected)

    def ended(self) -> bool:
        """Every coordinator shard has released the end of input."""
        return input_ended(self.values(self.topics.status), self.topics.shards)

    def finished(self) -> bool:
        """End of input released, and every INTO topic holds at least what it should."""
        if not self.ended():
            return False
        got = self.outputs()
        return all(len(got[t]) >= len(want) for t, want in self.expected.items())


class SlowProducer(threading.Thread):
    """Writes the pipeline's events to the source in chunks (each flushed, `pause_s`
    apart), keyed by symbol, then the end of input; after `holds[i]` events it waits for
    the i-th `release()`. `wait_held()` returns once everything before the next hold is
    written and acknowledged."""

    def __init__(self, pipe: Pipeline, chunk: int, pause_s: float, holds, end: bool):
        super().__init__(daemon=True)
        self.pipe, self.chunk, self.pause_s, self.end = pipe, chunk, pause_s, end
        self.holds = sorted(holds)
        assert all(0 < h < len(pipe.lines) for h in self.holds), self.holds
        self.written = 0
        self.moved_at = time.monotonic()  # when it last wrote or had something acknowledged
        self.error: BaseException | None = None
        self._state = threading.Condition()
        self._held: int | None = None  # the number of the hold it waits at
        self._released = 0  # releases so far (the number of the next hold)

    def run(self) -> None:
        try:
            self._write()
        except BaseException as e:  # the test sees it in wait_held / join_done
            self.error = e
            raise
        finally:
            with self._state:
                self._state.notify_all()

    def _write(self) -> None:
        pipe = self.pipe
        producer = pipe.settings.producer()
        lines = pipe.lines
        for number, stop in enumerate([*self.holds, len(lines)]):
            while self.written < stop:
                for line in lines[self.written:min(self.written + self.chunk, stop)]:
                    symbol = orjson.loads(line)["symbol"]
                    produce(producer, pipe.topics.source, line, key=symbol.encode(),
                            partition=pipe.source_partition(symbol))
                flush_progressing(producer, "source records", STALL_S, self._moved)
                self.written = min(self.written + self.chunk, stop)
                self._moved()
                if self.written < len(lines):
                    time.sleep(self.pause_s)
            if number < len(self.holds):
                with self._state:
                    self._held = number
                    self._state.notify_all()
                    self._state.wait_for(lambda n=number: self._released > n)
                    self._held = None
        if self.end:
            produce_end(producer, pipe.topics.source)
        flush_progressing(producer, "end-of-input markers", STALL_S, self._moved)

    def _moved(self) -> None:
        self.moved_at = time.monotonic()

    def _wait(self, done, what: str) -> None:
        """Wait (holding `_state`) until `done()`, while the producer writes or has its
        records acknowledged."""
        while not done():
            self._state.wait(1)
            stalled = time.monotonic() - self.moved_at
            if not done() and stalled > STALL_S:
                raise TimeoutError(f"the producer wrote nothing for {stalled:.0f} s "
                                   f"waiting for {what} ({self.written} written)")

    def wait_held(self) -> int:
        """Wait until the producer stops at its next hold (the first not released yet);
        the events written."""
        with self._state:
            self._wait(lambda: self._held == self._released or self.error is not None
                       or not self.is_alive(), "its hold")
            if self.error is not None:
                raise self.error
            assert self._held == self._released, "the producer finished without holding"
            return self.holds[self._held]

    def release(self) -> None:
        with self._state:
            self._released += 1
            self._state.notify_all()

    def join_done(self) -> None:
        """Wait until everything is written (end of input included)."""
        with self._state:
            self._wait(lambda: not self.is_alive(), "its end")
        self.join()
        if self.error is not None:
            raise self.error


def restart(pipe: Pipeline, role: str, ready_event: str, while_down=None) -> float:
    """Kill and restart `role` (calling `while_down()` in between); seconds from the kill
    until it is back (its ready event)."""
    killed = pipe.kill(role)
    if while_down is not None:
        while_down()
    pipe.start(role)
    pipe.wait_until(lambda: pipe.log_events(role, ready_event, killed), f"{role} back")
    return pipe.log_events(role, ready_event, killed)[0]["ts"] - killed


def after_released(pipe: Pipeline, count: int) -> None:
    pipe.wait_until(lambda: pipe.released() >= count, f"{count} composite events out")


def waiting_in_checkpoint(checkpoint: dict) -> int:
    """How many events waited in the reorder buffer at a splitter checkpoint."""
    reorder = checkpoint.get("reorder") or {}
    if not reorder.get("waiting"):
        return 0
    return len(zlib.decompress(base64.b64decode(reorder["waiting"]))) // 32  # 4 int64s each


def assert_exact(pipe: Pipeline, stop=None) -> None:
    """Once the end of input is released and the services are stopped (`stop`, by default
    SIGTERM to each: anything repeated has landed once they have exited), every INTO
    topic holds exactly the expected composite events."""
    pipe.wait_until(pipe.finished, "end of input released", interval_s=0.5)
    (stop or pipe.stop_gracefully)()
    got = pipe.outputs()
    assert sum(map(len, pipe.expected.values())) > 20
    for topic, want in pipe.expected.items():
        assert got[topic] == want, topic
