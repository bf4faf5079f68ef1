"""SEQ throughput by incremental automata (AIP) against the reference interpreter and CDP,
all measured in the same run, on one core, events already in columns.

Workloads (`cep_core.workloads`, deterministic and seeded):
- `r5_last`, `r5_each`: Cugola & Margara's base scenario (stream `rules`: one event per
  tick, types A-E uniform, `att` uniform in [1, 50000]) with the rule
  `DETECT C c, LAST|EACH B b WITHIN 100000 FROM c, LAST|EACH A a WITHIN 100000 FROM b
  WHERE a.att = c.att AND b.att = c.att`. AIP keys its instances by `att` (an equality
  class), resolves LAST among the instances that complete.
- `hyper_not`, `hyper_kleene`: HYPERSONIC-style `PATTERN SEQ` of 5 tickers with rising opens
  and one inner NOT or KLEENE{1,3} over minute bars of 10 tickers, WITHIN 4 minutes.
- `falling`: the `stocks.cep` example (`SEQ(AAPL a, AMZN b, AVID c)`, falling opens, WITHIN
  5 minutes) over the same bars.

The engines process a warm-up prefix first (compiling the kernel and filling the window),
then the timed events in batches of 65536. The reference interpreter is far too slow to
fill a 100000-tick window event by event, so it is measured in steady state: its partition
buffer is set to the events of its horizon before the timed events (what processing them
would leave; these queries hold no pending match or run), then it processes the next
events of the same stream. `agree` says whether AIP and CDP found the same composite
events over the timed events (when CDP runs the query).

Run: `.venv/bin/python bench/bench_seq_aip.py [--events N] [--json]`.
"""

from __future__ import annotations

import time

from cep_service.bench.bench_seq import steady_rate
from cep_service.bench.workloads_cli import workloads_main
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_query_text
from cep_core.composite import sort_key
from cep_core.engine_factory import seq_aip_engine, seq_engine
from cep_core.event_io import decode_record
from cep_core.reference.seq import SeqInterpreter
from cep_core.workloads import WORKLOADS, HyperStep

BATCH = 65536

STOCKS_FALLING = """QUERY falling FROM stocks
PATTERN SEQ(AAPL a, AMZN b, AVID c)
WHERE a.open > b.open AND b.open > c.open
WITHIN 5 minutes"""


def cases() -> list[tuple]:
    """(name, workload, query text, warm-up events, reference events timed)."""
    r5 = WORKLOADS["r5"]
    hyper = WORKLOADS["hyper"]
    out = [(f"r5_{v}", "r5", r5.query_text(seed=1, variant=v), 200_000, 20)
           for v in ("last", "each")]
    for kind in HyperStep:
        text = hyper.query_text(seed=1, length=5, kind=kind)
        out.append((f"hyper_{kind}", "hyper", text, 20_000, 3_000))
    out.append(("falling", "hyper", STOCKS_FALLING, 20_000, 3_000))
    return out


def engine_rate(factory, checked, table, warm: int, **options) -> tuple[float, list]:
    strings = StringDictionary()
    encoder = BatchEncoder(checked.schema, strings)
    engine = factory(checked, strings, **options)
    engine.process(encoder.from_arrow(table.slice(0, warm)))  # compiles, fills the window
    batches = [encoder.from_arrow(table.slice(lo, min(BATCH, table.num_rows - lo)))
               for lo in range(warm, table.num_rows, BATCH)]
    found = []
    started = time.perf_counter()
    for batch in batches:
        found += engine.process(batch)
    found += engine.flush()
    seconds = time.perf_counter() - started
    return (table.num_rows - warm) / seconds, found


def reference_rate(checked, table, start: int, count: int) -> float:
    schema = checked.schema
    interp = SeqInterpreter(checked)
    horizon = interp.horizon
    rows = table.slice(0, start + count).to_pylist()
    events = [decode_record(row, schema, i) for i, row in enumerate(rows)]
    timed = events[start:]
    warm = events[:start]
    if horizon is not None and timed:
        warm = [e for e in warm if e.ts >= timed[0].ts - horizon]
    return steady_rate(interp, warm, timed, count)


def run(events: int) -> list[dict]:
    rows = []
    for name, workload, text, warm, ref_count in cases():
        [checked] = [q for q in load_query_text(text)]
        table = WORKLOADS[workload].generate(warm + events, 1)
        aip, found = engine_rate(seq_aip_engine, checked, table, warm)
        try:
            cdp, cdp_found = engine_rate(seq_engine, checked, table, warm, algorithm="cdp")
        except Exception:  # CDP may not evaluate every query
            cdp, cdp_found = None, None
        ref = reference_rate(checked, table, warm, ref_count)
        agree = None
        if cdp_found is not None:
            agree = sorted(found, key=lambda c: sort_key(c, 0)) == \
                sorted(cdp_found, key=lambda c: sort_key(c, 0))
        rows.append({"workload": name, "events": events, "composites": len(found),
                     "aip_events_per_s": aip, "cdp_events_per_s": cdp,
                     "reference_events_per_s": ref, "speedup_vs_reference": aip / ref,
                     "aip_over_cdp": aip / cdp if cdp else None, "agree_with_cdp": agree})
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'workload':<13} {'events':>10} {'composites':>11} {'AIP ev/s':>13} "
          f"{'CDP ev/s':>13} {'reference ev/s':>15} {'AIP/ref':>9} {'AIP/CDP':>8} "
          f"{'agree':>6}")
    for r in rows:
        cdp = f"{r['cdp_events_per_s']:,.0f}" if r["cdp_events_per_s"] else "-"
        ratio = f"{r['aip_over_cdp']:.2f}" if r["aip_over_cdp"] else "-"
        agree = {True: "yes", False: "NO", None: "-"}[r["agree_with_cdp"]]
        print(f"{r['workload']:<13} {r['events']:>10,} {r['composites']:>11,} "
              f"{r['aip_events_per_s']:>13,.0f} {cdp:>13} "
              f"{r['reference_events_per_s']:>15,.1f} {r['speedup_vs_reference']:>8,.0f}x "
              f"{ratio:>8} {agree:>6}")


if __name__ == "__main__":
    workloads_main(__doc__, run, print_table)
