"""`cep bench backfill`: the finance workloads through the Spark backfill and, in the same
run, through `cep run --engine jit` in one process (read the file, run, write JSON lines).
Where the backfill's `auto` exchange scans (`services/backfill/scan.py`), the same job with
Spark's shuffle runs too, in the same session, for the ratio between them. A first job on
1,000 events starts the session's Python workers (their imports and kernel loads) before
either is timed; its time is the fixed cost of a job in a new session (`first_job_s`).

Every finance workload reads the same `trades` stream (one generator, same parameters), so
one Parquet file feeds all of their queries at once. Kernels are compiled (or loaded from
the on-disk cache) before either side is timed.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any


import pyarrow.parquet as pq

from cep_core.checked import CheckedQuery
from cep_core.checker import load_query_text
from cep_core.event_reader import read_table
from cep_core.runner import new_engines
from cep_core.workloads import WORKLOADS, write_events
from cep_service.backfill.job import run_backfill, spark_session
from cep_service.cli.common import Engine, run_queries

FINANCE = ("finance0", "finance1", "finance2", "finance3", "finance4", "finance5")


def bench_backfill(events: int = 10_000_000, workloads: tuple[str, ...] = FINANCE,
                   master: str = "local[2]", seed: int = 1, partitions: int | None = None,
                   baseline_events: int | None = None, workdir: str | None = None,
                   driver_memory: str = "4g", console: Any = None) -> dict:
    chosen = [WORKLOADS[name] for name in workloads]
    if len({w.stream for w in chosen}) != 1:
        raise ValueError("the workloads of one backfill bench must read one stream")
    directory = Path(workdir or tempfile.mkdtemp(prefix="cep-bench-backfill-"))
    directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    table = chosen[0].generate(events, seed)
    events_path = write_events(table, directory / f"{chosen[0].stream}.parquet", "parquet")
    queries = load_query_text("\n".join(w.query_text(seed=seed) for w in chosen))
    generate_s = time.perf_counter() - started

    baseline_n = min(baseline_events or events, events)
    baseline_path = events_path
    if baseline_n < events:
        baseline_path = write_events(table.slice(0, baseline_n),
                                     directory / f"baseline.{chosen[0].stream}.parquet",
                                     "parquet")
    sample_path = write_events(table.slice(0, 1000),
                               directory / f"first.{chosen[0].stream}.parquet", "parquet")
    del table
    _warm_kernels(queries, events_path)

    jit = _cep_run_jit(queries, baseline_path, directory / "jit.jsonl")
    spark_started = time.perf_counter()

    spark = spark_session(master, shuffle_partitions=partitions,
                          **{"spark.driver.memory": driver_memory})
    session_s = time.perf_counter() - spark_started
    partitions = partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
    first = run_backfill(spark, queries, [str(sample_path)], str(directory / "first"),
                         partitions=partitions)
    result = run_backfill(spark, queries, [str(events_path)], str(directory / "backfill"),
                          partitions=partitions, console=console)
    backfill_rate = result.events / result.seconds
    shuffled = {}
    if result.exchange != "shuffle":
        other = run_backfill(spark, queries, [str(events_path)], str(directory / "shuffled"),
                             partitions=partitions, console=console, exchange="shuffle")
        shuffled = {"shuffle_backfill_s": round(other.seconds, 2),
                    "shuffle_events_per_s": round(other.events / other.seconds),
                    "shuffle_same_composite_count": other.composites == result.composites,
                    "ratio_exchange_over_shuffle": round(other.seconds / result.seconds, 2)}
    return {
        "workloads": ",".join(workloads), "events": events, "master": master,
        "partitions": partitions, "generate_s": round(generate_s, 2),
        "backfill_s": round(result.seconds, 2), "backfill_events_per_s": round(backfill_rate),
        "backfill_composites": result.composites, "spark_session_s": round(session_s, 2),
        "first_job_s": round(first.seconds, 2),
        "jit_events": baseline_n, "jit_read_s": round(jit["read_s"], 2),
        "jit_run_s": round(jit["run_s"], 2), "jit_total_s": round(jit["total_s"], 2),
        "jit_events_per_s": round(baseline_n / jit["total_s"]),
        "jit_engine_events_per_s": round(baseline_n / jit["run_s"]),
        "jit_composites": jit["composites"],
        "same_composite_count": (jit["composites"] == result.composites
                                 if baseline_n == events else None),
        "ratio_backfill_over_jit": round(backfill_rate / (baseline_n / jit["total_s"]), 3),
        "exchange": result.exchange, **shuffled,
    }


def _warm_kernels(queries: list[CheckedQuery], events_path: Path) -> None:
    """Compile (or load) every kernel once, on a few events, so neither side pays it."""
    sample = pq.ParquetFile(events_path).read_row_group(0).slice(0, 1000)
    engines, encoder = new_engines(queries)
    engines.process(encoder.from_arrow(sample))
    engines.flush()


def _cep_run_jit(queries: list[CheckedQuery], events_path: Path, out: Path) -> dict:
    """What `cep run QUERY_FILE --events FILE --engine jit --out OUT` does, timed: the
    columnar reader (`event_reader.read_table`), the engines over the table, the composite
    events written from their columns."""
    started = time.perf_counter()
    table, _dead = read_table(events_path, queries[0].schema)
    read_s = time.perf_counter() - started
    composites, _rejected = run_queries(queries, table, Engine.JIT)
    run_s = time.perf_counter() - started - read_s
    del table
    composites.write(out)
    total_s = time.perf_counter() - started
    return {"read_s": read_s, "run_s": run_s, "total_s": total_s,
            "composites": len(composites)}
