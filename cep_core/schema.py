"""Stream schemas: attribute names and types, the event-time attribute, the type attribute.

Schemas are JSON files (`<stream>.json`); the built-in ones ship inside the package
(`cep_core/schemas/`, also reachable as the top-level `schemas/` of a checkout):

    {"stream": "trades",
     "attributes": {"symbol": "string", "price": "int", "volume": "int",
                    "ts": "timestamp", "seqNum": "int"},
     "time": "ts", "time_unit": "ms", "type_attribute": null, "types": null}

A registry looks streams up in: schemas added to it, the paths of `CEP_SCHEMA_PATH`
(os.pathsep-separated files or directories, first wins), then the built-in folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import orjson

ATTRIBUTE_TYPES = ("int", "float", "string", "bool", "timestamp")
# The one table of stream time units: nanoseconds per unit. "ticks" have no wall-clock
# length (a duration in ms is taken as that many ticks where one must be converted).
NANOS_PER_UNIT = {"ms": 1_000_000, "s": 1_000_000_000, "us": 1_000, "ns": 1}
TIME_UNITS = (*NANOS_PER_UNIT, "ticks")
SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"  # built-in schemas (package data)
SCHEMA_PATH_ENV = "CEP_SCHEMA_PATH"
# Files in the schema folders that describe messages, not event streams.
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


class SchemaJSONError(SchemaError):
    """A schema file that is not valid JSON (cut short, a stray comma): where and why, as
    `file:line:col: not valid JSON: why`; `located()` is the same as a located error line
    (`file:line:col: error: ...`, cep_core/errors.py)."""

    def __init__(self, path: str | Path, error: ValueError):
        self.path = str(path)
        self.line = getattr(error, "lineno", 1)
        self.column = getattr(error, "colno", 1)
        self.reason = getattr(error, "msg", str(error))
        super().__init__(f"{self.path}:{self.line}:{self.column}: not valid JSON: "
                         f"{self.reason}")

    def located(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: error: not valid JSON: {self.reason}"


def load_schema_file(path: str | Path) -> StreamSchema:
    try:
        return StreamSchema.from_dict(orjson.loads(Path(path).read_bytes()))
    except orjson.JSONDecodeError as e:
        raise SchemaJSONError(path, e) from None


def env_schema_paths() -> list[Path]:
    """The files and directories named by CEP_SCHEMA_PATH (os.pathsep-separated)."""
    return [Path(p) for p in os.environ.get(SCHEMA_PATH_ENV, "").split(os.pathsep) if p]


class SchemaRegistry:
    """Looks streams up by name: explicitly added schemas first, then the search path
    (`directories`: folders of `<stream>.json` files, and single schema files), in order.

    Without `directories`: the paths of CEP_SCHEMA_PATH, then the built-in SCHEMA_DIR.
    `add_path` puts a file or folder in front. `origin(stream)` says where a stream's
    schema came from."""

    def __init__(self, directories: list[Path] | None = None):
        self._schemas: dict[str, StreamSchema] = {}
        self._origins: dict[str, str] = {}
        self._files: dict[Path, StreamSchema] = {}  # schema files on the search path
        if directories is not None:
            self.directories = list(directories)
            return
        self.directories = [SCHEMA_DIR]
        for path in reversed(env_schema_paths()):  # add_path puts each in front
            if not path.exists():
                raise SchemaError(f"{SCHEMA_PATH_ENV}: {path}: no such file or directory")
            self.add_path(path)

    def add(self, schema: StreamSchema, origin: str = "added") -> None:
        self._schemas[schema.stream] = schema
        self._origins[schema.stream] = origin

    def add_path(self, path: str | Path) -> None:
        """A schema file, or a directory searched for `<stream>.json`, in front of the
        search path (a file is read now, so a bad one is an error here)."""
        path = Path(path)
        if not path.is_dir():
            self._files[path] = load_schema_file(path)
        self.directories.insert(0, path)

    def get(self, stream: str) -> StreamSchema | None:
        if stream not in self._schemas:
            for entry in self.directories:
                if entry in self._files:
                    if self._files[entry].stream == stream:
                        self.add(self._files[entry], str(entry))
                        break
                    continue
                candidate = entry / f"{stream}.json"
                if candidate.is_file():
                    schema = load_schema_file(candidate)
                    if schema.stream != stream:
                        raise SchemaError(f"{candidate} describes stream {schema.stream!r}, "
                                          f"not {stream!r}")
                    self.add(schema, str(candidate))
                    break
        return self._schemas.get(stream)

    def origin(self, stream: str) -> str | None:
        """The file a stream's schema was read from ("added" when given as an object), or
        None for an unknown stream."""
        return self._origins.get(stream) if self.get(stream) is not None else None

    def names(self) -> list[str]:
        found = set(self._schemas)
        for entry in self.directories:
            if entry in self._files:
                found.add(self._files[entry].stream)
            else:
                found.update(p.stem for p in entry.glob("*.json")
                             if p.stem not in NOT_STREAMS)
        return sorted(found)
