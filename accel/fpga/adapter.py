"""The host adapter: batches of events -> TUPLES datagrams to a device; REPORTS -> the
composite events the software engine emits (docs/fpga.md, "Host adapter").

Per batch, on numpy columns: dense partition ids (the MATCH engine's key ids), the time
check (events whose time goes backwards in their partition are rejected on the host, as
every engine does),
wire seqs (0, 1, 2, ... over the tuples sent), `pack_tuples`, then one buffer of datagrams
sent slice by slice. The columns EMIT reads are retained per chunk of tuples sent, at most
`retain_tuples` tuples, so a match record (partition, seq, start seq) can be turned into
the composite event: EMIT is evaluated over the partition's retained tuples with wire seq
in [start seq, seq] by the reference interpreter's expression evaluator.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

import numpy as np
import orjson
from numba import njit

from accel.fpga import wire
from accel.fpga.plan import FpgaPlan, compile_fpga, pack_tuples
from cep_core import ast
from cep_core.batch import Batch, BatchEncoder, StringDictionary
from cep_core.checker import CheckedQuery
from cep_core.engine.match import _Keys as PartitionIds
from cep_core.events import Event
from cep_core.reference.match import MatchEnv
from cep_core.reference.expr import evaluate

SEQ_MASK = 0xFFFF_FFFF
INT64_MIN = np.iinfo(np.int64).min


class DeviceError(RuntimeError):
    """The device did not answer, or answered with a different plan."""


@dataclass
class _Chunk:
    """Tuples sent together: wire seqs [start, start + len), their partition ids, the
    events' seqs and the columns EMIT reads."""

    start: int
    pids: np.ndarray
    seqs: np.ndarray
    columns: dict[str, np.ndarray]

    @property
    def end(self) -> int:
        return self.start + len(self.pids)


class FpgaAdapter:
    """Streams batches of one MATCH query's stream to a device and collects its matches.

    `send(batch)` returns the composite events of the reports received so far; `sync()`
    sends a BARRIER, waits for the device's STATUS (every report of the tuples sent before
    it has then arrived) and returns the rest. `sync_every` datagrams, `send` syncs by
    itself (flow control for a device that cannot keep up; None: line rate). `keep_rows`:
    keep every packed tuple sent in `sent_rows` and every record received in `received`
    (for `verify`)."""

    def __init__(self, checked: CheckedQuery, device: tuple[str, int],
                 bind: tuple[str, int] = ("127.0.0.1", 0), per_datagram: int | None = None,
                 retain_tuples: int = 1 << 22, sync_every: int | None = None,
                 timeout: float = 5.0, keep_rows: bool = False):
        self.checked = checked
        self.strings = StringDictionary()
        self.plan: FpgaPlan = compile_fpga(checked, self.strings)
        self.encoder = BatchEncoder(checked.schema, self.strings)
        self.per_datagram = per_datagram or self.plan.layout.tuples_per_datagram
        self.retain_tuples = retain_tuples
        self.sync_every = sync_every
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(bind)
        self.sock.connect(device)
        self.address = self.sock.getsockname()
        attr = self.plan.partition_attr
        # Dense ids by first appearance; one int/string column takes a jitted lookup table.
        self.keys = PartitionIds([attr] if attr else [], checked.schema)
        self.last_ts = np.full(16, INT64_MIN, np.int64)
        self.wire_seq = 0
        self.chunks: list[_Chunk] = []
        self.emit_attrs = _emit_attributes(checked)
        self.dead_letters: list[tuple[int, str]] = []
        self.lost_spans = 0
        self.status: dict = {}
        self._since_sync = 0
        self._token = 0
        self._buffer = bytearray(wire.RECEIVE_STRIDE)
        self.sent_rows: list[np.ndarray] | None = [] if keep_rows else None
        self.received: list[np.ndarray] = []  # with keep_rows: the records, as received

    # ------------------------------------------------------------ sending

    def send_events(self, events: list[Event]) -> list[dict]:
        return self.send(self.encoder.from_events(events))

    def send(self, batch: Batch) -> list[dict]:
        if len(batch) == 0:
            return self.receive()
        pids = self.keys.assign(batch)
        if len(self.keys) > len(self.last_ts):
            grown = np.full(2 * len(self.keys), INT64_MIN, np.int64)
            grown[:len(self.last_ts)] = self.last_ts
            self.last_ts = grown
        ts = np.ascontiguousarray(batch.ts, dtype=np.int64)
        accepted = _time_check(pids, ts, self.last_ts)
        if not accepted.all():
            self._reject(batch, pids, ~accepted)
            batch = _select(batch, accepted)
            pids = pids[accepted]
        n = len(pids)
        rows = pack_tuples(self.plan, batch, partition_ids=pids,
                           seqs=self.wire_seq + np.arange(n, dtype=np.int64))
        self._retain(batch, pids)
        if self.sent_rows is not None:
            self.sent_rows.append(rows)
        buffer, ends = wire.tuple_datagrams(rows, self.plan.query_id, self.wire_seq,
                                            self.per_datagram)
        self.wire_seq += n
        found = self._send_datagrams(buffer, ends)
        return found + self.receive()

    def _send_datagrams(self, buffer: np.ndarray, ends: np.ndarray) -> list[dict]:
        view, send = memoryview(buffer), self.sock.send
        found: list[dict] = []
        begin = 0
        for end in ends.tolist():
            send(view[begin:end])
            begin = end
            if self.sync_every is not None:
                self._since_sync += 1
                if self._since_sync >= self.sync_every:
                    found += self.sync()
        return found

    def _retain(self, batch: Batch, pids: np.ndarray) -> None:
        columns = {name: np.asarray(batch.columns[name]) for name in self.emit_attrs}
        columns["__ts"] = np.asarray(batch.ts, dtype=np.int64)
        self.chunks.append(_Chunk(self.wire_seq, pids, np.asarray(batch.seq, np.int64),
                                  columns))
        oldest = self.wire_seq + len(pids) - self.retain_tuples
        while self.chunks and self.chunks[0].end <= oldest:
            self.chunks.pop(0)
        if self.chunks and self.chunks[0].start < oldest:
            first = self.chunks[0]
            cut = oldest - first.start
            self.chunks[0] = _Chunk(oldest, first.pids[cut:], first.seqs[cut:],
                                    {k: v[cut:] for k, v in first.columns.items()})

    def _reject(self, batch: Batch, pids: np.ndarray, rejected: np.ndarray) -> None:
        for seq, pid in zip(batch.seq[rejected].tolist(), pids[rejected].tolist()):
            key = orjson.dumps(self._key(pid)).decode()
            self.dead_letters.append((seq, "event time goes backwards in partition " + key))

    # ------------------------------------------------------------ receiving

    def receive(self) -> list[dict]:
        """Composite events of the REPORTS waiting on the socket (does not block)."""
        found: list[dict] = []
        while True:
            try:
                n = self.sock.recv_into(self._buffer, 0, socket.MSG_DONTWAIT)
            except (BlockingIOError, ConnectionRefusedError):
                return found
            found += self._datagram(memoryview(self._buffer)[:n])

    def sync(self) -> list[dict]:
        """BARRIER, then every report up to the device's STATUS (retrying the barrier a few
        times, each waiting `timeout / 4` seconds)."""
        self._since_sync = 0
        self._token += 1
        token = self._token
        found: list[dict] = []
        for _ in range(4):
            self.sock.send(wire.barrier(self.plan.query_id, token, self.plan.fingerprint()))
            deadline = time.monotonic() + self.timeout / 4
            while time.monotonic() < deadline:
                self.sock.settimeout(max(1e-3, deadline - time.monotonic()))
                try:
                    n = self.sock.recv_into(self._buffer)
                except (TimeoutError, ConnectionRefusedError):
                    continue
                finally:
                    self.sock.settimeout(None)
                data = memoryview(self._buffer)[:n]
                head = wire.parse_header(data)
                if head["kind"] == wire.STATUS:
                    _, got, counts = wire.parse_status(data)
                    if got == token:
                        return found + self._accept_status(counts)
                    continue
                found += self._datagram(data)
        raise DeviceError(f"no STATUS from the device within {self.timeout} s")

    def _accept_status(self, counts: dict) -> list[dict]:
        if counts["fingerprint"] != self.plan.fingerprint():
            raise DeviceError("the device runs a different plan for query "
                              f"{self.plan.query_name} (fingerprint mismatch)")
        self.status = counts
        return []

    def _datagram(self, data) -> list[dict]:
        head = wire.parse_header(data)
        if head["kind"] != wire.REPORTS:
            return []
        records = wire.parse_reports(data)
        if self.sent_rows is not None:
            self.received.append(records)
        return [c for c in map(self._composite, records[records["query"] ==
                                                         self.plan.query_id]) if c]

    # ------------------------------------------------------------ composite events

    def _full_seq(self, low: int) -> int:
        """The wire seq whose low 32 bits are `low`, among the tuples sent (the latest)."""
        last = self.wire_seq - 1
        return last - ((last - low) & SEQ_MASK)

    def _composite(self, record) -> dict | None:
        pid = int(record["partition"])
        end, start = self._full_seq(int(record["seq"])), self._full_seq(int(record["start_seq"]))
        if not self.chunks or start < self.chunks[0].start:
            self.lost_spans += 1
            return None
        events = self._span(pid, start, end)
        if not events:
            self.lost_spans += 1
            return None
        env = MatchEnv(events, events[-1], self.checked.schema.time)
        out = {"query": self.checked.name, "key": self._key(pid), "seq": events[-1].seq,
               "start_seq": events[0].seq}
        for item in self.checked.query.body.emit:
            out[item.name] = evaluate(item.expr, env)
        return out

    def _span(self, pid: int, start: int, end: int) -> list[Event]:
        """The partition's retained tuples with wire seq in [start, end], as events holding
        the attributes EMIT reads."""
        events: list[Event] = []
        time_attr = self.checked.schema.time
        for chunk in self.chunks:
            if chunk.end <= start or chunk.start > end:
                continue
            lo, hi = max(start, chunk.start) - chunk.start, min(end + 1, chunk.end) - chunk.start
            rows = lo + np.flatnonzero(chunk.pids[lo:hi] == pid)
            values = {name: [self.encoder.decode_value(name, v) for v in column[rows].tolist()]
                      for name, column in chunk.columns.items() if name != "__ts"}
            times = chunk.columns["__ts"][rows].tolist()
            for r, (seq, ts) in enumerate(zip(chunk.seqs[rows].tolist(), times)):
                attrs = {name: column[r] for name, column in values.items()}
                attrs[time_attr] = ts
                events.append(Event(seq, ts, attrs))
        return events

    def _key(self, pid: int):
        attr = self.plan.partition_attr
        if attr is None:
            return None
        return self.encoder.decode_value(attr, self.keys.value(pid)[0])

    def close(self) -> None:
        self.sock.close()


def _emit_attributes(checked: CheckedQuery) -> list[str]:
    names: list[str] = []
    for item in checked.query.body.emit:
        for node in ast.walk(item.expr):
            if isinstance(node, ast.Attr) and node.name and node.name not in names \
                    and node.name != checked.schema.time:
                names.append(node.name)
    return names


def _select(batch: Batch, mask: np.ndarray) -> Batch:
    return Batch(batch.seq[mask], batch.ts[mask], {k: v[mask] for k, v in batch.columns.items()})


@njit(cache=True)
def _time_check(pids, ts, last_ts):
    """Accepts an event unless its time is before its partition's last accepted event."""
    out = np.ones(pids.shape[0], np.bool_)
    for i in range(pids.shape[0]):
        p = pids[i]
        if ts[i] < last_ts[p]:
            out[i] = False
        else:
            last_ts[p] = ts[i]
    return out
