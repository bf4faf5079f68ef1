"""`cep bench`: benchmarks (their code lives in bench/)."""


# Deferred imports: each benchmark (numba kernels, Kafka, Spark, the GPU) and the workloads load
# when its command runs: the CLI registers these commands for every `cep` invocation, `cep --help`
# included.

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cep_service.cli.common import (
    CliError,
    count_option,
    guard,
    print_json,
    print_table,
    stderr,
)

if TYPE_CHECKING:
    pass


bench_app = typer.Typer(help="Benchmarks (throughput against the reference interpreter).",
                        no_args_is_help=True)


@bench_app.command("core")
def bench_core(
    workload: Annotated[str, typer.Option(metavar="NAME",
                                          help="A workload name (see cep gen).")],
    count: Annotated[int, count_option()] = 1_000_000,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 1,
    queries: Annotated[int | None, typer.Option(help="Concurrent queries (q9; default "
                                                "1).")] = None,
    reference_events: Annotated[int | None, typer.Option(
        metavar="N", help="Events for the reference baseline (default: per workload).")] =
    None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """A workload's events, already in columns, through the jitted engine (events/s), with
    the reference interpreter as the baseline in the same run."""

    def body() -> None:
        from cep_service.bench.kernels import core
        from cep_core.workloads import WORKLOADS

        if workload not in WORKLOADS:
            raise CliError(f"unknown workload '{workload}' (one of {', '.join(WORKLOADS)})", 2)
        options = {"queries": queries} if queries is not None else {}
        result = core(workload, count, seed, reference_events, **options)
        if as_json:
            print_json(result)
        else:
            print_table(f"cep bench core --workload {workload}", result)

    guard(body)


@bench_app.command("gpu")
def bench_gpu(
    count: Annotated[int, count_option("events per run")] = 60_000,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer points (a smoke run).")] =
    False,
) -> None:
    """Cugola & Margara's R5 scenario: microseconds per event on CPU (AIP, CDP) and, on a
    real GPU only, GPU CDP; varying window, sequence length and number of rules."""

    def body() -> None:
        from cep_service.bench.gpu_kernels import main as bench_main

        bench_main(count, quick)

    guard(body)


@bench_app.command("backfill")
def bench_backfill(
    count: Annotated[int, count_option()] = 10_000_000,
    master: Annotated[str, typer.Option(metavar="URL", help="Spark master.")] = "local[2]",
    partitions: Annotated[int | None, typer.Option(min=1, help="Spark partitions per "
                                                   "keyed group (default: the cores Spark "
                                                   "has).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 1,
    baseline_events: Annotated[int | None, typer.Option(
        metavar="N", help="Events for the single-process jit baseline (default: all).")] =
    None,
    workdir: Annotated[Path | None, typer.Option(metavar="DIR", help="Where the data and "
                                                 "outputs go (default: a temporary "
                                                 "directory).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """The finance workloads through the Spark backfill and, in the same run, through
    `cep run --engine jit` in one process: events/s of both and their ratio."""

    def body() -> None:
        from cep_service.extras import require

        require("pyspark", "spark", "cep bench backfill")
        from cep_service.bench.spark_backfill import bench_backfill as run_bench

        result = run_bench(count, master=master, seed=seed, partitions=partitions,
                           baseline_events=baseline_events,
                           workdir=str(workdir) if workdir else None, console=stderr)
        if as_json:
            print_json(result)
        else:
            print_table("cep bench backfill", result, vertical=True)

    guard(body)


@bench_app.command("spark-stream")
def bench_spark_stream(
    count: Annotated[int, count_option()] = 200_000,
    masters: Annotated[str, typer.Option(metavar="URL,URL", help="Spark masters, each run "
                                         "in a process of its own.")] = "local[1],local[2]",
    per_file: Annotated[int, typer.Option(metavar="N", help="Events per input file.")] =
    10_000,
    triggers: Annotated[str, typer.Option(metavar="S,S", help="Trigger intervals (seconds) "
                                          "for the latency runs.")] = "1,2",
    seed: Annotated[int, typer.Option(help="Random seed.")] = 1,
    workdir: Annotated[Path | None, typer.Option(metavar="DIR", help="Where the data and "
                                                 "checkpoints go (default: a temporary "
                                                 "directory).")] = None,
    e2e: Annotated[bool, typer.Option("--e2e/--no-e2e", help="Also run `cep bench e2e "
                                      "--mode chained` (the Kafka service).")] = True,
    max_files: Annotated[int, typer.Option(min=0, metavar="N", help="Files per micro-batch "
                                           "of the throughput run (0: all).")] = 0,
    warm: Annotated[int, typer.Option(min=1, metavar="N", help="Events of the first job "
                                      "(Python workers, the JVM warmed up).")] = 1000,
) -> None:
    """The Spark streaming job against `cep run --engine jit` on the same events:
    throughput, latency p50/p99 per trigger interval, state size, restart (JSON)."""

    def body() -> None:
        from cep_service.extras import require

        require("pyspark", "spark", "cep bench spark-stream")
        from cep_service.bench.spark_stream import bench_spark_stream as run_bench

        print_json(run_bench(count, tuple(masters.split(",")), per_file,
                             tuple(float(t) for t in triggers.split(",") if t.strip()), seed,
                             str(workdir) if workdir else None, e2e, max_files, warm))

    guard(body)


@bench_app.command("reading")
def bench_reading(
    count: Annotated[int, count_option()] = 200_000,
    repeat: Annotated[int, typer.Option(min=1, help="Runs of each reader (the best kept).")]
    = 3,
    processes: Annotated[bool, typer.Option("--processes", help="Also whole `cep run` "
                                            "processes on the issue's IoT file.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per file.")] =
    False,
) -> None:
    """Users' data: realistic streams (ISO-8601 times, fields beside the schema, JSON lines
    and CSV) and finance1 read by `cep run`'s reader beside pyarrow's own reader on the same
    file, interleaved (bench/bench_realistic.py)."""

    def body() -> None:
        from cep_service.bench.bench_realistic import run_all

        for row in run_all(count, repeat, processes):
            if as_json:
                print_json(row)
            else:
                print_table(f"cep bench reading: {row['file']}", row)

    guard(body)


@bench_app.command("recognize")
def bench_recognize(
    count: Annotated[int, count_option()] = 1_000_000,
    repeat: Annotated[int, typer.Option(min=1, help="Fresh engines per query (the best "
                                        "kept).")] = 3,
    symbols: Annotated[int, typer.Option(min=1, metavar="K", help="Keys of the trades "
                                         "(with thousands, their partial matches are not in "
                                         "the cache).")] = 390,
    processes: Annotated[bool, typer.Option(
        help="Also both as whole `cep run` processes over the same CSV of trades, "
             "interleaved.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """MATCH_RECOGNIZE against MATCH: the M-shape as Flink writes it through the jitted
    MATCH_RECOGNIZE engine, beside our MATCH M-shape through the jitted MATCH engine, on the
    same trades (and with ORDER BY ts, price DESC); their output on a prefix checked against
    the reference interpreter; with --processes, the user's path too (file in, output
    written, start-up included) (bench/bench_recognize.py)."""

    def body() -> None:
        from cep_service.bench.bench_recognize import processes as whole_processes
        from cep_service.bench.bench_recognize import report, run

        result = run(count, repeat, symbols=symbols)
        if processes:
            result["processes"] = whole_processes(count, repeat)
        if as_json:
            print_json(result)
        else:
            for line in report(result):
                print(line)

    guard(body)


@bench_app.command("peers", context_settings={"allow_extra_args": True,
                                              "ignore_unknown_options": True,
                                              "help_option_names": []})
def bench_peers(ctx: typer.Context) -> None:
    """This product against OpenCEP and Apache Flink (MATCH_RECOGNIZE), side by side, match
    sets compared: bench/peers/run.py, whose options it takes (`cep bench peers --help`;
    docs/peers.md)."""
    from cep_service import bench

    script = Path(bench.__file__).resolve().parent / "peers" / "run.py"

    def body() -> None:
        code = subprocess.run([sys.executable, str(script), *ctx.args]).returncode
        if code:
            raise typer.Exit(code)

    guard(body)
