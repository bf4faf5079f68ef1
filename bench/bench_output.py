"""Ordering and writing composite events: the dict path `cep run` had against the columnar
one (`cep_core.composites.Composites`), in one run over the same engine output.

For each workload: its events (already in columns) go through fresh engines once, in
batches of 65,536; the CompositeBatches they give are then ordered and written as JSON
lines to memory, best of `--repeat`:
- old: every composite as a dict (`to_dicts`), `sorted` by `sort_key`, one orjson call per
  dict (what `cep run` did);
- new: `np.lexsort` over the columns and lines built from the columns in bulk;
- `dicts+orjson`: the old writing alone, over dicts already in order (the approach of
  orjson over rows, to compare with the columnar text);
- Arrow: `Composites.to_arrow()` (one table, what --out .parquet/.arrow writes).
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
from cep_core.engine import StreamEngines
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


def old_path(engines, batches) -> tuple[bytes, float, float]:
    started = time.perf_counter()
    index = {name: q.index for name, q in engines.queries.items()}
    ordered = sorted(to_dicts(batches), key=lambda c: sort_key(c, index[c["query"]]))
    sorted_at = time.perf_counter()
    out = io.BytesIO()
    for c in ordered:
        out.write(orjson.dumps(c, option=orjson.OPT_APPEND_NEWLINE))
    done = time.perf_counter()
    return out.getvalue(), sorted_at - started, done - started


def new_path(engines, batches) -> tuple[bytes, float, float]:
    started = time.perf_counter()
    composites = engines.composites(batches)
    composites.order()
    sorted_at = time.perf_counter()
    out = io.BytesIO()
    composites.write_jsonl(out)
    done = time.perf_counter()
    return out.getvalue(), sorted_at - started, done - started


def dicts_orjson(batches) -> float:
    rows = to_dicts(batches)
    started = time.perf_counter()
    out = io.BytesIO()
    for c in rows:
        out.write(orjson.dumps(c, option=orjson.OPT_APPEND_NEWLINE))
    return time.perf_counter() - started


def arrow_table(engines, batches) -> float:
    started = time.perf_counter()
    engines.composites(batches).to_arrow()
    return time.perf_counter() - started


def measure(workload: str, events: int, repeat: int) -> dict:
    engines, batches = engine_output(workload, events)
    n = sum(len(b) for b in batches)
    best = {k: float("inf") for k in ("old_sort", "old_total", "new_sort", "new_total",
                                      "dicts_orjson", "arrow")}
    for _ in range(repeat):
        old, old_sort, old_total = old_path(engines, batches)
        new, new_sort, new_total = new_path(engines, batches)
        assert new == old, f"{workload}: the columnar JSON lines differ from the dict path"
        del old, new
        for name, value in (("old_sort", old_sort), ("old_total", old_total),
                            ("new_sort", new_sort), ("new_total", new_total),
                            ("dicts_orjson", dicts_orjson(batches)),
                            ("arrow", arrow_table(engines, batches))):
            best[name] = min(best[name], value)

    def rate(seconds: float) -> int:
        return round(n / seconds) if seconds > 0 else 0

    return {"workload": workload, "events": events, "composites": n,
            "old_sort_s": round(best["old_sort"], 4), "new_sort_s": round(best["new_sort"], 4),
            "sort_ratio": round(best["old_sort"] / best["new_sort"], 1),
            "old_composites_per_s": rate(best["old_total"]),
            "new_composites_per_s": rate(best["new_total"]),
            "ratio": round(best["old_total"] / best["new_total"], 2),
            "dicts_orjson_write_s": round(best["dicts_orjson"], 4),
            "columnar_write_s": round(best["new_total"] - best["new_sort"], 4),
            "to_arrow_s": round(best["arrow"], 4)}


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
              f"order {r['old_sort_s']:.3f}s -> {r['new_sort_s']:.3f}s "
              f"({r['sort_ratio']}x); order+JSON lines {r['old_composites_per_s']:,}/s -> "
              f"{r['new_composites_per_s']:,}/s ({r['ratio']}x); writing alone: "
              f"dicts+orjson {r['dicts_orjson_write_s']:.3f}s, columns "
              f"{r['columnar_write_s']:.3f}s; to_arrow {r['to_arrow_s']:.3f}s")


if __name__ == "__main__":
    main()
