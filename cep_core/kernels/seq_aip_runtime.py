"""Jitted helpers every generated AIP (incremental automata) SEQ kernel shares.

Automaton instances live in one int64 table `IT` split into one segment per instance key
(the partition, or under an equality class the partition and the class value): the rows
of key q are `IT[ibase[q] : ibase[q] + icnt[q]]` inside a segment of `isize[q]` rows. A
segment that must grow moves to a segment twice as large at the table's top `itop[0]`; a
full table is copied, compacted, into a larger one.

Kleene elements are persistent linked lists in a node pool (`NR[node]`: the element's
absolute row in its channel, `NP[node]`: the previous element's node, -1 for none):
copying an instance (skip-till-any-match keeps the old one when it takes an event) copies
the list head only. Dead nodes are reclaimed by `pool_compact` between batches.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import numpy as np
import numpy.typing as npt
from numba import njit

I64 = npt.NDArray[np.int64]

AIP_RUNTIME_VERSION = 1  # bump when a signature or a behaviour here changes

INT64_MAX = 2 ** 63 - 1

# instance row columns before the per-variable slots
R_DL, R_FIRST, R_MASK, R_POS, R_HOLE = range(5)
R_FIXED = 5


@njit(cache=True)
def seg_regrow(IT: I64, ibase: I64, isize: I64, icnt: I64, itop: I64, need: int) -> I64:
    """A larger table, every segment copied compactly (empty ones give up their room),
    with at least `need` free rows at its top."""
    live = 0
    for q in range(ibase.shape[0]):
        if icnt[q] > 0:
            live += max(2 * icnt[q], 8)
    cap = max(2 * (live + need), 64)
    NT = np.empty((cap, IT.shape[1]), np.int64)
    at = 0
    for q in range(ibase.shape[0]):
        k = icnt[q]
        if k == 0:
            ibase[q] = 0
            isize[q] = 0
            continue
        b = ibase[q]
        for r in range(k):
            for z in range(IT.shape[1]):
                NT[at + r, z] = IT[b + r, z]
        ibase[q] = at
        isize[q] = max(2 * k, 8)
        at += isize[q]
    itop[0] = at
    return NT


@njit(cache=True)
def seg_reserve(IT: I64, ibase: I64, isize: I64, icnt: I64, itop: I64, q: int,
                need: int) -> I64:
    """Room for `need` rows in key q's segment (its current rows kept); returns the
    (possibly reallocated) table."""
    if need <= isize[q]:
        return IT
    new = max(2 * isize[q], need, 8)
    if itop[0] + new > IT.shape[0]:
        IT = seg_regrow(IT, ibase, isize, icnt, itop, new)
        if need <= isize[q]:
            return IT
    nb = itop[0]
    b = ibase[q]
    for r in range(icnt[q]):
        for z in range(IT.shape[1]):
            IT[nb + r, z] = IT[b + r, z]
    ibase[q] = nb
    isize[q] = new
    itop[0] = nb + new
    return IT


@njit(cache=True)
def grow_pool(NR: I64, NP: I64, need: int) -> tuple[I64, I64]:
    size = max(2 * NR.shape[0], need, 64)
    A = np.empty(size, np.int64)
    B = np.empty(size, np.int64)
    for i in range(NR.shape[0]):
        A[i] = NR[i]
        B[i] = NP[i]
    return A, B


@njit(cache=True)
def kmat(NR: I64, NP: I64, head: int, count: int, off: int, buf: I64, extra: int
         ) -> tuple[I64, int]:
    """The elements of a Kleene list as rows relative to the partition's channel table
    (`off` = rows evicted), oldest first, plus `extra` (a relative row) when >= 0.
    Returns (buffer, number of elements)."""
    m = count + (1 if extra >= 0 else 0)
    if buf.shape[0] < m:
        buf = np.empty(2 * m, np.int64)
    node = head
    j = count - 1
    while j >= 0:
        buf[j] = NR[node] - off
        node = NP[node]
        j -= 1
    if extra >= 0:
        buf[count] = extra
    return buf, m


@njit(cache=True)
def same_list(NR: I64, NP: I64, h1: int, h2: int, count: int) -> bool:
    """Two Kleene lists of `count` elements hold the same rows."""
    a = h1
    b = h2
    for _ in range(count):
        if a == b:
            return True
        if NR[a] != NR[b]:
            return False
        a = NP[a]
        b = NP[b]
    return True


@njit(cache=True)
def expire(IT: I64, ibase: I64, icnt: I64, qpart: I64, last_ts: I64) -> int:
    """Drop every instance whose deadline its partition's event time has passed (keys no
    event visited lately keep expired instances until this sweep). Returns rows left."""
    left = 0
    for q in range(icnt.shape[0]):
        b = ibase[q]
        now = last_ts[qpart[q]]
        w = 0
        for r in range(icnt[q]):
            if now > IT[b + r, R_DL]:
                continue
            if w != r:
                for z in range(IT.shape[1]):
                    IT[b + w, z] = IT[b + r, z]
            w += 1
        icnt[q] = w
        left += w
    return left


@njit(cache=True)
def pool_compact(IT: I64, ibase: I64, icnt: I64, kslots: I64, NR: I64, NP: I64, top: int
                 ) -> tuple[I64, I64, int]:
    """Keep only the pool nodes reachable from live instances (renumbered, order kept, so
    a node's predecessor still has a smaller index); instance heads are rewritten.
    Returns (NR, NP, new top)."""
    mark = np.zeros(top, np.int64)
    for q in range(icnt.shape[0]):
        b = ibase[q]
        for r in range(icnt[q]):
            for s in kslots:
                node = IT[b + r, s]
                while node >= 0 and mark[node] == 0:
                    mark[node] = 1
                    node = NP[node]
    remap = np.full(top, -1, np.int64)
    m = 0
    for i in range(top):
        if mark[i] != 0:
            remap[i] = m
            m += 1
    A = np.empty(max(2 * m, 64), np.int64)
    B = np.empty(max(2 * m, 64), np.int64)
    for i in range(top):
        if mark[i] != 0:
            A[remap[i]] = NR[i]
            B[remap[i]] = remap[NP[i]] if NP[i] >= 0 else -1
    for q in range(icnt.shape[0]):
        b = ibase[q]
        for r in range(icnt[q]):
            for s in kslots:
                node = IT[b + r, s]
                if node >= 0:
                    IT[b + r, s] = remap[node]
    return A, B, m


@njit(cache=True)
def assign_subkeys(pid: I64, vals: I64, table: MutableMapping[tuple[int, int], int], kp: I64,
                   kv: I64, n: int) -> tuple[I64, I64, I64, int]:
    """Dense ids for (partition id, class value) pairs (values as int64 bits), in order
    of first appearance: `table` maps a pair to its id, `kp`/`kv` hold the pairs by id.
    Returns (ids, kp, kv, number of ids)."""
    out = np.empty(pid.shape[0], np.int64)
    for i in range(pid.shape[0]):
        key = (pid[i], vals[i])
        q = table.get(key, -1)
        if q < 0:
            q = n
            table[key] = q
            if n >= kp.shape[0]:
                A = np.empty(max(2 * n, 64), np.int64)
                B = np.empty(max(2 * n, 64), np.int64)
                A[:n] = kp[:n]
                B[:n] = kv[:n]
                kp = A
                kv = B
            kp[n] = pid[i]
            kv[n] = vals[i]
            n += 1
        out[i] = q
    return out, kp, kv, n


@njit(cache=True)
def fill_subkeys(table: MutableMapping[tuple[int, int], int], kp: I64, kv: I64, n: int
                 ) -> None:
    for q in range(n):
        table[(kp[q], kv[q])] = q
