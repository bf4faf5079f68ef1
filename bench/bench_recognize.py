"""The M-shape (Hirzel's finance1, double top) as Flink users write it in MATCH_RECOGNIZE,
through the jitted MATCH_RECOGNIZE engine, beside our MATCH M-shape through the jitted MATCH
engine, on the same trades in the same run; and the same MATCH_RECOGNIZE statement with
`ORDER BY ts, price DESC` (`recognize_ties`: the engine holds a partition's rows of one time
and sorts them before the kernel takes them).

The two queries are the same shape, not the same query: MATCH reports at the first
accepting state and skips past it (MatchRegex), MATCH_RECOGNIZE gives Flink's answers
(greedy quantifiers on Flink's NFA, the match that started first wins), so their match
counts differ a little (issue 32). The MATCH_RECOGNIZE statement is bench/peers/
flink_runner.py's, with the measures of tests/recognize_flink/differential.py's MSHAPE.

`events_per_s`: fresh engines over the whole batch (best of `--repeat`, wall clock, composite
events as columns); `cpu_events_per_s` the same over the thread's CPU time (what is left when
other processes share the cores). The engines take turns, one run each per round, and
`recognize_over_match` is the ratio per CPU second. The jitted MATCH_RECOGNIZE engine's output
on a prefix is compared with the reference interpreter's (`agrees_with_reference`).

`--processes` adds the user's path (`processes`): each M-shape as a whole `cep run` process
over the same CSV of finance1 trades (`cep gen`), file in, composite events written,
imports, code generation and kernel loads included (numba's cache warmed by a first,
untimed run), the two interleaved, best of `--repeat`.

Run: `.venv/bin/cep bench recognize [--count N] [--repeat R] [--symbols K] [--processes]
[--json]`, or `.venv/bin/python -m cep_service.bench.bench_recognize [--events N]
[--repeat R] [--symbols K] [--processes] [--json]`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cep_core import reference
from cep_core.batch import Batch, StringDictionary
from cep_core.checker import load_query_text
from cep_core.compiler.match import compile_match
from cep_core.compiler.recognize import compile_recognize
from cep_core.engine.base import Engine
from cep_core.engine.match import MatchEngine
from cep_core.engine.recognize import RecognizeEngine
from cep_core.event_io import EventFormat
from cep_core.events import Event
from cep_core.workloads import MSHAPE_RECOGNIZE_DEFINE

from cep_service.bench.bench_match import MSHAPE, trades
from cep_service.bench.bench_run import cep, cep_times, generate

MSHAPE_RECOGNIZE = """SELECT * FROM trades MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts
  MEASURES FIRST(S.seqNum) AS first_seq, LAST(E.seqNum) AS last_seq, COUNT(*) AS n,
    MAX(price) AS max_price
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  """ + MSHAPE_RECOGNIZE_DEFINE + ") AS T"
# the same with the rows of one time sorted by price, highest first (a quarter of these
# trades share their time with the row before): the engine holds and sorts them
MSHAPE_RECOGNIZE_TIES = MSHAPE_RECOGNIZE.replace("ORDER BY ts", "ORDER BY ts, price DESC")


def _copy(strings: StringDictionary) -> StringDictionary:
    return StringDictionary(list(strings.strings))


def _timed(makers: dict[str, Callable[[], Engine]], batch: Batch, repeat: int
           ) -> dict[str, tuple[float, float, int]]:
    """Per engine: (best wall seconds, best CPU seconds, composite events) over fresh
    engines, taken in turns (one run of each per round: a machine slower for a while slows
    all of them alike)."""
    best = {name: (float("inf"), float("inf"), 0) for name in makers}
    for _ in range(repeat):
        for name, make in makers.items():
            engine = make()
            started, started_cpu = time.perf_counter(), time.thread_time()
            out = engine.process_columns(batch)
            cpu = time.thread_time() - started_cpu
            wall = time.perf_counter() - started
            found = sum(len(b) for b in out)
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu), found)
    return best


def run(events: int, repeat: int = 3, reference_events: int = 20_000,
        symbols: int = 390) -> dict:
    [match] = load_query_text(MSHAPE)
    [recognize] = load_query_text(MSHAPE_RECOGNIZE)
    [ties] = load_query_text(MSHAPE_RECOGNIZE_TIES)
    batch, strings = trades(events, symbols)
    match_program, recognize_program = compile_match(match), compile_recognize(recognize)
    ties_program = compile_recognize(ties)
    warm = batch.slice(0, min(events, 2000))  # numba compiles at the first call: not timed
    MatchEngine(match_program, _copy(strings)).process_columns(warm)
    RecognizeEngine(recognize_program, _copy(strings)).process_columns(warm)
    RecognizeEngine(ties_program, _copy(strings)).process_columns(warm)
    out: dict[str, Any] = {"events": events, "repeat": repeat, "symbols": symbols}
    makers: dict[str, Callable[[], Engine]] = {
        "match": lambda: MatchEngine(match_program, _copy(strings)),
        "recognize": lambda: RecognizeEngine(recognize_program, _copy(strings)),
        "recognize_ties": lambda: RecognizeEngine(ties_program, _copy(strings))}
    for name, (wall, cpu, found) in _timed(makers, batch, repeat).items():
        out[name] = {"events_per_s": round(events / wall),
                     "cpu_events_per_s": round(events / max(cpu, 1e-9)),
                     "seconds": round(wall, 4), "composite_events": found}
    # (per CPU second: a thread's own time, not the time it waited for a core)
    out["recognize_over_match"] = round(out["recognize"]["cpu_events_per_s"] /
                                        out["match"]["cpu_events_per_s"], 2)
    n = min(events, reference_events)
    prefix = batch.slice(0, n)
    rows = [Event(int(s), int(t), {"symbol": strings.decode(int(c)), "price": int(p),
                                   "volume": int(v), "ts": int(t), "seqNum": int(q)})
            for s, t, c, p, v, q in zip(prefix.seq, prefix.ts, prefix.columns["symbol"],
                                        prefix.columns["price"], prefix.columns["volume"],
                                        prefix.columns["seqNum"])]
    out["reference_events"] = n
    for name, query, program in (("agrees_with_reference", recognize, recognize_program),
                                 ("ties_agree_with_reference", ties, ties_program)):
        expected = reference.run([query], rows)
        engine = RecognizeEngine(program, _copy(strings))
        got = sorted(map(repr, engine.process(prefix) + engine.flush()))
        out[name] = got == sorted(map(repr, expected)) and bool(expected)
    return out


def processes(events: int, repeat: int = 3, directory: Path | None = None) -> dict:
    """Both M-shapes as whole `cep run` processes over the same CSV of trades (module doc)."""
    directory = directory or Path(tempfile.gettempdir()) / f"bench_run_{events}"
    directory.mkdir(parents=True, exist_ok=True)
    trades_csv = generate(directory, events)[EventFormat.CSV]
    queries = {"match": directory / "mshape_match.cep",
               "recognize": directory / "mshape_recognize.cep"}
    queries["match"].write_text(MSHAPE + "\n")
    queries["recognize"].write_text("QUERY mshape_recognize INTO mshape_recognize\n"
                                    + MSHAPE_RECOGNIZE + ";\n")
    outputs = {name: directory / f"{name}.jsonl" for name in queries}
    runs = {name: ("run", query, "--events", trades_csv, "-o", outputs[name])
            for name, query in queries.items()}
    for run_args in runs.values():
        cep(*run_args)  # warms numba's kernel cache
    best = {name: (float("inf"), float("inf")) for name in queries}
    for _ in range(repeat):
        for name, run_args in runs.items():  # interleaved: a load moves both
            wall, cpu = cep_times(*run_args)
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    out: dict[str, Any] = {"events": events, "repeat": repeat, "file": str(trades_csv)}
    for name, (wall, cpu) in best.items():
        with outputs[name].open("rb") as written:
            found = sum(1 for _ in written)
        out[name] = {"seconds": round(wall, 3), "cpu_seconds": round(cpu, 3),
                     "events_per_s": round(events / wall), "composite_events": found}
    out["recognize_over_match"] = round(best["match"][0] / best["recognize"][0], 2)
    return out


def report(result: dict) -> list[str]:
    """`run`'s result as lines of text."""
    lines = [f"M-shape over {result['events']:,} trades ({result['symbols']:,} symbols), best "
             f"of {result['repeat']}:"]
    for name in ("match", "recognize", "recognize_ties"):
        r = result[name]
        lines.append(f"  {name:14s} {r['events_per_s']:>12,} events/s  "
                     f"({r['cpu_events_per_s']:,} per CPU s)  {r['composite_events']:,} matches")
    lines.append(f"  MATCH_RECOGNIZE / MATCH: {result['recognize_over_match']}x per CPU "
                 "second; agrees with the "
                 f"reference on {result['reference_events']:,} events: "
                 f"{result['agrees_with_reference']} (ORDER BY ts, price DESC: "
                 f"{result['ties_agree_with_reference']})")
    if "processes" in result:
        whole = result["processes"]
        lines.append(f"Whole `cep run` processes over {whole['events']:,} trades "
                     f"({whole['file']}), best of {whole['repeat']}:")
        for name in ("match", "recognize"):
            r = whole[name]
            lines.append(f"  {name:14s} {r['seconds']:>8.3f} s  {r['events_per_s']:>12,} "
                         f"events/s  ({r['cpu_seconds']:.2f} CPU s)  "
                         f"{r['composite_events']:,} matches")
        lines.append(f"  MATCH_RECOGNIZE / MATCH: {whole['recognize_over_match']}x")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--symbols", type=int, default=390,
                    help="keys (partitions): with thousands, their partial matches are not "
                         "in the cache")
    ap.add_argument("--processes", action="store_true",
                    help="also both as whole `cep run` processes over a CSV of trades")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run(args.events, args.repeat, symbols=args.symbols)
    if args.processes:
        result["processes"] = processes(args.events, args.repeat)
    print(json.dumps(result) if args.json else "\n".join(report(result)))


if __name__ == "__main__":
    main()
