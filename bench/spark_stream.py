"""`cep bench spark-stream`: the Spark streaming job (services/spark_stream/) against
`cep run --engine jit` on the same events, in one run: throughput, latency per trigger
interval at half the sustained rate, state size, and the cost of a restart; each Spark
master (local[1], local[2]) in a process of its own (one SparkContext per process).

    .venv/bin/python -m cep_service.bench.spark_stream --count 200000 --masters local[1],local[2]

Events: the finance workloads' `trades` stream as JSON lines files of `--file-events`
each, read by the job's file source (`cep_files`). Throughput: every file present, the job
from a new checkpoint until it has taken them all (`processAllAvailable`), after a first
job on 1,000 events has started the session's Python workers. Latency: a writer adds a
file every `trigger / 2` s at half the measured rate; a file's latency is from its rename
into the directory to the end of the micro-batch that took it (the sink's write, found by
batch id in the offset log), the first file once the query has started. Restart: the
throughput job's checkpoint, one more file, a new query on it: the seconds until that file
is written out (state restored). Then the Kafka service's `cep bench e2e --mode chained`
on the same count (its M-shape query).
`throughput_cpu_s`: the CPU seconds the master's process tree used in the throughput run
(the driver, the JVM, the Python workers), a measure of the job's work that a loaded
machine stretches less than the wall clock; `--max-files N` cuts the throughput run
into micro-batches of N files.
"""

from __future__ import annotations

# Deferred imports: pyspark and the job's modules load in the process that runs one master
# (a SparkContext per process); the parent only runs `cep run` and starts them.

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from cep_core.checked import CheckedQuery
from cep_core.checker import load_query_text
from cep_core.workloads import WORKLOADS, write_events

WORKLOAD_NAMES = ("finance0", "finance1", "finance2")


def _files(table: pa.Table, folder: Path, per_file: int, start: int = 0) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(0, table.num_rows, per_file):
        out.append(write_events(table.slice(i, per_file), folder / f"{start + i:012d}.jsonl"))
    return out


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and its live descendants (the JVM and
    its Python workers), with what their exited children used: the work a run did, which
    other load on the machine stretches less than the wall clock."""
    ticks = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        procs[int(name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]))
    total, stack = 0, [os.getpid()]
    while stack:
        pid = stack.pop()
        total += procs.get(pid, (0, 0))[1]
        stack += [child for child, (parent, _) in procs.items() if parent == pid]
    return total / ticks


def _batch_files(checkpoint: Path) -> dict[int, str]:
    """Each micro-batch's last file, from Spark's offset log."""
    out = {}
    for path in (checkpoint / "spark" / "offsets").glob("[0-9]*"):
        out[int(path.name)] = json.loads(path.read_text().splitlines()[-1])["last"]
    return out


class TimedSink:
    """The job's FileSink, noting when each micro-batch's write ended."""

    def __init__(self, output: str):
        from cep_service.spark_stream.sinks import FileSink

        self.sink = FileSink(output)
        self.done: dict[int, float] = {}
        self.batch_ms: list[int] = []  # each micro-batch's triggerExecution

    def __call__(self, df: Any, batch_id: int) -> None:
        self.sink(df, batch_id)
        self.done[batch_id] = time.time()


def one_master(master: str, count: int, per_file: int, triggers: list[float], seed: int,
               workdir: Path, max_files: int = 0, warm: int = 1000, shards: int = 0) -> dict:
    """Every figure for one Spark master, in this process."""
    from cep_service.backfill.job import spark_session
    from cep_service.spark_stream.job import FileSource, query_texts, session_conf, start

    chosen = [WORKLOADS[name] for name in WORKLOAD_NAMES]
    text = "\n".join(w.query_text(seed=seed) for w in chosen)
    queries, texts = load_query_text(text), query_texts(text)
    extra = warm if warm > 1000 else 0  # a larger first job: events after the others'
    table = chosen[0].generate(count + 1000 + per_file + extra +
                               (10 * count if triggers else 0), seed)
    root = workdir / master.replace("[", "_").replace("]", "")
    started = time.perf_counter()
    spark = spark_session(master, shuffle_partitions=None, app_name="cep-bench-stream",
                          **session_conf())
    out: dict = {"master": master, "spark_session_s": round(time.perf_counter() - started, 2),
                 "shards": shards or int(spark.conf.get("spark.sql.shuffle.partitions"))}

    def run(folder: Path, name: str, **options: Any) -> tuple[float, TimedSink]:
        sink = TimedSink(str(root / name / "out"))
        t = time.perf_counter()
        job = start(spark, queries, FileSource(str(folder), max_files), sink,
                    str(root / name / "ck"), texts, shards=shards or None, **options)
        job.processAllAvailable()
        sink.batch_ms = [p["durationMs"]["triggerExecution"] for p in job.recentProgress]
        job.stop()
        return time.perf_counter() - t, sink

    _files(table.slice(1000 + count + per_file, extra) if extra else table.slice(0, 1000),
           root / "first_in", per_file)
    out["first_job_s"] = round(run(root / "first_in", "first")[0], 2)

    _files(table.slice(1000, count), root / "in", per_file)  # cep run's events
    cpu = tree_cpu_s()
    seconds, sink = run(root / "in", "throughput")
    cpu = tree_cpu_s() - cpu
    rate = count / seconds
    if max_files and len(sink.batch_ms) > 2:  # full micro-batches after the first
        steady = sorted(sink.batch_ms[1:-1] or sink.batch_ms[1:])
        out["steady_events_per_s"] = round(per_file * max_files / (steady[len(steady) // 2]
                                                                   / 1000))
    out.update(batch_ms=sink.batch_ms, warm_events=extra or 1000)
    out.update(events=count, throughput_s=round(seconds, 2), throughput_cpu_s=round(cpu, 2),
               cpu_us_per_event=round(cpu / count * 1e6, 2),
               events_per_s=round(rate), micro_batches=len(sink.done),
               state_bytes=_tree_bytes(root / "throughput" / "ck" / "spark" / "state"))

    _files(table.slice(1000 + count, per_file), root / "in", per_file, start=1000 + count)
    restart_s, _ = run(root / "in", "throughput")
    out["restart_s"] = round(restart_s, 2)

    offset = 1000 + count + per_file + extra
    for trigger in triggers:
        out[f"trigger_{trigger:g}s"] = _latency(spark, queries, texts, table, offset, rate / 2,
                                                trigger, root / f"latency_{trigger:g}", shards)
        offset += int(rate / 2 * 20) + 1
    spark.stop()
    return out


def _latency(spark: Any, queries: list[CheckedQuery], texts: dict[str, str],
             table: pa.Table, offset: int, rate: float, trigger: float,
             root: Path, shards: int = 0, seconds: float = 20.0) -> dict:
    """Files at `rate` events/s, one every trigger / 2 s, for `seconds`; latency of each."""
    from cep_service.spark_stream.job import FileSource, start

    folder = root / "in"
    folder.mkdir(parents=True)
    sink = TimedSink(str(root / "out"))
    job = start(spark, queries, FileSource(str(folder)), sink, str(root / "ck"), texts,
                shards=shards or None, trigger_s=trigger)
    # the first file once the query runs: its start (a few seconds) is not a latency
    waited = time.time()
    while not job.status["message"].startswith("Waiting") and time.time() - waited < 120:
        time.sleep(0.05)
    every = trigger / 2
    per_file = max(1, int(rate * every))
    written: dict[str, float] = {}

    def writer() -> None:
        at = offset
        deadline = time.time() + seconds
        while time.time() < deadline:
            name = f"{at:012d}.jsonl"
            write_events(table.slice(at, per_file), folder / f".{name}")
            os.rename(folder / f".{name}", folder / name)
            written[name] = time.time()
            at += per_file
            time.sleep(max(0.0, every - (time.time() - written[name])))

    thread = threading.Thread(target=writer)
    thread.start()
    thread.join()
    job.processAllAvailable()
    job.stop()
    ends = sorted(_batch_files(root / "ck").items())
    latencies = []
    for name, at in written.items():
        batch = next(b for b, last in ends if last >= name)
        latencies.append(sink.done[batch] - at)
    lat = np.array(latencies)
    return {"events_per_s_offered": round(rate), "files": len(lat),
            "p50_s": round(float(np.percentile(lat, 50)), 3),
            "p99_s": round(float(np.percentile(lat, 99)), 3),
            "p99_over_trigger": round(float(np.percentile(lat, 99)) / trigger, 2)}


def cep_run_baseline(count: int, seed: int, workdir: Path) -> dict:
    """`cep run --engine jit` over the throughput run's events as one JSON lines file."""
    from cep_service.bench.spark_backfill import _cep_run_jit, _warm_kernels

    chosen = [WORKLOADS[name] for name in WORKLOAD_NAMES]
    queries = load_query_text("\n".join(w.query_text(seed=seed) for w in chosen))
    table = chosen[0].generate(count + 1000, seed).slice(1000, count)
    path = write_events(table, workdir / "all.jsonl")
    parquet = write_events(table.slice(0, 1000), workdir / "warm.parquet")
    _warm_kernels(queries, parquet)
    jit = _cep_run_jit(queries, path, workdir / "jit.jsonl")
    return {"cep_run_s": round(jit["total_s"], 2),
            "cep_run_events_per_s": round(count / jit["total_s"]),
            "cep_run_composites": jit["composites"]}


def bench_spark_stream(count: int = 200_000, masters: tuple[str, ...] = ("local[1]", "local[2]"),
                       per_file: int = 10_000, triggers: tuple[float, ...] = (1.0, 2.0),
                       seed: int = 1, workdir: str | None = None, e2e: bool = True,
                       max_files: int = 0, warm: int = 1000, shards: int = 0) -> dict:
    directory = Path(workdir or tempfile.mkdtemp(prefix="cep-bench-spark-stream-"))
    directory.mkdir(parents=True, exist_ok=True)
    result: dict = {"count": count, "per_file": per_file, "max_files": max_files,
                    "load_before": os.getloadavg()[0]}
    result.update(cep_run_baseline(count, seed, directory))
    for master in masters:
        args = [sys.executable, "-m", "cep_service.bench.spark_stream", "--one", master,
                "--count", str(count), "--per-file", str(per_file), "--seed", str(seed),
                "--triggers", ",".join(f"{t:g}" for t in triggers), "--workdir",
                str(directory), "--max-files", str(max_files), "--warm", str(warm),
                "--shards", str(shards)]
        done = subprocess.run(args, capture_output=True, text=True, check=True)
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        figures["load_after"] = os.getloadavg()[0]
        result[master] = figures
    if e2e:  # the Kafka service (chained pipeline) on the same count, same machine
        done = subprocess.run([sys.executable, "-m", "cep_service.cli.main", "bench", "e2e",
                               "--json", "--count", str(count), "--mode", "chained"],
                              capture_output=True, text=True)
        try:
            result["kafka_service_e2e"] = json.loads(done.stdout[done.stdout.index("{"):])
        except ValueError:
            result["kafka_service_e2e"] = {"failed": done.stderr[-500:]}
        result["load_after_e2e"] = os.getloadavg()[0]
    return result


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Deliberately like bench/soak.py's options: argparse declarations, each benchmark its own
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--per-file", type=int, default=10_000)
    parser.add_argument("--masters", default="local[1],local[2]")
    parser.add_argument("--triggers", default="1,2",
                        help="trigger intervals of the latency runs (\"\": none)")
    parser.add_argument("--warm", type=int, default=1000,
                        help="events of the first job, which starts the Python workers and "
                        "warms the JVM (its JIT) before the throughput run")
    parser.add_argument("--max-files", type=int, default=0,
                        help="files per micro-batch of the throughput run (0: all)")
    parser.add_argument("--shards", type=int, default=0,
                        help="state keys per keyed query group (0: the job's default, "
                        "spark.sql.shuffle.partitions: the master's cores)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir")
    parser.add_argument("--no-e2e", action="store_true", help="skip `cep bench e2e`")
    parser.add_argument("--one", metavar="MASTER", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    triggers = tuple(float(t) for t in args.triggers.split(",") if t.strip())
    if args.one:
        print(json.dumps(one_master(args.one, args.count, args.per_file, list(triggers),
                                    args.seed, Path(args.workdir), args.max_files,
                                    args.warm, args.shards)))
        return
    print(json.dumps(bench_spark_stream(args.count, tuple(args.masters.split(",")),
                                        args.per_file, triggers, args.seed, args.workdir,
                                        not args.no_e2e, args.max_files, args.warm,
                                        args.shards),
                     indent=1))


if __name__ == "__main__":
    main()
