"""The streaming service end to end on a real broker (the session's `kafka_bootstrap`:
KAFKA_BOOTSTRAP, else testcontainers Kafka, else embedded tansu; one for all tests, each
test with its own topic prefix and source/control topics): known streams for MATCH, SEQ and
WINDOW through splitter, 1/2/4 workers and coordinator must give exactly the reference
interpreter's composite events on each INTO topic; queries are added and removed
mid-stream; `cep serve all` runs as real processes (the splitter as a Faust app with its
status view) and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest

from cep_core import reference
from cep_core.checker import load_queries
from cep_core.event_io import read_events
from cep_service.stream.broker import free_port
from cep_service.stream.control import ControlMessage, publish, split_query_file
from cep_service.stream.kafka import KafkaSettings, Topics, read_all
from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_for
from tests.stream_harness import file_records, produce_lines

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CASES = {"match": ("marathon.cep", "data/checkpoints.jsonl"),
         "seq": ("rfid.cep", "data/rfid.jsonl"), "window": ("ticks.cep", "data/ticks.jsonl")}


@pytest.fixture
def broker(kafka_bootstrap):
    return KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)


def _topics(stream: str, **names) -> Topics:
    """Topics of one test: its own prefix (internal topics, groups) and source topic."""
    run = uuid.uuid4().hex[:8]
    return Topics(stream, source=f"src.{stream}.{run}", prefix=f"t{run}", **names)


def _register(settings, topics, query_file: Path, only=None) -> list:
    for name, text in split_query_file(query_file.read_text()):
        if only is None or name in only:
            publish(settings, topics.control, ControlMessage("add", name, text))


def _outputs(settings, queries, before: dict[str, int] | None = None) -> dict[str, list]:
    """The composite events on each query's INTO topic after the first `before[topic]`
    (INTO topics are shared by the tests on one broker)."""
    before = before or {}
    return {q.query.output: [orjson.loads(m.value()) for m in read_all(
        settings, q.query.output)[before.get(q.query.output, 0):]] for q in queries}


def _counts(settings, queries) -> dict[str, int]:
    return {topic: len(got) for topic, got in _outputs(settings, queries).items()}


def _expected(queries, events) -> dict[str, list[dict]]:
    found = reference.run(queries, events)
    return {q.query.output: [c for c in found if c["query"] == q.name] for q in queries}


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("kind", ["match", "seq", "window"])
def test_known_stream_equals_reference(broker, kind, workers):
    query_file, events_file = (EXAMPLES / name for name in CASES[kind])
    queries = load_queries(query_file)
    stream = queries[0].schema.stream
    topics = _topics(stream)
    create_topics(broker, topics, 4, [q.query.output for q in queries])
    before = _counts(broker, queries)
    _register(broker, topics, query_file)
    events, _ = read_events(events_file, queries[0].schema)
    expected = _expected(queries, events)
    with LocalPipeline(broker, topics, workers=workers) as pipeline:
        produce_lines(broker, topics.source, file_records(events_file))
        wait_for(lambda: pipeline.coordinator.merger.ended, 120, "end of input released")
    got = _outputs(broker, queries, before)
    assert sum(map(len, expected.values())) > 0
    for output in expected:
        assert got[output] == expected[output], output


def test_into_topic_made_with_one_partition(broker):
    """An INTO topic nobody made is created by the coordinator with one partition (the
    broker's auto-creation would give its default, 4 on tansu), so its restart reads back
    all that was released."""
    from confluent_kafka import KafkaException

    topics = _topics("sensors")
    output = f"into_t{uuid.uuid4().hex[:8]}"
    [(name, text)] = [(n, t) for n, t in split_query_file((EXAMPLES / "fire.cep").read_text())
                      if n == "fire_each"]
    text = text.replace("INTO fire\n", f"INTO {output}\n")
    assert output in text
    create_topics(broker, topics, 4)
    publish(broker, topics.control, ControlMessage("add", name, text))
    with LocalPipeline(broker, topics, workers=1) as pipeline:
        produce_lines(broker, topics.source, file_records(EXAMPLES / "data/sensors.jsonl"))
        wait_for(lambda: pipeline.coordinator.merger.ended, 120, "end of input released")
    try:
        metadata = broker.admin().list_topics(output, timeout=10).topics[output]
    except KafkaException as e:
        raise AssertionError(f"{output} not made: {e}") from None
    assert len(metadata.partitions) == 1
    assert read_all(broker, output)  # the composites went there


def test_queries_added_and_removed_mid_stream(broker):
    schema_queries = load_queries(EXAMPLES / "finance.cep")
    schema = schema_queries[0].schema
    extra = ("QUERY ups FROM trades INTO ups PARTITION BY symbol\n"
             "PATTERN ( . up up up ) DEFINE up AS price > Last(price)\n"
             "EMIT symbol = symbol, n = Count();")
    (tmp := Path(os.environ.get("TMPDIR", "/tmp")) / f"ups-{os.getpid()}.cep").write_text(extra)
    topics = _topics("trades")
    create_topics(broker, topics, 4, ["double_tops", "ups"])
    mshape = [q for q in schema_queries if q.name == "mshape"]
    ups = load_queries_text(extra)
    before = _counts(broker, mshape + ups)
    _register(broker, topics, EXAMPLES / "finance.cep", only={"mshape"})
    lines = file_records(EXAMPLES / "data" / "trades.jsonl")
    events, _ = read_events(EXAMPLES / "data" / "trades.jsonl", schema)
    first, second = 400, 800
    with LocalPipeline(broker, topics, workers=2) as pipeline:
        merger = pipeline.coordinator.merger
        produce_lines(broker, topics.source, lines[:first], end=False)
        wait_for(lambda: min(merger.upto) >= first - 1, 60, "first part processed")
        publish(broker, topics.control, ControlMessage("add", "ups", extra))
        wait_for(lambda: any(e["name"] == "ups" for e in pipeline.coordinator.lived), 60,
                 "ups live")
        produce_lines(broker, topics.source, lines[first:second], end=False)
        wait_for(lambda: min(merger.upto) >= second - 1, 60, "second part processed")
        publish(broker, topics.control, ControlMessage("remove", "mshape"))
        wait_for(lambda: any(e["name"] == "mshape" and e["op"] == "remove"
                             for e in pipeline.coordinator.lived), 60, "mshape removed")
        produce_lines(broker, topics.source, lines[second:])
        wait_for(lambda: merger.ended, 60, "end of input released")
    added = [e for e in pipeline.coordinator.lived if e["name"] == "ups"][0]
    assert added["at"] == first and added["latency_ms"] is not None
    tmp.unlink()
    got = _outputs(broker, mshape + ups, before)
    want_m = reference.run(mshape, events[:second])
    want_u = reference.run(ups, events[first:])
    assert want_m and want_u
    assert got["double_tops"] == want_m
    assert got["ups"] == want_u


def load_queries_text(text: str):
    from cep_core.checker import load_query_text
    return load_query_text(text)


def test_serve_all_processes_and_sigterm(broker, tmp_path):
    """`cep serve all --distributed` as real processes (splitter, 2 workers, coordinator), queries
    registered with `cep query add`, clean exit 0 on SIGTERM."""
    queries = load_queries(EXAMPLES / "finance.cep")
    topics = _topics("trades")
    create_topics(broker, topics, 4, ["double_tops", "trade_stats"])
    before = _counts(broker, queries)
    web_port = free_port()
    env = {**os.environ, "KAFKA_BOOTSTRAP": broker.bootstrap, "CEP_SESSION_TIMEOUT_MS": "2000",
           "CEP_TOPIC_PREFIX": topics.prefix, "CEP_WEB_PORT": str(web_port)}
    cep = [sys.executable, "-m", "cep_service.cli.main"]
    added = subprocess.run(cep + ["query", "add", str(EXAMPLES / "finance.cep")], env=env,
                           cwd=ROOT, capture_output=True, timeout=60)
    assert added.returncode == 0, added.stderr
    log = open(tmp_path / "serve.log", "wb")
    serve = subprocess.Popen(cep + ["serve", "all", "--distributed", "--workers", "2",
                                    "--source", topics.source],
                             env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        produce_lines(broker, topics.source, file_records(EXAMPLES / "data" / "trades.jsonl"))
        events, _ = read_events(EXAMPLES / "data" / "trades.jsonl", queries[0].schema)
        expected = _expected(queries, events)

        def released():
            return any(orjson.loads(m.value()).get("event") == "end_of_input"
                       for m in read_all(broker, topics.status, idle_s=0.1))
        wait_for(released, 150, "end of input released", interval_s=0.3)
        assert _outputs(broker, queries, before) == expected
        # the splitter is a Faust app: its web view tells what it stamped and routed
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/status/", timeout=10) as r:
            status = json.loads(r.read())
        assert status["keyed_topic"] == topics.keyed
        assert status["last_seq"] == len(events) - 1
        assert [q["name"] for q in status["queries"]] == ["mshape", "activity"]
        routes = {q["route"] for q in status["queries"]}
        assert sum(p["events"] for p in status["partitions"]) == len(events) * len(routes)
        assert all(p["frames"] > 0 for p in status["partitions"])
        assert status["pulses"] > 0  # the Faust timer is the app's only pulse source
        listed = subprocess.run(cep + ["query", "list"], env=env, cwd=ROOT,
                                capture_output=True, timeout=60)
        assert [orjson.loads(x)["name"] for x in listed.stdout.splitlines()] == \
            ["mshape", "activity"]
    finally:
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(60)
    text = (tmp_path / "serve.log").read_text()
    assert code == 0, text[-3000:]
    assert '"event":"worker_stopped"' in text and '"event":"splitter_stopped"' in text
    assert "[^-SplitterApp]: Starting" in text  # Faust's worker ran the splitter
