"""Process model of the services: structured logs, metrics, signals, `cep serve all`.

Logs are JSON lines on stderr, one per event of note: {"ts", "level", "role", "event",
...}. The role is the process's, named once at its start (`configure_logging`; before
that CEP_ROLE, else "cep"); `log` writes with it. Metrics (services/stream/metrics.py) are
on `--metrics-port` (0: off). SIGTERM, SIGINT and SIGHUP set the stop flag: the service
finishes its current batch, commits and exits 0.
"""

from __future__ import annotations

import cProfile
import ctypes
import logging
import logging.config
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


def log_level() -> int:
    """The threshold set by CEP_LOG_LEVEL (debug, info, warning, error; default info)."""
    name = os.environ.get("CEP_LOG_LEVEL", "info").lower()
    if name not in LEVELS:
        raise ValueError(f"CEP_LOG_LEVEL={name!r}: not one of {', '.join(LEVELS)}")
    return LEVELS[name]


def _write(record: dict) -> None:
    sys.stderr.write(orjson.dumps(record, default=str).decode() + "\n")
    sys.stderr.flush()


@dataclass(frozen=True)
class ProcessLog:
    """The JSON log lines of one process, each with its `role`."""

    role: str

    def write(self, event: str, level: str = "info", **fields: Any) -> None:
        if LEVELS[level] < log_level():
            return
        _write({"ts": round(time.time(), 3), "level": level, "role": self.role,
                "event": event, **fields})

    def logging_config(self) -> dict:
        """A `logging.config.dictConfig` for the root logger: JSON lines on stderr at
        CEP_LOG_LEVEL, with this role."""
        return {"version": 1, "disable_existing_loggers": False,
                "formatters": {"json": {"()": JsonLogFormatter, "role": self.role}},
                "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json",
                                        "stream": "ext://sys.stderr"}},
                "root": {"level": log_level(), "handlers": ["stderr"]}}


# this process's log: replaced only by configure_logging, read only by this module
_process_log = ProcessLog(os.environ.get("CEP_ROLE", "cep"))


def configure_logging(role: str) -> ProcessLog:
    """Name this process's role, at its start: in `log`'s lines and in those of Python's
    logging (Faust's, mode's, aiokafka's), which it sends to stderr as JSON lines."""
    global _process_log
    _process_log = ProcessLog(role)
    logging.config.dictConfig(_process_log.logging_config())
    return _process_log


def log(event: str, level: str = "info", **fields: Any) -> None:
    """One JSON line of this process's log (its role: `configure_logging`)."""
    _process_log.write(event, level, **fields)


def logging_config() -> dict:
    """This process's `logging.config.dictConfig` (for Faust's worker, which applies it)."""
    return _process_log.logging_config()


class JsonLogFormatter(logging.Formatter):
    """Records of Python's logging (Faust's, mode's, aiokafka's) as the same JSON lines as
    `log`: event "log", the logger's name, its message, and a traceback where there is one."""

    def __init__(self, role: str, **options: Any) -> None:
        super().__init__(**options)
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        fields = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                  "role": self.role, "event": "log", "logger": record.name,
                  "message": record.getMessage()}
        if record.exc_info:
            fields["traceback"] = self.formatException(record.exc_info)
        return orjson.dumps(fields, default=str).decode()


@contextmanager
def profiled(role: str) -> Iterator[None]:
    """cProfile the calling thread while the block runs when CEP_PROFILE_DIR is set (stats
    go to DIR/ROLE-PID.prof; read them with `python -m pstats`)."""
    target = os.environ.get("CEP_PROFILE_DIR")
    if not target:
        yield
        return

    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        Path(target).mkdir(parents=True, exist_ok=True)
        profile.dump_stats(Path(target) / f"{role}-{os.getpid()}.prof")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def stop_flag() -> threading.Event:
    """An Event set by SIGTERM, SIGINT or SIGHUP."""
    stopping = threading.Event()

    def handler(signum: int, _frame: FrameType | None) -> None:
        log("stopping", signal=signal.Signals(signum).name)
        stopping.set()

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    return stopping


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP raise SystemExit in the main thread, as Ctrl-C raises
    KeyboardInterrupt, so a command's `finally` blocks stop the processes it started. Once
    one has arrived, more are ignored, so they cannot cut that clean-up short."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        for other in STOP_SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, handler)


def die_with_parent() -> None:
    """A `preexec_fn`: the child gets SIGTERM when the process that started it dies, even
    by SIGKILL, so no service or broker is left behind as an orphan (Linux; elsewhere a
    no-op). The child must be started from the main thread: it is the thread's death that
    counts."""
    if sys.platform != "linux":
        return

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def spawn(role: str, args: list[str], env: dict | None = None) -> subprocess.Popen:
    """One `cep serve ROLE` subprocess (its own process group; it stops when we die)."""
    return subprocess.Popen([sys.executable, "-m", "cep_service.cli.main", "serve", role, *args],
                            env={**os.environ, **(env or {}), "CEP_ROLE": role},
                            start_new_session=True, preexec_fn=die_with_parent)


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
