"""Run-time queries: the control topic and the live query set.

The control topic is compacted, key = query name, value = JSON `{"op": "add" | "update" |
"remove", "name": ..., "text": ...}`, validated against schemas/control_message.json
(`parse_control`). The text is parsed and checked (never evaluated) and
must hold exactly one query of that name. The splitter applies control messages in order;
a change holds from the next sequence number on, and reaches every worker partition and the
coordinator as a control frame at that seq.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from cep_core.checker import CheckedQuery, load_query_text
from cep_core.errors import QueryError, QueryErrors
from cep_core.schema import SchemaRegistry

OPS = ("add", "update", "remove")
INFINITE = None  # a horizon: composite events may come at any later time (end of input)


class ControlError(ValueError):
    pass


@dataclass(frozen=True)
class ControlMessage:
    op: str
    name: str
    text: str = ""

    def to_json(self) -> bytes:
        return orjson.dumps({"op": self.op, "name": self.name, "text": self.text})


def parse_control(value: bytes | None, key: bytes | None = None,
                  registry: SchemaRegistry | None = None,
                  stream: str | None = None) -> ControlMessage:
    """A control message from a record of the control topic, validated against
    schemas/control_message.json (cep_core.control_message.validate: op, a name equal to
    the key, size limits; add/update: the text checks into exactly one query of that name
    on `stream`). A null value with a key is a tombstone: remove. ControlError says why a
    record is refused."""
    from cep_core.control_message import ControlMessageError, validate

    try:
        message = validate(value, key, registry, stream)
    except ControlMessageError as e:
        raise ControlError(str(e)) from None
    return ControlMessage(message.op, message.name, message.text)


def check_query_text(name: str, text: str, registry: SchemaRegistry | None = None,
                     stream: str | None = None) -> CheckedQuery:
    """The one checked query the text holds; ControlError otherwise."""
    try:
        queries = load_query_text(text, registry or SchemaRegistry(), f"<query {name}>")
    except QueryErrors as e:
        raise ControlError("\n".join(str(err) for err in e.errors)) from None
    except QueryError as e:
        raise ControlError(str(e)) from None
    if len(queries) != 1:
        raise ControlError(f"the text of query {name!r} holds {len(queries)} queries, not one")
    if queries[0].name != name:
        raise ControlError(f"the text defines query {queries[0].name!r}, not {name!r}")
    if stream is not None and queries[0].schema.stream != stream:
        raise ControlError(f"query {name!r} reads stream {queries[0].schema.stream!r}, this "
                           f"pipeline reads {stream!r}")
    return queries[0]


def route_of(checked: CheckedQuery) -> str:
    """The keyed-topic route of a query: its PARTITION BY attributes, comma-separated."""
    return ",".join(a.name for a in checked.query.partition_by)


def horizon(checked: CheckedQuery) -> int | None:
    """How far (in stream time units) a composite event's last event may lie behind the
    event time at which it is emitted; INFINITE when unbounded (released at end of input).

    MATCH reports on the last event (0). SEQ waits at most its window (trailing negations,
    timeouts). Time windows release once time passes their end, so the last member lies
    within RANGE; count windows and windows over another attribute are unbounded here."""
    from cep_core import ast

    body = checked.query.body
    if isinstance(body, ast.MatchQuery):
        return 0
    if isinstance(body, ast.SeqQuery):
        if body.within is None or body.tesla:
            return INFINITE
        return checked.time_units(body.within)
    window = body.window
    if isinstance(window, ast.TimeWindow) and window.attr in (None, checked.schema.time):
        return checked.time_units(window.range)
    return INFINITE


@dataclass
class LiveQuery:
    name: str
    text: str
    index: int
    checked: CheckedQuery

    @property
    def route(self) -> str:
        return route_of(self.checked)

    @property
    def output(self) -> str:
        return self.checked.query.output

    def to_json(self) -> dict:
        return {"name": self.name, "text": self.text, "index": self.index}


class QuerySet:
    """The live queries of one stream, in order of first addition (their `index`)."""

    def __init__(self, stream: str, registry: SchemaRegistry | None = None):
        self.stream = stream
        self.registry = registry or SchemaRegistry()
        self.live: dict[str, LiveQuery] = {}
        self.next_index = 0

    def apply(self, message: ControlMessage) -> LiveQuery | None:
        """Apply a change; the new LiveQuery (None for remove). ControlError when invalid."""
        if message.op == "remove":
            if message.name not in self.live:
                raise ControlError(f"no live query {message.name!r} to remove")
            del self.live[message.name]
            return None
        checked = check_query_text(message.name, message.text, self.registry, self.stream)
        old = self.live.get(message.name)
        if message.op == "add" and old is not None:
            raise ControlError(f"query {message.name!r} is live already (use update)")
        if message.op == "update" and old is None:
            raise ControlError(f"no live query {message.name!r} to update")
        index = old.index if old is not None else self._take_index()
        entry = self.live[message.name] = LiveQuery(message.name, message.text, index, checked)
        return entry

    def load(self, entries: list[dict]) -> None:
        """Replace the set by a serialized one (a `set` control frame or a snapshot)."""
        self.live = {}
        for entry in entries:
            checked = check_query_text(entry["name"], entry["text"], self.registry, self.stream)
            self.live[entry["name"]] = LiveQuery(entry["name"], entry["text"], entry["index"],
                                                 checked)
        self.next_index = max([e["index"] + 1 for e in entries] + [self.next_index])

    def to_json(self) -> list[dict]:
        return [q.to_json() for q in self.live.values()]

    def _take_index(self) -> int:
        self.next_index += 1
        return self.next_index - 1

    def routes(self) -> set[str]:
        return {q.route for q in self.live.values()}


def publish(settings, topic: str, message: ControlMessage, timeout_s: float = 10) -> None:
    """Write a control message (key = query name) and wait for the broker's ack;
    services.kafka.DeliveryFailed when it did not come."""
    from services.kafka import Deliveries, flush_all

    deliveries = Deliveries()
    producer = settings.producer(**{"message.timeout.ms": int(timeout_s * 1000)})
    producer.produce(topic, message.to_json(), key=message.name.encode(),
                     on_delivery=deliveries)
    flush_all(producer, timeout_s + 5, deliveries, f"control message {message.name!r}")


def split_query_file(text: str, path: str = "<queries>") -> list[tuple[str, str]]:
    """(name, text) of each query of a query file, in file order (the text runs from the
    query's first line to the line before the next query)."""
    from cep_core.parser import parse

    queries = parse(text, path).queries
    lines = text.splitlines(keepends=True)
    starts = [q.pos.line - 1 for q in queries] + [len(lines)]
    out = []
    for q, a, b in zip(queries, starts, starts[1:]):
        first = lines[a][q.pos.column - 1:]
        out.append((q.name, (first + "".join(lines[a + 1:b])).strip()))
    return out
