"""A user's own stream through the streaming service: the orders schema of
examples/own_stream (imported from a JSON Schema) given by file, `cep query add --schema`
registering its queries, the services finding it through CEP_SCHEMA_PATH; the composite
events equal the reference interpreter's."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import orjson

from cep_core import reference
from cep_core.checker import load_queries
from cep_core.event_io import read_events
from cep_core.schema import SchemaRegistry
from cep_service.stream.kafka import (KafkaSettings, Topics, flush_all, produce, produce_end,
                                      read_all)
from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_for

ROOT = Path(__file__).resolve().parent.parent
OWN = ROOT / "examples" / "own_stream"


def _outputs(settings, queries) -> dict[str, list]:
    return {q.query.output: [orjson.loads(m.value()) for m in read_all(settings,
                                                                        q.query.output)]
            for q in queries}


def test_own_stream_through_the_pipeline(kafka_bootstrap, monkeypatch):
    settings = KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)
    registry = SchemaRegistry()
    registry.add_path(OWN / "schemas")
    queries = load_queries(OWN / "orders.cep", registry)
    run = uuid.uuid4().hex[:8]
    topics = Topics("orders", source=f"src.orders.{run}", prefix=f"own-{run}")
    create_topics(settings, topics, 2, [q.query.output for q in queries])
    before = {topic: len(got) for topic, got in _outputs(settings, queries).items()}
    env = {k: v for k, v in os.environ.items() if k != "CEP_SCHEMA_PATH"}
    env.update(KAFKA_BOOTSTRAP=kafka_bootstrap, CEP_TOPIC_PREFIX=topics.prefix)
    cep = [sys.executable, "-m", "cep_service.cli.main", "query", "add", str(OWN / "orders.cep")]
    unknown = subprocess.run(cep, env=env, capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 1 and "orders" in unknown.stderr
    added = subprocess.run(cep + ["--schema", str(OWN / "schemas")], env=env,
                           capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    events, dead = read_events(OWN / "orders.jsonl", queries[0].schema)
    assert len(dead) == 1
    found = reference.run(queries, events)
    expected = {q.query.output: [c for c in found if c["query"] == q.name] for q in queries}
    assert all(expected.values())
    monkeypatch.setenv("CEP_SCHEMA_PATH", str(OWN / "schemas"))  # the services' registries
    with LocalPipeline(settings, topics, workers=2, partitions=2) as pipeline:
        producer = settings.producer()
        for line in (OWN / "orders.jsonl").read_bytes().splitlines():
            produce(producer, topics.source, line)
        produce_end(producer, topics.source)
        flush_all(producer, 30)
        wait_for(lambda: pipeline.coordinator.merger.ended, 120, "end of input released")
    got = _outputs(settings, queries)
    for output, wanted in expected.items():
        assert got[output][before[output]:] == wanted, output
    dead_letters = [orjson.loads(m.value()) for m in read_all(settings, topics.dead_letters)]
    assert len(dead_letters) == 1 and "amount" in dead_letters[0]["reason"]
