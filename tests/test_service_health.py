"""/healthz and /readyz on the services' metrics port, against a real pipeline (splitter,
two workers, coordinator as threads on the session's broker); producers that fail loudly
when delivery fails (a broker that is not there, a topic that cannot exist); replication
factor of created topics as a setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from cep_service.stream.broker import free_port
from cep_service.stream.control import ControlMessage, publish, split_query_file
from cep_service.errors import BrokerUnreachable, DeliveryFailed
from cep_service.stream.kafka import (
    Deliveries,
    KafkaSettings,
    Topics,
    ensure_topics,
    flush_all,
    produce,
    produce_end,
)
from cep_service.stream.metrics import Metrics
from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def probe(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def settings(kafka_bootstrap):
    return KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)


def test_probes_before_a_service_observes_anything():
    port = free_port()
    metrics = Metrics("worker", port)
    try:
        assert probe(port, "/healthz") == (200, {"role": "worker", "alive": True})
        code, body = probe(port, "/readyz")
        assert code == 503
        assert body["ready"] is False and body["connected"] is False and body["lag"] is None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            assert b"cep_consumer_lag" in reply.read()
    finally:
        metrics.close()


def test_services_become_ready_and_report_lag(settings, monkeypatch):
    monkeypatch.setenv("CEP_READY_MAX_LAG", "0")
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.trades.{run}", prefix=f"health-{run}")
    create_topics(settings, topics, 2, ["double_tops"])
    text = dict(split_query_file((EXAMPLES / "finance.cep").read_text()))["mshape"]
    publish(settings, topics.control, ControlMessage("add", "mshape", text))
    ports = [free_port() for _ in range(4)]  # splitter, 2 workers, coordinator
    lines = [x for x in (EXAMPLES / "data" / "trades.jsonl").read_bytes().splitlines() if x]
    with LocalPipeline(settings, topics, workers=2, partitions=2,
                       metrics_ports=ports) as pipeline:
        for port in ports:
            assert probe(port, "/healthz")[0] == 200

        def all_ready():
            return all(probe(port, "/readyz")[0] == 200 for port in ports)
        wait_for(all_ready, 60, "every service ready", interval_s=0.3)
        bodies = [probe(port, "/readyz")[1] for port in ports]
        assert [b["role"] for b in bodies] == ["splitter", "worker", "worker", "coordinator"]
        assert all(b["connected"] and b["assigned"] and b["lag"] == 0 for b in bodies)
        producer = settings.producer()
        for line in lines:
            produce(producer, topics.source, line)
        produce_end(producer, topics.source)
        flush_all(producer, 30)
        wait_for(lambda: pipeline.coordinator.merger.ended, 90, "end of input released")
        wait_for(all_ready, 30, "caught up again", interval_s=0.3)
    for port in ports:  # stopped: nothing answers any more
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_publish_to_a_broker_that_is_not_there_fails():
    nowhere = KafkaSettings(f"127.0.0.1:{free_port()}", broker="kafka")
    with pytest.raises(DeliveryFailed, match="control message 'q'"):
        publish(nowhere, "cep.queries", ControlMessage("remove", "q"), timeout_s=1)


def test_delivery_errors_are_raised_by_flush_all(settings):
    deliveries = Deliveries()
    producer = settings.producer(on_delivery=deliveries, **{"message.timeout.ms": 3000})
    produce(producer, "no topic can have this name!", b"x")  # invalid characters
    with pytest.raises(DeliveryFailed, match="no topic can have this name"):
        flush_all(producer, 10, deliveries)


def test_flush_all_counts_what_is_still_queued():
    nowhere = KafkaSettings(f"127.0.0.1:{free_port()}", broker="kafka")
    producer = nowhere.producer()
    produce(producer, "t", b"x")
    with pytest.raises(DeliveryFailed, match="1 messages not delivered within 0.5 s"):
        flush_all(producer, 0.5)


def test_topics_on_a_broker_that_is_not_there():
    nowhere = KafkaSettings(f"127.0.0.1:{free_port()}", broker="kafka")
    with pytest.raises(BrokerUnreachable, match=nowhere.bootstrap):
        ensure_topics(nowhere, {"t": 1}, timeout_s=1)


def test_replication_factor_is_a_setting(settings, monkeypatch):
    monkeypatch.setenv("CEP_REPLICATION_FACTOR", "3")
    three = KafkaSettings.from_env(settings.bootstrap)
    assert three.replication_factor == 3
    name = f"rf3.{uuid.uuid4().hex[:8]}"
    ensure_topics(three, {name: 2})
    metadata = three.admin().list_topics(name, timeout=10).topics[name]
    assert [len(p.replicas) for p in metadata.partitions.values()] == [3, 3]


def test_query_add_to_a_stopped_broker_exits_1():
    queries = EXAMPLES / "finance.cep"
    result = subprocess.run(
        [sys.executable, "-m", "cep_service.cli.main", "query", "add", str(queries), "--bootstrap",
         f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "CEP_BROKER": "kafka"})
    assert result.returncode == 1, result.stderr
    assert "error: broker 127.0.0.1:" in result.stderr
    assert "Traceback" not in result.stderr
