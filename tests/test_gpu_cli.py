"""`cep gpu verify` and `cep run --placement` in fresh processes (the GPU path needs the
CUDA simulator chosen before numba.cuda is first imported), and placement decisions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cep_accel.gpu.placement import estimated_cost, place
from cep_core.checker import load_queries, load_query_text

ROOT = Path(__file__).resolve().parent.parent
CEP = [sys.executable, "-c", "from cep_service.cli.main import main; main()"]


def cep(*args, **env):
    environment = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    environment.update(env)
    return subprocess.run([*CEP, *args], cwd=ROOT, capture_output=True, text=True,
                          env=environment, timeout=600)


def test_verify_agrees_on_r4_with_host_resident_columns(tmp_path):
    events = tmp_path / "abc.jsonl"
    lines = (ROOT / "examples/data/abc.jsonl").read_text().splitlines()[:120]
    events.write_text("\n".join(lines) + "\n")
    done = cep("gpu", "verify", "examples/r4.cep", "--events", str(events),
               "--batch-size", "40", "--memory-budget", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "agree: r4: gpu" in done.stdout
    assert "all 1 queries agree" in done.stdout


def test_verify_names_a_query_that_failed_instead_of_reporting_no_events(tmp_path):
    """A GPU engine that fails (here: CEP_FAILPOINTS at its first batch; on a real device,
    say, a kernel that does not compile) is contained by the engines, so the run gives no
    composite events for it: verify must say why, not only that the counts differ."""
    events = tmp_path / "abc.jsonl"
    lines = (ROOT / "examples/data/abc.jsonl").read_text().splitlines()[:120]
    events.write_text("\n".join(lines) + "\n")
    done = cep("gpu", "verify", "examples/r4.cep", "--events", str(events),
               CEP_FAILPOINTS="r4:process")
    assert done.returncode == 1
    assert "DISAGREE: r4: gpu" in done.stdout
    assert "query 'r4' failed in process" in done.stdout and "injected" in done.stdout.lower()


def test_verify_reports_cpu_placement_with_reason(tmp_path):
    events = tmp_path / "stocks.jsonl"
    lines = (ROOT / "examples/data/stocks.jsonl").read_text().splitlines()[:60]
    events.write_text("\n".join(lines) + "\n")
    done = cep("gpu", "verify", "examples/stocks.cep", "--events", str(events))
    assert done.returncode == 0, done.stdout + done.stderr
    assert ": cpu" in done.stdout


def test_run_placement_cpu_equals_reference():
    args = ["run", "examples/r4.cep", "--events", "examples/data/abc.jsonl"]
    jit = cep(*args, "--engine", "jit", "--placement", "cpu")
    ref = cep(*args, "--engine", "reference")
    assert jit.returncode == 0, jit.stderr
    assert jit.stdout == ref.stdout and jit.stdout
    assert "placement: r4: cpu" in jit.stderr


def test_placement_decisions():
    [r4] = load_queries(ROOT / "examples/r4.cep")
    assert place(r4, "cpu").target == "cpu"
    assert estimated_cost(r4) == (480_000 + 180_000) * 3
    [kleene] = load_query_text("QUERY k FROM abc INTO k PATTERN SEQ(A a, B+ b, C c) "
                               "WITHIN 10 ms EMIT n = count(b);")
    where = place(kleene, "gpu")
    assert where.target == "cpu" and "Kleene" in where.reason
    marathon = load_queries(ROOT / "examples/marathon.cep")[0]
    where = place(marathon, "auto")
    assert where.target == "cpu" and "MATCH" in where.reason


def test_auto_on_a_real_device_keeps_each_steps_on_the_cpu(monkeypatch):
    """On a real GPU, `auto` places a SEQ query by cost, except one with an EACH step: the
    H200 run (docs/gpu.md) had GPU CDP 3-12x slower there and faster under LAST."""
    from cep_accel.gpu import device
    monkeypatch.setattr(device, "target", lambda: device.CudaTarget.DEVICE)
    monkeypatch.setattr(device, "name", lambda: "a test GPU")
    [r4] = load_queries(ROOT / "examples/r4.cep")  # EACH B b ... LAST A a
    where = place(r4, "auto")
    assert where.target == "cpu" and "EACH step" in where.reason
    [last] = load_query_text("QUERY l FROM abc INTO l DETECT C c, LAST B b WITHIN 8 min FROM c, "
                             "LAST A a WITHIN 3 min FROM b WHERE b.p = c.p EMIT p = c.p;")
    where = place(last, "auto")
    assert where.target == "gpu" and "cost at least" in where.reason
    assert place(r4, "gpu").target == "gpu"  # forced, as before
