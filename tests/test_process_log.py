"""A service's log lines (services/stream/serve.py): JSON on stderr, `{"ts", "level",
"role", "event", ...}`, the role named once when the process starts (`configure_logging`)
and, before that, CEP_ROLE's; Python's logging (Faust's, mode's) in the same lines. Each
case runs in a fresh interpreter: logging's configuration is the process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lines_of(code: str, **env) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "CEP_LOG_LEVEL": "info", **env})
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stderr.splitlines()]


def test_the_role_comes_from_cep_role_until_the_process_names_it():
    found = lines_of("""
from cep_service.stream.serve import configure_logging, log
log("before", n=1)
configure_logging("worker")
log("after", level="warning", n=2)
log("hidden", level="debug")
""", CEP_ROLE="splitter")
    assert [list(line) for line in found] == [["ts", "level", "role", "event", "n"]] * 2
    assert [(r["role"], r["event"], r["level"], r["n"]) for r in found] == [
        ("splitter", "before", "info", 1), ("worker", "after", "warning", 2)]


def test_pythons_logging_writes_the_same_lines_with_the_role():
    found = lines_of("""
import logging
from cep_service.stream.serve import configure_logging
configure_logging("coordinator")
logging.getLogger("faust.worker").warning("rebalancing %d", 3)
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("mode").exception("failed")
""")
    assert [{k: v for k, v in r.items() if k not in ("ts", "traceback")} for r in found] == [
        {"level": "warning", "role": "coordinator", "event": "log", "logger": "faust.worker",
         "message": "rebalancing 3"},
        {"level": "error", "role": "coordinator", "event": "log", "logger": "mode",
         "message": "failed"}]
    assert "ZeroDivisionError" in found[1]["traceback"]


def test_no_role_outside_the_process_log():
    import cep_service.stream.serve as serve

    assert not hasattr(serve, "ROLE")
