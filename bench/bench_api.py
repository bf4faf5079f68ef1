"""Speed through the Python API against `cep run`, on the same data, in one run.

Generates 1M finance1 events (`cep gen finance1 --format jsonl` and `--format parquet`),
then for each format times, best of `--repeat`, each in a fresh process (Python start,
imports and kernel loads included; a first untimed run of each warms numba's cache):
`cep run FILE --engine jit -o /dev/null`, and a Python script doing the same through the
API (`cep.compile(text).run(path)`, composites written as JSON lines to /dev/null). Then,
in this process and warm: `QuerySet.run` over the file and over a pandas DataFrame of it.
Prints events/s of each and the API/`cep run` ratio (above 1: the API is faster).
Run: `.venv/bin/python bench/bench_api.py [--events 1000000] [--repeat 3] [--dir DIR]`.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from bench_run import generate, generated_files_parser  # bench/ is on the path when this runs

import cep_core as cep

ROOT = Path(__file__).resolve().parent.parent
CEP = Path(sys.executable).with_name("cep")
API_SCRIPT = """
import sys
from pathlib import Path
import cep_core as cep
result = cep.compile(Path(sys.argv[1]).read_text()).run(sys.argv[2])
result.composites.write("/dev/null")
"""


def timed(command: list) -> float:
    started = time.perf_counter()
    subprocess.run([str(c) for c in command], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def cep_command(*args) -> list:
    return ([str(CEP)] if CEP.exists() else [sys.executable, "-m", "services.cli.main"]) + \
        list(args)


def main() -> None:
    parser = generated_files_parser(__doc__)
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.gettempdir()) / f"bench_api_{args.events}"
    directory.mkdir(parents=True, exist_ok=True)
    files = generate(directory, args.events, csv=False)  # bench_run's files and events
    query = directory / "finance1.cep"



    queries = cep.compile(query.read_text())
    n = args.events
    print(f"{n:,} finance1 events, best of {args.repeat}; busy machines give noisy numbers")
    print(f"{'format':8} {'what':40} {'seconds':>8} {'events/s':>12}")
    for fmt, path in files.items():
        run = cep_command("run", query, "--events", path, "--engine", "jit", "-o", "/dev/null")
        api = [sys.executable, "-c", API_SCRIPT, query, path]
        timed(run), timed(api)  # warm numba's kernel cache and the OS's file cache
        cli_s = min(timed(run) for _ in range(args.repeat))
        api_s = min(timed(api) for _ in range(args.repeat))
        warm_s = min(_in_process(queries, path) for _ in range(args.repeat))
        rows = [("cep run --engine jit (process)", cli_s),
                ("cep.compile(..).run(path) (process)", api_s),
                ("QuerySet.run(path) (in process, warm)", warm_s)]
        if fmt == "parquet":
            frame = pq.read_table(path).to_pandas()
            rows.append(("QuerySet.run(DataFrame) (in process)",
                         min(_in_process(queries, frame) for _ in range(args.repeat))))
        for what, seconds in rows:
            print(f"{fmt:8} {what:40} {seconds:8.3f} {n / seconds:12,.0f}")
        print(f"{fmt:8} {'API / cep run (processes, events/s)':40} {cli_s / api_s:8.2f}x")


def _in_process(queries, data) -> float:
    started = time.perf_counter()
    queries.run(data).composites.write("/dev/null")
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
