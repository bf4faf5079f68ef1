"""The jitted SEQ engine by column-based delayed processing (CDP, Cugola & Margara).

`SeqEngine(checked, strings, algorithm="auto"|"cdp", **options)` plans the query
(`cep_core.compiler.seq_plan`) and runs it with a generated numba kernel
(`cep_core.compiler.seq_cdp`): per-type columns per partition, matches built back from each
terminator. It evaluates skip-till-any-match queries (with TESLA's EACH / LAST / FIRST).

The planner is `cep_core.engine.create_engine`: skip-till-next-match, strict-contiguity and
a forced `algorithm="aip"` go to the incremental automata (`cep_core.engine.seq_aip`),
everything else here. Asked directly for "aip" or a run strategy, SeqEngine raises
`NotSupportedError` naming it.

Options (others are ignored, so one option set can serve every engine kind):
- `max_matches_per_event` (default 1,000,000) and `max_subsets_per_event` (Kleene subsets
  examined, default 10,000,000): the most one arriving event may produce / examine. Under
  skip-till-any-match the number of matches is exponential in the worst case; past either
  limit the engine stops building matches for that event.
- `on_overflow`: "error" (default) raises `SeqOverflowError` naming the event and the limit
  (the engine's state is then undefined: restore a snapshot); "count" keeps the matches
  found up to the limit, drops the rest and counts the event in `metrics()["overflows"]`.
- `idle_timeout` (event-time units, None: never): idle partitions lose their stored
  events, counted in `metrics()["evicted_keys"]` (`cep_core.engine.seq_idle`).

Results (composite events, dead letters, pending matches released by punctuations or
flush) are identical to the reference interpreter's (`cep_core.reference.seq`). Composite
events are read-only: an event bound by several composites returned by one call is one
dict shared by them.

Memory: a partition keeps, per channel, the events within the query's horizon (WITHIN, or
the TESLA chain of `WITHIN w FROM y`, plus the longest window aggregate) of its latest
event or oldest pending match; older rows are evicted when its table fills or the arena is
compacted. Without any window the events are kept, as the reference keeps them.
"""

from __future__ import annotations

import numpy as np

from cep_core.batch import Batch, StringDictionary
from cep_core.checker import CheckedQuery
from cep_core.compiler.expressions import StringTables
from cep_core.compiler.seq_cdp import (
    CTR_SIZE,
    ERR,
    INT64_MAX,
    INT64_MIN,
    OVF,
    PALIVE,
    PKN,
    PN,
    CdpKernel,
)
from cep_core.compiler.seq_plan import SeqPlan
from cep_core.compiler.seq_runtime import compact_pending
from cep_core.composite_batch import ColumnBatch, CompositeBatch
from cep_core.engine.base import Engine
from cep_core.engine.seq_output import SeqOutput
from cep_core.engine.keys import KeyIndex
from cep_core.engine.seq_idle import IdleKeys, drop_events, idle_partitions

BACKWARDS_TIME = "event time goes backwards"
ALGORITHMS = ("auto", "cdp", "aip")

_kernels: dict[str, CdpKernel] = {}


class NotSupportedError(NotImplementedError):
    """The engine cannot evaluate this query with the requested algorithm (yet)."""


class SeqOverflowError(RuntimeError):
    """One event would produce more matches (or examine more Kleene subsets) than allowed."""


def _kernel(plan: SeqPlan) -> CdpKernel:
    kernel = CdpKernel(plan)
    return _kernels.setdefault(kernel.source, kernel)


class SeqEngine(Engine):
    def __init__(self, checked: CheckedQuery, strings: StringDictionary,
                 algorithm: str = "auto", max_matches_per_event: int = 1_000_000,
                 max_subsets_per_event: int = 10_000_000, on_overflow: str = "error",
                 idle_timeout: int | None = None, **_other_options):
        super().__init__(checked, strings)
        self.idle = IdleKeys(idle_timeout)
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown SEQ algorithm {algorithm!r} (one of "
                             f"{', '.join(ALGORITHMS)})")
        if on_overflow not in ("error", "count"):
            raise ValueError("on_overflow is 'error' or 'count'")
        self.plan = plan = SeqPlan(checked)
        if algorithm == "aip" or plan.uses_runs:
            why = "algorithm 'aip'" if algorithm == "aip" else \
                f"USING {plan.strategy.value} (runs)"
            raise NotSupportedError(
                f"query {checked.name!r}: {why} is evaluated by incremental automata "
                "(cep_core.engine.seq_aip.SeqAipEngine; create_engine plans it), not by "
                "the CDP engine")
        algorithm = "cdp"
        self.algorithm = algorithm
        self.max_matches = int(max_matches_per_event)
        self.max_subsets = int(max_subsets_per_event)
        self.on_overflow = on_overflow
        self.kernel = _kernel(plan)
        self.module = self.kernel.module
        self.layout = self.kernel.layout
        self.n_channels = len(plan.channels)
        self.keys = KeyIndex([a.name for a in self.query.partition_by])
        self.uses_tables = any(f"s_{t}[" in self.kernel.source
                               for t in ("rank", "lower", "upper", "length"))
        self._tables: StringTables | None = None
        self.kleene_slots = np.array(self.kernel.kleene_slots, np.int64)
        self._decoders()
        self._reset()

    # ------------------------------------------------------------ state

    def _reset(self) -> None:
        C = self.n_channels
        self.P = 0
        self.last_ts = np.full(0, INT64_MIN, np.int64)
        self.base = np.zeros((0, C), np.int64)
        self.size = np.zeros((0, C), np.int64)
        self.cnt = np.zeros((0, C), np.int64)
        self.evicted = np.zeros((0, C), np.int64)
        self.top = np.zeros(C, np.int64)
        self.phead = np.full(0, -1, np.int64)
        self.ptail = np.full(0, -1, np.int64)
        self.pdec = np.full(0, INT64_MAX, np.int64)
        self.pfirst = np.full(0, INT64_MAX, np.int64)
        self.pd = np.zeros((16, self.kernel.record_width), np.int64)
        self.pk = np.zeros(16, np.int64)
        self.ctr = np.zeros(CTR_SIZE, np.int64)
        self.ctr[ERR] = -1
        self.punct = INT64_MIN
        nI, nF = self.layout.n_int, self.layout.n_float
        self.AI = [np.zeros((64, nI), np.int64) for _ in range(C)]
        self.AF = [np.zeros((64, nF), np.float64) for _ in range(C)]

    _PER_PARTITION = {"last_ts": INT64_MIN, "phead": -1, "ptail": -1, "pdec": INT64_MAX,
                      "pfirst": INT64_MAX}
    _PER_CHANNEL = ("base", "size", "cnt", "evicted")

    def _grow_partitions(self, P: int) -> None:
        """Per-partition arrays for partition ids < P (capacity grows by doubling)."""
        if P <= self.P:
            return
        cap = len(self.last_ts)
        if P > cap:
            extra = max(P, 2 * cap, 16) - cap
            for name, fill in self._PER_PARTITION.items():
                setattr(self, name, np.concatenate([getattr(self, name),
                                                    np.full(extra, fill, np.int64)]))
            for name in self._PER_CHANNEL:
                setattr(self, name, np.concatenate([
                    getattr(self, name), np.zeros((extra, self.n_channels), np.int64)]))
        self.P = P

    def _strings(self):
        sc = self.kernel.constants.codes(self.strings)
        if self.uses_tables:
            if self._tables is None:
                self._tables = StringTables(self.strings)
            self._tables.refresh()
            tables = self._tables.arrays()
        else:
            dummy = np.zeros(1, np.int64)
            tables = (dummy, dummy, dummy, dummy)
        return sc, tables

    def _arenas(self) -> list:
        out = []
        for c in range(self.n_channels):
            out += [self.AI[c], self.AF[c]]
        return out

    # ------------------------------------------------------------ processing

    def _columns(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        n = len(batch)
        EI = np.empty((n, self.layout.n_int), np.int64)
        EI[:, 0] = batch.seq
        EI[:, 1] = batch.ts
        for k, name in enumerate(self.layout.int_names):
            EI[:, 2 + k] = batch.columns[name]
        EF = np.zeros((n, self.layout.n_float), np.float64)
        for k, name in enumerate(self.layout.float_names):
            EF[:, k] = batch.columns[name]
        return EI, EF

    def process_columns(self, batch: Batch) -> list[CompositeBatch]:
        n = len(batch)
        if n == 0:
            return []
        pid = self.keys.assign(batch)
        self._grow_partitions(len(self.keys))
        EI, EF = self._columns(batch)
        sc, tables = self._strings()
        stop = self.on_overflow == "error"
        (n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn, n_dead, dead, self.pd, self.pk,
         arenas) = self.module.process(
            n, pid, EI, EF, *self._arenas(), self.base, self.size, self.cnt, self.evicted,
            self.top, self.last_ts, self.pd, self.pk, self.phead, self.ptail, self.pdec,
            self.pfirst, self.ctr, self.punct, sc, *tables, self.max_matches,
            self.max_subsets, stop)
        self.AI = list(arenas[0::2])
        self.AF = list(arenas[1::2])
        for t in dead[:n_dead].tolist():
            self.dead_letters.append((int(batch.seq[t]), BACKWARDS_TIME))
        if self.ctr[ERR] >= 0:
            t = int(self.ctr[ERR])
            raise SeqOverflowError(
                f"query {self.checked.name!r}: the event with seq {int(batch.seq[t])} would "
                f"build more than {self.max_matches} matches or examine more than "
                f"{self.max_subsets} Kleene subsets (options max_matches_per_event, "
                "max_subsets_per_event; on_overflow='count' drops the excess and counts it)")
        out = self._decode(n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn)
        self._maybe_compact()
        self.idle.advance(batch.ts.max())
        self._sweep()
        return [out] if len(out) else []

    def punctuate(self, ts: int) -> list[dict]:
        if ts > self.punct:
            self.punct = int(ts)
        out = self._release_all(False)
        self.idle.advance(ts)
        self._sweep()
        return out

    def _sweep(self) -> None:
        if not self.idle.due():
            return
        P = self.P
        parts = idle_partitions(self.idle.clock, self.idle.timeout, self.last_ts, self.cnt,
                                self.phead, np.zeros(P, np.int64), P)
        drop_events(parts, self.cnt, self.evicted)
        self.idle.evicted += len(parts)

    def flush(self) -> list[dict]:
        return self._release_all(True)

    def _release_all(self, force: bool) -> list[dict]:
        if self.ctr[PALIVE] == 0:
            return []
        sc, tables = self._strings()
        res = self.module.release_all(
            self.punct, force, *self._arenas(), self.base, self.cnt, self.evicted, self.last_ts,
            self.pd,
            self.pk, self.phead, self.ptail, self.pdec, self.pfirst, self.ctr, sc, *tables)
        out = self._decode(*res).to_dicts()
        self._maybe_compact()
        return out

    def _maybe_compact(self, force: bool = False) -> None:
        used, alive = int(self.ctr[PN]), int(self.ctr[PALIVE])
        if used == 0 or (not force and used - alive < max(1024, alive)):
            return
        self.pd, self.pk = compact_pending(
            self.pd, self.pk, self.phead[:self.P], self.ptail[:self.P], self.ctr,
            self.kleene_slots, alive, int(self.ctr[PKN]))

    def metrics(self) -> dict:
        return {"partitions": self.P, "overflows": int(self.ctr[OVF]),
                "pending": int(self.ctr[PALIVE]),
                "stored_events": int(self.cnt[:self.P].sum()),
                "evicted_keys": self.idle.evicted}

    # ------------------------------------------------------------ decoding

    def _decoders(self) -> None:
        self.output = SeqOutput(self)

    def _decode(self, n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn) -> ColumnBatch:
        return self.output.columns(n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn)

    # ------------------------------------------------------------ snapshots

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        self._maybe_compact(force=True)
        P = self.P
        meta = {"keys": self.keys.to_state(), "punct": int(self.punct), "partitions": P,
                "algorithm": self.algorithm,
                "idle": [self.idle.clock, self.idle.last_sweep, self.idle.evicted]}
        arrays = {"last_ts": self.last_ts[:P], "cnt": self.cnt[:P],
                  "evicted": self.evicted[:P], "phead": self.phead[:P],
                  "ptail": self.ptail[:P], "pdec": self.pdec[:P], "pfirst": self.pfirst[:P],
                  "ctr": self.ctr, "pd": self.pd[:int(self.ctr[PN])],
                  "pk": self.pk[:int(self.ctr[PKN])]}
        nI, nF = self.layout.n_int, self.layout.n_float
        for c in range(self.n_channels):
            parts_i = [self.AI[c][self.base[p, c]:self.base[p, c] + self.cnt[p, c]]
                       for p in range(P)]
            parts_f = [self.AF[c][self.base[p, c]:self.base[p, c] + self.cnt[p, c]]
                       for p in range(P)]
            arrays[f"ch{c}_i"] = np.concatenate(parts_i) if parts_i else np.zeros((0, nI),
                                                                                 np.int64)
            arrays[f"ch{c}_f"] = np.concatenate(parts_f) if parts_f else np.zeros((0, nF))
        return meta, arrays

    def load_state(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        self._reset()
        self.keys = KeyIndex.from_state(self.keys.attrs, meta["keys"])
        self.output.forget_keys()
        P = int(meta["partitions"])
        self._grow_partitions(P)
        self.punct = int(meta["punct"])
        self.idle.clock, self.idle.last_sweep, self.idle.evicted = meta["idle"]
        for name in ("last_ts", "cnt", "evicted", "phead", "ptail", "pdec", "pfirst"):
            getattr(self, name)[:P] = arrays[name]
        self.ctr = arrays["ctr"].astype(np.int64).copy()
        pd, pk = arrays["pd"], arrays["pk"]
        self.pd = np.zeros((max(16, 2 * len(pd)), self.kernel.record_width), np.int64)
        self.pd[:len(pd)] = pd
        self.pk = np.zeros(max(16, 2 * len(pk)), np.int64)
        self.pk[:len(pk)] = pk
        nI, nF = self.layout.n_int, self.layout.n_float
        for c in range(self.n_channels):
            rows_i, rows_f = arrays[f"ch{c}_i"], arrays[f"ch{c}_f"]
            sizes = [max(8, 2 * int(k)) for k in self.cnt[:P, c]]
            total = max(64, 2 * sum(sizes))
            self.AI[c] = np.zeros((total, nI), np.int64)
            self.AF[c] = np.zeros((total, nF), np.float64)
            at = offset = 0
            for p in range(P):
                k = int(self.cnt[p, c])
                self.AI[c][at:at + k] = rows_i[offset:offset + k]
                self.AF[c][at:at + k] = rows_f[offset:offset + k]
                self.base[p, c] = at
                self.size[p, c] = sizes[p]
                at += sizes[p]
                offset += k
            self.top[c] = at
