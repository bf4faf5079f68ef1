"""The pipeline's cores wired in memory (services/stream/memory_pipeline.py) give the reference
interpreter's composite events, for any number of keyed partitions, with one JSON event
per message or framed Arrow batches, cut into steps of any size."""

from __future__ import annotations

from pathlib import Path

import pytest

from cep_core import reference
from cep_core.checker import load_queries
from cep_core.event_io import read_events
from cep_service.stream.control import ControlMessage, split_query_file
from cep_service.stream.memory_pipeline import MemoryPipeline

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CASES = {"match": ("marathon.cep", "data/checkpoints.jsonl"),
         "seq": ("rfid.cep", "data/rfid.jsonl"), "window": ("ticks.cep", "data/ticks.jsonl"),
         "finance": ("finance.cep", "data/trades.jsonl")}


def lines_of(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line.strip()]


def case(kind: str):
    query_file, events_file = (EXAMPLES / name for name in CASES[kind])
    queries = load_queries(query_file)
    events, _ = read_events(events_file, queries[0].schema)
    found = reference.run(queries, events)
    expected = {q.query.output: [c for c in found if c["query"] == q.name] for q in queries}
    return query_file, events_file, queries[0].schema.stream, expected


def pipeline_of(query_file: Path, stream: str, partitions: int, **options) -> MemoryPipeline:
    pipeline = MemoryPipeline(stream, partitions, **options)
    for name, text in split_query_file(query_file.read_text()):
        pipeline.control(ControlMessage("add", name, text))
    return pipeline


def assert_outputs(pipeline: MemoryPipeline, expected: dict) -> None:
    assert sum(map(len, expected.values())) > 0
    for output, composites in expected.items():
        assert pipeline.outputs.get(output, []) == composites, output


@pytest.mark.parametrize("partitions", [1, 2, 4])
@pytest.mark.parametrize("kind", list(CASES))
def test_json_messages_equal_reference(kind, partitions):
    query_file, events_file, stream, expected = case(kind)
    pipeline = pipeline_of(query_file, stream, partitions)
    lines = lines_of(events_file)
    for at in range(0, len(lines), 97):
        pipeline.send(lines[at:at + 97])
    pipeline.end()
    assert_outputs(pipeline, expected)
    assert pipeline.merger.ended


@pytest.mark.parametrize("kind", ["match", "finance"])
def test_framed_batches_equal_reference(kind):
    import pyarrow.json as pj

    query_file, events_file, stream, expected = case(kind)
    pipeline = pipeline_of(query_file, stream, 4)
    table = pj.read_json(events_file)
    for at in range(0, table.num_rows, 300):
        pipeline.send_table(table.slice(at, 300))
    pipeline.end()
    assert_outputs(pipeline, expected)


def test_frames_sized_by_bytes_give_the_same_output():
    """A large step (a backlog of framed batches) goes out as several frames per keyed
    partition, each about `max_frame_bytes`, the step's `upto` on the last."""
    query_file, events_file, stream, expected = case("finance")
    pipeline = pipeline_of(query_file, stream, 4)
    pipeline.router.max_frame_bytes = 4096
    lines = lines_of(events_file)
    pipeline.send(lines[:50])
    sizes = []
    box = pipeline.router.out
    produce = box.produce

    def keep(topic, value, key=None, partition=None, headers=None):
        if dict(headers or ()).get("kind") == b"events":
            sizes.append(len(value))
        produce(topic, value, key, partition, headers)

    box.produce = keep
    pipeline.send(lines[50:])
    pipeline.end()
    assert_outputs(pipeline, expected)
    assert len(sizes) > 20 and max(sizes) < 3 * 4096
