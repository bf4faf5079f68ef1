"""What the API's checking threads run (CPU work, off the event loop): a query text's
problems and checked queries, a stream schema's text and name from a request's body, and
what `cep explain` says of a live query. Refusals are located problems
(cep_core/errors.py), never parsed back out of a message."""

from __future__ import annotations

from typing import Any

import orjson

from cep_core.checker import load_query_text
from cep_core.control_message import ControlMessageError, check_stream
from cep_core.control_ops import Outcome
from cep_core.errors import Category, QueryError, QueryErrors
from cep_core.explain import explain
from cep_service.api.errors import Refused, invalid, problem, problems
from cep_service.stream.live_changes import stream_text_from_json_schema


def query_problems(text: str, registry: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """(errors, checked queries) of a query text, checked against `registry`."""
    try:
        return [], load_query_text(text, registry, "<query>")
    except (QueryErrors, QueryError) as e:
        return [err.with_source(text).problem().to_json() for err in e.errors], []


def stream_text(data: dict[str, Any], name: str | None = None) -> str:
    """A stream schema's JSON text from `schema` (as schemas/*.json) or `json_schema` (a
    JSON Schema of one event, with optional `time`, `time_unit`, `type_attribute`,
    `skip_optional`): the fields of a StreamCheck body given."""
    if "schema" in data:
        return orjson.dumps(data["schema"]).decode()
    options = {k: data[k] for k in ("time", "time_unit", "type_attribute", "skip_optional")
               if k in data}
    try:
        return stream_text_from_json_schema(data["json_schema"], name or data.get("name"),
                                            **options)
    except ControlMessageError as e:
        raise Refused(e.category, invalid(e)[1]) from None


def stream_name(text: str) -> str:
    try:
        name = orjson.loads(text).get("stream")
    except AttributeError:
        name = None
    if not isinstance(name, str):
        raise Refused(Category.INVALID, {
            "outcome": Outcome.INVALID, "changes": [], "errors": problem(
            'a stream schema names its stream ("stream")')})
    return name


def checked_stream(data: dict[str, Any]) -> dict[str, Any]:
    """The answer of /api/streams/validate (a checking thread's work)."""
    try:
        text = stream_text(data)
        name = stream_name(text)
    except Refused as e:
        return {"ok": False, "errors": e.body["errors"]}
    try:
        schema = check_stream(name, text)
    except ControlMessageError as e:
        return {"ok": False, "errors": problems(e)}
    return {"ok": True, "errors": [], "schema": schema.to_dict()}


def stream_named(data: dict[str, Any], name: str | None) -> tuple[str, str]:
    """(name, schema text) of a stream change's body (a checking thread's work)."""
    text = stream_text(data, name)
    given = stream_name(text)
    if name is not None and given != name:
        raise Refused(Category.INVALID, {
            "outcome": Outcome.INVALID, "changes": [], "errors": problem(
            f"the schema describes stream {given!r}, not {name!r}")})
    return given, text


def explained(query: Any) -> dict[str, Any]:
    """What `cep explain` says of a live query (a checking thread's work: CPU, and
    Graphviz's dot in a child process)."""
    found = explain(query.checked)
    try:
        svg = found.svg()
    except RuntimeError:
        svg = None
    return {**found.to_json(), "text": found.text(), "dot": found.dot(), "svg": svg}
