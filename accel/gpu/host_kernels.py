"""Host-side jitted helpers of the GPU engines: the event-time check (the FPGA adapter's
too), appends to the per-partition column rings, and binary searches for window bounds
over a ring.

A ring of channel c and partition p is `cap[p]` rows of the channel's arena from
`base[p]`; absolute row r (rows are numbered from the partition's first event of that
channel) lives at `base[p] + r % cap[p]`; rows `start[p] .. count[p]` are kept.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from numba import njit


@njit(cache=True)
def accept_in_time(pid: NDArray[np.int64], ts: NDArray[np.int64],
                   last_ts: NDArray[np.int64]) -> NDArray[np.bool_]:
    """ok[t]: event t's time is not behind its partition's latest; updates last_ts."""
    ok = np.empty(pid.shape[0], np.bool_)
    for t in range(pid.shape[0]):
        p = pid[t]
        if ts[t] < last_ts[p]:
            ok[t] = False
        else:
            ok[t] = True
            last_ts[p] = ts[t]
    return ok


@njit(cache=True)
def append_rows(HI: NDArray[np.int64], HF: NDArray[np.float64], base: NDArray[np.int64],
                cap: NDArray[np.int64], start: NDArray[np.int64], count: NDArray[np.int64],
                pid: NDArray[np.int64], EI: NDArray[np.int64], EF: NDArray[np.float64],
                rows: NDArray[np.int64], at: int, absrow: NDArray[np.int64]) -> int:
    """Appends events `rows[at:]` to their partitions' rings; stops at the first whose
    ring is full and returns its position in `rows` (len(rows) when all went in)."""
    for k in range(at, rows.shape[0]):
        t = rows[k]
        p = pid[t]
        if count[p] - start[p] >= cap[p]:
            return k
        slot = base[p] + count[p] % cap[p]
        for q in range(EI.shape[1]):
            HI[slot, q] = EI[t, q]
        for q in range(EF.shape[1]):
            HF[slot, q] = EF[t, q]
        absrow[t] = count[p]
        count[p] += 1
    return rows.shape[0]


@njit(cache=True)
def lower_bounds(HI: NDArray[np.int64], col: int, base: NDArray[np.int64],
                 cap: NDArray[np.int64], start: NDArray[np.int64], count: NDArray[np.int64],
                 parts: NDArray[np.int64], keys: NDArray[np.int64], out: NDArray[np.int64]) -> None:
    """out[s]: the first kept row of partition parts[s] whose column `col` (0: seq, 1: ts)
    is >= keys[s]."""
    for s in range(parts.shape[0]):
        p = parts[s]
        lo = start[p]
        hi = count[p]
        while lo < hi:
            mid = (lo + hi) >> 1
            if HI[base[p] + mid % cap[p], col] < keys[s]:
                lo = mid + 1
            else:
                hi = mid
        out[s] = lo


@njit(cache=True)
def gather(H: np.ndarray, base: NDArray[np.int64], cap: NDArray[np.int64],
           parts: NDArray[np.int64], rows: NDArray[np.int64], out: np.ndarray) -> None:
    """out[s] = the ring row `rows[s]` of partition parts[s] (rows < 0: left as is)."""
    for s in range(parts.shape[0]):
        r = rows[s]
        if r >= 0:
            p = parts[s]
            out[s] = H[base[p] + r % cap[p]]
