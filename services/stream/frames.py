"""The frame codec of the internal topics: one Kafka record carries many events.

A frame is a Kafka record whose headers say what it is and whose value is its payload:

- `kind=events`: an Arrow IPC stream holding one record batch (columns `seq`, then the
  stream's attributes; strings as plain or dictionary strings). Headers `first`/`last`
  (seq range), `count`, `route` (the PARTITION BY attribute list the events were keyed by,
  comma-separated; empty for unkeyed queries).
- `kind=pulse`: no payload: "all events up to seq `upto` have been sent to this partition".
- `kind=control`: a JSON object (a query change, or the whole query set) that holds from
  seq `at` on; `kind=end`: end of input at seq `upto` (engines flush there).
- `kind=matches`: composite events (a JSON list), worker -> coordinator.

Any frame may carry `upto` (the partition is complete up to that seq) and `ts` (the largest
event time of the events up to `upto`). The source topic accepts `kind=events` frames from
high-rate producers besides one JSON event per message (no `kind` header).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson
import pyarrow as pa

EVENTS, PULSE, CONTROL, END, MATCHES = "events", "pulse", "control", "end", "matches"
KINDS = (EVENTS, PULSE, CONTROL, END, MATCHES)
INT_HEADERS = ("first", "last", "count", "upto", "ts", "at", "part", "sent_ms")


class FrameError(ValueError):
    """A record that claims to be a frame but cannot be decoded."""


@dataclass
class Frame:
    kind: str
    headers: dict = field(default_factory=dict)
    payload: bytes | pa.Table = b""  # a table: an events frame that stays in the process

    def get(self, name: str, default=None):
        return self.headers.get(name, default)

    def kafka_headers(self) -> list[tuple[str, bytes]]:
        out = [("kind", self.kind.encode())]
        out.extend((k, str(v).encode()) for k, v in self.headers.items() if v is not None)
        return out


def parse_headers(headers) -> dict:
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


def frame_of(message) -> Frame | None:
    """The frame a consumed message holds, or None when it is a plain JSON event."""
    headers = parse_headers(message.headers())
    kind = headers.pop("kind", None)
    if kind is None:
        return None
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind!r}")
    return Frame(kind, headers, message.value() or b"")


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


def events_frame(table: pa.Table, route: str = "", encode: bool = True, **headers) -> Frame:
    """`encode` False: the payload is the table itself, for a frame handed over in memory."""
    seq = table.column("seq")
    first = seq[0].as_py() if len(seq) else None
    last = seq[-1].as_py() if len(seq) else None
    return Frame(EVENTS, {"route": route, "first": first, "last": last,
                          "count": table.num_rows, **headers},
                 encode_table(table) if encode else table)


def json_frame(kind: str, obj, **headers) -> Frame:
    return Frame(kind, headers, orjson.dumps(obj))


def json_payload(frame: Frame):
    try:
        return orjson.loads(frame.payload) if frame.payload else None
    except orjson.JSONDecodeError as e:
        raise FrameError(f"{frame.kind} frame: not valid JSON: {e}") from None
