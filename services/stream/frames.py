"""The frame codec of the internal topics: one Kafka record carries many events.

A frame is a Kafka record whose headers say what it is and whose value is its payload:

- `kind=events`: an Arrow IPC stream holding one record batch (columns `seq`, then the
  stream's attributes; strings as plain or dictionary strings). Headers `first`/`last`
  (seq range), `count`, `route` (the PARTITION BY attribute list the events were keyed by,
  comma-separated; empty for unkeyed queries).
- `kind=pulse`: no payload: "all events up to seq `upto` have been sent to this partition".
- `kind=control`: a JSON object that holds from seq `at` on: one applied change
  (`ChangeFrame`) or the whole live set (`LiveSetFrame`), encoded by their `to_payload` and
  decoded once by `control_of`; `kind=end`: end of input at seq `upto` (engines flush
  there).
- `kind=matches`: composite events (a JSON list), worker -> coordinator; with `held`, the
  smallest seq of a composite event the partition's engines still hold back (a
  MATCH_RECOGNIZE match waiting behind an earlier partial one), absent when none is.

Any frame may carry `upto` (the partition is complete up to that seq) and `ts` (the largest
event time of the events up to `upto`). The source topic accepts `kind=events` frames from
high-rate producers besides one JSON event per message (no `kind` header).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson
import pyarrow as pa

from cep_core.control_message import QUERY, STREAM
from cep_core.control_ops import Kind, Op



class FrameKind(StrEnum):
    """What a frame is (its `kind` header)."""

    EVENTS = "events"
    PULSE = "pulse"
    CONTROL = "control"
    END = "end"
    MATCHES = "matches"


EVENTS, PULSE, CONTROL, END, MATCHES = FrameKind
KINDS = tuple(FrameKind)
INT_HEADERS = ("first", "last", "count", "upto", "ts", "at", "part", "sent_ms", "held")


class FrameError(ValueError):
    """A record that claims to be a frame but cannot be decoded."""


@dataclass
class Frame:
    kind: FrameKind
    headers: dict = field(default_factory=dict)
    payload: bytes | pa.Table = b""  # a table: an events frame that stays in the process

    def __post_init__(self) -> None:
        self.kind = FrameKind(self.kind)

    def get(self, name: str, default: Any = None) -> Any:
        return self.headers.get(name, default)

    def kafka_headers(self) -> list[tuple[str, bytes]]:
        out = [("kind", self.kind.encode())]
        out.extend((k, str(v).encode()) for k, v in self.headers.items() if v is not None)
        return out


def parse_headers(headers: Any) -> dict:
    """Kafka headers (list of (name, bytes)) as a dict; integer headers as ints."""
    out: dict = {}
    for name, value in headers or ():
        text = value.decode() if isinstance(value, (bytes, bytearray)) else value
        if name in INT_HEADERS:
            try:
                text = int(text)
            except (TypeError, ValueError):
                raise FrameError(f"header {name!r} is not an integer: {text!r}") from None
        out[name] = text
    return out


def frame_of(message: Any) -> Frame | None:
    """The frame a consumed message holds, or None when it is a plain JSON event."""
    headers = parse_headers(message.headers())
    kind = headers.pop("kind", None)
    if kind is None:
        return None
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind!r}")
    return Frame(FrameKind(kind), headers, message.value() or b"")


# ------------------------------------------------------------------ payloads


def encode_table(table: pa.Table | pa.RecordBatch) -> bytes:
    """One Arrow IPC stream holding the table as one record batch."""
    if isinstance(table, pa.Table):
        table = pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns],
                                           schema=table.schema)
    batch = table
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_table(payload: bytes | pa.Table) -> pa.Table:
    if isinstance(payload, pa.Table):  # never encoded (the chained pipeline)
        return payload
    try:
        return pa.ipc.open_stream(pa.py_buffer(payload)).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise FrameError(f"not an Arrow IPC stream: {e}") from None


def events_frame(table: pa.Table, route: str = "", encode: bool = True,
                 **headers: Any) -> Frame:
    """`encode` False: the payload is the table itself, for a frame handed over in memory."""
    seq = table.column("seq")
    first = seq[0].as_py() if len(seq) else None
    last = seq[-1].as_py() if len(seq) else None
    return Frame(EVENTS, {"route": route, "first": first, "last": last,
                          "count": table.num_rows, **headers},
                 encode_table(table) if encode else table)


def json_frame(kind: FrameKind, obj: Any, **headers: Any) -> Frame:
    return Frame(kind, headers, orjson.dumps(obj))


def json_payload(frame: Frame) -> Any:
    try:
        return orjson.loads(frame.payload) if frame.payload else None
    except orjson.JSONDecodeError as e:
        raise FrameError(f"{frame.kind} frame: not valid JSON: {e}") from None


# ---------------------------------------------------------------- control frames


@dataclass(frozen=True)
class ChangeFrame:
    """One change the splitter applied: a query's (`text` and `index`; no text once it is
    removed) or a stream's (`text`, empty once it is removed, and `version`). `key` and
    `offset` name the control record in status records (None in frames made by hand)."""

    op: Op  # (given as text, made an Op)
    name: str
    kind: Kind = QUERY
    key: str | None = None
    offset: int | None = None
    text: str | None = None
    index: int | None = None
    version: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", Op(self.op))
        object.__setattr__(self, "kind", Kind(self.kind))

    @classmethod
    def applied(cls, named: dict, entry: Any) -> ChangeFrame:
        """From a change's names (`status.change_of`) and what the live set made of it (a
        LiveQuery or LiveStream, None for a query removed)."""
        fields = entry.to_json() if entry is not None else {}
        return cls(named["op"], named["name"], named["kind"], named["key"], named["offset"],
                   fields.get("text"), fields.get("index"), fields.get("version"))

    @property
    def of_stream(self) -> bool:
        return self.kind is STREAM

    @property
    def removes(self) -> bool:
        return self.op is Op.REMOVE

    def named(self) -> dict:
        """What names the change in status records (`status.change_of`)."""
        return {"key": self.key, "offset": self.offset, "kind": self.kind, "op": self.op,
                "name": self.name}

    def query_entry(self) -> dict:
        """The query as a live set serializes it (`LiveQuery.to_json`)."""
        return {"name": self.name, "text": self.text, "index": self.index}

    def to_payload(self) -> dict:
        out: dict[str, Any] = {"op": self.op, "name": self.name}
        if self.key is not None:
            out.update(key=self.key, offset=self.offset)
        out["kind"] = self.kind
        for field_, value in (("text", self.text), ("index", self.index),
                              ("version", self.version)):
            if value is not None:
                out[field_] = value
        return out

    @classmethod
    def from_payload(cls, obj: dict) -> ChangeFrame:
        return cls(obj["op"], obj["name"], obj.get("kind", QUERY), obj.get("key"),
                   obj.get("offset"), obj.get("text"), obj.get("index"), obj.get("version"))


@dataclass(frozen=True)
class LiveSetFrame:
    """The whole live set, a splitter's first frame after it starts: its queries
    (`LiveSet.to_json`), the control topic's streams (`LiveRegistry.to_json`) and the
    changes it applied while starting (`ChangeFrame.named` of each)."""

    queries: tuple[dict, ...] = ()
    streams: tuple[dict, ...] = ()
    changes: tuple[dict, ...] = ()
    op = "set"

    def to_payload(self) -> dict:
        return {"op": self.op, "queries": list(self.queries), "streams": list(self.streams),
                "changes": list(self.changes)}

    @classmethod
    def from_payload(cls, obj: dict) -> LiveSetFrame:
        return cls(tuple(obj["queries"]), tuple(obj.get("streams", ())),
                   tuple(obj.get("changes", ())))


ControlFrame = ChangeFrame | LiveSetFrame


def control_frame(change: ControlFrame, **headers: Any) -> Frame:
    return json_frame(CONTROL, change.to_payload(), **headers)


def control_of(frame: Frame) -> ControlFrame:
    """The change or live set a control frame carries; FrameError when it holds neither."""
    obj = json_payload(frame)
    try:
        if obj["op"] == LiveSetFrame.op:
            return LiveSetFrame.from_payload(obj)
        return ChangeFrame.from_payload(obj)
    except (KeyError, TypeError) as e:
        raise FrameError(f"control frame: not a change or a live set: {e!r}") from None

