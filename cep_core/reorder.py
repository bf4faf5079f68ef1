"""A bounded buffer that puts each partition key's events back in event-time order.

Events arrive in `seq` order (the splitter's stamping order); their times may go backwards
within a key. Per key, the watermark is the largest time seen minus the allowed lateness:

- an event whose time is below its key's watermark at arrival (or below the time of an
  event of its key already released) is *late*: it goes to the late rows, never into the
  released stream;
- every other event waits in the buffer until the watermark reaches its time, and is then
  released; released events of a key come out in (ts, seq) order.

Whether an event is late depends only on the events of its key before it, so the released
and late rows of each key do not depend on how the input is cut into batches. Memory is
bounded: when more than `max_buffered` events wait, the oldest (smallest (ts, seq)) are
released early and counted in `forced`; later events of their keys below them are late.
Released events keep their seq; keys are dense integer ids (one per partition key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from cep_core.batch import Batch

_NO_TIME = np.iinfo(np.int64).min

Int64s = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


@dataclass
class Reordered:
    """What one push released (in (ts, seq) order) and what it found late (arrival order);
    `*_keys` are the rows' partition-key ids."""

    released: Batch
    released_keys: Int64s
    late: Batch
    late_keys: Int64s


class ReorderBuffer:
    def __init__(self, allowed_lateness: int, max_buffered: int) -> None:
        if allowed_lateness < 0 or max_buffered < 0:
            raise ValueError("allowed_lateness and max_buffered must not be negative")
        self.allowed_lateness = allowed_lateness
        self.max_buffered = max_buffered
        self.forced = 0  # events released before their time because the buffer was full
        self.late_count = 0
        self._max_ts = np.full(0, _NO_TIME, dtype=np.int64)  # per key id
        self._floor = np.full(0, _NO_TIME, dtype=np.int64)  # time of the last released event
        self._pending: Batch | None = None
        self._pending_keys = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._pending_keys)

    def push(self, batch: Batch, keys: npt.ArrayLike) -> Reordered:
        ids = np.asarray(keys, dtype=np.int64)
        if len(ids) != len(batch):
            raise ValueError("one key id per row")
        self._grow(int(ids.max()) + 1 if len(ids) else 0)
        late = self._late_rows(batch.ts, ids)
        np.maximum.at(self._max_ts, ids, batch.ts)
        self.late_count += int(late.sum())
        pending = self._append(_take(batch, ~late), ids[~late])
        watermark = _minus(self._max_ts[self._pending_keys], self.allowed_lateness)
        ready = pending.ts <= watermark
        excess = len(ready) - int(ready.sum()) - self.max_buffered
        if excess > 0:
            waiting = np.flatnonzero(~ready)
            oldest = np.lexsort((pending.seq[waiting], pending.ts[waiting]))
            ready[waiting[oldest[:excess]]] = True
            self.forced += excess
        released, released_keys = self._release(pending, ready)
        return Reordered(released, released_keys, _take(batch, late), ids[late])

    # ------------------------------------------------------------ checkpoints

    def state(self) -> dict[str, Any]:
        """The watermark state and counters, JSON-able. The rows waiting (`waiting()`) are
        the caller's to identify and to put back with `refill` after `restore`."""
        return {"max_ts": self._max_ts.tolist(), "floor": self._floor.tolist(),
                "forced": self.forced, "late": self.late_count}

    def restore(self, state: dict[str, Any]) -> None:
        """Put back `state()`; nothing waits until `refill`."""
        self._max_ts = np.array(state["max_ts"], dtype=np.int64)
        self._floor = np.array(state["floor"], dtype=np.int64)
        self.forced, self.late_count = int(state["forced"]), int(state["late"])
        self._pending, self._pending_keys = None, np.zeros(0, dtype=np.int64)

    def waiting(self) -> tuple[Batch | None, Int64s]:
        """The rows waiting and their keys (in no particular order)."""
        return self._pending, self._pending_keys

    def refill(self, batch: Batch, keys: npt.ArrayLike) -> None:
        """Rows that waited when `state()` was taken, back in the buffer as they were: no
        lateness check and no watermark change (their effect is in the restored state).
        Release order is (ts, seq) whatever the order rows are refilled in."""
        ids = np.asarray(keys, dtype=np.int64)
        self._grow(int(ids.max()) + 1 if len(ids) else 0)
        self._append(batch, ids)

    def flush(self) -> tuple[Batch, Int64s]:
        """Release everything still waiting (end of input), in (ts, seq) order."""
        if self._pending is None:
            return _empty_like(None), np.zeros(0, dtype=np.int64)
        return self._release(self._pending, np.ones(len(self._pending_keys), dtype=bool))

    def _late_rows(self, ts: Int64s, keys: Int64s) -> Mask:
        """Rows whose time is below their key's threshold at arrival: the largest earlier
        time of the key minus the lateness, or the key's last released time."""
        n = len(ts)
        if n == 0:
            return np.zeros(0, dtype=bool)
        order = np.lexsort((np.arange(n), keys))  # by key, then arrival
        sorted_keys, sorted_ts = keys[order], ts[order]
        times, rank = np.unique(sorted_ts, return_inverse=True)
        group = np.cumsum(np.r_[0, np.diff(sorted_keys) != 0])
        # Offsetting each key's ranks above the previous key's makes one running max
        # restart at every key.
        offset = group * len(times)
        running = times[np.maximum.accumulate(offset + rank) - offset]
        first = np.r_[True, group[1:] != group[:-1]]
        before = np.where(first, _NO_TIME, np.r_[_NO_TIME, running[:-1]])
        before = np.maximum(before, self._max_ts[sorted_keys])
        threshold = np.maximum(_minus(before, self.allowed_lateness),
                               self._floor[sorted_keys])
        late = np.empty(n, dtype=bool)
        late[order] = sorted_ts < threshold
        return late

    def _append(self, batch: Batch, keys: Int64s) -> Batch:
        """Rows now waiting besides those before; returns all that wait."""
        if self._pending is None:
            self._pending, self._pending_keys = batch, keys
            return batch
        p = self._pending
        self._pending = Batch(np.concatenate([p.seq, batch.seq]),
                              np.concatenate([p.ts, batch.ts]),
                              {k: np.concatenate([v, batch.columns[k]])
                               for k, v in p.columns.items()})
        self._pending_keys = np.concatenate([self._pending_keys, keys])
        return self._pending

    def _release(self, pending: Batch, rows: Mask) -> tuple[Batch, Int64s]:
        """Release the rows `rows` of `pending` (what waits)."""
        out, out_keys = _take(pending, rows), self._pending_keys[rows]
        order = np.lexsort((out.seq, out.ts))
        out, out_keys = _take(out, order), out_keys[order]
        np.maximum.at(self._floor, out_keys, out.ts)
        self._pending = _take(pending, ~rows)
        self._pending_keys = self._pending_keys[~rows]
        return out, out_keys

    def _grow(self, n_keys: int) -> None:
        if n_keys > len(self._max_ts):
            extra = np.full(n_keys - len(self._max_ts), _NO_TIME, dtype=np.int64)
            self._max_ts = np.concatenate([self._max_ts, extra])
            self._floor = np.concatenate([self._floor, extra])


def _minus(times: Int64s, lateness: int) -> Int64s:
    """times - lateness, staying at the no-time sentinel instead of wrapping around."""
    return np.where(times < _NO_TIME + lateness, _NO_TIME, times - lateness)


def _take(batch: Batch, rows: Mask | npt.NDArray[np.intp]) -> Batch:
    return Batch(batch.seq[rows], batch.ts[rows], {k: v[rows] for k, v in batch.columns.items()})


def _empty_like(batch: Batch | None) -> Batch:
    empty = np.zeros(0, dtype=np.int64)
    return Batch(empty, empty, {} if batch is None else
                 {k: v[:0] for k, v in batch.columns.items()})
