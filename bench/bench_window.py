"""Q9 (CQPH) throughput of the jitted WINDOW engine with 1, 8 and 64 concurrent queries.

    SELECT max(price), time FROM ticks [RANGE 4 minutes SLIDE 1 minute WATTR time]
    WHERE symbol IN (...) AND (volume > X OR price < Y) GROUP BY symbol

The queries and ticks are the `q9` workload of `cep_core.workloads` (100 Zipf-distributed
symbols, 10 ms mean gap; query 0 is AAPL/GOOG/MSFT, volume > 500 OR price < 50, the others
draw 1-8 of the 30 most frequent symbols and their thresholds). Events are already in
columns: one Batch of `--events` events, processed by a WindowQuerySet in one call (it
works in chunks internally), then flushed. Compilation is excluded (a warm-up run on a
small batch); the rate is the best of `--repeat` runs. The reference interpreter runs the
same queries over the first `--sample` events (fewer for many queries) in the same
process; the speedup is the ratio of events/s. The reference keeps every event of the
open windows and rescans them per event, so its rate falls as the sample grows (a 4-minute
window holds ~24,000 ticks): the speedup is indicative, quoted with its sample size.

Run: `.venv/bin/python bench/bench_window.py [--events N] [--sample N] [--json]`.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pyarrow.compute as pc
from rich.console import Console
from rich.table import Table

from cep_core import reference
from cep_core.batch import Batch, StringDictionary
from cep_core.checker import load_query_text
from cep_core.compiler.window import compile_window
from cep_core.engine.window import WindowQuerySet
from cep_core.events import Event
from cep_core.workloads import WORKLOADS


def columns(n: int, seed: int = 1):
    """The q9 ticks as a Batch (strings coded with a fresh dictionary) and as a table."""
    table = WORKLOADS["q9"].generate(n, seed)
    strings = StringDictionary()
    cols = {}
    for name in table.column_names:
        column = table.column(name)
        if str(column.type) == "string":
            encoded = pc.dictionary_encode(column).combine_chunks()
            codes = np.array([strings.code(s) for s in encoded.dictionary.to_pylist()],
                             dtype=np.int64)
            cols[name] = codes[encoded.indices.to_numpy(zero_copy_only=False)]
        else:
            cols[name] = np.ascontiguousarray(column.to_numpy())
    seq = cols.pop("seq")
    batch = Batch(seq, cols["time"].copy(), cols)
    return batch, strings, table


def engine_rate(queries, batch: Batch, strings: StringDictionary,
                repeat: int = 1) -> tuple[float, int]:
    """Events/s of a fresh WindowQuerySet over the batch (process + flush), best of
    `repeat` runs, and the number of composite events."""
    best = 0.0
    for _ in range(repeat):
        qset = WindowQuerySet(queries[0].schema, strings)
        for q in queries:
            qset.add(compile_window(q))
        started = time.perf_counter()
        out = qset.process(batch)
        out += qset.flush()
        seconds = time.perf_counter() - started
        best = max(best, len(batch) / seconds)
    return best, len(out)


def reference_rate(queries, table, sample: int) -> tuple[float, int]:
    rows = table.slice(0, sample).to_pylist()
    events = [Event(r.pop("seq"), r["time"], r) for r in rows]
    started = time.perf_counter()
    out = reference.run(queries, events)
    seconds = time.perf_counter() - started
    return len(events) / seconds, len(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--sample", type=int, default=20_000)
    parser.add_argument("--queries", type=int, nargs="*", default=[1, 8, 64])
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    batch, strings, table = columns(args.events)
    results = []
    for k in args.queries:
        queries = load_query_text(WORKLOADS["q9"].query_text(queries=k))
        warm_batch, warm_strings, _ = columns(10_000, seed=2)
        engine_rate(queries, warm_batch, warm_strings)  # compile (or load) the kernels
        rate, composites = engine_rate(queries, batch, strings, args.repeat)
        sample = max(1000, args.sample // max(1, k // 8))
        ref_rate, _ = reference_rate(queries, table, min(sample, args.events))
        results.append({"workload": "q9", "queries": k, "events": args.events,
                        "events_per_s": rate, "composites": composites,
                        "reference_events_per_s": ref_rate,
                        "reference_sample": min(sample, args.events),
                        "speedup": rate / ref_rate})
    if args.json:
        print(json.dumps(results))
        return
    out = Table(title=f"WINDOW engine, q9 (CQPH), {args.events:,} events in columns, one core")
    for column in ("queries", "events/s", "composite events", "reference events/s",
                   "speedup"):
        out.add_column(column, justify="right")
    for r in results:
        out.add_row(str(r["queries"]), f"{r['events_per_s']:,.0f}", f"{r['composites']:,}",
                    f"{r['reference_events_per_s']:,.0f} ({r['reference_sample']:,} ev)",
                    f"{r['speedup']:,.0f}x")
    Console().print(out)


if __name__ == "__main__":
    main()
