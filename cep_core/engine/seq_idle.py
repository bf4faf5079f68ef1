"""Idle-key eviction for the SEQ engines (option `idle_timeout`, as the MATCH engine's).

After a batch or punctuation the engine's clock is the largest event time (or
punctuation) seen. A partition whose last event is at least `idle_timeout` behind the clock
and that holds state (stored events, automaton instances) but no pending match (a
completed match waiting for its trailing NOT to be decided is a result, never dropped)
loses that state; `metrics()["evicted_keys"]` counts such evictions. The CDP engine then
forgets idle partitions that hold nothing (`empty_idle_partitions`): their ids go to new
partitions (`metrics()["released_keys"]`), so memory is bounded by the partitions live
within the timeout. Results are unaffected when `idle_timeout` exceeds the query's horizon
(WITHIN, TESLA's WITHIN ... FROM chain, window aggregates) plus how far a partition's
events may lag behind the other partitions' times (a returning partition's events are
then newer than its forgotten last time, so no "time goes backwards" rejection is missed).
The AIP engine does not release partitions yet.
Sweeps run at most every `idle_timeout // 8` of clock time, as MATCH's.

Without eviction a partition's state is already freed as it empties: stored events older
than the horizon are evicted when its table fills, instances when their window passes,
and a partition left with no rows gives its room back when the arena or the instance
table is compacted.
"""

from __future__ import annotations

import numpy as np
from numba import njit

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

    def advance(self, ts) -> None:
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
def idle_partitions(clock, timeout, last_ts, cnt, phead, live, P):
    """Partitions < P idle for `timeout` or longer, with stored events or live instances
    (`live[p]` > 0) and no pending match."""
    out = np.empty(P, np.int64)
    k = 0
    for p in range(P):
        if last_ts[p] == INT64_MIN or clock - last_ts[p] < timeout or phead[p] >= 0:
            continue
        holds = live[p] > 0
        for c in range(cnt.shape[1]):
            if cnt[p, c] > 0:
                holds = True
        if holds:
            out[k] = p
            k += 1
    return out[:k]


@njit(cache=True)
def empty_idle_partitions(clock, timeout, last_ts, cnt, phead, live, P):
    """Partitions < P in use (an accepted event), idle for `timeout` or longer and holding
    nothing: no stored events, no live instances, no pending match. The caller resets
    their rows and gives their ids to new keys (`SeqEngineBase._release`)."""
    out = np.empty(P, np.int64)
    k = 0
    for p in range(P):
        if last_ts[p] == INT64_MIN or clock - last_ts[p] < timeout or phead[p] >= 0 or \
                live[p] > 0:
            continue
        empty = True
        for c in range(cnt.shape[1]):
            if cnt[p, c] > 0:
                empty = False
        if empty:
            out[k] = p
            k += 1
    return out[:k]


@njit(cache=True)
def drop_events(parts, cnt, evicted):
    """Forget the stored events of `parts` (absolute row numbers stay valid)."""
    for p in parts:
        for c in range(cnt.shape[1]):
            evicted[p, c] += cnt[p, c]
            cnt[p, c] = 0


@njit(cache=True)
def drop_instances(parts, qpart, icnt, S, Q, P):
    """Forget the automaton instances of every key (< Q) of `parts` (partitions < P)."""
    gone = np.zeros(P, np.bool_)
    for p in parts:
        gone[p] = True
    for q in range(Q):
        if gone[qpart[q]]:
            for st in range(S):
                icnt[q * S + st] = 0


@njit(cache=True)
def live_instances(qpart, icnt, S, Q, P):
    """Live instances per partition."""
    live = np.zeros(P, np.int64)
    for q in range(Q):
        for st in range(S):
            live[qpart[q]] += icnt[q * S + st]
    return live
