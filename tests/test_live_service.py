"""Live changes with feedback on a real broker (the session's `kafka_bootstrap`): `cep query`
and `cep stream` wait for the services' outcome records on the status topic and exit 0
(applied everywhere), 1 (refused, with the checker's file:line:col message) or 2 (time-out);
a stream registered at run time carries a query end to end without a restart. Progress is
awaited on status records and the coordinator's state, never on wall-clock sleeps."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest

from cep_core import reference
from cep_core.checker import load_query_text
from cep_core.event_io import read_events
from cep_core.schema import SchemaRegistry, StreamSchema
from cep_service.stream.control import StatusReader, services_up
from cep_service.stream.kafka import KafkaSettings, Topics, produce, produce_end, read_all
from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_for

ROOT = Path(__file__).resolve().parent.parent
TRADES = ROOT / "examples" / "data" / "trades.jsonl"
UPS = """QUERY {name} FROM {stream} INTO {output} PARTITION BY symbol
PATTERN ( . up up ) DEFINE up AS price > Last(price)
EMIT symbol = symbol, n = Count();"""


@pytest.fixture
def broker(kafka_bootstrap):
    return KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)


def cep(broker, topics: Topics, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KAFKA_BOOTSTRAP": broker.bootstrap, "CEP_TOPIC_PREFIX": topics.prefix,
           "CEP_STREAM": topics.stream}
    return subprocess.run([sys.executable, "-m", "cep_service.cli.main", *args, "--timeout", "120"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)


def splitter_up(broker, topics: Topics) -> bool:
    reader = StatusReader(broker, topics.status)
    try:
        return any(e["role"] == "splitter" for e in services_up(reader.read_existing()).values())
    finally:
        reader.close()


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_query_applied_everywhere_or_refused_with_its_location(broker, tmp_path):
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.trades.{run}", prefix=f"t{run}")
    output = f"ups_{run}"
    create_topics(broker, topics, 4, [output])
    good = write(tmp_path / "good.cep", UPS.format(name="ups", stream="trades", output=output))
    bad = write(tmp_path / "bad.cep", "QUERY bad FROM trades\nPATTERN ( a )\n"
                "DEFINE a AS symbol > 3\nEMIT symbol = symbol;")
    with LocalPipeline(broker, topics, workers=2) as pipeline:
        wait_for(lambda: splitter_up(broker, topics), 60, "the splitter's presence record")
        added = cep(broker, topics, "query", "add", good)
        assert added.returncode == 0, added.stdout + added.stderr
        assert "query ups: add applied from seq 0" in added.stdout
        assert "all 4 partitions" in added.stdout
        assert any(e["name"] == "ups" for e in pipeline.coordinator.lived)

        again = cep(broker, topics, "query", "add", good)  # refused here: not published
        assert again.returncode == 1 and "query 'ups' is live already (use update)" in \
            again.stderr
        again = cep(broker, topics, "query", "add", good, "--no-check")  # by the splitter
        assert again.returncode == 1
        assert "query 'ups' is live already (use update)" in again.stdout

        refused = cep(broker, topics, "query", "add", bad, "--no-check")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "query bad: add refused by splitter@" in refused.stdout
        # the splitter's `<query bad>:3:N` message, located in the file the CLI sent
        assert re.search(re.escape(bad) + r":3:\d+: error: ", refused.stdout), refused.stdout
        assert "bad" not in pipeline.splitter.queries.live

        local = cep(broker, topics, "query", "add", bad)  # checked here: never published
        assert local.returncode == 1 and re.search(r":3:\d+: ", local.stderr), local.stderr

        listed = cep(broker, topics, "query", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        services = orjson.loads(listed.stdout)["services"]
        roles = sorted(s["role"] for s in services)
        assert roles == ["coordinator", "splitter", "worker", "worker"]
        for service in services:
            lives = [service["live"]] if service["role"] != "worker" else \
                list(service["partitions"].values())
            assert lives and all(set(live["queries"]) == {"ups"} for live in lives), service
        assert sorted(p for s in services for p in map(int, s["partitions"])) == [0, 1, 2, 3]


def test_stream_registered_at_run_time_end_to_end(broker, tmp_path):
    run = uuid.uuid4().hex[:8]
    stream, output = f"rt{run}", f"rt_ups_{run}"
    topics = Topics(stream, source=f"src.{stream}", prefix=f"t{run}")
    create_topics(broker, topics, 2, [output])
    schema = orjson.loads((ROOT / "schemas" / "trades.json").read_bytes())
    schema.update(stream=stream, doc="trades, registered at run time")
    schema_file = write(tmp_path / "stream.json", orjson.dumps(schema).decode())
    text = UPS.format(name="rises", stream=stream, output=output)
    query_file = write(tmp_path / "rises.cep", text)
    without_price = {**schema, "attributes": {k: v for k, v in schema["attributes"].items()
                                              if k != "price"}}
    breaking = write(tmp_path / "breaking.json", orjson.dumps(without_price).decode())

    with LocalPipeline(broker, topics, workers=1, partitions=2) as pipeline:
        wait_for(lambda: splitter_up(broker, topics), 60, "the splitter, waiting for its stream")
        added = cep(broker, topics, "stream", "add", schema_file)
        assert added.returncode == 0, added.stdout + added.stderr
        assert f"stream {stream}: add applied" in added.stdout
        query = cep(broker, topics, "query", "add", query_file)
        assert query.returncode == 0, query.stdout + query.stderr
        producer = broker.producer()
        for line in TRADES.read_bytes().splitlines():
            produce(producer, topics.source, line)
        produce_end(producer, topics.source)
        producer.flush(30)
        wait_for(lambda: pipeline.coordinator.merger.ended, 120, "end of input released")

        refused = cep(broker, topics, "stream", "update", breaking, "--no-check")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"stream '{stream}' update refused: it would break the live query 'rises'" \
            in refused.stdout
        assert re.search(r"<query rises>:\d+:\d+: ", refused.stdout), refused.stdout
        local = cep(broker, topics, "stream", "update", breaking)
        assert local.returncode == 1 and "would break the live query 'rises'" in local.stderr

        listed = cep(broker, topics, "stream", "list", "--json")
        splitter = [s for s in orjson.loads(listed.stdout)["services"]
                    if s["role"] == "splitter"][0]
        assert splitter["live"]["streams"] == {stream: 1}

    registry = SchemaRegistry()
    registry.add(StreamSchema.from_dict(schema))
    queries = load_query_text(text, registry)
    events, _ = read_events(TRADES, queries[0].schema)
    expected = reference.run(queries, events)
    assert expected
    assert [orjson.loads(m.value()) for m in read_all(broker, output)] == expected


def test_no_outcome_in_time_exits_2_and_no_pipeline_exits_0(broker, tmp_path):
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.trades.{run}", prefix=f"t{run}")
    query = write(tmp_path / "q.cep", UPS.format(name="ups", stream="trades", output="ups_x"))
    queued = cep(broker, topics, "query", "add", query)  # no status topic: nobody is up
    assert queued.returncode == 0, queued.stdout + queued.stderr
    assert "no 'trades' pipeline is up; the change waits on" in queued.stdout

    create_topics(broker, topics, 1)  # a splitter that says it is up, and never answers
    from cep_service.stream.control import StatusWriter
    from cep_service.stream.status import Presence
    producer = broker.producer()
    StatusWriter(topics.status, "splitter").presence(producer, Presence.UP)
    producer.flush(30)
    update = subprocess.run([sys.executable, "-m", "cep_service.cli.main", "query", "update", query,
                             "--timeout", "1"], env={**os.environ,
                            "KAFKA_BOOTSTRAP": broker.bootstrap,
                            "CEP_TOPIC_PREFIX": topics.prefix}, cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert update.returncode == 2, update.stdout + update.stderr
    assert "query ups: no outcome from the splitter and the coordinator of 'trades' after 1 s" \
        in update.stdout


def test_queries_live_at_start_up_show_in_every_workers_partitions(broker, tmp_path):
    """A query already on the control topic reaches the workers in the splitter's start-up
    `set` frame: each worker then says which of its partitions hold it (the console and
    `cep query list` read that), not only that it is up."""
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.trades.{run}", prefix=f"t{run}")
    output = f"ups_{run}"
    create_topics(broker, topics, 2, [output])
    good = write(tmp_path / "good.cep", UPS.format(name="ups", stream="trades", output=output))
    queued = cep(broker, topics, "query", "add", good)  # no pipeline up: it waits there
    assert queued.returncode == 0, queued.stdout + queued.stderr

    def workers_hold_it() -> bool:
        listed = cep(broker, topics, "query", "list", "--json")
        workers = [s for s in orjson.loads(listed.stdout)["services"]
                   if s["role"] == "worker"]
        lives = [live for w in workers for live in w.get("partitions", {}).values()]
        return len(lives) == 2 and all("ups" in live["queries"] for live in lives)

    with LocalPipeline(broker, topics, workers=1, partitions=2):
        wait_for(workers_hold_it, 120, "the worker's partitions holding the start-up query",
                 interval_s=1.0)
