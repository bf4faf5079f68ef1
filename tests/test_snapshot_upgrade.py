"""The upgrade test: snapshots written by earlier releases (tests/fixtures/snapshots/v<N>,
made by tests/fixtures/make_snapshots.py) restored by this code, fed the rest of their
input, give with what the earlier release emitted before the snapshot exactly one
uninterrupted run: the reference interpreter's composite events for engines and the
Python API's Stream, an uninterrupted in-memory pipeline's releases for the partitions and
the coordinator, every seq stamped once with the same event for the splitter."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest
from confluent_kafka import TopicPartition

FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIXTURES))

import make_snapshots as made  # noqa: E402
import test_splitter_end as splitter_test  # noqa: E402

import cep_service.stream.splitter as splitter_module  # noqa: E402
from cep_core import reference  # noqa: E402
from cep_core.batch import BatchEncoder, StringDictionary  # noqa: E402
from cep_core.composite import sort_key  # noqa: E402
from cep_core.composites import read_table as composite_dicts  # noqa: E402
from cep_core.engine_factory import create_engine  # noqa: E402
from cep_core.event_reader import events_from_table  # noqa: E402
from cep_core.snapshot_format import unpack_json  # noqa: E402
from cep_service.stream.merge import Merger  # noqa: E402
from cep_service.stream.partition import PartitionState  # noqa: E402
from cep_service.stream.splitter import SPLITTER_KEY  # noqa: E402

VERSIONS = sorted(p.name for p in (FIXTURES / "snapshots").glob("v*"))
QUERIES = {"mshape": "finance", "activity": "finance", "fulfilled": "rfid",
           "not_cancelled": "rfid", "duplicate_orders": "rfid", "duplicate_orders_next": "rfid"}


def fixture(version: str, name: str) -> bytes:
    return (FIXTURES / "snapshots" / version / name).read_bytes()


def emitted(version: str) -> dict:
    return orjson.loads(fixture(version, "emitted.json"))


def as_json(composites) -> list:
    return orjson.loads(orjson.dumps(list(composites)))


def in_order(queries, composites) -> list:
    index = {q.name: q.index for q in queries.queries}
    return sorted(as_json(composites), key=lambda c: sort_key(c, index[c["query"]]))


_reference: dict[str, tuple] = {}


def uninterrupted(file: str):
    """(query set, input table, the reference interpreter's composite events)."""
    if file not in _reference:
        queries, table = made.input_table(file)
        rejected: list = []
        out = reference.run(queries.queries, events_from_table(table, queries.schema),
                            rejected=rejected)
        assert not rejected
        _reference[file] = queries, table, as_json(out)
    return _reference[file]


def test_every_version_has_every_fixture():
    assert VERSIONS[:2] == ["v0", "v1"]
    names = {p.name for p in (FIXTURES / "snapshots" / "v0").iterdir()}
    for version in VERSIONS:
        assert {p.name for p in (FIXTURES / "snapshots" / version).iterdir()} == names


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", QUERIES)
def test_an_engine_goes_on_from_its_snapshot(version, name):
    queries, table, expected = uninterrupted(QUERIES[name])
    (checked,) = [q for q in queries.queries if q.name == name]
    strings = StringDictionary()
    engine = create_engine(checked, strings)
    engine.restore(fixture(version, f"engine-{name}.bin"))
    encoder = BatchEncoder(queries.schema, strings)
    half = made.split_at(range(table.num_rows))
    after = engine.process(encoder.from_arrow(table.slice(half))) + engine.flush()
    assert after, "the rest of the input completes composite events"
    assert in_order(queries, emitted(version)[f"engine-{name}"] + after) == \
        [c for c in expected if c["query"] == name]
    assert engine.dead_letters == []


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("file", made.FILES)
def test_a_python_api_stream_goes_on_from_its_snapshot(version, file):
    queries, table, expected = uninterrupted(file)
    stream = queries.stream()
    stream.restore(fixture(version, f"stream-{file}.bin"))
    half = made.split_at(range(table.num_rows))
    after = [stream.push(table.slice(half)), stream.flush()]
    got = emitted(version)[f"stream-{file}"] + [c for t in after for c in composite_dicts(t)]
    assert in_order(queries, got) == expected
    assert stream.dead_letters == []


@pytest.mark.parametrize("version", VERSIONS)
def test_partitions_and_the_coordinator_go_on_from_their_checkpoints(version):
    lines = made.input_lines("trades.jsonl")
    whole = made.pipeline_half()
    whole.send(lines[made.split_at(lines):])
    whole.end()

    pipeline = made.pipeline_half()  # the router where it was; its cores are replaced
    for p, part in enumerate(pipeline.parts):
        restored = PartitionState(p, "trades", pipeline.registry, 3_600_000, pipeline.topics)
        restored.restore(fixture(version, f"partition-{p}.bin"))
        assert restored.offset == part.offset and restored.seen == part.seen
        pipeline.parts[p] = restored
    checkpoint = unpack_json("coordinator", fixture(version, "coordinator.json"))
    assert checkpoint["offsets"] == [7, 9] and checkpoint["delivered"] == {"double_tops": 3}
    pipeline.merger = Merger(2, "trades", pipeline.registry)
    pipeline.merger.load_state(checkpoint["merger"])
    pipeline.outputs = emitted(version)["pipeline"]
    pipeline.send(lines[made.split_at(lines):])
    pipeline.end()
    assert as_json(pipeline.outputs["double_tops"]) == as_json(whole.outputs["double_tops"])
    assert as_json(pipeline.outputs["trade_stats"]) == as_json(whole.outputs["trade_stats"])
    assert len(whole.outputs["double_tops"]) > len(emitted(version)["pipeline"]["double_tops"])


@pytest.mark.parametrize("version", VERSIONS)
def test_the_splitter_goes_on_from_its_checkpoint(version, monkeypatch):
    source = made.splitter_messages()
    total = sum(len(m) - 1 for m in source.values())
    whole, _ = made.splitter_half()  # seqs are places in consumption order: the same order
    for messages in source.values():
        for step in splitter_test.steps_of(messages[made.split_at(messages):], 20):
            whole.take(step)
    expected = splitter_test.stamped(whole)

    monkeypatch.setattr(splitter_module, "read_latest",
                        lambda *a: {SPLITTER_KEY: fixture(version, "splitter.json")})
    monkeypatch.setattr(splitter_module, "logged_steps", lambda *a: [])
    restarted = splitter_test.new_splitter(5000)
    resume = restarted._resume_at([TopicPartition("src", p) for p in source])
    assert restarted.refill is not None  # events waited in the reorder buffer
    for tp in resume:
        for step in splitter_test.steps_of(source[tp.partition][max(tp.offset, 0):], 20):
            restarted.take(step)
    after = splitter_test.stamped(restarted)
    before = emitted(version)["splitter"]
    assert sorted(set(before) | set(after)) == list(range(total))
    assert all(after[seq] == expected[seq] for seq in after)
    splitter_test.assert_ends_last(restarted, total)
