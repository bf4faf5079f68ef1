"""`cep bench gpu` / bench/bench_gpu.py: Cugola & Margara's base scenario (R5) on CPU
(AIP and CDP engines) and, only where a real GPU is present, on the GPU (CDP kernels).

R5: `Tn xn, P Tn-1 xn-1 WITHIN w FROM xn, ..., P T1 x1 WITHIN w FROM x2` with every
`xi.att = xn.att`, P = EACH or LAST, `att` uniform in [1, 50000], one event per tick, types
uniform over the n step types and two noise types. Base point: n = 3, w = 100000, 1 rule;
then the window (10k-250k), the sequence length (2-7) and the number of rules (1-100)
vary one at a time. Microseconds per event, best of 2, engines compiled beforehand. The
CUDA simulator is never timed: without a real GPU the GPU column says so.
"""

from __future__ import annotations

# Deferred imports: the GPU engines (numba.cuda) load only when a GPU run is measured; the CPU side
# runs without them.

import string
import time
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import numpy as np
import pyarrow as pa

from cep_accel.gpu import device
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checked import CheckedQuery
from cep_core.checker import load_query_text
from cep_core.engine_factory import create_engine
from cep_core.placement import Algorithm

BASE = {"window": 100_000, "length": 3, "rules": 1}
WINDOWS = (10_000, 50_000, 100_000, 250_000)
LENGTHS = (2, 3, 5, 7)
RULES = (1, 10, 100)


def rule_text(name: str, length: int, window: int, policy: str) -> str:
    names = list(string.ascii_uppercase[:length])
    steps = [f"{names[-1]} x{length}"]
    for i in range(length - 1, 0, -1):
        steps.append(f"{policy} {names[i - 1]} x{i} WITHIN {window} FROM x{i + 1}")
    where = " AND ".join(f"x{i}.att = x{length}.att" for i in range(1, length))
    return (f"QUERY {name} FROM rules INTO {name}\nDETECT {', '.join(steps)}\n"
            f"WHERE {where}\nEMIT att = x{length}.att;\n")


def events(n: int, length: int, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    types = list(string.ascii_uppercase[:length + 2])
    return pa.table({"type": pa.array(np.array(types)[rng.integers(0, len(types), n)]),
                     "att": rng.integers(1, 50_001, n, dtype=np.int64),
                     "ts": np.arange(1, n + 1, dtype=np.int64)})


def measure(n: int, window: int, length: int, rules: int, policy: str, engine: Contender,
            repeat: int = 2) -> float:
    """Microseconds per event of `rules` identical-shape rules over n events."""
    text = "\n".join(rule_text(f"r{k}", length, window, policy) for k in range(rules))
    queries = load_query_text(text, path="<r5>")
    table = events(n, length)
    best = float("inf")
    for attempt in range(repeat + 1):
        strings = StringDictionary()
        batch = BatchEncoder(queries[0].schema, strings).from_arrow(
            table if attempt else table.slice(0, 2000))
        made = [_engine(q, strings, engine) for q in queries]
        started = time.perf_counter()
        for e in made:
            e.process(batch)
            e.flush()
        if attempt:  # the first pass compiles
            best = min(best, time.perf_counter() - started)
    return best / n * 1e6


class Contender(StrEnum):
    """An engine this benchmark runs (its value names its column in the rows)."""

    AIP = "aip"  # the CPU's AIP
    CDP = "cdp"  # the CPU's CDP
    GPU = "gpu"  # the GPU's CDP


def _engine(q: CheckedQuery, strings: StringDictionary, engine: Contender) -> Any:
    if engine is Contender.GPU:
        from cep_accel.gpu.seq_engine import GpuSeqEngine
        return GpuSeqEngine(q, strings)
    return create_engine(q, strings, algorithm=Algorithm(engine.value))


def points(quick: bool) -> Iterator[tuple[str, dict[str, int]]]:
    windows, lengths, rules = (WINDOWS[:2], LENGTHS[:2], RULES[:2]) if quick else \
        (WINDOWS, LENGTHS, RULES)
    for w in windows:
        yield "window", dict(BASE, window=w)
    for n in lengths:
        yield "length", dict(BASE, length=n)
    for r in rules:
        yield "rules", dict(BASE, rules=r)


# Deliberately like bench/gpu_match.py main: each GPU benchmark checks for a real GPU first
def main(n: int = 60_000, quick: bool = False) -> list[dict]:
    gpu = device.real_gpu()
    print(f"R5 (Cugola & Margara base scenario), {n:,} events, microseconds per event")
    if gpu:
        print(f"GPU: {device.name()}")
    else:
        print(f"GPU CDP: skipped, not measured here: {_why_no_gpu()}; the CUDA simulator "
              "is never timed as a GPU")
    header = f"{'varying':8} {'window':>7} {'len':>3} {'rules':>5} {'policy':6} " \
             f"{'CPU AIP':>9} {'CPU CDP':>9} {'GPU CDP':>9}"
    print(header)
    rows = []
    for varying, point in points(quick):
        for policy in ("EACH", "LAST"):
            row: dict[str, Any] = dict(point, varying=varying, policy=policy)
            for engine in [Contender.AIP, Contender.CDP] + ([Contender.GPU] if gpu else []):
                row[engine] = measure(n, point["window"], point["length"], point["rules"],
                                      policy, engine)
            gpu_text = f"{row['gpu']:9.3f}" if gpu else f"{'n/a':>9}"
            print(f"{varying:8} {point['window']:7} {point['length']:3} {point['rules']:5} "
                  f"{policy:6} {row['aip']:9.3f} {row['cdp']:9.3f} {gpu_text}", flush=True)
            rows.append(row)
    return rows


def _why_no_gpu() -> str:
    target = device.target()
    if target is device.CudaTarget.SIMULATOR:
        return "only numba's CUDA simulator is enabled (NUMBA_ENABLE_CUDASIM=1), not a GPU"
    return "no CUDA device (numba.cuda.is_available() is false)"
