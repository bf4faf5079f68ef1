"""What the generated MATCH_RECOGNIZE kernel (`cep_core.compiler.recognize`) and its engine
(`cep_core.engine.recognize`) share: the status codes, the counters, the fixed columns of a
computation's record and of a key's row, and the numba helpers that replay
`java.util.PriorityQueue` (`cep_core.reference.priority_queue`) over arrays of record
handles ordered by the row each computation started on.

A record is one row of `rec_i`/`rec_f`; handle 0 is Flink's start computation (no rows,
start NEVER: behind every partial match), shared by every key and never written after the
engine makes it. A record is in one queue at a time and changes only while its computation
steps: a TAKE makes a new record, but the computation's last TAKE on a row updates its own
record in place (the computation leaves its queue on every row). A heap holds handles only;
a pruned or released handle goes back to the free list.
The helpers are inlined into the runs and states layouts' kernels (`inlined_here`): a call
left in the kernel's loop over rows costs every row, made or not (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

I64 = npt.NDArray[np.int64]

NEVER = 1 << 62  # the start computation's place in a queue (after every partial match)

# Status codes the kernels return with where they stopped (event index or key id); the
# runs layout's kernels say which queue is full (FULL_QUEUE: the partial matches'),
# the computations layout's FULL_QUEUE for either.
DONE, FULL_OUTPUT, FULL_QUEUE, FULL_POOL, SKIP_MISSING, SKIP_FIRST, FULL_COMPLETED = range(7)
# Counters (`ctr`): free list top, pool high-water mark, outputs, dead letters, the start
# and end seq of a match that made AFTER MATCH SKIP fail, and the batch's first such stop
# (a kernel stepping rows key by key goes on with the other keys: its status, row, match).
CTR = ("free_top", "high", "out_n", "dead_n", "err_start", "err_end", "stop", "stop_row",
       "stop_start", "stop_end")
(FREE_TOP, HIGH, OUT_N, DEAD_N, ERR_START, ERR_END, STOP, STOP_ROW, STOP_START,
 STOP_END) = range(len(CTR))
# Fixed int columns of a record: its automaton state, the partition-local index, time and
# seq of its first row, index and seq of its last row, how many rows it has.
REC_FIXED = ("state", "start", "start_ts", "start_seq", "last_idx", "last_seq", "count")
STATE, START, START_TS, START_SEQ, LAST_IDX, LAST_SEQ, COUNT = range(len(REC_FIXED))
# A key's row (`key_i`): its last accepted event time, partial and completed matches in its
# queues, rows seen (the next row's index), and in the runs layout (`cep_core.compiler.
# recognize`) the partial matches its runs stand for after its last row.
KEY_FIELDS = ("last_ts", "npart", "ncomp", "rows", "branches")
K_LAST_TS, K_NPART, K_NCOMP, K_ROWS, K_BRANCHES = range(len(KEY_FIELDS))
# How a program's records stand for partial matches: one record each (Flink's computation
# states), one per start with how many are in each automaton state, or one per start with
# the one automaton state its one partial match is in (`RecognizeProgram`)
COMPUTATIONS, RUNS, STATES = "computations", "runs", "states"
# The state arrays every kernel takes, in order (after its scalars and the batch); `lq` is
# the runs layout's scratch: where the runs that complete matches on a row are.
STATE_ARGS = ["sc", "s_rank", "s_lower", "s_upper", "s_length", "ctr", "free", "key_i", "ph",
              "pf", "ch", "lp", "lc", "lq", "rec_i", "rec_f", "st_var", "st_final",
              "tr_off", "tr_n", "tr_act", "tr_tgt", "tr_var", "tr_unl"]


@dataclass(frozen=True)
class RunRows:
    """Where a run keeps its columns in its row of `ph`/`pf`, and the key's row those of
    the row before: only those, so a row is narrower than a record (136 bytes -> 88 on the
    M-shape; 1.2x at 5,000 keys, where the runs of the keys a row touches are not in the
    cache: docs/benchmarks.md). A run has none of a record's state, last row or row count
    (a completed match's record gets them), nor the row before; a key's row only that, in
    columns a run uses for others. Columns 0 and 1 are a run's START_SEQ and START, which
    no DEFINE reads: a DEFINE that the start computation evaluates on record 0 (all zeros
    but its STATE and START) reads zeros, as it does in record columns. The compiler makes
    it (`recognize_runs.run_rows`); the engine allocates and restores by it."""

    ints: dict[int, int]  # record int column -> its place in a row of ph
    floats: dict[int, int]  # record float column -> its place in a row of pf
    run_ints: tuple[int, ...]  # the record columns a run keeps, and its key's row
    run_floats: tuple[int, ...]
    key_ints: tuple[int, ...]
    key_floats: tuple[int, ...]
    # the states layout's: the runs layout's count columns, in the order of the states'
    # numbers; the first one's place keeps a run's state number
    counts: tuple[int, ...] = ()
    padded: bool = False  # ph's rows whole cache lines (8 ints): 1.08-1.12x on the M-shape

    @property
    def widths(self) -> tuple[int, int]:
        """The widths of ph's and pf's rows."""
        ints = max(self.ints.values()) + 1
        return (-(-ints // 8) * 8 if self.padded else ints,
                max(self.floats.values(), default=0) + 1)

    def describe(self) -> str:
        """The places as text (a snapshot's must be the same)."""
        return " ".join([f"i{c}>{j}" for c, j in sorted(self.ints.items())] +
                        [f"f{c}>{j}" for c, j in sorted(self.floats.items())] +
                        (["padded"] if self.padded else []))


def places_of(described: str) -> tuple[dict[int, int], dict[int, int]]:
    """The int and float places `RunRows.describe` wrote (ValueError: it is not that)."""
    places: dict[str, dict[int, int]] = {"i": {}, "f": {}}
    for item in described.split():
        if item == "padded":
            continue
        column, _, place = item[1:].partition(">")
        if item[:1] not in places or not column.isdigit() or not place.isdigit():
            raise ValueError(f"not a place of a run's column: {item[:40]!r}")
        places[item[0]][int(column)] = int(place)
    return places["i"], places["f"]


def inlined_here(call: Any, caller: Any, callee: Any) -> bool:
    """numba's inline cost model of the helpers below: inlined where the generated module
    asks for it (`INLINE_RUNTIME`: the runs and states layouts), called elsewhere (inlined,
    some of the computations layout's kernels took 1.5x as long to compile)."""
    return bool(caller.func_id.func.__globals__.get("INLINE_RUNTIME", False))


@njit(cache=True, inline="always")
def heap_add(heap: I64, base: int, n: int, item: int, rec_i: I64) -> int:
    """PriorityQueue.add (siftUp) into heap[base:base + n]; returns the new size."""
    key = rec_i[item, START]
    k = n
    while k > 0:
        parent = (k - 1) >> 1
        p = heap[base + parent]
        if key >= rec_i[p, START]:
            break
        heap[base + k] = p
        k = parent
    heap[base + k] = item
    return n + 1


@njit(cache=True, inline=inlined_here)
def sift_down(heap: I64, base: int, n: int, k: int, item: int, rec_i: I64) -> None:
    key = rec_i[item, START]
    half = n >> 1
    while k < half:
        child = 2 * k + 1
        c = heap[base + child]
        if child + 1 < n and rec_i[c, START] > rec_i[heap[base + child + 1], START]:
            child += 1
            c = heap[base + child]
        if key <= rec_i[c, START]:
            break
        heap[base + k] = c
        k = child
    heap[base + k] = item


@njit(cache=True, inline=inlined_here)
def heap_poll(heap: I64, base: int, n: int, rec_i: I64) -> int:
    """PriorityQueue.poll: removes the head (the caller read it); returns the new size."""
    n -= 1
    last = heap[base + n]
    if n > 0:
        sift_down(heap, base, n, 0, last, rec_i)
    return n


@njit(cache=True, inline=inlined_here)
def heapify(heap: I64, base: int, n: int, rec_i: I64) -> None:
    for k in range((n >> 1) - 1, -1, -1):
        sift_down(heap, base, n, k, heap[base + k], rec_i)


@njit(cache=True, inline=inlined_here)
def prune(heap: I64, base: int, n: int, rec_i: I64, column: int, limit: int, inclusive: bool,
          free: I64, ctr: I64) -> int:
    """PriorityQueue.removeIf (JDK 17's bulkRemove) of the records (not the start
    computation) whose `column` is below `limit` (or equal, when `inclusive`): survivors
    keep their order, then the array is heapified; nothing removed, nothing moves. The
    removed records go to the free list. Returns the new size."""
    w = 0
    for j in range(n):
        h = heap[base + j]
        v = rec_i[h, column]
        if h != 0 and (v < limit or (inclusive and v == limit)):
            free[ctr[FREE_TOP]] = h
            ctr[FREE_TOP] += 1
        else:
            heap[base + w] = h
            w += 1
    if w != n:
        heapify(heap, base, w, rec_i)
    return w


@njit(cache=True, inline=inlined_here)
def drop_runs(ph: I64, pf: npt.NDArray[np.float64], base: int, n: int, column: int,
              limit: int) -> int:
    """The runs layout: drops the runs of rows ph[base:base + n] (and pf's) whose `column`
    is at most `limit`, a prefix (the runs are in order of start, so of start time too),
    moving the others down; returns how many are left. The records they drop are gone
    (no free list: the queue holds the records)."""
    cut = 0
    while cut < n and ph[base + cut, column] <= limit:
        cut += 1
    if cut:
        for j in range(cut, n):
            for c in range(ph.shape[1]):
                ph[base + j - cut, c] = ph[base + j, c]
            for c in range(pf.shape[1]):
                pf[base + j - cut, c] = pf[base + j, c]
    return n - cut


@njit(cache=True)
def jdiv(a: int, b: int) -> int:
    """Java's integer division (truncates toward zero); the caller guards b == 0."""
    if b == 0:
        return a - a
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


@njit(cache=True)
def jmod(a: int, b: int) -> int:
    """Java's integer remainder (the sign of the dividend)."""
    return a - b * jdiv(a, b)


def live_handles(ph: I64 | None, ch: I64, key_i: I64, nkeys: int) -> I64:
    """The record handles the keys' queues hold (not the start computation; ph None: the
    runs layout, whose partial matches are not records of the pool)."""
    npart, ncomp = key_i[:nkeys, K_NPART], key_i[:nkeys, K_NCOMP]
    parts = [ch[k, :ncomp[k]] for k in range(nkeys)]
    if ph is not None:
        parts += [ph[k, :npart[k]] for k in range(nkeys)]
    handles = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return np.unique(handles[handles != 0])
