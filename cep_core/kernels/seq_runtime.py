"""Jitted helpers every generated SEQ kernel module shares (compiled once per process and
kept in numba's on-disk cache): binary searches over a channel's rows, growing output
buffers, the per-channel arenas that hold each partition's rows, pending-table compaction.

Channel arena: `AI` (int64 rows: seq, ts, int-like attributes) and `AF` (float64 rows) hold
the rows of every partition; partition p's rows are `AI[base[p, c] : base[p, c] + cnt[p, c]]`
inside a segment of `size[p, c]` rows. A full segment first evicts the rows older than the
threshold (`evicted[p, c]` counts them), then moves to a segment twice as large at the
arena's top `top[c]`; a full arena is copied, compacted, into a larger one.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Rows = npt.NDArray[np.generic]  # a buffer of any dtype (the grow_* helpers keep it)

RUNTIME_VERSION = 3  # bump when a signature or a behaviour here changes


SEQ, TS = 0, 1  # the first two columns of a channel's int64 rows


@njit(cache=True)
def first_row(A: I64, col: int, x: int, strict: bool) -> int:
    """First row whose column `col` is > x (`strict`) or >= x; rows sorted on `col`."""
    lo = 0
    hi = A.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        v = A[mid, col]
        if v < x or (strict and v == x):
            lo = mid + 1
        else:
            hi = mid
    return lo


# Deliberately like cep_core/kernels/seq_runtime.py's lb_ts to ub_seq (each other): one-line numba
# entry points over first_row, named for their call sites
@njit(cache=True)
def lb_ts(A: I64, x: int) -> int:
    """First row with ts >= x."""
    return first_row(A, TS, x, False)


@njit(cache=True)
def ub_ts(A: I64, x: int) -> int:
    """First row with ts > x."""
    return first_row(A, TS, x, True)


@njit(cache=True)
def lb_seq(A: I64, x: int) -> int:
    """First row with seq >= x."""
    return first_row(A, SEQ, x, False)


@njit(cache=True)
def ub_seq(A: I64, x: int) -> int:
    """First row with seq > x."""
    return first_row(A, SEQ, x, True)


@njit(cache=True)
def grow_rows(a: Rows, need: int) -> Rows:
    size = max(2 * a.shape[0], need, 16)
    b = np.empty((size, a.shape[1]), a.dtype)
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            b[i, j] = a[i, j]
    return b


@njit(cache=True)
def grow_1d(a: Rows, need: int) -> Rows:
    size = max(2 * a.shape[0], need, 16)
    b = np.empty(size, a.dtype)
    for i in range(a.shape[0]):
        b[i] = a[i]
    return b


@njit(cache=True)
def grow_out(om: Rows, ovi: Rows, ovf: Rows, ovn: Rows, need: int
             ) -> tuple[Rows, Rows, Rows, Rows]:
    return grow_rows(om, need), grow_rows(ovi, need), grow_rows(ovf, need), \
        grow_rows(ovn, need)


@njit(cache=True)
def grow_el(oe_i: Rows, oe_f: Rows, need: int) -> tuple[Rows, Rows]:
    return grow_rows(oe_i, need), grow_rows(oe_f, need)


@njit(cache=True)
def _regrow(AI: I64, AF: F64, base: I64, size: I64, cnt: I64, evicted: I64, top: I64, c: int,
            need: int, keep_from: I64) -> tuple[I64, F64]:
    """A larger arena for channel c, compacted, with room for `need` more rows at its top.
    Rows older than `keep_from[q]` (the eviction threshold of partition q) are dropped on
    the way; a partition left with no rows gives up its segment."""
    live = 0
    for q in range(base.shape[0]):
        live += size[q, c]
    cap = max(2 * (live + need), 64)
    NI = np.empty((cap, AI.shape[1]), np.int64)
    NF = np.empty((cap, AF.shape[1]), np.float64)
    at = 0
    for q in range(base.shape[0]):
        if size[q, c] == 0:
            continue
        b = base[q, c]
        k = cnt[q, c]
        d = 0
        while d < k and AI[b + d, 1] < keep_from[q]:
            d += 1
        for r in range(k - d):
            for z in range(AI.shape[1]):
                NI[at + r, z] = AI[b + r + d, z]
            for z in range(AF.shape[1]):
                NF[at + r, z] = AF[b + r + d, z]
        cnt[q, c] = k - d
        evicted[q, c] += d
        if k - d == 0:
            base[q, c] = 0
            size[q, c] = 0
            continue
        base[q, c] = at
        at += size[q, c]
    top[c] = at
    return NI, NF


@njit(cache=True)
def append_row(AI: I64, AF: F64, base: I64, size: I64, cnt: I64, evicted: I64, top: I64,
               p: int, c: int, EI: I64, EF: F64, t: int, thr: int, evict: int,
               last_ts: I64, pfirst: I64, horizon: int) -> tuple[I64, F64]:
    """Append event t of the batch to partition p's rows in channel c; returns the
    (possibly reallocated) arena. `thr`: rows of p older than it are no longer needed
    (when `evict`); other partitions' thresholds come from last_ts, pfirst and horizon."""
    k = cnt[p, c]
    if k == size[p, c]:
        b = base[p, c]
        if evict != 0 and k > 0:
            lo = 0
            hi = k
            while lo < hi:
                mid = (lo + hi) >> 1
                if AI[b + mid, 1] < thr:
                    lo = mid + 1
                else:
                    hi = mid
            d = lo
            if d > 0:
                for r in range(k - d):
                    for z in range(AI.shape[1]):
                        AI[b + r, z] = AI[b + r + d, z]
                    for z in range(AF.shape[1]):
                        AF[b + r, z] = AF[b + r + d, z]
                k -= d
                evicted[p, c] += d
                cnt[p, c] = k
        if size[p, c] == 0 or 2 * k > size[p, c]:
            new = max(2 * size[p, c], 8)
            if top[c] + new > AI.shape[0]:
                keep_from = np.empty(base.shape[0], np.int64)
                for q in range(base.shape[0]):
                    keep_from[q] = -(2 ** 62)
                    if evict != 0 and q != p:
                        keep_from[q] = min(last_ts[q], pfirst[q]) - horizon
                AI, AF = _regrow(AI, AF, base, size, cnt, evicted, top, c, new, keep_from)
                b = base[p, c]
                if size[p, c] == 0:  # (p's rows are never dropped here)
                    b = 0
            nb = top[c]
            for r in range(k):
                for z in range(AI.shape[1]):
                    AI[nb + r, z] = AI[b + r, z]
                for z in range(AF.shape[1]):
                    AF[nb + r, z] = AF[b + r, z]
            top[c] = nb + new
            base[p, c] = nb
            size[p, c] = new
    b = base[p, c]
    for z in range(AI.shape[1]):
        AI[b + k, z] = EI[t, z]
    for z in range(AF.shape[1]):
        AF[b + k, z] = EF[t, z]
    cnt[p, c] = k + 1
    return AI, AF


@njit(cache=True)
def compact_pending(pd: I64, pk: I64, phead: I64, ptail: I64, ctr: I64, kslots: I64,
                    n_alive: int, n_kleene: int) -> tuple[I64, I64]:
    """Copy the live pending records (each partition's list in order) to new arrays;
    `kslots` are the record columns holding (offset, count) of Kleene rows in `pk`."""
    npd = np.empty((max(2 * n_alive, 16), pd.shape[1]), np.int64)
    npk = np.empty(max(2 * n_kleene, 16), np.int64)
    m = 0
    mk = 0
    for p in range(phead.shape[0]):
        rec = phead[p]
        prev = -1
        while rec >= 0:
            for q in range(pd.shape[1]):
                npd[m, q] = pd[rec, q]
            for s in kslots:
                npd[m, s] = mk
                for j in range(pd[rec, s + 1]):
                    npk[mk] = pk[pd[rec, s] + j]
                    mk += 1
            if prev >= 0:
                npd[prev, 3] = m
            else:
                phead[p] = m
            prev = m
            rec = pd[rec, 3]
            m += 1
        if prev >= 0:
            npd[prev, 3] = -1
        ptail[p] = prev
    ctr[0] = m
    ctr[1] = mk
    return npd, npk
