"""A stream schema from the JSON Schema (draft 2020-12) of one event.

The event must be an object of flat, typed properties:

| JSON Schema property | stream attribute |
| --- | --- |
| `"type": "integer"` | `int` |
| `"type": "number"` | `float` |
| `"type": "string"` (or an `enum` of strings) | `string` |
| `"type": "string", "format": "date-time"` | `timestamp` |
| `"type": "boolean"` | `bool` |

The time attribute is `time` when given, else the one `date-time` property; an integer
time property becomes a `timestamp` counted in `time_unit`. Every attribute must be in
`required` (an event lacking one is a dead letter); `skip_optional` leaves the others out.
Nested objects, arrays, unions (a list of types, `anyOf`, `oneOf`, `allOf`), `$ref` and
untyped properties cannot map: SchemaImportError names each such property and why.
"""

from __future__ import annotations

# Deferred imports: jsonschema loads only when a JSON Schema is imported, not with
# every command that reads stream schemas.

import re
from typing import Any

from cep_core.schema import AttrType, SchemaError, StreamSchema

SIMPLE_TYPES = {"integer": "int", "number": "float", "string": "string", "boolean": "bool"}
COMBINERS = ("anyOf", "oneOf", "allOf", "not", "if", "$ref", "$dynamicRef")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")


class SchemaImportError(SchemaError):
    pass


def stream_schema_from_json_schema(document: dict[str, Any], stream: str | None = None,
                                   time: str | None = None, time_unit: str = "ms",
                                   type_attribute: str | None = None,
                                   skip_optional: bool = False) -> StreamSchema:
    """The StreamSchema of events described by `document` (a JSON Schema, as parsed JSON).

    `stream` defaults to the document's `title`. SchemaImportError lists every property
    that cannot map, or says what else is wrong (not an object, no time attribute)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError as InvalidJsonSchema

    if not isinstance(document, dict):
        raise SchemaImportError("a JSON Schema of an event is a JSON object")
    try:
        Draft202012Validator.check_schema(document)
    except InvalidJsonSchema as e:
        raise SchemaImportError(f"not a valid JSON Schema (draft 2020-12): {e.message}") \
            from None
    if document.get("type") != "object" or not isinstance(document.get("properties"), dict):
        raise SchemaImportError('the event must be "type": "object" with "properties"')
    name = stream or document.get("title")
    if not isinstance(name, str) or not IDENTIFIER.match(name):
        raise SchemaImportError(f"stream name {name!r} is not an identifier: name the stream "
                                "(a title in the JSON Schema, or the stream argument)")
    required = set(document.get("required", []))
    attributes: dict[str, AttrType] = {}
    problems: list[str] = []
    date_times: list[str] = []
    for prop, spec in document["properties"].items():
        if not IDENTIFIER.match(prop):
            problems.append(f"{prop}: not an identifier, so no query could name it")
            continue
        if prop not in required and prop != time:
            if not skip_optional:
                problems.append(f"{prop}: not in required (every attribute must be in every "
                                "event; add it to required, or skip optional properties)")
            continue
        kind = _attribute_type(spec)
        if kind.startswith("!"):
            problems.append(f"{prop}: {kind[1:]}")
            continue
        attributes[prop] = AttrType(kind)
        if attributes[prop] is AttrType.TIMESTAMP:
            date_times.append(prop)
    if problems:
        raise SchemaImportError("properties that cannot map to stream attributes:\n  "
                                + "\n  ".join(problems))
    time = time or _time_attribute(date_times, attributes)
    if time not in attributes:
        raise SchemaImportError(f"time attribute {time!r} is not a property of the event")
    if attributes[time] is AttrType.INT:
        attributes[time] = AttrType.TIMESTAMP  # numbers counted in time_unit since the epoch
    types = None
    if type_attribute is not None:
        enum = document["properties"].get(type_attribute, {}).get("enum")
        types = tuple(enum) if enum else None
    try:
        return StreamSchema(name, attributes, time, time_unit, type_attribute, types)
    except SchemaError as e:
        raise SchemaImportError(str(e)) from None


def _attribute_type(spec: object) -> str:
    """The attribute type of a property's schema, or `!why` when it cannot map."""
    if not isinstance(spec, dict):
        return "!a property schema must be an object"
    combined = [k for k in COMBINERS if k in spec]
    if combined:
        return f"!{combined[0]} (unions and references cannot map to one attribute type)"
    kind = spec.get("type")
    if kind is None and isinstance(spec.get("enum"), list) and spec["enum"] and \
            all(isinstance(v, str) for v in spec["enum"]):
        kind = "string"
    if isinstance(kind, list):
        return f"!a union of types {kind} (an attribute has one type; null is not allowed)"
    if kind == "object":
        return "!a nested object (flatten it: one attribute per field)"
    if kind == "array":
        return "!an array (attributes are single values)"
    if kind == "null":
        return "!type null"
    if kind not in SIMPLE_TYPES:
        return "!no type (give it one of integer, number, string, boolean)"
    if kind == "string" and spec.get("format") == "date-time":
        return "timestamp"
    return SIMPLE_TYPES[kind]


def _time_attribute(date_times: list[str], attributes: dict[str, AttrType]) -> str:
    if len(date_times) == 1:
        return date_times[0]
    ints = [a for a, k in attributes.items() if k is AttrType.INT]
    if date_times:
        raise SchemaImportError(f"several date-time properties ({', '.join(date_times)}): "
                                "name the time attribute")
    raise SchemaImportError("no date-time property: name the time attribute (a date-time "
                            "or integer property" + (f", e.g. one of {', '.join(ints)})"
                                                     if ints else ")"))
