"""The GPU SEQ engine: column-based delayed processing on numba's CUDA target.

`GpuSeqEngine(checked, strings, **options)` runs a SEQ query of the supported subset
(`cep_accel.gpu.seq_support`) with the kernels of `cep_accel.gpu.seq_kernels`; composite events,
dead letters and snapshots are those of the CPU engines (`cep_core.engine.seq`), and equal
to the reference interpreter's.

Per batch: event-time check and appends to the per-type column rings on the host, new rows
copied to the device asynchronously; then every terminator of the batch (an event of the
last step's type) starts one partial sequence, and each step, last to first, is one kernel
launch over every partial sequence of the batch (window bounds by binary search on the
host). EACH output is sorted by (parent, row), so the result is in the CPU engine's order.

Options: `device_memory_budget` (bytes; default: the device's free memory, unlimited under
the simulator): when the columns would exceed it they stay in host memory and are copied to
the device when a batch has terminators; `threads_per_block` (default 128).

String compaction: string codes are in partition keys and in the rows the rings keep; after
a remap the device mirror is copied again whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from cep_accel.gpu import device
from cep_accel.gpu.columns import ChannelRings, Residence
from cep_accel.gpu.host_kernels import accept_in_time, gather
from cep_accel.gpu.seq_kernels import SeqKernels
from cep_accel.gpu.seq_support import unsupported_reason
from cep_core import ast
from cep_core.arrow_numpy import segment_rows
from cep_core.batch import Batch, StringDictionary
from cep_core.checked import CheckedQuery
from cep_core.composite_batch import ColumnBatch
from cep_core.kernels.string_tables import StringTables
from cep_core.compiler.seq_plan import SeqPlan, Var
from cep_core.engine.base import Engine
from cep_core.engine.keys import KeyIndex
from cep_core.engine.seq import BACKWARDS_TIME, NotSupportedError
from cep_core.engine.seq_base import F64, I64, SeqEngineBase, string_columns
from cep_core.engine.seq_output import SeqOutput
from cep_core.schema import AttrType

INT64_MIN = np.iinfo(np.int64).min
INT64_MAX = np.iinfo(np.int64).max
_kernels: dict[str, SeqKernels] = {}


def _load(plan: SeqPlan, reduce_threads: int) -> SeqKernels:
    kernels = SeqKernels(plan, reduce_threads)
    return _kernels.setdefault(kernels.source, kernels)


class GpuSeqEngine(Engine):
    # partitions and event rows of a batch, decoding composite events, and which key
    # attributes are strings, as the CPU engines: their methods, typed for any self (they
    # read the attributes both engines have, not a SeqEngineBase's)
    _keyed: ClassVar[Callable[[Any, Batch], I64 | None]] = SeqEngineBase._keyed
    _columns: ClassVar[Callable[[Any, Batch], tuple[I64, F64]]] = SeqEngineBase._columns
    _decode: ClassVar[Callable[[Any, int, int, I64, I64, F64, I64, F64, I64], ColumnBatch]] = \
        SeqEngineBase._decode
    _key_string_positions: ClassVar[Callable[[Any], list[int]]] = \
        SeqEngineBase._key_string_positions

    def __init__(self, checked: CheckedQuery, strings: StringDictionary,
                 device_memory_budget: int | None = None, threads_per_block: int = 128,
                 **_other_options: Any):
        super().__init__(checked, strings)
        self.plan = plan = SeqPlan(checked)
        reason = unsupported_reason(plan)
        if reason is not None:
            raise NotSupportedError(f"query {checked.name!r}: {reason}")
        if not device.usable():
            raise NotSupportedError("no CUDA device (and the CUDA simulator is off)")
        self.cuda = device.cuda()
        self.tpb = int(threads_per_block)
        self.kernels = _load(plan, 8 if device.simulated() else 64)
        self.layout = self.kernels.layout
        self.budget = device_memory_budget if device_memory_budget is not None \
            else device.free_memory()
        self.keys = KeyIndex([a.name for a in self.query.partition_by])
        self.stream = self.cuda.stream()
        self._tables: StringTables | None = None
        self.output = SeqOutput(self)
        self._reset()

    def _reset(self) -> None:
        resident = Residence.DEVICE
        self.rings = [ChannelRings(self.layout.n_int, self.layout.n_float, resident)
                      for _ in self.plan.channels]
        self.last_ts = np.full(0, INT64_MIN, np.int64)
        self.P = 0

    @property
    def resident(self) -> Residence:
        return self.rings[0].resident

    def _grow_partitions(self, P: int) -> None:
        if P <= self.P:
            return
        self.last_ts = np.concatenate([self.last_ts, np.full(P - self.P, INT64_MIN,
                                                             np.int64)])
        for ring in self.rings:
            ring.grow_partitions(P)
        self.P = P

    def _check_memory(self) -> None:
        if self.budget is None or self.resident is Residence.HOST:
            return
        if sum(r.nbytes() for r in self.rings) > self.budget:
            for ring in self.rings:
                ring.drop_device()

    # ------------------------------------------------------------ processing

    def process(self, batch: Batch) -> list[dict]:
        # The same first steps as the CPU engine's (cep_core.engine.seq.SeqEngine.
        # process_columns), then the device's launches.
        pid = self._keyed(batch)
        if pid is None:
            return []
        n = len(pid)
        EI, EF = self._columns(batch)
        threshold = None
        if self.plan.horizon is not None:
            threshold = np.maximum(self.last_ts, INT64_MIN + self.plan.horizon) - \
                self.plan.horizon
        ok = accept_in_time(pid, EI[:, 1], self.last_ts)
        for t in np.flatnonzero(~ok).tolist():
            self.dead_letters.append((int(batch.seq[t]), BACKWARDS_TIME))
        sc = self.kernels.constants.codes(self.strings)
        absrows = []
        type_col = None
        if self.schema.type_attribute is not None:
            type_col = EI[:, self.layout.slots[self.schema.type_attribute][1]]
        for c, name in enumerate(self.plan.channels):
            member = (ok if name == ast.ANY_TYPE
                      else ok & (type_col == sc[self.kernels.type_consts[name]]))
            absrow = np.full(n, -1, np.int64)
            self.rings[c].append(pid, EI, EF, np.flatnonzero(member), absrow, threshold)
            absrows.append(absrow)
        self._check_memory()
        for ring in self.rings:
            ring.sync(self.stream)
        last = self.plan.variables[self.plan.items[-1].step.var]
        terminators = np.flatnonzero(absrows[last.channel] >= 0)
        if len(terminators) == 0:
            return []
        return self._build(pid[terminators], absrows[last.channel][terminators],
                           EI[terminators, 1], sc)

    def _strings(self) -> tuple[np.ndarray, ...]:
        if self._tables is None:
            self._tables = StringTables(self.strings)
        self._tables.refresh()
        return self._tables.arrays()

    def _build(self, parts: I64, term_rows: I64, term_ts: I64, sc: I64) -> list[dict]:
        cuda, stream = self.cuda, self.stream
        plan = self.plan
        nv = len(plan.positive)
        arenas = []
        for ring in self.rings:
            arenas += list(ring.device_arrays(stream))
        RB = cuda.to_device(np.stack([r.base for r in self.rings], axis=1), stream=stream)
        RC = cuda.to_device(np.stack([r.cap for r in self.rings], axis=1), stream=stream)
        tail = (*arenas, RB, RC, cuda.to_device(sc, stream=stream),
                *(cuda.to_device(t, stream=stream) for t in self._strings()))
        # partial sequences: one per terminator
        S = len(parts)
        B = np.full((S, nv), -1, np.int64)
        lo, hi = term_rows.copy(), term_rows + 1
        for i in range(len(plan.items) - 1, -1, -1):
            if i < len(plan.items) - 1:
                lo, hi = self._range(i, B, parts, term_ts)
            B, parts, term_ts = self._level(i, B, parts, term_ts, lo, hi, tail)
            if len(B) == 0:
                return []
        return self._finish(B, parts, tail)

    def _range(self, i: int, B: I64, parts: I64, term_ts: I64) -> tuple[I64, I64]:
        """Rows of step i's column each partial sequence admits: [lo, hi)."""
        plan = self.plan
        step = plan.items[i].step
        ring = self.rings[plan.variables[step.var].channel]
        lows = np.full(len(B), INT64_MIN, np.int64)
        if plan.window is not None:
            lows = np.maximum(lows, term_ts - plan.window)
        within = plan.step_within(step)
        if within is not None and step.anchor is not None:  # WITHIN w FROM anchor: both
            anchor = plan.variables[step.anchor]
            lows = np.maximum(lows, self._values(anchor, B, parts, 1) - within)
        lo = ring.lower_bound(1, parts, lows)
        nxt = plan.variables[plan.items[i + 1].step.var]
        hi = ring.lower_bound(0, parts, self._values(nxt, B, parts, 0))
        return lo, np.maximum(hi, lo)

    def _values(self, var: Var, B: I64, parts: I64, col: int) -> I64:
        """Column `col` (0: seq, 1: ts) of the rows bound to `var`."""
        ring = self.rings[var.channel]
        out = np.zeros((len(B), self.layout.n_int), np.int64)
        gather(ring.HI, ring.base, ring.cap, parts, B[:, var.index].copy(), out)
        return out[:, col]

    def _launch(self, kernel: Any, total: int, *args: Any) -> None:  # a numba CUDA kernel
        if total > 0:
            blocks = (total + self.tpb - 1) // self.tpb
            kernel[blocks, self.tpb, self.stream](*args)

    def _level(self, i: int, B: I64, parts: I64, term_ts: I64, lo: I64, hi: I64,
               tail: tuple[Any, ...]) -> tuple[I64, I64, I64]:
        cuda, stream = self.cuda, self.stream
        step = self.plan.items[i].step
        v = self.plan.variables[step.var].index
        policy = None if i == len(self.plan.items) - 1 else step.policy
        S = len(B)
        off = np.zeros(S + 1, np.int64)
        np.cumsum(hi - lo, out=off[1:])
        total = int(off[-1])
        if total == 0:
            return B[:0], parts[:0], term_ts[:0]
        select = policy in (ast.Policy.LAST, ast.Policy.FIRST)
        init = -1 if policy is ast.Policy.LAST else INT64_MAX
        d_sel = cuda.to_device(np.full(S if select else 1, init, np.int64), stream=stream)
        d_count = cuda.to_device(np.zeros(1, np.int64), stream=stream)
        cap_out = 1 if select else total
        d_par = cuda.device_array(cap_out, np.int64, stream=stream)
        d_row = cuda.device_array(cap_out, np.int64, stream=stream)
        self._launch(self.kernels.level(i), total, S, total, cuda.to_device(B, stream=stream),
                     cuda.to_device(parts, stream=stream), cuda.to_device(lo, stream=stream),
                     cuda.to_device(off, stream=stream), d_par, d_row, d_count, d_sel, *tail)
        if select:
            sel = d_sel.copy_to_host(stream=stream)
            stream.synchronize()
            keep = np.flatnonzero(sel != init)
            par, row = keep, sel[keep]
        else:
            count = int(d_count.copy_to_host(stream=stream)[0])
            par = d_par.copy_to_host(stream=stream)[:count]
            row = d_row.copy_to_host(stream=stream)[:count]
            stream.synchronize()
            order = np.lexsort((row, par))
            par, row = par[order], row[order]
        B = B[par]
        B[:, v] = row
        return B, parts[par], term_ts[par]

    def _finish(self, B: I64, parts: I64, tail: tuple[Any, ...]) -> list[dict]:
        cuda, stream, plan = self.cuda, self.stream, self.plan
        M = len(B)
        d_B, d_sp = cuda.to_device(B, stream=stream), cuda.to_device(parts, stream=stream)
        aggs = []
        for k, use in enumerate(self.kernels.uses):
            anchor = plan.variables[use.node.anchor]
            ring = self.rings[use.channel]
            wlo = ring.lower_bound(1, parts, self._values(anchor, B, parts, 1) - use.within)
            whi = np.maximum(ring.lower_bound(0, parts, self._values(anchor, B, parts, 0)),
                             wlo)
            kind = self.schema.attributes.get(use.node.attr) if use.node.attr else "int"
            d_v = cuda.device_array(M, np.float64 if kind == AttrType.FLOAT else np.int64,
                                    stream=stream)
            d_n = cuda.device_array(M, np.int64, stream=stream)
            self.kernels.wagg(k)[M, self.kernels.reduce_threads, stream](
                d_B, d_sp, cuda.to_device(wlo, stream=stream),
                cuda.to_device(whi, stream=stream), d_v, d_n, *tail)
            aggs += [d_v, d_n]
        E = self.kernels.n_emit
        d_keep = cuda.device_array(M, np.int64, stream=stream)
        d_ovi = cuda.device_array((M, E), np.int64, stream=stream)
        d_ovf = cuda.device_array((M, E), np.float64, stream=stream)
        d_ovn = cuda.to_device(np.zeros((M, E), np.int64), stream=stream)
        self._launch(self.kernels.module.final, M, M, d_B, d_sp, d_keep, d_ovi, d_ovf, d_ovn,
                     *aggs, *tail)
        keep = d_keep.copy_to_host(stream=stream).astype(bool)
        ovi, ovf = d_ovi.copy_to_host(stream=stream), d_ovf.copy_to_host(stream=stream)
        ovn = d_ovn.copy_to_host(stream=stream)
        stream.synchronize()
        B, parts = B[keep], parts[keep]
        ovi, ovf, ovn = ovi[keep], ovf[keep], ovn[keep]
        return self._decode(*self._elements(B, parts), ovi, ovf, ovn).to_dicts()

    def _elements(self, B: I64, parts: I64) -> tuple[int, int, I64, I64, F64]:
        """The CPU engine's output arrays: om (partition, first element, count) and the
        bound rows, variable by variable (oe_i: variable then int row; oe_f)."""
        M, nv = B.shape
        nI, nF = self.layout.n_int, self.layout.n_float
        oe_i = np.empty((M, nv, nI + 1), np.int64)
        oe_f = np.empty((M, nv, nF), np.float64)
        for var in self.plan.positive:
            ring = self.rings[var.channel]
            slots = ring.slots(parts, B[:, var.index])
            oe_i[:, var.index, 0] = var.index
            oe_i[:, var.index, 1:] = ring.HI[slots]
            oe_f[:, var.index] = ring.HF[slots]
        om = np.stack([parts, np.arange(M) * nv, np.full(M, nv)], axis=1).astype(np.int64)
        return M, M * nv, om, oe_i.reshape(M * nv, nI + 1), oe_f.reshape(M * nv, nF)

    # ------------------------------------------------------------ string compaction

    def _kept_slots(self, ring: ChannelRings) -> np.ndarray:
        """Arena slots of every partition's kept rows (start .. count) in `ring`."""
        kept = ring.count[:self.P] - ring.start[:self.P]
        rows = segment_rows(ring.start[:self.P], kept)
        return ring.slots(np.repeat(np.arange(self.P, dtype=np.int64), kept), rows)

    def string_codes(self) -> np.ndarray:
        """Partition keys and the string attributes of the rows the rings keep."""
        out = [np.asarray(self.keys.string_codes(self._key_string_positions()), np.int64)]
        columns = string_columns(self.layout, self.schema)
        if columns:
            out += [ring.HI[self._kept_slots(ring)][:, columns].ravel() for ring in self.rings]
        return np.concatenate(out)

    def remap_strings(self, new_code: np.ndarray) -> None:
        self.keys.remap_strings(self._key_string_positions(), new_code)
        columns = string_columns(self.layout, self.schema)
        if columns:
            for ring in self.rings:
                slots = self._kept_slots(ring)[:, None]
                ring.HI[slots, columns] = new_code[ring.HI[slots, columns]]
                ring.stale = True  # the device mirror is copied again whole

    def metrics(self) -> dict:
        return {"partitions": self.P, "resident": self.resident,
                "stored_events": int(sum((r.count - r.start).sum() for r in self.rings))}

    # ------------------------------------------------------------ snapshots

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        meta = {"keys": self.keys.to_state(), "partitions": self.P, "algorithm": "gpu-cdp"}
        arrays: dict[str, np.ndarray] = {"last_ts": self.last_ts}
        for c, ring in enumerate(self.rings):
            parts = [ring.kept(p) for p in range(self.P)]
            arrays[f"ch{c}_start"], arrays[f"ch{c}_count"] = ring.start, ring.count
            arrays[f"ch{c}_i"] = np.concatenate([x[0] for x in parts]) if parts else \
                np.zeros((0, self.layout.n_int), np.int64)
            arrays[f"ch{c}_f"] = np.concatenate([x[1] for x in parts]) if parts else \
                np.zeros((0, self.layout.n_float))
        return meta, arrays

    def load_state(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        self._reset()
        self.keys = KeyIndex.from_state(self.keys.attrs, meta["keys"])
        self.output.forget_keys()
        self.P = int(meta["partitions"])
        self.last_ts = arrays["last_ts"].astype(np.int64).copy()
        for c, ring in enumerate(self.rings):
            ring.load(arrays[f"ch{c}_start"], arrays[f"ch{c}_count"], arrays[f"ch{c}_i"],
                      arrays[f"ch{c}_f"])
        self._check_memory()
