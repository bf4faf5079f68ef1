"""Throughput of the reference interpreter on every example query file and its sample data.

The reference interpreter is the baseline that faster engines report their speedup against.
Run: `make bench` (or `.venv/bin/python bench/bench_reference.py`).
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from cep_core import reference
from cep_core.checker import load_queries
from cep_core.event_io import read_events

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def main() -> None:
    table = Table(title="reference interpreter, examples/ sample data")
    for column in ("query file", "stream", "events", "composite events", "seconds",
                   "events/s"):
        table.add_column(column, justify="right" if column != "query file" else "left")
    for path in sorted(EXAMPLES.glob("*.cep")):
        queries = load_queries(path)
        schema = queries[0].schema
        events, _dead = read_events(EXAMPLES / "data" / f"{schema.stream}.jsonl", schema)
        started = time.perf_counter()
        out = reference.run(queries, events)
        seconds = time.perf_counter() - started
        table.add_row(path.name, schema.stream, str(len(events)), str(len(out)),
                      f"{seconds:.3f}", f"{len(events) / seconds:,.0f}")
    Console().print(table)


if __name__ == "__main__":
    main()
