"""The owner of live changes without Kafka (cep_core/control_message.py): key forms, stream
messages checked with the JSON Schema, stream changes refused when they would break a live
query (with the checker's located message), each query checked once per process, the
control topic replayed in order; and the one time-unit table."""

import orjson
import pytest

from cep_core import ast
from cep_core import control_message as cm
from cep_core.control_message import (
    STREAM,
    ControlMessage,
    ControlMessageError,
    LiveRegistry,
    LiveSet,
    parse_key,
    replayed,
    validate,
)
from cep_core.event_io import decode_record
from cep_core.schema import NANOS_PER_UNIT, TIME_UNITS, StreamSchema, units_per_ms

QUOTES = {"stream": "quotes2", "attributes": {"sym": "string", "bid": "float", "ask": "float",
                                               "t": "timestamp"}, "time": "t"}
SPREAD = """QUERY wide FROM quotes2 PARTITION BY sym
PATTERN ( w ) DEFINE w AS ask - bid > 1.5
EMIT sym = sym"""


def stream_record(op: str, schema: dict | None = None, name: str = "quotes2") -> tuple:
    text = orjson.dumps(schema).decode() if schema is not None else ""
    value = orjson.dumps({"op": op, "name": name, **({"text": text} if text else {})})
    return f"stream/{name}".encode(), value


def query_record(op: str, name: str, text: str = "", key: str | None = None) -> tuple:
    value = orjson.dumps({"op": op, "name": name, **({"text": text} if text else {})})
    return (key or f"query/{name}").encode(), value


def with_quotes() -> LiveSet:
    live = LiveSet("quotes2")
    live.apply(validate(stream_record("add", QUOTES)[1], b"stream/quotes2"))
    live.apply(validate(*reversed(query_record("add", "wide", SPREAD)),
                        registry=live.registry, stream="quotes2"))
    return live


def test_key_forms():
    assert parse_key(b"query/rise") == ("query", "rise")
    assert parse_key(b"stream/quotes2") == ("stream", "quotes2")
    assert parse_key(b"rise") == ("query", "rise")  # the first form: a query
    for bad in (b"query/a b", b"../../etc/passwd", b"stream/"):
        with pytest.raises(ControlMessageError, match="does not match|must not be empty"):
            parse_key(bad)
    tombstone = validate(None, b"stream/quotes2")
    assert (tombstone.kind, tombstone.op, tombstone.name) == (STREAM, "remove", "quotes2")
    assert ControlMessage("add", "x", "t", kind=STREAM).key == b"stream/x"
    with pytest.raises(ControlMessageError, match="for stream 'quotes2' has the key"):
        validate(stream_record("add", QUOTES)[1], b"stream/other")


def test_a_stream_message_holds_a_checked_schema():
    change = validate(stream_record("add", QUOTES)[1], b"stream/quotes2")
    assert change.kind == STREAM and change.checked == StreamSchema.from_dict(QUOTES)


@pytest.mark.parametrize("schema,reason", [
    ({**QUOTES, "attributes": {**QUOTES["attributes"], "bid": "double"}},
     "field 'attributes.bid' must be one of int, float, string, bool, timestamp, got 'double'"),
    ({k: v for k, v in QUOTES.items() if k != "time"}, "schema lacks the field 'time'"),
    ({**QUOTES, "time_unit": "min"}, "field 'time_unit' must be one of ms, s, us, ns, ticks"),
    ({**QUOTES, "extra": 1}, "schema has an unknown field 'extra'"),
    ({**QUOTES, "time": "sym"}, "time attribute 'sym' must be an attribute of type timestamp"),
    ({**QUOTES, "stream": "other"}, "describes stream 'other', not 'quotes2'"),
])
def test_bad_stream_schemas_are_refused(schema, reason):
    with pytest.raises(ControlMessageError, match=reason.replace("(", r"\(")):
        validate(stream_record("add", schema)[1], b"stream/quotes2")


def test_a_stream_change_that_breaks_a_live_query_is_refused_naming_it():
    live = with_quotes()
    without_bid = {**QUOTES, "attributes": {k: v for k, v in QUOTES["attributes"].items()
                                            if k != "bid"}}
    retyped = {**QUOTES, "attributes": {**QUOTES["attributes"], "ask": "string"}}
    for schema in (without_bid, retyped):
        with pytest.raises(ControlMessageError) as refused:
            live.apply(validate(stream_record("update", schema)[1], b"stream/quotes2"))
        reason = str(refused.value)
        assert "stream 'quotes2' update refused: it would break the live query 'wide'" in reason
        assert "<query wide>:2:" in reason  # the checker's file:line:col message
    with pytest.raises(ControlMessageError, match="would break the live query 'wide'"):
        live.apply(validate(None, b"stream/quotes2"))
    assert live.registry.get("quotes2") == StreamSchema.from_dict(QUOTES)
    assert live.summary() == {"queries": {"wide": 0}, "streams": {"quotes2": 1}}


def test_compatible_stream_changes_are_versioned():
    live = with_quotes()
    wider = {**QUOTES, "attributes": {**QUOTES["attributes"], "venue": "string"}}
    changed = live.apply(validate(stream_record("update", wider)[1], b"stream/quotes2"))
    assert changed.version == 2 and live.summary()["streams"] == {"quotes2": 2}
    assert "venue" in live.live["wide"].checked.schema.attributes  # re-checked on it
    with pytest.raises(ControlMessageError, match="exists already"):
        live.apply(validate(stream_record("add", QUOTES)[1], b"stream/quotes2"))
    with pytest.raises(ControlMessageError, match="no stream 'nosuch' to update"):
        live.apply(validate(stream_record("update", {**QUOTES, "stream": "nosuch"},
                                          "nosuch")[1], b"stream/nosuch"))
    with pytest.raises(ControlMessageError, match="its schema is a file"):
        live.apply(validate(None, b"stream/trades"))
    live.apply(validate(None, b"query/wide"))
    live.apply(validate(None, b"stream/quotes2"))
    assert live.registry.get("quotes2") is None
    with pytest.raises(ControlMessageError, match="unknown stream 'quotes2'"):
        validate(query_record("add", "wide", SPREAD)[1], b"query/wide", live.registry)


def test_a_query_is_checked_once_per_process(monkeypatch):
    from cep_service.stream.worker import PartitionState

    calls = []
    check = cm._check_query
    monkeypatch.setattr(cm, "_check_query", lambda *a: calls.append(a[0]) or check(*a))
    registry = LiveRegistry()
    registry.learn("quotes2", orjson.dumps(QUOTES).decode(), 1)
    parts = [PartitionState(p, "quotes2", registry) for p in range(4)]
    for state in parts:
        state.reconcile([{"name": "wide", "text": SPREAD, "index": 0}])
    assert calls == ["wide"]
    assert len({id(state.queries.live["wide"].checked) for state in parts}) == 1
    registry.learn("quotes2", orjson.dumps({**QUOTES, "doc": "v2"}).decode(), 2)
    parts[0].restart_engines()
    assert calls == ["wide", "wide"]  # a stream change checks again
    registry.learn("quotes2", orjson.dumps(QUOTES).decode(), 2)  # not newer: ignored
    parts[1].restart_engines()
    assert calls == ["wide", "wide"]


def test_the_control_topic_replays_in_order():
    records = [query_record("add", "wide", SPREAD),  # before its stream: refused
               stream_record("add", QUOTES),
               query_record("add", "wide", SPREAD, key="wide"),  # the old key form
               query_record("add", "wide", SPREAD),  # live already: refused
               (b"query/bad", b"{not json")]
    live = replayed(records, "quotes2")
    assert live.summary() == {"queries": {"wide": 0}, "streams": {"quotes2": 1}}
    assert replayed(records[:1]).summary() == {"queries": {}, "streams": {}}


def test_one_time_unit_table():
    assert TIME_UNITS == ("ms", "s", "us", "ns", "ticks")
    assert [units_per_ms(u) for u in TIME_UNITS] == [1, 1e-3, 1e3, 1e6, 1]
    for unit, nanos in NANOS_PER_UNIT.items():
        assert ast.Duration(2, "s").in_time_units(unit) == 2 * 10**9 // nanos
        schema = StreamSchema("x", {"t": "timestamp"}, "t", unit)
        assert decode_record({"t": "1970-01-01T00:00:02Z"}, schema, 0).ts == \
            2 * 10**9 // nanos
    with pytest.raises(ValueError, match=r"finer than the stream's time unit \(s\)"):
        ast.Duration(1500, "ms").in_time_units("s")


def test_status_records_say_what_is_live_per_service_and_when_a_change_settled():
    from cep_service.stream.control import outcomes_of, services_up, settled

    change = {"key": "query/wide", "offset": 7}
    live = {"queries": {"wide": 0}, "streams": {}}
    records = [
        {"event": "service", "state": "up", "service": "s1", "role": "splitter", "live": {}},
        {"event": "service", "state": "up", "service": "w1", "role": "worker",
         "partitions": {"0": {}, "1": {}}},
        {"event": "service", "state": "up", "service": "w2", "role": "worker",
         "partitions": {"1": {}}},  # took partition 1 over from w1
        {"event": "change", **change, "outcome": "applied", "service": "s1",
         "role": "splitter", "at": 5, "live": live},
        {"event": "change", **change, "outcome": "applied", "service": "w1", "role": "worker",
         "partition": 0, "live": live},
    ]
    assert settled(outcomes_of(records, change)) is None  # the coordinator has not seen it
    view = services_up(records)
    assert view["s1"]["live"] == live
    assert view["w1"]["partitions"] == {0: live} and view["w2"]["partitions"] == {1: {}}
    records.append({"event": "change", **change, "outcome": "applied", "service": "c1",
                    "role": "coordinator", "partitions": 2})
    assert settled(outcomes_of(records, change)) == "applied"
    assert settled(outcomes_of(records, {**change, "offset": 8})) is None
    records.append({"event": "change", "key": "query/x", "offset": 9, "outcome": "refused",
                    "service": "s1", "role": "splitter", "reason": "<query x>:1:2: error"})
    assert settled(outcomes_of(records, {"key": "query/x", "offset": 9})) == "refused"
    records.append({"event": "service", "state": "down", "service": "w1", "role": "worker"})
    assert set(services_up(records)) == {"s1", "w2", "c1"}  # c1 reported: up
