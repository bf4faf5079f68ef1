"""ISO-8601 times on the columnar path (cep_core/iso_times.py): every time
it converts is exactly what the record decoder (`datetime.fromisoformat`, naive = UTC,
floored to the stream's unit) gives, every text the decoder refuses is left to it (null),
and the usual spellings are all converted (else the fast path would be no path). Files
of ISO times, with fields beyond the schema, read exactly as the record reader reads them."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep_core.errors import EventError
from cep_core.event_io import _iso_to_units
from cep_core.iso_times import iso_times
from cep_core.schema import StreamSchema
from tests.test_event_io import SCHEMA
from tests.test_event_reader import assert_same, lines_file

UNITS = ("s", "ms", "us", "ns")


def decoder(text: str, unit: str) -> int | None:
    try:
        return _iso_to_units("ts", text, unit)
    except EventError:
        return None


def two(lo: int, hi: int):
    return st.integers(lo, hi).map(lambda v: f"{v:02d}")


@st.composite
def spellings(draw) -> str:
    """ISO-8601 times as users write them, valid or nearly so."""
    year = draw(st.sampled_from(["0000", "0001", "1969", "1970", "2024", "2026", "2262",
                                 "2263", "9999"]))
    month, day = draw(two(0, 13)), draw(two(0, 32))
    hour, minute, second = draw(two(0, 25)), draw(two(0, 60)), draw(two(0, 61))
    text = f"{year}-{month}-{day}"
    if draw(st.integers(0, 9)):
        text += f"{draw(st.sampled_from(['T', ' ', 't', '_']))}{hour}"
        if draw(st.integers(0, 9)):
            text += f":{minute}"
            if draw(st.integers(0, 5)):
                text += f":{second}"
    digits = draw(st.integers(0, 22))
    if digits:
        text += draw(st.sampled_from(".,:")) + "".join(draw(st.lists(
            st.sampled_from("0123456789"), min_size=digits, max_size=digits)))
    zone = draw(st.sampled_from(["", "Z", "z", "+00:00", "-00:00", "+02:00", "-05:30",
                                 "+23:59", "+24:00", "+0200", "-0530", "+2400", "+02",
                                 "+02:00:30", "+02:60", "Z ", "+2:00"]))
    text += zone
    if draw(st.integers(0, 9)) == 0:
        text = " " + text
    if draw(st.integers(0, 19)) == 0:
        text = text + draw(st.sampled_from([" ", "x", "\n"]))
    return text


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(spellings(), min_size=1, max_size=30), unit=st.sampled_from(UNITS))
def test_converted_times_are_the_record_decoders(texts, unit):
    got = iso_times(pa.array(texts), unit).to_pylist()
    for text, value in zip(texts, got):
        if value is not None:
            assert value == decoder(text, unit), text


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("text", [
    "2026-11-01T00:00:00Z", "2026-11-01T00:00:00.1Z", "2026-11-01T00:00:00.123456Z",
    "2026-11-01T00:00:00+02:00", "2026-11-01T00:00:00.5-05:30", "2026-11-01 12:00:00",
    "2026-11-01T12:00:00.25", "1969-12-31T23:59:59.999999Z", "2024-02-29T00:00:00Z",
    "2026-11-01T00:00:00.1234567Z", "2026-11-01T00:00:00.999999999-00:00",
    "2026-11-01T00:00:00+0200", "2026-11-01T00:00:00+02", "2200-12-31T23:59:59.5-23:59",
    "2026-11-01", "2026-11-01T10", "2026-11-01 10:30"])
def test_the_usual_spellings_take_the_fast_path(text, unit):
    assert iso_times(pa.array([text]), unit).to_pylist() == [decoder(text, unit)]
    assert decoder(text, unit) is not None


@pytest.mark.parametrize("text", [
    "2026-02-30T00:00:00Z", "0000-01-01T00:00:00", "2026-11-01T24:00:00", " 2026-11-01T00:00Z",
    "2026-11-01T00:00:00.Z", "2026-11-01T00:00:00+24:00", "2025-02-29T00:00:00",
    "2026-11-01T00:00:00z", "2026-11-01t00:00:00,5", "2026-11-01T00:00:00.1234567890Z",
    "2026-11-01T00:00:00 ", "3000-01-01T00:00:00.1234567Z", "yesterday", ""])
def test_others_are_left_to_the_record_decoder(text):
    assert iso_times(pa.array([text, "2026-11-01T00:00:00Z"]), "ms").to_pylist()[0] is None


def test_ticks_and_nulls():
    assert iso_times(pa.array(["2026-11-01T00:00:00Z"]), "ticks").to_pylist() == [None]
    assert iso_times(pa.array([None, "2026-11-01T00:00:00Z"], pa.string()), "s").to_pylist() \
        == [None, decoder("2026-11-01T00:00:00Z", "s")]
    assert iso_times(pa.array(["2263-01-01T00:00:00Z"]), "ns").to_pylist() == [None]


PLANT = StreamSchema(stream="plant", attributes={
    "device": "string", "temp": "float", "ts": "timestamp"}, time="ts", time_unit="ms")


def test_files_of_iso_times_read_as_the_record_reader_reads_them(tmp_path):
    lines = []
    zones = ["Z", "+02:00", "", "-05:30"]
    for i in range(300):
        lines.append({"device": f"dev-{i % 7}", "temp": 20.5 + i % 3,
                      "ts": f"2026-11-01T00:{i // 60:02d}:{i % 60:02d}.{i % 1000:03d}"
                            f"{zones[i % 4]}", "firmware": "1.2.3", "extra": {"a": [1]}})
    lines[17]["ts"] = "2026-02-30T00:00:00Z"  # a dead letter, the decoder's message
    lines[40]["ts"] = 1761955200000 + 40  # a number among texts
    lines[41]["ts"] = " 2026-11-01T00:00:41Z"  # a spelling left to the decoder
    lines[250]["ts"] = "2026-11-01T00:04:10.1234567Z"
    path = lines_file(tmp_path / "plant.jsonl", lines)
    events, dead = assert_same(path, PLANT, blocks=(200, 4000, 1 << 20))
    assert len(events) == 299 and [d.position for d in dead] == [17]


def test_things_with_iso_times_and_numbers(tmp_path):
    lines = [{"kind": "A", "n": i, "x": 0.5, "ok": True,
              "ts": f"2024-01-02T09:30:{i:02d}Z" if i % 5 else 1704187800000 + i * 1000}
             for i in range(60)]
    assert_same(lines_file(tmp_path / "mixed.jsonl", lines), SCHEMA)
