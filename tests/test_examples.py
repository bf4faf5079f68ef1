"""Every example query file checks, and runs over its sample data with results.

examples/<name>.cep reads one stream; its sample data is examples/data/<stream>.jsonl,
written by examples/make_data.py (deterministic).
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from cep_core.parser import parse_file

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FILES = sorted(EXAMPLES.glob("*.cep"))
CEP = Path(sys.executable).with_name("cep")


def cep(*args):
    command = [str(CEP)] if CEP.exists() else [sys.executable, "-m", "cep_service.cli.main"]
    env = {k: v for k, v in os.environ.items() if k != "CEP_DEBUG"}
    return subprocess.run(command + [str(a) for a in args], check=False, capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=600)


def data_for(path: Path) -> Path:
    streams = {q.stream for q in parse_file(path).queries}
    assert len(streams) == 1, f"{path.name} reads several streams: {streams}"
    return EXAMPLES / "data" / f"{streams.pop()}.jsonl"


def test_there_are_examples():
    names = {p.stem for p in FILES}
    assert {"finance", "marathon", "stocks", "rfid", "fire", "r4", "auction"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_example_checks(path):
    result = cep("check", path)
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_example_runs_with_results(path):
    data = data_for(path)
    assert data.is_file(), f"no sample data {data} (run examples/make_data.py)"
    result = cep("run", path, "--events", data, "--engine", "reference")
    assert result.returncode == 0, result.stderr
    composites = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert composites, f"{path.name} found nothing in {data.name}"
    found = {c["query"] for c in composites}
    names = [q.name for q in parse_file(path).queries]
    assert set(names) <= found, f"queries without results: {set(names) - found}"
    assert "bad event" not in result.stderr  # the sample data is clean


def test_sample_data_is_what_make_data_writes(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("make_data", EXAMPLES / "make_data.py")
    make_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_data)
    monkeypatch.setattr(make_data, "DATA", tmp_path)
    make_data.main()
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(p.name for p in (EXAMPLES / "data").glob("*.jsonl"))
    for name in written:
        assert (tmp_path / name).read_bytes() == (EXAMPLES / "data" / name).read_bytes(), name


def test_cli_runner_agrees_with_reference_run():
    from cep_core.checker import load_queries
    from cep_core.event_io import read_events
    from cep_core.reference import run
    from cep_service.cli.common import run_queries

    queries = load_queries(EXAMPLES / "finance.cep")
    events, _ = read_events(data_for(EXAMPLES / "finance.cep"), queries[0].schema)
    composites, rejected = run_queries(queries, events)
    assert composites == run(queries, events)
    assert rejected == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_jit_engine_agrees_with_reference_on_example(path):
    from cep_core.checker import load_queries
    from cep_core.event_io import read_events
    from cep_service.cli.common import Engine, run_queries

    queries = load_queries(path)
    events, _ = read_events(data_for(path), queries[0].schema)
    assert run_queries(queries, events, Engine.JIT) == run_queries(queries, events)
