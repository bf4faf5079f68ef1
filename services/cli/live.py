"""`cep query` and `cep stream`: change what is live in the running pipelines, and see it.

A change is checked here first (by cep_core/control_message.py, against the schemas this
machine has plus the control topic's streams, and refused as a splitter would refuse it on
the live set the topic gives), written to the control topic, and then,
unless `--no-wait`, followed on the stream's status topic until the splitter refused it
(exit 1, with its reason) or applied it and the coordinator saw it in every keyed
partition (exit 0); nothing within `--timeout` exits 2. With no pipeline of that stream
up, the change waits on the control topic for one to start (exit 0). `list` reads the
status topic: one JSON line per live query (stream) with the services that are up and
hold it; `--json`, one object with each service's live set (workers: per partition).
"""


# Deferred imports: control messages (jsonschema, lark) and Kafka load when `cep query` or `cep
# stream` changes something, not for every `cep` command that registers them.

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import orjson
import typer

from services.cli.common import (
    Bootstrap,
    Control,
    KafkaConfig,
    SchemaPaths,
    Stream,
    TopicPrefix,
    export_schema_paths,
    kafka_settings,
)
from services.cli.query_diff import DiffEvents, DiffOld, query_diff
from services.stream.live_changes import (
    EXIT,
    live_items,
    query_changes,
    services_view,
    stream_changes,
    stream_text_from_json_schema,
    wait_outcomes,
)


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
AsJson = Annotated[bool, typer.Option("--json", help="list: one JSON object.")]


def register(app: typer.Typer, guard, cli_error) -> None:

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
        stream: Stream = "trades",
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
        guard(lambda: _change(cli_error, "query", op, target, name, stream, bootstrap,
                              control, topic_prefix, kafka_config, wait, timeout, no_check,
                              as_json, schema))

    @app.command()
    def stream(
        op: Annotated[Op, typer.Argument(help="add FILE / update FILE: a stream schema "
                                         "(JSON, as schemas/*.json); remove NAME; list.")],
        target: Annotated[str | None, typer.Argument(help="A schema file (add, update) or a "
                                                     "stream name (remove).")] = None,
        stream: Stream = "trades",
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
        guard(lambda: _change(cli_error, "stream", op, target, None, stream, bootstrap,
                              control, topic_prefix, kafka_config, wait, timeout, no_check,
                              as_json, schema, imported))


def _change(cli_error, kind, op, target, only, stream, bootstrap, control, topic_prefix,
            kafka_config, wait, timeout, no_check, as_json, schema=None,
            json_schema=None) -> None:
    if op is Op.diff:  # `cep query diff` never comes here
        raise cli_error(f"cep {kind} diff: only queries are compared (cep query diff)", 2)
    export_schema_paths(schema, cli_error)
    from cep_core.control_message import ControlMessageError
    from cep_core.errors import QueryError, QueryErrors
    from services.stream.control import control_log, publish
    from services.stream.kafka import Topics, ensure_topics

    settings = kafka_settings(bootstrap, kafka_config)
    control_topic = Topics("", control=control, prefix=topic_prefix).control
    if op is Op.list:
        _list(settings, Topics(stream, prefix=topic_prefix).status, kind, as_json)
        return
    if not target:
        raise cli_error(f"cep {kind} {op.value} needs a "
                        f"{kind + ' name' if op is Op.remove else 'file'}", 2)
    records = control_log(settings, control_topic)
    try:
        changes = _query_changes(op, target, only, records, no_check, cli_error) \
            if kind == "query" else _stream_changes(op, target, records, no_check, cli_error,
                                                   json_schema)
    except (ControlMessageError, QueryError, QueryErrors) as e:  # QueryError: --no-check
        raise cli_error(str(e)) from None
    ensure_topics(settings, {control_topic: 1}, compacted=(control_topic,))
    sent = []
    for message, key, stream_of in changes:
        offset = publish(settings, control_topic, message, key)
        print(f"{kind} {message.name}: {message.op} sent to {control_topic} at offset "
              f"{offset}", file=sys.stderr)
        sent.append(({"key": key.decode(), "offset": offset}, message, stream_of or stream))
    if wait:
        code = _wait(settings, sent, topic_prefix, control_topic, timeout)
        if code:
            raise typer.Exit(code)


def _query_changes(op, target, only, records, no_check, cli_error) -> list:
    if op is Op.remove:
        return query_changes(op.value, target, None, "", None, records, no_check)
    path = Path(target)
    if not path.is_file():
        raise cli_error(f"{path}: no such file", 2)
    out = query_changes(op.value, None, path.read_text(), str(path), only, records, no_check)
    if not out:
        raise cli_error(f"{path}: no query {only!r}" if only else f"{path}: no queries")
    return out


def _stream_changes(op, target, records, no_check, cli_error, json_schema=None) -> list:
    if op is Op.remove:
        return stream_changes(op.value, target, None, records, no_check)
    path = Path(target)
    if not path.is_file():
        raise cli_error(f"{path}: no such file", 2)
    text = path.read_text()
    if json_schema is not None:  # --from-jsonschema: a JSON Schema of one event
        try:
            text = stream_text_from_json_schema(orjson.loads(text), **json_schema)
        except orjson.JSONDecodeError as e:
            raise cli_error(f"{path}: not JSON: {e}") from None
    try:
        name = orjson.loads(text)["stream"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise cli_error(f"{path}: not a stream schema (JSON with a \"stream\" name)") \
            from None
    return stream_changes(op.value, name, text, records, no_check)


def _wait(settings, sent: list, prefix: str, control_topic: str, timeout: float) -> int:
    """Follow each change on its stream's status topic, print its outcome; the exit code."""
    found = wait_outcomes(settings, sent, prefix, control_topic, timeout)
    for outcome in found:
        print(outcome["said"])
    return max([EXIT[o["outcome"]] for o in found] + [0])


def _list(settings, status_topic: str, kind: str, as_json: bool) -> None:
    view = services_view(settings, status_topic)
    if as_json:
        print(orjson.dumps({"status_topic": status_topic, "services": list(view.values())},
                           option=orjson.OPT_NON_STR_KEYS).decode())
        return
    for item in live_items(view, kind):
        print(orjson.dumps(item).decode())


