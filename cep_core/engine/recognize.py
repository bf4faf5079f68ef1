"""The jitted MATCH_RECOGNIZE engine: one query's state, run by the kernels of its compiled
program (`cep_core.compiler.recognize.RecognizeProgram`), giving the reference
interpreter's (Flink 2.3's) answers.

State, all numpy arrays (a snapshot is arrays plus a little JSON):

- per key id (`key_i`): its last accepted event time, how many partial and completed
  matches its queues hold, how many rows it has seen;
- per key, its queue of partial matches (`ph`, a row of `pcap` handles) and of completed
  matches waiting for release (`ch`, `ccap`), each a binary heap in Java's
  `PriorityQueue` layout (`cep_core.kernels.recognize_runtime`); both widen (doubling)
  when a key needs more;
- the records the handles point to (`rec_i`/`rec_f`, one row per computation; row 0 is
  Flink's start computation) with a free list; the pool doubles when an event could need
  more than is free.

That is the computations layout. Where all the partial matches of one start read alike
(`RecognizeProgram.layout` is `runs`, see `cep_core.compiler.recognize`), a key's partial
matches are runs, one per start, kept in the key's own rows of `ph`/`pf` (shape: keys,
the key's row and `pcap` runs, record columns): the key's row holds the row before, the
runs follow in order of start; only completed matches are records of the pool. Where a
run never stands for more than one partial match (`states`, `cep_core.compiler.
recognize_states`), it keeps the number of its one automaton state instead of a count per
state; a runs snapshot of such a query is moved into that layout when restored
(`recognize_rows.states_of`).

The computations layout's kernel takes a batch `CHUNK` rows at a time, key by key (each
key's rows in their order; keys are independent), so that a key's records stay in the cache
from one of its rows to the next (the runs layout's takes rows in their order); the
composite events, which leave key by key, are put back in the order
of the rows they left on (`_batch_order`), so a batch's output is the same as row by row.
The kernel stops before an event that could need more room than there is (outputs,
queue slots, records) and resumes there once Python has grown the arrays. Partial matches
end by WITHIN on the key's next event, at `punctuate(ts)` (every key) and at `flush()`;
without WITHIN, completed matches held back by an unfinished earlier one never leave
(as in Flink, and the reference).

With `ORDER BY ts, col...` the rows of a partition's latest time wait
(`cep_core.engine.recognize_ties`) and go into the kernel sorted by those columns when a
later row of the partition comes, at a punctuation past their time or at the end; the
kernel takes them in that order, so the composite events and dead letters come in the
interpreter's order. `punctuate` and `flush` end partial matches by WITHIN in the order the
partitions took their first rows (`_fed_rank`), as the interpreter does.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from cep_core import ast
from cep_core.batch import Batch, StringDictionary
from cep_core.composite_batch import ColumnBatch, CompositeBatch, Decoder, Field, to_dicts
from cep_core.engine.base import Engine
from cep_core.engine.match import _Keys
from cep_core.engine.recognize_checks import check_state
from cep_core.engine.recognize_rows import rows_of, states_of
from cep_core.engine.recognize_ties import PendingRows, Sent, number_firsts
from cep_core.kernels import recognize_runtime as rt
from cep_core.kernels.match_runtime import dtype_of
from cep_core.kernels.string_tables import StringTables, string_ranks
from cep_core.reference.recognize import RecognizeRuntimeError
from cep_core.schema import AttrType

INT64_MIN = np.iinfo(np.int64).min
# Rows the kernel takes key by key at a time (its scratch stays in the cache): one key's
# rows one after another keep that key's records in the cache
CHUNK = 16384
_EMPTY = np.zeros(1, np.int64)


class RecognizeEngine(Engine):
    """A MATCH_RECOGNIZE query over columnar batches (see the module docstring). Options
    of other engines (`idle_timeout`, ...) are ignored: a key's state here ends by WITHIN."""

    def __init__(self, program: Any, strings: StringDictionary, **options: Any) -> None:
        # program: a RecognizeProgram (cep_core.compiler.recognize, which the engines do
        # not import)
        super().__init__(program.checked, strings)
        self.program = program
        self.key_attrs = [a.name for a in self.query.partition_by]
        self.keys = _Keys(self.key_attrs, self.schema)
        self._tables: StringTables | None = None
        self._runs = program.layout in (rt.RUNS, rt.STATES)
        self._buffers: dict[str, npt.NDArray[Any]] = {}
        body = self.query.body
        assert isinstance(body, ast.RecognizeQuery)
        # ORDER BY ts, col...: the rows of a partition's latest time wait (recognize_ties)
        self._then_by = [(a.name, desc) for a, desc in zip(body.then_by, body.then_desc)]
        self._pending: PendingRows | None = None
        self._rank: tuple[tuple[int, int], npt.NDArray[np.int64]] | None = None
        self._allocate(nkeys=16, pcap=4, ccap=4, pool=64, out_cap=256)

    # ------------------------------------------------------------ arrays

    def _allocate(self, nkeys: int, pcap: int, ccap: int, pool: int, out_cap: int) -> None:
        p = self.program
        self.pcap, self.ccap, self.out_cap = pcap, ccap, out_cap
        a: dict[str, npt.NDArray[Any]] = dict(p.tables)
        a["ctr"] = np.zeros(len(rt.CTR), np.int64)
        a["ctr"][rt.HIGH] = 1  # record 0: the start computation
        a["key_i"] = np.zeros((nkeys, len(rt.KEY_FIELDS)), np.int64)
        if self._runs:  # a key's rows: the key's row (its row before), then `pcap` runs
            ints, floats = p.rows.widths
            a["ph"] = np.zeros((nkeys, pcap + 1, ints), np.int64)
            a["pf"] = np.zeros((nkeys, pcap + 1, floats), np.float64)
        else:
            a["ph"] = np.zeros((nkeys, pcap), np.int64)
            a["pf"] = np.zeros((1, 1), np.float64)
        a["ch"] = np.zeros((nkeys, ccap), np.int64)
        a["lp"] = np.zeros(pcap, np.int64)
        a["lc"] = np.zeros(ccap, np.int64)
        self._completing(a, pcap)
        a["rec_i"] = np.zeros((pool, p.rec_ints), np.int64)
        a["rec_f"] = np.zeros((pool, p.rec_floats), np.float64)
        a["rec_i"][0, rt.STATE] = p.start_state
        a["rec_i"][0, rt.START] = rt.NEVER
        a["free"] = np.zeros(pool, np.int64)
        a["dead"] = np.zeros(1, np.int64)
        self.arrays = a
        self._keys_ready = 0
        self._out_arrays(out_cap)
        if self._then_by:
            self._pending = PendingRows(self.schema, self._then_by, [n for n, _ in p.columns])
        # ORDER BY ts, col...: each key's place in the order of partitions' first rows in
        # (-1: none yet), the order `_tick` takes them in, as the interpreter does
        self._fed_rank = np.full(nkeys, -1, np.int64)
        self._fed = 0

    def _completing(self, a: dict[str, npt.NDArray[Any]], pcap: int) -> None:
        """The runs layout's places of the runs that complete matches on a row (at most
        `pcap`); the computations layout has none."""
        a["lq"] = np.zeros(pcap if self._runs else 1, np.int64)

    def _out_arrays(self, size: int, keep: int = 0) -> None:
        a = self.arrays

        def make(name: str, dtype: npt.DTypeLike) -> None:
            new = np.zeros(size, dtype)
            if keep:
                new[:keep] = a[name][:keep]
            a[name] = new
        for name in ("out_key", "out_start", "out_end"):
            make(name, np.int64)
        if self._runs:  # (their kernel steps the rows in their order: no row to sort by)
            a["out_row"] = _EMPTY
        else:
            make("out_row", np.int64)
        for j, m in enumerate(self.program.measures):
            make(f"e{j}", dtype_of(m.kind))
            if m.nullable:
                make(f"e{j}n", np.bool_)
        self.out_cap = size

    def _ensure_keys(self, nkeys: int) -> None:
        a = self.arrays
        size = len(a["key_i"])
        if nkeys > size:
            while size < nkeys:
                size *= 2
            for name in ("key_i", "ph", "ch") + (("pf",) if self._runs else ()):
                grown = np.zeros((size,) + a[name].shape[1:], a[name].dtype)
                grown[:self._keys_ready] = a[name][:self._keys_ready]
                a[name] = grown
        if len(self._fed_rank) < size:
            self._fed_rank = np.concatenate([self._fed_rank,
                                             np.full(size - len(self._fed_rank), -1, np.int64)])
        if nkeys > self._keys_ready:  # a new key: no event yet, only the start computation
            new = slice(self._keys_ready, nkeys)
            a["key_i"][new] = 0
            a["key_i"][new, rt.K_LAST_TS] = INT64_MIN
            if not self._runs:  # its queue: the start computation (record 0)
                a["key_i"][new, rt.K_NPART] = 1
                a["ph"][new, 0] = 0
            self._keys_ready = nkeys

    def _grow(self, status: int) -> None:
        a, ctr = self.arrays, self.arrays["ctr"]
        if status == rt.FULL_OUTPUT:
            self._out_arrays(2 * self.out_cap, keep=int(ctr[rt.OUT_N]))
        elif status in (rt.FULL_QUEUE, rt.FULL_COMPLETED):
            # the computations layout's FULL_QUEUE: either queue (both grow)
            partial = status == rt.FULL_QUEUE
            completed = status == rt.FULL_COMPLETED or not self._runs
            queues = [("ph", self.pcap)] if partial else []
            queues += [("pf", self.pcap)] if partial and self._runs else []
            queues += [("ch", self.ccap)] if completed else []
            for name, old in queues:
                width = a[name].shape[1]  # the runs layout's: the key's row and `old` runs
                grown = np.zeros((len(a[name]), width + old) + a[name].shape[2:],
                                 a[name].dtype)
                grown[:, :width] = a[name]
                a[name] = grown
            self.pcap *= 2 if partial else 1
            self.ccap *= 2 if completed else 1
            a["lp"] = np.zeros(self.pcap, np.int64)
            a["lc"] = np.zeros(self.ccap, np.int64)
            self._completing(a, self.pcap)
        elif status == rt.FULL_POOL:
            rows = 2 * len(a["rec_i"])
            for name in ("rec_i", "rec_f", "free"):
                grown = np.zeros((rows,) + a[name].shape[1:], a[name].dtype)
                grown[:len(a[name])] = a[name]
                a[name] = grown
        elif status in (rt.SKIP_MISSING, rt.SKIP_FIRST):
            body, name = self.query.body, self.checked.name
            assert isinstance(body, ast.RecognizeQuery)
            start, end = int(ctr[rt.ERR_START]), int(ctr[rt.ERR_END])
            how = f"AFTER MATCH SKIP {body.skip.value.upper()} {body.skip_var}"
            if status == rt.SKIP_MISSING:
                raise RecognizeRuntimeError(
                    f"query {name!r}: {how}: a match without {body.skip_var} (rows "
                    f"{start}-{end}); Flink stops the query here")
            raise RecognizeRuntimeError(
                f"query {name!r}: {how} lands on the match's first row (seq {start}), which "
                "would find the same match again; Flink stops the query here")
        else:
            raise RuntimeError(f"MATCH_RECOGNIZE kernel returned unknown status {status}")

    # ------------------------------------------------------------ processing

    def _strings(self) -> None:
        a, p = self.arrays, self.program
        a["sc"] = p.constants.codes(self.strings)
        if p.uses_tables:
            if self._tables is None:
                self._tables = StringTables(self.strings)
            self._tables.refresh()
            tables = self._tables.arrays()
        else:
            tables = (_EMPTY,) * 4
        for name, array in zip(("s_rank", "s_lower", "s_upper", "s_length"), tables):
            a[name] = array

    def _state_args(self) -> list[npt.NDArray[Any]]:
        a = self.arrays
        flat = {"ch"} if self._runs else {"ph", "ch"}
        rows = {"ph", "pf"} if self._runs else set()  # a key's runs: rows k * pcap + j
        return [a[name].reshape(-1) if name in flat else
                a[name].reshape(-1, a[name].shape[2]) if name in rows else a[name]
                for name in rt.STATE_ARGS]

    def _out_args(self) -> list[npt.NDArray[Any]]:
        a = self.arrays
        return [a[name] for name in self._out_names]

    @property
    def _out_names(self) -> list[str]:
        names = ["out_key", "out_start", "out_end"]
        for j, m in enumerate(self.program.measures):
            names.append(f"e{j}")
            if m.nullable:
                names.append(f"e{j}n")
        return names

    def process_columns(self, batch: Batch) -> list[CompositeBatch]:
        n = len(batch)
        if n == 0:
            return []
        self._strings()
        kid = self.keys.assign(batch)
        self._ensure_keys(len(self.keys))
        seq = np.ascontiguousarray(batch.seq, dtype=np.int64)
        ts = np.ascontiguousarray(batch.ts, dtype=np.int64)
        if self._pending is not None:  # ORDER BY ts, col...: rows of a time wait
            sent = self._pending.take(kid, seq, ts, batch.columns, len(self.keys),
                                      self._ranks())
            return self._send(sent)
        cols = [np.ascontiguousarray(batch.columns[name], dtype=dtype)
                for name, dtype in self.program.columns]
        out, dead = self._run(kid, seq, ts, cols)
        self._dead_letters(kid[dead], seq[dead])
        return out

    def _run(self, kid: npt.NDArray[np.int64], seq: npt.NDArray[np.int64],
             ts: npt.NDArray[np.int64], cols: list[npt.NDArray[Any]]
             ) -> tuple[list[CompositeBatch], npt.NDArray[np.int64]]:
        """The kernel over these rows: their composite events, and the rows (in order) that
        came too late for their partition."""
        p, a = self.program, self.arrays
        n = len(kid)
        dead = np.zeros(n, np.int64)
        ctr = a["ctr"]
        ctr[rt.OUT_N] = ctr[rt.DEAD_N] = ctr[rt.STOP] = 0
        if n == 0:
            return [], dead
        # the kernel's scratch: a chunk of rows key by key (which row, and its columns; the
        # rows per key)
        size = min(n, CHUNK)
        scratch = [self._scratch("order", size, np.dtype(np.int64))]
        scratch += [self._scratch(f"g{j}", size, column.dtype)
                    for j, column in enumerate([kid, seq, ts, *cols])]
        scratch.append(self._scratch("counts", len(a["key_i"]) + 1, np.dtype(np.int64)))
        first = done = 0
        while True:
            status, first, done = p.module.kernel(
                first, done, n, p.within, self.pcap, self.ccap, self.out_cap,
                time.time_ns() // 1_000_000, kid, seq, ts, *cols, *scratch,
                *self._state_args(), *self._out_args(), a["out_row"], dead)
            if status == rt.DONE:
                break
            self._grow(status)
        if not self._runs:  # (the runs layout steps the rows in their order)
            self._batch_order(int(ctr[rt.OUT_N]))
        out = self._results(int(ctr[rt.OUT_N]))
        return [out] if len(out) else [], np.sort(dead[:int(ctr[rt.DEAD_N])])

    def _dead_letters(self, kid: npt.NDArray[np.int64], seq: npt.NDArray[np.int64]) -> None:
        for k, s in zip(kid.tolist(), seq.tolist()):
            key = orjson.dumps(self._key(k)).decode()
            self.dead_letters.append((s, "event time goes backwards in partition " + key))

    def _send(self, sent: Sent) -> list[CompositeBatch]:
        """ORDER BY ts, col...: the rows sent in, through the kernel; the dead letters of
        the rows late on arrival and of those late when they went in, in the order the
        interpreter makes them (by the row whose arrival made each)."""
        cols = [np.ascontiguousarray(sent.columns[name], dtype=dtype)
                for name, dtype in self.program.columns]
        # the interpreter makes a partition on its first row in: `_tick` takes them so
        self._fed = number_firsts(sent.kid, self._fed_rank, self._fed)
        out, dead = self._run(sent.kid, sent.seq, sent.ts, cols)
        at = np.concatenate([sent.late, sent.sent_at[dead]])
        after = np.concatenate([np.full(len(sent.late), -1, np.int64), dead])
        rows = np.lexsort([after, at])
        late_kid = np.concatenate([sent.late_kid, sent.kid[dead]])[rows]
        late_seq = np.concatenate([sent.late_seq, sent.seq[dead]])[rows]
        self._dead_letters(late_kid, late_seq)
        return out

    def _scratch(self, name: str, size: int, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
        """A buffer of the kernel's, kept from batch to batch (no new pages each time)."""
        buffer = self._buffers.get(name)
        if buffer is None or len(buffer) != size or buffer.dtype != dtype:
            buffer = self._buffers[name] = np.empty(size, dtype)
        return buffer

    def _batch_order(self, no: int) -> None:
        """The kernel stepped its rows key by key: the composite events, in the order they
        left, back in the order of the rows they left on (one row's stay in their order)."""
        self._order_outputs(self.arrays["out_row"][:no])

    def _order_outputs(self, by: npt.NDArray[np.int64]) -> None:
        """The first len(by) composite events in the (stable) order of `by`."""
        a, no = self.arrays, len(by)
        if no < 2 or bool((by[1:] >= by[:-1]).all()):
            return
        perm = np.argsort(by, kind="stable")
        for name in self._out_names:
            a[name][:no] = a[name][:no][perm]

    def _tick(self, ts: int) -> list[CompositeBatch]:
        p, a = self.program, self.arrays
        if p.within < 0 or not len(self.keys):
            return []
        self._strings()
        ctr = a["ctr"]
        ctr[rt.OUT_N] = 0
        k = 0
        while True:
            status, k = p.module.tick(k, len(self.keys), ts, p.within, self.pcap, self.ccap,
                                      self.out_cap, time.time_ns() // 1_000_000,
                                      *self._state_args(), *self._out_args())
            if status == rt.DONE:
                break
            self._grow(status)
        no = int(ctr[rt.OUT_N])
        if self._pending is not None:  # keys in the order their partitions began
            self._order_outputs(self._fed_rank[a["out_key"][:no]])
        out = self._results(no)
        return [out] if len(out) else []

    def punctuate_columns(self, ts: int) -> list[CompositeBatch]:
        return self._drain(ts) + self._tick(ts)

    def flush_columns(self) -> list[CompositeBatch]:
        return self._drain(None) + self._tick(rt.NEVER)

    def _drain(self, before: int | None) -> list[CompositeBatch]:
        """ORDER BY ts, col...: the rows waiting whose time ended by `before` (None: the
        end) go in."""
        if self._pending is None or not len(self._pending):
            return []
        self._strings()
        return self._send(self._pending.drain(before, self._ranks()))

    def _ranks(self) -> npt.NDArray[np.int64]:
        """Each string code's place in the strings' sorted order (ORDER BY a string), made
        again when the dictionary changed."""
        strings = self.strings
        if not any(self.schema.attributes[a] is AttrType.STRING for a, _ in self._then_by):
            return _EMPTY
        version = (len(strings), strings.generation)
        if self._rank is None or self._rank[0] != version:
            # (not StringTables': it adds every string's lower and upper case to the strings)
            self._rank = (version, string_ranks(strings.strings))
        return self._rank[1]

    def punctuate(self, ts: int) -> list[dict[str, Any]]:
        return to_dicts(self.punctuate_columns(ts))

    def flush(self) -> list[dict[str, Any]]:
        return to_dicts(self.flush_columns())

    def held_seq(self) -> int | None:
        """The smallest last seq of a completed match waiting behind an earlier partial
        one (None: none waits): every other composite still to come ends after the rows
        given (`StreamEngines.held`)."""
        a = self.arrays
        nkeys = len(self.keys)
        ncomp = a["key_i"][:nkeys, rt.K_NCOMP]
        # ORDER BY ts, col...: a row waiting for its time to end may end a match
        pending = None if self._pending is None else self._pending.held_seq()
        if not ncomp.any():
            return pending
        waiting = a["ch"][:nkeys][np.arange(a["ch"].shape[1]) < ncomp[:, None]]
        held = int(a["rec_i"][waiting, rt.LAST_SEQ].min())
        return held if pending is None else min(held, pending)

    # ------------------------------------------------------------ results

    def _key(self, k: int) -> object:
        return self.decode_key(self.key_attrs, self.keys.value(k))

    def _results(self, no: int) -> ColumnBatch:
        a, p = self.arrays, self.program
        ids = a["out_key"][:no]  # (`column` takes what it keeps: a gather or a copy)
        keys = self.keys.column(ids, self.schema, self.strings, self._key)
        fields = {}
        for j, attr in enumerate(self.key_attrs):
            if self.keys.fast:  # one attribute: the keys' own codes
                values = keys.ids
            else:
                values = np.array([self.keys.value(k)[j] for k in ids.tolist()],
                                  dtype_of(self.schema.attributes[attr]))
            fields[attr] = Field(attr, self.schema.attributes[attr], values)
        for j, m in enumerate(p.measures):
            fields[m.name] = Field(m.name, m.kind, a[f"e{j}"][:no].copy(),
                                   a[f"e{j}n"][:no].copy() if m.nullable else None)
        return ColumnBatch(self.checked.name, Decoder(self.strings.strings), keys,
                           a["out_end"][:no].copy(), a["out_start"][:no].copy(),
                           [fields[name] for name in p.outputs])

    # ------------------------------------------------------------ snapshots and strings

    def state(self) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
        a = self.arrays
        nkeys, high = len(self.keys), int(a["ctr"][rt.HIGH])
        keys, codes = self.keys.to_state()
        meta = {"keys": keys, "pcap": self.pcap, "ccap": self.ccap,
                "ctr": a["ctr"].tolist(), "pool": len(a["rec_i"]), "layout": self.program.layout,
                "record": self.program.record}
        if self.program.rows is not None:
            meta["rows"] = self.program.rows.describe()
        arrays = {"key_i": a["key_i"][:nkeys], "ph": a["ph"][:nkeys], "ch": a["ch"][:nkeys],
                  "rec_i": a["rec_i"][:high], "rec_f": a["rec_f"][:high],
                  "free": a["free"][:int(a["ctr"][rt.FREE_TOP])]}
        if self._runs:
            arrays["pf"] = a["pf"][:nkeys]
        if codes is not None:
            arrays["key_codes"] = codes
            arrays["key_free"] = self.keys.free_ids()
        if self._pending is not None:
            arrays.update(self._pending.arrays())
            arrays["tie_rank"] = self._fed_rank[:nkeys]
        return meta, arrays

    def load_state(self, meta: dict[str, Any], arrays: dict[str, npt.NDArray[Any]]) -> None:
        if "pcap" not in meta:  # e.g. the interpreter engine's (JSON) state
            raise ValueError(f"query {self.checked.name!r}: not the jitted MATCH_RECOGNIZE "
                             "engine's state (taken by the interpreter engine?)")
        name, layout = self.checked.name, meta.get("layout", rt.COMPUTATIONS)
        if layout == rt.RUNS and self.program.layout == rt.STATES:  # taken before states
            arrays = states_of(name, self.program, meta, arrays)
            layout = rt.STATES
            meta = dict(meta, layout=layout, rows=self.program.rows.describe())
        if layout != self.program.layout:  # e.g. taken before the query could run as runs
            raise ValueError(f"query {name!r}: the snapshot keeps partial matches as "
                             f"{layout}, this engine as {self.program.layout}: restore it "
                             "with the version that took it, or replay the stream")
        p = self.program
        if meta.get("record", p.record) != p.record:  # (snapshots before it have none)
            raise ValueError(f"query {name!r}: the snapshot's records keep other columns "
                             "than this version's compiler makes for the query: restore it "
                             "with the version that took it, or replay the stream")
        shapes: dict[str, tuple[int, ...]] = {"rec_i": (p.rec_ints,), "rec_f": (p.rec_floats,),
                                              "ph": (meta["pcap"],)}
        if self._runs:  # a key's rows: the key's row, then `pcap` runs
            arrays = rows_of(name, p, meta, arrays)
            ints, floats = p.rows.widths
            shapes["ph"], shapes["pf"] = (meta["pcap"] + 1, ints), (meta["pcap"] + 1, floats)
        if arrays["key_i"].ndim != 2 or arrays["key_i"].shape[1] > len(rt.KEY_FIELDS):
            shapes["key_i"] = (len(rt.KEY_FIELDS),)
        for array, shape in shapes.items():
            if array not in arrays or arrays[array].shape[1:] != shape:
                raise ValueError(f"query {name!r}: the snapshot's {array} is not this "
                                 "query's (another version of it?)")
        keys = _Keys.from_state(self.key_attrs, self.schema, meta["keys"],
                                arrays.get("key_codes"), arrays.get("key_free"))
        check_state(name, p, meta, arrays, len(keys))  # before the kernels index by them
        self.keys = keys
        nkeys = len(self.keys)
        self._allocate(nkeys=max(16, nkeys), pcap=meta["pcap"], ccap=meta["ccap"],
                       pool=meta["pool"], out_cap=256)
        a = self.arrays
        a["ctr"][:len(meta["ctr"])] = meta["ctr"]  # (older snapshots: fewer counters)
        # key_i: snapshots before the runs layout have no `branches` (0 in computations)
        a["key_i"][:nkeys, :arrays["key_i"].shape[1]] = arrays["key_i"]
        for array in ("ph", "ch", "rec_i", "rec_f", "free") + (("pf",) if self._runs else ()):
            a[array][:len(arrays[array])] = arrays[array]
        self._keys_ready = nkeys
        if self._pending is not None:
            self._load_pending(arrays, nkeys)
        elif any(name.startswith("tie_") for name in arrays):
            raise ValueError(f"query {name!r}: the snapshot has rows waiting for ORDER BY's "
                             "columns, which this query does not have")

    def _load_pending(self, arrays: dict[str, npt.NDArray[Any]], nkeys: int) -> None:
        """ORDER BY ts, col...: the rows waiting and the order the partitions began in,
        checked (`PendingRows.load`)."""
        assert self._pending is not None
        where = f"query {self.checked.name!r}"
        self._pending.load(arrays, nkeys, len(self.strings), where)
        rank = arrays.get("tie_rank")
        if rank is None:
            return
        rank = np.asarray(rank)
        began = rank[rank >= 0]
        if rank.ndim != 1 or len(rank) != nkeys or rank.dtype != np.int64 or \
                (rank < -1).any() or len(np.unique(began)) != len(began):
            raise ValueError(f"{where}: the snapshot's order of partitions is damaged")
        self._fed_rank[:nkeys] = rank
        self._fed = int(began.max()) + 1 if len(began) else 0

    def _string_cells(self) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
        a, p = self.arrays, self.program
        if not p.string_columns:
            return []
        nkeys = len(self.keys)
        live = rt.live_handles(None if self._runs else a["ph"], a["ch"], a["key_i"], nkeys)
        width, columns = a["rec_i"].shape[1], np.array(p.string_columns, np.int64)
        cells = [(a["rec_i"].reshape(-1), (live[:, None] * width + columns).ravel())]
        if self._runs:  # rows k * (pcap + 1) + j: the key's row (0), its runs
            j = np.arange(self.pcap + 1)
            npart = a["key_i"][:nkeys, rt.K_NPART, None]
            width, flat = a["ph"].shape[2], a["ph"].reshape(-1)
            for rows, kept in ((np.flatnonzero((j >= 1) & (j <= npart)), p.rows.run_ints),
                               (np.arange(nkeys) * (self.pcap + 1), p.rows.key_ints)):
                places = np.array([p.rows.ints[c] for c in p.string_columns if c in kept],
                                  np.int64)
                cells.append((flat, (rows[:, None] * width + places).ravel()))
        return cells

    def _pending_strings(self) -> list[npt.NDArray[Any]]:
        """ORDER BY ts, col...: the string columns of the rows waiting."""
        if self._pending is None:
            return []
        return [self._pending.columns[name] for name in self._pending.string_columns()]

    def string_codes(self) -> npt.NDArray[np.int64]:
        cells = [flat[at] for flat, at in self._string_cells()]
        return np.concatenate([np.asarray(self.keys.string_codes(), np.int64)] + cells +
                              self._pending_strings())

    def remap_strings(self, new_code: npt.NDArray[np.int64]) -> None:
        new_code = np.asarray(new_code, np.int64)
        cells = self._string_cells()
        new = [new_code[flat[at]] for flat, at in cells]
        waiting = [new_code[codes] for codes in self._pending_strings()]
        if any(len(codes) and codes.min() < 0 for codes in new + waiting):
            raise ValueError("the string dictionary dropped a string MATCH_RECOGNIZE "
                             "state holds")
        self.keys.remap_strings(new_code)
        for (flat, at), codes in zip(cells, new):
            flat[at] = codes
        for codes, remapped in zip(self._pending_strings(), waiting):
            codes[:] = remapped
        self._rank = None

