"""OpenCEP against `cep run --engine jit`: OpenCEP's test patterns on its enlarged NASDAQ
files, both engines as whole processes, engine-only times, and their match sets compared."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from compare import compare, read_composites, read_seq_lists
from nasdaq import write_enlarged
from patterns import PATTERNS, PeerPattern, cep_query

HERE = Path(__file__).resolve().parent
CLONE = "git clone https://github.com/ilya-kolchinsky/OpenCEP DIR"
_PROCESSING = re.compile(r"processing ([\d.]+)s \(([\d,]+) events/s\)")
_COMPILE = re.compile(r"compile/load ([\d.]+)s")


def check_opencep(directory: Path | None) -> Path:
    if directory is None:
        raise SystemExit(f"OpenCEP: no checkout given; get one with `{CLONE}` and pass "
                         "--opencep DIR (or set OPENCEP_DIR)")
    if not (directory / "CEP.py").is_file() or not (directory / "test/EventFiles").is_dir():
        raise SystemExit(f"OpenCEP: {directory} is not an OpenCEP checkout (no CEP.py or "
                         f"test/EventFiles); get one with `{CLONE}`")
    return directory


def cep_command() -> list[str]:
    script = Path(sys.executable).parent / "cep"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from cep_service.cli.main import main; main()"]


def run_cep(query: Path, events: Path, out: Path, n_events: int) -> dict:
    """`cep run --engine jit` as a whole process, measured after a run over the first
    lines of the events has filled the kernel cache (`warmup_s`: its wall time)."""
    head = events.with_name(f"head_{events.name}")
    with open(events) as src, open(head, "w") as dst:
        dst.writelines(line for _, line in zip(range(1000), src))
    warmup_s, _ = _timed(_cep_run(query, head, out))
    wall_s, stderr = _timed(_cep_run(query, events, out))
    m, c = _PROCESSING.search(stderr), _COMPILE.search(stderr)
    if m is None:
        print(f"warning: no 'processing ...s (... events/s)' in cep run's summary, so no "
              f"engine-only time: {stderr.strip()[-300:]}", file=sys.stderr)
    rate = int(m[2].replace(",", "")) if m else None
    engine_s = n_events / rate if rate else (float(m[1]) if m else None)
    return {"wall_s": wall_s, "warmup_s": warmup_s, "engine_s": engine_s,
            "load_s": float(c[1]) if c else None}


def _cep_run(query: Path, events: Path, out: Path) -> list[str]:
    return [*cep_command(), "run", str(query), "--events", str(events), "--engine", "jit",
            "--out", str(out)]


def run_opencep(directory: Path, python: str, pattern: PeerPattern, events: Path,
                out: Path) -> dict:
    cmd = [python, str(HERE / "opencep_runner.py"), "--opencep", str(directory),
           "--pattern", pattern.name, "--events", str(events), "--out", str(out)]
    wall_s, done = run_timed(cmd, f"OpenCEP runner on {pattern.name}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": wall_s, "engine_s": summary["engine_s"]}


def run_timed(cmd: list[str], what: str) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of `cmd` run to its end, and its result (text); a failure raises
    naming `what`, with the end of its stderr."""
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
    return wall_s, done


def _timed(cmd: list[str]) -> tuple[float, str]:
    wall_s, done = run_timed(cmd, " ".join(cmd))
    return wall_s, done.stderr


def run(directory: Path, scales: list[int], work: Path, names: list[str] | None = None,
        python: str = sys.executable, progress=print) -> list[dict]:
    """One row per pattern and scale."""
    directory = check_opencep(directory)
    rows = []
    for pattern in PATTERNS:
        if names and pattern.name not in names:
            continue
        query = work / f"{pattern.name}.cep"
        query.write_text(cep_query(pattern))
        for scale in scales:
            text, jsonl, n = write_enlarged(directory / "test/EventFiles" / pattern.events,
                                            scale, work / "events")
            ours_out = work / f"{pattern.name}_x{scale}.cep.jsonl"
            theirs_out = work / f"{pattern.name}_x{scale}.opencep.jsonl"
            progress(f"{pattern.name} x{scale} ({n} events): cep ...")
            ours = run_cep(query, jsonl, ours_out, n)
            progress(f"{pattern.name} x{scale}: OpenCEP ...")
            theirs = run_opencep(directory, python, pattern, text, theirs_out)
            rows.append(_row(pattern, scale, n, ours, theirs,
                             compare(read_composites(ours_out), read_seq_lists(theirs_out))))
    return rows


def _row(pattern: PeerPattern, scale: int, n: int, ours: dict, theirs: dict,
         matches: dict) -> dict:
    def rate(s):
        return n / s if s else None

    return {"pattern": pattern.name, "scale": scale, "events": n,
            "cep_process_ev_s": rate(ours["wall_s"]), "cep_engine_ev_s": rate(ours["engine_s"]),
            "opencep_process_ev_s": rate(theirs["wall_s"]),
            "opencep_engine_ev_s": rate(theirs["engine_s"]),
            "process_ratio": theirs["wall_s"] / ours["wall_s"],
            "engine_ratio": (theirs["engine_s"] / ours["engine_s"]) if ours["engine_s"]
            else None,
            "cep": ours, "opencep": theirs, "matches": matches}
