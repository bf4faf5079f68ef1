"""The jitted MATCH engine: the state of one query whose compiled program (a generated
kernel and the layout of its arrays, `cep_core.compiler.match.Program`) it is given.

Python gives each event its key id (`_Keys`), calls the kernel, which processes every
event of the batch and writes matches into preallocated output arrays, and turns only those
matches into composite events. When an output array or a state array is full the kernel
stops before the event that needs more room, Python grows the array and the kernel
resumes there.

State, all numpy arrays (so a snapshot is arrays plus a little JSON):

- per key id (`key_i`/`key_f`): its slot (0: none, see below), the time of its last
  accepted event (for the "event time goes backwards" check), how many candidates its slot
  holds, and the values `Last()` reads (the key's previous event);
- per *slot*: the partial matches of one key that has some. A key takes a slot when a
  partial match has to be kept and gives it back (to a free list) when it has none left,
  so candidate storage is bounded by the number of keys with live partial matches; a slot
  holds up to `cap` candidates, rows `slot * cap + j` of `rec_i`/`rec_f` (with
  aggregate-free predicates never more than the number of positions; with aggregates
  `cap` doubles when a key needs more). Slot 0 stays empty: keys without partial matches
  point to it. Slots are reserved for the keys seen so far while that stays within 64 MiB
  (growing by doubling mid-batch costs copies), and reused through the free list;
- with `Collect` in EMIT: a log of the collected values of the events of keys that have a
  slot, chained per key (`log_prev`), compacted when full to what live candidates need.

Option `idle_timeout` (event-time units): after a batch or punctuation, a key whose last
event is at least that far behind the engine's clock (the largest event time seen) loses
its partial matches and its slot (`metrics["evicted_keys"]` counts them), and then the key
itself: its id, row and lookup entry go to new keys (`metrics["released_keys"]`), so
memory is bounded by the keys live within the timeout. Results are unaffected when
`idle_timeout` exceeds every match's duration plus how far a key's events may lag behind
the other keys' times (a returning key's events are then newer than anything forgotten,
so no "time goes backwards" rejection is missed).

When every candidate shares the predicates and EMIT has no `Collect`, a key keeps its
candidates in its own row instead of a slot (one cache line per event;
`cep_core.compiler.match`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from numba import njit

from cep_core import ast
from cep_core.batch import Batch, StringDictionary
from cep_core.checked import ExprType
from cep_core.kernels import match_runtime as layout
from cep_core.kernels.string_tables import StringTables
from cep_core.composite_batch import ColumnBatch, CompositeBatch, Decoder, Field, Keys
from cep_core.engine.base import Arrays, Composite, Engine, Meta
from cep_core.engine.keys import Key, KeyIndex
from cep_core.engine.match_checks import check_state, string_columns
from cep_core.schema import AttrType, StreamSchema

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
F64 = npt.NDArray[np.float64]

INT64_MIN = np.iinfo(np.int64).min
CHUNK = 1 << 22  # a bigger batch is processed in chunks (bounds the per-event buffers)
_CTR = {name: i for i, name in enumerate(layout.CTR)}


class MatchEngine(Engine):
    """A MATCH query over columnar batches (see the module docstring). Options:
    `idle_timeout` (event-time units, None: never evict)."""

    def __init__(self, program: Any, strings: StringDictionary, idle_timeout: int | None = None,
                 **options: object):
        # `program`: `cep_core.compiler.match.Program`, shared by every engine of its query
        # (Any: cep_core.engine does not import the compiler).
        # Other options belong to the engines of other query kinds (create_engine passes
        # the same options to every engine of a file).
        super().__init__(program.checked, strings)
        self.program = program
        self.key_attrs = [a.name for a in self.query.partition_by]
        self.keys = _Keys(self.key_attrs, self.schema)
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive")
        self.idle_timeout = idle_timeout
        self.metrics = {"evicted_keys": 0, "released_keys": 0}
        self._tables: StringTables | None = None
        self._key_cache: dict[int, object] = {}
        self._last_sweep = INT64_MIN
        program = self.program
        cap = 1 if program.per_key else \
            min(2, program.automaton.size) if not program.aggregate_mode else 4
        self._allocate(nkeys=16, nslots=16, cap=cap, out_cap=256, log_cap=256, coll_cap=256)

    # ------------------------------------------------------------ arrays

    def _allocate(self, nkeys: int, nslots: int, cap: int, out_cap: int, log_cap: int,
                  coll_cap: int) -> None:
        p = self.program
        self.cap, self.nslots = cap, nslots
        self.out_cap, self.log_cap, self.coll_cap = out_cap, log_cap, coll_cap
        a: Arrays = {}
        a["ctr"] = np.zeros(len(layout.CTR), np.int64)
        a["ctr"][_CTR["clock"]] = INT64_MIN
        a["ctr"][_CTR["high"]] = 1  # slot 0: reserved, always empty (keys without one)
        a["ftab"] = p.ftab
        self._new_keys(a, nkeys)
        a["free"] = np.zeros(nslots, np.int64)
        for name, width, dtype in p.slots.arrays():
            a[name] = _zeros((nslots, width), dtype)
        for name, width, dtype in p.records.arrays():
            a[name] = _zeros((nslots * cap + 1, width), dtype)
        self._out_arrays(a, out_cap)
        if p.collect:
            a["log_prev"] = np.zeros(log_cap, np.int64)
            for name, dtype in p.log_fields:
                a[name] = np.zeros(log_cap, dtype)
            for j, spec in enumerate(p.emit):
                if spec.kind is ExprType.LIST:
                    a[f"cv{j}"] = np.zeros(coll_cap, layout.dtype_of(spec.element))
        a["dead"] = np.zeros(1, np.int64)
        self.arrays = a
        self._dead = np.empty(0, np.int64)  # kept between batches: fresh memory faults

    def _out_arrays(self, a: Arrays, size: int, keep: int = 0) -> None:
        def make(name: str, dtype: npt.DTypeLike) -> None:
            new = np.zeros(size, dtype)
            if keep and name in a:
                new[:keep] = a[name][:keep]
            a[name] = new
        for name in ("out_key", "out_start", "out_end"):
            make(name, np.int64)
        for j, spec in enumerate(self.program.emit):
            if spec.kind is ExprType.LIST:
                continue
            make(f"e{j}", layout.dtype_of(spec.kind))
            if spec.nullable:
                make(f"e{j}n", np.bool_)
        if self.program.collect:
            make("coll_off", np.int64)

    def _grow(self, status: int) -> None:
        a, p = self.arrays, self.program
        ctr = a["ctr"]
        if status == layout.FULL_OUTPUT:
            self.out_cap *= 2
            self._out_arrays(a, self.out_cap, keep=int(ctr[_CTR["out_n"]]))
        elif status == layout.FULL_SLOTS:
            self._resize_slots(self.nslots * 2)
        elif status == layout.FULL_CANDIDATES and p.per_key:
            self.cap *= 2  # key rows widen: their candidates follow their fields
            for name, width, dtype in p.key_arrays(self.cap):
                grown = _zeros((len(a[name]), width), dtype)
                grown[:, :a[name].shape[1]] = a[name]
                a[name] = grown
        elif status == layout.FULL_CANDIDATES:
            old, new = self.cap, self.cap * 2
            for name, width, dtype in p.records.arrays():
                grown = _zeros((self.nslots * new + 1, width), dtype)
                grown[:self.nslots * new].reshape(self.nslots, new, width)[:, :old] = \
                    a[name][:self.nslots * old].reshape(self.nslots, old, width)
                a[name] = grown
            self.cap = new
        elif status == layout.FULL_LOG:
            self._compact_log()
        elif status == layout.FULL_COLLECT:
            self.coll_cap *= 2
            for j, spec in enumerate(p.emit):
                if spec.kind is ExprType.LIST:
                    a[f"cv{j}"] = _grown(a[f"cv{j}"], self.coll_cap)
        else:
            raise RuntimeError(f"MATCH kernel returned unknown status {status}")

    def _resize_slots(self, new: int) -> None:
        """Only slots ever used (below the high-water mark) are copied: the rest are
        zeros, and copying them would touch fresh memory for nothing."""
        a, p = self.arrays, self.program
        ctr = a["ctr"]
        high, free_top = int(ctr[_CTR["high"]]), int(ctr[_CTR["free_top"]])
        a["free"] = _grown(a["free"][:free_top], new)
        for name, _, _ in p.slots.arrays():
            a[name] = _grown(a[name][:high], new)
        for name, _, _ in p.records.arrays():
            a[name] = _grown(a[name][:high * self.cap], new * self.cap + 1)
        self.nslots = new

    def _reserve_slots(self, expect: int = 0) -> None:
        """As many slots as keys (each key has at most one; `expect`: keys expected
        soon), while that stays within 64 MiB of candidates: growing them one doubling at
        a time costs copies. Keys that hold their candidates (`per_key`) need none."""
        if self.program.per_key:
            return
        row = sum(width * np.dtype(dtype).itemsize
                  for _, width, dtype in self.program.records.arrays())
        want = min(max(len(self.keys), expect) + 1, (64 << 20) // (self.cap * row))
        if want > self.nslots:
            self._resize_slots(1 << (want - 1).bit_length())

    def _compact_log(self) -> None:
        a, p = self.arrays, self.program
        ctr = a["ctr"]
        used = int(ctr[_CTR["log_n"]])
        keep = _log_keep(a["log_prev"], used, a["slot_i"], p.slots.ints[layout.HEAD],
                         a["key_i"], a["rec_i"], p.records.ints[layout.COUNT], self.cap,
                         int(ctr[_CTR["high"]]))
        kept = len(keep)
        if kept > self.log_cap // 2:
            self.log_cap *= 2
        for name in ["log_prev"] + [n for n, _ in p.log_fields]:
            grown = np.zeros(self.log_cap, a[name].dtype)
            grown[:kept] = a[name][keep]
            a[name] = grown
        ctr[_CTR["log_n"]] = kept

    def _new_keys(self, a: Arrays, nkeys: int) -> None:
        """Per key id: slot (0: none), time of its last accepted event (none yet: the
        smallest int64, written by `_ensure_keys` once the id is in use: rows never used
        are never touched), candidate count, then the values Last() reads."""
        for name, width, dtype in self.program.key_arrays(self.cap):
            a[name] = _zeros((nkeys, width), dtype)
        self._keys_ready = 0

    def _ensure_keys(self, nkeys: int, expect: int = 0) -> None:
        """Rows for key ids below `nkeys`; when they must grow, for `expect` keys too."""
        a = self.arrays
        size = len(a["key_i"])
        if nkeys > size:
            while size < max(nkeys, expect):
                size *= 2
            ready = self._keys_ready
            old = {name: a[name] for name, _, _ in self.program.keys.arrays()}
            self._new_keys(a, size)
            for name, array in old.items():
                a[name][:ready] = array[:ready]
            self._keys_ready = ready
        if nkeys > self._keys_ready:
            a["key_i"][self._keys_ready:nkeys, 1] = INT64_MIN
            self._keys_ready = nkeys

    # ------------------------------------------------------------ processing

    def process_columns(self, batch: Batch) -> list[CompositeBatch]:
        n = len(batch)
        if n == 0:
            return []
        self._strings()
        if n <= CHUNK:
            out = [self._chunk(batch)]
        else:  # smaller chunks measured slower on marathon and finance1, faster on finance0
            out = []
            for start in range(0, n, CHUNK):
                stop = min(start + CHUNK, n)
                out.append(self._chunk(batch.slice(start, stop), later=n - stop))
        self._sweep()
        return [b for b in out if len(b)]

    def _chunk(self, batch: Batch, later: int = 0) -> ColumnBatch:
        """`later`: events of the same batch after this chunk. Key and slot arrays grow
        for the keys they may add at this chunk's rate of new keys (one growth, not a
        doubling every few chunks)."""
        n = len(batch)
        p, a = self.program, self.arrays
        known = len(self.keys)
        kid = self.keys.assign(batch)
        nkeys = len(self.keys)
        expect = nkeys + (nkeys - known) * later // n
        self._ensure_keys(nkeys, expect)
        self._reserve_slots(expect)
        a["kid"] = kid
        a["seq"] = np.ascontiguousarray(batch.seq, dtype=np.int64)
        a["ts"] = np.ascontiguousarray(batch.ts, dtype=np.int64)
        for j, (name, dtype) in enumerate(p.columns):
            a[f"col{j}"] = np.ascontiguousarray(batch.columns[name], dtype=dtype)
        if len(self._dead) < n:
            self._dead = np.empty(max(n, 2 * len(self._dead)), np.int64)
        a["dead"] = self._dead
        ctr = a["ctr"]
        ctr[_CTR["out_n"]] = ctr[_CTR["dead_n"]] = ctr[_CTR["coll_n"]] = 0
        kernel, names = p.kernel, p.array_args
        i = 0
        while True:
            # Matrices go in flattened (the kernel knows their widths).
            status, i = kernel(i, n, self.cap, self.nslots, self.out_cap, self.log_cap,
                               self.coll_cap, *[a[name].reshape(-1) for name in names])
            if status == layout.DONE:
                break
            self._grow(status)
        out = self._results(int(ctr[_CTR["out_n"]]))
        nd = int(ctr[_CTR["dead_n"]])
        if nd:
            rows = a["dead"][:nd]
            for seq, k in zip(a["seq"][rows].tolist(), kid[rows].tolist()):
                key = orjson.dumps(self._key(k)).decode()
                self.dead_letters.append((seq, "event time goes backwards in partition " + key))
        for name in ["kid", "seq", "ts"] + [f"col{j}" for j in range(len(p.columns))]:
            del a[name]  # do not keep the batch alive
        return out

    def punctuate(self, ts: int) -> list[Composite]:
        ctr = self.arrays["ctr"]
        if ts > ctr[_CTR["clock"]]:
            ctr[_CTR["clock"]] = ts
        self._sweep()
        return []

    def _strings(self) -> None:
        a, p = self.arrays, self.program
        a["sc"] = p.constants.codes(self.strings)
        if p.uses_tables:
            self._tables = StringTables.current(self._tables, self.strings)
            arrays = self._tables.arrays()
        else:
            arrays = (_EMPTY,) * 4
        for name, array in zip(("s_rank", "s_lower", "s_upper", "s_length"), arrays):
            a[name] = array

    def _sweep(self) -> None:
        if self.idle_timeout is None:
            return
        a = self.arrays
        ctr = a["ctr"]
        clock = int(ctr[_CTR["clock"]])
        if clock == INT64_MIN or clock - self._last_sweep < max(1, self.idle_timeout // 8):
            return
        self._last_sweep = clock
        self.metrics["evicted_keys"] += int(_evict(
            clock, self.idle_timeout, ctr, a["slot_i"], a["key_i"], a["free"]))
        # Idle keys are forgotten too (ids, rows, lookup entries), so memory is bounded by
        # the keys live within the timeout. Forgetting a key's last time is sound under
        # eviction's own assumption: its later events are newer than `clock - timeout`.
        released = _release_idle(clock, self.idle_timeout, a["key_i"],
                                 a.get("key_f", _EMPTY_ROWS), len(self.keys))
        if len(released):
            self.keys.release(released)
            for k in released.tolist():
                self._key_cache.pop(k, None)
            self.metrics["released_keys"] += len(released)

    # ------------------------------------------------------------ string compaction

    def string_codes(self) -> I64:
        """The codes of live state only: keys in use (their values and Last() values),
        the candidates of those keys, the Collect log entries live candidates need (the
        log is compacted first). Released keys and dropped candidates hold nothing."""
        if self.program.collect:
            self._compact_log()
        cells = [flat[at] for flat, at in self._string_cells()]
        return np.concatenate([np.asarray(self.keys.string_codes(), np.int64)] + cells)

    def remap_strings(self, new_code: I64) -> None:
        """Constant codes (`sc`) and the string tables are re-derived before every batch
        (`_strings`); decoded keys (`_key_cache`) hold no codes."""
        new_code = np.asarray(new_code, np.int64)
        cells = self._string_cells()
        new = [new_code[flat[at]] for flat, at in cells]
        if any(len(codes) and codes.min() < 0 for codes in new):
            raise ValueError("the string dictionary dropped a string MATCH state holds")
        self.keys.remap_strings(new_code)
        for (flat, at), codes in zip(cells, new):
            flat[at] = codes

    def _string_cells(self) -> list[tuple[npt.NDArray[Any], I64]]:
        """(flattened state array, positions in it) of every live string value: the
        string columns of the rows of keys in use (an accepted event; released rows are
        reset), of their candidates and of the Collect log (`string_codes` compacts it)."""
        a, p = self.arrays, self.program
        key_i = a["key_i"]
        width = key_i.shape[1]
        live = np.flatnonzero(key_i[:len(self.keys), p.keys.ints[("last_ts",)]] != INT64_MIN)
        cells = [(key_i.reshape(-1), (live[:, None] * width + string_columns(p.keys)).ravel())]
        rec_columns = string_columns(p.records)
        rec_width = p.records.arrays()[0][1]
        count = p.keys.ints[("n",)]
        if len(rec_columns) and p.per_key:  # candidates follow the key's fields
            rows = _rows(live * width + len(p.keys.ints), key_i[live, count], rec_width)
            cells.append((key_i.reshape(-1), (rows[:, None] + rec_columns).ravel()))
        elif len(rec_columns):
            high = int(a["ctr"][_CTR["high"]])
            owner = a["slot_i"][1:high, p.slots.ints[("key",)]]
            mine = key_i[owner, p.keys.ints[("slot",)]] == np.arange(1, high)
            slots = np.flatnonzero(mine) + 1  # a freed slot's old key points elsewhere
            rows = _rows(slots * self.cap, key_i[owner[mine], count], 1)
            cells.append((a["rec_i"].reshape(-1),
                          (rows[:, None] * rec_width + rec_columns).ravel()))
        if p.collect:
            used = np.arange(int(a["ctr"][_CTR["log_n"]]))
            cells += [(a[name], used) for name in self._string_logs()]
        return cells

    def _string_logs(self) -> list[str]:
        """The Collect log's arrays that hold string codes."""
        return [name for (name, _), attr in zip(self.program.log_fields, _collected(self.query))
                if self.schema.attributes[attr] == AttrType.STRING]

    # ------------------------------------------------------------ results

    def _key(self, k: int) -> object:
        key = self._key_cache.get(k, _MISSING)
        if key is _MISSING:
            if len(self._key_cache) > 100_000:
                self._key_cache.clear()
            key = self._key_cache[k] = self.decode_key(self.key_attrs, self.keys.value(k))
        return key

    def _results(self, no: int) -> ColumnBatch:
        """The kernel's first `no` matches as columns (copies: the arrays are reused)."""
        a, p = self.arrays, self.program
        fields: list[Field] = []
        for j, spec in enumerate(p.emit):
            if spec.kind is ExprType.LIST:
                offsets = np.append(a["coll_off"][:no], a["ctr"][_CTR["coll_n"]])
                fields.append(Field(spec.name, spec.element, a[f"cv{j}"][:offsets[-1]].copy(),
                                    offsets=offsets))
            else:
                fields.append(Field(spec.name, spec.kind, a[f"e{j}"][:no].copy(),
                                    a[f"e{j}n"][:no].copy() if spec.nullable else None))
        return ColumnBatch(self.checked.name, Decoder(self.strings.strings),
                           self._key_column(a["out_key"][:no]),
                           a["out_end"][:no].copy(), a["out_start"][:no].copy(), fields)

    def _key_column(self, ids: I64) -> Keys:
        return self.keys.column(ids, self.schema, self.strings, self._key)

    # ------------------------------------------------------------ snapshots

    def state(self) -> tuple[Meta, Arrays]:
        a, p = self.arrays, self.program
        ctr = a["ctr"]
        nkeys, high = len(self.keys), int(ctr[_CTR["high"]])
        keys, codes = self.keys.to_state()
        meta: Meta = {"keys": keys, "cap": self.cap, "nslots": self.nslots, "ctr": ctr.tolist(),
                "metrics": dict(self.metrics), "last_sweep": self._last_sweep}
        arrays: Arrays = {"free": a["free"][:int(ctr[_CTR["free_top"]])]}
        for name, _, _ in p.keys.arrays():
            arrays[name] = a[name][:nkeys]
        if codes is not None:
            arrays["key_codes"] = codes
            arrays["key_free"] = self.keys.free_ids()
        for name, _, _ in p.slots.arrays():
            arrays[name] = a[name][:high]
        for name, _, _ in p.records.arrays():
            arrays[name] = a[name][:high * self.cap]
        if p.collect:
            used = int(ctr[_CTR["log_n"]])
            for name in ["log_prev"] + [n for n, _ in p.log_fields]:
                arrays[name] = a[name][:used]
        return meta, arrays

    def load_state(self, meta: Meta, arrays: Arrays) -> None:
        p = self.program
        ctr = meta["ctr"]
        keys = _Keys.from_state(self.key_attrs, self.schema, meta["keys"],
                                arrays.get("key_codes"), arrays.get("key_free"))
        # before the kernel indexes by them, and before anything here changes
        check_state(self.checked.name, p, meta, arrays, len(keys), len(self.strings),
                    self._string_logs())
        self.keys = keys
        nkeys = len(self.keys)
        self._key_cache = {}
        self.metrics = {"released_keys": 0, **meta["metrics"]}
        self._last_sweep = meta["last_sweep"]
        used = ctr[_CTR["log_n"]]
        self._allocate(nkeys=max(16, nkeys), nslots=meta["nslots"], cap=meta["cap"],
                       out_cap=256, log_cap=max(256, 2 * used), coll_cap=256)
        a = self.arrays
        a["ctr"][:] = ctr
        names = ["free"] + [n for n, _, _ in p.keys.arrays()] + \
            [n for n, _, _ in p.slots.arrays()] + \
            [n for n, _, _ in p.records.arrays()]
        if p.collect:
            names += ["log_prev"] + [n for n, _ in p.log_fields]
        for name in names:
            a[name][:len(arrays[name])] = arrays[name]
        self._keys_ready = nkeys


_EMPTY = np.zeros(1, np.int64)
_EMPTY_ROWS = np.zeros((0, 1), np.float64)


def _zeros(shape: tuple[int, ...], dtype: npt.DTypeLike) -> npt.NDArray[Any]:
    """np.zeros, 64-byte aligned (rows of state then sit in as few cache lines as can be)."""
    kind = np.dtype(dtype)
    size = int(np.prod(shape)) * kind.itemsize
    buffer = np.zeros(size + 64, np.uint8)
    offset = -buffer.ctypes.data % 64
    aligned: npt.NDArray[Any] = buffer[offset:offset + size].view(kind).reshape(shape)
    return aligned


def _grown(array: npt.NDArray[Any], rows: int) -> npt.NDArray[Any]:
    """A zero-filled array of `rows` rows that starts with `array`."""
    grown = _zeros((rows,) + array.shape[1:], array.dtype)
    grown[:len(array)] = array
    return grown


_MISSING = object()
_NO_CODES = np.zeros(0, np.int64)  # `_Keys.codes` once it uses `KeyIndex` (not read then)


def _rows(starts: I64, counts: I64, stride: int) -> I64:
    """start, start + stride, ... (count of them) for every start, concatenated."""
    counts = np.asarray(counts, np.int64)
    firsts = np.cumsum(counts) - counts
    step = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(firsts, counts)
    return np.repeat(np.asarray(starts, np.int64), counts) + step * stride


def _collected(query: ast.Query) -> list[str]:
    """The attributes Collect logs, in the order of the log arrays `lv0, lv1, ...`
    (first appearance in EMIT, as `compile_match` numbers them)."""
    attrs: list[str] = []
    assert isinstance(query.body, ast.MatchQuery)  # the MATCH engine's query
    for item in query.body.emit:
        expr = item.expr
        if isinstance(expr, ast.Aggregate) and expr.func is ast.AggFunc.COLLECT and \
                expr.arg is not None and expr.arg.name not in attrs:
            attrs.append(expr.arg.name)
    return attrs


# ---------------------------------------------------------------- partition keys


class _Keys:
    """Partition keys -> dense ids (order of first appearance, as `KeyIndex`).

    One partition attribute coded as an integer (an int, a timestamp or a string code)
    takes a fast path: a lookup table from value to id filled by a jitted loop, and the key
    values kept in a numpy array, so a million new keys cost no Python objects. Values too
    spread out for a table switch the engine to `KeyIndex` for good."""

    def __init__(self, attrs: list[str], schema: StreamSchema):
        self.attrs = attrs
        self.fast = len(attrs) == 1 and schema.attributes[attrs[0]] in (
            "int", "timestamp", "string")
        self.index: KeyIndex | None = None if self.fast else KeyIndex(attrs)
        self.string_positions = [i for i, a in enumerate(attrs)
                                 if schema.attributes[a] == AttrType.STRING]
        self.codes = np.zeros(16, np.int64)  # fast path: the key of each id
        self.count = 0  # fast path: ids in use or released (the id range)
        self.free = np.zeros(16, np.int64)  # fast path: released ids, taken before new ones
        self.free_top = 0
        self.lut: I32 | None = None
        self.lo = 0
        self.ids = np.empty(0, np.int64)

    def __len__(self) -> int:
        """The id range: ids in use or released."""
        return self.count if self.index is None else len(self.index)

    def column(self, ids: I64, schema: StreamSchema, strings: StringDictionary,
               key_of: Callable[[int], object]) -> Keys:
        """The composites' keys (`key_of`: a key id's decoded key), taken now: ids of
        evicted keys go to other keys later. One coded attribute is decoded only when read."""
        if not self.attrs:
            return Keys(np.zeros(len(ids), np.int64), lambda distinct: [None] * len(distinct))
        if self.fast:
            kind = schema.attributes[self.attrs[0]]
            decoder = Decoder(strings.strings)
            return Keys(self.codes[ids], lambda codes: decoder.values(kind, codes))
        keys = {k: key_of(k) for k in np.unique(ids).tolist()}
        return Keys(ids.copy(), lambda distinct: [keys[k] for k in distinct.tolist()])

    def value(self, k: int) -> Key:
        """The key of an id in use."""
        if self.index is None:
            return (int(self.codes[k]),)
        key = self.index.values[k]
        assert key is not None  # (ids in use have one)
        return key

    def release(self, ids: I64) -> None:
        """Forget these keys (idle-key eviction); their ids go to new keys first."""
        if len(ids) == 0:
            return
        if self.index is not None:
            self.index.release(ids.tolist())
            return
        assert self.lut is not None  # the fast path has a table once it has keys
        self.lut[self.codes[ids] - self.lo] = -1
        top = self.free_top + len(ids)
        if top > len(self.free):
            self.free = _grown(self.free[:self.free_top], max(top, 2 * len(self.free)))
        self.free[self.free_top:top] = ids
        self.free_top = top

    def free_ids(self) -> I64:
        return self.free[:self.free_top].copy() if self.index is None else \
            np.array(self.index.free, np.int64)

    def assign(self, batch: Batch) -> I64:
        if self.index is not None:
            return self.index.assign(batch)
        n = len(batch)
        column = np.ascontiguousarray(batch.columns[self.attrs[0]], dtype=np.int64)
        if self.count + n > len(self.codes):
            grown = np.zeros(max(2 * len(self.codes), self.count + n), np.int64)
            grown[:self.count] = self.codes[:self.count]
            self.codes = grown
        if len(self.ids) < n:  # kept between batches: fresh memory costs page faults
            self.ids = np.empty(max(n, 2 * len(self.ids)), np.int64)
        ids = self.ids[:n]
        position = 0
        while True:
            if self.lut is not None:
                added, self.free_top, position = _map_keys(
                    column, position, self.lo, self.lut, ids, self.count, self.codes,
                    self.free, self.free_top)
                self.count += added
                if position == n:
                    return ids
            rest = column[position:]  # a value outside the table: widen it for the rest
            if not self._cover(int(rest.min()), int(rest.max()) + 1, n):
                return self._slow().assign(batch)  # known keys keep their ids

    def _cover(self, lo: int, hi: int, batch: int) -> bool:
        """Widens the table to values lo..hi-1 (with room to spare where it grows); False
        when it would get too big for the number of keys."""
        old_lo, old_hi = (lo, lo) if self.lut is None else (self.lo, self.lo + len(self.lut))
        new_lo, new_hi = min(lo, old_lo), max(hi, old_hi)
        spare = (new_hi - new_lo) // 2 + 16
        if new_hi - new_lo > max(1 << 20, 8 * (self.count + batch)) or \
                self.count + batch >= 1 << 31:  # ids must fit the int32 table
            return False
        if self.lut is not None and new_lo < old_lo:
            new_lo -= spare
        if self.lut is None or new_hi > old_hi:
            new_hi += spare
        lut = np.full(new_hi - new_lo, -1, np.int32)  # half the cache lines of int64
        if self.lut is not None:
            lut[old_lo - new_lo:old_hi - new_lo] = self.lut
        self.lut, self.lo = lut, new_lo
        return True

    def _live(self) -> npt.NDArray[np.bool_]:
        """Fast path: which ids of the id range are in use (not released)."""
        live = np.ones(self.count, bool)
        live[self.free[:self.free_top]] = False
        return live

    def string_codes(self) -> I64:
        """The string codes of the keys in use (released keys hold none)."""
        if not self.string_positions:
            return np.empty(0, np.int64)
        if self.index is not None:
            return np.array(self.index.string_codes(self.string_positions), np.int64)
        return self.codes[:self.count][self._live()]

    def remap_strings(self, new_code: I64) -> None:
        """Renumbers string keys (ids stay); the fast path's table over the code range is
        rebuilt, or gives way to `KeyIndex` when the new codes are too spread out."""
        if not self.string_positions:
            return
        if self.index is not None:
            self.index.remap_strings(self.string_positions, new_code)
            return
        live = self._live()
        codes = self.codes[:self.count]
        codes[live] = new_code[codes[live]]
        codes[~live] = 0  # released ids: their old codes may be gone
        self._rebuild_table(live)

    def _rebuild_table(self, live: npt.NDArray[np.bool_]) -> None:
        """The lookup table from the codes of the ids in use (`live`)."""
        self.lut, self.lo = None, 0
        if live.any():
            used = self.codes[:self.count][live]
            if self._cover(int(used.min()), int(used.max()) + 1, 0):
                assert self.lut is not None  # _cover made it
                self.lut[used - self.lo] = np.flatnonzero(live).astype(np.int32)
            else:
                self._slow()

    def _slow(self) -> KeyIndex:
        """Switch to `KeyIndex` for good (returned)."""
        released = set(self.free[:self.free_top].tolist())
        index = self.index = KeyIndex.from_state(self.attrs, [
            None if k in released else [code]
            for k, code in enumerate(self.codes[:self.count].tolist())])
        self.fast, self.lut, self.codes = False, None, _NO_CODES
        return index

    def to_state(self) -> tuple[list[list[object] | None] | None, I64 | None]:
        """(JSON-able keys, or None; the fast path's key array, or None)."""
        if self.index is None:
            return None, self.codes[:self.count].copy()
        return self.index.to_state(), None

    @classmethod
    def from_state(cls, attrs: list[str], schema: StreamSchema,
                   values: list[list[object] | None] | None, codes: I64 | None,
                   free: I64 | None = None) -> _Keys:
        """`free`: the fast path's released ids (a snapshot's `key_free`)."""
        keys = cls(attrs, schema)
        if values is None:
            assert codes is not None  # a fast path's snapshot has them
            keys.codes = np.array(codes, dtype=np.int64)
            keys.count = len(codes)
            free = np.zeros(0, np.int64) if free is None else np.asarray(free, np.int64)
            keys.free = np.zeros(max(16, len(free)), np.int64)
            keys.free[:len(free)] = free
            keys.free_top = len(free)
            keys._rebuild_table(keys._live())
            if keys.fast and len(keys.codes) == 0:
                keys.codes = np.zeros(16, np.int64)
        else:
            keys.fast = False
            keys.index = KeyIndex.from_state(attrs, values)
        return keys


@njit(cache=True)
def _map_keys(values: I64, start: int, lo: int, lut: I32, ids: I64, next_id: int, codes: I64,
              free: I64, free_top: int) -> tuple[int, int, int]:
    """Ids of `values` from `start` on by the lookup table; a new value takes a released
    id (`free[:free_top]`, last first) or else the next new id, and is written to `codes`
    at its id. Returns how many new ids were used, the released ids left, and where it
    stopped: the end, or a value outside the table."""
    u = np.uint64  # unsigned indexes: no negative-index wraparound code
    size = lut.shape[0]
    added = 0
    for i in range(start, values.shape[0]):
        v = values[u(i)]
        if v - lo < 0 or v - lo >= size:
            return added, free_top, i
        k = lut[u(v - lo)]
        if k < 0:
            if free_top > 0:
                free_top -= 1
                k = free[u(free_top)]
            else:
                k = next_id + added
                added += 1
            lut[u(v - lo)] = k
            codes[u(k)] = v
        ids[u(i)] = k
    return added, free_top, values.shape[0]


# ---------------------------------------------------------------- helpers


@njit(cache=True)
def _evict(clock: int, timeout: int, ctr: I64, slot_i: I64, key_i: I64, free: I64) -> int:
    """Drops the candidates of keys idle for `timeout` or longer and frees their slots;
    returns how many keys. (Keys with candidates but no slot hold them in their row.)"""
    evicted = 0
    free_top = ctr[0]
    for s in range(1, ctr[1]):
        k = slot_i[s, 0]
        if key_i[k, 0] == s and clock - key_i[k, 1] >= timeout:
            key_i[k, 0] = 0
            key_i[k, 2] = 0
            free[free_top] = s
            free_top += 1
            evicted += 1
    ctr[0] = free_top
    for k in range(key_i.shape[0]):
        if key_i[k, 0] == 0 and key_i[k, 2] != 0 and clock - key_i[k, 1] >= timeout:
            key_i[k, 2] = 0
            evicted += 1
    return evicted


@njit(cache=True)
def _release_idle(clock: int, timeout: int, key_i: I64, key_f: F64, nkeys: int) -> I64:
    """Ids of the keys in use (an accepted event) idle for `timeout` or longer and without
    partial matches (`_evict` ran first); their rows are reset to those of a new key."""
    out = np.empty(nkeys, np.int64)
    n = 0
    for k in range(nkeys):
        last = key_i[k, 1]
        if last != INT64_MIN and key_i[k, 0] == 0 and key_i[k, 2] == 0 and \
                clock - last >= timeout:
            key_i[k, :] = 0
            key_i[k, 1] = INT64_MIN
            if key_f.shape[0] > k:
                key_f[k, :] = 0.0
            out[n] = k
            n += 1
    return out[:n]


@njit(cache=True)
def _log_keep(log_prev: I64, used: int, slot_i: I64, head: int, key_i: I64, rec_i: I64,
              count: int, cap: int, high: int) -> I64:
    """Compacts the Collect log to the entries live candidates need: per live slot, the
    newest `count of its oldest candidate` entries of its chain. Rewrites the `log_prev`
    links and the slots' heads for the new positions; returns the old positions kept, in
    order."""
    keep = np.zeros(used, np.bool_)
    for s in range(1, high):
        if key_i[slot_i[s, 0], 0] == s:
            need = rec_i[s * cap, count]
            e = slot_i[s, head]
            while need > 0 and e >= 0:
                keep[e] = True
                e = log_prev[e]
                need -= 1
    new_index = np.full(used, -1, np.int64)
    kept = 0
    for e in range(used):
        if keep[e]:
            new_index[e] = kept
            kept += 1
    order = np.empty(kept, np.int64)
    for e in range(used):
        if keep[e]:
            order[new_index[e]] = e
            prev = log_prev[e]
            log_prev[e] = new_index[prev] if prev >= 0 else -1
    for s in range(high):
        live = s > 0 and key_i[slot_i[s, 0], 0] == s
        slot_i[s, head] = new_index[slot_i[s, head]] if live and slot_i[s, head] >= 0 else -1
    return order
