"""SEQ throughput: the jitted CDP engine against the reference interpreter, same run.

Workloads (deterministic, seeded):
- `r5_last`, `r5_each`: Cugola & Margara's base scenario (schemas/rules.json): one event per
  tick, types A/B/C uniform, `att` uniform in [1, 50000], the 3-step rule
  `DETECT C c, LAST|EACH B b WITHIN 100000 FROM c, LAST|EACH A a WITHIN 100000 FROM b
  WHERE a.att = c.att AND b.att = c.att` (equal to `a.att = b.att = c.att`; the checker
  rejects a condition on LAST b that mentions the earlier a).
- `hyper`: HYPERSONIC-style `PATTERN SEQ(AAPL a, AMZN b, AVID c) WHERE a.open > b.open AND
  b.open > c.open WITHIN 5 minutes` over minute bars of 20 tickers (a common random walk
  plus per-ticker noise).

The engine runs over events already in columns (one Batch per 65536 events), after a
warm-up that fills its window and compiles its kernel. The reference interpreter is far
too slow to fill a 100000-tick window event by event, so it is measured in steady state:
its partition buffer is set to the window's events directly (what it would hold after
processing them), then it processes the next events of the same stream, timed.

Run: `.venv/bin/python bench/bench_seq.py [--events N] [--json]`.
"""

from __future__ import annotations

import time

import numpy as np

from cep_service.bench.workloads_cli import workloads_main
from cep_core.batch import Batch, StringDictionary
from cep_core.checker import load_query_text
from cep_core.engine_factory import create_engine
from cep_core.events import Event
from cep_core.reference.seq import SeqInterpreter
from cep_core.schema import AttrType

R5 = """QUERY r5_{name} FROM rules
DETECT C c, {policy} B b WITHIN 100000 ticks FROM c, {policy} A a WITHIN 100000 ticks FROM b
WHERE a.att = c.att AND b.att = c.att"""

HYPER = """QUERY hyper FROM stocks
PATTERN SEQ(AAPL a, AMZN b, AVID c) WHERE a.open > b.open AND b.open > c.open
WITHIN 5 minutes"""

TICKERS = ["AAPL", "AMZN", "AVID", "GOOG", "MSFT", "IBM", "ORCL", "INTC", "CSCO", "NVDA",
           "AMD", "QCOM", "TXN", "ADBE", "CRM", "NFLX", "PYPL", "SBUX", "COST", "PEP"]


def r5_stream(n: int, seed: int = 5) -> tuple[dict, list[str]]:
    rng = np.random.default_rng(seed)
    return {"type": rng.integers(0, 3, n), "att": rng.integers(1, 50_001, n),
            "ts": np.arange(n, dtype=np.int64)}, ["A", "B", "C"]


def hyper_stream(n: int, seed: int = 7) -> tuple[dict, list[str]]:
    rng = np.random.default_rng(seed)
    k = len(TICKERS)
    minutes = n // k + 1
    # a common random walk plus each ticker's own noise: orderings keep changing
    walk = 100 + np.cumsum(rng.normal(0, 0.3, (minutes, 1)), axis=0) + \
        rng.normal(0, 1, (minutes, k))
    order = np.argsort(rng.random((minutes, k)), axis=1)  # bars of a minute in any order
    ticker = order.reshape(-1)[:n]
    minute = np.repeat(np.arange(minutes), k)[:n]
    open_ = np.round(walk[minute, ticker], 2)
    return {"ticker": ticker, "ts": 1_704_187_800_000 + minute * 60_000, "open": open_,
            "peak": open_ + 0.2, "low": open_ - 0.2, "close": open_, "volume":
            rng.integers(100, 10_000, n)}, TICKERS


def to_batch(columns: dict, type_attr: str, names: list[str], schema,
             strings: StringDictionary) -> Batch:
    codes = np.array([strings.code(s) for s in names], np.int64)
    cols = {}
    for name, kind in schema.attributes.items():
        values = columns[name]
        if name == type_attr:
            values = codes[values]
        cols[name] = np.asarray(values, dtype=np.float64 if kind == AttrType.FLOAT else np.int64)
    n = len(cols[schema.time])
    return Batch(np.arange(n, dtype=np.int64), cols[schema.time].copy(), cols)


def to_events(columns: dict, type_attr: str, names: list[str], schema, lo: int,
              hi: int) -> list[Event]:
    out = []
    for i in range(lo, hi):
        attrs = {}
        for name, kind in schema.attributes.items():
            v = columns[name][i]
            if name == type_attr:
                attrs[name] = names[int(v)]
            elif kind == AttrType.FLOAT:
                attrs[name] = float(v)
            else:
                attrs[name] = int(v)
        out.append(Event(i, attrs[schema.time], attrs))
    return out


def bench_engine(checked, batch: Batch, strings: StringDictionary, warm: int,
                 batch_size: int = 65536) -> tuple[float, int]:
    engine = create_engine(checked, strings)
    engine.process(batch.slice(0, warm))  # compiles, fills the window
    found = 0
    started = time.perf_counter()
    for lo in range(warm, len(batch), batch_size):
        found += len(engine.process(batch.slice(lo, min(lo + batch_size, len(batch)))))
    found += len(engine.flush())
    seconds = time.perf_counter() - started
    return (len(batch) - warm) / seconds, found


def bench_reference(checked, columns, type_attr, names, window_events: int, start: int,
                    count: int) -> float:
    schema = checked.schema
    interp = SeqInterpreter(checked)
    warm = to_events(columns, type_attr, names, schema, max(start - window_events, 0), start)
    timed = to_events(columns, type_attr, names, schema, start, start + count)
    return steady_rate(interp, warm, timed, count)


def steady_rate(interp: SeqInterpreter, warm: list, timed: list, count: int) -> float:
    """`count` events over the time the reference interpreter takes on `timed`, its
    partition first left as processing the window's events `warm` leaves it (steady
    state)."""
    part = interp._partition(None)
    part.events = warm
    part.last_ts = warm[-1].ts if warm else None
    started = time.perf_counter()
    for e in timed:
        interp.process(e)
    return count / (time.perf_counter() - started)


def run(events: int) -> list[dict]:
    rows = []
    cases = [(f"r5_{p.lower()}", R5.format(name=p.lower(), policy=p), r5_stream, "type",
              100_000, 100_000, 20) for p in ("LAST", "EACH")]
    cases.append(("hyper", HYPER, hyper_stream, "ticker", 200_000, 100, 2000))
    for name, text, make, type_attr, warm, window_events, ref_count in cases:
        [checked] = load_query_text(text)
        columns, names = make(warm + events)
        strings = StringDictionary()
        batch = to_batch(columns, type_attr, names, checked.schema, strings)
        eps, found = bench_engine(checked, batch, strings, warm)
        ref = bench_reference(checked, columns, type_attr, names, window_events, warm,
                              ref_count)
        rows.append({"workload": name, "events": events, "composites": found,
                     "events_per_s": eps, "reference_events_per_s": ref,
                     "speedup": eps / ref})
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'workload':<10} {'events':>10} {'composites':>11} {'CDP events/s':>14} "
          f"{'reference ev/s':>15} {'speedup':>10}")
    for r in rows:
        print(f"{r['workload']:<10} {r['events']:>10,} {r['composites']:>11,} "
              f"{r['events_per_s']:>14,.0f} {r['reference_events_per_s']:>15,.1f} "
              f"{r['speedup']:>9,.0f}x")


if __name__ == "__main__":
    workloads_main(__doc__, run, print_table)
