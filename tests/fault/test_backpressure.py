"""Backpressure on a real broker: a producer much faster than a slowed worker. The worker's
and coordinator's clients are bounded (prefetch, output queue), the worker pauses its
consumer while its output queue is over the bound, and the coordinator pauses partitions
ahead of the slowest while too many composite events wait: the process's RSS stays within a
bound while the input is far larger than what is in flight, and every event is processed."""

from __future__ import annotations

import resource
import uuid
from pathlib import Path

import orjson
import pytest

from cep_core import reference
from cep_core.checker import load_query_text
from cep_core.event_io import read_events
from cep_service.stream.control import ControlMessage, publish, split_query_file
from cep_service.stream.kafka import KafkaSettings, Topics, produce, read_all
from cep_service.stream.pipeline import (
    LocalPipeline,
    create_topics,
    flush_progressing,
    wait_progressing,
)
from stream_harness import file_records, produce_to_end

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

QUERY = ("QUERY keys FROM trades INTO keys_bp PARTITION BY symbol\n"
         "PATTERN ( up ) DEFINE up AS price > 0\nEMIT symbol = symbol;")


@pytest.fixture
def broker(kafka_bootstrap):
    return KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def test_fast_producer_slow_worker_stays_bounded(broker):
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.bp.{run}", prefix=f"t{run}")
    create_topics(broker, topics, 4, ["keys_bp"])
    publish(broker, topics.control, ControlMessage("add", "keys", QUERY))
    total = 60_000
    with LocalPipeline(broker, topics, workers=1,
                       splitter_options={"batch_size": 500},
                       worker_options={"slow_down_s": 0.02, "max_queued_output": 50,
                                       "batch_size": 10}) as pipeline:
        pipeline.coordinator.max_pending = 2000
        worker = pipeline.workers[0]
        wait_progressing(lambda: worker.parts, pipeline.progress, "worker assigned")
        start = _rss_mib()
        producer = broker.producer()
        samples = []
        for i in range(total):
            produce(producer, topics.source, orjson.dumps(
                {"symbol": f"s{i % 5000}", "price": 1 + i % 7, "volume": 1, "ts": i,
                 "seqNum": i}))
            if i % 10000 == 0:
                flush_progressing(producer, "events")
                samples.append(_rss_mib())
        flush_progressing(producer, "events")
        wait_progressing(lambda: pipeline.coordinator.merger.received >= total,
                         pipeline.progress, "all processed")
        samples.append(_rss_mib())
        assert max(samples) - start < 300, samples
        assert all(len(w.producer) <= 2 * 50 + 500 for w in pipeline.workers)


def _finance_queries(run: str) -> list[tuple[str, str]]:
    """examples/finance.cep (a MATCH and a WINDOW query) with INTO topics of this run."""
    texts = []
    for name, text in split_query_file((EXAMPLES / "finance.cep").read_text()):
        for output in ("double_tops", "trade_stats"):
            text = text.replace(f"INTO {output}", f"INTO {output}_{run}")
        texts.append((name, text))
    return texts


def test_paused_pipeline_output_equals_reference(broker):
    """A worker output queue bound of 0 frames makes every batch that sends a frame pause
    the worker's consumer until the producer has delivered it; a coordinator bound of 0
    pending composites pauses the match partitions ahead of the slowest whenever a
    composite waits. Both pause counters go up and the INTO topics still hold exactly
    the reference interpreter's composite events."""
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.bpref.{run}", prefix=f"t{run}")
    texts = _finance_queries(run)
    queries = [q for _, text in texts for q in load_query_text(text)]
    path = EXAMPLES / "data" / "trades.jsonl"
    events, _ = read_events(path, queries[0].schema)
    found = reference.run(queries, events)
    expected = {q.query.output: [c for c in found if c["query"] == q.name] for q in queries}
    assert all(expected.values())
    create_topics(broker, topics, 4, list(expected))
    for name, text in texts:
        publish(broker, topics.control, ControlMessage("add", name, text))
    with LocalPipeline(broker, topics, workers=1, pulse_ms=1000,
                       splitter_options={"batch_size": 25},
                       worker_options={"max_queued_output": 0, "batch_size": 5,
                                       "checkpoint_ms": 60_000},
                       coordinator_options={"max_pending": 0}) as pipeline:
        produce_to_end(broker, pipeline, topics.source, file_records(path))
    worker = pipeline.workers[0]
    worker_metric = pipeline.metrics[1].registry.get_sample_value("cep_consumer_pauses_total")
    assert worker.pauses > 0 and worker_metric == worker.pauses
    # The coordinator pauses only when partitions are at different points as a batch ends:
    # timing-dependent, so not asserted here (observed 1-16 pauses per run).
    got = {topic: [orjson.loads(m.value()) for m in read_all(broker, topic)]
           for topic in expected}
    for topic, want in expected.items():
        assert got[topic] == want, topic
