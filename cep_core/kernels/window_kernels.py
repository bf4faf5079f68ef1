"""Numba kernels of the WINDOW engine: panes, window release, exact float sums.

One kernel (`run_query`) serves every WINDOW query: what differs between queries (window
kind, SLIDE, panes per window, aggregates and their columns, which predicate rows make up
the WHERE) is data, not code, so a query added at run time compiles nothing except its
WHERE predicates (see `cep_core/compiler/window.py`). The module is compiled once per
process and cached on disk by numba (`cache=True`).

Pane evaluation ("No pane, no gain"; CQPH). With SLIDE s and RANGE r = P * s, pane k of a
group holds its selected events with window time in ((k-1)*s, k*s] (count windows: rows
((k-1)*m, k*m]); window j (end j*s) is panes j-P+1 .. j. A pane-level step folds each
selected event into its (group, pane) partials at once; a window-level step combines the
P panes of a window when its end is passed. Each group keeps a ring of P pane slots
(slot k % P, tagged with k), so memory per group is bounded by the panes of one window.

Event time and release (identical to `cep_core/reference/window.py`):
- event time T is the largest window time seen (selected or not) or punctuation;
- a selected event whose first window (end ceil(t/s)*s) ends below T is late;
- windows whose end is below the new event time are released before the event is added
  (the event belongs to none of them), so the pane it goes to never overwrites a pane an
  unreleased window still needs;
- count windows: window j is released once a later row (or the chunk's end) is reached.

Per query, `st` holds the scalars (ST_* below), `cfg` the configuration (CF_*). `base` has
one row per (group, pane slot): tag (the pane number held), count, first and last seq.
Accumulators: `ist` (int64: min/max of ints or string codes, int sums), `fst` (float64:
float min/max), `xst` (exact float sums as XLIMBS signed 32-bit digits plus the range of
digits in use).

The kernel is resumable: it stops with NEED_GROUPS when a new group does not fit the state
arrays and with NEED_ROOM when the output buffer is full; `st[ST_POS]` is where to go on.

Speed notes: selected events are found 64 at a time (AND of the query's predicate bit
rows, then count-trailing-zeros); windows are released only when the first window holding
data ends below the clock (one comparison per event, no call); a query with one
accumulator of a kind runs it on hoisted locals. `mask_rows` evaluates many predicates on
one string attribute with one look-up per event and a 64 x 64 bit transpose.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from numba import njit

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
U8 = npt.NDArray[np.uint8]
F64 = npt.NDArray[np.float64]

if TYPE_CHECKING:
    # What numba's intrinsic is to numba code (its stub types a call from Python: Never).
    def _tz(m: np.uint64) -> np.uint64:
        """The number of trailing zero bits of m."""
        ...
else:
    try:  # count trailing zeros as one instruction
        from numba.cpython.unsafe.numbers import trailing_zeros as _tz
    except ImportError:  # pragma: no cover - older/newer numba without the intrinsic
        _DEBRUIJN = np.array([0, 1, 48, 2, 57, 49, 28, 3, 61, 58, 50, 42, 38, 29, 17, 4, 62,
                              55, 59, 36, 53, 51, 43, 22, 45, 39, 33, 30, 24, 18, 12, 5, 63,
                              47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21, 44, 32, 23, 11, 46,
                              26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9, 13, 8, 7, 6],
                             dtype=np.int64)

        @njit(cache=True)
        def _tz(m):
            return _DEBRUIJN[((m & (~m + np.uint64(1))) * np.uint64(0x03F79D71B4CB0A89))
                             >> np.uint64(58)]

I64_MIN = np.iinfo(np.int64).min
I64_MAX = np.iinfo(np.int64).max
NEG_INF = I64_MIN  # event time before any event
POS_INF = I64_MAX  # event time after flush()
NO_WINDOW = I64_MAX  # st[ST_NEXTJ] when no window holds data

# cfg
CF_MODE, CF_SLIDE, CF_PANES, CF_RANGE, CF_NCONJ = range(5)
CF_SIZE = 5
MODE_TIME, MODE_ROWS = 0, 1

# st
(ST_T, ST_R, ST_NEXTJ, ST_NACT, ST_ROW, ST_OUTN, ST_DLN, ST_POS, ST_NG,
 ST_NNEW) = range(10)
ST_SIZE = 10

# base columns
B_TAG, B_CNT, B_FSEQ, B_LSEQ = range(4)
B_SIZE = 4

# int accumulator kinds (ist); float ones (fst)
I_MIN, I_MAX, I_SMIN, I_SMAX, I_SUM = range(5)
F_MIN, F_MAX = range(2)

# kernel status
DONE, NEED_GROUPS, NEED_ROOM = range(3)

# out_i columns before the int accumulators
O_GROUP, O_WINDOW, O_COUNT, O_FSEQ, O_LSEQ = range(5)
O_SIZE = 5


class Output(StrEnum):
    """Where an output column of a WINDOW query comes from (the first field of each of
    its plan's `items`, cep_core/compiler/window.py; the engine reads them)."""

    COUNT = "count"  # the window's count
    INT = "int"  # an int accumulator (and its decode kind)
    FLOAT = "float"  # a float accumulator
    XSUM = "xsum"  # an exact float sum
    AVG_X = "avg_x"  # an exact float sum over the count
    AVG_INT = "avg_int"  # an int sum over the count
    KEY = "key"  # a GROUP BY attribute
    END = "end"  # the window attribute: the window's end

# ---------------------------------------------------------------- exact float sums
#
# A finite double is M * 2**E with M < 2**53 an integer and E >= -1126 (math.frexp's
# form); it is added as M shifted to bit E + XBIAS of a fixed-point number kept as XLIMBS
# signed int64 digits of 32 bits (bit 0 is 2**-1126; 2150 bits hold the largest double,
# two more digits hold carries). Digits may leave [0, 2**32) between normalisations; a
# pane is normalised every 2**28 additions so that no digit overflows. The sum is exact;
# `x_round` rounds it once, to nearest with ties to even: math.fsum's result.

XBIAS = 1126
XLIMBS = 70
XLO = XLIMBS  # index of the lowest digit in use
XHI = XLIMBS + 1  # index of the highest digit in use
XSIZE = XLIMBS + 2
XMASK = np.int64(0xFFFFFFFF)
XNORM_EVERY = (1 << 28) - 1


@njit(cache=True, inline="always")
def x_add(xst: I64, row: int, a: int, v: float) -> None:
    """Add the float v to the exact sum xst[row, a] (indexes, not a view: the per-event
    path makes no array views)."""
    if v == 0.0:
        return
    m, e = math.frexp(abs(v))
    mant = np.int64(m * 9007199254740992.0)
    p = e - 53 + XBIAS
    q = p >> 5
    r = p & 31
    a_ = (mant & XMASK) << r
    b = (mant >> 32) << r
    d0 = a_ & XMASK
    d1 = (a_ >> 32) + (b & XMASK)
    d2 = b >> 32
    if v < 0.0:
        d0, d1, d2 = -d0, -d1, -d2
    xst[row, a, q] += d0
    xst[row, a, q + 1] += d1
    xst[row, a, q + 2] += d2
    if q < xst[row, a, XLO]:
        xst[row, a, XLO] = q
    if q + 2 > xst[row, a, XHI]:
        xst[row, a, XHI] = q + 2


@njit(cache=True)
def x_normalize(x: I64) -> None:
    """Carry from the lowest digit in use up: digits in [0, 2**32), the top one signed."""
    lo = x[XLO]
    if lo > x[XHI]:
        return
    carry = np.int64(0)
    q = lo
    while q < XLIMBS - 1:
        v = x[q] + carry
        x[q] = v & XMASK
        carry = v >> 32
        q += 1
        if q > x[XHI] and carry == 0:
            break
    if q == XLIMBS - 1:
        x[q] += carry
    if q - 1 > x[XHI]:
        x[XHI] = q - 1
    if x[XLIMBS - 1] != 0 and x[XHI] < XLIMBS - 1:
        x[XHI] = XLIMBS - 1


@njit(cache=True)
def x_merge(acc: I64, x: I64) -> None:
    """acc += x (acc normalised before and after)."""
    lo, hi = x[XLO], x[XHI]
    if lo > hi:
        return
    for q in range(lo, hi + 1):
        acc[q] += x[q]
    if lo < acc[XLO]:
        acc[XLO] = lo
    if hi > acc[XHI]:
        acc[XHI] = hi
    x_normalize(acc)


@njit(cache=True)
def _bits(x: I64, pos: int, k: int) -> np.int64:
    """k <= 53 bits of a normalised non-negative number from bit `pos` up."""
    q = pos >> 5
    r = pos & 31
    v = np.uint64(x[q]) >> np.uint64(r)
    if q + 1 < XLIMBS:
        v |= np.uint64(x[q + 1]) << np.uint64(32 - r)
    if r > 0 and q + 2 < XLIMBS:
        v |= np.uint64(x[q + 2]) << np.uint64(64 - r)
    return np.int64(v & ((np.uint64(1) << np.uint64(k)) - np.uint64(1)))


@njit(cache=True)
def x_round(acc: I64) -> float:
    """The exact sum in `acc` rounded to the nearest float, ties to even (destroys acc)."""
    lo = acc[XLO]
    if lo > acc[XHI]:
        return 0.0
    acc[XHI] = XLIMBS - 1
    x_normalize(acc)
    sign = 1.0
    if acc[XLIMBS - 1] < 0:
        sign = -1.0
        for q in range(lo, XLIMBS):
            acc[q] = -acc[q]
        x_normalize(acc)
    h = XLIMBS - 1
    while h >= lo and acc[h] == 0:
        h -= 1
    if h < lo:
        return 0.0
    top = acc[h]
    nb = 0
    while top > 0:
        nb += 1
        top >>= 1
    length = 32 * h + nb  # bit length of the integer
    if length <= 53:
        v = np.int64(0)
        for q in range(h, lo - 1, -1):
            v = (v << 32) | acc[q]
        return sign * math.ldexp(float(v), 32 * lo - XBIAS)
    shift = length - 53
    mant = _bits(acc, shift, 53)
    half = _bits(acc, shift - 1, 1)
    if half:
        sticky = False
        sp = shift - 1
        q = sp >> 5
        r = sp & 31
        if r > 0 and (acc[q] & ((np.int64(1) << r) - 1)) != 0:
            sticky = True
        qq = lo
        while not sticky and qq < q:
            if acc[qq] != 0:
                sticky = True
            qq += 1
        if sticky or (mant & 1) == 1:
            mant += 1
    return sign * math.ldexp(float(mant), shift - XBIAS)


@njit(cache=True)
def exact_sum(values: F64) -> float:
    """math.fsum of an array (tests compare the two)."""
    x = np.zeros((1, 1, XSIZE), dtype=np.int64)
    x[0, 0, XLO] = XLIMBS
    x[0, 0, XHI] = -1
    for i in range(values.shape[0]):
        x_add(x, 0, 0, values[i])
        if (i & XNORM_EVERY) == XNORM_EVERY:
            x_normalize(x[0, 0])
    return x_round(x[0, 0])


# ---------------------------------------------------------------- small batch kernels


@njit(cache=True)
def prefix_max(wt: I64, out: I64) -> None:
    """out[i] = max(wt[:i]) (NEG_INF for i = 0), for i in 0..n."""
    cur = NEG_INF
    out[0] = cur
    for i in range(wt.shape[0]):
        v = wt[i]
        if v > cur:
            cur = v
        out[i + 1] = cur


@njit(cache=True)
def table_bits(out: U64, table: U8, codes: I64) -> None:
    """Predicate bits of a predicate on one dictionary-coded attribute: table[code]."""
    n = codes.shape[0]
    nw = (n + 63) >> 6
    for w in range(nw):
        base = w << 6
        lim = min(64, n - base)
        m = np.uint64(0)
        for b in range(lim):
            m |= np.uint64(table[codes[base + b]]) << np.uint64(b)
        out[w] = m


@njit(cache=True)
def transpose64(a: U64) -> None:
    """In place: bit c of a[r] becomes bit r of a[c] (a 64 x 64 bit matrix)."""
    j = 32
    m = np.uint64(0x00000000FFFFFFFF)
    while j != 0:
        k = 0
        while k < 64:
            t = ((a[k] >> np.uint64(j)) ^ a[k + j]) & m
            a[k + j] ^= t
            a[k] ^= t << np.uint64(j)
            k = (k + j + 1) & ~j
        j >>= 1
        m ^= m << np.uint64(j)


@njit(cache=True)
def mask_rows(pv: U64, rows: I64, masks: U64, codes: I64) -> None:
    """Predicate bits of many predicates on one dictionary-coded attribute at once.

    masks[code, p >> 6] has bit p & 63 set when predicate p holds for the code; the bit
    rows pv[rows[p]] are filled 64 events x 64 predicates at a time (one look-up per
    event and word of predicates, then a bit-matrix transpose)."""
    n = codes.shape[0]
    npred = rows.shape[0]
    a = np.zeros(64, dtype=np.uint64)
    for w in range((n + 63) >> 6):
        first = w << 6
        lim = min(64, n - first)
        for group in range(masks.shape[1]):
            for e in range(lim):
                a[e] = masks[codes[first + e], group]
            for e in range(lim, 64):
                a[e] = 0
            transpose64(a)
            for p in range(min(64, npred - (group << 6))):
                pv[rows[(group << 6) + p], w] = a[p]


@njit(cache=True)
def unpack_bits(words: U64, n: int, out: U8) -> None:
    for i in range(n):
        out[i] = (words[i >> 6] >> np.uint64(i & 63)) & np.uint64(1)


# ---------------------------------------------------------------- windows


@njit(cache=True)
def _emit(g: int, j: int, cfg: I64, st: I64, base: I64, ist: I64, fst: F64, xst: I64,
          ikind: I64, fkind: I64, s_rank: I64, lastpane: I64, out_i: I64, out_f: F64,
          acc: I64) -> None:
    """One result row: group g, window j, its panes combined."""
    P = cfg[CF_PANES]
    ni = ist.shape[1]
    nf = fst.shape[1]
    nx = xst.shape[1]
    r = st[ST_OUTN]
    st[ST_OUTN] = r + 1
    count = np.int64(0)
    fseq = np.int64(0)
    lseq = np.int64(0)
    first = True
    top = min(j, lastpane[g])
    for q in range(j - P + 1, top + 1):
        row = g * P + q % P
        if base[row, B_TAG] != q:
            continue
        if first:
            fseq = base[row, B_FSEQ]
            for a in range(ni):
                out_i[r, O_SIZE + a] = ist[row, a]
            for a in range(nf):
                out_f[r, a] = fst[row, a]
            first = False
        else:
            for a in range(ni):
                v = ist[row, a]
                k = ikind[a]
                cur = out_i[r, O_SIZE + a]
                if k == I_MAX:
                    if v > cur:
                        out_i[r, O_SIZE + a] = v
                elif k == I_MIN:
                    if v < cur:
                        out_i[r, O_SIZE + a] = v
                elif k == I_SUM:
                    out_i[r, O_SIZE + a] = cur + v
                elif k == I_SMAX:
                    if s_rank[v] > s_rank[cur]:
                        out_i[r, O_SIZE + a] = v
                else:
                    if s_rank[v] < s_rank[cur]:
                        out_i[r, O_SIZE + a] = v
            for a in range(nf):
                v = fst[row, a]
                if fkind[a] == F_MAX:
                    if v > out_f[r, a]:
                        out_f[r, a] = v
                elif v < out_f[r, a]:
                    out_f[r, a] = v
        lseq = base[row, B_LSEQ]
        count += base[row, B_CNT]
    for a in range(nx):
        acc[:] = 0
        acc[XLO] = XLIMBS
        acc[XHI] = -1
        for q in range(j - P + 1, top + 1):
            row = g * P + q % P
            if base[row, B_TAG] == q:
                x_merge(acc, xst[row, a])
        out_f[r, nf + a] = x_round(acc)
    out_i[r, O_GROUP] = g
    out_i[r, O_WINDOW] = j
    out_i[r, O_COUNT] = count
    out_i[r, O_FSEQ] = fseq
    out_i[r, O_LSEQ] = lseq


@njit(cache=True)
def _release(clock: int, cfg: I64, st: I64, base: I64, ist: I64, fst: F64, xst: I64,
             ikind: I64, fkind: I64, s_rank: I64, lastpane: I64, isact: U8, active: I64,
             out_i: I64, out_f: F64, acc: I64) -> bool:
    """Release every window holding data whose end is below `clock`, in end order.
    False when the output buffer is full (call again after draining it)."""
    s = cfg[CF_SLIDE]
    P = cfg[CF_PANES]
    while st[ST_NACT] > 0:
        j = st[ST_NEXTJ]
        if j * s >= clock:
            break
        na = st[ST_NACT]
        if st[ST_OUTN] + na > out_i.shape[0]:
            return False
        for a in range(na):
            _emit(active[a], j, cfg, st, base, ist, fst, xst, ikind, fkind, s_rank,
                  lastpane, out_i, out_f, acc)
        st[ST_NEXTJ] = j + 1
        keep = 0
        for a in range(na):  # groups with data in a later window stay active
            g = active[a]
            if lastpane[g] + P - 1 > j:
                active[keep] = g
                keep += 1
            else:
                isact[g] = 0
        st[ST_NACT] = keep
    if st[ST_NACT] == 0:
        st[ST_NEXTJ] = NO_WINDOW
    if clock > st[ST_R]:
        st[ST_R] = clock
    return True


@njit(cache=True, inline="always")
def _fold_int(kind: int, cur: int, v: int, s_rank: I64) -> int:
    """An int accumulator (min, max, sum of ints; min, max of string codes) takes v."""
    if kind == I_MAX:
        return v if v > cur else cur
    if kind == I_MIN:
        return v if v < cur else cur
    if kind == I_SUM:
        return cur + v
    if kind == I_SMAX:
        return v if s_rank[v] > s_rank[cur] else cur
    return v if s_rank[v] < s_rank[cur] else cur


@njit(cache=True)
def run_query(cfg: I64, st: I64, pv: U64, crow: I64, start: int, n: int, wt: I64, pmx: I64,
              seq: I64, kid: I64, loc: I64, imat: I64, fmat: F64, s_rank: I64, ikind: I64,
              icol: I64, fkind: I64, fcol: I64, xcol: I64, base: I64, ist: I64, fst: F64,
              xst: I64, lastpane: I64, isact: U8, active: I64, newk: I64, out_i: I64,
              out_f: F64, dl: I64) -> int:
    """Fold events start..n-1 of a chunk into one query's panes and release its windows.

    `pv[crow[c]]` are the bit rows (64 events a word) of the query's WHERE conjuncts;
    `wt` the window times and `pmx` their prefix maxima (time windows); `kid` the event's
    key id and `loc[kid]` the query's group for it (-1: new, assigned here and listed in
    `newk`). Late events' chunk positions go to `dl`. Returns DONE, NEED_GROUPS or
    NEED_ROOM (st[ST_POS]: where to go on)."""
    mode = cfg[CF_MODE]
    s = cfg[CF_SLIDE]
    P = cfg[CF_PANES]
    nconj = cfg[CF_NCONJ]
    ni = ist.shape[1]
    nf = fst.shape[1]
    nx = xst.shape[1]
    gcap = lastpane.shape[0]
    acc = np.zeros(XSIZE, dtype=np.int64)
    t0 = st[ST_T]
    row0 = st[ST_ROW]
    ones = ~np.uint64(0)
    nw = (n + 63) >> 6
    w = start >> 6
    lo = np.int64(I64_MAX)  # the pane last computed covers (lo, hi]
    hi = np.int64(I64_MIN)
    k = np.int64(0)
    slot = np.int64(0)
    ikind0, icol0 = ikind[0], icol[0]
    fmax0, fcol0 = fkind[0] == F_MAX, fcol[0]
    while w < nw:
        m = ones
        for c in range(nconj):
            m &= pv[crow[c], w]
        if w == nw - 1 and (n & 63) != 0:
            m &= (np.uint64(1) << np.uint64(n & 63)) - np.uint64(1)
        if w == (start >> 6) and (start & 63) != 0:
            m &= ~((np.uint64(1) << np.uint64(start & 63)) - np.uint64(1))
        while m != 0:
            b = _tz(m)
            m &= m - np.uint64(1)
            i = (w << 6) + np.int64(b)
            if mode == MODE_TIME:
                t = wt[i]
                if t > hi or t <= lo:
                    k = -((-t) // s)
                    hi = k * s
                    lo = hi - s
                    slot = k % P
                tb = pmx[i]
                if t0 > tb:
                    tb = t0
                if hi < tb:  # its first window has been released: late
                    dl[st[ST_DLN]] = i
                    st[ST_DLN] += 1
                    continue
                clock = t if t > tb else tb
            else:
                t = row0 + i + 1
                if t > hi or t <= lo:
                    k = (t + s - 1) // s
                    hi = k * s
                    lo = hi - s
                    slot = k % P
                clock = t
            if clock > st[ST_R]:
                # A window is due when the first one holding data ends below the clock.
                if st[ST_NACT] > 0 and st[ST_NEXTJ] * s < clock:
                    if not _release(clock, cfg, st, base, ist, fst, xst, ikind, fkind, s_rank,
                                    lastpane, isact, active, out_i, out_f, acc):
                        st[ST_POS] = i
                        return NEED_ROOM
                st[ST_R] = clock
            key = kid[i]
            g = loc[key]
            if g < 0:
                g = st[ST_NG]
                if g >= gcap:
                    st[ST_POS] = i
                    return NEED_GROUPS
                st[ST_NG] = g + 1
                loc[key] = g
                newk[st[ST_NNEW]] = key
                st[ST_NNEW] += 1
                isact[g] = 0
            row = g * P + slot
            if base[row, B_TAG] != k:
                base[row, B_TAG] = k
                base[row, B_CNT] = 0
                for a in range(nx):
                    for q in range(xst[row, a, XLO], xst[row, a, XHI] + 1):
                        xst[row, a, q] = 0
                    xst[row, a, XLO] = XLIMBS
                    xst[row, a, XHI] = -1
            cnt = base[row, B_CNT] + 1
            base[row, B_CNT] = cnt
            sq = seq[i]
            base[row, B_LSEQ] = sq
            if cnt == 1:
                base[row, B_FSEQ] = sq
                for a in range(ni):
                    ist[row, a] = imat[icol[a], i]
                for a in range(nf):
                    fst[row, a] = fmat[fcol[a], i]
            else:
                # One accumulator of a kind (the common case) runs on hoisted locals.
                if ni == 1:
                    ist[row, 0] = _fold_int(ikind0, ist[row, 0], imat[icol0, i], s_rank)
                else:
                    for a in range(ni):
                        ist[row, a] = _fold_int(ikind[a], ist[row, a], imat[icol[a], i],
                                                s_rank)
                if nf == 1:
                    v = fmat[fcol0, i]
                    if (v > fst[row, 0]) if fmax0 else (v < fst[row, 0]):
                        fst[row, 0] = v
                else:
                    for a in range(nf):
                        v = fmat[fcol[a], i]
                        if (v > fst[row, a]) if fkind[a] == F_MAX else (v < fst[row, a]):
                            fst[row, a] = v
            for a in range(nx):
                x_add(xst, row, a, fmat[xcol[a], i])
                if (cnt & XNORM_EVERY) == 0:
                    x_normalize(xst[row, a])
            if isact[g] == 0:
                isact[g] = 1
                na = st[ST_NACT]
                active[na] = g
                st[ST_NACT] = na + 1
                if na == 0 or k < st[ST_NEXTJ]:
                    st[ST_NEXTJ] = k
            lastpane[g] = k
        w += 1
    if mode == MODE_TIME:
        clock = pmx[n]
        if t0 > clock:
            clock = t0
        st[ST_T] = clock
    else:
        clock = row0 + n + 1
    if clock > st[ST_R]:
        if not _release(clock, cfg, st, base, ist, fst, xst, ikind, fkind, s_rank, lastpane,
                        isact, active, out_i, out_f, acc):
            st[ST_POS] = n
            return NEED_ROOM
    if mode == MODE_ROWS:
        st[ST_ROW] = row0 + n
    st[ST_POS] = n
    return DONE
