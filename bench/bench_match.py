"""Throughput of the jitted MATCH engine, with its speedup over the reference interpreter.

Events are built directly as numpy columns (a `Batch`), so the numbers are the engine's:
key ids, the kernel, and turning the matches into composite events.

- `mshape` (Hirzel's finance1, the M-shape / double top): trades of 390 symbols, prices are
  random walks in cents; predicates read First/Last (aggregate mode).
- `marathon` (Woods et al.): runners pass five checkpoints in order, every 12th skips one;
  partitioned by runner; aggregate-free predicates (bit-parallel mode).

`events_per_s` is end to end (`MatchEngine.process` returning composite events, best of
`--repeat` runs, wall clock); `cpu_events_per_s` the same over the thread's CPU time (what
is left when other processes share the core); `kernel_events_per_s` counts only the
(wall-clock) time inside the generated kernel
(the rest is key ids and building the composite events' dicts in Python, which grows with
the number of matches). The reference interpreter runs on a prefix of the same events in
the same run (it is three orders of magnitude slower, so a prefix is enough for its rate);
its output on that prefix is also compared with the engine's.

With `--workloads`, also finance1 and marathon as `cep_core.workloads` generates them
(Zipf-skewed symbols; runners in three start waves, all on the course at once), the data
`cep bench core` uses.

Run: `.venv/bin/python bench/bench_match.py [--events N] [--batch B] [--workloads] [--json]`.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any

import numpy as np

from cep_core.batch import Batch, BatchEncoder, StringDictionary
from cep_core.checker import load_query_text
from cep_core.compiler.match import compile_match
from cep_core.engine.match import MatchEngine
from cep_core.events import Event
from cep_core.reference.match import MatchInterpreter
from cep_core.workloads import WORKLOADS
from cep_core.schema import AttrType, StreamSchema

MSHAPE = WORKLOADS["finance1"].query_text()

MARATHON = WORKLOADS["marathon"].query_text()

T0 = 1_704_187_800_000
CHECKPOINTS = ["Staten Island", "Brooklyn", "Queens", "Bronx", "Manhattan"]


def trades(n: int, symbols: int = 390, seed: int = 1) -> tuple[Batch, StringDictionary]:
    rng = np.random.default_rng(seed)
    strings = StringDictionary([f"S{i:03d}" for i in range(symbols)])
    sym = rng.integers(0, symbols, n, dtype=np.int64)
    steps = rng.choice(np.array([-30, -20, -10, 0, 10, 20, 30], np.int64), n)
    order = np.argsort(sym, kind="stable")
    walk = np.cumsum(steps[order])
    starts = np.searchsorted(sym[order], np.arange(symbols))
    before = np.concatenate(([0], walk))[starts]  # walk total before each symbol's block
    counts = np.bincount(sym, minlength=symbols)
    walk -= np.repeat(before, counts)
    price = np.empty(n, np.int64)
    price[order] = walk
    price += rng.integers(5_000, 50_000, symbols)[sym]
    ts = T0 + np.cumsum(rng.integers(0, 4, n, dtype=np.int64))
    columns = {"symbol": sym, "price": price, "volume": rng.integers(1, 500, n),
               "ts": ts, "seqNum": np.arange(n, dtype=np.int64)}
    return Batch(np.arange(n, dtype=np.int64), ts, columns), strings


def checkpoints(n: int, concurrent: int = 50_000, cheat_every: int = 12, seed: int = 2
                ) -> tuple[Batch, StringDictionary]:
    """About n checkpoint passages: runners start one after the other so that about
    `concurrent` are on the course at a time; every `cheat_every`th runner skips one
    checkpoint (Brooklyn, Queens or the Bronx)."""
    rng = np.random.default_rng(seed)
    strings = StringDictionary(CHECKPOINTS)
    runners = n // 5 + 1
    minute = 60_000
    pace = rng.integers(25, 60, runners) * minute  # per leg
    course = 4 * 45 * minute
    start = T0 + np.sort(rng.integers(0, runners * course // concurrent, runners))
    legs = np.arange(5, dtype=np.int64)
    times = start[:, None] + legs[None, :] * pace[:, None] + \
        rng.integers(-5, 6, (runners, 5)) * minute * (legs > 0)
    keep = np.ones((runners, 5), bool)
    cheaters = np.arange(runners) % cheat_every == cheat_every - 1
    keep[cheaters, rng.integers(1, 4, int(cheaters.sum()))] = False
    runner = np.broadcast_to(np.arange(1, runners + 1)[:, None], (runners, 5))[keep]
    checkpoint = np.broadcast_to(legs[None, :], (runners, 5))[keep]
    ts = times[keep]
    order = np.argsort(ts, kind="stable")[:n]
    ts = ts[order]
    columns = {"runner": runner[order].astype(np.int64),
               "checkpoint": checkpoint[order].astype(np.int64), "ts": ts}
    return Batch(np.arange(len(ts), dtype=np.int64), ts, columns), strings


def events_of(batch: Batch, schema: StreamSchema, strings: StringDictionary, limit: int
              ) -> list[Event]:
    """The first `limit` events of a batch as the reference interpreter's Events."""
    out = []
    cols = {name: batch.columns[name][:limit].tolist() for name in schema.attributes}
    for i in range(min(limit, len(batch))):
        attrs = {}
        for name, kind in schema.attributes.items():
            v = cols[name][i]
            attrs[name] = strings.decode(v) if kind == AttrType.STRING else v
        out.append(Event(int(batch.seq[i]), int(batch.ts[i]), attrs))
    return out


class _Timed:
    """Wraps a kernel to add up the seconds spent inside it."""

    def __init__(self, kernel: Any) -> None:  # (a MatchProgram kernel: numba, untyped)
        self.kernel, self.seconds = kernel, 0.0

    def __call__(self, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.kernel(*args)
        finally:
            self.seconds += time.perf_counter() - started


def measure(name: str, text: str, batch: Batch, strings: StringDictionary, batch_size: int,
            sample: int, repeat: int) -> dict:
    checked = load_query_text(text)[0]
    n = len(batch)
    # Compile (or load from numba's cache) outside the timing.
    program = compile_match(checked)
    MatchEngine(program, StringDictionary(strings.strings)).process(batch.slice(0, 1000))

    best: tuple[float, float, int, float] | None = None
    for _ in range(repeat):
        timed = _Timed(program.kernel)
        engine = MatchEngine(replace(program, kernel=timed), StringDictionary(strings.strings))
        found = 0
        started, cpu_started = time.perf_counter(), time.thread_time()
        for lo in range(0, n, batch_size):
            found += len(engine.process(batch.slice(lo, min(n, lo + batch_size))))
        seconds = time.perf_counter() - started
        cpu = time.thread_time() - cpu_started
        if best is None or seconds < best[0]:
            best = (seconds, timed.seconds, found, cpu)
    assert best is not None  # (repeat >= 1)
    seconds, kernel_seconds, found, cpu = best

    events = events_of(batch, checked.schema, strings, sample)
    interpreter = MatchInterpreter(checked)
    started = time.perf_counter()
    expected = []
    for event in events:
        expected.extend(interpreter.process(event))
    ref_rate = len(events) / (time.perf_counter() - started)
    check = MatchEngine(program, StringDictionary(strings.strings))
    got = check.process(batch.slice(0, len(events)))
    assert got == expected, f"{name}: engine and reference differ on the sample"
    rate = n / seconds
    return {"workload": name, "events": n, "batch": batch_size, "matches": found,
            "seconds": round(seconds, 3), "events_per_s": round(rate),
            "cpu_events_per_s": round(n / cpu),
            "kernel_events_per_s": round(n / kernel_seconds),
            "reference_events": len(events), "reference_events_per_s": round(ref_rate),
            "speedup": round(rate / ref_rate, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    # Deliberately like bench/soak.py's options: argparse declarations, each benchmark its own
    parser.add_argument("--batch", type=int, default=1_000_000)
    parser.add_argument("--sample", type=int, default=20_000,
                        help="events the reference interpreter runs on")
    parser.add_argument("--workload", choices=["mshape", "marathon", "all"], default="all")
    parser.add_argument("--workloads", action="store_true",
                        help="also run finance1 and marathon as cep_core.workloads generates "
                             "them (the data of `cep bench core`)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best one counts")
    parser.add_argument("--runners", type=int, default=50_000,
                        help="marathon: runners on the course at a time (partitions)")
    parser.add_argument("--cheat-every", type=int, default=12,
                        help="marathon: every Nth runner skips a checkpoint")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    if args.workload in ("mshape", "all"):
        batch, strings = trades(args.events)
        rows.append(measure("mshape", MSHAPE, batch, strings, args.batch, args.sample,
                            args.repeat))
    if args.workload in ("marathon", "all"):
        batch, strings = checkpoints(args.events, args.runners, args.cheat_every)
        rows.append(measure("marathon", MARATHON, batch, strings, args.batch, args.sample,
                            args.repeat))
    if args.workloads:
        for name in ("finance1", "marathon"):
            spec = WORKLOADS[name]
            text = spec.query_text(seed=1)
            schema = load_query_text(text)[0].schema
            strings = StringDictionary()
            batch = BatchEncoder(schema, strings).from_arrow(spec.generate(args.events, 1))
            rows.append(measure(f"{name} (workloads)", text, batch, strings, args.batch,
                                args.sample, args.repeat))
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    header = ("workload", "events", "batch", "matches", "seconds", "events_per_s",
              "cpu_events_per_s", "kernel_events_per_s", "reference_events_per_s", "speedup")
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(f"{row[h]:,}" if isinstance(row[h], int) else str(row[h])
                         for h in header))


if __name__ == "__main__":
    main()
