"""The one owner of live changes: control-topic messages for queries and streams, their
JSON Schema (`schemas/control_message.json`, draft 2020-12, checked with `jsonschema`), the
checked form every service uses, and the live set of a pipeline with its refusal rules.

Key of a record: `query/<name>` or `stream/<name>`; a bare `<name>` (the first key form)
is a query. Value: `{"op": "add" | "update" | "remove", "name", "text"}`, where a query's
text is the query language and a stream's text is its schema as JSON. A null value is a
tombstone: remove. Nothing in a message is ever evaluated: query text only reaches the
grammar, and engines compile from the checked AST.

    validate(value, key, registry, stream) -> ControlMessage, checked once (`.checked`)
    LiveSet.apply(message)                  -> the change applied, or ControlMessageError
    replayed(records)                       -> the live set the topic gives (on a start)

The topic is compacted: only the last record of each key stays. A start therefore takes
the last record of each key (`compacted`: the same on the whole log and on the compacted
one), streams before queries, `add`/`update` as upserts and removals of what is not live
as no-ops; a stream's version is the offset (+1) of the record that made it. A splitter
that refuses a change writes the live record again under its key (a tombstone when none
is live), with the headers `cep.refused` (the refused offset) and `cep.version`, so that
the last record of each key is what is live.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache, cache
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson
from jsonschema import Draft202012Validator, ValidationError

from cep_core import ast
from cep_core.checked import CheckedQuery
from cep_core.checker import load_query_text
from cep_core.control_ops import Kind, Op
from cep_core.errors import Category, Problem, QueryError, QueryErrors, Refusal
from cep_core.schema import SCHEMA_DIR, SchemaError, SchemaRegistry, StreamSchema

if TYPE_CHECKING:
    from confluent_kafka import Message

MAX_MESSAGE_BYTES = 256 * 1024
SCHEMA_PATH = SCHEMA_DIR / "control_message.json"
QUERY, STREAM = Kind.QUERY, Kind.STREAM
KINDS = tuple(Kind)
INFINITE = None  # a horizon: composite events may come at any later time (end of input)
REFUSED_HEADER = "cep.refused"  # on a record a splitter wrote again: the offset it refused
VERSION_HEADER = "cep.version"  # on such a stream record: the version it holds


class ControlMessageError(Refusal):
    """A control message that is not applied, and why: its `category` and `problems`
    (cep_core/errors.py)."""


class OtherStream(ControlMessageError):
    """A query on another stream than the pipeline's: not this pipeline's to apply."""


@dataclass(frozen=True)
class ControlMessage:
    op: Op  # (given as text, made an Op)
    name: str
    text: str = ""
    checked: CheckedQuery | StreamSchema | None = None  # of an add or update, once checked
    kind: Kind = QUERY

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", Op(self.op))
        object.__setattr__(self, "kind", Kind(self.kind))

    @property
    def key(self) -> bytes:
        return key_of(self.kind, self.name)

    def to_json(self) -> bytes:
        return orjson.dumps({"op": self.op, "name": self.name, "text": self.text})


class ControlRecord(NamedTuple):
    """One record of the control topic; `offset` None where unknown (versions are then
    counted per applied change, as a client's view without offsets does)."""

    key: bytes | None
    value: bytes | None
    offset: int | None = None
    headers: dict[str, str | bytes | None] | None = None  # header name -> bytes

    @classmethod
    def of(cls, message: Message) -> ControlRecord:
        """A consumed confluent_kafka Message."""
        return cls(message.key(), message.value(), message.offset(),
                   dict(message.headers() or ()))

    def header(self, name: str) -> int | None:
        """A numeric header (None where absent or not a number)."""
        value = (self.headers or {}).get(name)
        try:
            return None if value is None else int(value)
        except ValueError:
            return None

    @property
    def republished(self) -> bool:
        """Written again by a splitter after a refusal (the live record under its key)."""
        return self.header(REFUSED_HEADER) is not None

    @property
    def version(self) -> int | None:
        """The stream version this record makes: the offset + 1 of the record that made
        it (a record written again names it), which compaction keeps."""
        held = self.header(VERSION_HEADER)
        if held is not None:
            return held
        return None if self.offset is None else self.offset + 1


def compacted(records: Iterable[ControlRecord | tuple[Any, ...]]) -> list[ControlRecord]:
    """What compaction leaves of `records` ((key, value[, offset, headers]) in topic
    order): the last record of each key, in topic order, stream records first (a stream
    record written again may now follow the queries that read it)."""
    rows = [r if isinstance(r, ControlRecord) else ControlRecord(*r) for r in records]
    last = {r.key: i for i, r in enumerate(rows)}
    since: dict[bytes | None, int] = {}  # where the key's current incarnation began
    for i, r in enumerate(rows):
        since.setdefault(r.key, i)
        if _is_removal(r.value):
            since.pop(r.key)
    kept = [i for i, r in enumerate(rows) if r.key is None or last[r.key] == i]
    # A query keeps the place its first record since its last removal gave it (an `add`
    # then an `update` on the whole log: the add's place, as when it ran); streams first.
    return [rows[i] for i in sorted(kept, key=lambda i: (
        not _is_stream_key(rows[i].key), since.get(rows[i].key, i)))]


def _is_removal(value: bytes | None) -> bool:
    if value is None:
        return True
    try:
        op: object = orjson.loads(value).get("op")
        return op == Op.REMOVE
    except (orjson.JSONDecodeError, AttributeError):
        return False


def _is_stream_key(key: bytes | None) -> bool:
    try:
        return parse_key(key)[0] is STREAM
    except ControlMessageError:
        return False


def key_of(kind: str, name: str) -> bytes:
    return f"{kind}/{name}".encode()


def parse_key(key: bytes | None) -> tuple[Kind, str]:
    """(kind, name) of a record key; a key without `/` is a query's (the old form)."""
    if not key:
        raise ControlMessageError("control message without a key")
    text = key.decode("utf-8", "replace")
    first, slash, name = text.partition("/")
    kind = QUERY
    if slash and first in KINDS:
        kind = Kind(first)
    else:
        name = text
    problems = violations(_validator("name"), name, "key")
    if problems:
        raise ControlMessageError("control key: " + "; ".join(problems))
    return kind, name


@lru_cache(maxsize=1)
def control_schema() -> dict[str, Any]:
    schema: dict[str, Any] = orjson.loads(SCHEMA_PATH.read_bytes())
    return schema


@cache
def _validator(part: str = "") -> Draft202012Validator:
    """The validator of the whole message, or of one part: `name`, `stream_schema`."""
    schema = control_schema()
    if part == "name":
        schema = schema["properties"]["name"]
    elif part:
        schema = schema["$defs"][part]
    return Draft202012Validator(schema)


def validate(value: bytes | None, key: bytes | None = None,
             registry: SchemaRegistry | None = None, stream: str | None = None) -> ControlMessage:
    """A control-topic record as a ControlMessage whose query or stream (add, update) is
    checked: exactly one query, named as the message says, reading `stream` when given; or
    a valid stream schema of that name."""
    kind, key_name = parse_key(key) if key is not None else (QUERY, None)
    if value is None:
        if key_name is None:  # no key (parse_key names every key it returns)
            raise ControlMessageError("empty control message without a key")
        return ControlMessage(Op.REMOVE, key_name, kind=kind)
    if len(value) > MAX_MESSAGE_BYTES:
        raise ControlMessageError(f"control message of {len(value)} bytes is over the limit "
                                  f"of {MAX_MESSAGE_BYTES} bytes")
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise ControlMessageError(f"control message is not valid JSON: {e}") from None
    problems = violations(_validator(), data)
    if problems:
        raise ControlMessageError("control message: " + "; ".join(problems))
    if key is not None and key_name is not None and key_name != data["name"]:
        raise ControlMessageError(f"control message for {kind} {data['name']!r} has the key "
                                  f"{key.decode('utf-8', 'replace')!r}")
    op, name, text = Op(data["op"]), data["name"], data.get("text", "")
    if op is Op.REMOVE:
        return ControlMessage(op, name, text, kind=kind)
    checked = check_query(name, text, registry, stream) if kind is QUERY else \
        check_stream(name, text)
    return ControlMessage(op, name, text, checked, kind)


def check_query(name: str, text: str, registry: SchemaRegistry | None = None,
                stream: str | None = None) -> CheckedQuery:
    """The one checked query `text` holds, named `name`; ControlMessageError otherwise
    (with the checker's `<query NAME>:line:col` messages). A LiveRegistry checks each
    (name, text) once until its streams change."""
    registry = registry or SchemaRegistry()
    checked = registry.checked.get((name, text)) if isinstance(registry, LiveRegistry) \
        else None
    if checked is None:
        checked = _check_query(name, text, registry)
        if isinstance(registry, LiveRegistry):
            registry.checked[(name, text)] = checked
    if stream is not None and checked.schema.stream != stream:
        raise OtherStream(f"query {name!r} reads stream {checked.schema.stream!r}, this "
                          f"pipeline reads {stream!r}")
    return checked


def _check_query(name: str, text: str, registry: SchemaRegistry) -> CheckedQuery:
    try:
        queries = load_query_text(text, registry, f"<query {name}>")
    except (QueryErrors, QueryError) as e:
        raise ControlMessageError(str(e), problems=[err.problem(name) for err in e.errors]) \
            from None
    if len(queries) != 1:
        raise ControlMessageError(f"the text of query {name!r} holds {len(queries)} "
                                  "queries, not one")
    if queries[0].name != name:
        raise ControlMessageError(f"the text defines query {queries[0].name!r}, not "
                                  f"{name!r}")
    return queries[0]


def check_stream(name: str, text: str) -> StreamSchema:
    """The stream schema `text` holds (JSON, as schemas/*.json), named `name`."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise ControlMessageError(f"stream {name!r}: the schema is not valid JSON: {e}") \
            from None
    problems = violations(_validator("stream_schema"), data, "schema")
    if problems:
        raise ControlMessageError(f"stream {name!r}: " + "; ".join(problems))
    if data["stream"] != name:
        raise ControlMessageError(f"the schema describes stream {data['stream']!r}, not "
                                  f"{name!r}")
    try:
        return StreamSchema.from_dict(data)
    except SchemaError as e:
        raise ControlMessageError(str(e)) from None


def violations(validator: Draft202012Validator, value: object,
               where: str = "message") -> list[str]:
    """What about `value` breaks the validator's schema, one sentence per problem."""
    return [_sentence(error, where) for error in validator.iter_errors(value)]


def _sentence(error: ValidationError, where: str) -> str:
    path = list(error.absolute_path)
    if path:
        where = f"field {'.'.join(map(str, path))!r}"
    keyword, expected, value = error.validator, error.validator_value, error.instance
    if keyword == "type":
        kinds = " or ".join([expected] if isinstance(expected, str) else expected)
        return f"{where} must be a JSON {kinds}, got {_json_type(value)}"
    if keyword == "enum":
        return f"{where} must be one of {', '.join(map(str, expected))}, got {_shown(value)}"
    if keyword == "required":
        missing = [f for f in expected if f not in value]
        return "; ".join(f"{where} lacks the field {f!r}" for f in missing)
    if keyword == "additionalProperties":
        known = error.schema.get("properties", {})
        return "; ".join(f"{where} has an unknown field {_shown(f)}" for f in value
                         if f not in known)
    if keyword == "minLength":
        return f"{where} must not be empty" if expected == 1 else \
            f"{where} is shorter than {expected} characters"
    if keyword == "maxLength":
        return f"{where} is longer than {expected} characters ({len(value)})"
    if keyword == "pattern":
        return f"{where} {_shown(value)} does not match {expected}"
    return f"{where}: {error.message}"


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    names: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}
    return names[type(value)]


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------- routes and horizons


def route_of(checked: CheckedQuery) -> str:
    """The keyed-topic route of a query: its PARTITION BY attributes, comma-separated."""
    return ",".join(a.name for a in checked.query.partition_by)


def horizon(checked: CheckedQuery) -> int | None:
    """How far (in stream time units) a composite event's last event may lie behind the
    event time at which it is emitted; INFINITE when unbounded (released at end of input).

    MATCH reports on the last event (0). SEQ waits at most its window (trailing negations,
    timeouts); MATCH_RECOGNIZE its WITHIN (unbounded without; the merge releases it as
    MATCH, below what a partition holds back: services/stream/merge.py). Time windows release once
    time passes their end, so the last member lies
    within RANGE; count windows and windows over another attribute are unbounded here."""
    body = checked.query.body
    if isinstance(body, ast.MatchQuery):
        return 0
    if isinstance(body, ast.SeqQuery):
        if body.within is None or body.tesla:
            return INFINITE
        return checked.time_units(body.within)
    if isinstance(body, ast.RecognizeQuery):  # a match waits behind earlier partial ones
        return INFINITE if body.within is None else checked.time_units(body.within)
    window = body.window
    if isinstance(window, ast.TimeWindow) and window.attr in (None, checked.schema.time):
        return checked.time_units(window.range)
    return INFINITE


# ---------------------------------------------------------------- the live set


class LiveRegistry(SchemaRegistry):
    """The schemas a service knows: the control topic's streams over the built-in and file
    schemas of `base`; and the checked queries, each checked once until a stream changes."""

    def __init__(self, base: SchemaRegistry | None = None):
        super().__init__(directories=[])
        self.base = base or SchemaRegistry()
        self.streams: dict[str, tuple[StreamSchema, int, str]] = {}  # schema, version, text
        self.removed: set[str] = set()  # topic streams removed (files do not come back)
        self.checked: dict[tuple[str, str], CheckedQuery] = {}

    def get(self, stream: str) -> StreamSchema | None:
        if stream in self.streams:
            return self.streams[stream][0]
        return None if stream in self.removed else self.base.get(stream)

    def add(self, schema: StreamSchema, origin: str = "added") -> None:
        self.base.add(schema, origin)

    def names(self) -> list[str]:
        return sorted((set(self.base.names()) - self.removed) | set(self.streams))

    def with_stream(self, name: str, entry: tuple[StreamSchema, int, str] | None) -> LiveRegistry:
        """A copy with stream `name` set to `entry` (schema, version, text), or removed."""
        trial = LiveRegistry(self.base)
        trial.streams, trial.removed = dict(self.streams), set(self.removed)
        trial.streams.pop(name, None)
        trial.removed.discard(name)
        if entry is None:
            trial.removed.add(name)
        else:
            trial.streams[name] = entry
        return trial

    def learn(self, name: str, text: str, version: int) -> bool:
        """Take a stream change a splitter applied (`text` empty: removed); a version not
        newer than the one known is ignored. Whether anything changed."""
        current = self.streams.get(name)
        if current is not None and current[1] >= version:
            return False
        if current is None and not text and name in self.removed:
            return False
        entry = (check_stream(name, text), version, text) if text else None
        trial = self.with_stream(name, entry)
        self.streams, self.removed, self.checked = trial.streams, trial.removed, {}
        return True

    def versions(self) -> dict[str, int]:
        return {name: version for name, (_, version, _) in self.streams.items()}

    def to_json(self) -> list[dict[str, Any]]:
        return [{"name": n, "text": t, "version": v} for n, (_, v, t) in self.streams.items()]


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

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "text": self.text, "index": self.index}


@dataclass
class LiveStream:
    name: str
    text: str
    version: int
    schema: StreamSchema | None = None  # None once removed

    def to_json(self) -> dict[str, Any]:
        return {"kind": STREAM, "name": self.name, "text": self.text,
                "version": self.version}


class LiveSet:
    """The live queries of one stream's pipeline, in order of first addition (their
    `index`), and the streams of the control topic (LiveRegistry)."""

    def __init__(self, stream: str | None, registry: SchemaRegistry | None = None):
        self.stream = stream  # None: queries of any stream (a client's view)
        self.registry = registry if isinstance(registry, LiveRegistry) else \
            LiveRegistry(registry)
        self.live: dict[str, LiveQuery] = {}
        self.next_index = 0

    def apply(self, message: ControlMessage, version: int | None = None,
              starting: bool = False) -> LiveQuery | LiveStream | None:
        """Apply a change: the new LiveQuery (None when one is removed) or LiveStream
        (`version`: ControlRecord.version; None: one more than the last). ControlMessageError
        says why a change is refused. `starting` (a replay of the compacted topic):
        `add` and `update` are upserts; see `unchanged` for what is then skipped."""
        if starting:
            message = self._upsert(message)
        if message.kind is STREAM:
            return self._apply_stream(message, version)
        if message.op is Op.REMOVE:
            if message.name not in self.live:
                raise ControlMessageError(f"no live query {message.name!r} to remove",
                                          Category.NOT_FOUND)
            del self.live[message.name]
            return None
        checked = message.checked if isinstance(message.checked, CheckedQuery) else None
        if checked is None or checked.schema != self.registry.get(checked.schema.stream):
            checked = check_query(message.name, message.text, self.registry, self.stream)
        old = self.live.get(message.name)
        if message.op is Op.ADD and old is not None:
            raise ControlMessageError(f"query {message.name!r} is live already (use update)",
                                      Category.CONFLICT)
        if message.op is Op.UPDATE and old is None:
            raise ControlMessageError(f"no live query {message.name!r} to update",
                                      Category.NOT_FOUND)
        index = old.index if old is not None else self._take_index()
        entry = self.live[message.name] = LiveQuery(message.name, message.text, index, checked)
        return entry

    def unchanged(self, message: ControlMessage) -> bool:
        """Whether the change leaves the live set as it is: the live text again, or a
        removal of what is not live (of a stream: not registered on the control topic)."""
        if message.kind is STREAM:
            current = self.registry.streams.get(message.name)
            return current is None if message.op is Op.REMOVE else \
                current is not None and current[2] == message.text
        live = self.live.get(message.name)
        return live is None if message.op is Op.REMOVE else \
            live is not None and live.text == message.text

    def live_text(self, kind: Kind, name: str) -> str | None:
        """The text live under a name (a query's, or a stream's registered on the topic)."""
        if kind is STREAM:
            current = self.registry.streams.get(name)
            return None if current is None else current[2]
        live = self.live.get(name)
        return None if live is None else live.text

    def _upsert(self, message: ControlMessage) -> ControlMessage:
        if message.op is Op.REMOVE:
            return message
        if message.kind is STREAM:
            live = message.name in self.registry.streams if message.op is Op.ADD else \
                self.registry.get(message.name) is not None
        else:
            live = message.name in self.live
        op = Op.UPDATE if live else Op.ADD
        return message if op is message.op else \
            ControlMessage(op, message.name, message.text, message.checked, message.kind)

    def _apply_stream(self, message: ControlMessage, version: int | None = None) -> LiveStream:
        name, op = message.name, message.op
        known = self.registry.get(name)
        current = self.registry.streams.get(name)
        if op is Op.ADD and known is not None:
            raise ControlMessageError(f"stream {name!r} exists already (use update)",
                                      Category.CONFLICT)
        if op is Op.UPDATE and known is None:
            raise ControlMessageError(f"no stream {name!r} to update", Category.NOT_FOUND)
        if op is Op.REMOVE and current is None:
            raise ControlMessageError(f"no stream {name!r} registered on the control topic "
                                      "to remove" + (" (its schema is a file)" if known
                                                     else ""), Category.NOT_FOUND)
        schema = message.checked if isinstance(message.checked, StreamSchema) else \
            None if op is Op.REMOVE else check_stream(name, message.text)
        if version is None:
            version = (current[1] if current else 0) + 1
        trial = self.registry.with_stream(name, None if schema is None else
                                          (schema, version, message.text))
        rechecked, broken = {}, []
        for query in self.live.values():
            if query.checked.schema.stream != name:
                continue
            try:
                rechecked[query.name] = _check_query(query.name, query.text, trial)
            except ControlMessageError as e:
                broken.append((query.name, e))
        if broken:
            names = ", ".join(repr(n) for n, _ in broken)
            head = (f"stream {name!r} {op} refused: it would break the live "
                    f"{'query' if len(broken) == 1 else 'queries'} {names}")
            raise ControlMessageError(
                head + "\n" + "\n".join(str(e) for _, e in broken),
                problems=[Problem(head)] + [p for _, e in broken for p in e.problems])
        self.registry.streams, self.registry.removed = trial.streams, trial.removed
        self.registry.checked = {(n, q.text): rechecked[n] for n, q in self.live.items()
                                 if n in rechecked}
        for query_name, checked in rechecked.items():
            self.live[query_name].checked = checked
        return LiveStream(name, message.text if schema else "", version, schema)

    def load(self, entries: list[dict[str, Any]]) -> None:
        """Replace the queries by a serialized set (a `set` control frame or a snapshot)."""
        self.live = {}
        for entry in entries:
            checked = check_query(entry["name"], entry["text"], self.registry, self.stream)
            self.live[entry["name"]] = LiveQuery(entry["name"], entry["text"], entry["index"],
                                                 checked)
        self.next_index = max([e["index"] + 1 for e in entries] + [self.next_index])

    def put(self, entry: dict[str, Any]) -> LiveQuery:
        """Set one query from a serialized entry (`LiveQuery.to_json`: a change another
        process checked and numbered), replacing the one of its name; it comes last."""
        self.remove(entry["name"])
        self.load(self.to_json() + [entry])
        return self.live[entry["name"]]

    def remove(self, name: str) -> LiveQuery | None:
        """Take a query out of the set; the one removed (None: none of that name)."""
        return self.live.pop(name, None)

    def clear(self) -> None:
        """No live queries (the streams stay, and so do the indexes given out)."""
        self.live = {}

    def load_streams(self, entries: list[dict[str, Any]]) -> None:
        """Take the control topic's streams of a serialized set (`LiveRegistry.to_json`)."""
        for entry in entries:
            self.registry.learn(entry["name"], entry["text"], entry["version"])

    def to_json(self) -> list[dict[str, Any]]:
        return [q.to_json() for q in self.live.values()]

    def summary(self) -> dict[str, Any]:
        """What is live: query names with their index, stream versions."""
        return {"queries": {q.name: q.index for q in self.live.values()},
                "streams": self.registry.versions()}

    def _take_index(self) -> int:
        self.next_index += 1
        return self.next_index - 1

    def routes(self) -> set[str]:
        return {q.route for q in self.live.values()}


def replayed(records: Iterable[ControlRecord | tuple[Any, ...]], stream: str | None = None,
             registry: SchemaRegistry | None = None) -> LiveSet:
    """The live set that the control topic's records ((key, value[, offset, headers]) in
    topic order, or ControlRecords) give, as a starting splitter applies them: the same
    on the whole log and on the compacted one (refused changes are skipped); every
    stream's queries when `stream` is None."""
    live = LiveSet(stream, registry)
    for record in compacted(records):
        try:
            replay(live, record)
        except ControlMessageError:
            continue
    return live


def replay(live: LiveSet, record: ControlRecord) -> tuple[ControlMessage, object] | None:
    """Apply one record of a replay (see `replayed`): (the change, what `apply` gave), or
    None where it changes nothing. ControlMessageError (OtherStream) when refused."""
    message = validate(record.value, record.key, live.registry, live.stream)
    if live.unchanged(message):
        return None
    return message, live.apply(message, record.version, starting=True)
