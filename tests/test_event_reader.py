"""The columnar reader against the record-at-a-time one: `read_table` must give exactly the
events and dead letters (reason, line, position, raw) of `read_events`, on every file.

Small blocks put block boundaries everywhere, so a bad record at a boundary, a block of
blank lines, a block that falls back to the slow path next to fast ones are all exercised.
"""

import io
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep_core.event_io import InputError, read_events
from cep_core.event_reader import events_from_table, read_table, row_json
from cep_core.json_batch import arrow_schema
from cep_core.schema import SchemaRegistry, StreamSchema
from cep_core.workloads import WORKLOADS, write_events
from tests.test_event_io import BAD_CASES, GOOD, MESSAGE_CASES, SCHEMA, standard_input_data

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = (1, 40, 200, 1 << 20)  # bytes: every line its own block ... the whole file


def typed(events):
    """Events with the type of every value, so that 1 == 1.0 == True do not pass."""
    return [(e.seq, e.ts, [(k, type(v), v) for k, v in e.attrs.items()]) for e in events]


def assert_same(path, schema, fmt=None, blocks=BLOCKS):
    try:
        events, dead = read_events(path, schema, fmt)
    except InputError as e:  # the file as a whole is unreadable: the same error
        for block_bytes in blocks:
            with pytest.raises(InputError) as raised:
                read_table(path, schema, fmt, block_bytes=block_bytes)
            assert str(raised.value) == str(e)
        return [], []
    for block_bytes in blocks:
        table, letters = read_table(path, schema, fmt, block_bytes=block_bytes)
        assert table.schema == arrow_schema(schema)
        assert typed(events_from_table(table, schema)) == typed(events), block_bytes
        assert letters == dead, block_bytes
    return events, dead


def lines_file(path, lines, end=b"\n"):
    path.write_bytes(b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + end
                              for line in lines))
    return path


# ------------------------------------------------------------------ JSON lines


@pytest.mark.parametrize("data", sorted((ROOT / "examples" / "data").glob("*.jsonl")),
                         ids=lambda p: p.name)
def test_example_data(data):
    schema = SchemaRegistry().get(data.stem)
    events, _ = assert_same(data, schema, blocks=(300, 1 << 20))
    assert events


@pytest.mark.parametrize("name", sorted(WORKLOADS))
@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_generated_workloads(tmp_path, name, fmt):
    workload = WORKLOADS[name]
    table = workload.generate(300, seed=3)
    path = tmp_path / f"events.{fmt}"
    if fmt == "csv":
        pcsv.write_csv(table, path, pcsv.WriteOptions(quoting_style="none"))
    else:
        write_events(table, path)
    events, dead = assert_same(path, workload.schema(), blocks=(500, 1 << 20))
    assert len(events) == 300 and dead == []


@pytest.mark.parametrize("bad", [b for b, _ in BAD_CASES] + [r for r, _ in MESSAGE_CASES])
def test_every_bad_record_of_the_record_reader(tmp_path, bad):
    line = bad if isinstance(bad, bytes) else orjson.dumps(bad)
    path = lines_file(tmp_path / "e.jsonl", [GOOD[0], GOOD[1], line, GOOD[0], GOOD[1]])
    events, _ = assert_same(path, SCHEMA)
    assert len(events) >= 4  # the good records around it still come through


ADVERSARIAL = {
    "blank and whitespace lines": [b"", GOOD[0], b"   ", b"\t", b"", GOOD[1], b" \r", b""],
    "form feed lines": [GOOD[0], b"\x0c", GOOD[1] | {"n": 3}, b"\x0b  "],
    "crlf": [orjson.dumps(GOOD[0]) + b"\r", orjson.dumps(GOOD[1]) + b"\r"],
    "bom": [b"\xef\xbb\xbf" + orjson.dumps(GOOD[0]), GOOD[1]],
    "bom inside a string": [GOOD[0] | {"kind": "\ufeffA"}, GOOD[1]],
    "seq on some lines": [GOOD[0], GOOD[1] | {"seq": 5}, GOOD[0], GOOD[1] | {"seq": 2},
                          GOOD[0] | {"seq": None}, GOOD[0] | {"seq": 9}, GOOD[1]],
    "seq going back": [GOOD[0] | {"seq": 5}, GOOD[1] | {"seq": 5}, GOOD[0] | {"seq": 4},
                       GOOD[1] | {"seq": 6}, GOOD[0] | {"seq": 3}, GOOD[1] | {"seq": 7}],
    "negative and odd seqs": [GOOD[0] | {"seq": -1}, GOOD[1] | {"seq": 1.0},
                              GOOD[0] | {"seq": ""}, GOOD[1] | {"seq": "7"}, GOOD[0]],
    "huge ints": [b'{"kind":"A","n":9223372036854775807,"x":1,"ok":true,"ts":1}',
                  b'{"kind":"A","n":9223372036854775808,"x":1,"ok":true,"ts":2}',
                  b'{"kind":"A","n":-9223372036854775808,"x":1,"ok":true,"ts":3}',
                  b'{"kind":"A","n":-9223372036854775809,"x":1,"ok":true,"ts":4}',
                  b'{"kind":"A","n":1,"x":123456789012345678901234567890,"ok":true,"ts":5}',
                  b'{"kind":"A","n":1,"x":18446744073709551617,"ok":true,"ts":6}',
                  b'{"kind":"A","n":1,"x":1,"ok":true,"ts":99999999999999999999}',
                  b'{"kind":"A","n":1,"x":1e308,"ok":true,"ts":7}',
                  b'{"kind":"A","n":1,"x":-0.0,"ok":true,"ts":8}',
                  b'{"kind":"A","n":-0,"x":5e-324,"ok":true,"ts":9}'],
    "nan-like": [b'{"kind":"A","n":1,"x":NaN,"ok":true,"ts":1}',
                 b'{"kind":"A","n":1,"x":Infinity,"ok":true,"ts":1}',
                 b'{"kind":"A","n":1,"x":-Inf,"ok":true,"ts":1}',
                 b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1,"extra":NaN}',
                 b'{"kind":"A","n":1,"x":1e400,"ok":true,"ts":1}',
                 GOOD[0] | {"kind": "NaN"}, GOOD[1]],
    "numbers beyond a double": [
        b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1,"extra":9e308}',
        b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1,"extra":' + b"9" * 400 + b"}",
        b'{"kind":"A","n":1,"x":' + b"9" * 400 + b',"ok":true,"ts":1}',
        b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1,"extra":-1' + b"0" * 250 + b".5E+99}",
        b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1,"extra":1e-400}', GOOD[1] | {"e": 1e300},
        GOOD[0]],
    "unicode": [GOOD[0] | {"kind": "\u00e9"}, GOOD[1] | {"extra": "\u65e5\u672c \U0001f600"},
                b'{"kind":"\\u0041","n":1,"x":1,"ok":true,"ts":1}',
                b'{"kind":"A\\u0000","n":1,"x":1,"ok":true,"ts":1}',
                b'{"kind":"\\ud800","n":1,"x":1,"ok":true,"ts":1}',
                b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1,"z":"\xff"}',
                b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1,"z":"\xc3"}', GOOD[1]],
    "json oddities": [b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1} {"kind":"B","n":1,"x":1,'
                      b'"ok":true,"ts":1}', b'{"kind":"A","kind":"B","n":1,"x":1,"ok":true,"ts":1}',
                      b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1,}', b"5", b'"A"', b"null",
                      b'{"kind":"A","n":01,"x":1,"ok":true,"ts":1}', b"[", b"{",
                      b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1}garbage',
                      b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1,"z":{"q":[1,{"r":null}]}}',
                      b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1,"z":"a\tb"}',
                      b'{"kind":["A"],"n":1,"x":1,"ok":true,"ts":1}', GOOD[1]],
    "deep nesting": [b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1,"z":' + b"[" * 1100 +
                     b"]" * 1100 + b"}", GOOD[0] | {"z": [[[[1]]]]}, GOOD[1]],
    "iso times": [GOOD[0] | {"ts": "2024-01-02T09:30:00Z"}, GOOD[1] | {"ts": "2024-01-02"},
                  GOOD[0] | {"ts": "0001-01-01T00:00:00+14:00"}, GOOD[1] | {"ts": "soon"}],
    "nulls and missing": [GOOD[0] | {"x": None}, {"kind": "A"}, {}, GOOD[1] | {"ok": None},
                          GOOD[0] | {"kind": None}, GOOD[1]],
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_lines(tmp_path, name):
    assert_same(lines_file(tmp_path / "e.jsonl", ADVERSARIAL[name]), SCHEMA)


def test_crlf_file_and_no_final_newline(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_bytes(b"\r\n".join(orjson.dumps(GOOD[i % 2] | {"n": i}) for i in range(20)))
    events, _ = assert_same(path, SCHEMA)
    assert len(events) == 20


def test_bad_record_at_every_block_boundary(tmp_path):
    lines = [GOOD[i % 2] | {"n": i} for i in range(30)]
    for at in range(0, 30, 7):
        lines[at] = b'{"kind": "A", "n": 1,'
    path = lines_file(tmp_path / "e.jsonl", lines)
    _, dead = assert_same(path, SCHEMA, blocks=range(1, 200, 13))
    assert [d.position for d in dead] == [0, 7, 14, 21, 28]


def test_fields_beyond_the_schema_from_some_block_on(tmp_path):
    """Blocks of the stream's fields alone are parsed strictly; from the first block with
    other fields on, those are ignored and NaN anywhere sends the block to orjson."""
    clean = [GOOD[i % 2] | {"n": i} for i in range(12)]
    lines = clean + [b'{"kind":"A","n":1,"x":NaN,"ok":true,"ts":1}'] + clean + [
        GOOD[0] | {"extra": 1}] + clean + [
        b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1,"extra":NaN}'] + clean + [
        b'{"kind":"A","n":1,"x":1,"ok":true,"ts":1,"extra":-Infinity}'] + clean
    _, dead = assert_same(lines_file(tmp_path / "e.jsonl", lines), SCHEMA,
                          blocks=(100, 600, 2000, 1 << 20))
    assert [d.position for d in dead] == [12, 38, 51]


@pytest.mark.parametrize("smallest,dense", [(256, 8192), (4, 16), (2, 0)])
def test_bad_records_scattered_through_big_blocks(tmp_path, monkeypatch, smallest, dense):
    """A refused block is halved down to a few lines: every bad record still gets its
    reason, line and position, and the seq check still sees every row."""
    import random

    from cep_core import event_reader

    monkeypatch.setattr(event_reader, "_SMALLEST_HALF", smallest)
    monkeypatch.setattr(event_reader, "_DENSE_BELOW", dense)

    bad = [line for lines in ADVERSARIAL.values() for line in lines] + [
        b for b, _ in BAD_CASES if isinstance(b, bytes)]
    rng = random.Random(7)
    lines = [GOOD[i % 2] | {"n": i} for i in range(3000)]
    for at in rng.sample(range(3000), 60):
        lines[at] = rng.choice(bad)
    path = lines_file(tmp_path / "e.jsonl", lines)
    events, dead = assert_same(path, SCHEMA, blocks=(1 << 20, 20_000, 3_000))
    assert len(events) > 2900 and len(dead) >= 20


def test_json_array_file(tmp_path):
    path = tmp_path / "e.json"
    path.write_bytes(b"\n \n  " + orjson.dumps(GOOD + [{"kind": "A"}, GOOD[0] | {"seq": 1}]))
    _, dead = assert_same(path, SCHEMA)
    assert [d.position for d in dead] == [2, 3]


def test_a_line_starting_with_a_bracket_later_is_a_record(tmp_path):
    assert_same(lines_file(tmp_path / "e.jsonl", [GOOD[0], b"[1, 2]", GOOD[1]]), SCHEMA)


def test_empty_and_blank_files(tmp_path):
    for data in (b"", b"\n\n  \n"):
        path = tmp_path / "e.jsonl"
        path.write_bytes(data)
        table, dead = read_table(path, SCHEMA)
        assert table.num_rows == 0 and dead == [] and read_events(path, SCHEMA) == ([], [])


fragments = st.sampled_from(
    [orjson.dumps(g) for g in GOOD] + [orjson.dumps(GOOD[0] | {"seq": s}) for s in (0, 3, 50)]
    + [line if isinstance(line, bytes) else orjson.dumps(line)
       for lines in ADVERSARIAL.values() for line in lines]
    + [b for b, _ in BAD_CASES if isinstance(b, bytes)] + [b"", b"  ", b"\r"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(lines=st.lists(fragments, max_size=25), block_bytes=st.integers(1, 400))
def test_any_mix_of_lines(tmp_path, lines, block_bytes):
    path = lines_file(tmp_path / "mix.jsonl", lines)
    assert_same(path, SCHEMA, blocks=(block_bytes,))


# ------------------------------------------------------------------ CSV


CSV_CASES = {
    "plain": "kind,n,x,ok,ts\nA,1,1.5,true,1000\nB,2,2,false,2000\n",
    "the record reader's test": (
        "kind,n,x,ok,ts\nA,1,1.5,true,1000\nB,2,2,FALSE,2024-01-02T09:30:00Z\nA,x,1.0,true,3\n"
        "A,1,1.0,maybe,3\nA,,1.0,true,3\nA,1,nan,true,3\nA,1,1.0\n\"B\",7,-0.5,True,4000\n"),
    "odd numbers": ("kind,n,x,ok,ts\nA,+1,1e5,true,1\nA, 2,1_000,true,2\nA,3 ,inf,true,3\n"
                    "A,99999999999999999999,1,true,4\nA,-0,-0.0,true,5\nA,007,.5,true,6\n"
                    "A,1,1e999,true,7\nA,1,5.,true,8\nA,1,1E-07,True,9\nA,²,1,true,10\n"
                    "A,1,0x10,true,11\nA,1,1,TRUE,12\nA,1,1, true,13\nA,1,١,true,14\n"
                    "A,-9223372036854775808,1,true,15\nA,9223372036854775807,1,true,16\n"),
    "long and dotted numbers": (  # the plain-number check's fast subset and its regex
        "kind,n,x,ok,ts\nA,123456789012345678,12345678901234567890,true,1\n"
        "A,1234567890123456789,123456789012345678901,true,2\nA,1,1.2.3,true,3\n"
        "A,1,12345678901234567890.5,true,4\nA,1,1.000000000000000000001,true,5\n"
        "A,1,-1.5,true,6\nA,1,0.5,true,7\nA,1,.,true,8\nA,1,1..2,true,9\n"),
    "hex and padded ints": (  # pyarrow reads 0x1f as 31 and trims blanks around numbers
        "seq,kind,n,x,ok,ts\n0,A,0x1f,1,true,1\n1,A,1,1,true,0X10\n0x2,A,1,1,true,2\n"
        "3,A, 5,2.5 ,true,3\n4,A,5\t,\t1,true,4\n5,A,1,1,true,5\n6,A,10x,1,true,6\n"),
    "empty fields": ("kind,n,x,ok,ts\n,1,1,true,1\nA,,1,true,2\nA,1,,true,3\nA,1,1,,4\n"
                     "A,1,1,true,\n"),
    "blank lines and crlf": "kind,n,x,ok,ts\r\n\r\nA,1,1,true,1\r\n\r\n\r\nB,2,2,false,2\r\n",
    "lone carriage returns": "kind,n,x,ok,ts\nA,1,1,true,1\rB,2,2,false,2\n",
    "field counts": "kind,n,x,ok,ts\nA,1,1,true,1,extra\nA,1\n \nA,1,1,true,2\n",
    "quotes": 'kind,n,x,ok,ts\n"A",1,1,true,1\n"A\nB",1,1,true,2\n"A,B",1,1,true,3\nB,1,1,true,4\n',
    "simple quotes": ('"kind","n","x","ok","ts"\n"A",1,1,true,1\r\n"B","2","2.5","false",2\n'
                      '"",1,1,true,3\n"A","","1","true",4\n"Z",1,1,true,5\n'),
    "quotes that are not simple": ('kind,n,x,ok,ts\n"A",1,1,true,1\n"A""B",1,1,true,2\n'
                                   'A"B,1,1,true,3\n"A"B,1,1,true,4\n"A" ,1,1,true,5\n'
                                   '"A,B",1,1,true,6\n" A",1,1,true,7\nB,1,1,true,8\n'),
    "seq column": "seq,kind,n,x,ok,ts\n3,A,1,1,true,1\n,B,1,1,false,2\n2,A,1,1,true,3\n"
                  "-1,A,1,1,true,4\nx,A,1,1,true,5\n 9,A,1,1,true,6\n10,B,1,1,true,7\n",
    "extra and reordered columns": "ts,other,ok,x,n,kind\n1,zz,true,1,1,A\n2,,false,2,2,B\n",
    "missing column": "kind,n,x,ts\nA,1,1,1\n",
    "header spaces": " kind , n,x ,ok,ts\nA,1,1,true,1\n",
    "bom": "\ufeffkind,n,x,ok,ts\nA,1,1,true,1\n",
    "unknown type and unicode": "kind,n,x,ok,ts\nZ,1,1,true,1\n\u00e9,1,1,true,2\nA,1,1,true,3\n",
    "duplicate header": "kind,n,x,ok,ts,n\nA,1,1,true,1,2\n",
    "header only": "kind,n,x,ok,ts\n",
    "blank header": "\nkind,n,x,ok,ts\nA,1,1,true,1\n",
    "quoted header": '"kind","n","x","ok",ts\nA,1,1,true,1\nB,2,2,false,2\n',
    "quoted commas and iso times": (  # as pyarrow writes users' data
        '"kind","n","x","ok","ts","agent"\n"A",1,1,true,"2024-01-02T09:30:00Z","a, b"\n'
        '"B",2,2.5,false,"2024-01-02 09:30:01.5+01:00","(KHTML, like Gecko)"\n'
        '"A",3,1,true,1704187802000,","\n"A",4,1,true,"2024-02-30T00:00:00",""\n'
        '"A",5,1,true,"2024-01-02T09:30:03.123456789",",,"\n'),
    "header over two lines": '"kind","n\n","x",ok,ts\nA,1,1,true,1\nB,2,2,false,2\n',
    "header with a lone carriage return": 'kind,n,"x\r",ok,ts\nA,1,1,true,1\n',
    "header with a quote inside a field": 'kind,n",x,ok,ts\nA,1,1,true,1\n',
    "quoted header field with a quote": '"kind","""n""",x,ok,ts\nA,1,1,true,1\n',
    "empty": "",
    "quoted strings and times": (  # the fast path reads them unquoted, where it can
        '"kind","n","x","ok","ts","other"\n"A",1,1,true,"2024-01-02T09:30:00Z",z\n'
        '"B",2,2.5,false,1704187801000,\n"\u00e9",3,1,true,"2024-01-02T09:30:02Z",p\n'
        '"",4,1,true,5,"q"\n"A",5,1,true,6,"p\nB,7,7,false,7,q"\n"A",8,1,true,8,z\n'
        '"A",9,"1",true,9,z\n"A,10,1,true,10,z\n"A""",11,1,true,11,z\nA",12,1,true,12,z\n'
        '"A",13,1,true,"14",z\n"B",14,1,true,15,z\n'),
}


@pytest.mark.parametrize("name", sorted(CSV_CASES))
def test_csv_cases(tmp_path, name):
    path = tmp_path / "e.csv"
    path.write_bytes(CSV_CASES[name].encode())
    assert_same(path, SCHEMA)


def test_csv_as_pyarrow_writes_it_with_bad_rows(tmp_path, monkeypatch):
    """Strings and ISO times quoted, as pyarrow (and Flink's, Spark's writers) quote them:
    read unquoted, without the quote scan that makes a quoted parse safe; the bad rows
    still go to the record decoder."""
    import cep_core.event_reader as reader

    n = 3000
    table = pa.table({
        "kind": pa.array(["A", "B", "C", "\u00e9"] * (n // 4)),
        "n": pa.array(range(n), pa.int64()),
        "x": pa.array([0.5 * i for i in range(n)]),
        "ok": pa.array([i % 3 == 0 for i in range(n)]),
        "ts": pa.array([f"2024-01-02T09:30:{i % 60:02d}.{i:06d}Z" for i in range(n)]),
        "other": pa.array(["x", "", None, "1.2.3"] * (n // 4)),  # a field not in the stream
    })
    path = tmp_path / "e.csv"
    pcsv.write_csv(table, path)
    scans = []
    simply_quoted = reader._simply_quoted
    monkeypatch.setattr(reader, "_simply_quoted",
                        lambda block: scans.append(block) or simply_quoted(block))
    events, dead = assert_same(path, SCHEMA, blocks=(4096, 1 << 20))
    assert len(events) + len(dead) == n and len(dead) >= n // 2  # "C", "é": no type
    assert scans == []  # every block of it read unquoted
    text = path.read_text()
    path.write_text(text + '"A, B",1,1,true,1\n' + text.split("\n", 1)[1])  # quoted comma
    assert_same(path, SCHEMA, blocks=(4096, 1 << 20))


def test_csv_invalid_utf8(tmp_path):
    path = tmp_path / "e.csv"
    path.write_bytes(b"kind,n,x,ok,ts\nA,1,1,true,1\n\xff,1,1,true,2\nB,1,1,true,3\n")
    assert_same(path, SCHEMA)


def test_csv_times_in_iso(tmp_path):
    schema = StreamSchema("s", {"v": "int", "ts": "timestamp"}, "ts", "us")
    path = tmp_path / "e.csv"
    path.write_text("v,ts\n1,2024-01-02T09:30:00.123456Z\n2,17\n3,+18\n4,2024-01-02\n")
    assert_same(path, schema)


# ------------------------------------------------------------------ Parquet


def test_parquet_with_bad_rows_and_seqs(tmp_path):
    path = tmp_path / "e.parquet"
    pq.write_table(pa.table({
        "seq": pa.array([0, 5, None, 4, 9, -1, 12], pa.int64()),
        "kind": ["A", "B", "C", "A", "A", "B", None],
        "n": pa.array([1, 2, 3, None, 5, 6, 7], pa.int64()),
        "x": [1.5, 2.0, 3.0, 4.0, float("nan"), 1.0, 2.0],
        "ok": [True, False, True, True, False, True, True],
        "ts": pa.array([1000, 2000, 3000, 4000, 5000, 6000, 7000], pa.int64()),
        "extra": ["a"] * 7,
    }), path, row_group_size=3)
    _, dead = assert_same(path, SCHEMA)
    assert len(dead) == 5


def test_parquet_timestamps_and_strings_as_dictionary(tmp_path):
    schema = StreamSchema("s", {"name": "string", "ts": "timestamp"}, "ts", "ms")
    path = tmp_path / "e.parquet"
    pq.write_table(pa.table({"name": pa.array(["a", "b", "a"]).dictionary_encode(),
                             "ts": pa.array([1, 2, 3], pa.timestamp("us"))}), path)
    assert_same(path, schema)


def test_blocks_as_read(tmp_path):
    from cep_core.event_reader import read_blocks

    path = tmp_path / "e.csv"
    path.write_text("kind,n,x,ok,ts\n" + "".join(f"A,{i},1,true,{i}\n" for i in range(100))
                    + "A,x,1,true,100\n" + "A,7,1,true,1\n" * 2)
    blocks = list(read_blocks(path, SCHEMA, block_bytes=200))
    assert len(blocks) > 5
    table, dead = read_table(path, SCHEMA)
    assert pa.concat_tables([t for t, _ in blocks]).equals(table)
    assert [letter for _, letters in blocks for letter in letters] == dead and len(dead) == 1


def test_unreadable_inputs_raise_as_before(tmp_path):
    (tmp_path / "e.parquet").write_bytes(b"not parquet")
    for path in (tmp_path / "e.parquet", tmp_path / "absent.jsonl", tmp_path / "e.xml"):
        with pytest.raises(InputError) as old:
            read_events(path, SCHEMA)
        with pytest.raises(InputError) as new:
            read_table(path, SCHEMA)
        assert str(new.value) == str(old.value)


# ------------------------------------------------------------------ standard input


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_standard_input(monkeypatch, fmt):
    data = standard_input_data(fmt)
    results = []
    for read in (read_events, read_table):
        stream = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
        monkeypatch.setattr("sys.stdin", stream)
        results.append(read("-", SCHEMA, fmt))
        assert not stream.closed
    (events, dead), (table, letters) = results
    assert typed(events_from_table(table, SCHEMA)) == typed(events) and letters == dead
    assert dead[0].source == "<stdin>"


def test_row_json_is_the_events_json(tmp_path):
    path = lines_file(tmp_path / "e.jsonl", [GOOD[0], GOOD[1] | {"seq": 7}])
    table, _ = read_table(path, SCHEMA)
    events, _ = read_events(path, SCHEMA)
    assert [row_json(table, i) for i in range(2)] == [orjson.dumps(e.to_json())
                                                       for e in events]


# ------------------------------------------------------------------ Kafka batches


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(raws=st.lists(fragments | st.sampled_from([b'{"kind":"A",\n"n":1}', b"\xff"]),
                     max_size=25))
def test_kafka_batches_through_the_block_parser(monkeypatch, raws):
    """json_batch parses big batches with this reader's parser: the same table and dead
    letters as message by message."""
    import numpy as np

    from cep_core import json_batch

    monkeypatch.setattr(json_batch, "COLUMNAR_FROM", 1)
    positions = np.arange(100, 100 + len(raws), dtype=np.int64)
    offsets = positions * 3
    got = json_batch.decode_messages(raws, SCHEMA, positions, offsets=offsets, partition=2,
                                     max_bytes=None)
    want = json_batch._slow(raws, SCHEMA, positions, offsets, 2, "source", None)
    assert got.table.to_pylist() == want.table.to_pylist()
    assert got.table.schema == want.table.schema
    assert got.rows.tolist() == want.rows.tolist() and got.dead == want.dead


def test_a_big_clean_kafka_batch_takes_the_block_parser(monkeypatch):
    import numpy as np

    from cep_core import event_reader, json_batch

    calls = []
    parse = event_reader.json_messages_table
    monkeypatch.setattr(event_reader, "json_messages_table",
                        lambda *a: calls.append(parse(*a)) or calls[-1])
    raws = [orjson.dumps(GOOD[i % 2] | {"n": i}) for i in range(json_batch.COLUMNAR_FROM)]
    decoded = json_batch.decode_messages(raws, SCHEMA, np.arange(len(raws)))
    assert calls and calls[0] is not None and decoded.table.equals(calls[0])
    assert decoded.table.column("n").to_pylist() == list(range(len(raws)))


# ------------------------------------------------------------------ a block at a time


LATE_SEQ = 285  # the second file starts with a seq below the first file's last one


def _messy_lines() -> list[bytes]:
    """Good records with seqs, bad ones among them, and seqs going back."""
    lines = []
    for i in range(60):
        record = {"seq": 10 * i, **GOOD[i % 2], "n": i}
        if i % 7 == 3:
            record["seq"] = 10 * i - 25  # below the one before: rejected
        lines.append(orjson.dumps(record))
        if i % 11 == 5:
            lines.append(b'{"kind": "A", "n": 1,')  # not JSON
        if i % 13 == 4:
            lines.append(orjson.dumps({**GOOD[0], "n": None}))
    return lines


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
@pytest.mark.parametrize("block_bytes", [60, 1 << 20])
def test_iter_tables_a_file_cut_in_two_is_the_whole_file(tmp_path, fmt, block_bytes):
    """Two files read in turn with `iter_tables` (positions going on, seqs checked
    against the first file's) give what `read_table` gives for the whole file."""
    from cep_core.event_reader import iter_tables

    whole = lines_file(tmp_path / "whole.jsonl", _messy_lines())
    if fmt != "jsonl":  # the well-formed records (seqs going back among them)
        records = []
        for line in _messy_lines():
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if None not in record.values():
                records.append({**record, "x": float(record["x"])})
        table = pa.Table.from_pylist(records)
        whole = tmp_path / f"whole.{fmt}"
        if fmt == "csv":
            pcsv.write_csv(table, whole, pcsv.WriteOptions(quoting_style="none"))
        else:
            pq.write_table(table, whole)
    expected, expected_dead = read_table(whole, SCHEMA, block_bytes=block_bytes)
    if fmt == "parquet":
        full = pq.read_table(whole)
        cut = full.column("seq").to_pylist().index(LATE_SEQ)
        halves = [full.slice(0, cut), full.slice(cut)]
        parts = []
        for i, half in enumerate(halves):
            parts.append(tmp_path / f"part{i}.parquet")
            pq.write_table(half, parts[-1])
    else:
        text = whole.read_bytes().splitlines(keepends=True)
        head = text[:1] if fmt == "csv" else []
        cut = next(i for i, line in enumerate(text)
                   if line.startswith(b"%d," % LATE_SEQ) or b'"seq":%d,' % LATE_SEQ in line)
        parts = [tmp_path / f"part0.{fmt}", tmp_path / f"part1.{fmt}"]
        parts[0].write_bytes(b"".join(text[:cut]))
        parts[1].write_bytes(b"".join(head + text[cut:]))
    tables, dead, position, prev_max = [], [], 0, -1
    for part in parts:
        records = 0
        with part.open("rb") as f:
            for table, letters in iter_tables(f, SCHEMA, fmt, str(whole),
                                              first_position=position, prev_max=prev_max,
                                              block_bytes=block_bytes):
                tables.append(table)
                dead.extend(letters)
                records += table.num_rows + len(letters)
                if table.num_rows:
                    prev_max = max(prev_max, pc.max(table.column("seq")).as_py())
        position += records
    got = pa.concat_tables(tables)
    assert got.equals(expected)
    assert [(d.position, d.reason, d.raw) for d in dead] == \
        [(d.position, d.reason, d.raw) for d in expected_dead]
    assert len(expected_dead) >= 8
