"""Frame codec, columnar JSON decoding, stable routing and the coordinator's release rule
(no broker)."""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa

from cep_core.event_io import decode_record
from cep_core.errors import EventError
from cep_core.json_batch import decode_json_batch
from cep_core.schema import SchemaRegistry
from cep_service.stream import frames
from cep_service.stream.control import ControlMessage, QuerySet, horizon, parse_control
from cep_service.stream.merge import Merger
from cep_service.stream.splitter import partition_ids

TRADES = SchemaRegistry().get("trades")
MSHAPE = """QUERY m FROM trades INTO tops PARTITION BY symbol
PATTERN ( . rise+ deep ) DEFINE rise AS price > Last(price), deep AS price < First(price);"""


class FakeMessage:
    def __init__(self, frame: frames.Frame):
        self._headers, self._value = frame.kafka_headers(), frame.payload

    def headers(self):
        return self._headers

    def value(self):
        return self._value


def test_events_frame_round_trip():
    table = pa.table({"seq": [3, 4], "symbol": ["A", "B"], "price": [1, 2]})
    frame = frames.events_frame(table, "symbol", upto=4, ts=9)
    back = frames.frame_of(FakeMessage(frame))
    assert back.kind == "events"
    assert (back.get("first"), back.get("last"), back.get("count")) == (3, 4, 2)
    assert (back.get("route"), back.get("upto"), back.get("ts")) == ("symbol", 4, 9)
    assert frames.decode_table(back.payload).equals(table)


def test_plain_message_is_not_a_frame():
    class Plain(FakeMessage):
        def __init__(self):
            self._headers, self._value = None, b"{}"
    assert frames.frame_of(Plain()) is None


def _record(i, **over):
    return {"symbol": f"S{i % 3}", "price": 100 + i, "volume": 5, "ts": 1000 + i,
            "seqNum": i, **over}


def test_json_batch_matches_decode_record_reasons():
    records = [orjson.dumps(_record(0)), b"not json", orjson.dumps(_record(2, price="x")),
               orjson.dumps(_record(3, price=True)), orjson.dumps({"symbol": "A"}),
               orjson.dumps(_record(5, volume=2.5)), orjson.dumps(_record(6))]
    positions = np.arange(10, 10 + len(records))
    table, dead = decode_json_batch(records, TRADES, positions)
    assert table.column("seq").to_pylist() == [10, 16]
    expected = {}
    for raw, pos in zip(records, positions.tolist()):
        try:
            decode_record(orjson.loads(raw), TRADES, pos)
        except EventError as e:
            expected[pos] = str(e)
        except orjson.JSONDecodeError:
            expected[pos] = "json"
    got = {d.position: d.reason for d in dead}
    assert sorted(got) == sorted(expected)
    assert all(got[p] == r for p, r in expected.items() if r != "json")


def test_json_batch_fast_path_keeps_values():
    records = [orjson.dumps(_record(i)) for i in range(50)]
    table, dead = decode_json_batch(records, TRADES, np.arange(50))
    assert not dead
    assert table.column("price").to_pylist() == [100 + i for i in range(50)]
    assert table.column("symbol").to_pylist()[:3] == ["S0", "S1", "S2"]


def test_partition_ids_are_stable_and_by_key():
    table = pa.table({"symbol": ["A", "B", "A", "C", "B"] * 20})
    parts = partition_ids(table, ["symbol"], 4)
    assert parts.tolist() == partition_ids(table, ["symbol"], 4).tolist()
    by_key = {}
    for key, p in zip(table.column("symbol").to_pylist(), parts.tolist()):
        assert by_key.setdefault(key, p) == p
    assert partition_ids(table, [], 4).tolist() == [0] * 100


def test_control_messages_are_validated():
    change = parse_control(ControlMessage("add", "m", MSHAPE).to_json())
    queries = QuerySet("trades")
    entry = queries.apply(change)
    assert (entry.route, entry.output, entry.index, horizon(entry.checked)) == \
        ("symbol", "tops", 0, 0)
    for bad in (b"[]", b'{"op": "drop", "name": "m"}', b'{"op": "add", "name": "m"}'):
        try:
            parse_control(bad)
            raise AssertionError(bad)
        except ValueError:
            pass
    try:
        queries.apply(ControlMessage("add", "x", MSHAPE))
        raise AssertionError("a text defining another name must be refused")
    except ValueError as e:
        assert "not 'x'" in str(e)


def _matches(part, upto, ts, composites=()):
    return frames.Frame(frames.MATCHES, {"part": part, "upto": upto, "ts": ts},
                        orjson.dumps(list(composites)) if composites else b"")


def test_merger_releases_in_seq_order_once_every_partition_passed():
    merger = Merger(2, "trades")
    merger.feed(frames.json_frame(frames.CONTROL, {"op": "set", "queries": [
        {"name": "m", "text": MSHAPE, "index": 0}]}, part=0, at=0))
    merger.feed(_matches(0, 10, 5, [{"query": "m", "key": "A", "seq": 7, "start_seq": 1}]))
    assert merger.release() == []  # partition 1 has not passed seq 7
    merger.feed(_matches(1, 6, 4, [{"query": "m", "key": "B", "seq": 5, "start_seq": 2}]))
    assert [c["seq"] for _, c in merger.release()] == [5]
    merger.feed(_matches(1, 12, 6))
    assert [(t, c["seq"]) for t, c in merger.release()] == [("tops", 7)]


def test_topic_prefix_names_internal_topics_and_groups_only():
    from cep_service.stream.kafka import Topics

    plain = Topics("trades")
    assert (plain.source, plain.control, plain.keyed) == ("trades", "cep.queries",
                                                          "cep.trades.keyed")
    run = Topics("trades", prefix="run1")
    assert run.source == "trades"  # named by the user: not prefixed
    assert run.control == "run1.cep.queries"
    assert [run.keyed, run.matches, run.state, run.status, run.dead_letters] == [
        f"run1.cep.trades.{t}" for t in ("keyed", "matches", "state", "status", "dead")]
    assert run.group("workers") == "run1.cep.trades.workers" != plain.group("workers")
    assert Topics("trades", prefix="a-").keyed == "a-cep.trades.keyed"
    assert Topics("trades", control="ctl", prefix="run1").control == "ctl"
