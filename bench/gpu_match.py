"""MATCH columns of bench/bench_gpu.py: the batched per-key MATCH kernel's workloads on the
CPU (the jitted `MatchEngine`, and the reference interpreter as the baseline) and, only on
a real GPU, on the GPU (`GpuMatchEngine`).

Workloads (`cep_core.workloads`): `marathon` (aggregate-free, about one key per five
events) and `finance1` (the M-shape, incremental aggregates) at 10, 390 and 20,000 symbols:
the GPU runs one thread per key of a batch, so the key count decides how much of it works.
Events per second, best of 2 after a compiling pass; batches of 65,536 events; the reference
runs on the first 20,000 events only. The CUDA simulator is never timed as a GPU.
"""

from __future__ import annotations

# Deferred imports: the GPU engine (numba.cuda) loads only when a GPU run is measured.

import time

import pyarrow as pa

from cep_accel.gpu import device
from cep_core import reference
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_query_text
from cep_core.engine_factory import match_engine
from cep_core.events import Event
from cep_core.workloads import WORKLOADS

CASES = (("marathon", {}), ("finance1", {"symbols": 10}), ("finance1", {"symbols": 390}),
         ("finance1", {"symbols": 20_000}))
BATCH = 65_536
REFERENCE_EVENTS = 20_000


def _engine_rate(make, query, table: pa.Table, repeat: int = 2) -> tuple[float, int]:
    """(events per second, composite events) of a fresh engine over the table in batches."""
    best, found = float("inf"), 0
    for attempt in range(repeat + 1):
        strings = StringDictionary()
        encoder = BatchEncoder(query.schema, strings)
        engine = make(query, strings)
        part = table if attempt else table.slice(0, 2_000)  # the first pass compiles
        batches = [encoder.from_arrow(part.slice(lo, BATCH))
                   for lo in range(0, part.num_rows, BATCH)]
        started = time.perf_counter()
        out = 0
        for batch in batches:
            out += len(engine.process(batch))
        out += len(engine.flush())
        if attempt:
            best, found = min(best, time.perf_counter() - started), out
    return table.num_rows / best, found


def _reference_rate(query, table: pa.Table) -> float:
    part = table.slice(0, REFERENCE_EVENTS)
    time_attr = query.schema.time
    events = [Event(row.pop("seq"), row[time_attr], row) for row in part.to_pylist()]
    started = time.perf_counter()
    reference.run([query], events)
    return part.num_rows / (time.perf_counter() - started)


# Deliberately like bench/gpu_kernels.py main: each GPU benchmark checks for a real GPU first
def main(n: int = 200_000, quick: bool = False) -> list[dict]:
    gpu = device.real_gpu()
    print(f"\nMATCH (batched per-key NFA), {n:,} events, events per second")
    if gpu:
        print(f"GPU: {device.name()}")
    else:
        print("GPU MATCH: skipped, not measured here: no real GPU (numba.cuda gives "
              f"{device.target()!r}); the CUDA simulator is never timed as a GPU")
    print(f"{'workload':10} {'keys':>7} {'matches':>8} {'reference':>10} {'CPU jit':>11} "
          f"{'jit/ref':>8} {'GPU':>11} {'GPU/jit':>8}")
    rows = []
    for name, params in (CASES[:2] if quick else CASES):
        workload = WORKLOADS[name]
        table = workload.generate(n, seed=1, **params)
        [query] = load_query_text(workload.query_text(), path=f"<{name}>")
        keys = len(set(table.column(query.query.partition_by[0].name).to_pylist()))
        row = {"workload": name, "keys": keys, **params}
        row["reference"] = _reference_rate(query, table)
        row["cpu"], row["matches"] = _engine_rate(match_engine, query, table)
        gpu_text = f"{'n/a':>11} {'n/a':>8}"
        if gpu:
            from cep_accel.gpu.match_engine import GpuMatchEngine
            row["gpu"], gpu_matches = _engine_rate(GpuMatchEngine, query, table)
            if gpu_matches != row["matches"]:
                raise AssertionError(f"{name}: GPU found {gpu_matches} matches, CPU "
                                     f"{row['matches']}")
            gpu_text = f"{row['gpu']:11,.0f} {row['gpu'] / row['cpu']:8.2f}"
        print(f"{name:10} {keys:7,} {row['matches']:8,} {row['reference']:10,.0f} "
              f"{row['cpu']:11,.0f} {row['cpu'] / row['reference']:8.1f} {gpu_text}",
              flush=True)
        rows.append(row)
    return rows
