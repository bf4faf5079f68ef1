"""`cep bench e2e`'s per-hop latency (bench/hops.py) attributes a composite event's
time to the records that carried it, found by their create times on a real broker."""

from __future__ import annotations

import uuid

import orjson

from cep_service.stream import frames
from cep_service.bench.hops import hops
from cep_service.stream.kafka import KafkaSettings, Topics, produce
from cep_service.stream.pipeline import create_topics


def test_each_hop_is_the_gap_between_the_records_that_carried_the_composite(
        kafka_bootstrap):
    settings = KafkaSettings(kafka_bootstrap)
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.{run}", prefix=f"hops{run}", shards=2)
    create_topics(settings, topics, 2, [f"out{run}"])
    output = f"out{run}"
    producer = settings.producer()
    base = 1_800_000_000_000
    composites = [{"query": "q", "seq": 15, "key": "A"}, {"query": "q", "seq": 42, "key": "B"}]
    keyed = [(1, 10, 19, base + 40), (0, 40, 49, base + 1040), (1, 50, 59, base + 2000)]
    for partition, first, last, at in keyed:
        frame = frames.Frame(frames.EVENTS, {"first": first, "last": last, "route": ""})
        producer.produce(topics.keyed, b"", partition=partition,
                         headers=frame.kafka_headers(), timestamp=at)
    mine = topics.matches_of(topics.shard_of(output))
    for partition, composite, at in [(1, composites[0], base + 100), (0, composites[1],
                                                                      base + 1300)]:
        frame = frames.Frame(frames.MATCHES, {"part": partition, "upto": composite["seq"]})
        producer.produce(mine, orjson.dumps([composite]), partition=partition,
                         headers=frame.kafka_headers(), timestamp=at)
    produce(producer, topics.status, b"{}")
    assert producer.flush(30) == 0
    released = [(orjson.dumps(composites[0]), base + 130, base + 10),
                (orjson.dumps(composites[1]), base + 1330, base + 1000),
                (orjson.dumps({"query": "q", "seq": 99}), base + 5000, base)]  # not carried
    found = hops(settings, topics, 2, output, released)
    # splitter 30 and 40 ms, worker 60 and 260 ms, coordinator 30 ms twice
    assert found == {"splitter": [35.0, 39.9], "worker": [160.0, 258.0],
                     "coordinator": [30.0, 30.0]}
