"""`cep run --engine jit` as a whole process, and reading events alone: old reader
(`event_io.read_events`, one dict + Event per record) against the columnar one
(`event_reader.read_table`), on the same generated files.

Generates finance1 events (`cep gen finance1`) as JSON lines and Parquet, plus a CSV copy,
then times each `cep run` in a fresh process (wall clock, imports and kernel loads
included; a first untimed run warms numba's kernel cache) and each read in this process.
Also `cep run` on the first 1000 events (start-up alone) and Parquet in and out. Each
process's CPU seconds (user + system, all its threads) are shown beside its wall time: on
a busy machine they move much less than the wall clock.
Run: `.venv/bin/python bench/bench_run.py [--events 1000000] [--repeat 3] [--dir DIR]
[--processes-only]`.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from cep_core.checker import load_queries
from cep_core.event_io import EventFormat, read_events
from cep_core.event_reader import read_table
from cep_core.schema import StreamSchema

ROOT = Path(__file__).resolve().parent.parent
CEP = Path(sys.executable).with_name("cep")


def cep(*args: object) -> float:
    """Seconds one `cep` command takes, as a process (output to /dev/null)."""
    return cep_times(*args)[0]


def cep_times(*args: object) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one `cep` command, as a process."""
    command = [str(CEP)] if CEP.exists() else [sys.executable, "-m", "cep_service.cli.main"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command + [str(a) for a in args], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def generate(directory: Path, events: int, csv: bool = True) -> dict[EventFormat, Path]:
    files = {fmt: directory / f"trades.{fmt}" for fmt in
             (EventFormat.JSONL, EventFormat.PARQUET, EventFormat.CSV)}
    for fmt in (EventFormat.JSONL, EventFormat.PARQUET):
        if not files[fmt].exists():
            cep("gen", "finance1", "--events", events, "--seed", 7, "--format", fmt,
                "--out", directory)
    if not csv:
        del files[EventFormat.CSV]
    elif not files[EventFormat.CSV].exists():
        pcsv.write_csv(pq.read_table(files[EventFormat.PARQUET]), files[EventFormat.CSV],
                       pcsv.WriteOptions(quoting_style="none"))
    return files


def generated_files_parser(doc: str) -> argparse.ArgumentParser:
    """A command line with --events, --repeat and --dir (where generated files are kept)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the generated files go (kept: later runs reuse them)")
    return parser


def best(repeat: int, measure: Callable[[], float]) -> float:
    return min(measure() for _ in range(repeat))


def main() -> None:
    parser = generated_files_parser(__doc__)
    parser.add_argument("--processes-only", action="store_true",
                        help="time only the `cep run` processes, not the readers in-process")
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.gettempdir()) / f"bench_run_{args.events}"
    directory.mkdir(parents=True, exist_ok=True)
    files = generate(directory, args.events)
    query = directory / "finance1.cep"


    schema = load_queries(query)[0].schema
    n = args.events
    print(f"{n:,} finance1 events, best of {args.repeat}; busy machines give noisy numbers")
    print(f"{'format':8} {'what':34} {'seconds':>8} {'events/s':>12} {'cpu s':>6}")
    tiny = directory / "first1000.jsonl"
    with files[EventFormat.JSONL].open("rb") as f:
        tiny.write_bytes(b"".join(f.readline() for _ in range(1000)))
    processes: list[tuple[str, str, Path, Path | str, int]] = [
        ("start-up", "cep run, first 1000 events", tiny, "/dev/null", 1000)]
    processes += [(fmt, "cep run --engine jit (process)", path, "/dev/null", n)
                  for fmt, path in files.items()]
    processes.append(("parquet", "cep run, Parquet out (process)", files[EventFormat.PARQUET],
                      directory / "out.parquet", n))
    for fmt, what, path, out, events in processes:
        run = ("run", query, "--events", path, "--engine", "jit", "-o", out)
        cep(*run)  # warm
        wall, cpu = min(cep_times(*run) for _ in range(args.repeat))
        print(f"{fmt:8} {what:34} {wall:8.3f} {events / wall:12,.0f} {cpu:6.2f}")
    for fmt, path in ({} if args.processes_only else files).items():
        new = best(args.repeat, partial(_timed, read_table, path, schema))
        old = best(1, partial(_timed, read_events, path, schema))
        for what, seconds in (("read_table (columnar reader)", new),
                              ("read_events (record reader)", old)):
            print(f"{fmt:8} {what:34} {seconds:8.3f} {n / seconds:12,.0f}")
        print(f"{fmt:8} {'reader speed-up':34} {old / new:8.1f}x")


def _timed(read: Callable[..., object], path: Path, schema: StreamSchema) -> float:
    started = time.perf_counter()
    read(path, schema)
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
