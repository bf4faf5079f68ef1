"""What every `cep` command shares: consoles, clean errors, schema and query loading."""

from __future__ import annotations

# Deferred imports: the query checker (lark), the runner (numpy, pyarrow, numba) and Kafka load when
# a command needs them, so `cep --help` and `cep schemas` import none of them.

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.console import Console

from cep_core.home import HomeError
from cep_core.placement import Target as Placement
from cep_core.runner import EngineName as Engine
from cep_service.errors import CleanError

if TYPE_CHECKING:
    import pyarrow as pa

    from cep_core import ast
    from cep_core.checked import CheckedQuery
    from cep_core.composites import Composites
    from cep_core.events import Event
    from cep_core.schema import SchemaError, SchemaRegistry
    from cep_service.stream.kafka import KafkaSettings


stderr = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)


stdout = Console(soft_wrap=True, highlight=False, emoji=False)


class CliError(Exception):
    """A clean error: printed as `error: message` and exits with `code`."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


SchemaOption = Annotated[
    list[Path] | None,
    typer.Option("--schema", "-s", metavar="FILE|DIR",
                 help="A schema file, or a directory of <stream>.json files (repeatable; "
                 "before those of $CEP_SCHEMA_PATH; the built-in schemas come last)."),
]


def print_error(message: str) -> None:
    stderr.print(message, markup=False, style="red")


def schema_registry(schemas: list[Path] | None) -> SchemaRegistry:
    from cep_core.schema import SchemaError, SchemaRegistry

    try:
        registry = SchemaRegistry()
    except SchemaError as e:
        raise CliError(schema_error_text(e)) from None
    for path in reversed(schemas or []):  # add_path puts each in front: the first wins
        if not path.exists():
            raise CliError(f"schema {path}: no such file or directory", 2)
        try:
            registry.add_path(path)
        except SchemaError as e:
            raise CliError(schema_error_text(e, f"schema {path}: ")) from None
    return registry


def schema_error_text(error: SchemaError, prefix: str = "") -> str:
    """A SchemaError as an error line: a schema file that is not JSON is located
    (`file:line:col: error: not valid JSON: ...`), any other has `prefix` in front."""
    located = getattr(error, "located", None)
    return located() if located is not None else f"{prefix}{error}"


def load_query_file(path: Path, registry: SchemaRegistry) -> list[CheckedQuery]:
    """Checked queries of one file; CliError with every located message otherwise."""
    text, parsed = parse_query_file(path)
    return check_query_file(path, text, parsed, registry)


def parse_query_file(path: Path) -> tuple[str, ast.QueryFile]:
    """The text of a query file and its queries as parsed, not yet checked (what streams
    they read): `load_query_file`'s first half; CliError otherwise."""
    from cep_core.errors import QueryError
    from cep_core.parser import parse

    if not path.is_file():
        raise CliError(f"{path}: no such file", 2 if not path.exists() else 1)
    try:
        text = path.read_text()
        return text, parse(text, str(path))
    except QueryError as e:
        raise CliError(str(e)) from None
    except UnicodeDecodeError as e:
        raise CliError(f"{path}: {e}") from None


def check_query_file(path: Path, text: str, parsed: ast.QueryFile,
                     registry: SchemaRegistry) -> list[CheckedQuery]:
    """`load_query_file`'s second half: the queries `parse_query_file` gave, checked."""
    from cep_core.checker import check
    from cep_core.errors import QueryError, QueryErrors
    from cep_core.schema import SchemaError

    try:
        return check(parsed, registry, text)
    except QueryErrors as e:
        raise CliError("\n".join(str(err) for err in e.errors)) from None
    except QueryError as e:
        raise CliError(str(e)) from None
    except SchemaError as e:
        raise CliError(f"{path}: {e}") from None


# What `register` of services/cli/serve.py and live.py is given: `guard`, `CliError`.
Guard = Callable[[Callable[[], object]], None]
CliErrorType = Callable[..., Exception]


def guard(body: Callable[[], object]) -> None:
    """Run a command body, turning errors into clean messages and exit codes."""
    try:
        body()
    except CliError as e:
        print_error(f"error: {e}" if not is_located(str(e)) else str(e))
        raise typer.Exit(e.code) from None
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except (HomeError, CleanError) as e:  # a folder not made, an extra, the broker
        print_error(f"error: {e}")
        raise typer.Exit(1) from None
    except Exception as e:  # an internal error: still no traceback unless asked for
        if os.environ.get("CEP_DEBUG"):
            raise
        print_error(f"internal error: {type(e).__name__}: {e} (set CEP_DEBUG=1 for the traceback)")
        raise typer.Exit(2) from None


def is_located(message: str) -> bool:
    """Whether the message already starts `file:line:col: error:`."""
    return ": error: " in message.split("\n", 1)[0]


def run_queries(queries: list[CheckedQuery], events: Sequence[Event] | pa.Table,
                engine: Engine = Engine.REFERENCE,
                placement: Placement | None = None,
                timings: dict[str, float] | None = None,
                failures: list | None = None) -> tuple[Composites, list]:
    """`cep_core.runner.run_checked` (the glue the Python API uses too), printing where
    each query was placed when `placement` is given, and each query that failed (its
    output stops there; the others' is whole); `failures` gets them."""
    from cep_core.runner import run_checked

    report: list = []
    failed: list = []
    composites, rejected = run_checked(queries, events, engine.value,
                                       placement.value if placement else None, timings,
                                       report, failed)
    for where in report:
        stderr.print(f"placement: {where.line()}", markup=False, style="dim")
    for failure in failed:
        stderr.print(f"{failure}; its composite events stop there, the other queries' "
                     "are whole", markup=False, style="red")
    if failures is not None:
        failures.extend(failed)
    return composites, rejected


def count_option(what: str = "events", minimum: int = 1) -> Any:
    """`--count N` / `-n N`, how many events; `--events N`, its old name, still works (an
    events *file* is `--events FILE` in `cep run`)."""
    return typer.Option("--count", "--events", "-n", min=minimum, metavar="N",
                        help=f"How many {what} (--events N: the old name).")


def print_table(title: str, result: dict, vertical: bool = False) -> None:
    from rich.table import Table

    def shown(value: object) -> str:
        return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) \
            else str(value)

    table = Table(title=title)
    if vertical:
        table.add_column("measure")
        table.add_column("value", justify="right")
        for name, value in result.items():
            table.add_row(name, shown(value))
    else:
        for name in result:
            table.add_column(name, justify="right")
        table.add_row(*(shown(v) for v in result.values()))
    stdout.print(table)


def print_json(result: dict) -> None:
    print(orjson.dumps(result).decode())


Bootstrap = Annotated[str, typer.Option("--bootstrap", envvar="KAFKA_BOOTSTRAP",
                                        metavar="HOST:PORT", help="Kafka bootstrap servers.")]


Stream = Annotated[str, typer.Option(
    envvar="CEP_STREAM", metavar="NAME",
    help="The stream (its schema name); internal topics are cep.<stream>.*")]


Partitions = Annotated[int, typer.Option(envvar="CEP_PARTITIONS", min=1,
                                         help="Partitions of the keyed and match topics.")]


Source = Annotated[str, typer.Option(
    envvar="CEP_SOURCE_TOPIC", metavar="TOPIC",
    help="Source topic (default: the stream's name).")]


Control = Annotated[str, typer.Option(
    envvar="CEP_CONTROL_TOPIC", metavar="TOPIC",
    help="The compacted query control topic (default: <prefix>cep.queries).")]


TopicPrefix = Annotated[str, typer.Option(
    envvar="CEP_TOPIC_PREFIX", metavar="PREFIX",
    help="Prefix of the internal topics and consumer groups, so separate deployments can "
    "share a broker.")]


KafkaConfig = Annotated[Path | None, typer.Option(
    envvar="CEP_KAFKA_CONFIG", metavar="FILE",
    help="File of extra librdkafka key=value settings.")]


SchemaPaths = Annotated[list[Path] | None, typer.Option(
    "--schema", "-s", metavar="FILE|DIR",
    help="A schema file or directory for streams beyond the built-in ones (repeatable; put "
    "in front of $CEP_SCHEMA_PATH, which the services' processes inherit). The services "
    "must be given the same schemas as `cep query add`.")]


def export_schema_paths(paths: list[Path] | None,
                        cli_error: Callable[..., Exception]) -> None:
    """Put --schema paths in front of CEP_SCHEMA_PATH, so every registry this process (and
    any process it starts) makes finds them; a bad path or schema file is a clean error
    here rather than in a service later."""
    from cep_core.schema import SCHEMA_PATH_ENV, SchemaError, SchemaRegistry

    for path in paths or []:
        if not path.exists():
            raise cli_error(f"schema {path}: no such file or directory", 2)
    if paths:
        os.environ[SCHEMA_PATH_ENV] = os.pathsep.join(
            [str(p.resolve()) for p in paths] + [p for p in os.environ.get(SCHEMA_PATH_ENV, "")
                                                 .split(os.pathsep) if p])
    try:
        SchemaRegistry()  # a bad schema file: say so now, not in a service later
    except SchemaError as e:
        raise cli_error(schema_error_text(e)) from None


def kafka_settings(bootstrap: str, kafka_config: Path | None) -> KafkaSettings:
    from cep_service.stream.kafka import KafkaSettings
    return KafkaSettings.from_env(bootstrap, kafka_config)
