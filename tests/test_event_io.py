"""Reading events (JSONL, JSON arrays, CSV, Parquet) and dead letters; writing JSON lines."""

import base64
import dataclasses
import io

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cep_core.errors import EventError
from cep_core.event_io import (
    DeadLetter,
    InputError,
    decode_record,
    read_events,
    write_composites_jsonl,
    write_dead_letters_jsonl,
)
from cep_core.events import Event
from cep_core.schema import StreamSchema

SCHEMA = StreamSchema(
    stream="things",
    attributes={"kind": "string", "n": "int", "x": "float", "ok": "bool", "ts": "timestamp"},
    time="ts", time_unit="ms", type_attribute="kind", types=("A", "B"))

GOOD = [
    {"kind": "A", "n": 1, "x": 1.5, "ok": True, "ts": 1000},
    {"kind": "B", "n": 2, "x": 2, "ok": False, "ts": 2000},  # an int where a float belongs
]


def write_jsonl(path, lines):
    path.write_bytes(b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n"
                              for line in lines))
    return path


def test_jsonl_good_events(tmp_path):
    events, dead = read_events(write_jsonl(tmp_path / "e.jsonl", GOOD), SCHEMA)
    assert dead == []
    assert events == [
        Event(0, 1000, {"kind": "A", "n": 1, "x": 1.5, "ok": True, "ts": 1000}),
        Event(1, 2000, {"kind": "B", "n": 2, "x": 2.0, "ok": False, "ts": 2000}),
    ]
    assert isinstance(events[1].attrs["x"], float)
    assert list(events[0].attrs) == list(SCHEMA.attributes)  # schema order, extras dropped


@pytest.mark.parametrize("suffix", [".json", ".ndjson"])
def test_other_json_suffixes(tmp_path, suffix):
    events, dead = read_events(write_jsonl(tmp_path / f"e{suffix}", GOOD), SCHEMA)
    assert [e.seq for e in events] == [0, 1] and dead == []


def test_json_array_file(tmp_path):
    path = tmp_path / "e.json"
    path.write_bytes(orjson.dumps(GOOD + [{"kind": "A"}]))
    events, dead = read_events(path, SCHEMA)
    assert [e.seq for e in events] == [0, 1]
    assert [(d.position, d.reason) for d in dead] == [(2, "missing attribute 'n'")]


def test_seq_from_input_and_blank_lines(tmp_path):
    lines = [{**GOOD[0], "seq": 10}, b"", {**GOOD[1], "seq": 12}]
    events, dead = read_events(write_jsonl(tmp_path / "e.jsonl", lines), SCHEMA)
    assert [e.seq for e in events] == [10, 12] and dead == []


BAD_CASES = [
    (b'{"kind": "A", "n": 1,', "not valid JSON"),
    (b"[1, 2]", "not a JSON object"),
    ({"kind": "A", "x": 1.0, "ok": True, "ts": 5}, "missing attribute 'n'"),
    ({**GOOD[0], "n": None}, "null attribute 'n'"),
    ({**GOOD[0], "n": "12"}, "attribute 'n': expected int, got a string ('12')"),
    ({**GOOD[0], "n": 1.5}, "attribute 'n': expected int, got a number (1.5)"),
    ({**GOOD[0], "n": True}, "attribute 'n': expected int, got a bool (true)"),
    ({**GOOD[0], "x": "1.5"}, "attribute 'x': expected float, got a string ('1.5')"),
    ({**GOOD[0], "kind": 3}, "attribute 'kind': expected string, got a number (3)"),
    ({**GOOD[0], "ok": "true"}, "attribute 'ok': expected bool, got a string ('true')"),
    ({**GOOD[0], "ts": "yesterday"}, "attribute 'ts': expected an integer time or an ISO-8601"),
    ({**GOOD[0], "kind": "Z"}, "unknown event type 'Z' for stream things (one of A, B)"),
    ({**GOOD[0], "seq": "x"}, "attribute 'seq': expected int"),
]


@pytest.mark.parametrize("bad,reason", BAD_CASES)
def test_bad_record_goes_to_dead_letters(tmp_path, bad, reason):
    path = write_jsonl(tmp_path / "e.jsonl", [GOOD[0], bad, GOOD[1]])
    events, dead = read_events(path, SCHEMA)
    assert [e.seq for e in events] == [0, 2]  # good records around it still come through
    [letter] = dead
    assert letter.source == str(path) and letter.position == 1
    assert reason in letter.reason
    raw = bad if isinstance(bad, bytes) else orjson.dumps(bad)
    assert letter.raw == raw


def test_null_and_missing_attributes_have_their_own_reasons():
    with pytest.raises(EventError) as null:
        decode_record({**GOOD[0], "x": None}, SCHEMA, 0)
    assert str(null.value) == "null attribute 'x'"
    with pytest.raises(EventError) as missing:
        decode_record({k: v for k, v in GOOD[0].items() if k != "x"}, SCHEMA, 0)
    assert str(missing.value) == "missing attribute 'x'"
    # CSV has no null: an empty field is missing, and an empty string is a string
    with pytest.raises(EventError, match="^missing attribute 'x'$"):
        decode_record({"kind": "A", "n": "1", "x": "", "ok": "true", "ts": "1"}, SCHEMA, 0,
                      text=True)
    assert decode_record({"kind": "", "n": "1", "x": "1", "ok": "true", "ts": "1"},
                         StreamSchema("s", dict(SCHEMA.attributes), "ts"), 0,
                         text=True).attrs["kind"] == ""


def test_framed_batch_with_a_null_column_is_a_null_attribute():
    from cep_core.json_batch import conform_table

    good = {"kind": ["A"], "n": [1], "x": [1.0], "ok": [True], "ts": [5]}
    assert conform_table(pa.table(good), SCHEMA).num_rows == 1
    with pytest.raises(EventError, match="^null attribute 'n'$"):
        conform_table(pa.table({**good, "n": pa.array([None], pa.int64())}), SCHEMA)
    with pytest.raises(EventError, match="^missing attribute 'n'$"):
        conform_table(pa.table({k: v for k, v in good.items() if k != "n"}), SCHEMA)


def test_nan_and_infinity_are_dead_letters(tmp_path):
    path = tmp_path / "e.jsonl"  # orjson refuses NaN literals: they are invalid JSON
    path.write_bytes(orjson.dumps(GOOD[0]) + b"\n" + b'{"kind": "A", "n": 1, "x": NaN, '
                     b'"ok": true, "ts": 5}\n')
    events, dead = read_events(path, SCHEMA)
    assert len(events) == 1 and "not valid JSON" in dead[0].reason
    for value in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(EventError, match="not a finite number"):
            decode_record({**GOOD[0], "x": value}, SCHEMA, 0)


def test_seq_must_increase(tmp_path):
    lines = [{**GOOD[0], "seq": 5}, {**GOOD[1], "seq": 5}, {**GOOD[1], "seq": 3},
             {**GOOD[1], "seq": 6}]
    events, dead = read_events(write_jsonl(tmp_path / "e.jsonl", lines), SCHEMA)
    assert [e.seq for e in events] == [5, 6]
    assert [d.reason for d in dead] == ["seq 5 does not increase (previous seq 5)",
                                        "seq 3 does not increase (previous seq 5)"]


def test_iso_timestamps():
    def ts(value, unit="ms"):
        schema = StreamSchema("s", {"ts": "timestamp"}, "ts", unit)
        return decode_record({"ts": value}, schema, 0).ts

    assert ts("1970-01-01T00:00:01Z") == 1000
    assert ts("2024-01-02T09:30:00Z") == 1_704_187_800_000
    assert ts("2024-01-02T09:30:00.250+00:00") == 1_704_187_800_250
    assert ts("2024-01-02T10:30:00+01:00") == 1_704_187_800_000
    assert ts("2024-01-02T09:30:00") == 1_704_187_800_000  # naive: UTC
    assert ts("2024-01-02T09:30:00.000001Z", "us") == 1_704_187_800_000_001
    assert ts("2024-01-02T09:30:00Z", "ns") == 1_704_187_800_000_000_000
    assert ts("2024-01-02T09:30:00.9Z", "s") == 1_704_187_800
    assert ts(42) == 42
    with pytest.raises(EventError, match="ticks takes integer times"):
        ts("2024-01-02T09:30:00Z", "ticks")
    # An `int` time attribute takes integers only.
    schema = StreamSchema("s", {"t": "int"}, "t")
    with pytest.raises(EventError, match="expected int"):
        decode_record({"t": "2024-01-02T09:30:00Z"}, schema, 0)


def test_csv(tmp_path):
    path = tmp_path / "e.csv"
    path.write_text(
        "kind,n,x,ok,ts\n"
        "A,1,1.5,true,1000\n"
        "B,2,2,FALSE,2024-01-02T09:30:00Z\n"
        "A,x,1.0,true,3\n"          # a string where a number belongs
        "A,1,1.0,maybe,3\n"         # not a bool
        "A,,1.0,true,3\n"           # empty: missing
        "A,1,nan,true,3\n"          # NaN
        "A,1,1.0\n"                 # too few fields
        "\"B\",7,-0.5,True,4000\n"
    )
    # the times jump from 1970 to 2024: no bound on events too far ahead for this reading
    events, dead = read_events(path, dataclasses.replace(SCHEMA, max_ahead="none"))
    assert [(e.seq, e.attrs) for e in events] == [
        (0, {"kind": "A", "n": 1, "x": 1.5, "ok": True, "ts": 1000}),
        (1, {"kind": "B", "n": 2, "x": 2.0, "ok": False, "ts": 1_704_187_800_000}),
        (7, {"kind": "B", "n": 7, "x": -0.5, "ok": True, "ts": 4000}),
    ]
    assert [(d.position, d.reason) for d in dead] == [
        (2, "attribute 'n': expected int, got a string ('x')"),
        (3, "attribute 'ok': expected bool, got a string ('maybe')"),
        (4, "missing attribute 'n'"),
        (5, "attribute 'x': not a finite number (nan)"),
        (6, "3 fields where the header has 5"),
    ]
    assert dead[0].raw == "A,x,1.0,true,3"


def test_csv_seq_column(tmp_path):
    path = tmp_path / "e.csv"
    path.write_text("seq,kind,n,x,ok,ts\n3,A,1,1,true,1\n9,B,1,1,false,2\n")
    events, dead = read_events(path, SCHEMA)
    assert [e.seq for e in events] == [3, 9] and dead == []


def test_parquet(tmp_path):
    path = tmp_path / "e.parquet"
    table = pa.table({
        "kind": ["A", "B", "C", "A", "A"],
        "n": pa.array([1, 2, 3, None, 5], pa.int64()),
        "x": [1.5, 2.0, 3.0, 4.0, float("nan")],
        "ok": [True, False, True, True, False],
        "ts": pa.array([1000, 2000, 3000, 4000, 5000], pa.int64()),
    })
    pq.write_table(table, path)
    events, dead = read_events(path, SCHEMA)
    assert [(e.seq, e.ts, e.attrs["n"]) for e in events] == [(0, 1000, 1), (1, 2000, 2)]
    assert [(d.position, d.reason) for d in dead] == [
        (2, "unknown event type 'C' for stream things (one of A, B)"),
        (3, "null attribute 'n'"),
        (4, "attribute 'x': not a finite number (nan)"),
    ]


def test_parquet_timestamp_column(tmp_path):
    path = tmp_path / "e.parquet"
    schema = StreamSchema("s", {"v": "int", "ts": "timestamp"}, "ts", "ms")
    pq.write_table(pa.table({"v": [1], "ts": pa.array([1_704_187_800_250], pa.timestamp("ms"))}),
                   path)
    events, dead = read_events(path, schema)
    assert dead == [] and events[0].ts == 1_704_187_800_250


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(InputError, match="unknown event file format"):
        read_events(tmp_path / "e.txt", SCHEMA)
    with pytest.raises(InputError, match="no such file"):
        read_events(tmp_path / "absent.jsonl", SCHEMA)


def test_write_composites_keeps_field_order(tmp_path):
    composites = [{"query": "q", "key": None, "seq": 3, "start_seq": 1, "zeta": 1, "alpha": 2.5},
                  {"query": "q", "key": ["a", 1], "seq": 4, "start_seq": 4, "events": {}}]
    buffer = io.BytesIO()
    assert write_composites_jsonl(composites, buffer) == 2
    assert buffer.getvalue() == (
        b'{"query":"q","key":null,"seq":3,"start_seq":1,"zeta":1,"alpha":2.5}\n'
        b'{"query":"q","key":["a",1],"seq":4,"start_seq":4,"events":{}}\n')
    path = tmp_path / "out.jsonl"
    write_composites_jsonl(composites, path)
    assert [orjson.loads(line) for line in path.read_bytes().splitlines()] == composites


def test_write_dead_letters(tmp_path):
    path = tmp_path / "dead.jsonl"
    write_dead_letters_jsonl([DeadLetter("f.jsonl", 3, b"{bad", "not valid JSON")], path)
    assert orjson.loads(path.read_bytes()) == {"source": "f.jsonl", "position": 3,
                                               "reason": "not valid JSON", "raw": "{bad"}


# ------------------------------------------------------------------ Kafka message batches

MESSAGE_CASES = [  # one message per bad-input class, and the reason its dead letter gives
    (b'{"kind": "A", "n": 1,', "not valid JSON"),
    (b"\xff\xfe not utf-8", "not valid JSON"),
    (b"", "not valid JSON"),
    (b'"just a string"', "not a JSON object"),
    (orjson.dumps({**GOOD[0], "n": None}), "null attribute 'n'"),
    (orjson.dumps({k: v for k, v in GOOD[0].items() if k != "ts"}), "missing attribute 'ts'"),
    (orjson.dumps({**GOOD[0], "n": "12"}), "attribute 'n': expected int, got a string ('12')"),
    (orjson.dumps({**GOOD[0], "x": "1.5"}), "attribute 'x': expected float, got a string"),
    (orjson.dumps({**GOOD[0], "ok": 1}), "attribute 'ok': expected bool, got a number (1)"),
    (orjson.dumps({**GOOD[0], "kind": "Z"}), "unknown event type 'Z' for stream things"),
    (b'{"kind": "A", "n": 1, "x": NaN, "ok": true, "ts": 5}', "not valid JSON"),
    (b'{"kind": "A", "n": 1, "x": 1e400, "ok": true, "ts": 5}', "number is infinity"),
    (b'{"kind": "A", "n": 18446744073709551615, "x": 1, "ok": true, "ts": 5}',
     "attribute 'n': integer 18446744073709551615 does not fit in 64 bits"),
    (orjson.dumps({**GOOD[0], "ts": "9999-12-31T00:00:00Z"}), "does not fit in 64 bits"),
    (b'{"kind": "A", "n": 1, "x": 1, "ok": true, "ts": 5, "pad": "' + b"x" * 100 + b'"}',
     "message of 161 bytes is over the limit of 100 bytes"),
]


@pytest.mark.parametrize("raw,reason", MESSAGE_CASES)
def test_bad_message_is_a_dead_letter_with_offset_and_bytes(raw, reason):
    from cep_core.json_batch import decode_messages

    ns = StreamSchema(SCHEMA.stream, SCHEMA.attributes, "ts", "ns", "kind", ("A", "B"))
    raws = [orjson.dumps(GOOD[0]), raw, orjson.dumps(GOOD[1])]
    decoded = decode_messages(raws, ns, np.array([10, 11, 12]), offsets=np.array([500, 501, 502]),
                              partition=4, source="events", max_bytes=100)
    assert decoded.table.column("seq").to_pylist() == [10, 12]  # processing continues
    assert decoded.rows.tolist() == [0, 2]
    [letter] = decoded.dead
    assert reason in letter.reason
    assert (letter.source, letter.position, letter.offset, letter.partition) == \
        ("events", 11, 501, 4)
    assert letter.raw == raw[:100]
    out = letter.to_json()
    assert (out["offset"], out["partition"]) == (501, 4)
    assert base64.b64decode(out.get("raw_base64", "")) == (b"" if "raw_base64" not in out
                                                          else raw[:100])


def test_dead_letter_keeps_bytes_that_are_not_utf8():
    letter = DeadLetter("events", 0, b"\xff{", "not valid JSON", offset=7)
    out = letter.to_json()
    assert base64.b64decode(out["raw_base64"]) == b"\xff{" and out["offset"] == 7
    assert "raw_base64" not in DeadLetter("f", 0, b"{", "x").to_json()


def test_decode_json_batch_keeps_its_signature():
    from cep_core.json_batch import decode_json_batch

    table, dead = decode_json_batch([orjson.dumps(GOOD[0]), b"{"], SCHEMA, np.array([0, 1]),
                                    "src")
    assert table.num_rows == 1 and [(d.position, d.offset) for d in dead] == [(1, None)]


def test_csv_integer_text_out_of_range_and_odd_digits(tmp_path):
    path = tmp_path / "e.csv"
    path.write_text("kind,n,x,ok,ts\nA,99999999999999999999,1,true,1\nA,+-5,1,true,2\n"
                    "A,²,1,true,3\n")
    events, dead = read_events(path, SCHEMA)
    assert events == []
    assert [d.reason for d in dead] == [
        "attribute 'n': integer 99999999999999999999 does not fit in 64 bits",
        "attribute 'n': expected int, got a string ('+-5')",
        "attribute 'n': expected int, got a string ('²')"]


# ------------------------------------------------------------------ lines of dead letters


def test_jsonl_dead_letters_name_the_line_editors_show(tmp_path):
    path = tmp_path / "e.jsonl"  # line 1 good, 2 blank, 3 bad, 4 whitespace, 5 bad, 6 good
    path.write_bytes(orjson.dumps(GOOD[0]) + b"\n\n{bad\n   \r\n" +
                     orjson.dumps({**GOOD[1], "n": None}) + b"\r\n" + orjson.dumps(GOOD[1]) +
                     b"\n")
    events, dead = read_events(path, SCHEMA)
    assert [e.seq for e in events] == [0, 3]  # seqs still count records, not lines
    assert [(d.line, d.position) for d in dead] == [(3, 1), (5, 2)]
    assert dead[1].reason == "null attribute 'n'"
    assert [d.where() for d in dead] == [f"{path}:3", f"{path}:5"]
    assert dead[0].to_json() == {"source": str(path), "line": 3, "position": 1,
                                 "reason": dead[0].reason, "raw": "{bad"}


def test_csv_dead_letters_name_physical_lines_header_counted(tmp_path):
    path = tmp_path / "e.csv"
    path.write_text(
        "kind,n,x,ok,ts\n"            # line 1: the header
        "A,1,1.5,true,1000\n"         # 2
        "\n"                          # 3: blank, skipped
        "A,x,1.0,true,3\n"            # 4: bad
        '"A\nB",1,1.0,true,5\n'       # 5-6: one record over two lines (unknown type)
        "A,1,1.0\n",                  # 7: too few fields
        newline="")
    events, dead = read_events(path, SCHEMA)
    assert [e.seq for e in events] == [0]
    assert [(d.line, d.position) for d in dead] == [(4, 1), (5, 2), (7, 3)]
    assert dead[1].reason.startswith("unknown event type 'A\nB'")


def test_parquet_and_json_array_dead_letters_have_no_line(tmp_path):
    path = tmp_path / "e.json"
    path.write_bytes(b"\n  " + orjson.dumps(GOOD + [{"kind": "A"}]))
    events, dead = read_events(path, SCHEMA)
    assert len(events) == 2 and [(d.line, d.position) for d in dead] == [(None, 2)]
    assert "line" not in dead[0].to_json() and dead[0].where() == f"{path}, record 2"
    parquet = tmp_path / "e.parquet"
    pq.write_table(pa.table({"kind": ["Z"], "n": [1], "x": [1.0], "ok": [True], "ts": [1]}),
                   parquet)
    _, [letter] = read_events(parquet, SCHEMA)
    assert letter.line is None and letter.position == 0


# ------------------------------------------------------------------ standard input


def _stdin(monkeypatch, data: bytes):
    stream = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    monkeypatch.setattr("sys.stdin", stream)
    return stream


def standard_input_data(fmt: str) -> bytes:
    """Two good events and a bad one between them (record 1), in `fmt`."""
    if fmt == "jsonl":
        return orjson.dumps(GOOD[0]) + b"\n\n{bad\n" + orjson.dumps(GOOD[1]) + b"\n"
    if fmt == "csv":
        return b"kind,n,x,ok,ts\nA,1,1.5,true,1000\nA,x,1,true,3\nB,2,2,false,2000\n"
    sink = io.BytesIO()
    pq.write_table(pa.table({"kind": ["A", "Z", "B"], "n": [1, 1, 2], "x": [1.5, 1, 2],
                             "ok": [True, True, False], "ts": [1000, 1, 2000]}), sink)
    return sink.getvalue()


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_read_events_from_standard_input(monkeypatch, tmp_path, fmt):
    stream = _stdin(monkeypatch, standard_input_data(fmt))
    events, [letter] = read_events("-", SCHEMA, fmt)
    assert [(e.seq, e.attrs["n"]) for e in events] == [(0, 1), (2, 2)]
    assert letter.source == "<stdin>" and letter.position == 1
    assert letter.line == {"jsonl": 3, "csv": 3, "parquet": None}[fmt]
    assert not stream.closed  # reading stdin leaves it open


def test_standard_input_needs_a_format_and_formats_are_checked(monkeypatch, tmp_path):
    _stdin(monkeypatch, b"")
    with pytest.raises(InputError, match="standard input has no file suffix"):
        read_events("-", SCHEMA)
    with pytest.raises(InputError, match="unknown event format 'xml'"):
        read_events("-", SCHEMA, "xml")
    path = write_jsonl(tmp_path / "e.txt", GOOD)  # a named format overrides the suffix
    events, dead = read_events(path, SCHEMA, "jsonl")
    assert len(events) == 2 and dead == []
