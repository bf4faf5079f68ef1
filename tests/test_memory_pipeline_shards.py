"""Coordinator shards in memory: with 1 or 2 shards and 1, 2 or 4 keyed partitions (the
units workers own: any split of them over workers gives each partition the same frames),
the pipeline gives the reference interpreter's composite events, each INTO topic written by
one shard only."""

from __future__ import annotations

import pytest

from cep_service.stream.kafka import Topics
from tests.test_memory_pipeline import CASES, assert_outputs, case, lines_of, pipeline_of


@pytest.mark.parametrize("partitions", [1, 2, 4])
@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("kind", list(CASES))
def test_sharded_output_equals_reference(kind, shards, partitions):
    query_file, events_file, stream, expected = case(kind)
    pipeline = pipeline_of(query_file, stream, partitions, shards=shards)
    lines = lines_of(events_file)
    for at in range(0, len(lines), 97):
        pipeline.send(lines[at:at + 97])
    pipeline.end()
    assert_outputs(pipeline, expected)
    assert all(merger.ended for merger in pipeline.mergers)


def test_each_shard_releases_only_its_own_into_topics():
    query_file, events_file, stream, expected = case("finance")
    pipeline = pipeline_of(query_file, stream, 4, shards=2)
    shards = {output: pipeline.topics.shard_of(output) for output in expected}
    assert sorted(shards.values()) == [0, 1]  # the two INTO topics land on both shards
    released: list[set] = [set() for _ in pipeline.mergers]
    for k, merger in enumerate(pipeline.mergers):
        merger.release = _recording(merger.release, released[k])
    for line in lines_of(events_file):
        pipeline.send([line])
    pipeline.end()
    assert_outputs(pipeline, expected)
    assert released == [{o for o, k in shards.items() if k == s} for s in (0, 1)]


def _recording(release, outputs: set):
    def wrapped():
        out = release()
        outputs.update(output for output, _ in out)
        return out
    return wrapped


def test_one_shard_keeps_todays_topic_and_checkpoint_names():
    topics = Topics("trades")
    assert topics.matches_of(0) == "cep.trades.matches"
    assert topics.coordinator_name(0) == "coordinator"
    sharded = Topics("trades", shards=3)
    assert [sharded.matches_of(k) for k in range(3)] == \
        ["cep.trades.matches.0", "cep.trades.matches.1", "cep.trades.matches.2"]
    assert sharded.coordinator_name(2) == "coordinator.2"
    assert {sharded.shard_of(f"out{i}") for i in range(30)} == {0, 1, 2}
