"""Users' data on the columnar path (issue 31): the realistic workloads (ISO-8601 times in
several spellings, fields and nested objects the schema does not name, nulls, long strings)
read by `read_table` exactly as `read_events` reads them, and without a record decoded one
by one; hostile lines (hypothesis: drawn times, drawn fields beside the schema's) read alike
too; the splitter's batches of such messages take the block parser."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep_core import event_reader, json_batch
from cep_core.event_reader import read_table
from cep_core.workloads import WORKLOADS, write_events
from tests.test_event_reader import assert_same
from tests.test_iso_times import spellings

REALISTIC = ["iot", "activity", "clicks"]
EVENTS = 3000  # three runs of the iot file's time spellings per block of 1 MiB


def no_record_decoding(monkeypatch) -> None:
    """Make any record the columnar reader would decode one by one fail the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a record left the columnar path")

    monkeypatch.setattr(event_reader, "decode_record", refuse)
    monkeypatch.setattr(event_reader, "decode_records", refuse)


@pytest.mark.parametrize("name", REALISTIC)
@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_realistic_workloads_read_as_the_record_reader_reads_them(tmp_path, name, fmt):
    workload = WORKLOADS[name]
    path = write_events(workload.written(EVENTS, seed=5), tmp_path / f"events.{fmt}")
    events, dead = assert_same(path, workload.schema(), blocks=(30_000, 1 << 20))
    assert len(events) == EVENTS and not dead


@pytest.mark.parametrize("name", REALISTIC)
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_realistic_workloads_stay_on_the_columnar_path(tmp_path, monkeypatch, name, fmt):
    workload = WORKLOADS[name]
    written = workload.written(EVENTS, seed=6)
    path = write_events(written, tmp_path / f"events.{fmt}")
    no_record_decoding(monkeypatch)
    table, dead = read_table(path, workload.schema())
    assert table.num_rows == EVENTS and not dead
    assert table.column("ts").to_pylist() == workload.generate(EVENTS, seed=6).column(
        "ts").to_pylist()  # the times as generated, whatever their spelling


def test_the_user_file_of_the_issue(tmp_path, monkeypatch):
    """The issue's line: an event type, ISO times with a Z and 6 decimals, a field the
    schema does not name."""
    line = {"device": "dev-008", "zone": "zone-3", "kind": "reading", "temp": 20.67,
            "humidity": 28.3, "ts": "2026-11-01T00:00:00.100000Z", "firmware": "1.2.3"}
    path = tmp_path / "plant.jsonl"
    path.write_bytes(b"".join(orjson.dumps(line | {"temp": 20 + i / 100}) + b"\n"
                              for i in range(5000)))
    schema = WORKLOADS["iot"].schema()
    assert_same(path, schema, blocks=(1 << 20,))
    no_record_decoding(monkeypatch)
    table, dead = read_table(path, schema)
    assert table.num_rows == 5000 and not dead
    assert set(table.column("ts").to_pylist()) == {1_793_491_200_100}


# Values of fields beside the schema's: what orjson refuses and pyarrow takes (NaN,
# infinities, numbers beyond a double, deep nesting), what only looks like it (inside
# strings), nulls, objects, and values that change type from line to line.
EXTRA = [b"NaN", b"-Infinity", b"Infinity", b"1e400", b"10e308", b"1" * 320, b"2e308",
         b'"NaN"', b'"15E148"', b'"Infinity and 1e999"', b"1.5e300", b"-0", b"null", b"true",
         b'{"a":[1,2,{"b":null}],"c":"x\\"y"}', b"[" * 1100 + b"]" * 1100, b"[]", b"{}",
         b'"2026-11-01T00:00:00Z"', b"12345678901234567890123", b'"a\\\\"', b"[1,\"two\"]"]
FIELDS = ["firmware", "meta", "note", "x"]


@st.composite
def usual_times(draw) -> str:
    """ISO-8601 times as programs write them: valid, in the usual spellings."""
    when = draw(st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1)))
    text = when.isoformat(sep=draw(st.sampled_from("T ")), timespec=draw(st.sampled_from(
        ["seconds", "milliseconds", "microseconds"])))
    if draw(st.booleans()) and "." in text:
        text += "123"  # nanoseconds
    return text + draw(st.sampled_from(["Z", "+02:00", "", "-0530", "+00:00"]))


@st.composite
def plant_lines(draw) -> bytes:
    """One line of the plant stream as users write it, or nearly: a drawn time (an ISO
    spelling, an integer, a number), drawn fields beside the schema's, sometimes a null or
    an unknown event type."""
    record = {"device": f"dev-{draw(st.integers(0, 9))}", "zone": "zone-1",
              "kind": draw(st.sampled_from(["reading"] * 6 + ["alarm", "boiler"])),
              "temp": draw(st.sampled_from([20.5, 21, -3.25] * 3 + [None])), "humidity": 40.0}
    text = orjson.dumps(record)[:-1]
    time = draw(st.one_of(usual_times().map(orjson.dumps), usual_times().map(orjson.dumps),
                          spellings().map(orjson.dumps),
                          st.integers(1_700_000_000_000, 1_800_000_000_000).map(
                              lambda v: str(v).encode()),
                          st.just(b"1.7e12")))
    text += b',"ts":' + time
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3, unique=True)):
        value = draw(st.one_of(st.sampled_from(EXTRA),
                               st.floats(allow_nan=False).map(orjson.dumps),
                               st.text(max_size=8).map(orjson.dumps)))
        text += b',"' + name.encode() + b'":' + value
    return text + b"}"


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lines=st.lists(plant_lines(), min_size=1, max_size=40), spread=st.integers(1, 3))
def test_drawn_times_and_fields(tmp_path, lines, spread):
    """Many copies of a few lines, so that a block holds hundreds of rows (pyarrow's
    paths) around the drawn ones."""
    good = orjson.dumps({"device": "dev-1", "zone": "zone-1", "kind": "reading", "temp": 1.0,
                         "humidity": 2.0, "ts": "2026-11-01T00:00:00.5Z", "firmware": "x"})
    path = tmp_path / "plant.jsonl"
    path.write_bytes(b"".join(line + b"\n" + (good + b"\n") * (50 * spread)
                              for line in lines))
    assert_same(path, WORKLOADS["iot"].schema(), blocks=(2000, 1 << 20))


@pytest.mark.parametrize("name", REALISTIC)
def test_the_splitters_batches_take_the_block_parser(tmp_path, monkeypatch, name):
    workload = WORKLOADS[name]
    path = write_events(workload.written(json_batch.COLUMNAR_FROM, seed=7),
                        tmp_path / "events.jsonl")
    raws = path.read_bytes().splitlines()
    table, _ = read_table(path, workload.schema())
    monkeypatch.setattr(json_batch, "_slow", None)  # the message-by-message decoder
    monkeypatch.setattr(json_batch, "_fast_columns", None)
    decoded = json_batch.decode_messages(raws, workload.schema(), np.arange(len(raws)))
    assert decoded.table.equals(table) and not decoded.dead


@pytest.mark.parametrize("name", REALISTIC)
def test_small_batches_take_the_column_path(tmp_path, monkeypatch, name):
    """Under COLUMNAR_FROM messages the splitter reads orjson's records a column at a time:
    ISO-8601 times and fields beside the schema's do not send a batch record by record."""
    workload = WORKLOADS[name]
    path = write_events(workload.written(500, seed=8), tmp_path / "events.jsonl")
    raws = path.read_bytes().splitlines()
    table, _ = read_table(path, workload.schema())
    monkeypatch.setattr(json_batch, "_slow", None)
    decoded = json_batch.decode_messages(raws, workload.schema(), np.arange(len(raws)))
    assert decoded.table.equals(table) and not decoded.dead


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(plant_lines(), min_size=1, max_size=30))
def test_small_batches_of_drawn_lines_decode_as_message_by_message(lines):
    schema = WORKLOADS["iot"].schema()
    positions = np.arange(len(lines), dtype=np.int64)
    got = json_batch.decode_messages(lines, schema, positions)
    want = json_batch._slow(lines, schema, positions, None, None, "source",
                            json_batch.DEFAULT_MAX_MESSAGE_BYTES)
    assert got.table.to_pylist() == want.table.to_pylist()
    assert got.rows.tolist() == want.rows.tolist() and got.dead == want.dead


@settings(max_examples=60, deadline=None)
@given(times=st.lists(st.one_of(spellings(), usual_times()), min_size=1, max_size=20))
def test_small_batches_of_drawn_times_decode_as_message_by_message(times):
    schema = WORKLOADS["iot"].schema()
    lines = [orjson.dumps({"device": "dev-1", "zone": "zone-1", "kind": "reading",
                           "temp": 20.5, "humidity": 40.0, "ts": text, "firmware": "1.2"})
             for text in times]
    positions = np.arange(len(lines), dtype=np.int64)
    got = json_batch.decode_messages(lines, schema, positions)
    want = json_batch._slow(lines, schema, positions, None, None, "source",
                            json_batch.DEFAULT_MAX_MESSAGE_BYTES)
    assert got.table.to_pylist() == want.table.to_pylist() and got.dead == want.dead


def test_reading_users_data_imports_no_pandas(tmp_path):
    """pyarrow imports pandas for a Python value in a compute call (0.8 s of a process's
    first read): ISO times, fields beside the schema's and CSV read without it."""
    import subprocess
    import sys

    files = []
    for name, fmt in (("iot", "jsonl"), ("clicks", "jsonl"), ("activity", "csv")):
        path = write_events(WORKLOADS[name].written(300, seed=9), tmp_path / f"{name}.{fmt}")
        files.append((name, str(path)))
    code = (f"import sys\nfrom cep_core.event_reader import read_table\n"
            f"from cep_core.workloads import WORKLOADS\n"
            f"for name, path in {files!r}:\n"
            f"    table, dead = read_table(path, WORKLOADS[name].schema())\n"
            f"    assert table.num_rows == 300 and not dead\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parent.parent)
    assert done.stdout.strip() == "[]"
