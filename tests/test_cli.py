"""The `cep` console script, run as users run it (a subprocess)."""

import os
import subprocess
import sys
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


def cep(*args, cwd=ROOT):
    command = [str(CEP)] if CEP.exists() else [sys.executable, "-m", "services.cli"]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("CEP_DEBUG", None)
    return subprocess.run(command + [str(a) for a in args], check=False, capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=120)


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
