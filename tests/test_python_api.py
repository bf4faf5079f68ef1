"""The Python API (`import cep_core as cep`, docs/python.md): every kind of input gives the
composite events and dead letters of `cep run`; streams pushed batch by batch, with a
snapshot and a restore on the way, give those of one run; errors carry line and column."""

import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

import cep_core as cep
from cep_core.composite import sort_key
from cep_core.composites import read_table as composite_dicts
from cep_core.event_reader import read_table
from cep_core.schema import SchemaError, StreamSchema
from cep_core.testing import assert_engines_agree, run_query
from tests.test_cli import RISE, cep as cep_cli, trade
from tests.test_run_table import rejecting_file

ROOT = Path(__file__).resolve().parent.parent
FINANCE = (ROOT / "examples" / "finance.cep").read_text()
TRADES = ROOT / "examples" / "data" / "trades.jsonl"
TRADES_SCHEMA = {"symbol": "string", "price": "int", "volume": "int", "ts": "timestamp",
                 "seqNum": "int"}


def cep_run(query_text: str, events: Path, tmp_path, engine: str = "jit"):
    """What `cep run` writes: composite dicts, dead letters as JSON."""
    query = tmp_path / "q.cep"
    query.write_text(query_text)
    dead = tmp_path / "dead.jsonl"
    done = cep_cli("run", query, "--events", events, "--engine", engine,
                   "--dead-letters", dead)
    assert done.returncode == 0, done.stderr
    return ([orjson.loads(line) for line in done.stdout.splitlines()],
            [orjson.loads(line) for line in dead.read_bytes().splitlines()])


@pytest.fixture(scope="module")
def finance():
    return cep.compile(FINANCE)


@pytest.fixture(scope="module")
def trades_table(finance):
    table, dead = read_table(TRADES, finance.schema)
    assert not dead
    return table.drop(["seq"])


@pytest.fixture(scope="module")
def expected(finance, tmp_path_factory):
    composites, dead = cep_run(FINANCE, TRADES, tmp_path_factory.mktemp("cep_run"))
    assert len(composites) > 100 and not dead
    return composites


def test_import_loads_neither_numba_nor_pyarrow():
    code = ("import sys, cep_core as cep; cep.compile; "
            "print(sorted(m for m in ('numba', 'pyarrow') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]"


# ------------------------------------------------------------------ inputs


def test_a_path_gives_what_cep_run_gives(finance, expected):
    assert finance.run(TRADES).to_dicts() == expected
    assert finance.run(str(TRADES), engine="reference").to_dicts() == expected


def test_parquet_and_csv_paths(finance, trades_table, expected, tmp_path):
    pq.write_table(trades_table, tmp_path / "t.parquet")
    pcsv.write_csv(trades_table, tmp_path / "t.csv")
    assert finance.run(tmp_path / "t.parquet").to_dicts() == expected
    assert finance.run(tmp_path / "t.csv").to_dicts() == expected


def test_arrow_pandas_and_dicts(finance, trades_table, expected):
    assert finance.run(trades_table).to_dicts() == expected
    assert finance.run(trades_table.to_batches()[0].slice(0)).to_dicts() == \
        finance.run(trades_table.slice(0, trades_table.to_batches()[0].num_rows)).to_dicts()
    assert finance.run(trades_table.to_pandas()).to_dicts() == expected
    assert finance.run(trades_table.to_pylist()).to_dicts() == expected
    assert finance.run(iter(trades_table.to_pylist()), engine="reference").to_dicts() == \
        expected


def test_pandas_datetime_column_is_the_time(finance, trades_table, expected):
    frame = trades_table.to_pandas()
    import pandas as pd

    frame["ts"] = pd.to_datetime(frame["ts"], unit="ms")
    assert finance.run(frame).to_dicts() == expected


@pytest.mark.parametrize("placement", ["cpu", "auto"])
def test_placement_on_a_machine_without_gpu(finance, expected, placement):
    assert finance.run(TRADES, placement=placement).to_dicts() == expected
    stream = finance.stream(placement=placement)
    assert in_output_order(finance, [stream.push(TRADES), stream.flush()]) == expected


def test_unknown_engine_or_placement(finance):
    with pytest.raises(ValueError, match="engine must be one of reference, jit"):
        finance.run(TRADES, engine="fast")
    with pytest.raises(ValueError, match="placement must be one of cpu, gpu, auto"):
        finance.stream(placement="tpu")


def test_result_is_a_table_of_composites(finance, expected):
    result = finance.run(TRADES)
    assert isinstance(result.table, pa.Table)
    assert result.table.num_rows == len(result) == len(expected)
    assert composite_dicts(result.table) == expected
    assert result.events == 1200 and result.dead_letters == []
    assert list(result.to_pandas()["query"]) == [c["query"] for c in expected]


def test_anything_with_to_arrow_is_a_table(finance, trades_table, expected):
    class PolarsLike:
        def to_arrow(self):
            return trades_table

    assert finance.run(PolarsLike()).to_dicts() == expected


# ------------------------------------------------------------------ dead letters


def test_dead_letters_of_a_file_are_those_of_cep_run(tmp_path):
    path = rejecting_file(tmp_path)
    composites, dead = cep_run(RISE, path, tmp_path)
    for engine in ("jit", "reference"):
        result = cep.compile(RISE).run(path, engine=engine)
        assert result.to_dicts() == composites
        assert [d.to_json() for d in result.dead_letters] == dead
    reasons = [d["reason"] for d in dead]
    assert any("expected int" in r for r in reasons) and len(dead) == 3
    table = cep.compile(RISE).run(path).dead_letters_table()
    assert table.column("reason").to_pylist() == reasons
    assert table.column("line").to_pylist() == [d.get("line") for d in dead]


def test_dead_letters_of_dicts_and_frames():
    rows = [trade("A", 1, 10), {"symbol": "A", "price": None, "volume": 1, "ts": 11,
                                "seqNum": 0}, trade("A", 3, 12), "not an event"]
    result = cep.compile(RISE).run(rows)
    assert [(d.position, d.reason) for d in result.dead_letters] == [
        (1, "null attribute 'price'"), (3, "not a JSON object")]
    assert result.to_dicts() == [{"query": "up", "key": "A", "seq": 2, "start_seq": 0,
                                  "symbol": "A", "gain": 2}]
    import pandas as pd

    frame = pd.DataFrame(rows[:3])
    from_frame = cep.compile(RISE).run(frame)
    assert [(d.position, d.reason) for d in from_frame.dead_letters] == [
        (1, "null attribute 'price'")]
    assert from_frame.to_dicts() == result.to_dicts()


# ------------------------------------------------------------------ schemas


@pytest.mark.parametrize("schema", [
    TRADES_SCHEMA,
    {"stream": "trades", "attributes": TRADES_SCHEMA, "time": "ts"},
    {"attributes": TRADES_SCHEMA, "time": "ts"},
    StreamSchema("trades", TRADES_SCHEMA, "ts"),
    {"title": "trades", "type": "object", "required": list(TRADES_SCHEMA), "properties": {
        "symbol": {"type": "string"}, "price": {"type": "integer"},
        "volume": {"type": "integer"}, "ts": {"type": "string", "format": "date-time"},
        "seqNum": {"type": "integer"}}},
    pa.schema([("symbol", pa.string()), ("price", pa.int64()), ("volume", pa.int32()),
               ("ts", pa.timestamp("ms")), ("seqNum", pa.int64())]),
], ids=["attributes", "schema-file-format", "unnamed", "StreamSchema", "json-schema",
        "arrow"])
def test_every_kind_of_schema(schema, expected):
    queries = cep.compile(FINANCE, schema)
    assert queries.schema.attributes == TRADES_SCHEMA and queries.schema.time == "ts"
    assert queries.run(TRADES).to_dicts() == expected


def test_schema_from_a_file_and_a_renamed_stream(tmp_path, finance, trades_table):
    path = tmp_path / "ticks_of_mine.json"
    path.write_bytes(orjson.dumps({"stream": "mine", "attributes": TRADES_SCHEMA,
                                   "time": "ts"}))
    mine = cep.compile(FINANCE.replace("trades", "mine"), path)
    assert mine.schema.stream == "mine"
    assert [c["seq"] for c in mine.run(trades_table).to_dicts()] == \
        [c["seq"] for c in finance.run(trades_table).to_dicts()]


def test_categorical_columns(trades_table, expected):
    frame = trades_table.to_pandas()
    frame["symbol"] = frame["symbol"].astype("category")
    schema = pa.Table.from_pandas(frame, preserve_index=False).schema
    assert pa.types.is_dictionary(schema.field("symbol").type)
    queries = cep.compile(FINANCE, schema)
    assert queries.schema.attributes["symbol"] == "string"
    assert queries.run(frame).to_dicts() == expected


def test_schema_inferred_from_a_table_needs_a_time(trades_table):
    with pytest.raises(SchemaError, match="time=NAME"):
        cep.compile(FINANCE, trades_table.rename_columns(
            ["symbol", "price", "volume", "when", "seqNum"]))
    renamed = trades_table.rename_columns(["symbol", "price", "volume", "when", "seqNum"])
    queries = cep.compile(FINANCE.replace("trades", "t2"), renamed, time="when")
    assert queries.schema.time == "when" and queries.schema.attributes["when"] == "int"


# ------------------------------------------------------------------ errors


def test_query_error_has_line_and_column():
    text = "QUERY up FROM trades\nPARTITION BY symbl\nPATTERN (a) DEFINE a AS TRUE;\n"
    with pytest.raises(cep.QueryError) as caught:
        cep.compile(text)
    error = caught.value
    assert (error.line, error.column) == (2, 14)
    assert error.source_line == "PARTITION BY symbl"
    assert "did you mean 'symbol'" in error.message
    assert str(error).endswith("PARTITION BY symbl\n                 ^")


def test_every_error_and_syntax_errors():
    text = ("QUERY a FROM trades PATTERN (x) DEFINE x AS nope > 1;\n"
            "QUERY b FROM trades PATTERN (x) DEFINE x AS price > 'z';\n")
    with pytest.raises(cep.QueryError) as caught:
        cep.compile(text)
    assert [e.line for e in caught.value.errors] == [1, 2]
    with pytest.raises(cep.QueryError) as caught:
        cep.compile("QUERY a FROM trades\n  PATTERN (x DEFINE x AS TRUE;")
    assert caught.value.line == 2 and caught.value.source_line is not None


# ------------------------------------------------------------------ streams


def in_output_order(queries, tables) -> list[dict]:
    index = {q.name: q.index for q in queries.queries}
    rows = [c for t in tables for c in composite_dicts(t)]
    return sorted(rows, key=lambda c: sort_key(c, index[c["query"]]))


@pytest.mark.parametrize("size", [1, 97, 5000])
def test_pushed_batches_give_one_run(finance, trades_table, expected, size):
    stream = finance.stream()
    pushed = [stream.push(trades_table.slice(i, size))
              for i in range(0, trades_table.num_rows, size)]
    pushed.append(stream.flush())
    assert in_output_order(finance, pushed) == expected
    assert stream.dead_letters == []


def test_snapshot_and_restore_in_the_middle(finance, trades_table, expected):
    first = finance.stream()
    pushed = [first.push(trades_table.slice(0, 500)), first.push(trades_table.slice(500, 200))]
    snapshot = first.snapshot()
    second = finance.stream()
    second.restore(snapshot)
    rest = [second.push(trades_table.slice(700).to_pylist()), second.flush()]
    assert in_output_order(finance, pushed + rest) == expected
    more = [first.push(trades_table.slice(700)), first.flush()]  # the original goes on too
    assert in_output_order(finance, more) == in_output_order(finance, rest)


def test_a_stream_checks_seqs_across_pushes(tmp_path):
    rows = [{**trade("A", p, s), "seq": s} for p, s in [(1, 5), (2, 6), (3, 6), (1, 7),
                                                        (4, 8)]]
    stream = cep.compile(RISE).stream()
    pushed = [stream.push(rows[:2]), stream.push(rows[2:]), stream.flush()]
    assert [(d.position, d.reason) for d in stream.dead_letters] == [
        (2, "seq 6 does not increase (previous seq 6)")]
    assert orjson.loads(stream.dead_letters[0].raw)["price"] == 3
    taken = stream.take_dead_letters()
    assert stream.dead_letters == [] and len(taken) == 1
    stream.dead_letters = taken
    one_run = cep.compile(RISE).run(rows)
    assert [(d.position, d.reason) for d in one_run.dead_letters] == \
        [(d.position, d.reason) for d in stream.dead_letters]
    assert [c["seq"] for c in one_run.to_dicts()] == [6, 8]
    assert in_output_order(cep.compile(RISE), pushed) == one_run.to_dicts()


def test_a_stream_keeps_rejected_events(tmp_path):
    path = rejecting_file(tmp_path)
    _, dead = cep_run(RISE, path, tmp_path)
    stream = cep.compile(RISE).stream()
    for line in path.read_bytes().splitlines():
        stream.push([orjson.loads(line)])
    stream.flush()
    got = [(d.position, d.reason, orjson.loads(d.raw)) for d in stream.dead_letters]
    assert sorted(got, key=str) == sorted(
        [(d["position"], d["reason"], orjson.loads(d["raw"])) for d in dead], key=str)


# ------------------------------------------------------------------ the test harness


def test_harness_runs_a_query_over_dicts():
    events = [trade("A", 100, 1), trade("A", 105, 2), trade("B", 7, 3), trade("B", 6, 4)]
    assert run_query(RISE, events) == [{"query": "up", "key": "A", "seq": 1, "start_seq": 0,
                                        "symbol": "A", "gain": 5}]
    assert assert_engines_agree(RISE, events) == run_query(RISE, events, engine="reference")


def test_harness_reports_a_disagreement(monkeypatch):
    from cep_core import api

    real = api.QuerySet.run

    def wrong(self, data, *, engine="jit", **kw):
        result = real(self, data, engine=engine, **kw)
        if engine == "jit":
            result.composites = type(result.composites).from_dicts(result.to_dicts()[:-1])
        return result

    monkeypatch.setattr(api.QuerySet, "run", wrong)
    with pytest.raises(AssertionError, match="jit gives 0 composite events, the reference 1"):
        assert_engines_agree(RISE, [trade("A", 100, 1), trade("A", 105, 2)])


def test_example_tests_pass():
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "examples" / "test_my_queries.py")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and "failed" not in done.stdout


def test_the_notebook_example_runs():
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "trades_notebook.py"), "-",
                           "20000"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "20,000 trades ->" in done.stdout and "streamed in 1 batches" in done.stdout
