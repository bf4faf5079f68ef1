"""Reading checkpoints back: the newest record per key of a state topic, and what a
coordinator wrote to an output topic after its last checkpoint.

Both reads are bounded by the fetch high-watermark (ListOffsets "latest" is wrong on tansu,
docs/broker.md) and keep only what they need in memory: tansu does not compact, so a
state topic holds every snapshot ever written.
"""

from __future__ import annotations

import time

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from services.stream.kafka import KafkaSettings

PIPELINE_HEADER = "cep.pipeline"  # on output records: the coordinator group that wrote them


def read_partitions(settings: KafkaSettings, partitions: list[TopicPartition], visit,
          timeout_s: float = 30.0, idle_s: float = 2.0) -> None:
    """Call `visit(message)` for every message from the given offsets up to the fetch
    high-watermark of each partition."""
    consumer = settings.consumer()
    try:
        consumer.assign(partitions)
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            messages = consumer.consume(10000, 0.05)
            for message in messages:
                if not message.error():
                    visit(message)
            if messages:
                quiet_since = time.monotonic()
            if _caught_up(consumer, partitions) or time.monotonic() - quiet_since > idle_s:
                return
        raise TimeoutError(f"reading {partitions[0].topic} took over {timeout_s} s")
    finally:
        consumer.close()


def _caught_up(consumer, partitions: list[TopicPartition]) -> bool:
    for start, at in zip(partitions, consumer.position(partitions)):
        _, high = consumer.get_watermark_offsets(at, cached=True)
        if high < 0:
            return False  # no fetch answered yet
        offset = at.offset if at.offset >= 0 else start.offset  # nothing read yet: the start
        if high > 0 and (offset < 0 or offset < high):
            return False
    return True


def read_latest(settings: KafkaSettings, topic: str) -> dict[bytes, bytes]:
    """The newest value of each key of a (compacted) topic; {} when the topic is absent."""
    probe = settings.consumer()
    try:
        metadata = probe.list_topics(topic, timeout=10).topics.get(topic)
    finally:
        probe.close()
    if metadata is None or metadata.error is not None:
        return {}
    latest: dict[bytes, bytes] = {}

    def keep(message) -> None:
        if message.key() is not None:
            latest[message.key()] = message.value()

    read_partitions(settings, [TopicPartition(topic, p, OFFSET_BEGINNING)
                               for p in metadata.partitions], keep)
    return latest


def written_since(settings: KafkaSettings, topic: str, after: int, pipeline: str) -> list:
    """The records of partition 0 of `topic` after offset `after` (-1: all) that carry
    `pipeline` in their PIPELINE_HEADER, in offset order."""
    out = []
    tag = pipeline.encode()

    def keep(message) -> None:
        if (PIPELINE_HEADER, tag) in (message.headers() or ()):
            out.append(message)

    start = after + 1 if after >= 0 else OFFSET_BEGINNING
    read_partitions(settings, [TopicPartition(topic, 0, start)], keep)
    return out
