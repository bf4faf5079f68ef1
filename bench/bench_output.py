"""Ordering and writing composite events: the dict path `cep run` had against the columnar
one (`cep_core.composites.Composites`), in one run over the same engine output.

For each workload: its events (already in columns) go through fresh engines once, in
batches of 65,536; the CompositeBatches they give are then ordered and written as JSON
lines to memory, best of `--repeat`:
- old: every composite as a dict (`to_dicts`), `sorted` by `sort_key`, one orjson call per
  dict (what `cep run` did), each step timed;
- new: `np.lexsort` over the columns, then lines built from the columns in bulk;
- lexsort + dicts + orjson: the other exact way to write, the new order then a dict and an
  orjson call per composite (to choose between them);
- to_arrow: `Composites.to_arrow()` (one table, what --out .parquet/.arrow writes).
Both JSON outputs are checked byte for byte equal. Prints composites/s and ratios.

Run: `.venv/bin/python bench/bench_output.py [--events N] [--workloads hyper,finance0]
[--json]`.
"""

from __future__ import annotations

import argparse
import io
import json
import time

import orjson

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_query_text
from cep_core.composite import sort_key
from cep_core.composite_batch import to_dicts
from cep_core.stream_engines import StreamEngines
from cep_core.workloads import WORKLOADS

BATCH = 65_536


def engine_output(workload: str, events: int, seed: int = 1):
    spec = WORKLOADS[workload]
    table = spec.generate(events, seed)
    queries = load_query_text(spec.query_text(seed=seed), path=f"<{workload}>")
    strings = StringDictionary()
    encoder = BatchEncoder(queries[0].schema, strings)
    engines = StreamEngines(queries, strings)
    batches = []
    for start in range(0, events, BATCH):
        rows = table.slice(start, min(BATCH, events - start))
        batches += engines.process_columns(encoder.from_arrow(rows))
    batches += engines.flush_columns()
    return engines, batches


def old_path(engines, batches) -> tuple[bytes, dict]:
    """Dicts, sorted by sort_key, one orjson call each: what `cep run` did."""
    started = time.perf_counter()
    index = {name: q.index for name, q in engines.queries.items()}
    found = to_dicts(batches)
    built = time.perf_counter()
    ordered = sorted(found, key=lambda c: sort_key(c, index[c["query"]]))
    sorted_at = time.perf_counter()
    out = io.BytesIO()
    for c in ordered:
        out.write(orjson.dumps(c, option=orjson.OPT_APPEND_NEWLINE))
    done = time.perf_counter()
    return out.getvalue(), {"old_dicts": built - started, "old_sort": sorted_at - built,
                            "old_orjson": done - sorted_at, "old_total": done - started}


def new_path(engines, batches) -> tuple[bytes, dict]:
    """np.lexsort over the columns, JSON lines from the columns."""
    started = time.perf_counter()
    composites = engines.composites(batches)
    composites.order()
    sorted_at = time.perf_counter()
    out = io.BytesIO()
    composites.write_jsonl(out)
    done = time.perf_counter()
    return out.getvalue(), {"new_order": sorted_at - started, "new_write": done - sorted_at,
                            "new_total": done - started}


def dicts_in_new_order(engines, batches) -> dict:
    """The other way to write exact JSON lines: the columnar order, then a dict per
    composite (`to_dicts`) and one orjson call each."""
    started = time.perf_counter()
    composites = engines.composites(batches)
    order = composites.order().tolist()
    found = to_dicts(batches)
    out = io.BytesIO()
    for i in order:
        out.write(orjson.dumps(found[i], option=orjson.OPT_APPEND_NEWLINE))
    return {"lexsort_dicts_orjson_total": time.perf_counter() - started}


def arrow_table(engines, batches) -> dict:
    started = time.perf_counter()
    engines.composites(batches).to_arrow()
    return {"to_arrow": time.perf_counter() - started}


def measure(workload: str, events: int, repeat: int) -> dict:
    engines, batches = engine_output(workload, events)
    n = sum(len(b) for b in batches)
    best: dict[str, float] = {}
    for _ in range(repeat):
        old, old_times = old_path(engines, batches)
        new, new_times = new_path(engines, batches)
        assert new == old, f"{workload}: the columnar JSON lines differ from the dict path"
        del old, new
        for times in (old_times, new_times, dicts_in_new_order(engines, batches),
                      arrow_table(engines, batches)):
            for name, value in times.items():
                best[name] = min(best.get(name, float("inf")), value)

    def rate(seconds: float) -> int:
        return round(n / seconds) if seconds > 0 else 0

    return {"workload": workload, "events": events, "composites": n,
            **{f"{name}_s": round(value, 4) for name, value in best.items()},
            "old_composites_per_s": rate(best["old_total"]),
            "new_composites_per_s": rate(best["new_total"]),
            "ratio": round(best["old_total"] / best["new_total"], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--workloads", default="hyper,finance0,r5")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [measure(w, args.events, args.repeat) for w in args.workloads.split(",")]
    if args.json:
        print(json.dumps(results))
        return
    for r in results:
        print(f"{r['workload']}: {r['composites']:,} composites from {r['events']:,} events; "
              f"old: dicts {r['old_dicts_s']:.3f}s + sorted {r['old_sort_s']:.3f}s + orjson "
              f"{r['old_orjson_s']:.3f}s = {r['old_total_s']:.3f}s "
              f"({r['old_composites_per_s']:,}/s); new: lexsort {r['new_order_s']:.3f}s + "
              f"lines from columns {r['new_write_s']:.3f}s = {r['new_total_s']:.3f}s "
              f"({r['new_composites_per_s']:,}/s); ratio {r['ratio']}x; lexsort + dicts + "
              f"orjson {r['lexsort_dicts_orjson_total_s']:.3f}s; to_arrow "
              f"{r['to_arrow_s']:.3f}s")


if __name__ == "__main__":
    main()
