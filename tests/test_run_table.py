"""`cep run --engine jit` reads a table and runs the engines on it: the same composite events
and dead letters (read and rejected) as over Events, and no pandas on the way."""

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from cep_core.checker import load_queries
from cep_core.event_io import read_events
from cep_core.event_reader import read_table
from cep_service.cli.common import Engine, run_queries
from tests.test_cli import RISE, cep, trade
from tests.test_examples import FILES, data_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_jit_on_a_table_agrees_with_events_on_example(path):
    queries = load_queries(path)
    events, _ = read_events(data_for(path), queries[0].schema)
    table, _ = read_table(data_for(path), queries[0].schema)
    assert run_queries(queries, table, Engine.JIT) == run_queries(queries, events)
    assert run_queries(queries, table) == run_queries(queries, events)


def rejecting_file(tmp_path):
    """Trades with a bad record and events whose time goes backwards (rejected)."""
    rows = [trade("A", 1, 10), trade("A", 2, 20), trade("A", 3, 15), trade("B", 5, 30),
            trade("B", 6, 25), trade("A", 4, 40)]
    lines = [orjson.dumps(r) for r in rows]
    lines.insert(3, b'{"symbol": "A", "price": "cheap", "volume": 1, "ts": 3, "seqNum": 0}')
    path = tmp_path / "trades.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_rejected_events_carry_their_json_from_the_table(tmp_path):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    queries = load_queries(query)
    path = rejecting_file(tmp_path)
    events, _ = read_events(path, queries[0].schema)
    table, _ = read_table(path, queries[0].schema)
    composites, rejected = run_queries(queries, table, Engine.JIT)
    assert (composites, rejected) == run_queries(queries, events)
    assert [(d.position, orjson.loads(d.raw)["ts"]) for d in rejected] == [(2, 15), (5, 25)]


def test_cep_run_writes_the_same_for_both_engines(tmp_path):
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    events = rejecting_file(tmp_path)
    written = {}
    for engine in ("jit", "reference"):
        dead = tmp_path / f"dead-{engine}.jsonl"
        result = cep("run", query, "--events", events, "--engine", engine,
                     "--dead-letters", dead)
        assert result.returncode == 0, result.stderr
        written[engine] = result.stdout, dead.read_bytes()
    assert written["jit"] == written["reference"]
    composites, dead = written["jit"]
    assert [orjson.loads(line)["seq"] for line in composites.splitlines()] == [1]
    letters = [orjson.loads(line) for line in dead.splitlines()]
    assert [(d["source"], d["position"]) for d in letters] == [
        (str(events), 3), ("query up", 2), ("query up", 5)]


def test_reading_running_and_writing_json_lines_import_no_pandas(tmp_path):
    """pyarrow's own numpy conversions import pandas (0.1-0.2 s): reading a file, running
    the jit engines on it and writing the composites as JSON lines go without them."""
    query = tmp_path / "q.cep"
    query.write_text(RISE)
    events = rejecting_file(tmp_path)
    code = f"""
import sys
from cep_core.checker import load_queries
from cep_core.event_reader import read_table
from cep_service.cli.common import Engine, run_queries
queries = load_queries({str(query)!r})
table, dead = read_table({str(events)!r}, queries[0].schema)
composites, rejected = run_queries(queries, table, Engine.JIT)
assert len(dead) == 1 and len(rejected) == 2, (dead, rejected)
assert composites.write({str(tmp_path / "out.jsonl")!r}) == len(composites) > 0
print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_parquet_in_and_parquet_and_arrow_out_import_no_pandas(tmp_path):
    """The same from Parquet (decoded by event_columns) to Parquet and Arrow (composite
    columns built by arrow_numpy.array): pandas costs ~0.3 s of CPU per process."""
    import pyarrow.parquet as pq

    query = tmp_path / "q.cep"
    query.write_text(RISE)
    table, _ = read_table(rejecting_file(tmp_path), load_queries(query)[0].schema)
    pq.write_table(table, tmp_path / "in.parquet")
    code = f"""
import sys
from cep_core.checker import load_queries
from cep_core.composites import read as read_composites
from cep_core.event_reader import read_table
from cep_service.cli.common import Engine, run_queries
queries = load_queries({str(query)!r})
table, dead = read_table({str(tmp_path / "in.parquet")!r}, queries[0].schema)
composites, rejected = run_queries(queries, table, Engine.JIT)
assert len(rejected) == 2 and len(composites) > 0, (dead, rejected)
outs = [{str(tmp_path)!r} + "/out" + suffix for suffix in (".parquet", ".arrow")]
for out in outs:
    assert composites.write(out) == len(composites)
pandas = sorted(m for m in sys.modules if m.split('.')[0] == 'pandas')
for out in outs:  # reading back is not on the way
    assert read_composites(out) == composites.to_dicts()
print(pandas)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_jit_run_reads_standard_input_like_the_reference(tmp_path, fmt):
    import pyarrow.csv as pcsv
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    query = tmp_path / "q.cep"
    query.write_text(RISE)
    source = rejecting_file(tmp_path)
    if fmt == "jsonl":
        data = source.read_bytes()
    else:
        good = b"\n".join(line for line in source.read_bytes().splitlines()
                          if b"cheap" not in line)
        table = pj.read_json(pa_buffer(good))
        path = tmp_path / f"e.{fmt}"
        if fmt == "csv":
            pcsv.write_csv(table, path)
        else:
            pq.write_table(table, path)
        data = path.read_bytes()
    outputs = {}
    for engine in ("jit", "reference"):
        result = cep("run", query, "--events", "-", "--format", fmt, "--engine", engine,
                     stdin=data)
        assert result.returncode == 0, result.stderr
        outputs[engine] = result.stdout
    assert outputs["jit"] == outputs["reference"] and outputs["jit"]


def pa_buffer(data: bytes):
    import pyarrow as pa

    return pa.py_buffer(data)
