"""Where `cep run --engine jit` spends its time, by phase, under cProfile:

    .venv/bin/python bench/peers/profile_run.py QUERY_FILE EVENTS [--engine jit]

Phases (cumulative seconds of the functions that make them): the engines over the table
(columns from the table, the numba kernels, the composites put in order), writing JSON
lines. Reading runs in a thread beside the imports, where cProfile does not see it:
`cep run`'s own summary (printed too) gives its time. Run it twice: the first run fills
the kernel cache.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

from cep_service.cli.main import main as cep_main

# phase -> (file suffix, function name) whose cumulative time is that phase
PHASES = {
    "engines over the table": ("cep_core/stream_engines.py", "run_table"),
    "engines over Event objects": ("cep_core/stream_engines.py", "run_engines"),
    "of which columns from the table": ("cep_core/batch.py", "from_arrow"),
    "of which ordering composites": ("cep_core/composite_order.py", "order"),
    "write JSON lines": ("cep_core/composites.py", "write_jsonl"),
}


def phase_times(stats: pstats.Stats) -> dict[str, float]:
    out = dict.fromkeys(PHASES, 0.0)
    kernels = 0.0
    for (path, _line, name), (_cc, _nc, tt, ct, _callers) in stats.stats.items():
        for phase, (suffix, fn) in PHASES.items():
            if path.endswith(suffix) and name == fn:
                out[phase] += ct
        if "cep_kernel_" in path:
            kernels += tt  # the generated modules' jitted entry points
    out["of which numba kernels"] = kernels
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("query")
    ap.add_argument("events")
    ap.add_argument("--engine", default="jit")
    ap.add_argument("--top", type=int, default=0, help="Also print the top N functions.")
    args = ap.parse_args()

    sys.argv = ["cep", "run", args.query, "--events", args.events, "--engine", args.engine,
                "--out", "/dev/null"]
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    try:
        cep_main()
    except SystemExit:
        pass
    profile.disable()
    total = time.perf_counter() - started
    stats = pstats.Stats(profile, stream=io.StringIO())
    print(f"total {total:.2f}s (under cProfile)")
    for phase, seconds in phase_times(stats).items():
        print(f"  {phase:34s} {seconds:7.2f}s")
    if args.top:
        stats.stream = sys.stdout
        stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
