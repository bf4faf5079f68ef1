"""Control-topic messages: validated against `schemas/control_message.json`, then the query
text is parsed and checked into an AST. Nothing in a message is ever evaluated: the text
only ever reaches the grammar, and engines compile from the checked AST.

    validate(value, key)  ->  ControlMessage (with `.checked` for add/update)
                          or  ControlMessageError saying what is wrong

A null value with a key is a tombstone of the compacted topic: remove that query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import orjson

from cep_core.checker import CheckedQuery, load_query_text
from cep_core.errors import QueryError, QueryErrors
from cep_core.schema import SCHEMA_DIR, SchemaRegistry

MAX_MESSAGE_BYTES = 256 * 1024
SCHEMA_PATH = SCHEMA_DIR / "control_message.json"


class ControlMessageError(ValueError):
    """A control message that is not applied, and why."""


@dataclass(frozen=True)
class ControlMessage:
    op: str
    name: str
    text: str = ""
    checked: CheckedQuery | None = None  # the checked query of an add or update

    def to_json(self) -> bytes:
        return orjson.dumps({"op": self.op, "name": self.name, "text": self.text})


@lru_cache(maxsize=1)
def control_schema() -> dict:
    return orjson.loads(SCHEMA_PATH.read_bytes())


def validate(value: bytes | None, key: bytes | None = None,
             registry: SchemaRegistry | None = None, stream: str | None = None) -> ControlMessage:
    """A control-topic record as a ControlMessage whose query (for add/update) is checked:
    exactly one query, named as the message says, reading `stream` when given."""
    if value is None:
        return ControlMessage("remove", _tombstone_name(key))
    if len(value) > MAX_MESSAGE_BYTES:
        raise ControlMessageError(f"control message of {len(value)} bytes is over the limit "
                                  f"of {MAX_MESSAGE_BYTES} bytes")
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise ControlMessageError(f"control message is not valid JSON: {e}") from None
    problems = schema_violations(control_schema(), data)
    if problems:
        raise ControlMessageError("control message: " + "; ".join(problems))
    if key is not None and key.decode("utf-8", "replace") != data["name"]:
        raise ControlMessageError(f"control message for query {data['name']!r} has the key "
                                  f"{key.decode('utf-8', 'replace')!r}")
    if data["op"] == "remove":
        return ControlMessage("remove", data["name"], data.get("text", ""))
    checked = check_query(data["name"], data["text"], registry, stream)
    return ControlMessage(data["op"], data["name"], data["text"], checked)


def check_query(name: str, text: str, registry: SchemaRegistry | None = None,
                stream: str | None = None) -> CheckedQuery:
    """The one checked query `text` holds, named `name`; ControlMessageError otherwise."""
    try:
        queries = load_query_text(text, registry or SchemaRegistry(), f"<query {name}>")
    except QueryErrors as e:
        raise ControlMessageError("\n".join(str(err) for err in e.errors)) from None
    except QueryError as e:
        raise ControlMessageError(str(e)) from None
    if len(queries) != 1:
        raise ControlMessageError(f"the text of query {name!r} holds {len(queries)} queries, "
                                  "not one")
    if queries[0].name != name:
        raise ControlMessageError(f"the text defines query {queries[0].name!r}, not {name!r}")
    if stream is not None and queries[0].schema.stream != stream:
        raise ControlMessageError(f"query {name!r} reads stream {queries[0].schema.stream!r}, "
                                  f"this pipeline reads {stream!r}")
    return queries[0]


def _tombstone_name(key: bytes | None) -> str:
    if not key:
        raise ControlMessageError("empty control message without a key")
    name = key.decode("utf-8", "replace")
    problems = schema_violations(control_schema()["properties"]["name"], name, "key")
    if problems:
        raise ControlMessageError("control tombstone: " + "; ".join(problems))
    return name


# The JSON Schema keywords the control schema uses, checked without a schema library.
_JSON_TYPES = {"object": dict, "string": str, "array": list, "boolean": bool}


def schema_violations(schema: dict, value, where: str = "message") -> list[str]:
    """What about `value` breaks `schema` (type, enum, required, properties,
    additionalProperties, min/maxLength, pattern, allOf, if/then); [] when nothing."""
    problems: list[str] = []
    kind = schema.get("type")
    if kind is not None and not isinstance(value, _JSON_TYPES[kind]):
        return [f"{where} must be a JSON {kind}, got {_json_type(value)}"]
    if "enum" in schema and value not in schema["enum"]:
        shown = ", ".join(map(str, schema["enum"]))
        problems.append(f"{where} must be one of {shown}, got {_shown(value)}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            problems.append(f"{where} must not be empty" if schema["minLength"] == 1
                            else f"{where} is shorter than {schema['minLength']} characters")
        if len(value) > schema.get("maxLength", len(value)):
            problems.append(f"{where} is longer than {schema['maxLength']} characters "
                            f"({len(value)})")
        elif "pattern" in schema and not re.search(schema["pattern"], value):
            problems.append(f"{where} {_shown(value)} does not match {schema['pattern']}")
    if isinstance(value, dict):
        problems += _object_violations(schema, value, where)
    for part in schema.get("allOf", []):
        problems += schema_violations(part, value, where)
    if "if" in schema and not schema_violations(schema["if"], value, where):
        problems += schema_violations(schema.get("then", {}), value, where)
    return problems


def _object_violations(schema: dict, value: dict, where: str) -> list[str]:
    problems = [f"{where} lacks the field {field!r}" for field in schema.get("required", [])
                if field not in value]
    properties = schema.get("properties", {})
    for field, item in value.items():
        if field in properties:
            problems += schema_violations(properties[field], item, f"field {field!r}")
        elif schema.get("additionalProperties", True) is False:
            problems.append(f"{where} has an unknown field {_shown(field)}")
    return problems


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {dict: "an object", list: "an array", str: "a string"}[type(value)]


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
