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

from __future__ import annotations

import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import orjson
import typer

from services.serve_cli import (
    Bootstrap,
    Control,
    KafkaConfig,
    SchemaPaths,
    Stream,
    TopicPrefix,
    _settings,
    export_schema_paths,
)


class Op(StrEnum):
    add = "add"
    update = "update"
    remove = "remove"
    list = "list"


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
                                         "query file (or only --name); remove NAME; list.")],
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
    ) -> None:
        """Change the queries of the running pipelines (no restart), or list what is live."""
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
    export_schema_paths(schema, cli_error)
    from cep_core.control_message import ControlMessageError
    from cep_core.errors import QueryError, QueryErrors
    from services.control import control_log, publish
    from services.kafka import Topics, ensure_topics

    settings = _settings(bootstrap, kafka_config)
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


def _key_for(kind: str, name: str, records) -> bytes:
    """`kind/name`, or the bare name where the topic already holds the query so (the old
    key form): a record under a new key would not replace it on the compacted topic."""
    if kind == "query" and any(r[0] == name.encode() for r in records):
        return name.encode()
    return f"{kind}/{name}".encode()


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


def query_changes(op: str, name: str | None, text: str, source: str, only: str | None,
                  records, no_check: bool = False) -> list:
    """(message, key, stream) of each change: `remove` of query `name`, or `add`/`update`
    of each query of the query text (only the one named `only`), checked as the splitter
    checks it on the live set the control `records` give (unless `no_check`).
    ControlMessageError (QueryError, QueryErrors with `no_check`) says why not."""
    from cep_core.control_message import ControlMessage, check_query, replayed
    from cep_core.parser import parse
    from services.control import split_query_file

    view = replayed(records)  # every stream's queries, as the topic gives them
    if op == "remove":
        live = view.live.get(name)
        message = ControlMessage("remove", name)
        if not no_check:
            view.apply(message)
        return [(message, _key_for("query", name, records),
                 live.checked.schema.stream if live is not None else None)]
    out = []
    for query_name, query_text in split_query_file(text, source):
        if only is not None and query_name != only:
            continue
        message = ControlMessage(op, query_name, query_text)
        if no_check:
            stream_of = parse(query_text, source).queries[0].stream
        else:  # the splitter's refusals, on the topic's live set: a refused record would
            # replace the one it was meant to change on the compacted topic
            message = ControlMessage(op, query_name, query_text,
                                     check_query(query_name, query_text, view.registry))
            view.apply(message)
            stream_of = message.checked.schema.stream
        out.append((message, _key_for("query", query_name, records), stream_of))
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


def stream_text_from_json_schema(document, stream: str | None = None, **options) -> str:
    """A stream schema's JSON text from the JSON Schema of one event
    (cep_core/schema_import.py); ControlMessageError says why it cannot map."""
    from cep_core.control_message import ControlMessageError
    from cep_core.schema import SchemaError
    from cep_core.schema_import import stream_schema_from_json_schema

    if not isinstance(document, dict):
        raise ControlMessageError("a JSON Schema is a JSON object")
    try:
        schema = stream_schema_from_json_schema(document, stream, **options)
    except SchemaError as e:
        raise ControlMessageError(str(e)) from None
    return orjson.dumps(schema.to_dict()).decode()


def stream_changes(op: str, name: str, text: str | None, records,
                   no_check: bool = False) -> list:
    """[(message, key, stream)] of a change of stream `name` (`text`: its schema as JSON),
    refused as a splitter would refuse it on the topic's live queries (unless
    `no_check`): ControlMessageError says why."""
    from cep_core.control_message import STREAM, ControlMessage, check_stream, replayed

    message = ControlMessage("remove", name, kind=STREAM) if op == "remove" else \
        ControlMessage(op, name, text, check_stream(name, text), STREAM)
    if not no_check:  # the same refusals as a splitter's, on the topic's live queries
        replayed(records).apply(message)
    return [(message, _key_for("stream", message.name, records), message.name)]


def _wait(settings, sent: list, prefix: str, control_topic: str, timeout: float) -> int:
    """Follow each change on its stream's status topic, print its outcome; the exit code."""
    found = wait_outcomes(settings, sent, prefix, control_topic, timeout)
    for outcome in found:
        print(outcome["said"])
    return max([EXIT[o["outcome"]] for o in found] + [0])


EXIT = {"applied": 0, "queued": 0, "refused": 1, "timed_out": 2}


def wait_outcomes(settings, sent: list, prefix: str, control_topic: str,
                  timeout: float) -> list[dict]:
    """The outcome of each sent change ((change, message, stream) as `_change` sends
    them), followed on its stream's status topic: `applied` (the splitter applied it and
    the coordinator saw it in every keyed partition), `refused` (with the splitter's
    `reason`), `queued` (no pipeline of that stream is up) or `timed_out` (with who did
    not report, `missing`); `said` is the line the CLI prints."""
    from services.control import StatusReader, outcomes_of, services_up, settled
    from services.kafka import Topics

    out = []
    deadline = time.monotonic() + timeout
    for stream in dict.fromkeys(s for _, _, s in sent):
        reader = StatusReader(settings, Topics(stream, prefix=prefix).status)
        try:
            mine = [(c, m) for c, m, s in sent if s == stream]
            if not any(e["role"] == "splitter"
                       for e in services_up(reader.read_existing()).values()):
                for change, message in mine:
                    out.append(_outcome(message, change, "queued", said=(
                        f"{message.kind} {message.name}: no {stream!r} pipeline is up; "
                        f"the change waits on {control_topic} for it")))
                continue
            waiting = list(mine)
            while waiting and time.monotonic() < deadline:
                reader.poll(0.2)
                for change, message in list(waiting):
                    found = outcomes_of(reader.records, change)
                    if settled(found):
                        waiting.remove((change, message))
                        out.append(_settled(message, change, found))
            for change, message in waiting:
                found = outcomes_of(reader.records, change)
                missing = [r for r in ("splitter", "coordinator") if found[r] is None]
                out.append(_outcome(message, change, "timed_out", missing=missing, said=(
                    f"{message.kind} {message.name}: no outcome from the "
                    f"{' and the '.join(missing)} of {stream!r} after {timeout:g} s")))
        finally:
            reader.close()
    return out


def _outcome(message, change: dict, outcome: str, **fields) -> dict:
    return {"kind": message.kind, "name": message.name, "op": message.op, **change,
            "outcome": outcome, **fields}


def _settled(message, change: dict, found: dict) -> dict:
    splitter, coordinator = found["splitter"], found["coordinator"]
    what = f"{message.kind} {message.name}: {message.op}"
    if splitter["outcome"] == "refused":
        return _outcome(message, change, "refused", reason=splitter["reason"],
                        splitter=splitter["service"],
                        said=f"{what} refused by {splitter['service']}:\n{splitter['reason']}")
    services = sorted({w["service"] for w in found["workers"]})
    workers = ", ".join(services) or \
        ("those of the splitter's start-up set" if splitter.get("starting") else "-")
    latency = coordinator.get("latency_ms")
    said = (f"{what} applied from seq {splitter['at']}: splitter {splitter['service']}, "
            f"workers {workers}, coordinator {coordinator['service']} (all "
            f"{coordinator.get('partitions')} partitions"
            + (f", {latency} ms after the control message)" if latency is not None else ")"))
    return _outcome(message, change, "applied", at=splitter["at"],
                    splitter=splitter["service"], workers=services,
                    coordinator=coordinator["service"],
                    partitions=coordinator.get("partitions"), latency_ms=latency, said=said)


def _list(settings, status_topic: str, kind: str, as_json: bool) -> None:
    view = services_view(settings, status_topic)
    if as_json:
        print(orjson.dumps({"status_topic": status_topic, "services": list(view.values())},
                           option=orjson.OPT_NON_STR_KEYS).decode())
        return
    for item in live_items(view, kind):
        print(orjson.dumps(item).decode())


def services_view(settings, status_topic: str) -> dict[str, dict]:
    """The services up on a status topic and what each holds (services.control)."""
    from services.control import StatusReader, services_up

    reader = StatusReader(settings, status_topic)
    try:
        return services_up(reader.read_existing())
    finally:
        reader.close()


def live_items(view: dict[str, dict], kind: str) -> list[dict]:
    """One item per live query (`index`) or stream (`version`), with the services that
    are up and hold it, in query order (streams: by name)."""
    field = "queries" if kind == "query" else "streams"
    merged: dict[str, dict] = {}
    for entry in view.values():
        lives = [entry["live"]] if entry["live"] is not None else []
        lives += [live for _, live in sorted(entry["partitions"].items())]
        for live in lives:
            for name, value in ((live or {}).get(field) or {}).items():
                item = merged.setdefault(name, {"name": name, "index" if kind == "query"
                                                else "version": value, "services": []})
                if entry["service"] not in item["services"]:
                    item["services"].append(entry["service"])
    order = "index" if kind == "query" else "name"
    return sorted(merged.values(), key=lambda i: i[order])
