"""`ORDER BY ts, col [ASC|DESC], ...` for the jitted MATCH_RECOGNIZE engine: the rows of a
partition's latest time wait until a later row of that partition comes (or a punctuation
past their time, or the end), then go in sorted by those columns, as Flink's operator sorts
the rows of a time before its automaton takes them and as the reference interpreter does
(`RecognizeInterpreter._process_sorted`).

A row earlier than its partition's waiting time is late when it comes (a dead letter
then); a row earlier than the partition's last row taken is late when it goes in (the
kernel dead-letters it then, as the interpreter does). The rows that go in on a row's
arrival go in before the next row's, so the engine gives the interpreter's composite events
and dead letters in the interpreter's order.

The waiting rows are columns (their key id, seq, time and the columns the kernel and the
sort read), saved in snapshots and checked when loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cmp_to_key
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from cep_core.schema import AttrType, StreamSchema

I64 = npt.NDArray[np.int64]
Columns = dict[str, npt.NDArray[Any]]
_NONE = np.empty(0, np.int64)


@njit(cache=True)
def tie_slots(kid: I64, ts: I64, nkeys: int) -> I64:
    """Rows in arrival order (those waiting first: one time per key) -> per row: 1 + the
    row whose arrival sends it in (with the other rows of its key and time), 0 where it
    still waits, -1 where it is late on arrival."""
    n = len(kid)
    pending_ts = np.zeros(nkeys, np.int64)
    current = np.full(nkeys, -1, np.int64)  # per key: its waiting group
    group = np.empty(n, np.int64)
    sent_by = np.full(n, -1, np.int64)
    groups = 0
    for i in range(n):
        k, t = kid[i], ts[i]
        g = current[k]
        if g >= 0 and t < pending_ts[k]:
            group[i] = -1
            continue
        if g < 0 or t > pending_ts[k]:
            if g >= 0:
                sent_by[g] = i
            current[k] = groups
            groups += 1
        group[i] = current[k]
        pending_ts[k] = t
    for i in range(n):
        group[i] = -1 if group[i] < 0 else sent_by[group[i]] + 1
    return group


@njit(cache=True)
def tie_order(group: I64, keys: I64) -> I64:
    """The rows' stable order by `group` (small non-negative ints), then by `keys` (one row
    of keys per ORDER BY column after the time): a counting sort, then each group sorted
    (by insertion where it is small) but group 0's (rows not going in)."""
    n = len(group)
    top = group.max() + 2 if n else 1
    start = np.zeros(top, np.int64)
    for i in range(n):
        start[group[i] + 1] += 1
    for g in range(top - 1):
        start[g + 1] += start[g]
    order = np.empty(n, np.int64)
    for i in range(n):
        g = group[i]
        order[start[g]] = i
        start[g] += 1
    a = 0
    while a < n:
        b = a + 1
        while b < n and group[order[b]] == group[order[a]]:
            b += 1
        if group[order[a]] == 0:
            pass
        elif b - a > 16:
            for j in range(len(keys) - 1, -1, -1):  # by the last key first, each stable
                part = order[a:b].copy()
                order[a:b] = part[np.argsort(keys[j][part], kind="mergesort")]
        else:
            for i in range(a + 1, b):
                x = order[i]
                at = i - 1
                while at >= a and _before(keys, x, order[at]):
                    order[at + 1] = order[at]
                    at -= 1
                order[at + 1] = x
        a = b
    return order


@njit(cache=True)
def number_firsts(kid: I64, rank: I64, taken: int) -> int:
    """`rank[k]` := its place in the order keys first appear in `kid` (after `taken` keys
    numbered before; keys numbered already keep theirs); returns how many are numbered."""
    for k in kid:
        if rank[k] < 0:
            rank[k] = taken
            taken += 1
    return taken


@njit(cache=True)
def _before(keys: I64, x: int, y: int) -> bool:
    for j in range(len(keys)):
        if keys[j, x] != keys[j, y]:
            return bool(keys[j, x] < keys[j, y])
    return False


def _float_order(values: npt.NDArray[Any]) -> I64:
    """Floats as int64s in the same order (-0.0 as 0.0, as Python compares them; NaN is
    sorted apart: `PendingRows._nan_groups`)."""
    bits = np.where(values == 0, 0.0, values).astype(np.float64).view(np.int64)
    return np.where(bits < 0, bits ^ np.int64(0x7FFFFFFFFFFFFFFF), bits)


@dataclass
class Sent:
    """Rows going in, in order: their key ids, seqs, times and columns, and the position
    (in the batch) of the row whose arrival sent each one in (-1: a punctuation or the
    end); and the positions, key ids and seqs of the batch's rows late on arrival."""

    kid: I64
    seq: I64
    ts: I64
    columns: Columns
    sent_at: I64
    late: I64
    late_kid: I64
    late_seq: I64


class PendingRows:
    """The rows waiting for their time to end, per partition (see the module)."""

    def __init__(self, schema: StreamSchema, then_by: list[tuple[str, bool]],
                 columns: list[str]) -> None:
        self.schema = schema
        self.then_by = then_by  # (attribute, DESC)
        self.names = list(dict.fromkeys(columns + [a for a, _ in then_by
                                                   if a != schema.time]))
        self.kid = np.empty(0, np.int64)
        self.seq = np.empty(0, np.int64)
        self.ts = np.empty(0, np.int64)
        self.columns: Columns = {name: np.empty(0, self._dtype(name)) for name in self.names}

    def _dtype(self, name: str) -> np.dtype[np.generic]:
        kind = self.schema.attributes[name]
        return np.dtype(np.float64 if kind is AttrType.FLOAT else
                        np.bool_ if kind is AttrType.BOOL else np.int64)

    def __len__(self) -> int:
        return len(self.kid)

    def take(self, kid: I64, seq: I64, ts: I64, columns: Columns, nkeys: int,
             rank: I64) -> Sent:
        """A batch arrives (its rows' key ids, seqs, times, columns): the rows it sends in,
        in order; the rest of it waits. `rank`: each string code's place in sorted order."""
        m = len(self)
        all_kid = np.concatenate([self.kid, kid])
        all_seq = np.concatenate([self.seq, seq])
        all_ts = np.concatenate([self.ts, ts])
        cols = {name: np.concatenate([self.columns[name],
                                      np.asarray(columns[name], self._dtype(name))])
                for name in self.names}
        slot = tie_slots(all_kid, all_ts, nkeys)
        order = self._order(np.maximum(slot, 0), all_ts, cols, rank)
        stay = len(order) - int(np.count_nonzero(slot > 0))
        waiting, order = np.sort(order[:stay]), order[stay:]
        waiting = waiting[slot[waiting] == 0]
        late = np.flatnonzero(slot[m:] < 0)
        sent = self._sent(all_kid, all_seq, all_ts, cols, order, slot[order] - 1 - m,
                          (late, kid[late], seq[late]))
        self._keep(all_kid, all_seq, all_ts, cols, waiting)
        return sent

    def drain(self, before: int | None, rank: I64) -> Sent:
        """A punctuation at `before` (None: the end): the waiting rows of earlier times go
        in, partition by partition (by key id), each partition's sorted."""
        go = np.ones(len(self), np.bool_) if before is None else self.ts < before
        order = self._order(np.where(go, self.kid + 1, 0), self.ts, self.columns, rank)
        order = order[len(order) - int(np.count_nonzero(go)):]
        sent = self._sent(self.kid, self.seq, self.ts, self.columns, order,
                          np.full(len(order), -1, np.int64))
        self._keep(self.kid, self.seq, self.ts, self.columns, np.flatnonzero(~go))
        return sent

    @staticmethod
    def _sent(kid: I64, seq: I64, ts: I64, cols: Columns, order: I64, at: I64,
              late: tuple[I64, I64, I64] = (_NONE, _NONE, _NONE)) -> Sent:
        """Rows `order` going in, sent by the rows at `at`; `late`: the positions, key ids
        and seqs of rows late on arrival."""
        return Sent(kid[order], seq[order], ts[order],
                    {name: c[order] for name, c in cols.items()}, at, *late)

    def _keep(self, kid: I64, seq: I64, ts: I64, cols: Columns, rows: I64) -> None:
        self.kid, self.seq, self.ts = kid[rows], seq[rows], ts[rows]
        self.columns = {name: c[rows] for name, c in cols.items()}

    def _order(self, group: I64, ts: I64, cols: Columns, rank: I64) -> I64:
        """The order of rows that go in: by group (ascending), then by the ORDER BY columns
        after the time, then as they came (a stable sort)."""
        keys = np.empty((len(self.then_by), len(group)), np.int64)
        nan = np.zeros(len(group), np.bool_)
        for j, (name, desc) in enumerate(self.then_by):
            kind = self.schema.attributes[name]
            values = ts if name == self.schema.time else cols[name]
            if kind is AttrType.STRING:
                values = rank[values]
            if kind is AttrType.FLOAT:
                nan |= np.isnan(values)
                values = _float_order(values)
            values = np.asarray(values, np.int64)
            keys[j] = ~values if desc else values  # (~ reverses, and never overflows)
        order = tie_order(group, keys)
        if nan.any():
            self._nan_groups(order, group, nan, ts, cols, rank)
        return order

    def _nan_groups(self, order: I64, group: I64, nan: npt.NDArray[np.bool_], ts: I64,
                    cols: Columns, rank: I64) -> None:
        """A group going in with a NaN (`nan`: per row) in a float ORDER BY column is
        sorted as Python's `sorted` sorts it in the interpreter (NaN is neither less nor
        greater), in place."""
        kinds = [self.schema.attributes[name] for name, _ in self.then_by]
        sorted_group = group[order]
        starts = np.flatnonzero(np.r_[True, sorted_group[1:] != sorted_group[:-1]])
        ends = np.r_[starts[1:], len(order)]
        with_nan = np.add.reduceat(nan[order], starts) > 0
        with_nan &= sorted_group[starts] > 0  # (group 0 does not go in)
        for a, b in zip(starts[with_nan].tolist(), ends[with_nan].tolist()):
            rows = np.sort(order[a:b])  # as they came
            values = [[(ts if name == self.schema.time else cols[name])[r] for r in rows]
                      for name, _ in self.then_by]

            def compare(x: int, y: int, values: list[list[Any]] = values) -> int:
                # the interpreter's sort keys are tuples: the first column whose values are
                # not == decides, by `<` alone (NaN: neither, so the rows stay as they are)
                for col, kind, (_, desc) in zip(values, kinds, self.then_by):
                    p, q = col[x], col[y]
                    if kind is AttrType.STRING:
                        p, q = rank[p], rank[q]
                    if p == q:
                        continue
                    if desc:
                        p, q = q, p
                    return -1 if p < q else 1 if q < p else 0
                return 0

            picked = sorted(range(len(rows)), key=cmp_to_key(compare))
            order[a:b] = rows[picked]

    def held_seq(self) -> int | None:
        return int(self.seq.min()) if len(self) else None

    # ------------------------------------------------------------ strings and snapshots

    def string_columns(self) -> list[str]:
        return [n for n in self.names if self.schema.attributes[n] is AttrType.STRING]

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        out: dict[str, npt.NDArray[Any]] = {"tie_kid": self.kid, "tie_seq": self.seq,
                                             "tie_ts": self.ts}
        out.update({f"tie_col{j}": self.columns[name] for j, name in enumerate(self.names)})
        return out

    def load(self, arrays: dict[str, npt.NDArray[Any]], nkeys: int, strings: int,
             where: str) -> None:
        """Waiting rows from a snapshot's arrays (none where it has none), checked: one
        length, the right types, key ids of keys, one time per key, string codes of
        strings; `ValueError` naming `where` otherwise."""
        wanted = ["tie_kid", "tie_seq", "tie_ts"] + [f"tie_col{j}" for j in range(len(self.names))]
        if not any(name in arrays for name in wanted):
            return
        if not all(name in arrays for name in wanted) or any(
                name.startswith("tie_") and name not in wanted + ["tie_rank"] for name in arrays):
            raise ValueError(f"{where}: the snapshot's waiting rows (ORDER BY) are not this "
                             "query's")
        loaded = {name: np.asarray(arrays[name]) for name in wanted}
        n = len(loaded["tie_kid"])
        if any(a.ndim != 1 or len(a) != n for a in loaded.values()):
            raise ValueError(f"{where}: the snapshot's waiting rows' columns are not one "
                             "length")
        for j, name in enumerate(["kid", "seq", "ts"] + self.names):
            want = np.dtype(np.int64) if j < 3 else self._dtype(name)
            if loaded[wanted[j]].dtype != want:
                raise ValueError(f"{where}: the snapshot's waiting rows' {name} is not "
                                 f"{want}")
        kid, ts = loaded["tie_kid"], loaded["tie_ts"]
        if n and (kid.min() < 0 or kid.max() >= nkeys):
            raise ValueError(f"{where}: a waiting row of a key the snapshot does not have")
        if n:
            first = np.full(nkeys, np.iinfo(np.int64).min, np.int64)
            first[kid[::-1]] = ts[::-1]
            if (first[kid] != ts).any():
                raise ValueError(f"{where}: waiting rows of one partition at two times")
        for j, name in enumerate(self.names):
            codes = loaded[f"tie_col{j}"]
            if self.schema.attributes[name] is AttrType.STRING and n and (
                    codes.min() < 0 or codes.max() >= strings):
                raise ValueError(f"{where}: a waiting row's {name} is not a string's code")
        self.kid, self.seq, self.ts = kid.copy(), loaded["tie_seq"].copy(), ts.copy()
        self.columns = {name: loaded[f"tie_col{j}"].copy() for j, name in enumerate(self.names)}
