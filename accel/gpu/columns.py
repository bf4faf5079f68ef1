"""Per-type columns of the GPU SEQ engine: for each channel (an event type the query reads)
one arena of rings, a ring per partition (see `host_kernels`), kept in host memory and
mirrored in device memory, where new rows are copied asynchronously on a CUDA stream.

Host-resident mode (device memory short): there is no device mirror; `device_arrays()`
copies the whole arena to the device when a batch has terminators to evaluate.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from cep_accel.gpu import device
from cep_accel.gpu.host_kernels import append_rows, lower_bounds

INITIAL_RING = 64


class Residence(StrEnum):
    """Where a channel's columns live: mirrored on the device, or on the host only."""

    DEVICE = "device"
    HOST = "host"


class ChannelRings:
    def __init__(self, n_int: int, n_float: int, resident: str):
        self.n_int, self.n_float = n_int, n_float
        self.resident = Residence(resident)
        self.P = 0
        self.base = np.zeros(0, np.int64)
        self.cap = np.zeros(0, np.int64)
        self.start = np.zeros(0, np.int64)
        self.count = np.zeros(0, np.int64)
        self.HI = np.zeros((0, n_int), np.int64)
        self.HF = np.zeros((0, n_float), np.float64)
        self.DI = self.DF = None
        self.stale = True  # the device mirror needs a full copy
        self.dirty: list[tuple[int, int]] = []  # arena slot ranges changed since the copy

    def nbytes(self) -> int:
        return self.HI.nbytes + self.HF.nbytes

    def grow_partitions(self, P: int) -> None:
        if P <= self.P:
            return
        extra = P - self.P
        top = len(self.HI)
        self.base = np.concatenate([self.base, top + INITIAL_RING * np.arange(extra)])
        self.cap = np.concatenate([self.cap, np.full(extra, INITIAL_RING, np.int64)])
        self.start = np.concatenate([self.start, np.zeros(extra, np.int64)])
        self.count = np.concatenate([self.count, np.zeros(extra, np.int64)])
        self.HI = np.concatenate([self.HI, np.zeros((extra * INITIAL_RING, self.n_int),
                                                    np.int64)])
        self.HF = np.concatenate([self.HF, np.zeros((extra * INITIAL_RING, self.n_float))])
        self.P = P
        self.stale = True

    # ------------------------------------------------------------ appending

    def append(self, pid: np.ndarray, EI: np.ndarray, EF: np.ndarray, rows: np.ndarray,
               absrow: np.ndarray,
               threshold: np.ndarray | None) -> None:
        """Appends events `rows` (batch positions, in order) to their partitions' rings;
        a full ring first drops its rows with ts < threshold[p], then doubles."""
        before = self.count.copy()
        at = 0
        while at < len(rows):
            at = append_rows(self.HI, self.HF, self.base, self.cap, self.start, self.count,
                             pid, EI, EF, rows, at, absrow)
            if at < len(rows):
                self._make_room(int(pid[rows[at]]), threshold)
        if not self.stale:
            for p in np.flatnonzero(self.count != before).tolist():
                self._mark(p, int(before[p]), int(self.count[p]))

    def _mark(self, p: int, lo: int, hi: int) -> None:
        cap, base = int(self.cap[p]), int(self.base[p])
        a, b = lo % cap, (hi - 1) % cap + 1
        if hi - lo >= cap or a >= b:
            self.dirty.append((base, base + cap))
        else:
            self.dirty.append((base + a, base + b))

    def _make_room(self, p: int, threshold: np.ndarray | None) -> None:
        if threshold is not None:
            out = np.zeros(1, np.int64)
            lower_bounds(self.HI, 1, self.base, self.cap, self.start, self.count,
                         np.array([p]), threshold[p:p + 1], out)
            if out[0] > self.start[p]:
                self.start[p] = out[0]
                return
        self._regrow(p, 2 * int(self.cap[p]))

    def _regrow(self, p: int, new_cap: int) -> None:
        """Moves partition p's ring to a new segment of new_cap rows at the arena's end."""
        rows = np.arange(self.start[p], self.count[p])
        old = self.base[p] + rows % self.cap[p]
        top = len(self.HI)
        self.HI = np.concatenate([self.HI, np.zeros((new_cap, self.n_int), np.int64)])
        self.HF = np.concatenate([self.HF, np.zeros((new_cap, self.n_float))])
        self.HI[top + rows % new_cap] = self.HI[old]
        self.HF[top + rows % new_cap] = self.HF[old]
        self.base[p], self.cap[p] = top, new_cap
        self.stale = True
        self._compact_if_sparse()

    def _compact_if_sparse(self) -> None:
        used = int(self.cap.sum())
        if len(self.HI) <= 2 * used:
            return
        HI = np.zeros((used, self.n_int), np.int64)
        HF = np.zeros((used, self.n_float))
        top = 0
        for p in range(self.P):
            cap = int(self.cap[p])
            HI[top:top + cap] = self.HI[self.base[p]:self.base[p] + cap]
            HF[top:top + cap] = self.HF[self.base[p]:self.base[p] + cap]
            self.base[p] = top
            top += cap
        self.HI, self.HF = HI, HF

    # ------------------------------------------------------------ device side

    def sync(self, stream: Any) -> None:
        """Copies what changed to the device mirror (asynchronously on `stream`)."""
        if self.resident is not Residence.DEVICE:
            return
        cuda = device.cuda()
        if self.stale or self.DI is None:
            self.DI = cuda.to_device(self.HI, stream=stream)
            self.DF = cuda.to_device(self.HF, stream=stream)
        else:
            for lo, hi in self.dirty:
                self.DI[lo:hi].copy_to_device(self.HI[lo:hi], stream=stream)
                self.DF[lo:hi].copy_to_device(self.HF[lo:hi], stream=stream)
        self.stale = False
        self.dirty = []

    def device_arrays(self, stream: Any) -> tuple[Any, Any]:
        """(int arena, float arena) on the device for a kernel launch."""
        if self.resident is Residence.DEVICE:
            self.sync(stream)
            return self.DI, self.DF
        cuda = device.cuda()
        return cuda.to_device(self.HI, stream=stream), cuda.to_device(self.HF, stream=stream)

    def drop_device(self) -> None:
        """Switches to host-resident columns (device memory ran short)."""
        self.resident = Residence.HOST
        self.DI = self.DF = None

    # ------------------------------------------------------------ host reads

    def lower_bound(self, col: int, parts: np.ndarray, keys: np.ndarray) -> np.ndarray:
        out = np.empty(len(parts), np.int64)
        lower_bounds(self.HI, col, self.base, self.cap, self.start, self.count,
                     parts.astype(np.int64), keys.astype(np.int64), out)
        return out

    def slots(self, parts: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return self.base[parts] + rows % self.cap[parts]

    def kept(self, p: int) -> tuple[np.ndarray, np.ndarray]:
        slots = self.slots(np.full(int(self.count[p] - self.start[p]), p),
                           np.arange(self.start[p], self.count[p]))
        return self.HI[slots], self.HF[slots]

    def load(self, starts: ArrayLike, counts: ArrayLike, rows_i: np.ndarray,
             rows_f: np.ndarray) -> None:
        """Rebuilds the rings from a snapshot: per partition, rows start..count."""
        self.start = np.asarray(starts, np.int64).copy()
        self.count = np.asarray(counts, np.int64).copy()
        kept = self.count - self.start
        self.cap = np.maximum(INITIAL_RING, 1 << np.ceil(np.log2(np.maximum(kept, 1)))
                              .astype(np.int64) + 1)
        self.base = np.concatenate([[0], np.cumsum(self.cap)[:-1]]).astype(np.int64)
        self.P = len(self.start)
        self.HI = np.zeros((int(self.cap.sum()), self.n_int), np.int64)
        self.HF = np.zeros((int(self.cap.sum()), self.n_float))
        offset = 0
        for p in range(self.P):
            k = int(kept[p])
            slots = self.slots(np.full(k, p), np.arange(self.start[p], self.count[p]))
            self.HI[slots] = rows_i[offset:offset + k]
            self.HF[slots] = rows_f[offset:offset + k]
            offset += k
        self.stale = True
