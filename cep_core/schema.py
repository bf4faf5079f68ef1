"""Stream schemas: attribute names and types, the event-time attribute, the type attribute.

Schemas are JSON files (`<stream>.json`); the built-in ones ship inside the package
(`cep_core/schemas/`, also reachable as the top-level `schemas/` of a checkout):

    {"stream": "trades",
     "attributes": {"symbol": "string", "price": "int", "volume": "int",
                    "ts": "timestamp", "seqNum": "int"},
     "time": "ts", "time_unit": "ms", "type_attribute": null, "types": null}

A registry looks streams up in: schemas added to it, the paths of `CEP_SCHEMA_PATH`
(os.pathsep-separated files or directories, first wins), then the built-in folder.

Optional time fields (docs/semantics.md, "Events too far ahead" and "Idle streams"), each
an integer in the stream's time unit, a duration (`"1 hour"`, `"30 seconds"`) or `"none"`:
`max_ahead` (how far an event may run ahead of the stream's time; default 366 days),
`max_ahead_of_clock` (of the wall clock; default none) and `idleness` (how long the
streaming service waits, in wall-clock time, with no event before it advances the stream's
time by the wall clock; default none).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson



class AttrType(StrEnum):
    """The type of a stream attribute (its value in a schema's `attributes`)."""

    INT = "int"
    FLOAT = "float"
    STRING = "string"
    BOOL = "bool"
    TIMESTAMP = "timestamp"


ATTRIBUTE_TYPES = tuple(AttrType)


class TimeUnit(StrEnum):
    """The unit of a stream's time (its value in a schema's `time_unit`). TICKS have no
    wall-clock length (a duration in ms is taken as that many ticks where one must be
    converted)."""

    MS = "ms"
    S = "s"
    US = "us"
    NS = "ns"
    TICKS = "ticks"


# The one table of stream time units: nanoseconds per unit (all but ticks).
NANOS_PER_UNIT: dict[str, int] = {TimeUnit.MS: 1_000_000, TimeUnit.S: 1_000_000_000,
                                 TimeUnit.US: 1_000, TimeUnit.NS: 1}
TIME_UNITS = tuple(unit.value for unit in TimeUnit)  # as schema files write them
SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"  # built-in schemas (package data)
SCHEMA_PATH_ENV = "CEP_SCHEMA_PATH"
# Files in the schema folders that describe messages, not event streams.
NOT_STREAMS = ("composite_event", "control_message")


class SchemaError(ValueError):
    pass


def units_per_ms(time_unit: TimeUnit) -> float:
    """How many of a stream's time units make a millisecond (ticks: one)."""
    ms = NANOS_PER_UNIT[TimeUnit.MS]
    return ms / NANOS_PER_UNIT.get(time_unit, ms)


# The bounds and timeouts of a stream's time (`max_ahead`, `max_ahead_of_clock`,
# `idleness`): durations as the query language writes them, or integers in the stream's
# time unit, or "none".
TIME_FIELDS = ("max_ahead", "max_ahead_of_clock", "idleness")
NO_BOUND = "none"
DEFAULT_MAX_AHEAD_MS = 366 * 86_400_000  # the longest duration a query may give
_DURATION = re.compile(r"\s*([0-9]+)\s*([A-Za-z]+)\s*")
_DURATION_MS = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds", "msec"), 1),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1000),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), 60_000),
    **dict.fromkeys(("h", "hr", "hour", "hours"), 3_600_000),
    **dict.fromkeys(("d", "day", "days"), 86_400_000),
}
_TICK_WORDS = ("tick", "ticks")


def time_amount(value: object, time_unit: TimeUnit, what: str = "max_ahead") -> int | None:
    """A `max_ahead`-style value in the stream's time unit: None for "none"; an integer
    (at least 1) as it is; a duration such as "5 minutes" or "1 day" converted (on a
    stream timed in ticks: "N ticks", or for `idleness`, a wall-clock duration taken as
    milliseconds, one tick each). SchemaError says what is wrong."""
    if isinstance(value, str) and value.strip().lower() == NO_BOUND:
        return None
    if isinstance(value, str) and value.strip().isdigit():  # an option's integer
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise SchemaError(f"{what} must be at least 1, got {value}")
        return value
    found = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        raise SchemaError(f"{what} must be a positive integer in the stream's time unit, a "
                          f"duration such as \"1 hour\", or \"none\"; got {value!r}")
    amount, unit = int(found.group(1)), found.group(2).lower()
    if amount < 1:
        raise SchemaError(f"{what} must be positive, got {value!r}")
    if unit in _TICK_WORDS:
        if time_unit != TimeUnit.TICKS:
            raise SchemaError(f"{what} {value!r}: ticks are the unit of streams timed in "
                              f"ticks, this one is timed in {time_unit}")
        return amount
    if unit not in _DURATION_MS:
        raise SchemaError(f"{what} {value!r}: unknown time unit {unit!r} (use ms, seconds, "
                          "minutes, hours, days or ticks)")
    ms = amount * _DURATION_MS[unit]
    if time_unit == TimeUnit.TICKS:
        if what != "idleness":
            raise SchemaError(f"{what} {value!r}: a stream timed in ticks takes durations "
                              "in ticks")
        return ms
    nanos = ms * NANOS_PER_UNIT[TimeUnit.MS]
    if nanos % NANOS_PER_UNIT[time_unit]:
        raise SchemaError(f"{what} {value!r}: finer than the stream's time unit ({time_unit})")
    return nanos // NANOS_PER_UNIT[time_unit]


@dataclass(frozen=True, init=False)
class StreamSchema:
    """A stream's schema. Built from its fields as a schema file writes them (attribute
    types and time unit as text) or as the enums; it keeps the enums."""

    stream: str
    attributes: dict[str, AttrType]
    time: str
    time_unit: TimeUnit
    type_attribute: str | None
    types: tuple[str, ...] | None  # the values the type attribute may take, if known
    # The time fields as given (an int in the time unit, a duration text, "none"; None:
    # the default), see `time_amount` and the properties below.
    max_ahead: int | str | None
    max_ahead_of_clock: int | str | None
    idleness: int | str | None

    def __init__(self, stream: str, attributes: Mapping[str, str], time: str,
                 time_unit: str = TimeUnit.MS, type_attribute: str | None = None,
                 types: tuple[str, ...] | None = None, max_ahead: int | str | None = None,
                 max_ahead_of_clock: int | str | None = None,
                 idleness: int | str | None = None) -> None:
        for name, kind in attributes.items():
            if kind not in ATTRIBUTE_TYPES:
                raise SchemaError(f"stream {stream}: attribute {name} has unknown type "
                                  f"{kind!r} (one of {', '.join(ATTRIBUTE_TYPES)})")
        typed = {name: AttrType(kind) for name, kind in attributes.items()}
        if typed.get(time) not in (AttrType.TIMESTAMP, AttrType.INT):
            raise SchemaError(f"stream {stream}: time attribute {time!r} must be "
                              "an attribute of type timestamp or int")
        if time_unit not in TIME_UNITS:
            raise SchemaError(f"stream {stream}: time_unit must be one of {TIME_UNITS}")
        if type_attribute is not None and typed.get(type_attribute) is not AttrType.STRING:
            raise SchemaError(f"stream {stream}: type attribute {type_attribute!r} "
                              "must be a string attribute")
        fields = {"stream": stream, "attributes": typed, "time": time,
                  "time_unit": TimeUnit(time_unit), "type_attribute": type_attribute,
                  "types": types, "max_ahead": max_ahead,
                  "max_ahead_of_clock": max_ahead_of_clock, "idleness": idleness}
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        for name in TIME_FIELDS:
            try:
                self._time_field(name)
            except SchemaError as e:
                raise SchemaError(f"stream {self.stream}: {e}") from None
        if self.time_unit is TimeUnit.TICKS and self.max_ahead_of_clock is not None and \
                self.ahead_of_clock_bound is not None:
            raise SchemaError(f"stream {self.stream}: max_ahead_of_clock: a stream timed in "
                              "ticks has no wall-clock time")

    def _time_field(self, name: str) -> int | None:
        value = getattr(self, name)
        return None if value is None else time_amount(value, self.time_unit, name)

    @property
    def ahead_bound(self) -> int | None:
        """How far (in the time unit) an event may run ahead of the stream's time: the
        `max_ahead` field, by default 366 days (on a stream timed in ticks, as many ticks
        as 366 days have milliseconds); None: no bound."""
        if self.max_ahead is None:
            return round(DEFAULT_MAX_AHEAD_MS * units_per_ms(self.time_unit))
        return self._time_field("max_ahead")

    @property
    def ahead_of_clock_bound(self) -> int | None:
        """How far (in the time unit) an event may run ahead of the wall clock (None: no
        bound, the default)."""
        return self._time_field("max_ahead_of_clock")

    @property
    def idleness_units(self) -> int | None:
        """After how much wall-clock time without events (in the time unit; ticks:
        milliseconds) the streaming service advances the stream's time (None: never)."""
        return self._time_field("idleness")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StreamSchema:
        try:
            types = data.get("types")
            return cls(stream=data["stream"], attributes=dict(data["attributes"]),
                       time=data["time"], time_unit=data.get("time_unit", "ms"),
                       type_attribute=data.get("type_attribute"),
                       types=tuple(types) if types is not None else None,
                       **{name: data[name] for name in TIME_FIELDS
                          if data.get(name) is not None})
        except KeyError as e:
            raise SchemaError(f"schema lacks the field {e.args[0]!r}") from None

    def to_dict(self) -> dict[str, Any]:
        """The schema file's JSON (the time fields only where given)."""
        out = {"stream": self.stream, "attributes": self.attributes, "time": self.time,
               "time_unit": self.time_unit.value, "type_attribute": self.type_attribute,
               "types": list(self.types) if self.types is not None else None}
        out.update({name: getattr(self, name) for name in TIME_FIELDS
                    if getattr(self, name) is not None})
        return out


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
