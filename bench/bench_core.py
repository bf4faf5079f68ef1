"""`make bench`: every workload through the jitted engine, events already in columns,
against the reference interpreter measured in the same run (on a prefix of the events).
`events/s`: fresh engines, the whole table as one batch, composite events out as columns;
`steady events/s`: engines already running, batches of 65,536 events; `dicts events/s`:
as `events/s` with every composite event also built as a Python dict (see
`cep_service.bench.kernels`).

    .venv/bin/python -m cep_service.bench.bench_core [--events N] [--json] [--record]

`--record` writes the table into docs/benchmarks.md (cep_service.bench.doc_record), as
`make bench` does.
"""

from __future__ import annotations

import argparse
import sys

import orjson
from rich.console import Console
from rich.table import Table

from cep_service.bench.doc_record import markdown_table, provenance, record
from cep_service.bench.kernels import core

RUNS = [("finance0", {}), ("finance1", {}), ("finance2", {}), ("finance3", {}),
        ("finance4", {}), ("finance5", {}), ("twitter1", {}), ("twitter2", {}),
        ("marathon", {}), ("r5", {}), ("hyper", {}),
        ("q9", {"queries": 1}), ("q9", {"queries": 8}), ("q9", {"queries": 64})]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--only", nargs="*", help="workload names to run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--record", action="store_true",
                        help="write the table into docs/benchmarks.md")
    args = parser.parse_args()
    table = Table(title=f"cep bench core: {args.events:,} events per workload, one core")
    header = ["workload", "queries", "events/s", "steady events/s", "dicts events/s",
              "composite", "reference events/s", "speedup", "agrees"]
    for column in header:
        table.add_column(column, justify="left" if column == "workload" else "right")
    rows: list[list[str]] = []
    for name, options in RUNS:
        if args.only and name not in args.only:
            continue
        try:
            r = core(name, args.events, **options)
        except Exception as e:  # one unsupported workload must not hide the others
            rows.append([name, "", f"error: {e}", "", "", "", "", "", ""])
            table.add_row(*rows[-1])
            continue
        if args.json:
            print(orjson.dumps(r).decode())
        rows.append([name, str(r["queries"]), f"{r['events_per_s']:,}",
                     f"{r['steady_events_per_s']:,}", f"{r['dict_events_per_s']:,}",
                     f"{r['composite_events']:,}", f"{r['reference_events_per_s']:,}",
                     f"{r['speedup']:,}x", "yes" if r["agrees_with_reference"] else "NO"])
        table.add_row(*rows[-1])
    if not args.json:
        Console().print(table)
    if args.record:
        command = "python -m cep_service.bench.bench_core " + " ".join(sys.argv[1:])
        record("kernels", f"{provenance(command)}\n\n{markdown_table(header, rows)}")


if __name__ == "__main__":
    main()
