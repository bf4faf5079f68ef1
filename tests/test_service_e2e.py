"""The streaming service end to end on a real broker (embedded tansu per test, or
KAFKA_BOOTSTRAP is not used: topic names are fixed per stream): known streams for MATCH,
SEQ and WINDOW through splitter, 1/2/4 workers and coordinator must give exactly the
reference interpreter's composite events on each INTO topic; queries are added and removed
mid-stream; `cep serve all` runs as real processes and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from cep_core import reference
from cep_core.checker import load_queries
from cep_core.event_io import read_events
from services.broker import EmbeddedBroker
from services.control import ControlMessage, publish, split_query_file
from services.kafka import KafkaSettings, Topics, produce, read_all
from services.pipeline import LocalPipeline, create_topics, wait_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CASES = {"match": ("marathon.cep", "data/checkpoints.jsonl"),
         "seq": ("rfid.cep", "data/rfid.jsonl"), "window": ("ticks.cep", "data/ticks.jsonl")}


@pytest.fixture
def broker():
    embedded = EmbeddedBroker().start()
    try:
        yield KafkaSettings(embedded.bootstrap, session_timeout_ms=2000)
    finally:
        embedded.kill()  # in-memory storage: nothing to lose, and a graceful stop waits ~5 s


def _register(settings, topics, query_file: Path, only=None) -> list:
    for name, text in split_query_file(query_file.read_text()):
        if only is None or name in only:
            publish(settings, topics.control, ControlMessage("add", name, text))


def _produce(settings, topic: str, lines: list[bytes], end: bool = True) -> None:
    producer = settings.producer()
    for line in lines:
        produce(producer, topic, line)
    if end:
        produce(producer, topic, b"", headers=[("kind", b"end")])
    producer.flush(30)


def _outputs(settings, queries) -> dict[str, list[dict]]:
    return {q.query.output: [orjson.loads(m.value()) for m in read_all(settings,
                                                                        q.query.output)]
            for q in queries}


def _expected(queries, events) -> dict[str, list[dict]]:
    found = reference.run(queries, events)
    return {q.query.output: [c for c in found if c["query"] == q.name] for q in queries}


def _lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line.strip()]


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("kind", ["match", "seq", "window"])
def test_known_stream_equals_reference(broker, kind, workers):
    query_file, events_file = (EXAMPLES / name for name in CASES[kind])
    queries = load_queries(query_file)
    stream = queries[0].schema.stream
    topics = Topics(stream, source=f"src.{stream}")
    create_topics(broker, topics, 4, [q.query.output for q in queries])
    _register(broker, topics, query_file)
    events, _ = read_events(events_file, queries[0].schema)
    expected = _expected(queries, events)
    with LocalPipeline(broker, topics, workers=workers) as pipeline:
        _produce(broker, topics.source, _lines(events_file))
        wait_for(lambda: pipeline.coordinator.merger.ended, 120, "end of input released")
    got = _outputs(broker, queries)
    assert sum(map(len, expected.values())) > 0
    for output in expected:
        assert got[output] == expected[output], output


def test_queries_added_and_removed_mid_stream(broker):
    schema_queries = load_queries(EXAMPLES / "finance.cep")
    schema = schema_queries[0].schema
    extra = ("QUERY ups FROM trades INTO ups PARTITION BY symbol\n"
             "PATTERN ( . up up up ) DEFINE up AS price > Last(price)\n"
             "EMIT symbol = symbol, n = Count();")
    (tmp := Path(os.environ.get("TMPDIR", "/tmp")) / f"ups-{os.getpid()}.cep").write_text(extra)
    topics = Topics("trades", source="src.trades.live")
    create_topics(broker, topics, 4, ["double_tops", "ups"])
    _register(broker, topics, EXAMPLES / "finance.cep", only={"mshape"})
    lines = _lines(EXAMPLES / "data" / "trades.jsonl")
    events, _ = read_events(EXAMPLES / "data" / "trades.jsonl", schema)
    first, second = 400, 800
    with LocalPipeline(broker, topics, workers=2) as pipeline:
        merger = pipeline.coordinator.merger
        _produce(broker, topics.source, lines[:first], end=False)
        wait_for(lambda: min(merger.upto) >= first - 1, 60, "first part processed")
        publish(broker, topics.control, ControlMessage("add", "ups", extra))
        wait_for(lambda: any(e["name"] == "ups" for e in pipeline.coordinator.lived), 60,
                 "ups live")
        _produce(broker, topics.source, lines[first:second], end=False)
        wait_for(lambda: min(merger.upto) >= second - 1, 60, "second part processed")
        publish(broker, topics.control, ControlMessage("remove", "mshape"))
        wait_for(lambda: any(e["name"] == "mshape" and e["op"] == "remove"
                             for e in pipeline.coordinator.lived), 60, "mshape removed")
        _produce(broker, topics.source, lines[second:])
        wait_for(lambda: merger.ended, 60, "end of input released")
    added = [e for e in pipeline.coordinator.lived if e["name"] == "ups"][0]
    assert added["at"] == first and added["latency_ms"] is not None
    tmp.unlink()
    mshape = [q for q in schema_queries if q.name == "mshape"]
    ups = load_queries_text(extra)
    got = _outputs(broker, mshape + ups)
    want_m = reference.run(mshape, events[:second])
    want_u = reference.run(ups, events[first:])
    assert want_m and want_u
    assert got["double_tops"] == want_m
    assert got["ups"] == want_u


def load_queries_text(text: str):
    from cep_core.checker import load_query_text
    return load_query_text(text)


def test_serve_all_processes_and_sigterm(broker, tmp_path):
    """`cep serve all` as real processes (splitter, 2 workers, coordinator), queries
    registered with `cep query add`, clean exit 0 on SIGTERM."""
    queries = load_queries(EXAMPLES / "finance.cep")
    topics = Topics("trades", source="src.trades.procs", control="ctl.procs")
    create_topics(broker, topics, 4, ["double_tops", "trade_stats"])
    env = {**os.environ, "KAFKA_BOOTSTRAP": broker.bootstrap, "CEP_SESSION_TIMEOUT_MS": "2000"}
    cep = [sys.executable, "-m", "services.cli"]
    added = subprocess.run(cep + ["query", "add", str(EXAMPLES / "finance.cep"),
                                  "--control", topics.control], env=env, cwd=ROOT,
                           capture_output=True, timeout=60)
    assert added.returncode == 0, added.stderr
    log = open(tmp_path / "serve.log", "wb")
    serve = subprocess.Popen(cep + ["serve", "all", "--workers", "2", "--source",
                                    topics.source, "--control", topics.control],
                             env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        _produce(broker, topics.source, _lines(EXAMPLES / "data" / "trades.jsonl"))
        events, _ = read_events(EXAMPLES / "data" / "trades.jsonl", queries[0].schema)
        expected = _expected(queries, events)

        def released():
            return any(orjson.loads(m.value()).get("event") == "end_of_input"
                       for m in read_all(broker, topics.status, idle_s=0.1))
        wait_for(released, 150, "end of input released", interval_s=0.3)
        assert _outputs(broker, queries) == expected
        listed = subprocess.run(cep + ["query", "list", "--control", topics.control],
                                env=env, cwd=ROOT, capture_output=True, timeout=60)
        assert [orjson.loads(x)["name"] for x in listed.stdout.splitlines()] == \
            ["mshape", "activity"]
    finally:
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(60)
    text = (tmp_path / "serve.log").read_text()
    assert code == 0, text[-3000:]
    assert '"event":"worker_stopped"' in text and '"event":"splitter_stopped"' in text
