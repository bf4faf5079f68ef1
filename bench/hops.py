"""Where a composite event's latency goes, hop by hop, from the Kafka timestamps (the
producer's create time) of the records that carried it: its last event's produce time ->
the keyed frame holding that event (splitter) -> the match frame holding the composite
(worker) -> the INTO record (coordinator). Each hop includes the producer's linger and the
next consumer's fetch of the hop before it; the coordinator's hop also its wait for every
keyed partition to pass the composite's seq. Used by `cep bench e2e` (`hops_ms`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cep_service.stream import frames
from cep_service.stream.checkpoint import read_partitions
from cep_service.stream.kafka import KafkaSettings, Topics


def _keyed_frames(settings: KafkaSettings, topic: str,
                  partitions: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, last, create time ms) of every events frame, sorted by first seq."""
    rows = []

    def visit(message: Any) -> None:
        frame = frames.frame_of(message)
        if frame is not None and frame.kind is frames.EVENTS and frame.get("first") is not None:
            rows.append((frame.get("first"), frame.get("last"), message.timestamp()[1]))

    read_partitions(settings, [TopicPartition(topic, p, OFFSET_BEGINNING)
                               for p in range(partitions)], visit, timeout_s=60)
    rows.sort()
    return (np.array([r[0] for r in rows]), np.array([r[1] for r in rows]),
            np.array([r[2] for r in rows], dtype=float))


def _match_times(settings: KafkaSettings, topic: str, partitions: int) -> dict[bytes, float]:
    """Create time (ms) of the match frame that carried each composite (as JSON bytes)."""
    out: dict[bytes, float] = {}

    def visit(message: Any) -> None:
        frame = frames.frame_of(message)
        if frame is not None and frame.payload and frame.kind in (frames.MATCHES, frames.END):
            for composite in orjson.loads(frame.payload):
                out.setdefault(orjson.dumps(composite), message.timestamp()[1])

    read_partitions(settings, [TopicPartition(topic, p, OFFSET_BEGINNING)
                               for p in range(partitions)], visit, timeout_s=60)
    return out


def hops(settings: KafkaSettings, topics: Topics, partitions: int, output: str,
         released: list[tuple[bytes, float, float]]) -> dict[str, list[float] | None]:
    """p50 and p99 (ms) of each hop for `released`: (INTO record value, its create time ms,
    the produce time ms of the composite's last event)."""
    firsts, lasts, keyed_at = _keyed_frames(settings, topics.keyed, partitions)
    matched_at = _match_times(settings, topics.matches_of(topics.shard_of(output)),
                              partitions)
    split, work, merge = [], [], []
    for value, out_at, sent_at in released:
        seq = orjson.loads(value)["seq"]
        i = int(np.searchsorted(firsts, seq, side="right")) - 1
        match = matched_at.get(value)
        if i < 0 or lasts[i] < seq or match is None:
            continue
        split.append(keyed_at[i] - sent_at)
        work.append(match - keyed_at[i])
        merge.append(out_at - match)

    def pct(values: list[float]) -> list[float] | None:
        return [round(float(np.percentile(values, q)), 1) for q in (50, 99)] if values \
            else None

    return {"splitter": pct(split), "worker": pct(work), "coordinator": pct(merge)}
