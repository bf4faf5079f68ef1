"""Live changes over Kafka: the control topic (publish, read) and the status topic (what
each service did with each change, which services are up, what is live in each).

What a change is, how it is checked and when it is refused: cep_core/control_message.py.
The splitter applies control records in topic order, a change holds from the next
sequence number on, and reaches every worker partition and the coordinator as a control
frame at that seq.

Status records (JSON, on `cep.<stream>.status`), besides `query_live` and `end_of_input`
(`{"event": "end_of_input", "upto"}`, with `shard` and `shards` when the coordinator is
sharded: one per shard, see `input_ended`):

    {"event": "change", "service", "role", "key", "offset", "kind", "op", "name",
     "outcome": "applied" | "refused", "reason", "at", "partition", "live", "starting"}
    {"event": "service", "service", "role", "state": "up" | "down", "live", "partitions"}

`key`/`offset` name the control record; `live` is the service's live set after it
(`{"queries": {name: index}, "streams": {name: version}}`); workers report per keyed
`partition`, and `partitions` (presence) maps each assigned partition to its live set;
`starting`: the splitter applied the change while starting (it reaches the workers and the
coordinator in its start-up `set` frame).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cep_core.control_message import (  # noqa: F401  (the names services and tests use)
    INFINITE,
    ControlMessage,
    ControlRecord,
    LiveQuery,
    LiveSet,
    horizon,
    replayed,
    route_of,
)
from cep_core.control_message import ControlMessageError as ControlError  # noqa: F401
from cep_core.control_message import LiveSet as QuerySet  # noqa: F401
from cep_core.control_message import check_query as check_query_text  # noqa: F401
from cep_core.control_message import validate as parse_control  # noqa: F401
from cep_core.control_ops import Outcome
from cep_core.parser import parse
from cep_core.schema import SchemaRegistry
from cep_service.stream.kafka import Deliveries, KafkaSettings, flush_all, read_all
from cep_service.stream.status import Presence, Role, StatusEvent
from cep_service.stream.status import StatusWriter, change_of  # noqa: F401  (their home was here)

def publish(settings: KafkaSettings, topic: str, message: ControlMessage, key: bytes | None = None,
            timeout_s: float = 10) -> int:
    """Write a control message (key `query/<name>` or `stream/<name>` unless `key` is
    given) and wait for the broker's ack; the record's offset.
    cep_service.stream.kafka.DeliveryFailed when the ack did not come."""
    offsets: list[int] = []
    deliveries = Deliveries(also=lambda err, m: offsets.append(m.offset()))
    producer = settings.producer(**{"message.timeout.ms": int(timeout_s * 1000)})
    producer.produce(topic, message.to_json(), key=key or message.key, on_delivery=deliveries)
    flush_all(producer, timeout_s + 5, deliveries, f"control message {message.name!r}")
    return offsets[0]


def control_records(settings: KafkaSettings, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of every record of the control topic, in order."""
    return [(m.key(), m.value()) for m in read_all(settings, topic)]


def control_log(settings: KafkaSettings, topic: str) -> list[ControlRecord]:
    """Every record of the control topic, in order, with offsets and headers (the
    offsets make stream versions that compaction keeps)."""
    return [ControlRecord.of(m) for m in read_all(settings, topic)]


def learned_live(settings: KafkaSettings, topic: str, stream: str | None = None,
                 registry: SchemaRegistry | None = None) -> LiveSet:
    """The live set (queries of `stream`, every stream) the control topic gives: how a
    service learns streams registered at run time before any frame tells it."""
    return replayed(control_log(settings, topic), stream, registry)


def split_query_file(text: str, path: str = "<queries>") -> list[tuple[str, str]]:
    """(name, text) of each query of a query file, in file order (the text runs from the
    query's first line to the line before the next query)."""
    queries = parse(text, path).queries
    lines = text.splitlines(keepends=True)
    starts = [q.pos.line - 1 for q in queries] + [len(lines)]
    out = []
    for q, a, b in zip(queries, starts, starts[1:]):
        first = lines[a][q.pos.column - 1:]
        out.append((q.name, (first + "".join(lines[a + 1:b])).strip()))
    return out


# ---------------------------------------------------------------- status records


class StatusReader:
    """Follows a status topic from its beginning (one partition)."""

    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        self.consumer = settings.consumer()
        metadata = self.consumer.list_topics(topic, timeout=10).topics.get(topic)
        self.exists = metadata is not None and metadata.error is None
        self.consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self.tp = TopicPartition(topic, 0)
        self.records: list[dict] = []

    def poll(self, timeout_s: float = 0.1) -> list[dict]:
        got = []
        for message in self.consumer.consume(1000, timeout_s):
            value = message.value()
            if message.error() is None and value:
                try:
                    got.append(orjson.loads(value))
                except orjson.JSONDecodeError:
                    continue
        self.records.extend(got)
        return got

    def caught_up(self) -> bool:
        _, high = self.consumer.get_watermark_offsets(self.tp, cached=True)
        position = self.consumer.position([self.tp])[0].offset
        return high == 0 or (high > 0 and position >= high)

    def read_existing(self, timeout_s: float = 10) -> list[dict]:
        """Every record there now (up to the fetch high-watermark)."""
        deadline = time.monotonic() + timeout_s
        while self.exists:
            got = self.poll(0.1)
            if (not got and self.caught_up()) or time.monotonic() > deadline:
                break
        return self.records

    def close(self) -> None:
        self.consumer.close()


def services_up(records: list[dict]) -> dict[str, dict]:
    """What is live per service that is up (its last presence record says `up`): role,
    live set (splitter, coordinator) or live set per keyed partition (workers)."""
    view: dict[str, dict] = {}
    for record in records:
        service = record.get("service")
        if service is None:
            continue
        entry = view.setdefault(service, {"service": service, "role": record.get("role"),
                                          "state": Presence.UP, "live": None, "partitions": {}})
        if record["event"] == StatusEvent.SERVICE:
            entry["state"] = record["state"]
            if "live" in record:
                entry["live"] = record["live"]
            if "partitions" in record:
                entry["partitions"] = {int(p): live for p, live in record["partitions"].items()}
                _drop_partitions(view, service, entry["partitions"])
        elif record["event"] == StatusEvent.QUERY_FAILED:
            entry.setdefault("failed", {})[record["name"]] = {
                k: record.get(k) for k in ("stage", "reason", "seq", "partition")}
        elif record["event"] == StatusEvent.CHANGE and record.get("outcome") == Outcome.APPLIED:
            entry.get("failed", {}).pop(record.get("name"), None)  # a new text or removed
            if record.get("partition") is not None:
                entry["partitions"][int(record["partition"])] = record.get("live")
                _drop_partitions(view, service, {record["partition"]})
            elif record.get("live") is not None:
                entry["live"] = record["live"]
    return {s: e for s, e in view.items() if e["state"] == Presence.UP}


def _drop_partitions(view: dict, owner: str, partitions: Iterable[Any]) -> None:
    for service, entry in view.items():
        if service != owner:
            for p in partitions:
                entry["partitions"].pop(int(p), None)


def input_ended(records: list[dict], shards: int = 1, upto: int | None = None) -> bool:
    """Whether every coordinator shard released an end of input (at seq `upto`, if
    given): each shard announces its own, after its composite events (docs/scaling.md)."""
    done = {r.get("shard", 0) for r in records if r.get("event") == StatusEvent.END_OF_INPUT
            and (upto is None or r.get("upto") == upto)}
    return len(done) >= shards


def outcomes_of(records: list[dict], change: dict) -> dict:
    """The status records about one change (its key and offset), by role."""
    mine = [r for r in records if r.get("event") == StatusEvent.CHANGE and
            r.get("key") == change["key"] and r.get("offset") == change["offset"]]
    return {"splitter": next((r for r in mine if r["role"] == Role.SPLITTER), None),
            "workers": [r for r in mine if r["role"] == Role.WORKER],
            "coordinator": next((r for r in mine if r["role"] == Role.COORDINATOR), None)}


def settled(found: dict) -> Outcome | None:
    """REFUSED, APPLIED (the splitter applied it and the coordinator saw it in every
    keyed partition) or None (not yet)."""
    splitter, coordinator = found["splitter"], found["coordinator"]
    if splitter is not None and splitter["outcome"] == Outcome.REFUSED:
        return Outcome.REFUSED
    if splitter is not None and coordinator is not None:
        return Outcome.APPLIED
    return None
