"""The UDP wire protocol between the host adapter and the device (docs/fpga.md).

Every datagram starts with a 16-byte little-endian header:

    offset 0  u8   version (1)
           1  u8   kind: TUPLES, BARRIER, REPORTS or STATUS
           2  u16  stream id (the query id whose circuit the datagram is for)
           4  u16  count (tuples or report records that follow)
           6  u16  flags (0)
           8  u64  first seq (TUPLES: seq of the first tuple; BARRIER/STATUS: the token;
                   REPORTS: the report datagram's own sequence number)

TUPLES carry `count` packed tuples (`plan.pack_tuples`). BARRIER carries the sender's plan
fingerprint (u64); the device answers it with STATUS once every report of the tuples
before it is sent. REPORTS carry `count` 16-byte match records (`REPORT_DTYPE`).
"""

from __future__ import annotations

import numpy as np

from cep_accel.fpga.plan import DATAGRAM_PAYLOAD

VERSION = 1
TUPLES, BARRIER, REPORTS, STATUS = 1, 2, 3, 4
HEADER_BYTES = 16
MAX_DATAGRAM = HEADER_BYTES + DATAGRAM_PAYLOAD
RECEIVE_STRIDE = 2048  # bytes per datagram slot in receive buffers (> any datagram)
REPORTS_PER_DATAGRAM = DATAGRAM_PAYLOAD // 16

HEADER_DTYPE = np.dtype([("version", "u1"), ("kind", "u1"), ("stream", "<u2"),
                         ("count", "<u2"), ("flags", "<u2"), ("first_seq", "<u8")])
REPORT_DTYPE = np.dtype([("query", "<u2"), ("flags", "<u2"), ("partition", "<u4"),
                         ("seq", "<u4"), ("start_seq", "<u4")])
BARRIER_DTYPE = np.dtype([("fingerprint", "<u8")])
STATUS_FIELDS = ("tuples", "discarded", "expired", "reports", "lost_tuples", "fingerprint")
STATUS_DTYPE = np.dtype([(name, "<u8") for name in STATUS_FIELDS])
assert HEADER_DTYPE.itemsize == HEADER_BYTES and REPORT_DTYPE.itemsize == 16


class WireError(ValueError):
    """A datagram that does not follow the protocol."""


def header(kind: int, stream: int, count: int, first_seq: int) -> bytes:
    h = np.zeros(1, HEADER_DTYPE)
    h[0] = (VERSION, kind, stream, count, 0, first_seq)
    return h.tobytes()


def parse_header(data: bytes | memoryview) -> np.void:
    if len(data) < HEADER_BYTES:
        raise WireError(f"datagram of {len(data)} bytes is shorter than the header")
    h = np.frombuffer(data, HEADER_DTYPE, count=1)[0]
    if h["version"] != VERSION:
        raise WireError(f"unknown protocol version {h['version']}")
    return h


def tuple_datagrams(tuples: np.ndarray, stream: int, first_seq: int,
                    per_datagram: int) -> tuple[np.ndarray, np.ndarray]:
    """Packed tuples (uint8 rows) split into TUPLES datagrams of up to `per_datagram`
    tuples, built in one buffer: (buffer, end offsets of the datagrams). The seq in each
    header is `first_seq` plus the index of its first tuple (the sender's seqs are
    consecutive)."""
    n, width = tuples.shape
    if per_datagram < 1 or per_datagram * width > DATAGRAM_PAYLOAD:
        raise ValueError(f"{per_datagram} tuples of {width} bytes do not fit one datagram")
    firsts = first_seq + np.arange(-(-n // per_datagram), dtype=np.uint64) * per_datagram
    return _datagrams(tuples, per_datagram, TUPLES, stream, firsts)


def _datagrams(rows: np.ndarray, per: int, kind: int, stream: int,
               firsts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint8 rows, `per` to a datagram, each datagram's header with its `firsts` value, in
    one buffer: (buffer, end offsets)."""
    n, width = rows.shape
    full, rest = divmod(n, per)
    size = HEADER_BYTES + per * width
    buffer = np.empty(full * size + (HEADER_BYTES + rest * width if rest else 0), np.uint8)
    if full:
        body = buffer[:full * size].reshape(full, size)
        body[:, HEADER_BYTES:] = rows[:full * per].reshape(full, -1)
        heads = body[:, :HEADER_BYTES].view(HEADER_DTYPE).reshape(full)
        heads["version"], heads["kind"], heads["stream"] = VERSION, kind, stream
        heads["count"], heads["flags"] = per, 0
        heads["first_seq"] = firsts[:full]
    ends = np.arange(1, full + 1, dtype=np.int64) * size
    if rest:
        tail = buffer[full * size:]
        tail[:HEADER_BYTES] = np.frombuffer(header(kind, stream, rest, int(firsts[full])),
                                            np.uint8)
        tail[HEADER_BYTES:] = rows[full * per:].reshape(-1)
        ends = np.append(ends, len(buffer))
    return buffer, ends


def starts_of(ends: np.ndarray) -> np.ndarray:
    """The start offsets of datagrams laid end to end, from their end offsets."""
    starts = np.zeros(len(ends), np.int64)
    starts[1:] = ends[:-1]
    return starts


def barrier(stream: int, token: int, fingerprint: int) -> bytes:
    body = np.array([(fingerprint,)], BARRIER_DTYPE).tobytes()
    return header(BARRIER, stream, 0, token) + body


def status(stream: int, token: int, counts: dict[str, int]) -> bytes:
    body = np.zeros(1, STATUS_DTYPE)
    for name in STATUS_FIELDS:
        body[name] = counts.get(name, 0)
    return header(STATUS, stream, 0, token) + body.tobytes()


def parse_status(data: bytes | memoryview) -> tuple[int, int, dict[str, int]]:
    """(stream, token, counts) of a STATUS datagram."""
    h = parse_header(data)
    if h["kind"] != STATUS or len(data) < HEADER_BYTES + STATUS_DTYPE.itemsize:
        raise WireError("not a STATUS datagram")
    body = np.frombuffer(data, STATUS_DTYPE, count=1, offset=HEADER_BYTES)[0]
    return int(h["stream"]), int(h["first_seq"]), {n: int(body[n]) for n in STATUS_FIELDS}


def parse_reports(data: bytes | memoryview) -> np.ndarray:
    """The match records of a REPORTS datagram (a REPORT_DTYPE array)."""
    h = parse_header(data)
    count = int(h["count"])
    if h["kind"] != REPORTS or len(data) < HEADER_BYTES + 16 * count:
        raise WireError("not a REPORTS datagram, or a truncated one")
    return np.frombuffer(data, REPORT_DTYPE, count=count, offset=HEADER_BYTES).copy()


def report_datagrams(records: np.ndarray, first_number: int) -> tuple[np.ndarray, np.ndarray]:
    """REPORT_DTYPE records as REPORTS datagrams of up to REPORTS_PER_DATAGRAM each,
    numbered from `first_number`, in one buffer: (buffer, end offsets)."""
    rows = np.ascontiguousarray(records, REPORT_DTYPE).view(np.uint8).reshape(-1, 16)
    numbers = first_number + np.arange(-(-len(records) // REPORTS_PER_DATAGRAM),
                                       dtype=np.uint64)
    return _datagrams(rows, REPORTS_PER_DATAGRAM, REPORTS, 0, numbers)
