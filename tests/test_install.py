"""Install anywhere: the built wheel, installed with its core dependencies only into a fresh
virtualenv outside the checkout, runs from another directory: `cep schemas` finds the
built-in schemas inside the installed package, `cep check` and `cep run` work on a user's
own schema, query and events made in a temporary folder, the extras are really optional
(`cep backfill` without pyspark exits 1 naming the extra), and a short verifying
`cep demo` runs the streaming pipeline on the embedded broker.

Dependencies come from pip's configured indexes (and its cache); CEP_WHEELHOUSE=DIR installs
offline from a folder of wheels instead (`pip install --no-index --find-links DIR`). The
slowest test module: about a minute (venv, install, the demo's kernels compiled cold)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ORDERS = ROOT / "examples" / "own_stream"


def _run(command: list, cwd: Path, timeout: float = 300, env: dict | None = None):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PYTHONPATH", "VIRTUAL_ENV", "CEP_SCHEMA_PATH", "CEP_DEBUG")}
    return subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**clean, **(env or {})})


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin folder of the fresh venv, a working folder outside the checkout)."""
    base = tmp_path_factory.mktemp("install")
    wheels = base / "wheels"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                  "-q", "-w", wheels, ROOT], cwd=base)
    assert built.returncode == 0, built.stderr
    venv = base / "venv"
    made = _run([sys.executable, "-m", "venv", venv], cwd=base)
    assert made.returncode == 0, made.stderr
    source = os.environ.get("CEP_WHEELHOUSE")
    offline = ["--no-index", "--find-links", source] if source else []
    wheel = next(wheels.glob("cep_service-*.whl"))
    pip = _run([venv / "bin" / "python", "-m", "pip", "install", "-q", *offline, wheel],
               cwd=base, timeout=600)
    assert pip.returncode == 0, pip.stderr[-3000:]
    work = base / "work"
    work.mkdir()
    return venv / "bin", work


def test_the_wheel_installs_the_projects_names_only(installed):
    """No generic `services`, `accel` or `bench` in a user's site-packages: the folders
    install as cep_service, cep_accel and cep_service.bench."""
    bin_dir, work = installed
    wheel = next((work.parent / "wheels").glob("cep_service-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == \
        {"cep_core", "cep_service", "cep_accel"}
    assert "cep_service/bench/bench_core.py" in names
    assert "cep_service/api/console/index.html" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        assert "cep = cep_service.cli.main:app" in archive.read(entry_points).decode()


def test_the_wheel_holds_the_schemas(installed):
    bin_dir, work = installed
    listed = _run([bin_dir / "cep", "schemas", "--json"], cwd=work)
    assert listed.returncode == 0, listed.stderr
    rows = {row["stream"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert {"trades", "rfid", "sensors"} <= set(rows)
    origin = Path(rows["trades"]["origin"])
    assert origin.name == "trades.json" and origin.parent.name == "schemas"
    assert "site-packages" in origin.parts and ROOT not in origin.parents


def test_core_install_has_no_extras(installed):
    bin_dir, work = installed
    for module in ("pyspark", "matplotlib"):
        found = _run([bin_dir / "python", "-c", f"import {module}"], cwd=work)
        assert found.returncode == 1, f"{module} is importable in the core install"
    where = _run([bin_dir / "python", "-c", "import cep_core; print(cep_core.__file__)"],
                 cwd=work)
    assert ROOT not in Path(where.stdout.strip()).parents
    backfill = _run([bin_dir / "cep", "backfill", ORDERS / "orders.cep", "--input", "x.jsonl",
                     "--output", work / "bf", "--schema", ORDERS / "schemas"], cwd=work)
    assert backfill.returncode == 1
    assert "pip install 'cep-service[spark]'" in backfill.stderr


def test_own_schema_query_and_events(installed):
    bin_dir, work = installed
    cep = bin_dir / "cep"
    schema = work / "orders.json"
    imported = _run([cep, "schemas", "import", ORDERS / "orders.jsonschema.json",
                     "--skip-optional", "--type-attribute", "kind", "--out", schema], cwd=work)
    assert imported.returncode == 0, imported.stderr
    assert json.loads(schema.read_text()) == json.loads((ORDERS / "schemas" /
                                                         "orders.json").read_text())
    queries = work / "orders.cep"
    shutil.copy(ORDERS / "orders.cep", queries)
    events = work / "orders.jsonl"
    shutil.copy(ORDERS / "orders.jsonl", events)
    checked = _run([cep, "check", "orders.cep", "--schema", "orders.json"], cwd=work)
    assert checked.returncode == 0, checked.stderr
    assert "2 queries OK" in checked.stdout
    ran = _run([cep, "run", "orders.cep", "--events", "orders.jsonl",
                "--dead-letters", "dead.jsonl"], cwd=work, env={"CEP_SCHEMA_PATH": str(work)})
    assert ran.returncode == 0, ran.stderr
    composites = [json.loads(line) for line in ran.stdout.splitlines()]
    by_query = {q: [c for c in composites if c["query"] == q]
                for q in ("paid_then_cancelled", "spend")}
    assert by_query["paid_then_cancelled"] and by_query["spend"]
    for found in by_query["paid_then_cancelled"]:
        assert found["events"]["o"]["id"] == found["events"]["c"]["id"] == found["order"]
        assert found["amount"] > 500 and found["events"]["o"]["paid"]
    dead = [json.loads(line) for line in (work / "dead.jsonl").read_text().splitlines()]
    assert [d["line"] for d in dead] == [41]
    unknown = _run([cep, "check", "orders.cep"], cwd=work)  # no schema given: unknown stream
    assert unknown.returncode == 1 and "orders" in unknown.stderr


def test_demo_runs_from_the_installed_package(installed, tmp_path):
    bin_dir, work = installed
    demo = _run([bin_dir / "cep", "demo", "--count", "500", "--workers", "1", "--verify"],
                cwd=work, env={"CEP_HOME": str(tmp_path / "home")}, timeout=240)
    assert demo.returncode == 0, (demo.stdout + demo.stderr)[-3000:]


API_SESSION = """
import sys
import pyarrow as pa
import cep_core as cep
from cep_core.testing import assert_engines_agree, run_query

assert "numba" not in sys.modules
rise = cep.compile("QUERY up FROM trades PARTITION BY symbol PATTERN (a b) "
                   "DEFINE a AS TRUE, b AS price > Last(price) EMIT gain = Last(price) - "
                   "First(price);")
events = pa.table({"symbol": ["A", "B", "A"], "price": [1, 5, 3], "volume": [1, 1, 1],
                   "ts": [1, 2, 3], "seqNum": [0, 1, 2]})
result = rise.run(events)
assert isinstance(result.table, pa.Table) and result.table.column("gain").to_pylist() == [2]
assert run_query(rise, events.to_pylist()) == result.to_dicts()
assert_engines_agree(rise, events.to_pylist())
print("api ok", cep.__file__)
"""


def test_the_python_api_from_the_installed_package(installed):
    bin_dir, work = installed
    session = _run([bin_dir / "python", "-c", API_SESSION], cwd=work)
    assert session.returncode == 0, session.stderr[-3000:]
    assert session.stdout.startswith("api ok") and "site-packages" in session.stdout


def test_the_installed_api_serves_the_console(installed):
    """`cep serve api` of the core install: the console's files are package data."""
    import time
    import urllib.request

    from cep_service.stream.broker import free_port

    bin_dir, work = installed
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    api = subprocess.Popen([bin_dir / "cep", "serve", "api", "--api-port", str(port),
                            "--bootstrap", f"127.0.0.1:{free_port()}"], cwd=work,
                           env=clean, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                    assert b"console.js" in page.read()
                    break
            except OSError:
                assert api.poll() is None and time.monotonic() < deadline, \
                    api.stderr.read().decode() if api.poll() is not None else "no answer"
                time.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/console/console.js",
                                    timeout=5) as script:
            assert b"EventSource" in script.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/console/vendor/uPlot.iife.min.js",
                                    timeout=5) as charts:  # vendored: nothing from a CDN
            assert b"uPlot" in charts.read()
    finally:
        api.terminate()
        api.wait(30)
