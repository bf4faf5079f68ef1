"""The host adapter: batches of events -> TUPLES datagrams to a device; REPORTS -> the
composite events the software engine emits (docs/fpga.md, "Host adapter").

Per batch, on numpy columns: dense partition ids (the MATCH engine's key ids), the time
check (events whose time goes backwards in their partition are rejected on the host, as
every engine does), wire seqs (0, 1, 2, ... over the tuples sent); then, a chunk of
whole datagrams at a time, `pack_tuples`, one buffer of datagrams and one sendmmsg call
per up to 1024 messages (`cep_accel.fpga.udp`; UDP GSO where the kernel has it). The columns
EMIT reads are retained per batch sent, at most `retain_tuples` tuples, so a match record
(partition, seq, start seq) can be turned into the composite event: EMIT is evaluated over
the partition's retained tuples with wire seq in [start seq, seq] by the reference
interpreter's expression evaluator.
"""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass

import numpy as np
import orjson

from cep_accel.fpga import udp, wire
from cep_accel.fpga.plan import FpgaPlan, compile_fpga, pack_tuples
from cep_accel.gpu.host_kernels import accept_in_time
from cep_core import ast
from cep_core.batch import Batch, BatchEncoder, StringDictionary
from cep_core.checked import CheckedQuery
from cep_core.engine.match import _Keys as PartitionIds
from cep_core.events import Event
from cep_core.reference.match import MatchEnv
from cep_core.reference.expr import evaluate

SEQ_MASK = 0xFFFF_FFFF
SEND_CHUNK_TUPLES = 32768  # tuples packed per step of `send`
RECEIVE_SLOTS = 256  # datagrams taken from the socket per receive call
RECEIVE_ROUNDS = 64  # receive calls per `receive()` at most (a device that never stops)
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
    it has then arrived) and returns the rest. Flow control for a device that cannot keep
    up: after every `sync_every` datagrams `send` sends a BARRIER and waits for the STATUS
    of the one before, so at most two windows are in flight and the sender never idles
    for a round trip (None: line rate). `keep_rows`: keep every packed tuple sent in
    `sent_rows` and every record received in `received` (for `verify`). `use_mmsg=False`:
    one system call per datagram (the plain path; also where libc has no sendmmsg)."""

    def __init__(self, checked: CheckedQuery, device: tuple[str, int],
                 bind: tuple[str, int] = ("127.0.0.1", 0), per_datagram: int | None = None,
                 retain_tuples: int = 1 << 22, sync_every: int | None = None,
                 timeout: float = 5.0, keep_rows: bool = False,
                 use_mmsg: bool | None = None):
        self.checked = checked
        self.strings = StringDictionary()
        self.plan: FpgaPlan = compile_fpga(checked, self.strings)
        body = checked.query.body
        assert isinstance(body, ast.MatchQuery)  # compile_fpga refuses every other query
        self.emit = body.emit
        self.encoder = BatchEncoder(checked.schema, self.strings)
        self.per_datagram = per_datagram or self.plan.layout.tuples_per_datagram
        self.retain_tuples = retain_tuples
        self.sync_every = sync_every
        self.timeout = timeout
        # Deliberately like accel/fpga/emulator.py's: the two ends of one UDP link each open their
        # socket
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.size_buffers(self.sock)
        self.sock.bind(bind)
        self.sock.connect(device)
        self.address = self.sock.getsockname()
        self.sender = udp.DatagramSender(self.sock, use_mmsg=use_mmsg)
        self.receiver = udp.DatagramReceiver(self.sock, RECEIVE_SLOTS, wire.RECEIVE_STRIDE,
                                             use_mmsg)
        self._poller = select.poll()
        self._poller.register(self.sock, select.POLLIN)
        attr = self.plan.partition_attr
        # Dense ids by first appearance; one int/string column takes a jitted lookup table.
        self.keys = PartitionIds([attr] if attr else [], checked.schema)
        self.last_ts = np.full(16, INT64_MIN, np.int64)
        self.wire_seq = 0
        self.chunks: list[_Chunk] = []
        self.emit_attrs = _emit_attributes(self.emit, checked.schema.time)
        self.dead_letters: list[tuple[int, str]] = []
        self.lost_spans = 0
        self.status: dict = {}
        self._since_sync = 0
        self._token = 0
        self._awaited = 0  # the highest barrier token answered
        self._pending: int | None = None  # flow control: the barrier sent, not waited for
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
        accepted = accept_in_time(pids, ts, self.last_ts)
        if not accepted.all():
            self._reject(batch, pids, ~accepted)
            batch = _select(batch, accepted)
            pids = pids[accepted]
        n, first = len(pids), self.wire_seq
        self._retain(batch, pids)
        self.wire_seq += n
        # Packed and sent a chunk at a time (whole datagrams each), so that the temporaries
        # stay small and in cache.
        chunk = max(1, SEND_CHUNK_TUPLES // self.per_datagram) * self.per_datagram
        found: list[dict] = []
        for start in range(0, n, chunk):
            part = batch.slice(start, start + chunk)
            rows = pack_tuples(self.plan, part, partition_ids=pids[start:start + chunk],
                               seqs=first + start + np.arange(len(part), dtype=np.int64))
            if self.sent_rows is not None:
                self.sent_rows.append(rows)
            buffer, ends = wire.tuple_datagrams(rows, self.plan.query_id, first + start,
                                                self.per_datagram)
            found += self._send_datagrams(buffer, ends)
        return found + self.receive()

    def _send_datagrams(self, buffer: np.ndarray, ends: np.ndarray) -> list[dict]:
        starts = wire.starts_of(ends)
        if self.sync_every is None:
            self.sender.send(buffer, starts, ends)
            return []
        found: list[dict] = []
        begin = 0
        while begin < len(ends):
            take = min(len(ends) - begin, self.sync_every - self._since_sync)
            self.sender.send(buffer, starts[begin:begin + take], ends[begin:begin + take])
            begin += take
            self._since_sync += take
            if self._since_sync >= self.sync_every:
                found += self._pace()
        return found

    def _pace(self) -> list[dict]:
        """Flow control without a stall per window: a BARRIER after every `sync_every`
        datagrams, and a wait for the previous window's STATUS only (at most two windows
        in flight)."""
        self._since_sync = 0
        self._token += 1
        self._send_barrier(self._token)
        previous, self._pending = self._pending, self._token
        return [] if previous is None else self._await(previous)

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
        for _ in range(RECEIVE_ROUNDS):
            if not self.receiver.receive():
                break
            found += self._received()
        return found

    def sync(self) -> list[dict]:
        """BARRIER, then every report up to the device's STATUS (retrying the barrier a few
        times, each waiting `timeout / 4` seconds)."""
        self._since_sync = 0
        self._pending = None
        self._token += 1
        self._send_barrier(self._token)
        return self._await(self._token)

    def _send_barrier(self, token: int) -> None:
        self.sock.send(wire.barrier(self.plan.query_id, token, self.plan.fingerprint()))

    def _await(self, token: int) -> list[dict]:
        """Reports until the STATUS of barrier `token` (or a later one); the barrier is sent
        again after each `timeout / 4` seconds without it."""
        found: list[dict] = []
        for attempt in range(4):
            if attempt:
                self._send_barrier(token)
            deadline = time.monotonic() + self.timeout / 4
            while self._awaited < token:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if self.receiver.receive():
                    found += self._received()
                else:
                    self._poller.poll(max(1, int(left * 1000)))
            if self._awaited >= token:
                return found
        raise DeviceError(f"no STATUS from the device within {self.timeout} s")

    def _received(self) -> list[dict]:
        """Composite events of the datagrams in the receiver's slots, in order; a STATUS
        among them is taken (`status`, the token answered)."""
        found: list[dict] = []
        for i in range(self.receiver.count):
            data = self.receiver.datagram(i)
            head = wire.parse_header(data)
            if head["kind"] == wire.STATUS:
                _, token, counts = wire.parse_status(data)
                if token > self._awaited:
                    self._accept_status(counts)
                    self._awaited = token
                continue
            found += self._datagram(data)
        return found

    def _accept_status(self, counts: dict) -> list[dict]:
        if counts["fingerprint"] != self.plan.fingerprint():
            raise DeviceError("the device runs a different plan for query "
                              f"{self.plan.query_name} (fingerprint mismatch)")
        self.status = counts
        return []

    def _datagram(self, data: bytes | memoryview) -> list[dict]:
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

    def _composite(self, record: np.void) -> dict | None:
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
        for item in self.emit:
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

    def _key(self, pid: int) -> object:
        attr = self.plan.partition_attr
        if attr is None:
            return None
        return self.encoder.decode_value(attr, self.keys.value(pid)[0])

    def close(self) -> None:
        self.sock.close()


def _emit_attributes(emit: list[ast.EmitItem], time_attr: str) -> list[str]:
    names: list[str] = []
    for item in emit:
        for node in item.expr.find_all(ast.Attr):
            if node.name and node.name not in names and node.name != time_attr:
                names.append(node.name)
    return names


def _select(batch: Batch, mask: np.ndarray) -> Batch:
    return Batch(batch.seq[mask], batch.ts[mask], {k: v[mask] for k, v in batch.columns.items()})
