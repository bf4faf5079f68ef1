"""Batched datagram I/O on connected UDP sockets: sendmmsg(2) / recvmmsg(2) through ctypes.

One system call moves up to `batch` datagrams between the socket and a numpy buffer. The
mmsghdr and iovec arrays are built once; per call only the iovecs' (address, length) are
written, as numpy columns, so no Python runs per datagram. Datagrams laid end to end with
one size (what `wire` builds) are sent as UDP GSO messages where the kernel has it: the
kernel splits each into up to 64 datagrams, so the per-datagram cost of the send path is
paid once per message (receivers see the same datagrams); receivers turn on UDP GRO, so
such runs can arrive whole and are split here. Where libc has no sendmmsg /
recvmmsg (not Linux), `DatagramSender` and `DatagramReceiver` fall back to one `send` /
`recv_into` per datagram with the same results.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import socket
import sys
from typing import Any

import numpy as np

MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0x40)
SEND_WAITS = 1000  # a full send buffer is waited on at most this many times, 10 ms each
# Socket buffer sizes asked for: a few thousand full datagrams, so that a group of 1024 in
# flight each way fits (Linux caps them at net.core.rmem_max / wmem_max).
RECEIVE_BUFFER = 8 << 20
SEND_BUFFER = 4 << 20


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.c_void_p), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _Msghdr), ("msg_len", ctypes.c_uint)]


IOVEC_DTYPE = np.dtype({"names": ["base", "len"], "formats": ["<u8", "<u8"],
                        "offsets": [_Iovec.iov_base.offset, _Iovec.iov_len.offset],
                        "itemsize": ctypes.sizeof(_Iovec)})
_HDR = _Mmsghdr.msg_hdr.offset
MMSGHDR_DTYPE = np.dtype({
    "names": ["iov", "iovlen", "control", "controllen", "len"],
    "formats": ["<u8", "<u8", "<u8", "<u8", "<u4"],
    "offsets": [_HDR + _Msghdr.msg_iov.offset, _HDR + _Msghdr.msg_iovlen.offset,
                _HDR + _Msghdr.msg_control.offset, _HDR + _Msghdr.msg_controllen.offset,
                _Mmsghdr.msg_len.offset],
    "itemsize": ctypes.sizeof(_Mmsghdr)})
# UDP generic segmentation offload (Linux >= 4.18): one message of up to GSO_SEGMENTS
# datagrams of one size (the last may be shorter), split by the kernel, given as a
# control message (cmsghdr: u64 length, i32 level, i32 type, u16 segment size).
SOL_UDP, UDP_SEGMENT = 17, 103
GSO_SEGMENTS = 64  # the kernel's UDP_MAX_SEGMENTS before 6.x
GSO_BYTES = 65000  # under the 65,507-byte UDP payload limit
GSO_CMSG_DTYPE = np.dtype([("len", "<u8"), ("level", "<i4"), ("type", "<i4"),
                           ("size", "<u2"), ("pad", "V6")])  # CMSG_SPACE(2) bytes
GSO_CMSG_LEN = 18  # CMSG_LEN(2)
GSO_FAILURES = (errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP)
# UDP GRO on a receiving socket (Linux >= 5.0): datagrams of one size may arrive as one
# buffer, with a control message giving the segment size (an int).
UDP_GRO = 104
GRO_STRIDE = 1 << 16
GRO_CMSG_DTYPE = np.dtype([("len", "<u8"), ("level", "<i4"), ("type", "<i4"),
                           ("size", "<i4"), ("pad", "V4")])  # CMSG_SPACE(4) bytes
GRO_CMSG_LEN = 20  # CMSG_LEN(4)


def _libc_mmsg() -> tuple[Any, Any] | None:  # ctypes foreign functions
    """(sendmmsg, recvmmsg) from libc, or None where there are none (or not 64-bit little
    endian, the layout the dtypes above assume)."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8 \
            or sys.byteorder != "little":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        sendmmsg, recvmmsg = libc.sendmmsg, libc.recvmmsg
    except (OSError, AttributeError):
        return None
    sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int,
                         ctypes.c_void_p]
    sendmmsg.restype = recvmmsg.restype = ctypes.c_int
    return sendmmsg, recvmmsg


MMSG = _libc_mmsg()
HAVE_MMSG = MMSG is not None


class _Headers:
    """`count` mmsghdr, each with one iovec of its own (both zeroed numpy arrays: no
    name), and all with the same control data if `control` (a numpy array) is given."""

    def __init__(self, count: int, control: np.ndarray | None = None):
        self.msgs = np.zeros(count, MMSGHDR_DTYPE)
        self.iovs = np.zeros(count, IOVEC_DTYPE)
        self.msgs["iov"] = self.iovs.ctypes.data + np.arange(count, dtype=np.uint64) * \
            np.uint64(IOVEC_DTYPE.itemsize)
        self.msgs["iovlen"] = 1
        if control is not None:
            self.msgs["control"], self.msgs["controllen"] = control.ctypes.data, control.nbytes
        self.address = self.msgs.ctypes.data


def gso_supported(sock: socket.socket) -> bool:
    try:
        sock.getsockopt(SOL_UDP, UDP_SEGMENT)
    except OSError:
        return False
    return True


def size_buffers(sock: socket.socket) -> tuple[int, int]:
    """Asks for RECEIVE_BUFFER / SEND_BUFFER; returns what the system granted."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))


def _enable_gro(sock: socket.socket, on: bool) -> bool:
    """Sets UDP_GRO on the socket (off too: a receiver that does not split runs must not
    get them); whether it is on."""
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, int(on))
    except OSError:
        return False
    return on


def _error(code: int) -> OSError:
    return OSError(code, os.strerror(code))  # the errno's subclass (ConnectionRefusedError...)


def _wait_writable(sock: socket.socket) -> None:
    select.select([], [sock], [], 0.01)


class DatagramSender:
    """Sends slices of a uint8 numpy buffer as datagrams on a connected socket, in order:
    up to `batch` per sendmmsg call, or one `send` each (`use_mmsg=False`, or no
    sendmmsg). Datagrams laid end to end with one size (the last may be shorter), as
    `wire` builds them, go as UDP GSO messages of up to GSO_SEGMENTS datagrams where the
    kernel has GSO (`use_gso`; the receiver gets the same datagrams). A full send buffer
    (non-blocking socket) is waited on, bounded."""

    def __init__(self, sock: socket.socket, batch: int = 1024, use_mmsg: bool | None = None,
                 use_gso: bool | None = None):
        self.sock = sock
        self.batch = batch
        self.mmsg = HAVE_MMSG if use_mmsg is None else (use_mmsg and HAVE_MMSG)
        self.gso = self.mmsg and use_gso is not False and gso_supported(sock)
        self.calls = 0
        if self.mmsg:
            self._headers = _Headers(batch)
        if self.gso:
            self._control = np.zeros(1, GSO_CMSG_DTYPE)
            self._control[0] = (GSO_CMSG_LEN, SOL_UDP, UDP_SEGMENT, 0, b"")
            self._gso_headers = _Headers(batch, self._control)

    def send(self, buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        """Datagram i is buffer[starts[i]:ends[i]]."""
        if not len(starts):
            return
        if not self.mmsg:
            self._send_each(buffer, starts, ends)
            return
        buffer = np.ascontiguousarray(buffer, np.uint8)
        size = int(ends[0] - starts[0])
        if self.gso and len(starts) > 1 and 0 < size <= GSO_BYTES // 2 \
                and (starts[1:] == ends[:-1]).all() and (ends[:-1] - starts[:-1] == size).all() \
                and ends[-1] - starts[-1] <= size:
            self._send_segmented(buffer, starts, ends, size)
        else:
            self._sendmmsg(self._headers, buffer, starts, ends)

    def _send_segmented(self, buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                        size: int) -> None:
        per = min(GSO_SEGMENTS, GSO_BYTES // size)
        message_starts = starts[::per]
        message_ends = np.append(ends[per - 1::per], ends[-1]) if len(ends) % per \
            else ends[per - 1::per]
        self._control["size"] = size
        try:
            self._sendmmsg(self._gso_headers, buffer, message_starts, message_ends)
        except OSError as e:
            if e.errno not in GSO_FAILURES:
                raise
            # No GSO on this route (no checksum offload, say): the rest one by one.
            self.gso = False
            rest = self._progress * per
            self._sendmmsg(self._headers, buffer, starts[rest:], ends[rest:])

    def _sendmmsg(self, headers: _Headers, buffer: np.ndarray, starts: np.ndarray,
                  ends: np.ndarray) -> None:
        """Every message; `_progress` counts those sent (where an error stopped it)."""
        base = np.uint64(buffer.ctypes.data)
        assert MMSG is not None  # self.mmsg: libc has them
        sendmmsg, fd = MMSG[0], self.sock.fileno()
        self._progress = 0
        for first in range(0, len(starts), self.batch):
            chunk_starts = starts[first:first + self.batch]
            n = len(chunk_starts)
            headers.iovs["base"][:n] = base + chunk_starts.astype(np.uint64)
            headers.iovs["len"][:n] = ends[first:first + n] - chunk_starts
            done, waits = 0, 0
            while done < n:
                sent = sendmmsg(fd, headers.address + done * MMSGHDR_DTYPE.itemsize,
                                n - done, 0)
                self.calls += 1
                if sent >= 0:
                    done += sent
                    self._progress += sent
                    continue
                code = ctypes.get_errno()
                if code in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS) \
                        and waits < SEND_WAITS:
                    waits += 1
                    _wait_writable(self.sock)
                elif code != errno.EINTR:
                    raise _error(code)

    def _send_each(self, buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        view, send = np.ascontiguousarray(buffer, np.uint8).data, self.sock.send
        for begin, end in zip(starts.tolist(), ends.tolist()):
            for wait in range(SEND_WAITS + 1):
                try:
                    send(view[begin:end])
                    break
                except BlockingIOError:
                    if wait == SEND_WAITS:
                        raise
                    _wait_writable(self.sock)
            self.calls += 1


class DatagramReceiver:
    """Receives datagrams into one preallocated uint8 buffer, never blocking: datagram i of
    the last `receive` at `offsets[i]`, `lengths[i]` bytes, i < `count`.

    With recvmmsg: up to `slots` datagram slots of `stride` bytes per call, or, with UDP
    GRO (`use_gro`, where the kernel has it), up to `slots // 4` (at least 16) slots of
    64 KiB, each holding one datagram or a run of datagrams of one size that the kernel
    kept together (a GSO message on loopback), split here by the segment size it reports.
    Else one `recv_into` per datagram into `slots` slots of `stride` bytes. Longer
    datagrams are truncated to `stride` bytes (as recv_into does)."""

    def __init__(self, sock: socket.socket, slots: int, stride: int,
                 use_mmsg: bool | None = None, use_gro: bool | None = None):
        self.sock = sock
        self.mmsg = HAVE_MMSG if use_mmsg is None else (use_mmsg and HAVE_MMSG)
        self.gro = _enable_gro(sock, self.mmsg and use_gro is not False)
        if self.gro:
            slots, stride = max(16, slots // 4), GRO_STRIDE
        self.slots, self.stride = slots, stride
        self.buffer = np.zeros(slots * stride, np.uint8)
        self._slot_offsets = np.arange(slots, dtype=np.int64) * stride
        self._slot_lengths = np.zeros(slots, np.int64)
        self.offsets, self.lengths = self._slot_offsets, self._slot_lengths
        self.count = 0
        self.calls = 0
        if self.mmsg:
            self._headers = _Headers(slots)
            self._headers.iovs["base"] = self.buffer.ctypes.data + \
                self._slot_offsets.astype(np.uint64)
            self._headers.iovs["len"] = stride
            if self.gro:
                self._control = np.zeros(slots, GRO_CMSG_DTYPE)
                self._headers.msgs["control"] = self._control.ctypes.data + \
                    np.arange(slots, dtype=np.uint64) * np.uint64(GRO_CMSG_DTYPE.itemsize)
        else:
            self._view = self.buffer.data

    def receive(self) -> int:
        """The datagrams waiting on the socket (as many as fit); returns `count` (0: none
        waiting, or a pending ICMP error such as connection refused was consumed)."""
        self.count = self._receive_mmsg() if self.mmsg else self._receive_each()
        return self.count

    def _receive_mmsg(self) -> int:
        headers = self._headers
        assert MMSG is not None  # self.mmsg: libc has them
        for _ in range(8):  # EINTR retries
            if self.gro:
                headers.msgs["controllen"] = GRO_CMSG_DTYPE.itemsize
            got = MMSG[1](self.sock.fileno(), headers.address, self.slots, MSG_DONTWAIT, None)
            self.calls += 1
            if got >= 0:
                self._slot_lengths[:got] = headers.msgs["len"][:got]
                self.offsets, self.lengths = self._slot_offsets, self._slot_lengths
                return self._split(got) if self.gro else got
            code = ctypes.get_errno()
            if code in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ECONNREFUSED):
                return 0
            if code != errno.EINTR:
                raise _error(code)
        return 0

    def _split(self, got: int) -> int:
        """Per-datagram offsets and lengths of `got` slots, some holding runs of datagrams
        of the segment size in their UDP_GRO control message."""
        lengths = self._slot_lengths[:got]
        control = self._control[:got]
        coalesced = (self._headers.msgs["controllen"][:got] >= GRO_CMSG_LEN) & \
            (control["level"] == SOL_UDP) & (control["type"] == UDP_GRO) & (control["size"] > 0)
        size = np.where(coalesced, control["size"], np.maximum(lengths, 1)).astype(np.int64)
        counts = np.maximum(1, -(-lengths // size))
        if (counts == 1).all():
            return got
        total = int(counts.sum())
        slot = np.repeat(np.arange(got), counts)
        index = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        segment = size[slot]
        self.offsets = self._slot_offsets[slot] + index * segment
        self.lengths = np.minimum(segment, lengths[slot] - index * segment)
        return total

    def _receive_each(self) -> int:
        view, recv_into, stride = self._view, self.sock.recv_into, self.stride
        n = 0
        try:
            while n < self.slots:
                self.lengths[n] = recv_into(view[n * stride:(n + 1) * stride], stride,
                                            MSG_DONTWAIT)
                self.calls += 1
                n += 1
        except (BlockingIOError, ConnectionRefusedError):
            pass
        return n

    def datagram(self, i: int) -> memoryview:
        at = int(self.offsets[i])
        return self.buffer.data[at:at + int(self.lengths[i])]
