"""The command line of a benchmark that times a few workloads of `--events` events each."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable


def workloads_main(doc: str, run: Callable[[int], list[dict]],
                   print_table: Callable[[list[dict]], None]) -> None:
    """`run(events)` gives one row a workload: printed as JSON lines with `--json`, else by
    `print_table`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000,
                        help="events timed per workload (after the warm-up)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args.events)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print_table(rows)
