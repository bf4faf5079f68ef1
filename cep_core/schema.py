"""Stream schemas: attribute names and types, the event-time attribute, the type attribute.

Schemas are JSON files (`schemas/<stream>.json`):

    {"stream": "trades",
     "attributes": {"symbol": "string", "price": "int", "volume": "int",
                    "ts": "timestamp", "seqNum": "int"},
     "time": "ts", "time_unit": "ms", "type_attribute": null, "types": null}
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

ATTRIBUTE_TYPES = ("int", "float", "string", "bool", "timestamp")
# The one table of stream time units: nanoseconds per unit. "ticks" have no wall-clock
# length (a duration in ms is taken as that many ticks where one must be converted).
NANOS_PER_UNIT = {"ms": 1_000_000, "s": 1_000_000_000, "us": 1_000, "ns": 1}
TIME_UNITS = (*NANOS_PER_UNIT, "ticks")
SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
# Files in schemas/ that describe messages, not event streams.
NOT_STREAMS = ("composite_event", "control_message")


class SchemaError(ValueError):
    pass


def units_per_ms(time_unit: str) -> float:
    """How many of a stream's time units make a millisecond (ticks: one)."""
    return NANOS_PER_UNIT["ms"] / NANOS_PER_UNIT.get(time_unit, NANOS_PER_UNIT["ms"])


@dataclass(frozen=True)
class StreamSchema:
    stream: str
    attributes: dict[str, str]
    time: str
    time_unit: str = "ms"
    type_attribute: str | None = None
    types: tuple[str, ...] | None = None  # the values the type attribute may take, if known

    def __post_init__(self):
        for name, kind in self.attributes.items():
            if kind not in ATTRIBUTE_TYPES:
                raise SchemaError(f"stream {self.stream}: attribute {name} has unknown type "
                                  f"{kind!r} (one of {', '.join(ATTRIBUTE_TYPES)})")
        if self.attributes.get(self.time) not in ("timestamp", "int"):
            raise SchemaError(f"stream {self.stream}: time attribute {self.time!r} must be "
                              "an attribute of type timestamp or int")
        if self.time_unit not in TIME_UNITS:
            raise SchemaError(f"stream {self.stream}: time_unit must be one of {TIME_UNITS}")
        if self.type_attribute is not None and \
                self.attributes.get(self.type_attribute) != "string":
            raise SchemaError(f"stream {self.stream}: type attribute {self.type_attribute!r} "
                              "must be a string attribute")

    @classmethod
    def from_dict(cls, data: dict) -> StreamSchema:
        try:
            types = data.get("types")
            return cls(stream=data["stream"], attributes=dict(data["attributes"]),
                       time=data["time"], time_unit=data.get("time_unit", "ms"),
                       type_attribute=data.get("type_attribute"),
                       types=tuple(types) if types is not None else None)
        except KeyError as e:
            raise SchemaError(f"schema lacks the field {e.args[0]!r}") from None

    def to_dict(self) -> dict:
        return {"stream": self.stream, "attributes": self.attributes, "time": self.time,
                "time_unit": self.time_unit, "type_attribute": self.type_attribute,
                "types": list(self.types) if self.types is not None else None}


def load_schema_file(path: str | Path) -> StreamSchema:
    try:
        return StreamSchema.from_dict(orjson.loads(Path(path).read_bytes()))
    except orjson.JSONDecodeError as e:
        raise SchemaError(f"{path}: not valid JSON: {e}") from None


class SchemaRegistry:
    """Looks streams up by name: explicitly added schemas first, then the search directories."""

    def __init__(self, directories: list[Path] | None = None):
        self.directories = list(directories) if directories is not None else [SCHEMA_DIR]
        self._schemas: dict[str, StreamSchema] = {}

    def add(self, schema: StreamSchema) -> None:
        self._schemas[schema.stream] = schema

    def add_path(self, path: str | Path) -> None:
        """A schema file, or a directory searched for `<stream>.json`."""
        path = Path(path)
        if path.is_dir():
            self.directories.insert(0, path)
        else:
            self.add(load_schema_file(path))

    def get(self, stream: str) -> StreamSchema | None:
        if stream not in self._schemas:
            for directory in self.directories:
                candidate = directory / f"{stream}.json"
                if candidate.is_file():
                    schema = load_schema_file(candidate)
                    if schema.stream != stream:
                        raise SchemaError(f"{candidate} describes stream {schema.stream!r}, "
                                          f"not {stream!r}")
                    self._schemas[stream] = schema
                    break
        return self._schemas.get(stream)

    def names(self) -> list[str]:
        found = set(self._schemas)
        for directory in self.directories:
            found.update(p.stem for p in directory.glob("*.json")
                         if p.stem not in NOT_STREAMS)
        return sorted(found)
