"""A design probe for issue 32's kernel target, not product code: the M-shape as Flink
answers it (bench_recognize's MSHAPE_RECOGNIZE: SKIP PAST LAST ROW, no WITHIN) in a kernel
written by hand with our MATCH kernel's structure, timed beside the generated
MATCH_RECOGNIZE kernel and the MATCH kernel, kernel against kernel (each engine's kernel
call timed inside its `process_columns`), its rows checked against the generated engine's.

What it keeps, per key: one 64-byte row per run (state, start, start seq, S's seqNum and
price, MAX so far), stepped by a (state, DEFINE bits) table, which is valid here because no
two partial matches of one run share a state on this pattern; the row before's price in
the key's row; completed matches in a small queue sorted by start, released while none
alive started earlier, then everything that started at or before the match's last row
dropped. There are no records, heaps or per-run counts.

On 2026-11-29 (22:58 UTC, 1,000,000 trades, best of 5, the same 39,295 rows) at 390
symbols it ran 48.4M events per CPU second against the MATCH kernel's 48.5M and the
generated kernel's 36.9M. At 5,000 symbols (best of 3) it ran 24.9-28.8M against 42.5-43.8M
and 24.3-26.3M. So at 390 symbols it is the generated kernel's structure, not Flink's
semantics, that keeps MATCH_RECOGNIZE below MATCH's speed. With many keys the layout
matters as well: MATCH keeps candidates in slots, reusing the last freed first.

Run: `.venv/bin/python -m cep_service.bench.probe_recognize [--events N] [--symbols K]
[--repeat R]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

from cep_core.batch import Batch, StringDictionary
from cep_core.checker import load_query_text
from cep_core.compiler.match import compile_match
from cep_core.compiler.recognize import compile_recognize
from cep_core.engine.match import MatchEngine
from cep_core.engine.recognize import RecognizeEngine

from cep_service.bench.bench_match import MSHAPE, trades
from cep_service.bench.bench_recognize import MSHAPE_RECOGNIZE

RUN = 8  # ints per run row (64 bytes): state, start, start seq, S.seqNum, S.price, MAX
DONE = 8  # a table entry's bit for "completes"


def step_table() -> np.ndarray:
    """(state * 16 + DEFINE bits) -> next state | DONE, for PATTERN (S R1+ D1+ R2+? D2* E):
    states 1 (after S), 2 (R1), 3 (D1), 4 (R2), 5 (D2); bits R1 from S, R1 again / R2, D1 /
    D2, E (the generated kernel's four conditions)."""
    table = np.zeros(6 * 16, np.int64)
    for state in range(1, 6):
        for bits in range(16):
            p0, p1, p2, p3 = (bits >> b & 1 for b in range(4))
            done = 0
            if state == 1:
                after = 2 if p0 else 0
            elif state == 2:
                after = 2 if p1 else 3 if p2 else 0
            elif state == 3:
                after = 3 if p2 else 4 if p1 else 0
            elif state == 4:
                after, done = (4 if p1 else 5 if p2 else 0), int(p3 and not p2)
            else:
                after, done = (5 if p2 else 0), int(p3 and not p2)
            table[state * 16 + bits] = after | (DONE if done else 0)
    return table


@njit(cache=True, error_model="numpy")
def kernel(kid, seq, price, seqnum, cap, qcap, table, key, rec, queue, out):  # noqa: C901
    """Composite events (key, start seq, end index, end seq, first_seq, last_seq, n,
    max_price) into `out`, 8 ints each; returns how many, or -1 when a key's runs or queue
    are full."""
    U = np.uint64
    found = 0
    for i in range(len(kid)):
        k = kid[U(i)]
        a0 = price[U(i)]
        idx, nr = key[U(k * 4)], key[U(k * 4 + 1)]
        prev, nq = key[U(k * 4 + 2)], key[U(k * 4 + 3)]
        if nr + 1 >= cap or nq + nr >= qcap:
            return -1
        base, qb, w = k * cap, k * qcap, 0
        for j in range(nr):
            c = base + j
            sp = rec[U(c * RUN + 4)]
            gt = a0 > sp
            bits = (gt | ((gt & (a0 >= prev)) << 1) | (((a0 >= sp) & (a0 < prev)) << 2)
                    | (((a0 < sp) & (a0 < prev)) << 3))
            v = table[U(rec[U(c * RUN)] * 16 + bits)]
            top = max(rec[U(c * RUN + 5)], a0)
            d = base + w
            rec[U(d * RUN)] = v & 7
            for f in range(1, 4):
                rec[U(d * RUN + f)] = rec[U(c * RUN + f)]
            rec[U(d * RUN + 4)] = sp
            rec[U(d * RUN + 5)] = top
            if v & DONE:  # into the queue, kept sorted by start
                start = rec[U(d * RUN + 1)]
                p = nq
                while p > 0 and queue[U((qb + p - 1) * 8)] > start:
                    for f in range(8):
                        queue[U((qb + p) * 8 + f)] = queue[U((qb + p - 1) * 8 + f)]
                    p -= 1
                q = (qb + p) * 8
                queue[U(q)] = start
                queue[U(q + 1)] = rec[U(d * RUN + 2)]
                queue[U(q + 2)] = idx
                queue[U(q + 3)] = seq[U(i)]
                queue[U(q + 4)] = rec[U(d * RUN + 3)]
                queue[U(q + 5)] = seqnum[U(i)]
                queue[U(q + 6)] = idx - start + 1
                queue[U(q + 7)] = top
                nq += 1
            w += (v & 7) != 0
        d = base + w  # S takes every row: a new run
        rec[U(d * RUN)] = 1
        rec[U(d * RUN + 1)] = idx
        rec[U(d * RUN + 2)] = seq[U(i)]
        rec[U(d * RUN + 3)] = seqnum[U(i)]
        rec[U(d * RUN + 4)] = a0
        rec[U(d * RUN + 5)] = a0
        w += 1
        while nq > 0 and queue[U(qb * 8)] <= rec[U(base * RUN + 1)]:
            out[U(found * 8)] = k
            for f in range(1, 8):
                out[U(found * 8 + f)] = queue[U(qb * 8 + f)]
            found += 1
            limit = queue[U(qb * 8 + 2)]  # AFTER MATCH SKIP PAST LAST ROW
            drop = 0
            while drop < w and rec[U((base + drop) * RUN + 1)] <= limit:
                drop += 1
            for j in range(w - drop):
                for f in range(6):
                    rec[U((base + j) * RUN + f)] = rec[U((base + j + drop) * RUN + f)]
            w -= drop
            gone = 1
            while gone < nq and queue[U((qb + gone) * 8)] <= limit:
                gone += 1
            for j in range(nq - gone):
                for f in range(8):
                    queue[U((qb + j) * 8 + f)] = queue[U((qb + j + gone) * 8 + f)]
            nq -= gone
            if w == 0:
                break
        key[U(k * 4)] = idx + 1
        key[U(k * 4 + 1)] = w
        key[U(k * 4 + 2)] = a0
        key[U(k * 4 + 3)] = nq
    return found


def probe(batch: Batch, nkeys: int, cap: int = 64, qcap: int = 64
          ) -> tuple[float, list[tuple[int, ...]]]:
    """CPU seconds of the kernel over the batch, and its rows (sorted)."""
    columns = {name: np.ascontiguousarray(batch.columns[name], dtype=np.int64)
               for name in ("symbol", "price", "seqNum")}
    seq = np.ascontiguousarray(batch.seq, dtype=np.int64)
    key = np.zeros(nkeys * 4, np.int64)
    rec = np.zeros(nkeys * cap * RUN, np.int64)
    queue = np.zeros(nkeys * qcap * 8, np.int64)
    out = np.zeros(8 * (len(seq) // 4 + 1000), np.int64)
    started = time.thread_time()
    found = kernel(columns["symbol"], seq, columns["price"], columns["seqNum"], cap, qcap,
                   step_table(), key, rec, queue, out)
    seconds = time.thread_time() - started
    if found < 0:
        raise RuntimeError("a key's runs or completed queue is full: raise cap or qcap")
    rows = out[:found * 8].reshape(-1, 8)[:, [0, 1, 3, 4, 5, 6, 7]]  # not the end's index
    return seconds, sorted(tuple(int(v) for v in row) for row in rows)


def _kernel_timed(kernel_fn: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    def timed(*args: Any) -> Any:
        started = time.thread_time()
        result = kernel_fn(*args)
        spent[0] += time.thread_time() - started
        return result
    return timed


def run(events: int, symbols: int = 390, repeat: int = 3) -> dict:
    batch, strings = trades(events, symbols)
    nkeys = len(strings.strings)
    spent = [0.0]
    match = compile_match(load_query_text(MSHAPE)[0])
    match = dataclasses.replace(match, kernel=_kernel_timed(match.kernel, spent))
    recognize = compile_recognize(load_query_text(MSHAPE_RECOGNIZE)[0])
    module = types.SimpleNamespace(**vars(recognize.module))
    module.kernel = _kernel_timed(recognize.module.kernel, spent)
    recognize = dataclasses.replace(recognize, module=module)
    makers = {"match": lambda: MatchEngine(match, StringDictionary(list(strings.strings))),
              "recognize": lambda: RecognizeEngine(recognize,
                                                   StringDictionary(list(strings.strings)))}
    probe(batch.slice(0, 2000), nkeys)
    for make in makers.values():
        make().process_columns(batch.slice(0, 2000))
    best = {name: float("inf") for name in (*makers, "probe")}
    generated: list[tuple[int, ...]] = []
    mine: list[tuple[int, ...]] = []
    for _ in range(repeat):
        for name, make in makers.items():
            engine, spent[0] = make(), 0.0
            out = engine.process_columns(batch)
            best[name] = min(best[name], spent[0])
            if name == "recognize":
                generated = sorted(
                    (strings.strings.index(c["key"]), c["start_seq"], c["seq"], c["first_seq"],
                     c["last_seq"], c["n"], c["max_price"]) for b in out for c in b.to_dicts())
        seconds, mine = probe(batch, nkeys)
        best["probe"] = min(best["probe"], seconds)
    return {"events": events, "symbols": symbols, "repeat": repeat,
            **{f"{name}_kernel_events_per_s": round(events / best[name]) for name in best},
            "probe_over_match": round(best["match"] / best["probe"], 2),
            "generated_over_match": round(best["match"] / best["recognize"], 2),
            "same_rows_as_generated": mine == generated and bool(mine), "rows": len(mine)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--symbols", type=int, default=390)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(run(args.events, args.symbols, args.repeat))


if __name__ == "__main__":
    main()
