"""`make bench`: the six finance workloads (one `trades` Parquet file, all six queries)
through the Spark backfill in local[2], against `cep run --engine jit` in one process
measured in the same run (read the file, run, write JSON lines).

    .venv/bin/python bench/bench_backfill.py [--events N] [--master local[2]] [--json]
"""

from __future__ import annotations

import argparse

import orjson
from rich.console import Console
from rich.table import Table

from cep_service.bench.spark_backfill import bench_backfill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=None,
                        help="Spark partitions per keyed group (default: the cores)")
    parser.add_argument("--baseline-events", type=int, default=None,
                        help="events for the single-process jit baseline (default: all)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    console = Console(stderr=True)
    result = bench_backfill(args.events, master=args.master, partitions=args.partitions,
                            baseline_events=args.baseline_events, console=console)
    if args.json:
        print(orjson.dumps(result).decode())
        return
    table = Table(title=f"cep bench backfill: finance0..5, {args.events:,} events")
    for column in ("side", "events", "seconds", "events/s", "composite events"):
        table.add_column(column, justify="right")
    table.add_row(f"backfill {args.master}", f"{result['events']:,}",
                  f"{result['backfill_s']:.2f}", f"{result['backfill_events_per_s']:,}",
                  f"{result['backfill_composites']:,}")
    table.add_row("cep run --engine jit", f"{result['jit_events']:,}",
                  f"{result['jit_total_s']:.2f}", f"{result['jit_events_per_s']:,}",
                  f"{result['jit_composites']:,}")
    Console().print(table)
    Console().print(f"ratio backfill / jit: {result['ratio_backfill_over_jit']}x; jit engine "
                    f"alone (events in memory): {result['jit_engine_events_per_s']:,} events/s; "
                    f"jit read {result['jit_read_s']:.1f}s of {result['jit_total_s']:.1f}s")


if __name__ == "__main__":
    main()
