"""Fuzzing the event decoders: any bytes, any JSON-ish value, any Arrow column.

Whatever comes in, each decoder returns good rows plus dead letters, one per bad record
with its reason, original bytes and offset: it never raises, and never takes long.
"""

import orjson
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep_core.errors import EventError
from cep_core.event_columns import decode_table
from cep_core.event_io import decode_record
from cep_core.json_batch import decode_messages
from cep_core.schema import StreamSchema

import numpy as np

SCHEMA = StreamSchema(
    stream="things",
    attributes={"kind": "string", "n": "int", "x": "float", "ok": "bool", "ts": "timestamp"},
    time="ts", time_unit="ns", type_attribute="kind", types=("A", "B"))

FUZZ = settings(max_examples=150, deadline=2000,
                suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.text(max_size=30),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["A", "B", "C", "2024-01-02T09:30:00Z", "9999-12-31T23:59:59Z", "1e5",
                     "0001-01-01", "nan", "12"]))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=5), inner, max_size=4), max_leaves=12)
# Records shaped like events: each field of the schema, present or not, of any value.
field_values = {name: json_values for name in [*SCHEMA.attributes, "seq"]}
event_like = st.fixed_dictionaries({}, optional=field_values)


def encode(value) -> bytes:
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):  # NaN/inf are written as null; big ints fail
        return repr(value).encode()


messages = st.one_of(st.binary(max_size=80), json_values.map(encode), event_like.map(encode))


def check_decoded(raws, decoded, offsets):
    dead_at = {int(np.searchsorted(offsets, d.offset)) for d in decoded.dead}
    assert len(decoded.rows) + len(decoded.dead) == len(raws)
    assert dead_at.isdisjoint(decoded.rows.tolist())
    for letter in decoded.dead:
        i = int(np.searchsorted(offsets, letter.offset))
        assert offsets[i] == letter.offset and letter.position == 100 + i
        assert letter.raw == raws[i][:64] and letter.reason
        assert letter.partition == 3
        orjson.dumps(letter.to_json())
    assert decoded.table.num_rows == len(decoded.rows)


@FUZZ
@given(st.lists(messages, max_size=8))
def test_any_bytes_decode_to_rows_or_dead_letters(raws):
    offsets = np.arange(len(raws), dtype=np.int64) * 7 + 1000
    positions = np.arange(100, 100 + len(raws), dtype=np.int64)
    decoded = decode_messages(raws, SCHEMA, positions, offsets=offsets, partition=3,
                              max_bytes=64)
    check_decoded(raws, decoded, offsets)


@FUZZ
@given(st.lists(event_like, max_size=8))
def test_event_like_records_agree_with_decode_record(records):
    raws = [encode(r) for r in records]
    offsets = np.arange(len(raws), dtype=np.int64)
    decoded = decode_messages(raws, SCHEMA, np.arange(len(raws)), offsets=offsets,
                              max_bytes=None)
    good = []
    for i, raw in enumerate(raws):
        try:
            good.append(decode_record(orjson.loads(raw), SCHEMA, i))
        except (EventError, orjson.JSONDecodeError):
            pass
    assert decoded.table.column("seq").to_pylist() == [e.seq for e in good]
    for name in SCHEMA.attributes:
        assert decoded.table.column(name).to_pylist() == [e.attrs[name] for e in good]


arrow_columns = {
    "kind": st.sampled_from([pa.array(["A", "B", None]), pa.array(["C", "A", "B"]),
                             pa.array([1, 2, 3])]),
    "n": st.sampled_from([pa.array([1, None, 3]), pa.array([2**64 - 1, 1, 2], pa.uint64()),
                          pa.array([1.5, 2.0, 3.0]), pa.array(["1", "2", "x"])]),
    "x": st.sampled_from([pa.array([1.0, float("nan"), float("inf")]), pa.array([1, 2, 3]),
                          pa.array([True, False, None])]),
    "ok": st.sampled_from([pa.array([True, False, None]), pa.array([1, 0, 1])]),
    "ts": st.sampled_from([pa.array([1, 2, 3]),
                           pa.array([0, 2**62, -(2**62)], pa.timestamp("s")),
                           pa.array([1, 2, 3], pa.timestamp("ms", tz="UTC")),
                           pa.array(["2024-01-02T09:30:00Z", "bad", None])]),
    "seq": st.sampled_from([pa.array([5, -1, None]), pa.array([2**63, 1, 2], pa.uint64()),
                            pa.array(["1", "x", None])]),
}


@FUZZ
@given(st.fixed_dictionaries({}, optional=arrow_columns))
def test_any_arrow_columns_decode_to_rows_or_reasons(columns):
    table = pa.table(columns) if columns else pa.table({"other": [1, 2, 3]})
    decoded = decode_table(table, SCHEMA, np.arange(3, dtype=np.int64))
    assert len(decoded.errors) == 3 and len(decoded.seq) == 3
    for row, error in enumerate(decoded.errors):
        if error is None:
            assert all(decoded.attributes[name][row].is_valid for name in SCHEMA.attributes)
        else:
            assert decoded.raw[row] is not None
