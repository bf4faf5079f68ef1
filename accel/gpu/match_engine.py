"""The GPU MATCH engine: batched per-key NFA advance on numba's CUDA target.

`GpuMatchEngine(checked, strings, **options)` runs a MATCH query of the supported subset
(`cep_accel.gpu.match_kernels.unsupported_reason`: everything but `Collect()` in EMIT and
patterns over 63 positions) with the kernel of `cep_accel.gpu.match_kernels`; composite events,
dead letters and `idle_timeout` eviction are the CPU `MatchEngine`'s (and so the reference
interpreter's).

Per batch, on the host: key ids (`_Keys`, as the CPU engine), a stable argsort of them
(each key's rows stay in seq order), the batch's columns gathered in that order and copied
to the device; then one kernel launch, one thread per key of the batch, that walks the
key's rows. Per-key state stays in device arrays between batches (`key_i`/`key_f`: last
accepted time, candidate count, `Last()` values; `rec_i`/`rec_f`: `cap + 1` candidate rows
per key). Matches come back through an atomically incremented index and are sorted by the
row of their last event, so they are in the CPU engine's order. When a key needs more
candidate rows than `cap`, its thread stops before that event; the host doubles `cap` and
launches again from where each thread stopped.

Options: `idle_timeout` (as the CPU engine), `threads_per_block` (default 128; 16 under the
simulator, which runs every thread as a Python thread).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any, ClassVar

import numpy as np
import orjson

from cep_accel.gpu import device
from cep_accel.gpu.match_kernels import (DEAD_N, NEED_ROWS, OUT_N, MatchKernelPlan,
                                         compile_kernel)
from cep_core.batch import Batch, StringDictionary
from cep_core.checked import CheckedQuery
from cep_core.composite_batch import ColumnBatch, Keys
from cep_core.compiler import match as cpu
from cep_core.kernels.match_runtime import dtype_of
from cep_core.kernels.string_tables import StringTables
from cep_core.engine.base import Engine
from cep_core.engine.match import MatchEngine, _Keys
from cep_core.engine.seq import NotSupportedError

INT64_MIN = np.iinfo(np.int64).min
_plans: dict[str, MatchKernelPlan] = {}


class _Rows(Enum):
    """How a state array is laid out: a row per key, or `cap + 1` rows per key (candidate
    records and the scratch row)."""

    KEY = "key"
    RECORD = "rec"


def _plan(checked: CheckedQuery) -> MatchKernelPlan:
    plan = compile_kernel(checked)
    return _plans.setdefault(plan.source, plan)


class GpuMatchEngine(Engine):
    # Composite events are decoded as the CPU engine decodes its output arrays: its methods,
    # typed for any self (they read the attributes both engines have, not a MatchEngine's).
    _results: ClassVar[Callable[[Any, int], ColumnBatch]] = MatchEngine._results
    _key_column: ClassVar[Callable[[Any, np.ndarray], Keys]] = MatchEngine._key_column
    _key: ClassVar[Callable[[Any, int], object]] = MatchEngine._key

    def __init__(self, checked: CheckedQuery, strings: StringDictionary,
                 idle_timeout: int | None = None, threads_per_block: int | None = None,
                 **_other_options: Any):
        super().__init__(checked, strings)
        if not device.usable():
            raise NotSupportedError("no CUDA device (and the CUDA simulator is off)")
        try:
            self.program = _plan(checked)
        except cpu.MatchCompileError as e:
            raise NotSupportedError(f"query {checked.name!r}: {e}") from None
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive")
        self.idle_timeout = idle_timeout
        self.cuda = device.cuda()
        self.tpb = int(threads_per_block or (16 if device.simulated() else 128))
        self.key_attrs = [a.name for a in self.query.partition_by]
        self.keys = _Keys(self.key_attrs, self.schema)
        self.metrics = {"evicted_keys": 0}
        self._tables: StringTables | None = None
        self._key_cache: dict[int, object] = {}
        self.arrays: dict[str, np.ndarray] = {}  # the last batch's output (host)
        self.clock = INT64_MIN
        self._last_sweep = INT64_MIN
        p = self.program
        self.cap = p.automaton.size + 1 if not p.aggregate_mode else 4
        self.capacity = 0  # keys the device arrays hold
        self.state_arrays: dict[str, Any] = {}  # numba device arrays (untyped), flattened
        self._d_ftab = self.cuda.to_device(p.ftab)
        self._resize(keys=16, cap=self.cap)

    # ------------------------------------------------------------ device state

    def _state_layout(self) -> Iterator[tuple[str, int, str, _Rows]]:
        p = self.program
        for name, width, dtype in p.keys.arrays():
            yield name, width, dtype, _Rows.KEY
        for name, width, dtype in p.records.arrays():
            yield name, width, dtype, _Rows.RECORD

    def _host_state(self) -> dict[str, np.ndarray]:
        """The device state copied to the host, one matrix per array."""
        out = {}
        for name, width, _, kind in self._state_layout():
            rows = self.capacity * (self.cap + 1) if kind is _Rows.RECORD else self.capacity
            out[name] = self.state_arrays[name].copy_to_host().reshape(rows, width)
        return out

    def _resize(self, keys: int, cap: int, host: dict | None = None) -> None:
        """Device state for `keys` keys of `cap` candidate rows (+ scratch), keeping what
        `host` (or the current device state) holds."""
        old = host if host is not None else (self._host_state() if self.capacity else {})
        old_cap = self.cap
        arrays = {}
        for name, width, dtype, kind in self._state_layout():
            if kind is _Rows.KEY:
                new = np.zeros((keys, width), dtype)
                if name == "key_i":
                    new[:, self.program.keys.ints[("last_ts",)]] = INT64_MIN
                if name in old:
                    new[:len(old[name])] = old[name][:keys]
            else:
                new = np.zeros((keys, cap + 1, width), dtype)
                if name in old:
                    kept = old[name].reshape(-1, old_cap + 1, width)
                    new[:len(kept), :old_cap] = kept[:, :old_cap]
            arrays[name] = self.cuda.to_device(new.reshape(-1))
        self.state_arrays = arrays
        self.capacity, self.cap = keys, cap

    def _ensure_keys(self, nkeys: int) -> None:
        if nkeys > self.capacity:
            self._resize(1 << (nkeys - 1).bit_length(), self.cap)

    # ------------------------------------------------------------ processing

    def process(self, batch: Batch) -> list[dict]:
        n = len(batch)
        if n == 0:
            return []
        cuda, p = self.cuda, self.program
        kid = self.keys.assign(batch).copy()
        self._ensure_keys(len(self.keys))
        order = np.argsort(kid, kind="stable")
        grouped = kid[order]
        starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
        groups = len(starts)
        boff = np.append(starts, n).astype(np.int64)
        ts = np.ascontiguousarray(batch.ts, dtype=np.int64)
        inputs = {"bkey": grouped[starts], "boff": boff, "resume": starts.astype(np.int64),
                  "seq": np.ascontiguousarray(batch.seq, dtype=np.int64)[order],
                  "ts": ts[order]}
        for j, (name, dtype) in enumerate(p.columns):
            inputs[f"col{j}"] = np.ascontiguousarray(batch.columns[name], dtype=dtype)[order]
        inputs["sc"] = p.constants.codes(self.strings)
        for name, array in zip(("s_rank", "s_lower", "s_upper", "s_length"), self._strings()):
            inputs[name] = array
        d = {name: cuda.to_device(array) for name, array in inputs.items()}
        d["ftab"] = self._d_ftab
        d["ctr"] = cuda.to_device(np.zeros(3, np.int64))
        d["dead"] = cuda.device_array(n, np.int64)
        for name in ("out_key", "out_start", "out_end", "out_row"):
            d[name] = cuda.device_array(n, np.int64)
        for j, spec in enumerate(p.emit):
            d[f"e{j}"] = cuda.device_array(n, dtype_of(spec.kind))
            if spec.nullable:
                d[f"e{j}n"] = cuda.device_array(n, np.bool_)
        blocks = (groups + self.tpb - 1) // self.tpb
        while True:
            d.update(self.state_arrays)
            p.kernel[blocks, self.tpb](groups, self.cap, *[d[name] for name in p.array_args])
            ctr = d["ctr"].copy_to_host()
            if ctr[NEED_ROWS] == 0:
                break
            self._resize(self.capacity, self.cap * 2)
            ctr[NEED_ROWS] = 0
            d["ctr"] = cuda.to_device(ctr)
        dead = np.sort(order[d["dead"].copy_to_host()[:int(ctr[DEAD_N])]])
        out = self._collect(d, order, int(ctr[OUT_N]))
        self._dead_letters(batch, kid, dead)
        accepted = np.ones(n, np.bool_)
        accepted[dead] = False
        if accepted.any():
            self.clock = max(self.clock, int(ts[accepted].max()))
        self._sweep()
        return out

    def _collect(self, d: dict, order: np.ndarray, no: int) -> list[dict]:
        """The batch's matches, in the order of the rows that end them."""
        if no == 0:
            return []
        rows = order[d["out_row"].copy_to_host()[:no]]
        by_row = np.argsort(rows, kind="stable")
        names = ["out_key", "out_start", "out_end"]
        for j, spec in enumerate(self.program.emit):
            names.append(f"e{j}")
            if spec.nullable:
                names.append(f"e{j}n")
        self.arrays = {name: d[name].copy_to_host()[:no][by_row] for name in names}
        try:
            return self._results(no).to_dicts()
        finally:
            self.arrays = {}

    def _dead_letters(self, batch: Batch, kid: np.ndarray, rows: np.ndarray) -> None:
        for seq, k in zip(np.asarray(batch.seq)[rows].tolist(), kid[rows].tolist()):
            key = orjson.dumps(self._key(k)).decode()
            self.dead_letters.append((seq, "event time goes backwards in partition " + key))

    def _strings(self) -> tuple[np.ndarray, ...]:
        if not self.program.uses_tables:
            return (np.zeros(1, np.int64),) * 4
        if self._tables is None:
            self._tables = StringTables(self.strings)
        self._tables.refresh()
        return self._tables.arrays()

    def punctuate(self, ts: int) -> list[dict]:
        self.clock = max(self.clock, int(ts))
        self._sweep()
        return []

    def _sweep(self) -> None:
        """Idle-key eviction, as the CPU engine: keys whose last event is `idle_timeout`
        or more behind the clock lose their partial matches."""
        if self.idle_timeout is None or self.clock == INT64_MIN or \
                self.clock - self._last_sweep < max(1, self.idle_timeout // 8):
            return
        self._last_sweep = self.clock
        keys = self.program.keys
        host = self.state_arrays["key_i"].copy_to_host().reshape(self.capacity, -1)
        count, last = keys.ints[("n",)], keys.ints[("last_ts",)]
        idle = (host[:, count] > 0) & (self.clock - host[:, last] >= self.idle_timeout)
        if idle.any():
            host[idle, count] = 0
            self.state_arrays["key_i"] = self.cuda.to_device(host.reshape(-1))
            self.metrics["evicted_keys"] += int(idle.sum())

    # ------------------------------------------------------------ snapshots

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        keys, codes = self.keys.to_state()
        nkeys = len(self.keys)
        meta = {"algorithm": "gpu-match", "keys": keys, "cap": self.cap,
                "clock": self.clock, "last_sweep": self._last_sweep,
                "metrics": dict(self.metrics)}
        host = self._host_state()
        arrays = {}
        for name, _, _, kind in self._state_layout():
            arrays[name] = host[name][:nkeys * (self.cap + 1) if kind is _Rows.RECORD else nkeys]
        if codes is not None:
            arrays["key_codes"] = codes
        return meta, arrays

    def load_state(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        if meta.get("algorithm") != "gpu-match":
            raise ValueError("not a snapshot of the GPU MATCH engine")
        self.keys = _Keys.from_state(self.key_attrs, self.schema, meta["keys"],
                                     arrays.get("key_codes"))
        self._key_cache = {}
        self.clock, self._last_sweep = meta["clock"], meta["last_sweep"]
        self.metrics = dict(meta["metrics"])
        nkeys = max(16, 1 << max(len(self.keys) - 1, 0).bit_length())
        self.capacity, self.cap = 0, int(meta["cap"])
        host = {name: arrays[name] for name, _, _, _ in self._state_layout()}
        self._resize(nkeys, self.cap, host=host)
