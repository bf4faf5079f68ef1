"""The chained pipeline (services/stream/chained.py) on a real broker: splitter, workers
and coordinator cores in one thread, Kafka only at the edges. Its INTO topics must hold
exactly the reference interpreter's composite events (which the distributed pipeline's
equal, tests/test_service_e2e.py) for MATCH, SEQ and WINDOW; queries added and removed
mid-stream switch at the same seqs; no internal topic is written; a stop and a start
resume from the checkpointed cut with nothing lost or repeated. Kills are in the fault
suite (tests/fault/, mode "chained")."""

from __future__ import annotations

import uuid

import orjson
import pytest

from cep_core import reference
from cep_core.checker import load_queries, load_query_text
from cep_core.control_message import check_query
from cep_core.event_io import decode_record, read_events
from cep_service.stream.chained import CHAINED_KEY, part_key
from cep_service.stream.checkpoint import read_latest
from cep_service.stream.control import ControlMessage, publish, split_query_file
from cep_service.stream.kafka import KafkaSettings, Topics, read_all
from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_progressing
from tests.stream_harness import file_records, produce_lines
from tests.test_service_e2e import CASES, EXAMPLES


@pytest.fixture
def broker(kafka_bootstrap):
    return KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)


def _topics(stream: str, shards: int = 1) -> Topics:
    run = uuid.uuid4().hex[:8]
    return Topics(stream, source=f"src.{stream}.{run}", prefix=f"c{run}", shards=shards)


def _outputs(settings, outputs, before: dict[str, int]) -> dict[str, list]:
    return {o: [orjson.loads(m.value()) for m in read_all(settings, o)[before.get(o, 0):]]
            for o in outputs}


def _wait(pipeline: LocalPipeline, condition, what: str) -> None:
    wait_progressing(condition, pipeline.progress, what, stall_s=120)


@pytest.mark.parametrize("kind", ["match", "seq", "window"])
def test_chained_equals_reference(broker, kind):
    query_file, events_file = (EXAMPLES / name for name in CASES[kind])
    queries = load_queries(query_file)
    topics = _topics(queries[0].schema.stream)
    outputs = [q.query.output for q in queries]
    create_topics(broker, topics, 4, outputs)
    before = {o: len(read_all(broker, o)) for o in outputs}
    for name, text in split_query_file(query_file.read_text()):
        publish(broker, topics.control, ControlMessage("add", name, text))
    events, _ = read_events(events_file, queries[0].schema)
    found = reference.run(queries, events)
    expected = {q.query.output: [c for c in found if c["query"] == q.name] for q in queries}
    with LocalPipeline(broker, topics, chained=True) as pipeline:
        produce_lines(broker, topics.source, file_records(events_file))
        _wait(pipeline, lambda: pipeline.coordinator.merger.ended, "end of input released")
    assert sum(map(len, expected.values())) > 0
    assert _outputs(broker, outputs, before) == expected
    # Kafka only at the edges: nothing on the internal topics
    assert read_all(broker, topics.keyed) == [] and read_all(broker, topics.matches) == []


def test_chained_queries_added_and_removed_mid_stream(broker):
    extra = ("QUERY ups FROM trades INTO ups PARTITION BY symbol\n"
             "PATTERN ( . up up up ) DEFINE up AS price > Last(price)\n"
             "EMIT symbol = symbol, n = Count();")
    mshape = [q for q in load_queries(EXAMPLES / "finance.cep") if q.name == "mshape"]
    ups = load_query_text(extra)
    topics = _topics("trades")
    create_topics(broker, topics, 4, ["double_tops", "ups"])
    before = {o: len(read_all(broker, o)) for o in ("double_tops", "ups")}
    [(name, text)] = [(n, t) for n, t in split_query_file(
        (EXAMPLES / "finance.cep").read_text()) if n == "mshape"]
    publish(broker, topics.control, ControlMessage("add", name, text))
    lines = file_records(EXAMPLES / "data" / "trades.jsonl")
    events, _ = read_events(EXAMPLES / "data" / "trades.jsonl", mshape[0].schema)
    first, second = 400, 800
    with LocalPipeline(broker, topics, chained=True) as pipeline:
        coordinator = pipeline.coordinator
        produce_lines(broker, topics.source, lines[:first], end=False)
        _wait(pipeline, lambda: min(coordinator.merger.upto) >= first - 1, "first part")
        publish(broker, topics.control, ControlMessage("add", "ups", extra))
        _wait(pipeline, lambda: any(e["name"] == "ups" for e in coordinator.lived),
              "ups live")
        produce_lines(broker, topics.source, lines[first:second], end=False)
        _wait(pipeline, lambda: min(coordinator.merger.upto) >= second - 1, "second part")
        # Deliberately like tests/test_recognize_service.py's live add and remove: each test
        # spells out its own timeline of changes
        publish(broker, topics.control, ControlMessage("remove", "mshape"))
        _wait(pipeline, lambda: any(e["name"] == "mshape" and e["op"] == "remove"
                                    for e in coordinator.lived), "mshape removed")
        produce_lines(broker, topics.source, lines[second:])
        _wait(pipeline, lambda: coordinator.merger.ended, "end of input released")
    added = [e for e in coordinator.lived if e["name"] == "ups"][0]
    assert added["at"] == first
    got = _outputs(broker, ["double_tops", "ups"], before)
    want_m, want_u = reference.run(mshape, events[:second]), reference.run(ups, events[first:])
    assert want_m and want_u
    assert got == {"double_tops": want_m, "ups": want_u}


@pytest.mark.parametrize("shards", [1, 2])
def test_chained_resumes_from_its_cut(broker, shards):
    """Stopped (a checkpoint: every core and the source offsets as one cut) half way and
    started again: the second process restores the cut (with 2 coordinator shards, both
    merges) and the INTO topics hold exactly the reference output."""
    queries = load_queries(EXAMPLES / "finance.cep")
    topics = _topics("trades", shards)
    outputs = [q.query.output for q in queries]
    create_topics(broker, topics, 4, outputs)
    before = {o: len(read_all(broker, o)) for o in outputs}
    for name, text in split_query_file((EXAMPLES / "finance.cep").read_text()):
        publish(broker, topics.control, ControlMessage("add", name, text))
    lines = file_records(EXAMPLES / "data" / "trades.jsonl")
    events, _ = read_events(EXAMPLES / "data" / "trades.jsonl", queries[0].schema)
    half = len(lines) // 2
    with LocalPipeline(broker, topics, chained=True) as pipeline:
        produce_lines(broker, topics.source, lines[:half], end=False)
        _wait(pipeline, lambda: pipeline.splitter.position >= half, "first half taken")
    latest = read_latest(broker, topics.state)
    merges = [b"chained." + topics.coordinator_name(k).encode() for k in range(shards)]
    assert {CHAINED_KEY, part_key(0), *merges} <= {k.removesuffix(b".alt") for k in latest}
    with LocalPipeline(broker, topics, chained=True) as pipeline:
        _wait(pipeline, lambda: pipeline.splitter.started, "started again")
        assert pipeline.splitter.position == half  # restored, not replayed from 0
        produce_lines(broker, topics.source, lines[half:])
        _wait(pipeline, lambda: pipeline.coordinator.merger.ended, "end of input released")
    found = reference.run(queries, events)
    expected = {q.query.output: [c for c in found if c["query"] == q.name] for q in queries}
    assert sum(map(len, expected.values())) > 20
    assert _outputs(broker, outputs, before) == expected


def test_chained_and_distributed_agree_on_one_source(broker):
    """Both modes read the same source topic (a generated trade stream, the demo's MATCH
    and WINDOW queries, INTO topics named per mode): their INTO topics hold the same
    composite events, the reference interpreter's."""
    from cep_service.stream.demo import demo_queries, trade_lines

    run = uuid.uuid4().hex[:8]
    lines = trade_lines(4000, seed=33)
    source = f"src.trades.{run}"
    got = {}
    pipelines = []
    for mode in ("distributed", "chained"):
        topics = Topics("trades", source=source, prefix=f"{mode[0]}{run}")
        texts = [(name, text.replace("INTO double_tops", f"INTO double_tops_{mode}_{run}")
                  .replace("INTO trade_stats", f"INTO trade_stats_{mode}_{run}"))
                 for name, text in demo_queries()]
        outputs = [f"double_tops_{mode}_{run}", f"trade_stats_{mode}_{run}"]
        create_topics(broker, topics, 4, outputs)
        for name, text in texts:
            publish(broker, topics.control, ControlMessage("add", name, text))
        pipelines.append((mode, outputs, LocalPipeline(broker, topics, workers=2,
                                                       chained=mode == "chained").start()))
    try:
        produce_lines(broker, source, lines)
        for mode, _, pipeline in pipelines:
            _wait(pipeline, lambda p=pipeline: all(c.merger.ended for c in p.coordinators),
                  f"{mode}: end of input released")
    finally:
        for _, _, pipeline in pipelines:
            pipeline.stop()
    for mode, outputs, _ in pipelines:
        got[mode] = [_outputs(broker, [o], {})[o] for o in outputs]
    queries = [check_query(name, text) for name, text in demo_queries()]
    for index, query in enumerate(queries):
        query.index = index
    events = [decode_record(orjson.loads(line), queries[0].schema, seq)
              for seq, line in enumerate(lines)]
    found = reference.run(queries, events)
    want = [[c for c in found if c["query"] == q.name] for q in queries]
    assert all(want)
    assert got["chained"] == got["distributed"] == want
