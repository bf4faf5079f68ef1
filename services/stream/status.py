"""Status records a service writes (the records are described in
services/stream/control.py), without a Kafka client: the cores write them to an Outbox,
their shells to a producer.
"""

from __future__ import annotations

import itertools
import os
import socket
from enum import StrEnum
from typing import Any

import orjson

from cep_core.control_message import ControlMessage
from cep_core.control_ops import Outcome
from cep_service.stream.topics import produce

_instances = itertools.count()


class StatusEvent(StrEnum):
    """What a status record says (its `event`)."""

    SERVICE = "service"  # a service's presence: up or down, what it holds
    CHANGE = "change"  # what became of a change here (its `outcome`)
    QUERY_FAILED = "query_failed"  # a query whose engine failed here
    QUERY_LIVE = "query_live"  # the coordinator: a query live in every partition
    END_OF_INPUT = "end_of_input"  # the coordinator: the input ended, released up to `upto`


# Deliberately like the enums of cep_core/ast.py in shape only: member declarations
class Presence(StrEnum):
    """A service's presence record's `state`."""

    UP = "up"
    DOWN = "down"


class QueryState(StrEnum):
    """A query's `state` in the live view the services' records add up to."""

    LIVE = "live"
    FAILED = "failed"


class Role(StrEnum):
    """Who wrote a status record (its `role`)."""

    SPLITTER = "splitter"
    WORKER = "worker"
    COORDINATOR = "coordinator"
    CHAINED = "chained"
    API = "api"
    BROKER = "broker"  # writes no record: the pipeline view's (services/api/pipeline.py) node


def change_of(key: bytes | None, offset: int | None, message: ControlMessage | None = None) -> dict:
    """What names a change in status records and control frames."""
    out = {"key": (key or b"").decode("utf-8", "replace"), "offset": offset}
    if message is not None:
        out.update(kind=message.kind, op=message.op, name=message.name)
    return out


class StatusWriter:
    """Writes one service's records to the status topic."""

    def __init__(self, topic: str, role: str):
        self.topic, self.role = topic, role
        n = next(_instances)
        self.service = f"{role}@{socket.gethostname()}:{os.getpid()}" + (f"#{n}" if n else "")

    def presence(self, producer: Any, state: Presence, **fields: Any) -> None:
        self._write(producer, {"event": StatusEvent.SERVICE, "state": state, **fields})

    def outcome(self, producer: Any, change: dict, outcome: Outcome, **fields: Any) -> None:
        self._write(producer, {"event": StatusEvent.CHANGE, **change, "outcome": outcome, **fields})

    def failure(self, producer: Any, failure: dict, **fields: Any) -> None:
        """A query whose engine failed here (`QueryFailure.to_json()`): stopped alone."""
        self._write(producer, {"event": StatusEvent.QUERY_FAILED, **failure, **fields})

    def _write(self, producer: Any, record: dict) -> None:
        produce(producer, self.topic, orjson.dumps(
            {**record, "service": self.service, "role": self.role}))
        producer.poll(0)
