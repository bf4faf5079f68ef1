"""`cep demo --verify` reads every INTO record of its run before judging.

A collector that stops soon after the coordinator's end-of-input record (while tens of
thousands of composites are still unread), or reads partition 0 of an INTO topic only,
fails here: 80,000 composites spread by key over 4 partitions, all written before the
end-of-input record, are on the topic when collection starts (more than a handful of
`consume(10000, ...)` calls can return). Records of another pipeline on the same topic
are skipped. `compare_outputs` checks sort-key order within each partition and the merge
of all partitions against the reference."""

from __future__ import annotations

import uuid

import orjson
import pytest

from cep_service.stream.checkpoint import PIPELINE_HEADER
from cep_service.stream.demo import _collect_until_end, _consumer, compare_outputs
from cep_service.stream.kafka import KafkaSettings, ensure_topics, produce

N = 80_000


def _composite(seq: int) -> dict:
    return {"query": "q", "key": f"S{seq % 997}", "seq": seq, "start_seq": seq - 3, "n": 1}


def test_collects_every_partition_up_to_the_end(kafka_bootstrap):
    settings = KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)
    run = uuid.uuid4().hex[:8]
    into, status = f"into-{run}", f"status-{run}"
    ensure_topics(settings, {into: 4, status: 1})
    producer = settings.producer()
    mine, other = b"pipe-" + run.encode(), b"another-pipeline"
    produce(producer, into, orjson.dumps(_composite(0)), key=b'"S0"',
            headers=[(PIPELINE_HEADER, other)])
    want = [_composite(seq) for seq in range(1, N + 1)]
    for c in want:  # in sort-key order, placed by key as the coordinator does
        produce(producer, into, orjson.dumps(c), key=orjson.dumps(c["key"]),
                headers=[(PIPELINE_HEADER, mine)])
    producer.flush(60)
    produce(producer, status, orjson.dumps({"event": "end_of_input", "upto": N}))
    producer.flush(30)

    consumer = _consumer(settings, [into])
    received: list = []
    try:
        assert _collect_until_end(settings, consumer, received, None, mine.decode(), status,
                                  N, 60)
    finally:
        consumer.close()
    assert len({p for _, p, _ in received}) == 4
    assert len(received) == N
    assert compare_outputs({into: want}, received, {"q": 0}) == []


def test_collect_until_end_gives_up_without_the_end_record(kafka_bootstrap):
    settings = KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)
    run = uuid.uuid4().hex[:8]
    ensure_topics(settings, {f"into-{run}": 2, f"status-{run}": 1})
    consumer = _consumer(settings, [f"into-{run}"])
    try:
        assert not _collect_until_end(settings, consumer, [], None, None, f"status-{run}",
                                      10, 0.5)
    finally:
        consumer.close()


@pytest.mark.parametrize("case", ["interleaved", "swapped", "missing", "repeated"])
def test_compare_outputs_per_partition_order(case):
    want = [_composite(seq) for seq in range(10)]
    received = [("t", seq % 3, c) for seq, c in enumerate(want)]
    received.sort(key=lambda r: -r[1])  # partition 2, 1, 0: no order across partitions
    if case == "swapped":  # two records of one partition out of order
        i, j = [k for k, (_, p, _) in enumerate(received) if p == 0][:2]
        received[i], received[j] = received[j], received[i]
    elif case == "missing":
        received.pop()
    elif case == "repeated":
        received.append(received[0])
    problems = compare_outputs({"t": want}, received, {"q": 0})
    if case == "interleaved":
        assert problems == []
    else:
        assert problems and all(p.startswith("t: ") for p in problems)
