"""Process model of the services: structured logs, metrics, signals, `cep serve all`.

Logs are JSON lines on stderr, one per event of note: {"ts", "level", "role", "event",
...}. Metrics (services/metrics.py) are on `--metrics-port` (0: off). SIGTERM and
SIGINT set the stop flag: the service finishes its current batch, commits and exits 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import orjson

ROLE = {"name": os.environ.get("CEP_ROLE", "cep")}


def log(event: str, level: str = "info", **fields) -> None:
    record = {"ts": round(time.time(), 3), "level": level, "role": ROLE["name"],
              "event": event, **fields}
    sys.stderr.write(orjson.dumps(record, default=str).decode() + "\n")
    sys.stderr.flush()


@contextmanager
def profiled(role: str):
    """cProfile the calling thread while the block runs when CEP_PROFILE_DIR is set (stats
    go to DIR/ROLE-PID.prof; read them with `python -m pstats`)."""
    target = os.environ.get("CEP_PROFILE_DIR")
    if not target:
        yield
        return
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        Path(target).mkdir(parents=True, exist_ok=True)
        profile.dump_stats(Path(target) / f"{role}-{os.getpid()}.prof")


def stop_flag() -> threading.Event:
    """An Event set by SIGTERM or SIGINT."""
    stopping = threading.Event()

    def handler(signum, _frame):
        log("stopping", signal=signal.Signals(signum).name)
        stopping.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stopping


def spawn(role: str, args: list[str], env: dict | None = None) -> subprocess.Popen:
    """One `cep serve ROLE` subprocess (its own process group)."""
    return subprocess.Popen([sys.executable, "-m", "services.cli", "serve", role, *args],
                            env={**os.environ, **(env or {}), "CEP_ROLE": role},
                            start_new_session=True)


def run_all(args_by_role: list[tuple[str, list[str]]], stopping: threading.Event,
            max_restarts: int = 5, window_s: float = 60.0) -> int:
    """Start one process per role and restart one that dies (it resumes from its checkpoint;
    docs/reliability.md); more than `max_restarts` deaths of one process within `window_s`
    stop everything (exit code 1). On stop, SIGTERM them in pipeline order and wait."""
    processes = [(role, spawn(role, args)) for role, args in args_by_role]
    deaths: list[list[float]] = [[] for _ in processes]
    log("started_all", processes=[{"role": r, "pid": p.pid} for r, p in processes])
    code = 0
    try:
        while not stopping.is_set():
            for i, (role, process) in enumerate(processes):
                if process.poll() is None or stopping.is_set():
                    continue
                now = time.monotonic()
                deaths[i] = [t for t in deaths[i] if now - t < window_s] + [now]
                log("process_exited", level="error", role_of=role, code=process.returncode,
                    deaths=len(deaths[i]))
                if len(deaths[i]) > max_restarts:
                    stopping.set()
                    code = 1
                    break
                processes[i] = (role, spawn(role, args_by_role[i][1]))
                log("process_restarted", role_of=role, pid=processes[i][1].pid)
            stopping.wait(0.2)
    finally:
        terminate(processes)
    return code


def terminate(processes: list[tuple[str, subprocess.Popen]], timeout_s: float = 30) -> None:
    for _, process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        # pipeline order: each stage finishes what it has before the next one stops
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
