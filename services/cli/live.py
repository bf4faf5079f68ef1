"""`cep query` and `cep stream`: change what is live in the running pipelines, and see it.

A change is checked here first (by cep_core/control_message.py, against the schemas this
machine has plus the control topic's streams, and refused as a splitter would refuse it on
the live set the topic gives), written to the control topic, and then,
unless `--no-wait`, followed on the stream's status topic until the splitter refused it
(exit 1, with its reason) or applied it and the coordinator saw it in every keyed
partition (exit 0); nothing within `--timeout` exits 2. With no pipeline of that stream
up, the change waits on the control topic for one to start (exit 0). A refusal of a
file's query names the file and the line and column in it. `list` reads the status
topics: one JSON line per live query (stream) with the services that are up and hold it;
`--json`, one object per stream with each service's live set (workers: per partition).
Without `--stream` (or CEP_STREAM), every stream's: those of the control topic's queries
and streams, and those with a status topic on the broker.
"""


# Deferred imports: control messages (jsonschema, lark) and Kafka load when `cep query` or `cep
# stream` changes something, not for every `cep` command that registers them.

import re
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from cep_core.control_ops import Kind, Outcome
from cep_service.cli.common import (
    Bootstrap,
    CliErrorType,
    Control,
    Guard,
    KafkaConfig,
    SchemaPaths,
    TopicPrefix,
    export_schema_paths,
    kafka_settings,
)
from cep_service.cli.query_diff import DiffEvents, DiffOld, query_diff
from cep_service.stream.live_changes import (
    EXIT,
    Records,
    live_items,
    query_changes,
    services_view,
    stream_changes,
    stream_text_from_json_schema,
    wait_outcomes,
)

if TYPE_CHECKING:
    from cep_service.stream.kafka import KafkaSettings


class Op(StrEnum):
    add = "add"
    update = "update"
    remove = "remove"
    list = "list"
    diff = "diff"


Wait = Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until every service "
                                    "applied the change or one refused it.")]
Timeout = Annotated[float, typer.Option(min=0.1, metavar="S", help="Seconds to wait for "
                                        "the outcome (exit 2 after).")]
NoCheck = Annotated[bool, typer.Option("--no-check", help="Publish without checking here: "
                                       "the services check (a client without their schema "
                                       "files).")]
AsJson = Annotated[bool, typer.Option("--json", help="list: one JSON object per stream.")]
Stream = Annotated[str | None, typer.Option(
    envvar="CEP_STREAM", metavar="NAME", show_default=False,
    help="list: only this stream's pipeline (default: every stream, those of the control "
    "topic's queries and streams and those with a status topic); remove --no-check of a "
    "query the control topic does not hold: the stream whose pipeline reports (default "
    "trades).")]
DEFAULT_STREAM = "trades"  # remove --no-check: whose status topic to follow


# Deliberately like services/cli/serve.py _register_serve: each command module registers its typer
# commands
def register(app: typer.Typer, guard: Guard, cli_error: CliErrorType) -> None:

    # Deliberately like stream() below: each typer command declares its own options (the shared
    # ones are Annotated aliases)
    @app.command()
    def query(
        op: Annotated[Op, typer.Argument(help="add FILE / update FILE: the queries of a "
                                         "query file (or only --name); remove NAME; list; "
                                         "diff FILE --events FILE: the query's composite "
                                         "events against the live version's.")],
        target: Annotated[str | None, typer.Argument(help="A query file (add, update) or a "
                                                     "query name (remove).")] = None,
        name: Annotated[str | None, typer.Option(metavar="NAME",
                                                 help="Only this query of the file.")] = None,
        stream: Stream = None,
        bootstrap: Bootstrap = "127.0.0.1:9092",
        control: Control = "",
        topic_prefix: TopicPrefix = "",
        kafka_config: KafkaConfig = None,
        wait: Wait = True,
        timeout: Timeout = 30,
        no_check: NoCheck = False,
        as_json: AsJson = False,
        schema: SchemaPaths = None,
        events: DiffEvents = None,
        old: DiffOld = None,
    ) -> None:
        """Change the queries of the running pipelines (no restart), or list what is live."""
        if op is Op.diff:
            guard(lambda: query_diff(cli_error, target, name, events, old, bootstrap, control,
                                     topic_prefix, kafka_config, schema))
            return
        guard(lambda: _change(cli_error, Kind.QUERY, op, target, name, stream, bootstrap,
                              control, topic_prefix, kafka_config, wait, timeout, no_check,
                              as_json, schema))

    # Deliberately like query() above: each typer command declares its own options (the shared
    # ones are Annotated aliases)
    @app.command()
    def stream(
        op: Annotated[Op, typer.Argument(help="add FILE / update FILE: a stream schema "
                                         "(JSON, as schemas/*.json); remove NAME; list.")],
        target: Annotated[str | None, typer.Argument(help="A schema file (add, update) or a "
                                                     "stream name (remove).")] = None,
        stream: Stream = None,
        bootstrap: Bootstrap = "127.0.0.1:9092",
        control: Control = "",
        topic_prefix: TopicPrefix = "",
        kafka_config: KafkaConfig = None,
        wait: Wait = True,
        timeout: Timeout = 30,
        no_check: NoCheck = False,
        as_json: AsJson = False,
        schema: SchemaPaths = None,
        from_jsonschema: Annotated[Path | None, typer.Option(
            "--from-jsonschema", metavar="FILE", help="add/update: the stream from the JSON "
            "Schema (draft 2020-12) of one event, as `cep schema import` maps it (its "
            "title names the stream unless --name).")] = None,
        name: Annotated[str | None, typer.Option(metavar="NAME", help="--from-jsonschema: "
                                                 "the stream's name.")] = None,
        time: Annotated[str | None, typer.Option(metavar="ATTR", help="--from-jsonschema: "
                                                 "the time attribute.")] = None,
        time_unit: Annotated[str, typer.Option(metavar="UNIT", help="--from-jsonschema: "
                                               "unit of an integer time.")] = "ms",
        type_attribute: Annotated[str | None, typer.Option(
            metavar="ATTR", help="--from-jsonschema: the event-type attribute.")] = None,
        skip_optional: Annotated[bool, typer.Option(
            "--skip-optional", help="--from-jsonschema: leave out properties not in "
            "required.")] = False,
    ) -> None:
        """Register, change or remove a stream on the control topic (no file on any
        machine, no restart), or list the streams live per service."""
        imported = None
        if from_jsonschema is not None:
            if target is not None:
                raise cli_error("give a schema file or --from-jsonschema FILE, not both", 2)
            target = str(from_jsonschema)
            imported = {"stream": name, "time": time, "time_unit": time_unit,
                        "type_attribute": type_attribute, "skip_optional": skip_optional}
        guard(lambda: _change(cli_error, Kind.STREAM, op, target, None, stream, bootstrap,
                              control, topic_prefix, kafka_config, wait, timeout, no_check,
                              as_json, schema, imported))


def _change(cli_error: CliErrorType, kind: Kind, op: Op, target: str | None,
            only: str | None, stream: str | None, bootstrap: str, control: str,
            topic_prefix: str, kafka_config: Path | None, wait: bool, timeout: float,
            no_check: bool, as_json: bool, schema: list[Path] | None = None,
            json_schema: dict[str, Any] | None = None) -> None:
    if op is Op.diff:  # `cep query diff` never comes here
        raise cli_error(f"cep {kind} diff: only queries are compared (cep query diff)", 2)
    export_schema_paths(schema, cli_error)
    from cep_core.control_message import ControlMessageError
    from cep_core.errors import QueryError, QueryErrors
    from cep_service.stream.control import control_log, publish
    from cep_service.stream.kafka import Topics, ensure_topics

    settings = kafka_settings(bootstrap, kafka_config)
    control_topic = Topics("", control=control, prefix=topic_prefix).control
    if op is Op.list:
        _list(settings, stream, topic_prefix, control_topic, kind, as_json)
        return
    if not target:
        raise cli_error(f"cep {kind} {op.value} needs a "
                        f"{kind + ' name' if op is Op.remove else 'file'}", 2)
    # The file first: a missing or broken one is said without asking the broker.
    text = None if op is Op.remove else _read_file(kind, Path(target), cli_error, json_schema)

    def in_file(said: str, problems: list | None = None, head: str = "") -> str:
        """A refusal of the file's queries located in the file, from its problems."""
        if kind is not Kind.QUERY or not text or not problems:
            return said
        return head + _in_file(problems, target, text)

    records = control_log(settings, control_topic)
    try:
        changes = query_changes(op.value, target if op is Op.remove else None, text,
                                target or "", only, records, no_check) \
            if kind is Kind.QUERY else _stream_changes(op, target, text, records, no_check)
    except ControlMessageError as e:
        raise cli_error(in_file(str(e), e.problems)) from None
    except (QueryError, QueryErrors) as e:  # --no-check: located in the file already
        raise cli_error(str(e)) from None
    if kind is Kind.QUERY and op is not Op.remove and not changes:
        raise cli_error(f"{target}: no query {only!r}" if only else f"{target}: no queries")
    ensure_topics(settings, {control_topic: 1}, compacted=(control_topic,))
    sent = []
    for message, key, stream_of in changes:
        offset = publish(settings, control_topic, message, key)
        print(f"{kind} {message.name}: {message.op} sent to {control_topic} at offset "
              f"{offset}", file=sys.stderr)
        sent.append(({"key": key.decode(), "offset": offset}, message,
                     stream_of or stream or DEFAULT_STREAM))
    if wait:
        code = _wait(settings, sent, topic_prefix, control_topic, timeout, in_file)
        if code:
            raise typer.Exit(code)


def _read_file(kind: Kind, path: Path, cli_error: CliErrorType,
               json_schema: dict[str, Any] | None = None) -> str:
    """The text an add or update publishes: a query file's, or a stream schema's JSON (made
    from a JSON Schema with --from-jsonschema); a file that is not JSON is refused with
    file:line:col."""
    from cep_core.control_message import ControlMessageError
    from cep_core.schema import SchemaJSONError

    if not path.is_file():
        raise cli_error(f"{path}: no such file", 2)
    text = path.read_text()
    if kind is Kind.QUERY:
        return text
    try:
        document = orjson.loads(text)
        if json_schema is not None:  # --from-jsonschema: a JSON Schema of one event
            text = stream_text_from_json_schema(document, **json_schema)
            document = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise cli_error(SchemaJSONError(path, e).located()) from None
    except ControlMessageError as e:
        raise cli_error(str(e)) from None
    if not isinstance(document, dict) or "stream" not in document:
        raise cli_error(f"{path}: not a stream schema (JSON with a \"stream\" name)")
    return text


def _stream_changes(op: Op, target: str, text: str | None, records: Records,
                    no_check: bool) -> list:
    if op is Op.remove:
        return stream_changes(op.value, target, None, records, no_check)
    assert text is not None  # _read_file's for every op but remove
    return stream_changes(op.value, orjson.loads(text)["stream"], text, records, no_check)


def _in_file(problems: list, path: str, text: str) -> str:
    """A refusal's problems (cep_core.errors.Problem: their query, line and column are
    fields, never read back out of a message) as lines: each on a query the file holds
    located in the file instead, `path:line:col` with the line counted in the file (a
    query's text is the file's from the query's first line, split_query_file) and the
    file's line with a caret under it; each on another query located in that query's text
    (`<query NAME>:line:col`), as the checker says it; the others as they are."""
    from cep_core import ast
    from cep_core.errors import QueryError
    from cep_core.parser import parse

    try:
        starts = {q.name: q.pos for q in parse(text, path).queries}
    except QueryError:
        starts = {}
    out: list[str] = []
    for problem in problems:
        if problem.query is None or problem.line is None:
            out.append(problem.message)
            continue
        line, column = problem.line, problem.column or 1
        start = starts.get(problem.query)
        if start is None:  # another query's: in its own text
            where = ast.Pos(f"<query {problem.query}>", line, column)
            source = "\n" * (line - 1) + (problem.source_line or "")
            out.append(str(QueryError(problem.message, where, source if problem.source_line
                                      is not None else None)))
            continue
        if line == 1:  # the query's text starts at its QUERY keyword
            column += start.column - 1
        out.append(str(QueryError(problem.message,
                                  ast.Pos(path, start.line + line - 1, column), text)))
    return "\n".join(out)


def _wait(settings: "KafkaSettings", sent: list, prefix: str, control_topic: str,
          timeout: float,
          in_file: Callable[..., str] = lambda said, problems=None, head="": said) -> int:
    """Follow each change on its stream's status topic, print its outcome (a refusal's
    problems `in_file`, under its first line); the exit code."""
    from cep_core.errors import Problem

    found = wait_outcomes(settings, sent, prefix, control_topic, timeout)
    for outcome in found:
        errors = outcome.get("errors") if outcome["outcome"] == Outcome.REFUSED else None
        if errors:
            head = outcome["said"].split("\n", 1)[0] + "\n"
            print(in_file(outcome["said"], [Problem(**e) for e in errors], head))
        else:
            print(outcome["said"])
    return max([EXIT[o["outcome"]] for o in found] + [0])


def _list(settings: "KafkaSettings", stream: str | None, prefix: str, control_topic: str,
          kind: Kind, as_json: bool) -> None:
    """What is live: of `stream`'s pipeline, or (None) of every stream's (`_streams`);
    a note on stderr says where it looked when nothing is."""
    from cep_service.stream.kafka import Topics

    streams = [stream] if stream is not None else _streams(settings, prefix, control_topic)
    views = {s: services_view(settings, Topics(s, prefix=prefix).status) for s in streams}
    if as_json:
        lines = [{"stream": s, "status_topic": Topics(s, prefix=prefix).status,
                  "services": list(view.values())} for s, view in views.items()]
        shown = any(views.values())
    elif kind is Kind.QUERY:
        lines = [{**item, "stream": s} for s, view in views.items()
                 for item in live_items(view, kind)]
        shown = bool(lines)
    else:  # a registered stream is live in every pipeline: one line each, all services
        lines = live_items({service: entry for view in views.values()
                            for service, entry in view.items()}, kind)
        shown = bool(lines)
    for line in lines:
        print(orjson.dumps(line, option=orjson.OPT_NON_STR_KEYS).decode())
    if shown:
        return
    plural = "queries" if kind is Kind.QUERY else "streams"
    if stream is not None:
        note = (f"no live {plural} on stream {stream!r} (status topic "
                f"{Topics(stream, prefix=prefix).status}); --stream NAME (CEP_STREAM) reads "
                "another stream's, no --stream every stream's")
    elif not streams:
        note = (f"no live {plural}: no query or stream on the control topic {control_topic} "
                "and no pipeline's status topic on the broker")
    else:
        note = (f"no live {plural}: no service is up on the status topics of "
                f"{', '.join(streams)}")
    print(note, file=sys.stderr)


def _streams(settings: "KafkaSettings", prefix: str, control_topic: str) -> list[str]:
    """Every stream `list` reads without --stream: those the control topic's queries read,
    those registered on it, and those with a status topic on the broker (a pipeline that
    ran, whatever its queries)."""
    from cep_core.control_message import replayed
    from cep_service.stream.control import control_log
    from cep_service.stream.kafka import Topics

    view = replayed(control_log(settings, control_topic))
    found = {q.checked.schema.stream for q in view.live.values()} | set(view.registry.streams)
    status = re.compile(re.escape(Topics("", prefix=prefix).prefix) + r"cep\.(\w+)\.status")
    for topic in settings.admin().list_topics(timeout=10).topics:
        named = status.fullmatch(topic)
        if named:
            found.add(named[1])
    return sorted(found)
