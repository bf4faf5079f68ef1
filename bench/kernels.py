"""Core benchmark: a workload's events, already in columns, through the jitted engine.

`events_per_s` times fresh engines over the whole table as one batch (best of `repeat`):
one-time allocation and first-touch page faults count. Engines return composite events as
columns there (`StreamEngines.process_columns`); `dict_events_per_s` is the same run with
every composite event also built as a Python dict (`process`, what JSON output needs).
`steady_events_per_s` is a streaming engine's steady state (columns out): engines that
have processed the first half of the table in batches of `STEADY_BATCH` events, timed on
the second half in such batches (best of `repeat`).

The baseline is the reference interpreter, measured in the same run on a prefix of the same
events (the reference is slow, so its sample is smaller); the jitted engine's output on
that prefix must equal the reference's, or the result says so.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from cep_core import stream_engines as jit
from cep_core import reference
from cep_core.batch import Batch, BatchEncoder, StringDictionary
from cep_core.checker import load_query_text
from cep_core.composite_batch import count
from cep_core.event_io import decode_record
from cep_core.workloads import WORKLOADS

# Events the reference interpreter gets per workload (its cost grows with window sizes).
REFERENCE_SAMPLE = {"r5": 1_000, "q9": 5_000, "twitter2": 5_000, "finance4": 5_000}
DEFAULT_REFERENCE_SAMPLE = 20_000
STEADY_BATCH = 1 << 16


def core(workload: str, events: int, seed: int = 1, reference_events: int | None = None,
         repeat: int = 3, **options: Any) -> dict:
    """Measure one workload; returns a JSON-able dict with `events_per_s` and `speedup`."""
    spec = WORKLOADS[workload]
    table = spec.generate(events, seed)
    queries = load_query_text(spec.query_text(seed=seed, **options), path=f"<{workload}>")
    schema = queries[0].schema

    def encoded(rows: pa.Table) -> tuple[StringDictionary, Batch]:
        strings = StringDictionary()
        return strings, BatchEncoder(schema, strings).from_arrow(rows)

    # Compile (and warm numba's dispatchers) on a small prefix first: compile time is not
    # throughput. Then time fresh engines over the whole batch, best of `repeat`.
    strings, warm = encoded(table.slice(0, min(events, 1000)))
    jit.StreamEngines(queries, strings).process(warm)
    best, best_dicts, found = float("inf"), float("inf"), 0
    for _ in range(repeat):
        strings, batch = encoded(table)
        engines = jit.StreamEngines(queries, strings)
        started = time.perf_counter()
        found = count(engines.process_columns(batch)) + len(engines.flush())
        best = min(best, time.perf_counter() - started)
        strings, batch = encoded(table)
        engines = jit.StreamEngines(queries, strings)
        started = time.perf_counter()
        found_dicts = len(engines.process(batch)) + len(engines.flush())
        best_dicts = min(best_dicts, time.perf_counter() - started)
        assert found_dicts == found

    steady = float("inf")
    half = events // 2
    for _ in range(repeat):
        strings, batch = encoded(table)
        engines = jit.StreamEngines(queries, strings)
        for start in range(0, half, STEADY_BATCH):
            engines.process_columns(batch.slice(start, min(start + STEADY_BATCH, half)))
        started = time.perf_counter()
        for start in range(half, events, STEADY_BATCH):
            engines.process_columns(batch.slice(start, min(start + STEADY_BATCH, events)))
        steady = min(steady, time.perf_counter() - started)

    sample_n = min(events, reference_events or REFERENCE_SAMPLE.get(workload,
                                                                    DEFAULT_REFERENCE_SAMPLE))
    sample = table.slice(0, sample_n)
    sample_events = [decode_record(row, schema, i) for i, row in enumerate(sample.to_pylist())]
    started = time.perf_counter()
    expected = reference.run(queries, sample_events)
    reference_s = time.perf_counter() - started
    agree = jit.run(queries, sample_events) == expected

    events_per_s = events / best
    reference_per_s = sample_n / reference_s
    return {
        "workload": workload, "queries": len(queries), "events": events,
        "seconds": round(best, 4), "events_per_s": round(events_per_s),
        "dict_events_per_s": round(events / best_dicts),
        "composite_events": found,
        "steady_batch": STEADY_BATCH,
        "steady_events_per_s": round((events - half) / max(steady, 1e-9)),
        "reference_events": sample_n, "reference_events_per_s": round(reference_per_s),
        "speedup": round(events_per_s / reference_per_s, 1),
        "agrees_with_reference": agree,
    }
