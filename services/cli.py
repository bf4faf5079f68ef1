"""The `cep` command line: check query files, run them offline over event files, list schemas.

Messages go to stderr (rich); data (composite events, `check` results, tables) to stdout.
Exit codes: 0 ok, 1 a problem with the queries or the input, 2 a usage error. Errors are
one clean message, never a traceback (set CEP_DEBUG=1 to see the traceback of an internal
error).
"""

from __future__ import annotations

import os
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.table import Table

from cep_core.errors import QueryError, QueryErrors
from cep_core.schema import SchemaError, SchemaRegistry

app = typer.Typer(
    name="cep",
    help="Complex event processing: check and run queries (MATCH, SEQ, WINDOW).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

stderr = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)
stdout = Console(soft_wrap=True, highlight=False, emoji=False)


class CliError(Exception):
    """A clean error: printed as `error: message` and exits with `code`."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class Engine(StrEnum):
    reference = "reference"
    jit = "jit"


class Placement(StrEnum):
    cpu = "cpu"
    gpu = "gpu"
    auto = "auto"


SchemaOption = Annotated[
    list[Path] | None,
    typer.Option("--schema", "-s", help="A schema file, or a directory of <stream>.json files "
                 "(repeatable); schemas/ is always searched last."),
]


def _error(message: str) -> None:
    stderr.print(message, markup=False, style="red")


def _registry(schemas: list[Path] | None) -> SchemaRegistry:
    registry = SchemaRegistry()
    for path in schemas or []:
        if not path.exists():
            raise CliError(f"schema {path}: no such file or directory", 2)
        try:
            registry.add_path(path)
        except SchemaError as e:
            raise CliError(f"schema {path}: {e}") from None
    return registry


def _load(path: Path, registry: SchemaRegistry):
    """Checked queries of one file; CliError with every located message otherwise."""
    from cep_core.checker import load_queries

    if not path.is_file():
        raise CliError(f"{path}: no such file", 2 if not path.exists() else 1)
    try:
        return load_queries(path, registry)
    except QueryErrors as e:
        raise CliError("\n".join(str(err) for err in e.errors)) from None
    except QueryError as e:
        raise CliError(str(e)) from None
    except (SchemaError, UnicodeDecodeError) as e:
        raise CliError(f"{path}: {e}") from None


def _guard(body) -> None:
    """Run a command body, turning errors into clean messages and exit codes."""
    try:
        body()
    except CliError as e:
        _error(f"error: {e}" if not _is_located(str(e)) else str(e))
        raise typer.Exit(e.code) from None
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as e:  # an internal error: still no traceback unless asked for
        if os.environ.get("CEP_DEBUG"):
            raise
        _error(f"internal error: {type(e).__name__}: {e} (set CEP_DEBUG=1 for the traceback)")
        raise typer.Exit(2) from None


def _is_located(message: str) -> bool:
    """Whether the message already starts `file:line:col: error:`."""
    return ": error: " in message.split("\n", 1)[0]


# ------------------------------------------------------------------ cep check


@app.command()
def check(
    files: Annotated[list[Path], typer.Argument(help="Query files to parse and check.")],
    schema: SchemaOption = None,
) -> None:
    """Parse and check query files; errors name file:line:col."""

    def body():
        registry = _registry(schema)
        failed = 0
        for path in files:
            try:
                queries = _load(path, registry)
            except CliError as e:
                _error(f"error: {e}" if not _is_located(str(e)) else str(e))
                failed = max(failed, e.code)
                continue
            names = ", ".join(q.name for q in queries)
            plural = "query" if len(queries) == 1 else "queries"
            stdout.print(f"{path}: {len(queries)} {plural} OK ({names})", markup=False)
        if failed:
            raise typer.Exit(failed)

    _guard(body)


# ------------------------------------------------------------------ cep run


@app.command()
def run(
    query_file: Annotated[Path, typer.Argument(help="The query file.")],
    events: Annotated[Path, typer.Option("--events", "-e", help="Events: .jsonl/.json/"
                                         ".ndjson, .csv or .parquet.")],
    schema: SchemaOption = None,
    engine: Annotated[Engine, typer.Option(help="Which engine runs the queries.")] =
    Engine.reference,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Where composite events "
                                                "go, as JSON lines (default: stdout).")] = None,
    dead_letters: Annotated[Path | None, typer.Option(
        "--dead-letters", help="Write bad events here as JSON lines (default: a summary on "
        "stderr).")] = None,
    placement: Annotated[Placement | None, typer.Option(
        help="jit engine: where SEQ queries run (auto: costly ones on a real GPU; gpu: every "
        "query the GPU engine supports; see docs/gpu.md).")] = None,
) -> None:
    """Run the queries of a file over a file of events; composite events as JSON lines."""

    def body():
        from cep_core.event_io import (
            InputError,
            read_events,
            write_composites_jsonl,
            write_dead_letters_jsonl,
        )

        registry = _registry(schema)
        queries = _load(query_file, registry)
        streams = sorted({q.schema.stream for q in queries})
        if len(streams) != 1:
            raise CliError(f"{query_file}: the queries read several streams "
                           f"({', '.join(streams)}); cep run takes one stream per file")
        stream_schema = queries[0].schema

        started = time.perf_counter()
        try:
            simple, dead = read_events(events, stream_schema)
        except InputError as e:
            raise CliError(str(e)) from None
        except OSError as e:
            raise CliError(f"{events}: {e.strerror or e}") from None
        read_s = time.perf_counter() - started

        started = time.perf_counter()
        composites, rejected = run_queries(queries, simple, engine, placement)
        run_s = time.perf_counter() - started
        dead.extend(rejected)

        try:
            write_composites_jsonl(composites, out)
            if dead_letters is not None:
                write_dead_letters_jsonl(dead, dead_letters)
        except OSError as e:
            raise CliError(f"{e.filename or out}: {e.strerror or e}") from None

        if dead and dead_letters is None:
            first = dead[0]
            stderr.print(f"{len(dead)} bad event{'s' if len(dead) != 1 else ''}: first "
                         f"{first.source}:{first.position}: {first.reason}", markup=False,
                         style="yellow")
        rate = len(simple) / run_s if run_s > 0 else float("inf")
        stderr.print(f"{len(simple)} events ({len(dead)} bad) read in {read_s:.2f}s; "
                     f"{engine.value} engine: {len(composites)} composite events in "
                     f"{run_s:.2f}s ({rate:,.0f} events/s)", markup=False, style="dim")

    _guard(body)


def run_queries(queries, events, engine: Engine = Engine.reference,
                placement: Placement | None = None) -> tuple[list[dict], list]:
    """Composite events of the queries over the events, in deterministic order, with the
    events the engines rejected (time going backwards, late for a window) as DeadLetters."""
    from cep_core.event_io import DeadLetter

    rejected: list = []
    if engine is Engine.reference:
        from cep_core import reference

        composites = reference.run(queries, events, rejected=rejected)
        rejected = [(q, event, reason) for q, event, reason in rejected]
    else:
        from cep_core import engine as jit

        if placement is None:
            composites = jit.run(queries, events, rejected=rejected)
        else:
            from accel.gpu import placement as placed

            report: list = []
            composites = placed.run(queries, events, placement.value, rejected=rejected,
                                    report=report)
            for where in report:
                stderr.print(f"placement: {where.line()}", markup=False, style="dim")
        by_seq = {event.seq: event for event in events}
        rejected = [(q, by_seq[seq], reason) for q, seq, reason in rejected]
    return composites, [DeadLetter(f"query {q.name}", event.seq,
                                   orjson.dumps(event.to_json()), reason)
                        for q, event, reason in rejected]


# ------------------------------------------------------------------ cep schemas


@app.command()
def schemas(schema: SchemaOption = None) -> None:
    """List the known streams and their attributes."""

    def body():
        registry = _registry(schema)
        table = Table(title="Streams")
        for column in ("stream", "attributes", "time", "type attribute"):
            table.add_column(column)
        for name in registry.names():
            try:
                s = registry.get(name)
            except SchemaError as e:
                _error(f"error: {e}")
                continue
            if s is None:
                continue
            attrs = ", ".join(f"{a}: {t}" for a, t in s.attributes.items())
            typed = "-" if s.type_attribute is None else s.type_attribute + (
                f" ({', '.join(s.types)})" if s.types else "")
            table.add_row(s.stream, attrs, f"{s.time} ({s.time_unit})", typed)
        stdout.print(table)

    _guard(body)


# ------------------------------------------------------------------ cep gen


class EventFormat(StrEnum):
    parquet = "parquet"
    jsonl = "jsonl"


@app.command()
def gen(
    workload: Annotated[str, typer.Argument(help="finance0 .. finance5, twitter1, twitter2, "
                                            "marathon, r5, q9 or hyper.")],
    events: Annotated[int, typer.Option("--events", "-n", min=0, help="How many events.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write into "
                                      "(created if missing).")],
    seed: Annotated[int, typer.Option(min=0, help="Random seed; the same seed gives the same "
                                      "events and queries.")] = 0,
    fmt: Annotated[EventFormat, typer.Option("--format", help="Format of the events file.")] =
    EventFormat.parquet,
    queries: Annotated[int | None, typer.Option(min=1, help="q9 only: how many concurrent "
                                                "queries (default 1).")] = None,
) -> None:
    """Write a benchmark workload: OUT/<stream>.<format> (events) and OUT/<workload>.cep."""

    def body():
        from cep_core.workloads import WORKLOADS, write_events

        chosen = WORKLOADS.get(workload)
        if chosen is None:
            raise CliError(f"unknown workload '{workload}' (one of {', '.join(WORKLOADS)})", 2)
        options = {}
        if queries is not None:
            if "queries" not in chosen.options:
                raise CliError(f"workload '{workload}' takes no --queries (only q9 does)", 2)
            options["queries"] = queries
        started = time.perf_counter()
        table = chosen.generate(events, seed)
        events_path = out / f"{chosen.stream}.{fmt.value}"
        query_path = out / f"{workload}.cep"
        try:
            out.mkdir(parents=True, exist_ok=True)
            write_events(table, events_path, fmt.value)
            query_path.write_text(chosen.query_text(seed=seed, **options))
        except OSError as e:
            raise CliError(f"{e.filename or out}: {e.strerror or e}") from None
        stderr.print(f"{workload}: {events} events (seed {seed}) in {events_path}, queries in "
                     f"{query_path} ({time.perf_counter() - started:.2f}s)\n"
                     f"run them: cep run {query_path} --events {events_path}",
                     markup=False, style="dim")

    _guard(body)


# ------------------------------------------------------------------ cep broker


@app.command()
def broker(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0: a free one).")] = 9092,
    storage: Annotated[str, typer.Option(help="tansu storage URL (memory://tansu/ or "
                                         "s3://tansu/ with AWS_* variables set).")]
    = "memory://tansu/",
) -> None:
    """Run the embedded Kafka-protocol broker (tansu) in the foreground until Ctrl-C or
    SIGTERM."""
    import signal

    from services.broker import BrokerError, EmbeddedBroker

    def body():
        embedded = EmbeddedBroker(port=port, storage=storage)
        try:
            embedded.start()
        except BrokerError as e:
            raise CliError(str(e)) from None
        stderr.print(f"broker listening on {embedded.bootstrap} (storage {storage}); "
                     f"export KAFKA_BOOTSTRAP={embedded.bootstrap}", markup=False)
        def interrupt(*_):
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, interrupt)
        try:
            embedded.process.wait()
        except KeyboardInterrupt:
            pass
        finally:
            embedded.stop()

    _guard(body)


# ------------------------------------------------------------------ cep bench

bench_app = typer.Typer(help="Benchmarks (throughput against the reference interpreter).",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("core")
def bench_core(
    workload: Annotated[str, typer.Option(help="A workload name (see cep gen).")],
    events: Annotated[int, typer.Option("--events", "-n", min=1, help="Events.")] = 1_000_000,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 1,
    queries: Annotated[int | None, typer.Option(help="Concurrent queries (q9).")] = None,
    reference_events: Annotated[int | None, typer.Option(
        help="Events for the reference baseline (default: per workload).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """A workload's events, already in columns, through the jitted engine (events/s), with
    the reference interpreter as the baseline in the same run."""

    def body():
        from cep_core.benchmark import core
        from cep_core.workloads import WORKLOADS

        if workload not in WORKLOADS:
            raise CliError(f"unknown workload '{workload}' (one of {', '.join(WORKLOADS)})", 2)
        options = {"queries": queries} if queries is not None else {}
        result = core(workload, events, seed, reference_events, **options)
        if as_json:
            print(orjson.dumps(result).decode())
            return
        table = Table(title=f"cep bench core --workload {workload}")
        for name in result:
            table.add_column(name, justify="right")
        table.add_row(*(f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)
                        for v in result.values()))
        stdout.print(table)

    _guard(body)


@bench_app.command("gpu")
def bench_gpu(
    events: Annotated[int, typer.Option("--events", "-n", min=1, help="Events per run.")] =
    60_000,
    quick: Annotated[bool, typer.Option(help="Fewer points (a smoke run).")] = False,
) -> None:
    """Cugola & Margara's R5 scenario: microseconds per event on CPU (AIP, CDP) and, on a
    real GPU only, GPU CDP; varying window, sequence length and number of rules."""

    def body():
        from accel.gpu.benchmark import main as bench_main

        bench_main(events, quick)

    _guard(body)


@bench_app.command("backfill")
def bench_backfill(
    events: Annotated[int, typer.Option("--events", "-n", min=1, help="Events.")] =
    10_000_000,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[2]",
    partitions: Annotated[int, typer.Option(min=1, help="Spark partitions per keyed "
                                            "group.")] = 8,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 1,
    baseline_events: Annotated[int | None, typer.Option(
        help="Events for the single-process jit baseline (default: all).")] = None,
    workdir: Annotated[Path | None, typer.Option(help="Where the data and outputs go "
                                                 "(default: a temporary directory).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """The finance workloads through the Spark backfill and, in the same run, through
    `cep run --engine jit` in one process: events/s of both and their ratio."""

    def body():
        from services.backfill_bench import bench_backfill as run_bench

        result = run_bench(events, master=master, seed=seed, partitions=partitions,
                           baseline_events=baseline_events,
                           workdir=str(workdir) if workdir else None, console=stderr)
        if as_json:
            print(orjson.dumps(result).decode())
            return
        table = Table(title="cep bench backfill")
        table.add_column("measure")
        table.add_column("value", justify="right")
        for name, value in result.items():
            table.add_row(name, f"{value:,}" if isinstance(value, int)
                          and not isinstance(value, bool) else str(value))
        stdout.print(table)

    _guard(body)


# ------------------------------------------------------------------ cep backfill


@app.command()
def backfill(
    query_file: Annotated[Path, typer.Argument(help="The query file.")],
    inputs: Annotated[list[str], typer.Option("--input", "-i", help="History: .parquet, "
                                              ".jsonl or .csv files or directories, local "
                                              "or any Hadoop URI (repeatable; read in "
                                              "order as one stream).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Where composite events go "
                                        "(a Parquet directory).")],
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[*]",
    partitions: Annotated[int | None, typer.Option(min=1, help="Spark partitions per keyed "
                                                   "query group (default: the shuffle "
                                                   "partitions, 8).")] = None,
    dead_letters: Annotated[str | None, typer.Option(
        "--dead-letters", help="Where dead letters go (Parquet; default "
        "OUTPUT_dead_letters).")] = None,
    to_kafka: Annotated[str | None, typer.Option("--to-kafka", help="Also produce the "
                                                 "composite events to this topic.")] = None,
    bootstrap: Annotated[str | None, typer.Option(help="Kafka bootstrap servers (default: "
                                                  "$KAFKA_BOOTSTRAP).")] = None,
    schema: SchemaOption = None,
) -> None:
    """Run the queries over history with Spark; composite events as Parquet."""

    def body():
        from cep_core.event_io import InputError
        from services.backfill import run_backfill, spark_session

        queries = _load(query_file, _registry(schema))
        if to_kafka and not (bootstrap or os.environ.get("KAFKA_BOOTSTRAP")):
            raise CliError("--to-kafka needs a broker: pass --bootstrap or set "
                           "KAFKA_BOOTSTRAP", 2)
        spark = spark_session(master, shuffle_partitions=partitions or 8)
        try:
            result = run_backfill(spark, queries, inputs, output, dead_letters=dead_letters,
                                  partitions=partitions, console=stderr, to_kafka=to_kafka,
                                  bootstrap=bootstrap)
        except (InputError, ValueError) as e:
            raise CliError(str(e)) from None
        stderr.print(result.summary(), markup=False)

    _guard(body)


from accel.gpu.cli import gpu_app  # noqa: E402

app.add_typer(gpu_app, name="gpu")

from accel.fpga.cli import fpga_app  # noqa: E402

app.add_typer(fpga_app, name="fpga")


# ------------------------------------------------------------------ the streaming service

from services.serve_cli import register as _register_service  # noqa: E402

_register_service(app, bench_app, _guard, CliError)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
