"""The services' Prometheus endpoints, scraped over real HTTP while a pipeline (splitter,
one worker, coordinator as threads on the shared test broker) runs the M-shape query on the
example trades with a few bad records: events in/out, dead letters, batch seconds, lag,
partitions, live queries and the MATCH engine's partial matches have the values the run
implies."""

from __future__ import annotations

import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cep_core import reference
from cep_core.checker import load_queries
from cep_core.event_io import read_events
from cep_service.stream.broker import free_port
from cep_service.stream.control import ControlMessage, publish, split_query_file
from cep_service.stream.kafka import KafkaSettings, Topics, produce, produce_end
from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_for

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BAD = [b"{not json", b'{"symbol": "MSFT"}', b"[1, 2]"]


def scrape(port: int) -> dict[str, float]:
    """Every sample of the endpoint: name{label=value,...} -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


@pytest.fixture
def settings(kafka_bootstrap):
    return KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)


def test_metrics_endpoints_report_the_run(settings):
    queries = [q for q in load_queries(EXAMPLES / "finance.cep") if q.name == "mshape"]
    lines = [x for x in (EXAMPLES / "data" / "trades.jsonl").read_bytes().splitlines() if x]
    events, _ = read_events(EXAMPLES / "data" / "trades.jsonl", queries[0].schema)
    expected = reference.run(queries, events)
    assert expected
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.trades.{run}", prefix=f"metrics-{run}")
    create_topics(settings, topics, 4, ["double_tops"])
    text = dict(split_query_file((EXAMPLES / "finance.cep").read_text()))["mshape"]
    publish(settings, topics.control, ControlMessage("add", "mshape", text))
    ports = [free_port() for _ in range(3)]
    producer = settings.producer()
    with LocalPipeline(settings, topics, workers=1, metrics_ports=ports) as pipeline:
        for line in BAD + lines:
            produce(producer, topics.source, line)
        producer.flush(30)
        merger = pipeline.coordinator.merger
        total = len(BAD) + len(lines)
        wait_for(lambda: min(merger.upto) >= total - 1, 60, "every event processed")
        time.sleep(1.2)  # the gauges refresh once a second
        wait_for(lambda: scrape(ports[1]).get("cep_consumer_lag") == 0, 10, "worker lag 0")
        splitter, worker = scrape(ports[0]), scrape(ports[1])
        # mid-stream (no end of input yet): the MATCH engine holds partial matches
        partial = worker["cep_partial_matches{query=mshape}"]
        symbols = {e["symbol"] for e in events}
        assert 0 < partial <= len(symbols)
        assert worker["cep_engine_state{measure=keys_with_partials,query=mshape}"] == partial
        produce_end(producer, topics.source)
        producer.flush(30)
        wait_for(lambda: merger.ended, 60, "end of input released")
        wait_for(lambda: scrape(ports[2]).get("cep_events_out_total") == len(expected), 10,
                 "coordinator counted its output")
        coordinator = scrape(ports[2])

    assert splitter["cep_events_in_total"] == len(lines)
    assert splitter["cep_events_out_total"] == len(lines)  # one route
    assert splitter["cep_dead_letters_total"] == len(BAD)
    assert splitter["cep_batch_seconds_count"] >= 1
    assert 0 < splitter["cep_batch_seconds_sum"] < 60
    assert splitter["cep_partitions"] == 1  # the source topic's one partition
    assert splitter["cep_live_queries"] == 1
    assert splitter["cep_consumer_lag"] == 0

    assert worker["cep_events_in_total"] == len(lines)
    assert worker["cep_partitions"] == 4
    assert worker["cep_live_queries"] == 1
    assert worker["cep_dead_letters_total"] == 0
    assert worker["cep_batch_seconds_count"] >= 1

    assert coordinator["cep_events_in_total"] == len(expected)
    assert coordinator["cep_events_out_total"] == len(expected)
    assert coordinator["cep_partitions"] == 4
    assert coordinator["cep_live_queries"] == 1
    assert coordinator["cep_batch_seconds_count"] >= 1
