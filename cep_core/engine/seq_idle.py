"""Idle-key eviction for the SEQ engines (option `idle_timeout`, as the MATCH engine's).

After a batch or punctuation the engine's clock is the largest event time (or
punctuation) seen. A partition whose last event is at least `idle_timeout` behind the clock
and that holds state (stored events, automaton instances) but no pending match (a
completed match waiting for its trailing NOT to be decided is a result, never dropped)
loses that state; `metrics()["evicted_keys"]` counts such evictions. The engine then
forgets idle partitions that hold nothing (`idle_partitions` with `holding` false): their
ids go to new partitions (`metrics()["released_keys"]`), so memory is bounded by the partitions live
within the timeout. Results are unaffected when `idle_timeout` exceeds the query's horizon
(WITHIN, TESLA's WITHIN ... FROM chain, window aggregates) plus how far a partition's
events may lag behind the other partitions' times (a returning partition's events are
then newer than its forgotten last time, so no "time goes backwards" rejection is missed).
The AIP engine, under an equality class, also releases its instance keys (partition,
class value) that hold no instances (`release_empty_instance_keys`): their ids go to new
instance keys (`metrics()["released_instance_keys"]`).
Sweeps run at most every `idle_timeout // 8` of clock time, as MATCH's.

Without eviction a partition's state is already freed as it empties: stored events older
than the horizon are evicted when its table fills, instances when their window passes,
and a partition left with no rows gives its room back when the arena or the instance
table is compacted.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import numpy as np
import numpy.typing as npt
from numba import njit

I64 = npt.NDArray[np.int64]
Table = MutableMapping[tuple[int, int], int]  # numba's typed Dict: instance key -> id

INT64_MIN = np.iinfo(np.int64).min


class IdleKeys:
    """The clock, the sweep cadence and the eviction count of one SEQ engine."""

    def __init__(self, idle_timeout: int | None):
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive")
        self.timeout = idle_timeout
        self.clock = INT64_MIN
        self.last_sweep = INT64_MIN
        self.evicted = 0
        self.released = 0  # partitions forgotten (their ids given to new keys)

    def state(self) -> list[int]:
        return [self.clock, self.last_sweep, self.evicted, self.released]

    def load_state(self, state: list[int]) -> None:
        self.clock, self.last_sweep, self.evicted = state[:3]
        self.released = state[3] if len(state) > 3 else 0

    def advance(self, ts: int | np.int64) -> None:
        if ts > self.clock:
            self.clock = int(ts)

    def due(self) -> bool:
        """A sweep is due (and is recorded as done)."""
        if self.timeout is None or self.clock == INT64_MIN:
            return False
        if self.clock - self.last_sweep < max(1, self.timeout // 8):
            return False
        self.last_sweep = self.clock
        return True


@njit(cache=True)
def idle_partitions(clock: int, timeout: int, last_ts: I64, cnt: I64, phead: I64, live: I64,
                    P: int, holding: bool) -> I64:
    """Partitions < P in use (an accepted event), idle for `timeout` or longer, with no
    pending match, that hold something (stored events or live instances, `live[p]` > 0)
    when `holding` is true (to evict), or hold nothing when it is false (the caller resets
    their rows and gives their ids to new keys: `SeqEngineBase._release`)."""
    out = np.empty(P, np.int64)
    k = 0
    for p in range(P):
        if last_ts[p] == INT64_MIN or clock - last_ts[p] < timeout or phead[p] >= 0:
            continue
        holds = live[p] > 0
        for c in range(cnt.shape[1]):
            if cnt[p, c] > 0:
                holds = True
        if holds == holding:
            out[k] = p
            k += 1
    return out[:k]


@njit(cache=True)
def drop_events(parts: I64, cnt: I64, evicted: I64) -> None:
    """Forget the stored events of `parts` (absolute row numbers stay valid)."""
    for p in parts:
        for c in range(cnt.shape[1]):
            evicted[p, c] += cnt[p, c]
            cnt[p, c] = 0


@njit(cache=True)
def drop_instances(parts: I64, qpart: I64, icnt: I64, S: int, Q: int, P: int) -> None:
    """Forget the automaton instances of every key (< Q) of `parts` (partitions < P)."""
    gone = np.zeros(P, np.bool_)
    for p in parts:
        gone[p] = True
    for q in range(Q):
        if qpart[q] >= 0 and gone[qpart[q]]:
            for st in range(S):
                icnt[q * S + st] = 0


@njit(cache=True)
def live_instances(qpart: I64, icnt: I64, S: int, Q: int, P: int) -> I64:
    """Live instances per partition."""
    live = np.zeros(P, np.int64)
    for q in range(Q):
        if qpart[q] >= 0:
            for st in range(S):
                live[qpart[q]] += icnt[q * S + st]
    return live


# Instance keys (AIP under an equality class: a partition and a class value). A released
# key's `kp` is -1 and its id waits in the stack `free[:n_free]` (the last released is
# taken first); `table` maps a live key's (partition, value) to its id.


@njit(cache=True)
def assign_instance_keys(pid: I64, vals: I64, table: Table, kp: I64, kv: I64, n: int,
                         free: I64, n_free: int) -> tuple[I64, I64, I64, int, int]:
    """The instance key of every event (pid[i], vals[i]); a new key takes a released id
    before a fresh one. Returns (ids, kp, kv, id range, n_free)."""
    out = np.empty(pid.shape[0], np.int64)
    for i in range(pid.shape[0]):
        key = (pid[i], vals[i])
        q = table.get(key, -1)
        if q < 0:
            if n_free > 0:
                n_free -= 1
                q = free[n_free]
            else:
                q = n
                n += 1
                if q >= kp.shape[0]:
                    A = np.full(max(2 * q, 64), -1, np.int64)
                    B = np.zeros(max(2 * q, 64), np.int64)
                    A[:q] = kp[:q]
                    B[:q] = kv[:q]
                    kp = A
                    kv = B
            table[key] = q
            kp[q] = pid[i]
            kv[q] = vals[i]
        out[i] = q
    return out, kp, kv, n, n_free


@njit(cache=True)
def release_empty_instance_keys(table: Table, kp: I64, kv: I64, icnt: I64, S: int, Q: int,
                                free: I64, n_free: int) -> int:
    """Release every live instance key (< Q) without instances: it holds nothing a new
    key would not (`free` has room for Q ids). Returns n_free."""
    for q in range(Q):
        if kp[q] < 0:
            continue
        empty = True
        for st in range(S):
            if icnt[q * S + st] > 0:
                empty = False
        if empty:
            table.pop((kp[q], kv[q]))
            kp[q] = -1
            kv[q] = 0
            free[n_free] = q
            n_free += 1
    return n_free


@njit(cache=True)
def fill_instance_keys(table: Table, kp: I64, kv: I64, Q: int) -> None:
    """`table` of the live instance keys < Q."""
    for q in range(Q):
        if kp[q] >= 0:
            table[(kp[q], kv[q])] = q
