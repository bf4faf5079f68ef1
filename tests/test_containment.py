"""A query whose engine fails stops alone: the other queries' composite events are exactly
those of a run without it (`cep run`, the Python API's engines, the pipeline's cores), the
failure is reported where a user looks (status topic, `cep query list`'s items, a metric),
and a restart from a snapshot neither runs the failed query again nor dies on it.
Failures are injected with CEP_FAILPOINTS (cep_core/failpoints.py) at every stage, and
come for real from a WINDOW query whose groups outgrow CEP_MAX_QUERY_STATE_BYTES."""

from __future__ import annotations

from pathlib import Path

import pytest

from cep_core import failpoints, query_limits, reference
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_queries, load_query_text
from cep_core.event_io import read_events
from cep_core.stream_engines import StreamEngines, run
from cep_service.stream.control import ControlMessage, services_up, split_query_file
from cep_service.stream.live_changes import live_items
from cep_service.stream.memory_pipeline import MemoryPipeline

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# (query file, events): each file has two queries or more, so one can fail beside others.
CASES = {"finance": ("finance.cep", "data/trades.jsonl"),
         "fire": ("fire.cep", "data/sensors.jsonl"),
         "rfid": ("rfid.cep", "data/rfid.jsonl")}


@pytest.fixture
def failpoint(monkeypatch):
    def set_points(text: str) -> None:
        monkeypatch.setenv("CEP_FAILPOINTS", text)
        failpoints.reset()
    yield set_points
    monkeypatch.delenv("CEP_FAILPOINTS", raising=False)
    failpoints.reset()


def load(case: str):
    query_file, events_file = (EXAMPLES / name for name in CASES[case])
    queries = load_queries(query_file)
    events, _ = read_events(events_file, queries[0].schema)
    return query_file, events_file, queries, events


def without(found: list[dict], name: str) -> list[dict]:
    return [c for c in found if c["query"] != name]


@pytest.mark.parametrize("stage", ["compile", "process", "flush"])
@pytest.mark.parametrize("case", list(CASES))
def test_engines_lose_only_the_failed_query(case, stage, failpoint):
    _, _, queries, events = load(case)
    victim = queries[-1].name
    expected = without(reference.run(queries, events), victim)
    middle = events[len(events) // 2].seq
    failpoint(f"{victim}:{stage}" + (f"@{middle}" if stage == "process" else ""))
    strings = StringDictionary()
    engines = StreamEngines(queries, strings)
    from cep_core.stream_engines import run_engines
    found = run_engines(engines, BatchEncoder(queries[0].schema, strings), events,
                        batch_size=50).to_dicts()
    assert without(found, victim) == expected
    assert list(engines.failed) == [victim]
    failure = engines.failed[victim]
    assert failure.stage == stage and "InjectedFault" in failure.reason
    assert engines.take_failures() == [failure] and engines.take_failures() == []


def test_snapshot_and_restore_failures_are_contained(failpoint):
    _, _, queries, events = load("finance")
    half = len(events) // 2
    expected = reference.run(queries, events)
    victim, other = queries[0].name, queries[1].name
    failpoint(f"{victim}:snapshot")
    strings = StringDictionary()
    engines = StreamEngines(queries, strings)
    first = run(queries, events[:half], flush=False)  # what a run up to here releases
    encoder = BatchEncoder(queries[0].schema, strings)
    engines.process(encoder.from_events(events[:half]))
    saved = engines.snapshot()
    assert list(engines.failed) == [victim]
    failpoint("")
    strings2 = StringDictionary()
    again = StreamEngines(queries, strings2)
    again.restore(saved)  # the snapshot has no state of the victim: it starts afresh
    rest = again.process(BatchEncoder(queries[0].schema, strings2).from_events(
        events[half:])) + again.flush()
    assert without(again.order(first + rest), victim) == without(expected, victim)
    assert [c for c in first + rest if c["query"] == other]

    failpoint(f"{other}:restore")
    strings3 = StringDictionary()
    third = StreamEngines(queries, strings3)
    third.restore(saved)
    assert list(third.failed) == [other]


def test_window_state_limit_fails_the_query_alone(monkeypatch):
    """A real run-time failure: a WINDOW query grouped by a key with many values goes
    past the per-query state limit; the other queries beside it are untouched."""
    from cep_core.compiler.window import plan
    from cep_core.kernels import window_kernels

    _, _, queries, events = load("finance")
    text = ("QUERY wide INTO wide SELECT seqNum, count(*) AS n "
            "FROM trades [RANGE 1 hour SLIDE 1 second] GROUP BY seqNum;")
    one_group = 3600 * query_limits.pane_bytes(plan(load_query_text(text)[0]), window_kernels)
    monkeypatch.setenv("CEP_MAX_QUERY_STATE_BYTES", str(40 * one_group))
    query_limits.limits.cache_clear()
    try:
        wide = load_query_text(text)[0]
        wide.index = len(queries)
        strings = StringDictionary()
        engines = StreamEngines(queries + [wide], strings)
        from cep_core.stream_engines import run_engines
        found = run_engines(engines, BatchEncoder(queries[0].schema, strings), events,
                            batch_size=100).to_dicts()
    finally:
        query_limits.limits.cache_clear()
    assert list(engines.failed) == ["wide"]
    assert "QueryStateLimit" in engines.failed["wide"].reason
    assert without(found, "wide") == reference.run(queries, events)


@pytest.mark.parametrize("partitions", [1, 3])
def test_pipeline_quarantines_one_query(partitions, failpoint):
    query_file, events_file, queries, events = load("finance")
    victim = "mshape"
    expected = without(reference.run(queries, events), victim)
    failpoint(f"{victim}:process@{events[len(events) // 3].seq}")
    pipeline = MemoryPipeline(queries[0].schema.stream, partitions)
    for name, text in split_query_file(query_file.read_text()):
        pipeline.control(ControlMessage("add", name, text))
    lines = [line for line in events_file.read_bytes().splitlines() if line.strip()]
    for at in range(0, len(lines), 97):
        pipeline.send(lines[at:at + 97])
    pipeline.end()
    found = [c for output in pipeline.outputs.values() for c in output]
    assert sorted(map(repr, without(found, victim))) == sorted(map(repr, expected))
    status = pipeline.records_of(pipeline.topics.status)
    failed = [r for r in status if r["event"] == "query_failed"]
    assert failed and {r["name"] for r in failed} == {victim}
    assert all(r["stage"] == "process" and "InjectedFault" in r["reason"] for r in failed)
    items = {i["name"]: i for i in live_items(services_up(status), "query")}
    assert items[victim]["state"] == "failed" and "InjectedFault" in items[victim]["reason"]
    assert items["activity"]["state"] == "live"

    # A restart from a snapshot keeps it failed: no second failure, no engine for it.
    part = next(p for p in pipeline.parts if victim in p.failed)
    failpoint("")
    from cep_service.stream.partition import PartitionState
    again = PartitionState(part.partition, part.queries.stream, part.queries.registry,
                           topics=pipeline.topics)
    again.restore(part.snapshot())
    assert victim in again.failed
    assert all(victim not in engines.queries for engines, _ in again.routes.values())
    import orjson
    said = [orjson.loads(value) for topic, value, *_ in again.sent.take()
            if topic == pipeline.topics.status]
    assert [r["name"] for r in said if r["event"] == "query_failed"] == [victim]


def test_update_gives_a_failed_query_a_new_start(failpoint):
    query_file, events_file, queries, events = load("finance")
    failpoint(f"mshape:process@{events[10].seq}")
    pipeline = MemoryPipeline(queries[0].schema.stream, 1)
    texts = dict(split_query_file(query_file.read_text()))
    for name, text in texts.items():
        pipeline.control(ControlMessage("add", name, text))
    lines = [line for line in events_file.read_bytes().splitlines() if line.strip()]
    pipeline.send(lines[:100])
    assert "mshape" in pipeline.parts[0].failed
    failpoint("")
    pipeline.control(ControlMessage("update", "mshape", texts["mshape"].replace(
        "EMIT symbol = symbol", "EMIT symbol = symbol, last = Last(price)")))
    assert "mshape" not in pipeline.parts[0].failed
    pipeline.send(lines[100:])
    pipeline.end()
    status = pipeline.records_of(pipeline.topics.status)
    items = {i["name"]: i for i in live_items(services_up(status), "query")}
    assert items["mshape"]["state"] == "live"
    assert any(c["query"] == "mshape" and "last" in c
               for c in pipeline.outputs.get("double_tops", []))


def test_service_quarantines_one_query_on_a_real_broker(kafka_bootstrap, failpoint):
    """The workers (threads of a LocalPipeline, on the session's broker) contain an engine
    failure: the other query's INTO topic is exactly `cep run`'s, the status topic and
    `cep query list`'s items say which query failed and why."""
    import uuid

    import orjson

    from cep_service.stream.control import StatusReader
    from cep_service.stream.kafka import KafkaSettings, Topics, produce, produce_end, read_all
    from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_for

    broker = KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)
    query_file, events_file, queries, events = load("finance")
    run_id = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.trades.{run_id}", prefix=f"t{run_id}")
    texts = dict(split_query_file(query_file.read_text()))
    texts["activity"] = texts["activity"].replace("INTO trade_stats", f"INTO stats_{run_id}")
    texts["mshape"] = texts["mshape"].replace("INTO double_tops", f"INTO tops_{run_id}")
    create_topics(broker, topics, 2, [f"stats_{run_id}", f"tops_{run_id}"])
    from cep_service.stream.control import publish
    for name, text in texts.items():
        publish(broker, topics.control, ControlMessage("add", name, text))
    failpoint(f"mshape:process@{events[len(events) // 2].seq}")
    with LocalPipeline(broker, topics, workers=2, partitions=2) as pipeline:
        producer = broker.producer()
        for line in events_file.read_bytes().splitlines():
            if line.strip():
                produce(producer, topics.source, line)
        produce_end(producer, topics.source)
        producer.flush(30)
        wait_for(lambda: pipeline.coordinator.merger.ended, 300, "end of input released")
    reader = StatusReader(broker, topics.status)
    try:
        status = reader.read_existing()
    finally:
        reader.close()
    failed = [r for r in status if r["event"] == "query_failed"]
    assert failed and {r["name"] for r in failed} == {"mshape"}
    checked = {q.name: q for q in load_query_text("\n".join(texts.values()))}
    got = [orjson.loads(m.value()) for m in read_all(broker, f"stats_{run_id}")]
    assert got == reference.run([checked["activity"]], events)
