"""The Arrow JSON reader path of `decode_messages` gives exactly what the record-by-record
path gives (rows, values to the bit, dead letters), whatever the batch holds: it takes a
batch only when nothing in it needs a closer look."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cep_core.json_batch as json_batch
from cep_core.json_batch import _arrow_columns, decode_messages
from cep_core.schema import StreamSchema

SCHEMA = StreamSchema(
    stream="things",
    attributes={"kind": "string", "n": "int", "x": "float", "ok": "bool", "ts": "timestamp"},
    time="ts", type_attribute="kind", types=("A", "B", "é"))

odd = st.sampled_from([None, True, 0, -1, 1.5, "1", 2**63, -(2**63), 2**64 - 1, 2**70,
                       9007199254740993, [1], {"a": 1}, "NaN", ""])
texts = st.text(max_size=6)
valid = {"kind": st.sampled_from(["A", "B", "é", "C"]), "n": st.integers(-(2**63), 2**63 - 1),
         "x": st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**53), 2**53),
         "ok": st.booleans(), "ts": st.integers(0, 2**62)}
fields = {name: values | odd if name != "ts" else values for name, values in valid.items()}
events = st.fixed_dictionaries(valid, optional={"extra": texts | odd | st.floats()})
record = st.one_of(events, events, events, events, st.fixed_dictionaries({}, optional=fields))
raw_forms = st.sampled_from(["plain", "spaced", "escaped", "-0", "seq", "cut"])


def dumps(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def written(value: dict, form: str) -> bytes:
    raw = dumps(value)
    if form == "spaced":
        return b" " + raw.replace(b",", b" , ") + b"\t"
    if form == "escaped":
        return raw.replace(b'"A"', b'"\\u0041"')
    if form == "-0" and isinstance(value.get("x"), (int, float)):
        return dumps({**value, "x": 0}).replace(b'"x":0', b'"x":-0')
    if form == "seq":
        return raw[:-1] + b',"seq":null}' if raw != b"{}" else b'{"seq":null}'
    if form == "cut":
        return raw[:-1]
    return raw


def by_records(raws, positions, offsets):
    saved = json_batch._arrow_columns
    json_batch._arrow_columns = lambda *a: None
    try:
        return decode_messages(raws, SCHEMA, positions, offsets=offsets, partition=2)
    finally:
        json_batch._arrow_columns = saved


def same(a: pa.Table, b: pa.Table) -> bool:
    if a.schema != b.schema or a.num_rows != b.num_rows:
        return False
    for x, y in zip(a.columns, b.columns):
        if pa.types.is_floating(x.type):  # to the bit: -0.0 is not 0.0
            if not np.array_equal(x.to_numpy().view(np.int64), y.to_numpy().view(np.int64)):
                return False
        elif not x.equals(y):
            return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(record, st.sampled_from(["plain"] * 12) | raw_forms), max_size=12))
def test_arrow_path_agrees_with_the_record_path(batch):
    raws = [written(value, form) for value, form in batch]
    positions = np.arange(50, 50 + len(raws), dtype=np.int64)
    offsets = positions * 3
    fast = decode_messages(raws, SCHEMA, positions, offsets=offsets, partition=2)
    slow = by_records(raws, positions, offsets)
    assert same(fast.table, slow.table)
    assert fast.rows.tolist() == slow.rows.tolist()
    assert [d.to_json() for d in fast.dead] == [d.to_json() for d in slow.dead]


def test_a_plain_batch_takes_the_arrow_path():
    raws = [orjson.dumps({"kind": "AB"[i % 2], "n": i, "x": i / 3, "ok": i % 3 == 0,
                          "ts": 1000 + i, "other": {"deep": [i]}}) for i in range(1000)]
    table = _arrow_columns(raws, SCHEMA, np.arange(1000, dtype=np.int64))
    assert table is not None
    assert table.column("n").to_pylist() == list(range(1000))
    assert table.column("x").to_pylist() == [i / 3 for i in range(1000)]
    assert same(table, by_records(raws, np.arange(1000), np.arange(1000)).table)


def test_messages_that_are_not_one_object_each_are_left_to_orjson():
    one = orjson.dumps({"kind": "A", "n": 1, "x": 1.0, "ok": True, "ts": 5})
    for raws in ([one + one, b""], [one, b"[1]"], [one, b" "], [one + b"\n" + one],
                 [one, one.replace(b'"n":1', b'"n":1,"n":2')],
                 [one, one[:-1] + b',"deep":' + b"[" * 1100 + b"]" * 1100 + b"}"]):
        assert _arrow_columns(raws, SCHEMA, np.arange(len(raws), dtype=np.int64)) is None
