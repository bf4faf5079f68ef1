"""The `cep` console script, run as users run it (a subprocess)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parent.parent
CEP = Path(sys.executable).with_name("cep")

RISE = """\
QUERY up FROM trades PARTITION BY symbol
PATTERN ( a b ) DEFINE a AS TRUE, b AS price > Last(price)
EMIT symbol = symbol, gain = Last(price) - First(price);
"""


def cep(*args, cwd=ROOT, stdin: str | bytes = ""):
    command = [str(CEP)] if CEP.exists() else [sys.executable, "-m", "cep_service.cli.main"]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("CEP_DEBUG", None)
    done = subprocess.run(command + [str(a) for a in args], check=False, capture_output=True,
                          cwd=cwd, env=env, timeout=120,
                          input=stdin.encode() if isinstance(stdin, str) else stdin)
    return subprocess.CompletedProcess(done.args, done.returncode,
                                       done.stdout.decode("utf-8", "replace"),
                                       done.stderr.decode("utf-8", "replace"))


def trade(symbol, price, ts):
    return {"symbol": symbol, "price": price, "volume": 10, "ts": ts, "seqNum": 0}


@pytest.fixture
def trades_file(tmp_path):
    path = tmp_path / "trades.jsonl"
    rows = [trade("A", 100, 1), trade("B", 50, 2), trade("A", 90, 3), trade("A", 95, 4),
            trade("B", 60, 5)]
    lines = [orjson.dumps(r) for r in rows]
    lines.insert(2, b'{"symbol": "A", "price": "cheap", "volume": 1, "ts": 3, "seqNum": 0}')
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_check_ok(tmp_path):
    path = tmp_path / "ok.cep"
    path.write_text(RISE + "QUERY n SELECT count(*) FROM trades [ROWS 2 SLIDE 2];\n")
    result = cep("check", path)
    assert result.returncode == 0, result.stderr
    assert f"{path}: 2 queries OK (up, n)" in result.stdout


# Deliberately like the other CLI tests (test_csv_dead_letters_count_the_header_line): each
# writes its own files and reads its own command's output
def test_check_bad_file_names_file_line_col(tmp_path):
    good = tmp_path / "good.cep"
    good.write_text(RISE)
    bad = tmp_path / "bad.cep"
    bad.write_text("QUERY x FROM trades\nPATTERN ( a ) DEFINE a AS price >> 3;\n")
    result = cep("check", good, bad)
    assert result.returncode == 1
    assert f"{good}: 1 query OK (up)" in result.stdout
    assert f"{bad}:2:" in result.stderr and "error:" in result.stderr
    assert "^" in result.stderr  # the caret under the spot
    assert "Traceback" not in result.stderr


def test_check_unknown_stream(tmp_path):
    bad = tmp_path / "bad.cep"
    bad.write_text("QUERY x FROM nowhere PATTERN ( a ) DEFINE a AS TRUE;\n")
    result = cep("check", bad)
    assert result.returncode == 1
    assert f"{bad}:1:" in result.stderr and "nowhere" in result.stderr


def test_check_missing_file(tmp_path):
    result = cep("check", tmp_path / "absent.cep")
    assert result.returncode != 0
    assert "no such file" in result.stderr and "Traceback" not in result.stderr


def test_check_with_extra_schema(tmp_path):
    schema = tmp_path / "mine.json"
    schema.write_bytes(orjson.dumps({"stream": "mine", "attributes": {"v": "int", "t": "int"},
                                     "time": "t"}))
    query = tmp_path / "q.cep"
    query.write_text("QUERY big FROM mine PATTERN ( b ) DEFINE b AS v > 3;\n")
    assert cep("check", query).returncode == 1
    result = cep("check", query, "--schema", schema)
    assert result.returncode == 0, result.stderr


def test_run_writes_json_lines(tmp_path, trades_file):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    result = cep("run", query, "--events", trades_file, "--engine", "reference")
    assert result.returncode == 0, result.stderr
    lines = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert lines == [
        {"query": "up", "key": "A", "seq": 4, "start_seq": 3, "symbol": "A", "gain": 5},
        {"query": "up", "key": "B", "seq": 5, "start_seq": 1, "symbol": "B", "gain": 10},
    ]
    assert "1 bad event" in result.stderr and "attribute 'price'" in result.stderr
    assert "composite events" in result.stderr and "events/s" in result.stderr


def test_run_out_and_dead_letters_files(tmp_path, trades_file):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    out, dead = tmp_path / "out.jsonl", tmp_path / "dead.jsonl"
    result = cep("run", query, "--events", trades_file, "--out", out, "--dead-letters", dead)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert len(out.read_bytes().splitlines()) == 2
    [letter] = [orjson.loads(line) for line in dead.read_bytes().splitlines()]
    assert letter["source"] == str(trades_file) and letter["position"] == 2
    assert letter["reason"] == "attribute 'price': expected int, got a string ('cheap')"


def test_run_unknown_engine(tmp_path, trades_file):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    result = cep("run", query, "--events", trades_file, "--engine", "warp")
    assert result.returncode == 2 and "warp" in result.stderr


def test_run_several_streams_is_an_error(tmp_path, trades_file):
    query = tmp_path / "q.cep"
    query.write_text(RISE + "QUERY b SELECT count(*) FROM bids [ROWS 2 SLIDE 2];\n")
    result = cep("run", query, "--events", trades_file)
    assert result.returncode == 1
    assert "several streams (bids, trades)" in result.stderr


def test_run_bad_query_and_bad_events_file(tmp_path, trades_file):
    bad = tmp_path / "bad.cep"
    bad.write_text("QUERY x FROM trades PATTERN ( a DEFINE a AS TRUE;\n")
    result = cep("run", bad, "--events", trades_file)
    assert result.returncode == 1 and f"{bad}:1:" in result.stderr
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    for events in (tmp_path / "absent.jsonl", tmp_path / "e.txt"):
        result = cep("run", query, "--events", events)
        assert result.returncode == 1, result.stderr
        assert str(events) in result.stderr and "Traceback" not in result.stderr


def test_schemas_lists_streams():
    result = cep("schemas")
    assert result.returncode == 0, result.stderr
    for stream in ("trades", "rfid", "sensors", "bids"):
        assert stream in result.stdout
    assert "bid_price: int" in result.stdout


def test_run_collects_events_the_engine_rejects(tmp_path):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    events = tmp_path / "e.csv"  # CSV input; A's event time goes backwards at seq 2
    events.write_text("symbol,price,volume,ts,seqNum\nA,1,1,10,0\nA,2,1,20,1\nA,3,1,15,2\n")
    dead = tmp_path / "dead.jsonl"
    result = cep("run", query, "--events", events, "--dead-letters", dead)
    assert result.returncode == 0, result.stderr
    assert [orjson.loads(line)["seq"] for line in result.stdout.splitlines()] == [1]
    [letter] = [orjson.loads(line) for line in dead.read_bytes().splitlines()]
    assert letter["source"] == "query up" and letter["position"] == 2
    assert orjson.loads(letter["raw"])["ts"] == 15


# ------------------------------------------------------------------ no valid event


def test_run_fails_when_no_event_is_valid_and_still_writes_dead_letters(tmp_path):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n\n{also not\n")
    dead = tmp_path / "dead.jsonl"
    result = cep("run", query, "--events", garbage, "--dead-letters", dead)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert f"{garbage}: no valid event: all 2 records are bad" in result.stderr
    assert f"first {garbage}:1: not valid JSON" in result.stderr
    letters = [orjson.loads(line) for line in dead.read_bytes().splitlines()]
    assert [(d["line"], d["position"]) for d in letters] == [(1, 0), (3, 1)]
    # Valid JSON of another stream: every event lacks the stream's attributes.
    other = tmp_path / "sensors.jsonl"
    other.write_text('{"sensor": 1, "temp": 20.5, "ts": 1}\n{"sensor": 2, "temp": 21, "ts": 2}\n')
    result = cep("run", query, "--events", other)
    assert result.returncode == 1
    assert "2 bad events: first" in result.stderr  # the summary is still shown
    assert "missing attribute 'symbol'" in result.stderr
    assert "The queries read stream 'trades' (symbol: string, price: int" in result.stderr


def test_run_fails_on_an_empty_input(tmp_path):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    result = cep("run", query, "--events", empty)
    assert result.returncode == 1
    assert f"{empty}: no events (the input is empty)" in result.stderr


# ------------------------------------------------------------------ dead-letter lines


def test_dead_letters_name_editor_lines_and_keep_record_positions(tmp_path):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    events = tmp_path / "e.jsonl"  # line 2 blank; line 3 bad (record 1); line 5 null price
    events.write_text("\n".join([
        orjson.dumps(trade("A", 100, 1)).decode(), "",
        '{"symbol": "A", "price": "cheap", "volume": 1, "ts": 2, "seqNum": 0}',
        orjson.dumps(trade("A", 110, 3)).decode(),
        orjson.dumps({**trade("A", 0, 4), "price": None}).decode()]) + "\n")
    dead = tmp_path / "dead.jsonl"
    result = cep("run", query, "--events", events, "--dead-letters", dead)
    assert result.returncode == 0, result.stderr
    letters = [orjson.loads(line) for line in dead.read_bytes().splitlines()]
    assert [(d["line"], d["position"], d["reason"]) for d in letters] == [
        (3, 1, "attribute 'price': expected int, got a string ('cheap')"),
        (5, 3, "null attribute 'price'")]
    summary = cep("run", query, "--events", events)
    assert f"2 bad events: first {events}:3: attribute 'price'" in summary.stderr


# Deliberately like test_check_bad_file_names_file_line_col: each writes its own files
def test_csv_dead_letters_count_the_header_line(tmp_path):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    events = tmp_path / "e.csv"
    events.write_text("symbol,price,volume,ts,seqNum\nA,1,1,10,0\n\nA,x,1,20,1\nA,3,1,30,2\n")
    dead = tmp_path / "dead.jsonl"
    result = cep("run", query, "--events", events, "--dead-letters", dead)
    assert result.returncode == 0, result.stderr
    [letter] = [orjson.loads(line) for line in dead.read_bytes().splitlines()]
    assert (letter["line"], letter["position"]) == (4, 1)


# ------------------------------------------------------------------ standard input


def test_run_reads_standard_input_in_a_named_format(tmp_path, trades_file):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    from_file = cep("run", query, "--events", trades_file)
    data = trades_file.read_text()
    result = cep("run", query, "--events", "-", "--format", "jsonl", stdin=data)
    assert result.returncode == 0, result.stderr
    assert result.stdout == from_file.stdout and result.stdout
    assert "1 bad event: first <stdin>:3: attribute 'price'" in result.stderr
    csv_text = "symbol,price,volume,ts,seqNum\nA,100,1,1,0\nA,90,1,3,0\nA,95,1,4,0\n"
    result = cep("run", query, "-e", "-", "-f", "csv", stdin=csv_text)
    assert result.returncode == 0, result.stderr
    assert [orjson.loads(line)["gain"] for line in result.stdout.splitlines()] == [5]


def test_run_reads_parquet_from_standard_input(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    query = tmp_path / "q.cep"
    query.write_text(RISE)
    path = tmp_path / "e.parquet"
    pq.write_table(pa.Table.from_pylist([trade("A", 100, 1), trade("A", 90, 3),
                                         trade("A", 95, 4)]), path)
    result = cep("run", query, "--events", "-", "--format", "parquet",
                 stdin=path.read_bytes())
    assert result.returncode == 0, result.stderr
    assert [orjson.loads(line)["gain"] for line in result.stdout.splitlines()] == [5]


def test_standard_input_without_a_format_is_a_usage_error(tmp_path):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    result = cep("run", query, "--events", "-", stdin="")
    assert result.returncode == 2
    assert "standard input has no file suffix; name its format with --format" in result.stderr


# ------------------------------------------------------------------ version, help, names


def test_version_comes_from_the_package_metadata():
    from importlib.metadata import version

    result = cep("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"cep {version('cep-service')}"


def _commands(group=None, prefix=()):
    import typer

    from cep_service.cli.main import app

    command = group or typer.main.get_command(app)
    yield prefix
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*prefix, name))


def test_every_help_reads_cleanly():
    commands = list(_commands())
    assert ("run",) in commands and ("bench", "core") in commands and ("fpga", "hdl") in commands
    for command in commands:
        result = cep(*command, "--help")
        assert result.returncode == 0, (command, result.stderr)
        for python_type in ("<path>", "<list[", "<bool>", "<int", "<float", "<str>",
                            "[default: -1]", "<reference|jit>", "<splitter|"):
            assert python_type not in result.stdout, (command, python_type)
    run_help = cep("run", "--help").stdout
    assert "Usage: cep run [OPTIONS] QUERY_FILE" in run_help, run_help
    assert "cep query [OPTIONS] OP [TARGET]" in cep("query", "--help").stdout
    assert "--events,--input" in run_help and "FILE" in run_help
    assert "[reference|jit]" in run_help and "--out,--output" in run_help


def test_run_and_backfill_take_the_same_option_names(tmp_path, trades_file):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    out = tmp_path / "out.jsonl"
    result = cep("run", query, "--input", trades_file, "--output", out)
    assert result.returncode == 0, result.stderr
    assert len(out.read_bytes().splitlines()) == 2
    # backfill: the run names are accepted too (the query file is missing, so it stops
    # before Spark starts; an unknown option would be a usage error naming the option)
    result = cep("backfill", tmp_path / "absent.cep", "--events", trades_file, "--out", out)
    assert result.returncode == 2 and "absent.cep: no such file" in result.stderr
    result = cep("backfill", tmp_path / "absent.cep", "--evnts", trades_file, "--out", out)
    assert result.returncode == 2 and "No such option" in result.stderr


@pytest.mark.parametrize("count", ["--count", "--events", "-n"])
def test_gen_takes_count_and_its_old_name(tmp_path, count):
    result = cep("gen", "finance0", count, 7, "--out", tmp_path, "--format", "jsonl")
    assert result.returncode == 0, result.stderr
    assert len((tmp_path / "trades.jsonl").read_bytes().splitlines()) == 7


# ------------------------------------------------------------------ start-up


def _imported(*args) -> set[str]:
    """Modules a `cep` command imports (python -X importtime)."""
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           "from cep_service.cli.main import main; main()", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.split("|")[-1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def test_help_imports_no_engine_parser_or_data_library():
    imported = _imported("--help")
    for heavy in ("numba", "numpy", "pyarrow", "lark", "cep_core.checker", "confluent_kafka",
                  "faust", "pyspark"):
        assert heavy not in imported, heavy


def test_reference_run_imports_no_jit_engine(trades_file, tmp_path):
    """The reference interpreter runs without the jitted engines; numba (and pyarrow, which
    the compilers' modules import) load for the one check alone (cep_core.admission builds
    the query's program, so a query the compilers refuse is refused on every engine)."""
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    imported = _imported("run", query, "--events", trades_file, "--engine", "reference")
    assert "cep_core.reference" in imported and "lark" in imported
    assert "cep_core.admission" in imported
    for heavy in ("cep_core.stream_engines", "cep_core.engine.match", "confluent_kafka",
                  "pyspark"):
        assert heavy not in imported, heavy


# ------------------------------------------------------------------ compile time apart


def test_jit_rate_leaves_compiling_out():
    from cep_service.cli.main import _engine_summary
    from cep_service.cli.common import Engine

    line = _engine_summary(Engine.JIT, 1200, 10, 22.0,
                           {"setup_s": 1.5, "compile_s": 20.0, "process_s": 0.5})
    assert "compile/load 21.50s" in line and "kernels 20.00s" in line
    assert "processing 0.50s (2,400 events/s)" in line
    assert "55 events/s" not in line  # 1200 / 22 s: the rate with compiling in it
    reference = _engine_summary(Engine.REFERENCE, 1200, 10, 2.0, {})
    assert "in 2.00s (600 events/s)" in reference


def test_compile_timer_counts_numba_compiling_only():
    import numba

    from cep_core.stream_engines import compile_timer

    @numba.njit
    def twice(x):
        return 2 * x

    with compile_timer() as first:
        started = time.perf_counter()
        twice(21)
        elapsed = time.perf_counter() - started
    assert 0 < first.seconds <= elapsed
    with compile_timer() as again:
        twice(21)  # compiled already: nothing to count
    assert again.seconds == 0


def test_jit_run_reports_compile_and_processing_apart(tmp_path, trades_file):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    result = cep("run", query, "--events", trades_file, "--engine", "jit")
    assert result.returncode == 0, result.stderr
    assert "jit engine: 2 composite events; compile/load " in result.stderr
    assert "kernels " in result.stderr and "); processing " in result.stderr
    assert "; written in " in result.stderr and "composite events/s, JSON lines)" in \
        result.stderr
    parquet = cep("run", query, "--events", trades_file, "--engine", "jit", "-o",
                  tmp_path / "out.parquet")
    assert "composite events/s, Parquet)" in parquet.stderr, parquet.stderr


# ------------------------------------------------------------------ what a new user met (issue 26)


def test_run_defaults_to_the_jit_engine_and_reference_stays(tmp_path, trades_file):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    default = cep("run", query, "--events", trades_file)
    assert default.returncode == 0, default.stderr
    assert "jit engine: 2 composite events; compile/load " in default.stderr
    reference = cep("run", query, "--events", trades_file, "--engine", "reference")
    assert reference.returncode == 0, reference.stderr
    assert "reference engine: 2 composite events in " in reference.stderr
    assert reference.stdout == default.stdout and default.stdout
    assert "[default: jit]" in cep("run", "--help").stdout


def test_an_unknown_stream_says_how_to_give_its_schema(tmp_path):
    query = tmp_path / "boiler.cep"
    query.write_text("QUERY overheat FROM boiler PATTERN ( hot ) DEFINE hot AS temp > 90;\n")
    result = cep("check", query)
    assert result.returncode == 1
    assert (f"{query}:1:1: error: unknown stream 'boiler': no schema of that name is known "
            "here; give its schema file with --schema FILE (or a directory of <stream>.json "
            "files), or name that file or directory in CEP_SCHEMA_PATH") in result.stderr
    # and both ways work
    schema = tmp_path / "schemas" / "boiler.json"
    schema.parent.mkdir()
    schema.write_bytes(orjson.dumps({"stream": "boiler", "attributes": {"temp": "int",
                                                                       "ts": "timestamp"},
                                     "time": "ts"}))
    for given in (schema, schema.parent):
        result = cep("check", query, "--schema", given)
        assert result.returncode == 0, result.stderr
    env = {"CEP_SCHEMA_PATH": str(schema.parent)}
    command = [str(CEP)] if CEP.exists() else [sys.executable, "-m", "cep_service.cli.main"]
    done = subprocess.run(command + ["check", str(query)], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **env}, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_schema_file_cut_short_gives_the_json_error_where_it_is(tmp_path):
    text = (ROOT / "schemas" / "trades.json").read_text()
    cut = tmp_path / "trades.json"
    cut.write_text(text[:len(text) // 2])
    lines = cut.read_text().splitlines()
    where = f"{cut}:{len(lines)}:{len(lines[-1]) + 1}"
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    for command in (["check", query, "--schema", cut],
                    ["run", query, "--events", ROOT / "examples/data/trades.jsonl",
                     "--schema", cut],
                    ["stream", "add", cut, "--bootstrap", "127.0.0.1:1"]):
        result = cep(*command)
        assert result.returncode == 1, (command, result.stderr)
        assert result.stderr.startswith(f"{where}: error: not valid JSON: unexpected end of "
                                        "data"), (command, result.stderr)
    # in a schema directory, found when a query reads the stream: at the query, then the file
    result = cep("check", query, "--schema", tmp_path)
    assert result.returncode == 1
    assert f"{query}:1:1: error: schema of stream 'trades': {where}: not valid JSON: " \
        in result.stderr, result.stderr


def test_bench_recognize_compares_match_recognize_with_match_and_the_reference(
        tmp_path, monkeypatch):
    # issue 32's kernel target as a command: both M-shapes on the same trades, the
    # MATCH_RECOGNIZE engines' output on the trades checked against the reference; with
    # --processes both as whole `cep run` processes over a generated CSV (in TMPDIR)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    result = cep("bench", "recognize", "--count", "3000", "--repeat", "1", "--symbols", "40",
                 "--processes", "--json")
    assert result.returncode == 0, result.stderr
    out = orjson.loads(result.stdout)
    assert out["events"] == out["reference_events"] == 3000 and out["symbols"] == 40
    assert out["agrees_with_reference"] is True and out["ties_agree_with_reference"] is True
    assert all(out[name]["composite_events"] > 0 and out[name]["cpu_events_per_s"] > 0
               for name in ("match", "recognize", "recognize_ties"))
    assert out["recognize_over_match"] > 0
    whole = out["processes"]
    assert whole["events"] == 3000 and whole["file"].startswith(str(tmp_path))
    for name in ("match", "recognize"):  # the written files' lines are the matches
        assert whole[name]["composite_events"] > 0 and whole[name]["seconds"] > 0
    assert whole["recognize_over_match"] > 0
