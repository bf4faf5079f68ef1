"""Benchmark workload generators (cep_core.workloads) and `cep gen`.

Every workload: deterministic per seed, columns exactly as its schema, events readable by
event_io in both formats, a query file that checks, and at least one composite event per
query from the reference interpreter on a small stream."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pytest

from cep_core import reference
from cep_core.checker import load_query_text
from cep_core.event_io import read_events
from cep_core.workloads import WORKLOADS, arrow_schema, write_events

ROOT = Path(__file__).resolve().parent.parent
CEP = Path(sys.executable).with_name("cep")
NAMES = ["finance0", "finance1", "finance2", "finance3", "finance4", "finance5", "twitter1",
         "twitter2", "marathon", "r5", "q9", "hyper", "iot", "activity", "clicks"]
SEED = 11
# Small streams that already match. r5's published attribute domain [1, 50000] needs
# ~10^5 events per match, and its reference run is quadratic, so it is shrunk here.
SIZES = {name: (2000, {}) for name in NAMES} | {"r5": (600, {"att_max": 20})}


def test_registry_has_the_named_workloads():
    assert list(WORKLOADS) == NAMES
    for name, workload in WORKLOADS.items():
        assert workload.name == name and workload.doc and workload.schema().stream == \
            workload.stream


@pytest.fixture(scope="module", params=NAMES)
def generated(request):
    name = request.param
    n, params = SIZES[name]
    return WORKLOADS[name], WORKLOADS[name].generate(n, SEED, **params), params


def test_deterministic_per_seed(generated):
    workload, table, params = generated
    assert workload.generate(len(table), SEED, **params).equals(table)
    assert not workload.generate(len(table), SEED + 1, **params).equals(table)
    assert workload.query_text(seed=SEED) == workload.query_text(seed=SEED)


def test_columns_follow_the_schema(generated):
    workload, table, _ = generated
    schema = workload.schema()
    assert table.schema == arrow_schema(schema)
    assert table.column_names == ["seq", *schema.attributes]
    assert table.column("seq").to_pylist() == list(range(len(table)))
    assert all(column.null_count == 0 for column in table.columns)
    ts = table.column(schema.time).to_numpy()
    assert (np.diff(ts) >= 0).all()  # time never goes backwards (so no partition's does)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_events_read_back(generated, fmt, tmp_path):
    workload, table, _ = generated
    table = table.slice(0, 300)
    path = write_events(table, tmp_path / f"{workload.stream}.{fmt}", fmt)
    events, dead = read_events(path, workload.schema())
    assert dead == []
    rows = table.to_pylist()
    assert [e.seq for e in events] == [r["seq"] for r in rows]
    assert [e.attrs for e in events] == [{k: v for k, v in r.items() if k != "seq"}
                                         for r in rows]


def test_reference_finds_matches(generated, tmp_path):
    workload, table, _ = generated
    queries = load_query_text(workload.query_text(seed=SEED))
    events, _ = read_events(write_events(table, tmp_path / "events.parquet"), workload.schema())
    found = {c["query"] for c in reference.run(queries, events)}
    assert found == {q.name for q in queries}


def test_edge_sizes():
    for workload in WORKLOADS.values():
        for n in (0, 1, 7):
            table = workload.generate(n, 3)
            assert table.num_rows == n and table.schema == arrow_schema(workload.schema())


def test_query_options_check():
    q9 = load_query_text(WORKLOADS["q9"].query_text(queries=64))
    assert len(q9) == 64 and len({q.name for q in q9}) == 64
    assert WORKLOADS["q9"].query_text(queries=8) == WORKLOADS["q9"].query_text(seed=5, queries=8)
    for variant, names in (("each", ["r5_each"]), ("last", ["r5_last"]),
                           ("both", ["r5_each", "r5_last"])):
        assert [q.name for q in load_query_text(
            WORKLOADS["r5"].query_text(variant=variant))] == names
    hyper = WORKLOADS["hyper"]
    for length in range(3, 8):
        for kind in ("not", "kleene"):
            text = hyper.query_text(length=length, kind=kind)
            assert f"{kind.upper()}(" in text
            load_query_text(text)
    assert len({hyper.query_text(seed=s) for s in range(10)}) > 1  # drawn from the seed


def test_unknown_parameters_are_refused():
    with pytest.raises(ValueError, match="unknown parameter"):
        WORKLOADS["finance0"].generate(10, 1, att_max=3)
    with pytest.raises(ValueError, match="unknown query option"):
        WORKLOADS["finance0"].query_text(queries=3)


def test_jsonl_escapes_strings_it_cannot_write_column_wise(tmp_path):
    table = pa.table({"seq": [0, 1], "s": ['say "hi"', "a\\b"], "x": [1.0, 2.5]})
    path = write_events(table, tmp_path / "odd.jsonl")
    assert [orjson.loads(line) for line in path.read_bytes().splitlines()] == \
        table.to_pylist()


# ------------------------------------------------------------------ cep gen


def cep(*args):
    command = [str(CEP)] if CEP.exists() else [sys.executable, "-m", "cep_service.cli.main"]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("CEP_DEBUG", None)
    return subprocess.run(command + [str(a) for a in args], check=False, capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120)


def test_cli_gen_then_run(tmp_path):
    result = cep("gen", "marathon", "--events", 500, "--seed", 1, "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints.parquet", "marathon.cep"]
    result = cep("run", tmp_path / "marathon.cep", "--events", tmp_path / "checkpoints.parquet")
    assert result.returncode == 0, result.stderr
    found = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert found and {c["query"] for c in found} == {"marathon"}


def test_cli_gen_users_data_as_csv_then_run(tmp_path):
    result = cep("gen", "iot", "--events", 2000, "--format", "csv", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iot.cep", "plant.csv"]
    header, first = (tmp_path / "plant.csv").read_text().splitlines()[:2]
    assert "firmware" in header and "Z" in first  # a field beside the schema, ISO times
    result = cep("run", tmp_path / "iot.cep", "--events", tmp_path / "plant.csv")
    assert result.returncode == 0, result.stderr
    assert "2000 events (0 bad)" in result.stderr
    assert {orjson.loads(line)["query"] for line in result.stdout.splitlines()} == \
        {"iot_warming", "iot_alarm", "iot_zones"}


def test_cli_gen_jsonl_and_queries(tmp_path):
    result = cep("gen", "q9", "-n", 200, "--seed", 2, "-o", tmp_path, "--format", "jsonl",
                 "--queries", 8)
    assert result.returncode == 0, result.stderr
    workload = WORKLOADS["q9"]
    events, dead = read_events(tmp_path / "ticks.jsonl", workload.schema())
    assert dead == [] and len(events) == 200
    assert (tmp_path / "q9.cep").read_text() == workload.query_text(seed=2, queries=8)
    assert [e.attrs for e in events] == [{k: v for k, v in r.items() if k != "seq"}
                                         for r in workload.generate(200, 2).to_pylist()]


def test_cli_gen_usage_errors(tmp_path):
    result = cep("gen", "nasdaq", "-n", 10, "-o", tmp_path)
    assert result.returncode == 2 and "unknown workload 'nasdaq'" in result.stderr
    result = cep("gen", "r5", "-n", 10, "-o", tmp_path, "--queries", 3)
    assert result.returncode == 2 and "takes no --queries" in result.stderr
