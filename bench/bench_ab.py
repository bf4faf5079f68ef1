"""A/B throughput of the jitted engines: this tree against a baseline copy of `cep_core`,
run alternately (A, B, A, B, ...) so that both see the same machine load; medians.

    cp -r cep_core /tmp/base/          # before the change
    .venv/bin/python bench/bench_ab.py --baseline /tmp/base [--events N] [--reps R]

Each run is a fresh process (the two versions of `cep_core` cannot share one), timing the
same events two ways after warming the kernels on a prefix:

- `whole`: fresh engines over the whole table as one batch, best of 3 (what `cep bench core`
  reports);
- `steady`: fresh engines that have processed the first half of the table, timed on the
  second half in batches of `--batch` events (a streaming engine's steady state).

Each is given per wall-clock second and per second of the process's CPU time (`_cpu`: what
is left when other jobs share the core). Both also report how many composite events they
found (must agree between A and B).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson

from cep_core import stream_engines as jit
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_query_text
from cep_core.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parent.parent
RUNS = [("finance0", {}), ("finance1", {}), ("finance2", {}), ("finance3", {}),
        ("finance4", {}), ("marathon", {}),
        ("q9", {"queries": 1}), ("q9", {"queries": 8}), ("q9", {"queries": 64})]


def measure(workload: str, events: int, batch: int, options: dict) -> dict:
    """One measurement in this process (public API only: it runs on either version)."""
    spec = WORKLOADS[workload]
    table = spec.generate(events, 1)
    queries = load_query_text(spec.query_text(seed=1, **options), path=f"<{workload}>")

    def encoded(rows):
        strings = StringDictionary()
        return strings, BatchEncoder(queries[0].schema, strings).from_arrow(rows)

    strings, warm = encoded(table.slice(0, 1000))
    jit.StreamEngines(queries, strings).process(warm)
    whole_s = whole_cpu = float("inf")
    for _ in range(3):  # best of 3, as `cep bench core`
        strings, whole = encoded(table)
        engines = jit.StreamEngines(queries, strings)
        started, cpu = time.perf_counter(), time.process_time()
        found = len(engines.process(whole)) + len(engines.flush())
        whole_s = min(whole_s, time.perf_counter() - started)
        whole_cpu = min(whole_cpu, time.process_time() - cpu)

    strings, data = encoded(table)
    engines = jit.StreamEngines(queries, strings)
    half = events // 2
    for a in range(0, half, batch):
        engines.process(data.slice(a, min(a + batch, half)))
    started, cpu = time.perf_counter(), time.process_time()
    steady_found = 0
    for a in range(half, events, batch):
        steady_found += len(engines.process(data.slice(a, min(a + batch, events))))
    steady_s = time.perf_counter() - started
    steady_cpu = time.process_time() - cpu
    return {"whole": events / whole_s, "whole_cpu": events / whole_cpu,
            "steady": (events - half) / steady_s, "steady_cpu": (events - half) / steady_cpu,
            "found": found, "steady_found": steady_found}


def _child(root: Path, workload: str, events: int, batch: int, options: dict) -> dict:
    code = ("import sys, orjson; sys.path.insert(0, sys.argv[1]); "
            "from bench_ab import measure; "
            "print(orjson.dumps(measure(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), "
            "orjson.loads(sys.argv[5]))).decode())")
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), workload,
                          str(events), str(batch), orjson.dumps(options).decode()],
                         env=env, check=True, capture_output=True, text=True, cwd=root)
    return orjson.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, type=Path,
                        help="a folder holding the baseline's cep_core package")
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="workload names (q9 runs 1, 8 and 64 queries)")
    args = parser.parse_args()
    for name, options in RUNS:
        if args.only and name not in args.only:
            continue
        runs: dict[str, list[dict]] = {"A": [], "B": []}
        for _ in range(args.reps):
            for label, root in (("A", args.baseline), ("B", ROOT)):
                runs[label].append(_child(root, name, args.events, args.batch, options))
        found = {label: {r["found"] for r in rs} for label, rs in runs.items()}
        row = {"workload": name, **options, "events": args.events, "batch": args.batch,
               "reps": args.reps, "same_results": found["A"] == found["B"]}
        for figure in ("whole", "whole_cpu", "steady", "steady_cpu"):
            a = statistics.median(r[figure] for r in runs["A"])
            b = statistics.median(r[figure] for r in runs["B"])
            row[f"{figure}_baseline_per_s"] = round(a)
            row[f"{figure}_per_s"] = round(b)
            row[f"{figure}_ratio"] = round(b / a, 3)
        print(orjson.dumps(row).decode(), flush=True)


if __name__ == "__main__":
    main()
