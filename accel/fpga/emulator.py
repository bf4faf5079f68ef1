"""A functional emulator of the FPGA circuit (docs/fpga.md, "The circuit, stage by stage").

`Circuit` holds the state of one query's circuit in numpy arrays (pipeline elements, their
NFA states, start seqs and timers, a hash from partition id to element standing in for the
partitioner's parallel lookup) and runs one numba kernel over every tuple of a group of
TUPLES datagrams. `EmulatorServer` is the UDP side: a socket connected to the peer (so the
kernel delivers only the peer's datagrams), one recvmmsg into the slots of a preallocated
buffer per group of datagrams (`cep_accel.fpga.udp`), then the kernel, then the reports back
to the peer in one sendmmsg.
"""

from __future__ import annotations

import select
import socket
import threading
import time

import numpy as np
from numpy.typing import NDArray
from numba import njit

from cep_accel.fpga import udp, wire
from cep_accel.fpga.plan import CircuitConfig, FpgaPlan

SEQ_MASK = 0xFFFF_FFFF
OPS = {"=": 0, "<": 1, "<=": 2}
# ctr: the circuit's counters and cursor, kept between calls.
TUPLES, DISCARDED, EXPIRED, REPORTS, LOST, NEXT_SEQ, OUT_N, FOREIGN, DROPPED_N, HINT = range(10)
STOP_DONE, STOP_CONTROL = 0, 1


class Circuit:
    """One query's circuit. `run(rows)` / `run_datagrams(...)` return the match records
    (partition, seq, start seq: int64 arrays) the tuples produce, in order; after each
    call `dropped` holds the seqs of the tuples it discarded (partitioner full)."""

    def __init__(self, plan: FpgaPlan, config: CircuitConfig | None = None):
        self.plan = plan
        self.config = config or CircuitConfig()
        auto = plan.automaton
        k = self.config.elements
        hash_bits = max(4, (2 * k - 1).bit_length())
        self.cfg = np.array([plan.query_id, plan.layout.tuple_bytes, auto.size, k,
                             self.config.tick_tuples, (1 << self.config.timer_bits) - 1,
                             auto.first, auto.last, hash_bits, len(plan.atoms)], np.int64)
        fields = {f.name: f for f in plan.layout.fields}
        self.atoms = np.array([[fields[a.field].byte_offset, fields[a.field].byte_width,
                                fields[a.field].signed, OPS[a.op], a.constant]
                               for a in plan.atoms], np.int64).reshape(-1, 5)
        self.table = plan.enabled_table()
        self.follow = np.array(auto.follow + [0], np.int64)
        self.dropped = np.zeros(0, np.int64)
        self._out, self._dropped = np.empty((0, 3), np.int64), np.empty(0, np.int64)
        self._best = np.zeros(64, np.int64)
        self.reset()

    def reset(self) -> None:
        k, positions = self.config.elements, self.plan.automaton.size
        self.el_pid = np.full(k, -1, np.int64)
        self.el_state = np.zeros(k, np.int64)
        self.el_timer = np.zeros(k, np.int64)
        self.el_start = np.zeros(k * max(positions, 1), np.int64)
        self.hkeys = np.full(1 << int(self.cfg[8]), -1, np.int64)
        self.hvals = np.zeros(len(self.hkeys), np.int64)
        self.ctr = np.zeros(10, np.int64)
        # Occupancy bitmap of the elements (bits past k set: never free); the partitioner
        # takes the lowest free element.
        self.used = np.zeros(-(-k // 64), np.uint64)
        if k % 64:
            self.used[-1] = np.uint64(((1 << 64) - 1) ^ ((1 << (k % 64)) - 1))
        self.ctr[NEXT_SEQ] = -1  # no datagram yet: no gap to count

    def counts(self) -> dict:
        c = self.ctr
        return {"tuples": int(c[TUPLES]), "discarded": int(c[DISCARDED]),
                "expired": int(c[EXPIRED]), "reports": int(c[REPORTS]),
                "lost_tuples": int(c[LOST]), "foreign": int(c[FOREIGN])}

    def run_datagrams(self, buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                      start: int, out_cap: int) -> tuple[int, int, np.ndarray]:
        """Runs datagrams [start, len(offsets)) of `buf` until the end or a control
        datagram (BARRIER). Returns (stop reason, index reached, records)."""
        if len(self._dropped) < out_cap:  # scratch kept between calls
            self._out = np.empty((out_cap, 3), np.int64)
            self._dropped = np.empty(out_cap, np.int64)
        self.ctr[OUT_N] = self.ctr[DROPPED_N] = 0
        stop, index = _run(buf, offsets, lengths, start, self.cfg, self.atoms, self.table,
                           self.follow, self.el_pid, self.el_state, self.el_timer,
                           self.el_start, self.used, self.hkeys, self.hvals, self.ctr,
                           self._out, self._dropped, self._best)
        self.dropped = self._dropped[:int(self.ctr[DROPPED_N])].copy()
        return int(stop), int(index), self._out[:int(self.ctr[OUT_N])].copy()

    def run(self, rows: np.ndarray, first_seq: int = 0) -> np.ndarray:
        """Runs packed tuples (uint8 rows) as if they came in full datagrams; returns the
        records (partition, seq, start seq) as an (n, 3) int64 array."""
        per = self.plan.layout.tuples_per_datagram
        buf, ends = wire.tuple_datagrams(rows, self.plan.query_id, first_seq, per)
        offsets = wire.starts_of(ends)
        _, _, records = self.run_datagrams(buf, offsets, ends - offsets, 0, len(rows))
        return records.copy()


@njit(cache=True, inline="always")
def _read(buf: NDArray[np.uint8], at: int, nbytes: int, signed: bool) -> np.int64:
    value = np.int64(0)
    for b in range(nbytes):
        value |= np.int64(buf[at + b]) << np.int64(8 * b)
    if signed and nbytes < 8 and (value >> (8 * nbytes - 1)) & 1:
        value -= np.int64(1) << np.int64(8 * nbytes)
    return value


@njit(cache=True, nogil=True)
def _run(buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, start: int,
         cfg: np.ndarray, atoms: np.ndarray, table: np.ndarray, follow: np.ndarray,
         el_pid: np.ndarray, el_state: np.ndarray, el_timer: np.ndarray, el_start: np.ndarray,
         used: np.ndarray, hkeys: np.ndarray, hvals: np.ndarray, ctr: np.ndarray,
         out: np.ndarray, dropped: np.ndarray, best: np.ndarray) -> tuple[int, int]:
    stream, width, npos, k = cfg[0], cfg[1], cfg[2], cfg[3]
    tick, timer_max, first, last = cfg[4], cfg[5], cfg[6], cfg[7]
    hash_bits, natoms = cfg[8], cfg[9]
    hmask = (np.int64(1) << hash_bits) - 1
    positions = max(npos, 1)
    # Hot counters in locals (stores to ctr may alias out / dropped: LLVM would reload).
    tuples, out_n, reports = ctr[TUPLES], ctr[OUT_N], ctr[REPORTS]
    discarded, dropped_n = ctr[DISCARDED], ctr[DROPPED_N]
    until_tick = tick - tuples % tick
    d = start
    while d < offsets.shape[0]:
        at, length = offsets[d], lengths[d]
        if length < 16 or buf[at] != 1:
            ctr[FOREIGN] += 1
            d += 1
            continue
        kind = buf[at + 1]
        if kind != 1:
            ctr[TUPLES], ctr[OUT_N], ctr[REPORTS] = tuples, out_n, reports
            ctr[DISCARDED], ctr[DROPPED_N] = discarded, dropped_n
            return STOP_CONTROL, d
        count = _read(buf, at + 4, 2, False)
        if _read(buf, at + 2, 2, False) != stream or 16 + count * width > length:
            ctr[FOREIGN] += 1
            d += 1
            continue
        first_seq = _read(buf, at + 8, 8, False)
        if ctr[NEXT_SEQ] >= 0 and first_seq > ctr[NEXT_SEQ]:
            ctr[LOST] += first_seq - ctr[NEXT_SEQ]
        ctr[NEXT_SEQ] = first_seq + count
        for t in range(count):
            row = at + 16 + t * width
            # 1. timer tick
            tuples += 1
            until_tick -= 1
            if until_tick == 0:
                until_tick = tick
                for e in range(k):
                    if el_pid[e] >= 0:
                        el_timer[e] -= 1
                        if el_timer[e] <= 0:
                            _unhash(hkeys, hvals, hmask, hash_bits, el_pid[e])
                            _release(used, ctr, e)
                            el_pid[e] = -1
                            el_state[e] = 0
                            ctr[EXPIRED] += 1
            seq = _read(buf, row, 4, False)
            pid = _read(buf, row + 4, 4, False)
            # 2. predicate decoder
            vector = np.int64(0)
            for a in range(natoms):
                value = _read(buf, row + atoms[a, 0], atoms[a, 1], atoms[a, 2] != 0)
                op, constant = atoms[a, 3], atoms[a, 4]
                if atoms[a, 2] == 0 and atoms[a, 1] == 8:  # u64: compare unsigned
                    hit = (np.uint64(value) == np.uint64(constant)) if op == 0 else \
                        (np.uint64(value) < np.uint64(constant)) if op == 1 else \
                        (np.uint64(value) <= np.uint64(constant))
                else:
                    hit = value == constant if op == 0 else value < constant if op == 1 \
                        else value <= constant
                if hit:
                    vector |= np.int64(1) << a
            enabled = table[vector]
            # 3. stream partitioner
            e = _lookup(hkeys, hvals, hmask, hash_bits, pid)
            if e < 0:
                e = _lowest_free(used, ctr)
                if e < 0:
                    discarded += 1
                    dropped[dropped_n] = seq
                    dropped_n += 1
                    continue
                state = np.int64(0)
            else:
                state = el_state[e]
            # 4. NFA update, earliest start per position (as ages: seq - start)
            new = first & enabled
            for j in range(npos):
                best[j] = 0 if (new >> j) & 1 else -1
            s = state
            i = 0
            while s != 0:
                if s & 1:
                    reach = follow[i] & enabled
                    if reach != 0:
                        age = (seq - el_start[e * positions + i]) & SEQ_MASK
                        new |= reach
                        for j in range(npos):
                            if (reach >> j) & 1 and age > best[j]:
                                best[j] = age
                s >>= 1
                i += 1
            # 5. match reporting
            accept = new & last
            if accept != 0:
                winner = np.int64(-1)
                for j in range(npos):
                    if (accept >> j) & 1 and best[j] > winner:
                        winner = best[j]
                out[out_n, 0] = pid
                out[out_n, 1] = seq
                out[out_n, 2] = (seq - winner) & SEQ_MASK
                out_n += 1
                reports += 1
                new = 0
            if new == 0:
                if el_pid[e] >= 0:
                    _unhash(hkeys, hvals, hmask, hash_bits, pid)
                    _release(used, ctr, e)
                    el_pid[e] = -1
                    el_state[e] = 0
                continue
            if el_pid[e] < 0:
                el_pid[e] = pid
                used[e >> 6] |= np.uint64(1) << np.uint64(e & 63)
                _insert(hkeys, hvals, hmask, hash_bits, pid, e)
            el_state[e] = new
            el_timer[e] = timer_max
            for j in range(npos):
                if (new >> j) & 1:
                    el_start[e * positions + j] = (seq - best[j]) & SEQ_MASK
        d += 1
    ctr[TUPLES], ctr[OUT_N], ctr[REPORTS] = tuples, out_n, reports
    ctr[DISCARDED], ctr[DROPPED_N] = discarded, dropped_n
    return STOP_DONE, d


@njit(cache=True)
def _lowest_free(used: NDArray[np.uint64], ctr: NDArray[np.int64]) -> int:
    """The lowest free element, or -1 (words before ctr[HINT] are all taken)."""
    full = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
    for w in range(ctr[HINT], used.shape[0]):
        word = used[w]
        if word != full:
            ctr[HINT] = w
            bit = 0
            while (word >> np.uint64(bit)) & np.uint64(1):
                bit += 1
            return w * 64 + bit
    ctr[HINT] = used.shape[0]
    return -1


@njit(cache=True)
def _release(used: NDArray[np.uint64], ctr: NDArray[np.int64], e: int) -> None:
    used[e >> 6] &= ~(np.uint64(1) << np.uint64(e & 63))
    if (e >> 6) < ctr[HINT]:
        ctr[HINT] = e >> 6


@njit(cache=True, inline="always")
def _slot(pid: int | np.int64, hash_bits: int) -> np.int64:
    return np.int64((np.uint64(pid) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - hash_bits))


@njit(cache=True)
def _lookup(hkeys: NDArray[np.int64], hvals: NDArray[np.int64], hmask: int, hash_bits: int,
            pid: int | np.int64) -> int:
    h = _slot(pid, hash_bits)
    while hkeys[h] >= 0:
        if hkeys[h] == pid:
            return hvals[h]
        h = (h + 1) & hmask
    return -1


@njit(cache=True)
def _insert(hkeys: NDArray[np.int64], hvals: NDArray[np.int64], hmask: int, hash_bits: int,
            pid: int | np.int64, element: int) -> None:
    h = _slot(pid, hash_bits)
    while hkeys[h] >= 0:
        h = (h + 1) & hmask
    hkeys[h] = pid
    hvals[h] = element


@njit(cache=True)
def _unhash(hkeys: NDArray[np.int64], hvals: NDArray[np.int64], hmask: int, hash_bits: int,
            pid: int | np.int64) -> None:
    """Removes pid (linear probing with backward-shift deletion: no tombstones)."""
    h = _slot(pid, hash_bits)
    while hkeys[h] != pid:
        if hkeys[h] < 0:
            return
        h = (h + 1) & hmask
    hole = h
    j = (h + 1) & hmask
    while hkeys[j] >= 0:
        home = _slot(hkeys[j], hash_bits)
        # Move j into the hole unless its home lies cyclically in (hole, j].
        if ((j - home) & hmask) >= ((j - hole) & hmask):
            hkeys[hole] = hkeys[j]
            hvals[hole] = hvals[j]
            hole = j
        j = (j + 1) & hmask
    hkeys[hole] = -1


# ---------------------------------------------------------------- the UDP server


class EmulatorServer:
    """The circuit behind a UDP socket bound to `listen` and connected to `peer`: it takes
    datagrams only from the peer and sends REPORTS and STATUS there. Up to `group`
    datagrams (more where UDP GRO keeps runs of them together) are received per system
    call (`udp.DatagramReceiver`), the kernel runs over all of them, and their reports go
    back in one sendmmsg call."""

    def __init__(self, circuit: Circuit, listen: tuple[str, int], peer: tuple[str, int],
                 group: int = 1024, use_mmsg: bool | None = None):
        self.circuit = circuit
        # Deliberately like accel/fpga/adapter.py's: the two ends of one UDP link each open their
        # socket
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.size_buffers(self.sock)
        self.sock.bind(listen)
        self.sock.connect(peer)
        self.address = self.sock.getsockname()
        self.group = group
        self.receiver = udp.DatagramReceiver(self.sock, group, wire.RECEIVE_STRIDE, use_mmsg)
        self.sender = udp.DatagramSender(self.sock, use_mmsg=use_mmsg)
        self.report_number = 0
        self.groups = 0
        self._stop = threading.Event()
        self.fingerprint = circuit.plan.fingerprint()

    def serve(self, duration: float | None = None, poll: float = 0.05) -> None:
        """Serves until `stop()` or `duration` seconds."""
        deadline = None if duration is None else time.monotonic() + duration
        # Non-blocking socket: recvmmsg takes what is waiting; only an empty socket waits,
        # in poll (at most `poll` seconds, so stop() and the deadline are seen).
        self.sock.setblocking(False)
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        receive, stopped = self.receiver.receive, self._stop.is_set
        while not stopped():
            if deadline is not None and time.monotonic() > deadline:
                break
            n = receive()
            if n:
                self._process(n)
                self.groups += 1
            else:
                poller.poll(poll * 1000)

    def _process(self, n: int) -> None:
        circuit, received = self.circuit, self.receiver
        offsets, lengths = received.offsets[:n], received.lengths[:n]
        # Records and discards: at most one per tuple that fits the datagrams.
        out_cap = int(np.maximum(lengths - wire.HEADER_BYTES, 0).sum()) // \
            circuit.plan.layout.tuple_bytes + 1
        index = 0
        while index < n:
            stop, index, records = circuit.run_datagrams(received.buffer, offsets, lengths,
                                                         index, out_cap)
            self._send_reports(records)
            if stop == STOP_CONTROL:
                self._control(index)
                index += 1

    def _send_reports(self, records: np.ndarray) -> None:
        if not len(records):
            return
        out = np.zeros(len(records), wire.REPORT_DTYPE)
        out["query"] = self.circuit.plan.query_id
        out["partition"], out["seq"], out["start_seq"] = records.T
        buffer, ends = wire.report_datagrams(out, self.report_number)
        self.report_number += len(ends)
        self._send(buffer, ends)

    def _send(self, buffer: np.ndarray, ends: np.ndarray) -> None:
        try:
            self.sender.send(buffer, wire.starts_of(ends), ends)
        except (ConnectionRefusedError, BlockingIOError):
            pass  # the peer is not listening (yet), or never drains: lost, as on a wire

    def _control(self, index: int) -> None:
        data = self.receiver.datagram(index).tobytes()
        try:
            head = wire.parse_header(data)
        except wire.WireError:
            return
        if head["kind"] != wire.BARRIER or len(data) < wire.HEADER_BYTES + 8:
            return
        counts = self.circuit.counts()
        counts["fingerprint"] = self.fingerprint
        datagram = np.frombuffer(wire.status(int(head["stream"]), int(head["first_seq"]),
                                             counts), np.uint8)
        self._send(datagram, np.array([len(datagram)], np.int64))

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.sock.close()

    def start_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve, daemon=True)
        thread.start()
        return thread
