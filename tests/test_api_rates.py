"""The composites/s of a query (`state.composites_per_s`, the console's column) comes from
the high-watermarks of its INTO topic, learnt by one consumer kept at their end
(`Api.output_rates`). That consumer fetched records it never read: once 100,000 were
queued (librdkafka's queued.min.messages) it fetched no more, the high-watermarks stopped
moving and the rate read 0 while composite events kept arriving (issue 29). Here, on the
session's broker: more than that many records arrive between two looks, then a few more
at each look, and every look must come to the topic's true count."""

from __future__ import annotations

import uuid

from cep_service.api.app import Api, ApiConfig
from cep_service.stream.kafka import KafkaSettings, ensure_topics, flush_all

BURST = 120_000  # beyond librdkafka's default queued.min.messages (100,000)
LOOKS = 20  # each waits for a fetch (up to 0.3 s): a true count comes at the first or second


def look_until(api: Api, topic: str, count: int) -> list[tuple]:
    """The looks until one sees `count` records (all of them when none does)."""
    seen = []
    for _ in range(LOOKS):
        seen.append(api.output_rates([topic])[topic])
        if seen[-1][0] == count:
            break
    return seen


def produce(producer, topic: str, n: int) -> None:
    for _ in range(n):
        producer.produce(topic, b"{}")
        if len(producer) > 50_000:
            producer.poll(0.1)
    flush_all(producer, 60)


def test_composites_per_s_follows_the_topic_past_a_large_backlog(kafka_bootstrap):
    settings = KafkaSettings(kafka_bootstrap)
    topic = f"rates_{uuid.uuid4().hex[:8]}"
    ensure_topics(settings, {topic: 1})
    api = Api(ApiConfig(settings))
    try:
        assert look_until(api, topic, 0)[-1] == (0, None)  # placed at the end
        producer = settings.producer()
        produce(producer, topic, BURST)
        total = BURST
        assert look_until(api, topic, total)[-1][0] == total
        for _ in range(3):  # a few more each time: seen, at a rate above 0
            produce(producer, topic, 500)
            total += 500
            seen = look_until(api, topic, total)
            assert seen[-1][0] == total, seen
            assert all(rate is None or rate >= 0 for _, rate in seen)
            assert any(rate and rate > 0 for _, rate in seen), seen
    finally:
        api.close()
