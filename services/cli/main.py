"""The `cep` command line: check query files, run them offline over event files, list schemas.

Messages go to stderr (rich); data (composite events, `check` results, tables) to stdout.
Exit codes: 0 ok, 1 a problem with the queries or the input, 2 a usage error. Errors are
one clean message, never a traceback (set CEP_DEBUG=1 to see the traceback of an internal
error).

Start-up matters (`cep --help`, `cep run` on a small file): this module imports only typer
and rich; every command imports what it uses in its body (numba only for the jit engine,
pyarrow only for Parquet, Spark only for the backfill). The command modules do without
`from __future__ import annotations`: typer would `eval` every string annotation of every
command at each start (~50 ms of `cep run`'s start-up).
"""


# Deferred imports: each command's modules load when it runs (events and the reader, pyarrow and the
# engines, the workloads, the broker, Spark): `cep --help`, `cep check` and `cep run --engine
# reference` import only what they use.

import gc
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer

from cep_core.event_io import EventFormat
from cep_service.cli.fpga import fpga_app
from cep_service.cli.gpu import gpu_app
from cep_service.cli.bench import bench_app
from cep_service.cli.common import (
    CliError,
    Engine,
    Placement,
    SchemaOption,
    count_option,
    guard,
    is_located,
    check_query_file,
    load_query_file,
    parse_query_file,
    print_error,
    print_json,
    run_queries,
    schema_error_text,
    schema_registry,
    stderr,
    stdout,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from cep_core import ast
    from cep_core.checked import CheckedQuery
    from cep_core.event_io import DeadLetter
    from cep_core.schema import SchemaRegistry, StreamSchema
    from cep_core.time_guard import TimeGuard
from cep_service.cli.explain import explain_command
from cep_service.cli.help import PlainHelpGroup
from cep_service.cli.serve import register as register_service_commands
from cep_service.cli.spark import spark_app

app = typer.Typer(
    name="cep",
    cls=PlainHelpGroup,
    help="Complex event processing: check and run queries (MATCH, SEQ, WINDOW).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        number = version("cep-service")
    except PackageNotFoundError:  # run from a source tree that was never installed
        number = "unknown (the cep-service package is not installed)"
    print(f"cep {number}")
    raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print the version (from the installed package) and exit.")] = False,
) -> None:
    pass


# ------------------------------------------------------------------ cep check


@app.command()
def check(
    files: Annotated[list[Path], typer.Argument(help="Query files to parse and check.")],
    schema: SchemaOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per file on "
                                          "stdout: ok, its queries (name, stream, INTO "
                                          "topic) or its error messages.")] = False,
) -> None:
    """Parse and check query files; errors name file:line:col."""

    def body() -> None:
        registry = schema_registry(schema)
        failed = 0
        for path in files:
            try:
                queries = load_query_file(path, registry)
            except CliError as e:
                if as_json:
                    print_json({"file": str(path), "ok": False, "error": str(e)})
                else:
                    print_error(f"error: {e}" if not is_located(str(e)) else str(e))
                failed = max(failed, e.code)
                continue
            if as_json:
                print_json({"file": str(path), "ok": True, "queries": [
                    {"name": q.name, "stream": q.schema.stream, "into": q.query.output}
                    for q in queries]})
                continue
            names = ", ".join(q.name for q in queries)
            plural = "query" if len(queries) == 1 else "queries"
            stdout.print(f"{path}: {len(queries)} {plural} OK ({names})", markup=False)
        if failed:
            raise typer.Exit(failed)

    guard(body)


# ------------------------------------------------------------------ cep run

EventsOption = Annotated[Path, typer.Option(
    "--events", "--input", "-e", "-i", metavar="FILE",
    help="Events: .jsonl/.json/.ndjson, .csv or .parquet; - reads standard input (name its "
    "format with --format).")]
FormatOption = Annotated[EventFormat | None, typer.Option(
    "--format", "-f", help="Format of the events (default: by the file's suffix; standard "
    "input needs it).")]


@app.command()
def run(
    query_file: Annotated[Path, typer.Argument(help="The query file.")],
    events: EventsOption,
    fmt: FormatOption = None,
    schema: SchemaOption = None,
    engine: Annotated[Engine, typer.Option(
        help="Which engine runs the queries: jit (numba kernels, compiled once and cached; "
        "the Python API's default too) or reference (the interpreter the jit engine is "
        "tested against).")] = Engine.JIT,
    out: Annotated[Path | None, typer.Option(
        "--out", "--output", "-o", metavar="FILE", show_default=False,
        help="Where composite events go: FILE.parquet (Parquet), FILE.arrow (Arrow IPC "
        "file), any other name JSON lines (default: standard output, JSON lines).")] = None,
    dead_letters: Annotated[Path | None, typer.Option(
        "--dead-letters", metavar="FILE", help="Write bad events here as JSON lines "
        "(default: a summary on stderr).")] = None,
    placement: Annotated[Placement | None, typer.Option(
        help="jit engine: where SEQ queries run (auto: costly ones on a real GPU; gpu: every "
        "query the GPU engine supports; see docs/gpu.md; default: the CPU engines).")] = None,
    max_ahead: Annotated[str | None, typer.Option(
        "--max-ahead", metavar="DURATION", help="An event whose time is more than this "
        "after the stream's time (the largest event time so far) is a dead letter, too far "
        "ahead: a duration (\"1 day\"), an integer in the stream's time unit, or none "
        "(default: the schema's max_ahead, else 366 days; docs/semantics.md).")] = None,
    max_ahead_of_clock: Annotated[str | None, typer.Option(
        "--max-ahead-of-clock", metavar="DURATION", help="The same bound against the wall "
        "clock, read when the run starts (default: the schema's max_ahead_of_clock, else "
        "none).")] = None,
) -> None:
    """Run the queries of a file over a file of events; composite events as JSON lines
    (or Parquet / Arrow by the suffix of --out).

    Exits 1 when no valid event could be read (dead letters are still written)."""

    def body() -> None:
        from cep_core.event_io import (
            STDIN,
            STDIN_SOURCE,
            InputError,
            read_events,
            write_dead_letters_jsonl,
        )
        from cep_core.schema import SchemaError
        from cep_core.time_guard import TimeGuard

        def bound(stream_schema: "StreamSchema") -> "TimeGuard":
            """The bound on events too far ahead, the same for both engines."""
            return TimeGuard.of(stream_schema, max_ahead, max_ahead_of_clock)

        registry = schema_registry(schema)
        text, parsed = parse_query_file(query_file)
        stdin_unnamed = str(events) == STDIN and fmt is None
        # The jit engine takes a table (no Python object per event), read in a thread from
        # here (a file; standard input once the queries are fine) while the queries are
        # checked (the compilers import numba) and their engines imported; the reference
        # interpreter takes Events, read without pyarrow.
        reading = None if engine is Engine.REFERENCE or str(events) == STDIN else \
            _Reading.early(parsed, registry, events, fmt, bound)
        try:
            queries = check_query_file(query_file, text, parsed, registry)
            streams = sorted({q.schema.stream for q in queries})
            if len(streams) != 1:
                raise CliError(f"{query_file}: the queries read several streams "
                               f"({', '.join(streams)}); cep run takes one stream per file")
            stream_schema = queries[0].schema
            if stdin_unnamed:
                raise CliError("--events -: standard input has no file suffix; name its "
                               "format with --format jsonl, csv or parquet", 2)
            if reading is not None and reading.schema != stream_schema:
                reading.cancel()
                reading = None
            if reading is None:
                try:
                    guard = bound(stream_schema)
                except (SchemaError, ValueError) as e:
                    raise CliError(f"stream {stream_schema.stream}: {e}", 2) from None
        except BaseException:
            if reading is not None:
                reading.cancel()
            raise
        source = STDIN_SOURCE if str(events) == STDIN else str(events)
        if engine is Engine.REFERENCE:
            started = time.perf_counter()
            try:
                simple, dead = read_events(events, stream_schema, fmt,
                                           guard)
            except InputError as e:
                raise CliError(str(e)) from None
            except OSError as e:
                raise CliError(f"{source}: {e.strerror or e}") from None
            read_s = time.perf_counter() - started
            count = len(simple)
        else:
            if reading is None:
                reading = _Reading(events, stream_schema, fmt, guard)
            try:
                _import_engines(queries)
                simple, dead = reading.result()
            except BaseException:
                reading.cancel()
                raise
            read_s, count = reading.seconds, simple.num_rows

        def write_dead_letters() -> None:
            if dead_letters is not None:
                try:
                    write_dead_letters_jsonl(dead, dead_letters)
                except OSError as e:
                    raise CliError(f"{e.filename or dead_letters}: {e.strerror or e}") \
                        from None
            elif dead:
                first = dead[0]
                stderr.print(f"{len(dead)} bad event{'s' if len(dead) != 1 else ''}: first "
                             f"{_where(first)}: {first.reason}", markup=False,
                             style="yellow")

        if not count:
            write_dead_letters()
            raise CliError(_no_events_message(source, dead, stream_schema, dead_letters))

        timings: dict = {}
        started = time.perf_counter()
        failures: list = []
        composites, rejected = run_queries(queries, simple, engine, placement, timings,
                                           failures)
        run_s = time.perf_counter() - started
        dead.extend(rejected)

        started = time.perf_counter()
        try:
            composites.write(out)
        except OSError as e:
            raise CliError(f"{e.filename or out}: {e.strerror or e}") from None
        write_s = time.perf_counter() - started
        write_dead_letters()
        stderr.print(f"{count} events ({len(dead)} bad) read in {read_s:.2f}s; "
                     + _engine_summary(engine, count, len(composites), run_s, timings)
                     + _write_summary(len(composites), write_s, out),
                     markup=False, style="dim")
        if failures:
            raise CliError(f"{len(failures)} of {len(queries)} queries failed (above)", 1)

    with _collector_paused(engine is Engine.JIT):
        guard(body)


@contextmanager
def _collector_paused(paused: bool) -> Iterator[None]:
    """The cyclic garbage collector off for a jit run: its columns make few reference
    cycles, while the collector's passes over the objects numba and pyarrow make at
    import cost 0.1-0.2 s of CPU and stall the reading thread as they hold the GIL."""
    if not paused or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Reading:
    """The events read into one table in a thread: pyarrow parses without the GIL, so on
    a machine with cores to spare reading costs little wall-clock time beside checking
    the queries and importing their engines (numba). The engines run once every block is
    read: their kernels hold the GIL, and a reader that needs it between its pyarrow and
    numpy calls would wait for a kernel call each time."""

    def __init__(self, events: str | Path, schema: "StreamSchema", fmt: str | None,
                 guard: "TimeGuard | None") -> None:
        from cep_core.event_io import STDIN, STDIN_SOURCE
        from cep_core.event_reader import read_blocks

        self.schema = schema
        self.seconds = 0.0
        self._cancel = threading.Event()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        source = STDIN_SOURCE if str(events) == STDIN else str(events)

        def read() -> None:
            started = time.perf_counter()
            blocks = []
            try:
                for block in read_blocks(events, schema, fmt, guard=guard):
                    blocks.append(block)
                    if self._cancel.is_set():
                        return
                self.seconds = time.perf_counter() - started
                self._done.put(blocks)
            except Exception as e:  # noqa: BLE001 - the main thread raises it
                self._done.put(_reading_error(e, source))

        # A daemon: an error elsewhere ends the run without waiting for its block (or for
        # standard input).
        threading.Thread(target=read, name="cep run: reading events", daemon=True).start()

    @classmethod
    def early(cls, parsed: "ast.QueryFile", registry: "SchemaRegistry", events: str | Path,
              fmt: str | None,
              bound: "Callable[[StreamSchema], TimeGuard | None]") -> "_Reading | None":
        """Reading started before the queries are checked, where the parsed queries
        already name one known stream and its bound on events too far ahead is valid;
        else None (the checks then say what is wrong, as they would)."""
        from cep_core.schema import SchemaError

        streams = {query.stream for query in parsed.queries}
        if len(streams) != 1:
            return None
        try:
            schema = registry.get(streams.pop())
            return None if schema is None else cls(events, schema, fmt, bound(schema))
        except (SchemaError, ValueError):
            return None

    def result(self) -> "tuple[pa.Table, list[DeadLetter]]":
        """The table and the dead letters in file order, as `read_table` gives them; the
        reading's error (a CliError for the input's) where it failed."""
        import pyarrow as pa

        blocks = self._done.get()
        if isinstance(blocks, BaseException):
            raise blocks
        return (pa.concat_tables([table for table, _ in blocks]),
                sorted((letter for _, letters in blocks for letter in letters),
                       key=lambda letter: letter.position))

    def cancel(self) -> None:
        """Stop at the next block; the result is never asked for."""
        self._cancel.set()


def _reading_error(error: Exception, source: str) -> Exception:
    """An error of the reading thread as the main thread raises it: the input's own as a
    clean message, anything else as it is."""
    from cep_core.event_io import InputError

    if isinstance(error, InputError):
        return CliError(str(error))
    if isinstance(error, OSError):
        return CliError(f"{source}: {error.strerror or error}")
    return error


def _import_engines(queries: "list[CheckedQuery]") -> None:
    """Import the queries' engines and ready what kernels loaded from numba's cache link
    against (`cache_load.ready`), while the events are read."""
    modules = {"match": ["match"], "seq": ["seq", "seq_aip"], "window": ["window"],
               "recognize": ["recognize"]}
    for kind in sorted({q.query.kind for q in queries}):
        for module in modules.get(kind, []):
            import_module(f"cep_core.engine.{module}")
    from cep_core.engine import cache_load

    cache_load.ready()


def _where(letter: "DeadLetter") -> str:
    """Where a dead letter came from, for messages: `file:line`, or the query and seq of
    an event an engine rejected."""
    if letter.line is None and letter.source.startswith("query "):
        return f"{letter.source}, seq {letter.position}"
    return letter.where()


def _no_events_message(source: str, dead: list, schema: "StreamSchema",
                       dead_letters: Path | None) -> str:
    if not dead:
        return f"{source}: no events (the input is empty)"
    attributes = ", ".join(f"{a}: {t}" for a, t in schema.attributes.items())
    written = f"; dead letters in {dead_letters}" if dead_letters is not None else ""
    return (f"{source}: no valid event: all {len(dead)} records are bad (first "
            f"{_where(dead[0])}: {dead[0].reason}){written}. The queries read stream "
            f"'{schema.stream}' ({attributes})")


def _engine_summary(engine: Engine, events: int, composites: int, run_s: float,
                    timings: dict) -> str:
    """The engine's part of the summary line. The jit engine's rate leaves out compiling:
    kernels compiled (or loaded from numba's cache) and code generated are shown apart."""
    if engine is Engine.REFERENCE or "process_s" not in timings:
        rate = events / run_s if run_s > 0 else float("inf")
        return (f"{engine.value} engine: {composites} composite events in {run_s:.2f}s "
                f"({rate:,.0f} events/s)")
    process_s = timings["process_s"]
    rate = events / process_s if process_s > 0 else float("inf")
    load_s = timings["setup_s"] + timings["compile_s"]
    return (f"{engine.value} engine: {composites} composite events; compile/load "
            f"{load_s:.2f}s (imports and code generation {timings['setup_s']:.2f}s, "
            f"kernels {timings['compile_s']:.2f}s); processing {process_s:.2f}s "
            f"({rate:,.0f} events/s)")


def _write_summary(composites: int, write_s: float, out: Path | None) -> str:
    """The summary's last part: how long writing the composite events took, at what rate,
    in which format."""
    from cep_core.composites import output_format

    rate = f"{composites / write_s:,.0f} composite events/s, " if composites and write_s else ""
    return f"; written in {write_s:.2f}s ({rate}{output_format(out)})"


# ------------------------------------------------------------------ cep schemas


class SchemasAction(StrEnum):
    list = "list"
    import_ = "import"


@app.command()
def schemas(
    action: Annotated[SchemasAction, typer.Argument(
        help="list (the default): the known streams; import FILE: a stream schema from the "
        "JSON Schema (draft 2020-12) of one event.")] = SchemasAction.list,
    file: Annotated[Path | None, typer.Argument(help="import: the JSON Schema file.")] = None,
    schema: SchemaOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="list: one JSON object per stream "
                                          "(its schema and `origin`, the file it came "
                                          "from).")] = False,
    out: Annotated[Path | None, typer.Option(
        "--out", "--output", "-o", metavar="FILE",
        help="import: where the stream schema goes (default: standard output).")] = None,
    stream: Annotated[str | None, typer.Option(metavar="NAME", help="import: the stream's "
                                               "name (default: the JSON Schema's title).")]
    = None,
    time_attribute: Annotated[str | None, typer.Option(
        "--time", metavar="PROPERTY", help="import: the event-time property (default: the "
        "one date-time property).")] = None,
    time_unit: Annotated[str, typer.Option(help="import: unit of integer times (ms, s, us, "
                                           "ns or ticks).")] = "ms",
    type_attribute: Annotated[str | None, typer.Option(
        metavar="PROPERTY", help="import: the string property holding the event type.")]
    = None,
    skip_optional: Annotated[bool, typer.Option(
        "--skip-optional", help="import: leave out properties that are not required (else "
        "an error: a stream attribute is in every event).")] = False,
) -> None:
    """List the known streams, their attributes and where each schema came from; or import
    a JSON Schema: `cep schemas import FILE --out STREAM.json`."""

    def body() -> None:
        if action is SchemasAction.import_:
            if file is None:
                raise CliError("cep schemas import needs a JSON Schema file", 2)
            _import_json_schema(file, out, stream, time_attribute, time_unit, type_attribute,
                                skip_optional)
        elif file is not None:
            raise CliError(f"cep schemas list takes no file (got {file})", 2)
        else:
            _list_schemas(schema_registry(schema), as_json)

    guard(body)


def _list_schemas(registry: "SchemaRegistry", as_json: bool) -> None:
    from rich.table import Table

    from cep_core.schema import SchemaError

    table = Table(title="Streams")
    for column in ("stream", "attributes", "time", "type attribute", "from"):
        table.add_column(column)
    for name in registry.names():
        try:
            s = registry.get(name)
        except SchemaError as e:
            print_error(schema_error_text(e, "error: "))
            continue
        if s is None:
            continue
        if as_json:
            print_json({**s.to_dict(), "origin": registry.origin(name)})
            continue
        attrs = ", ".join(f"{a}: {t}" for a, t in s.attributes.items())
        typed = "-" if s.type_attribute is None else s.type_attribute + (
            f" ({', '.join(s.types)})" if s.types else "")
        table.add_row(s.stream, attrs, f"{s.time} ({s.time_unit})", typed,
                      _shown_origin(registry.origin(name)))
    if not as_json:
        stdout.print(table)


def _shown_origin(origin: str | None) -> str:
    from cep_core.schema import SCHEMA_DIR

    if origin and Path(origin).parent == SCHEMA_DIR:
        return "built-in"
    return origin or "-"


def _import_json_schema(file: Path, out: Path | None, stream: str | None,
                        time_attribute: str | None, time_unit: str,
                        type_attribute: str | None, skip_optional: bool) -> None:
    from cep_core.schema import SchemaJSONError
    from cep_core.schema_import import SchemaImportError, stream_schema_from_json_schema

    try:
        document = orjson.loads(file.read_bytes())
    except OSError as e:
        raise CliError(f"{file}: {e.strerror or e}", 2) from None
    except orjson.JSONDecodeError as e:
        raise CliError(SchemaJSONError(file, e).located()) from None
    try:
        made = stream_schema_from_json_schema(document, stream, time_attribute, time_unit,
                                              type_attribute, skip_optional)
    except SchemaImportError as e:
        raise CliError(f"{file}: {e}") from None
    text = orjson.dumps(made.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n"
    if out is None:
        print(text, end="")
        return
    try:
        out.write_text(text)
    except OSError as e:
        raise CliError(f"{out}: {e.strerror or e}") from None
    stderr.print(f"stream {made.stream} ({len(made.attributes)} attributes, time "
                 f"{made.time}) in {out}; use it: --schema {out} or CEP_SCHEMA_PATH",
                 markup=False, style="dim")


# ------------------------------------------------------------------ cep gen


class Exchange(StrEnum):  # services/backfill/scan.py
    auto = "auto"
    shuffle = "shuffle"
    scan = "scan"


class GenFormat(StrEnum):  # the core's formats, with the default (Parquet) first in the help
    parquet = EventFormat.PARQUET
    jsonl = EventFormat.JSONL
    csv = EventFormat.CSV


@app.command()
def gen(
    workload: Annotated[str, typer.Argument(help="finance0 .. finance5, twitter1, twitter2, "
                                            "marathon, r5, q9, hyper, or users' data: iot, "
                                            "activity, clicks.")],
    count: Annotated[int, count_option(minimum=0)],
    out: Annotated[Path, typer.Option("--out", "--output", "-o", metavar="DIR",
                                      help="Directory to write into (created if missing).")],
    seed: Annotated[int, typer.Option(min=0, help="Random seed; the same seed gives the same "
                                      "events and queries.")] = 0,
    fmt: Annotated[GenFormat, typer.Option("--format", help="Format of the events file.")] =
    GenFormat.parquet,
    queries: Annotated[int | None, typer.Option(min=1, help="q9 only: how many concurrent "
                                                "queries (default 1).")] = None,
) -> None:
    """Write a benchmark workload: OUT/<stream>.<format> (events) and OUT/<workload>.cep."""

    def body() -> None:
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
        table = chosen.written(count, seed)  # as users write them (realistic workloads)
        events_path = out / f"{chosen.stream}.{fmt.value}"
        query_path = out / f"{workload}.cep"
        try:
            out.mkdir(parents=True, exist_ok=True)
            write_events(table, events_path, EventFormat(fmt))
            query_path.write_text(chosen.query_text(seed=seed, **options))
        except OSError as e:
            raise CliError(f"{e.filename or out}: {e.strerror or e}") from None
        stderr.print(f"{workload}: {count} events (seed {seed}) in {events_path}, queries in "
                     f"{query_path} ({time.perf_counter() - started:.2f}s)\n"
                     f"run them: cep run {query_path} --events {events_path}",
                     markup=False, style="dim")

    guard(body)


# ------------------------------------------------------------------ cep broker


@app.command()
def broker(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0: a free one).")] = 9092,
    storage: Annotated[str, typer.Option(metavar="URL", help="tansu storage URL "
                                         "(memory://tansu/ or s3://tansu/ with AWS_* "
                                         "variables set).")]
    = "memory://tansu/",
) -> None:
    """Run the embedded Kafka-protocol broker (tansu) in the foreground until Ctrl-C or
    SIGTERM."""

    def body() -> None:
        from cep_service.stream.broker import BrokerError, EmbeddedBroker

        embedded = EmbeddedBroker(port=port, storage=storage)
        try:
            embedded.start()
        except BrokerError as e:
            raise CliError(str(e)) from None
        stderr.print(f"broker listening on {embedded.bootstrap} (storage {storage}); "
                     f"export KAFKA_BOOTSTRAP={embedded.bootstrap}", markup=False)
        def interrupt(*_: object) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, interrupt)
        try:
            assert embedded.process is not None  # start() made it or raised
            embedded.process.wait()
        except KeyboardInterrupt:
            pass
        finally:
            embedded.stop()

    guard(body)


# ------------------------------------------------------------------ cep bench

app.command("explain")(explain_command)
app.add_typer(bench_app, name="bench")


# ------------------------------------------------------------------ cep backfill


@app.command()
def backfill(
    query_file: Annotated[Path, typer.Argument(help="The query file.")],
    inputs: Annotated[list[str], typer.Option(
        "--input", "--events", "-i", "-e", metavar="PATH",
        help="History: .parquet, .jsonl or .csv files or directories, local or any Hadoop "
        "URI (repeatable; read in order as one stream).")],
    output: Annotated[str, typer.Option("--output", "--out", "-o", metavar="DIR",
                                        help="Where composite events go (a Parquet "
                                        "directory, local or any Hadoop URI).")],
    master: Annotated[str, typer.Option(metavar="URL", help="Spark master.")] = "local[*]",
    partitions: Annotated[int | None, typer.Option(min=1, help="Spark partitions per keyed "
                                                   "query group (default: the cores Spark "
                                                   "has).")] = None,
    dead_letters: Annotated[str | None, typer.Option(
        "--dead-letters", metavar="DIR", help="Where dead letters go (Parquet; default "
        "OUTPUT_dead_letters).")] = None,
    to_kafka: Annotated[str | None, typer.Option("--to-kafka", metavar="TOPIC",
                                                 help="Also produce the composite events to "
                                                 "this topic.")] = None,
    bootstrap: Annotated[str | None, typer.Option(metavar="HOST:PORT", help="Kafka bootstrap "
                                                  "servers (default: $KAFKA_BOOTSTRAP).")]
    = None,
    schema: SchemaOption = None,
    exchange: Annotated[Exchange, typer.Option(
        help="How each keyed query group's engine tasks get their events: shuffle (Spark "
        "repartitions by the keys and sorts by seq), scan (every task reads the whole "
        "Parquet input and keeps its keys: no shuffle, the input read once per partition), "
        "auto (scan where the input allows it and partitions are at most 16).")] =
    Exchange.auto,
) -> None:
    """Run the queries over history with Spark; composite events as Parquet."""

    def body() -> None:
        from cep_service.extras import require

        require("pyspark", "spark", "cep backfill")
        from cep_core.event_io import InputError
        from cep_service.backfill.job import run_backfill, spark_session

        queries = load_query_file(query_file, schema_registry(schema))
        if to_kafka and not (bootstrap or os.environ.get("KAFKA_BOOTSTRAP")):
            raise CliError("--to-kafka needs a broker: pass --bootstrap or set "
                           "KAFKA_BOOTSTRAP", 2)
        spark = spark_session(master, shuffle_partitions=partitions)
        try:
            result = run_backfill(spark, queries, inputs, output, dead_letters=dead_letters,
                                  partitions=partitions, console=stderr, to_kafka=to_kafka,
                                  bootstrap=bootstrap, exchange=exchange.value)
        except (InputError, ValueError) as e:
            raise CliError(str(e)) from None
        stderr.print(result.summary(), markup=False)

    guard(body)


app.add_typer(gpu_app, name="gpu")
app.add_typer(fpga_app, name="fpga")
app.add_typer(spark_app, name="spark")
register_service_commands(app, bench_app, guard, CliError)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
