"""The jitted SEQ engine by incremental automata (AIP, Cugola & Margara).

`SeqAipEngine(program, strings, max_instances=1_000_000, on_overflow="error")` holds the
state of one query whose program it is given (`cep_core.compiler.seq_programs.compile_aip`:
the plan, `cep_core.compiler.seq_plan`, and a generated numba kernel,
`cep_core.compiler.seq_aip`: how instances advance, LAST/FIRST witnesses, negation,
equality classes). Results — composite events, dead letters ("event time goes backwards"),
pending matches released by punctuations or flush — are identical to the reference
interpreter's (`cep_core.reference.seq`).

Evaluated: skip-till-any-match (with EACH / LAST / FIRST, parameters, negation at the start,
between steps and at the end, bounded and unbounded Kleene closure with aggregates, AND
groups, window aggregates, WITHIN and TESLA's WITHIN ... FROM, ORDER BY ts),
skip-till-next-match and strict-contiguity (runs). Refused at construction with
`NotSupportedError` naming the construct: LAST/FIRST under ORDER BY ts (the selected event
can change after a match completed, when a later event has an equal time).

Option `idle_timeout` (event-time units, None: never): idle partitions lose their stored
events and instances, counted in `metrics()["evicted_keys"]` (`cep_core.engine.seq_idle`;
with ON TIMEOUT EMIT PARTIAL their runs are reported as timed out first); idle partitions
that hold nothing then give their ids to new partitions (`metrics()["released_keys"]`),
and instance keys without instances theirs to new instance keys.

Memory. Events are kept per partition and channel only as far back as the query's horizon
(WITHIN, the TESLA chain, window aggregates), instances only until their deadline (window
eviction, per key when an event visits it and for all keys in a sweep between batches).
Under skip-till-any-match the number of instances is exponential in the worst case (every
subset of a Kleene step's candidates), so live instances per key (partition, or partition
and equality-class value) are capped by `max_instances`:
- `on_overflow="error"` (default): the batch stops at the event that would exceed the cap
  and `AipOverflowError` names it (the engine's state is then undefined: restore a
  snapshot);
- `on_overflow="count"`: the new instances beyond the cap are dropped (the matches they
  would have led to are lost) and counted in `metrics()["overflows"]`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import types
from numba.typed import Dict

from cep_core.batch import Batch, StringDictionary
from cep_core.composite_batch import ColumnBatch, CompositeBatch, to_dicts
from cep_core.engine.base import Arrays, Composite, Meta
from cep_core.engine.seq_base import F64, I64, Overflow, SeqEngineBase
from cep_core.engine.seq_checks import check_channel_state
from cep_core.engine.seq_idle import (
    Table,
    assign_instance_keys,
    drop_events,
    drop_instances,
    fill_instance_keys,
    idle_partitions,
    live_instances,
    release_empty_instance_keys,
)
from cep_core.kernels.seq_aip_runtime import expire, pool_compact
from cep_core.kernels.seq_layout import ERR, OVF, PALIVE, POOL
from cep_core.schema import AttrType


class AipOverflowError(RuntimeError):
    """An event would make a key's live automaton instances exceed `max_instances`."""


class SeqAipEngine(SeqEngineBase):
    # Set by `_reset`: instance keys (Q of them), their segments of the instance table IT,
    # the Kleene node pool (NR/NP) and the free instance key ids
    Q: int
    ibase: I64
    isize: I64
    icnt: I64
    qpart: I64
    kv: I64
    subkeys: Table
    qfree: I64
    n_qfree: int
    released_instance_keys: int
    itop: I64
    IT: I64
    NR: I64
    NP: I64
    _live_after_sweep: int
    _pool_after_compact: int

    def __init__(self, program: Any, strings: StringDictionary,
                 max_instances: int = 1_000_000, on_overflow: str = "error",
                 idle_timeout: int | None = None, **_other_options: object):
        # `program`: `cep_core.compiler.seq_programs.compile_aip`'s, shared by the query's
        # engines (Any: cep_core.engine does not import the compiler).
        super().__init__(program.checked, strings)
        if max_instances < 1:
            raise ValueError("max_instances must be at least 1")
        self.plan = program.plan
        self.kernel = program.kernel
        self.algorithm = "aip"
        self.max_instances = int(max_instances)
        self.width = self.kernel.width
        self.templates = self.kernel.templates()
        self.S = self.kernel.generator.S
        self._setup(idle_timeout, on_overflow)
        eq = self.kernel.equality
        # instances keyed by (partition, value of the equality class's attribute)
        self.class_attr: str | None = eq.attr if eq is not None and eq.attr not in self.keys.attrs \
            else None
        self.pending_kleene_slots = np.array(self.kernel.pkslots, np.int64)
        self.kslots = np.array(self.kernel.kslots, np.int64)
        self._reset()

    # ------------------------------------------------------------ state

    def _reset(self) -> None:
        self._reset_channels()
        self.Q = 0
        self.ibase = np.zeros(0, np.int64)
        self.isize = np.zeros(0, np.int64)
        self.icnt = np.zeros(0, np.int64)
        self.qpart = np.zeros(0, np.int64)
        self.kv = np.zeros(0, np.int64)
        self.subkeys = self._new_subkeys()
        self.qfree = np.zeros(16, np.int64)  # released instance key ids (a stack)
        self.n_qfree = 0
        self.released_instance_keys = 0
        self.itop = np.zeros(1, np.int64)
        self.IT = np.zeros((64, self.width), np.int64)
        self.NR = np.zeros(64, np.int64)
        self.NP = np.zeros(64, np.int64)
        self._live_after_sweep = 0
        self._pool_after_compact = 0

    _PER_SEGMENT = ("ibase", "isize", "icnt")

    def _grow_keys(self, Q: int) -> None:
        """Instance lists for keys < Q: one segment per key and stage."""
        if Q <= self.Q:
            return
        cap = len(self.icnt)
        if Q * self.S > cap:
            extra = max(Q * self.S, 2 * cap, 16) - cap
            for name in self._PER_SEGMENT:
                setattr(self, name, np.concatenate([getattr(self, name),
                                                    np.zeros(extra, np.int64)]))
        self.Q = Q

    @staticmethod
    def _new_subkeys() -> Table:
        key = types.UniTuple(types.int64, 2)  # type: ignore[no-untyped-call]  # numba's types
        table: Table = Dict.empty(key_type=key, value_type=types.int64)
        return table

    @staticmethod
    def _class_values(batch: Batch, attr: str) -> I64:
        """The class attribute as int64 (floats by their bits, -0.0 as 0.0)."""
        column = batch.columns[attr]
        if column.dtype == np.float64:
            return np.ascontiguousarray(column + 0.0).view(np.int64)
        return np.ascontiguousarray(column, dtype=np.int64)

    # ------------------------------------------------------------ processing

    def process_columns(self, batch: Batch) -> list[CompositeBatch]:
        pid = self._keyed(batch)
        if pid is None:
            return []
        n = len(pid)
        if self.class_attr is not None:
            qid, self.qpart, self.kv, Q, self.n_qfree = assign_instance_keys(
                pid, self._class_values(batch, self.class_attr), self.subkeys, self.qpart,
                self.kv, self.Q, self.qfree, self.n_qfree)
            self._grow_keys(Q)
        else:
            qid = pid
            if len(self.qpart) < self.P:
                self.qpart = np.arange(max(2 * self.P, 16), dtype=np.int64)
            self._grow_keys(self.P)
        EI, EF = self._columns(batch)
        sc, tables = self._strings()
        stop = self.on_overflow is Overflow.ERROR
        (n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn, n_dead, dead, self.pd, self.pk,
         self.IT, self.NR, self.NP, arenas, *timed_out) = self.module.process(
            n, pid, qid, EI, EF, *self._arenas(), self.base, self.size, self.cnt,
            self.evicted, self.top, self.last_ts, self.IT, self.ibase, self.isize, self.icnt,
            self.itop, self.templates, self.NR, self.NP, self.pd, self.pk, self.phead,
            self.ptail, self.pdec, self.pfirst, self.ctr, self.punct,
            sc, *tables, self.max_instances, stop)
        # Deliberately like cep_core/engine/seq.py's: each engine calls its own kernel, then takes
        # back what it grew
        self._take_arenas(arenas)
        self._reject_backwards(batch, dead, n_dead)
        if self.ctr[ERR] >= 0:
            t = int(self.ctr[ERR])
            raise AipOverflowError(
                f"query {self.checked.name!r}: the event with seq {int(batch.seq[t])} would "
                f"make more than {self.max_instances} live automaton instances in its "
                "partition (option max_instances; on_overflow='count' drops the excess and "
                "counts it)")
        out: list[CompositeBatch] = [self._decode(n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn)]
        if timed_out:
            out.append(self._decode_timed_out(*timed_out))
        self.idle.advance(batch.ts.max())
        out += self._sweep()
        self._maintain()
        return [b for b in out if len(b)]

    def punctuate(self, ts: int) -> list[Composite]:
        return to_dicts(self.punctuate_columns(ts))

    def punctuate_columns(self, ts: int) -> list[CompositeBatch]:
        if ts > self.punct:
            self.punct = int(ts)
        out = self._release_all(False) + self._time_out_all(False)
        self.idle.advance(ts)
        return [b for b in out + self._sweep() if len(b)]

    def flush(self) -> list[Composite]:
        return to_dicts(self.flush_columns())

    def flush_columns(self) -> list[CompositeBatch]:
        return [b for b in self._release_all(True) + self._time_out_all(True) if len(b)]

    def _time_out_all(self, force: bool,
                      parts: I64 | None = None) -> list[CompositeBatch]:
        """ON TIMEOUT EMIT PARTIAL: the runs of `parts` (default: every partition) whose
        window event time (or, with force, the end of input) has passed, as timed-out
        partial matches."""
        if not self.kernel.generator.timeouts:
            return []
        if parts is None:
            parts = np.arange(self.P, dtype=np.int64)
        res = self.module.time_out_all(
            self.punct, force, *self._arenas(), self.base, self.cnt, self.evicted,
            self.last_ts, self.IT, self.ibase, self.icnt, self.NR, self.NP, parts)
        return [self._decode_timed_out(*res)]

    def _sweep(self) -> list[CompositeBatch]:
        """Idle-key eviction (`cep_core.engine.seq_idle`); the runs of an evicted partition
        are reported as timed out first when the query asks for them. Then idle partitions
        that hold nothing, and instance keys without instances, give their ids to new
        ones."""
        timeout = self.idle.timeout
        if timeout is None or not self.idle.due():
            return []
        self._expire()
        P, Q = self.P, self.Q
        live = live_instances(self.qpart, self.icnt, self.S, Q, P)
        parts = idle_partitions(self.idle.clock, timeout, self.last_ts, self.cnt,
                                self.phead, live, P, True)
        out: list[CompositeBatch] = []
        if len(parts):
            out = self._time_out_all(True, parts)
            drop_instances(parts, self.qpart, self.icnt, self.S, Q, P)
            drop_events(parts, self.cnt, self.evicted)
            self.idle.evicted += len(parts)
            live = live_instances(self.qpart, self.icnt, self.S, Q, P)
        if self.class_attr is not None:
            self._release_instance_keys()
        self._release(idle_partitions(self.idle.clock, timeout, self.last_ts,
                                      self.cnt, self.phead, live, P, False))
        return out

    def _release_instance_keys(self) -> None:
        if len(self.qfree) < self.Q:
            self.qfree = np.concatenate([self.qfree[:self.n_qfree],
                                         np.zeros(self.Q, np.int64)])
        before = self.n_qfree
        self.n_qfree = release_empty_instance_keys(self.subkeys, self.qpart, self.kv,
                                                   self.icnt, self.S, self.Q, self.qfree,
                                                   self.n_qfree)
        self.released_instance_keys += self.n_qfree - before

    def _release_all(self, force: bool) -> list[CompositeBatch]:
        if self.ctr[PALIVE] == 0:
            return []
        sc, tables = self._strings()
        res = self.module.release_all(
            self.punct, force, *self._arenas(), self.base, self.cnt, self.evicted,
            self.last_ts, self.pd, self.pk, self.phead, self.ptail, self.pdec, self.pfirst,
            self.ctr, sc, *tables)
        out = self._decode(*res)
        self._maybe_compact_pending()
        return [out]

    # ------------------------------------------------------------ memory

    def _maintain(self, force: bool = False) -> None:
        """Between batches: drop expired instances of every key, reclaim pool nodes,
        compact the pending table."""
        G = self.Q * self.S
        live = int(self.icnt[:G].sum())
        if force or live > 2 * self._live_after_sweep + 4096:
            self._expire()
        top = int(self.ctr[POOL])
        if len(self.kslots) and (force or top > 2 * self._pool_after_compact + 4096):
            self.NR, self.NP, m = pool_compact(self.IT, self.ibase[:G], self.icnt[:G],
                                               self.kslots, self.NR, self.NP, top)
            self.ctr[POOL] = m
            self._pool_after_compact = int(m)
        self._maybe_compact_pending(force)

    def _expire(self) -> None:
        """Drop the instances past their deadline, of every key."""
        G = self.Q * self.S
        segpart = np.repeat(np.maximum(self.qpart[:self.Q], 0), self.S)  # -1: released
        self._live_after_sweep = int(expire(self.IT, self.ibase[:G], self.icnt[:G], segpart,
                                            self.last_ts))

    def metrics(self) -> dict[str, int]:
        return {"partitions": self.P, "keys": self.Q, "overflows": int(self.ctr[OVF]),
                "instances": int(self.icnt[:self.Q * self.S].sum()),
                "pending": int(self.ctr[PALIVE]),
                "pool_nodes": int(self.ctr[POOL]),
                "stored_events": int(self.cnt[:self.P].sum()),
                "evicted_keys": self.idle.evicted, "released_keys": self.idle.released,
                "released_instance_keys": self.released_instance_keys}

    # ------------------------------------------------------------ string compaction

    def _class_holds_strings(self) -> bool:
        return self.class_attr is not None and \
            self.schema.attributes[self.class_attr] == AttrType.STRING

    def _more_string_codes(self) -> list[I64]:
        """The class values of live instance keys, when they are strings."""
        if not self._class_holds_strings():
            return []
        return [self.kv[:self.Q][self.qpart[:self.Q] >= 0]]

    def _remap_more_strings(self, new_code: I64) -> None:
        if not self._class_holds_strings():
            return
        live = np.flatnonzero(self.qpart[:self.Q] >= 0)
        self.kv[live] = new_code[self.kv[live]]
        self.subkeys = self._new_subkeys()
        fill_instance_keys(self.subkeys, self.qpart, self.kv, self.Q)

    # ------------------------------------------------------------ decoding

    def _decode_timed_out(self, n_out: int, n_el: int, om: I64, oe_i: I64, oe_f: F64
                          ) -> ColumnBatch:
        """Partial matches: the variables bound so far, no EMIT fields, "timed_out"."""
        none, nonef = np.zeros((n_out, 0), np.int64), np.zeros((n_out, 0), np.float64)
        return self.output.columns(n_out, n_el, om, oe_i, oe_f, none, nonef, none,
                                   timed_out=True)

    # ------------------------------------------------------------ snapshots

    def state(self) -> tuple[Meta, Arrays]:
        self._maintain(force=True)
        meta, arrays = self._channel_state()
        Q = self.Q
        G = Q * self.S
        meta["instance_keys"] = Q
        meta["released_instance_keys"] = self.released_instance_keys
        arrays.update({"icnt": self.icnt[:G], "qpart": self.qpart[:Q], "kv": self.kv[:Q],
                       "NR": self.NR[:int(self.ctr[POOL])], "NP": self.NP[:int(self.ctr[POOL])],
                       "qfree": self.qfree[:self.n_qfree]})
        rows = [self.IT[self.ibase[g]:self.ibase[g] + self.icnt[g]] for g in range(G)]
        arrays["IT"] = np.concatenate(rows) if rows else np.zeros((0, self.width), np.int64)
        return meta, arrays

    def load_state(self, meta: Meta, arrays: Arrays) -> None:
        check_channel_state(self, meta, arrays, len(self.strings))  # (not its instances)
        self._reset()
        self._load_channel_state(meta, arrays)
        Q = int(meta["instance_keys"])
        self._grow_keys(Q)
        nr, np_ = arrays["NR"], arrays["NP"]
        self.NR = np.zeros(max(64, 2 * len(nr)), np.int64)
        self.NP = np.zeros(max(64, 2 * len(nr)), np.int64)
        self.NR[:len(nr)] = nr
        self.NP[:len(nr)] = np_
        self._pool_after_compact = len(nr)
        # keys and their instances: one segment per key and stage
        self.qpart = np.zeros(max(2 * Q, 16), np.int64)
        self.kv = np.zeros(max(2 * Q, 16), np.int64)
        self.qpart[:Q] = arrays["qpart"]
        self.kv[:len(arrays["kv"])] = arrays["kv"]
        free = arrays.get("qfree", np.zeros(0, np.int64))
        self.qfree = np.zeros(max(16, 2 * len(free)), np.int64)
        self.qfree[:len(free)] = free
        self.n_qfree = len(free)
        self.released_instance_keys = int(meta.get("released_instance_keys", 0))
        if self.class_attr is not None:
            fill_instance_keys(self.subkeys, self.qpart, self.kv, Q)
        else:  # key = partition, also for the partitions still to come (process grows it)
            self.qpart = np.arange(max(2 * Q, 16), dtype=np.int64)
        icnt = arrays["icnt"].astype(np.int64)
        sizes = np.where(icnt > 0, np.maximum(2 * icnt, 8), 0)
        total = max(64, 2 * int(sizes.sum()))
        self.IT = np.zeros((total, self.width), np.int64)
        rows = arrays["IT"]
        at = offset = 0
        for g in range(len(icnt)):
            k = int(icnt[g])
            self.IT[at:at + k] = rows[offset:offset + k]
            self.ibase[g] = at
            self.isize[g] = sizes[g]
            self.icnt[g] = k
            at += int(sizes[g])
            offset += k
        self.itop[0] = at
        self._live_after_sweep = int(icnt.sum())
