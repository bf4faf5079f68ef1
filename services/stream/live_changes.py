"""Live changes shared by `cep query|stream` (services/cli/live.py) and the HTTP API
(services/api/app.py): the control records a change makes, and the outcomes the services
report."""

from __future__ import annotations

# Deferred imports: control messages (jsonschema, lark) and the control topic's reader (Kafka) load
# when a change is made: the CLI imports this module for every command.

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from cep_core.control_ops import Kind, Op, Outcome

if TYPE_CHECKING:
    from cep_core.control_message import ControlMessage
    from cep_service.stream.kafka import KafkaSettings

Records = Sequence[tuple[Any, ...]]  # the control topic's (key, value, ...) records


def _key_for(kind: Kind, name: str, records: Records) -> bytes:
    """`kind/name`, or the bare name where the topic already holds the query so (the old
    key form): a record under a new key would not replace it on the compacted topic."""
    if kind is Kind.QUERY and any(r[0] == name.encode() for r in records):
        return name.encode()
    return f"{kind}/{name}".encode()


def query_changes(op: str, name: str | None, text: str | None, source: str,
                  only: str | None, records: Records, no_check: bool = False) -> list:
    """(message, key, stream) of each change: `remove` of query `name`, or `add`/`update`
    of each query of the query text (only the one named `only`), checked as the splitter
    checks it on the live set the control `records` give (unless `no_check`).
    ControlMessageError (QueryError, QueryErrors with `no_check`) says why not."""
    from cep_core.control_message import (ControlMessage, ControlMessageError, check_query,
                                          replayed)
    from cep_core.parser import parse
    from cep_service.stream.control import split_query_file

    view = replayed(records)  # every stream's queries, as the topic gives them
    change = Op(op)
    if change is Op.REMOVE:
        if name is None:
            raise ControlMessageError("a query to remove needs its name")
        live = view.live.get(name)
        message = ControlMessage(Op.REMOVE, name)
        if not no_check:
            view.apply(message)
        return [(message, _key_for(Kind.QUERY, name, records),
                 live.checked.schema.stream if live is not None else None)]
    if text is None:
        raise ControlMessageError(f"a query {change.value} needs the query text")
    out = []
    for query_name, query_text in split_query_file(text, source):
        if only is not None and query_name != only:
            continue
        message = ControlMessage(change, query_name, query_text)
        if no_check:
            stream_of = parse(query_text, source).queries[0].stream
        else:  # the splitter's refusals, on the topic's live set: a refused record would
            # replace the one it was meant to change on the compacted topic
            checked = check_query(query_name, query_text, view.registry)
            message = ControlMessage(change, query_name, query_text, checked)
            view.apply(message)
            stream_of = checked.schema.stream
        out.append((message, _key_for(Kind.QUERY, query_name, records), stream_of))
    return out


def stream_text_from_json_schema(document: Any, stream: str | None = None,
                                 **options: Any) -> str:
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


def stream_changes(op: str, name: str, text: str | None, records: Records,
                   no_check: bool = False) -> list:
    """[(message, key, stream)] of a change of stream `name` (`text`: its schema as JSON),
    refused as a splitter would refuse it on the topic's live queries (unless
    `no_check`): ControlMessageError says why."""
    from cep_core.control_message import (ControlMessage, ControlMessageError, check_stream,
                                          replayed)

    change = Op(op)
    if change is Op.REMOVE:
        message = ControlMessage(Op.REMOVE, name, kind=Kind.STREAM)
    elif text is None:
        raise ControlMessageError(f"a stream {change.value} needs the schema")
    else:
        message = ControlMessage(change, name, text, check_stream(name, text), Kind.STREAM)
    if not no_check:  # the same refusals as a splitter's, on the topic's live queries
        replayed(records).apply(message)
    return [(message, _key_for(Kind.STREAM, message.name, records), message.name)]


EXIT = {Outcome.APPLIED: 0, Outcome.QUEUED: 0, Outcome.REFUSED: 1, Outcome.TIMED_OUT: 2}


def wait_outcomes(settings: KafkaSettings, sent: list, prefix: str, control_topic: str,
                  timeout: float) -> list[dict]:
    """The outcome of each sent change ((change, message, stream) as `_change` sends
    them), followed on its stream's status topic: `applied` (the splitter applied it and
    the coordinator saw it in every keyed partition), `refused` (with the splitter's
    `reason`), `queued` (no pipeline of that stream is up) or `timed_out` (with who did
    not report, `missing`); `said` is the line the CLI prints."""
    from cep_service.stream.control import StatusReader, outcomes_of, services_up, settled
    from cep_service.stream.kafka import Topics
    from cep_service.stream.status import Role

    out = []
    deadline = time.monotonic() + timeout
    for stream in dict.fromkeys(s for _, _, s in sent):
        reader = StatusReader(settings, Topics(stream, prefix=prefix).status)
        try:
            mine = [(c, m) for c, m, s in sent if s == stream]
            if not any(e["role"] == Role.SPLITTER
                       for e in services_up(reader.read_existing()).values()):
                for change, message in mine:
                    out.append(_outcome(message, change, Outcome.QUEUED, said=(
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
                out.append(_outcome(message, change, Outcome.TIMED_OUT, missing=missing, said=(
                    f"{message.kind} {message.name}: no outcome from the "
                    f"{' and the '.join(missing)} of {stream!r} after {timeout:g} s")))
        finally:
            reader.close()
    return out


def _outcome(message: ControlMessage, change: dict, outcome: Outcome, **fields: Any) -> dict:
    return {"kind": message.kind, "name": message.name, "op": message.op, **change,
            "outcome": outcome, **fields}


def _settled(message: ControlMessage, change: dict, found: dict) -> dict:
    splitter, coordinator = found["splitter"], found["coordinator"]
    what = f"{message.kind} {message.name}: {message.op}"
    if splitter["outcome"] == Outcome.REFUSED:
        return _outcome(message, change, Outcome.REFUSED, reason=splitter["reason"],
                        errors=splitter.get("errors"), splitter=splitter["service"],
                        said=f"{what} refused by {splitter['service']}:\n{splitter['reason']}")
    services = sorted({w["service"] for w in found["workers"]})
    workers = ", ".join(services) or \
        ("those of the splitter's start-up set" if splitter.get("starting") else "-")
    latency = coordinator.get("latency_ms")
    said = (f"{what} applied from seq {splitter['at']}: splitter {splitter['service']}, "
            f"workers {workers}, coordinator {coordinator['service']} (all "
            f"{coordinator.get('partitions')} partitions"
            + (f", {latency} ms after the control message)" if latency is not None else ")"))
    return _outcome(message, change, Outcome.APPLIED, at=splitter["at"],
                    splitter=splitter["service"], workers=services,
                    coordinator=coordinator["service"],
                    partitions=coordinator.get("partitions"), latency_ms=latency, said=said)


def services_view(settings: KafkaSettings, status_topic: str) -> dict[str, dict]:
    """The services up on a status topic and what each holds (cep_service.stream.control)."""
    from cep_service.stream.control import StatusReader, services_up

    reader = StatusReader(settings, status_topic)
    try:
        return services_up(reader.read_existing())
    finally:
        reader.close()


def live_items(view: dict[str, dict], kind: Kind) -> list[dict]:
    """One item per live query (`index`) or stream (`version`), with the services that
    are up and hold it, in query order (streams: by name)."""
    from cep_service.stream.status import QueryState

    queries = Kind(kind) is Kind.QUERY
    field = "queries" if queries else "streams"
    merged: dict[str, dict] = {}
    for entry in view.values():
        lives = [entry["live"]] if entry["live"] is not None else []
        lives += [live for _, live in sorted(entry["partitions"].items())]
        for live in lives:
            for name, value in ((live or {}).get(field) or {}).items():
                item = merged.setdefault(name, {"name": name, "index" if queries
                                                else "version": value, "services": []})
                if entry["service"] not in item["services"]:
                    item["services"].append(entry["service"])
    if queries:
        for entry in view.values():
            for name, failure in (entry.get("failed") or {}).items():
                known = merged.get(name)
                if known is not None and "reason" not in known:
                    known.update(state=QueryState.FAILED, reason=failure["reason"],
                                failed_in=entry["service"], partition=failure["partition"])
        for item in merged.values():
            item.setdefault("state", QueryState.LIVE)
    order = "index" if queries else "name"
    return sorted(merged.values(), key=lambda i: i[order])
