"""The jitted WINDOW engine: pane-based sliding windows, many queries over one stream.

`WindowQuerySet` evaluates any number of WINDOW queries over one stream together (CQPH):
each distinct WHERE conjunct is computed once per event into a shared predicate matrix
(one bit per event and predicate), then every query folds the events it selects into its
panes (`window_kernels.run_query`) and releases the windows whose end event time has
passed. Queries are added (`add`), changed (`update`) and removed (`remove`) between
batches; the others keep their state. Each query comes compiled
(`cep_core.compiler.window.compile_window`: its plan and predicate kernels); the set holds
the state. `WindowEngine`, what `create_engine` builds for a WINDOW query, is the set with
one query.

Per batch (in chunks of `chunk` events): predicate kernels fill the matrix (a predicate on
one string attribute is a per-code table look-up; `masked_at` or more on one attribute are
one look-up of a per-code bit mask per event, transposed 64 x 64), prefix maxima of each
window attribute give event time before every event, key ids come from the dictionary
codes (one string GROUP BY attribute) or a shared `KeyIndex`; then one kernel call per
query folds its selected events (found 64 at a time from the AND of its predicate rows)
and releases windows. Python orchestrates the calls, turns result rows into composite
events (once per call, in bulk) and late events into dead letters.

Memory: per query and group, P pane slots (P = RANGE / SLIDE, or ROWS n / SLIDE m) of a
few int64s per aggregate (576 bytes per exact float sum). A group whose panes no window
still to be released reads is forgotten (its number goes to later groups, its key id back
to the KeyIndex) once as many groups are idle as live, and always before the strings are
compacted, so groups are bounded by those with data in an unreleased window. The id ->
group table of a query grouped by one string attribute has one entry per dictionary code;
`remap_strings` rebuilds it (and the per-code predicate tables) for the compacted codes.

Results and dead letters are identical to `cep_core/reference/window.py` (see there and
docs/semantics.md); sums of floats are exact (the reference uses math.fsum).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from enum import StrEnum
from functools import partial
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt
import orjson

from cep_core import failpoints
from cep_core.query_limits import QueryStateLimit, limits, pane_bytes
from cep_core.batch import Batch, StringDictionary, decode_value
from cep_core.kernels.string_tables import StringTables
from cep_core.kernels import window_kernels as wk
from cep_core.engine.base import Arrays, Composite, Engine, Meta
from cep_core.engine.keys import Key, KeyIndex
from cep_core.engine.window_checks import check_state, live_rows
from cep_core.composite_batch import row_builder
from cep_core.schema import AttrType, StreamSchema

CHUNK = 1 << 16
FIRST_GROUPS = 8
FIRST_ROWS = 256
MASKED_AT = 4  # this many predicates on one string attribute are evaluated together
RELEASE_AT = 64  # idle groups (or idle key ids) forgotten once this many and as many as live
_EMPTY_I = np.zeros(0, dtype=np.int64)

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
U8 = npt.NDArray[np.uint8]
F64 = npt.NDArray[np.float64]
Block = tuple[I64, F64]  # result rows of one kernel call: out_i, out_f
PredicateKey = tuple[object, ...]
_S = TypeVar("_S", bound=np.generic)  # a WHERE conjunct's canonical form (the compiler's Key)


class _Predicate:
    """A shared WHERE conjunct and the queries that use it."""

    # `compiled`: cep_core.compiler.window.CompiledPredicate (Any: cep_core.engine does not
    # import the compiler)
    def __init__(self, compiled: Any):
        self.compiled = compiled
        self.users: set[str] = set()
        self.codes = np.zeros(1, dtype=np.int64)  # string constants' dictionary codes
        self.table = np.zeros(0, dtype=np.uint8)  # dense: result per dictionary code


class GroupKeyKind(StrEnum):
    """How a GROUP BY attribute list gives key ids (see the class below)."""

    NONE = "none"
    DENSE = "dense"
    GENERAL = "general"


class _Grouping:
    """Key ids for one GROUP BY attribute list, shared by the queries that group so.

    none: one key (id 0); dense (one string attribute): the dictionary code is the id;
    general: a KeyIndex over the batch."""

    def __init__(self, attrs: tuple[str, ...], schema: StreamSchema):
        self.attrs = attrs
        if not attrs:
            self.kind = GroupKeyKind.NONE
        elif len(attrs) == 1 and schema.attributes[attrs[0]] == AttrType.STRING:
            self.kind = GroupKeyKind.DENSE
        else:
            self.kind = GroupKeyKind.GENERAL
        self.index = KeyIndex(list(attrs)) if self.kind is GroupKeyKind.GENERAL else None
        self.users: set[str] = set()
        self.string_positions = [i for i, attr in enumerate(attrs)
                                 if schema.attributes[attr] == AttrType.STRING]

    def ids(self, batch: Batch, a: int, b: int, zeros: I64) -> I64:
        if self.kind is GroupKeyKind.NONE:
            return zeros[:b - a]
        if self.kind is GroupKeyKind.DENSE:
            return np.ascontiguousarray(batch.columns[self.attrs[0]][a:b], dtype=np.int64)
        assert self.index is not None  # GENERAL has one
        return self.index.assign(batch.slice(a, b))

    def size(self, strings: StringDictionary) -> int:
        """Bound on the ids: what a query's id -> group table must cover."""
        if self.kind is GroupKeyKind.NONE:
            return 1
        if self.kind is GroupKeyKind.DENSE:
            return len(strings)
        assert self.index is not None
        return len(self.index)

    def key(self, kid: int) -> Key:
        if self.kind is GroupKeyKind.NONE:
            return ()
        if self.kind is GroupKeyKind.DENSE:
            return (kid,)
        assert self.index is not None
        key = self.index.values[kid]
        assert key is not None  # asked for live keys only (a released one's is None)
        return key


class _Query:
    """One query's plan and state: kernel arrays, its groups' keys, its dead letters."""

    # `program`: cep_core.compiler.window.compile_window's (Any: the engine does not import
    # the compiler)
    def __init__(self, program: Any, rows_capacity: int, groups: int):
        checked, plan_ = program.checked, program.plan
        self.checked = checked
        self.name = checked.name
        self.plan = plan_
        self.group_attrs = tuple(plan_.group_by)
        self.st = np.zeros(wk.ST_SIZE, dtype=np.int64)
        self.st[wk.ST_T] = wk.NEG_INF
        self.st[wk.ST_R] = wk.NEG_INF
        self.st[wk.ST_NEXTJ] = wk.NO_WINDOW
        self.cfg = plan_.config(len(plan_.where))
        self.ikind = np.array([k for k, _ in plan_.int_accs] or [0], dtype=np.int64)
        self.fkind = np.array([k for k, _ in plan_.float_accs] or [0], dtype=np.int64)
        self.crow = np.zeros(max(1, len(plan_.where)), dtype=np.int64)
        self.icol = np.zeros(max(1, len(plan_.int_accs)), dtype=np.int64)
        self.fcol = np.zeros(max(1, len(plan_.float_accs)), dtype=np.int64)
        self.xcol = np.zeros(max(1, len(plan_.exact_sums)), dtype=np.int64)
        self.string_accs = [a for a, (kind, _) in enumerate(plan_.int_accs)
                            if kind in (wk.I_SMIN, wk.I_SMAX)]  # ist columns of codes
        self.keys: list[Key] = []  # group -> key tuple (column values)
        self.key_values: list[object] = []  # group -> decoded key (the composite's "key")
        self.key_parts: list[list[object]] = []  # group -> decoded GROUP BY values
        self.key_rank = np.zeros(0, dtype=np.int64)  # group -> place in key order
        self.make_rows = row_builder(["query", "key", "seq", "start_seq", "window_start",
                                       "window_end", *(name for name, _ in plan_.items)])
        self.predicate_keys = [predicate.key for predicate in program.predicates]
        self.dead: list[tuple[int, str]] = []
        self.loc = np.full(1, -1, dtype=np.int64)
        self.first_groups = groups if self.group_attrs else 1
        self._allocate(self.first_groups)
        self.out_i = np.zeros((rows_capacity, wk.O_SIZE + len(plan_.int_accs)), np.int64)
        self.out_f = np.zeros((rows_capacity, len(plan_.float_accs) + len(plan_.exact_sums)),
                              np.float64)

    # ------------------------------------------------------------ state arrays

    def _allocate(self, groups: int, old: Arrays | None = None) -> None:
        P, plan_ = self.plan.panes, self.plan
        need = groups * P * pane_bytes(plan_, wk)
        if old is not None and need > limits().state_bytes:
            raise QueryStateLimit(
                f"query {self.name!r} would hold {groups:,} groups of {P:,} panes "
                f"({need:,} bytes), over its state limit of {limits().state_bytes:,} bytes "
                "(CEP_MAX_QUERY_STATE_BYTES): fewer groups (a narrower GROUP BY or WHERE) or "
                "fewer panes (a longer SLIDE)")
        base = np.zeros((groups * P, wk.B_SIZE), dtype=np.int64)
        base[:, wk.B_TAG] = wk.I64_MIN
        ist = np.zeros((groups * P, len(plan_.int_accs)), dtype=np.int64)
        fst = np.zeros((groups * P, len(plan_.float_accs)), dtype=np.float64)
        xst = np.zeros((groups * P, len(plan_.exact_sums), wk.XSIZE), dtype=np.int64)
        xst[:, :, wk.XLO] = wk.XLIMBS
        xst[:, :, wk.XHI] = -1
        lastpane = np.zeros(groups, dtype=np.int64)
        isact = np.zeros(groups, dtype=np.uint8)
        active = np.zeros(groups, dtype=np.int64)
        if old is not None:
            rows, g = old["base"].shape[0], old["lastpane"].shape[0]
            base[:rows] = old["base"]
            ist[:rows] = old["ist"]
            fst[:rows] = old["fst"]
            xst[:rows] = old["xst"]
            lastpane[:g] = old["lastpane"]
            isact[:g] = old["isact"]
            active[:g] = old["active"]
        self.base, self.ist, self.fst, self.xst = base, ist, fst, xst
        self.lastpane, self.isact, self.active = lastpane, isact, active
        self.newk = np.zeros(groups, dtype=np.int64)

    def grow_groups(self) -> None:
        self._allocate(2 * self.lastpane.shape[0], self.arrays())

    def cover(self, size: int) -> None:
        """The id -> group table covers ids below `size`."""
        if self.loc.shape[0] < size:
            loc = np.full(max(size, 2 * self.loc.shape[0]), -1, dtype=np.int64)
            loc[:self.loc.shape[0]] = self.loc
            self.loc = loc

    def arrays(self) -> Arrays:
        return {"base": self.base, "ist": self.ist, "fst": self.fst, "xst": self.xst,
                "lastpane": self.lastpane, "isact": self.isact, "active": self.active}

    # ------------------------------------------------------------ idle groups, strings

    def idle_groups(self) -> int:
        return int(self.st[wk.ST_NG] - self.st[wk.ST_NACT])

    def release_idle(self) -> None:
        """Forget the groups no window still to be released reads (the kernel's inactive
        ones: their panes all lie before the first pane an unreleased window covers); the
        live ones are renumbered 0.. in their old order, the arrays shrink to fit them."""
        groups, live = int(self.st[wk.ST_NG]), int(self.st[wk.ST_NACT])
        if groups == live:
            return
        P = self.plan.panes
        kept = np.sort(self.active[:live])
        renumber = np.full(groups, -1, dtype=np.int64)
        renumber[kept] = np.arange(live, dtype=np.int64)
        rows = (kept[:, None] * P + np.arange(P, dtype=np.int64)).ravel()
        self._allocate(max(live, self.first_groups), {
            "base": self.base[rows], "ist": self.ist[rows], "fst": self.fst[rows],
            "xst": self.xst[rows], "lastpane": self.lastpane[kept],
            "isact": self.isact[kept], "active": renumber[self.active[:live]]})
        self.st[wk.ST_NG] = live
        held = self.loc >= 0
        self.loc[held] = renumber[self.loc[held]]
        kept_list = kept.tolist()
        self.keys = [self.keys[g] for g in kept_list]
        if len(self.key_values) == groups:  # decoded keys and ranks keep their order
            self.key_values = [self.key_values[g] for g in kept_list]
            self.key_parts = [self.key_parts[g] for g in kept_list]
            self.key_rank = self.key_rank[kept]
        else:
            self.key_values, self.key_parts = [], []

    def _live_rows(self) -> npt.NDArray[np.bool_]:
        """Which pane rows of the groups in use a window still to be released may read."""
        return live_rows(self.base[:int(self.st[wk.ST_NG]) * self.plan.panes], self.st,
                         self.plan)

    def string_codes(self, positions: list[int]) -> I64:
        """Codes in the groups' keys (at `positions`) and in string min/max panes."""
        codes: list[I64] = [np.array([key[i] for key in self.keys for i in positions],
                                     dtype=np.int64)]
        if self.string_accs:
            live = self._live_rows()
            codes.append(self.ist[:live.shape[0]][live][:, self.string_accs].ravel())
        return np.concatenate(codes)

    def remap_strings(self, positions: list[int], new_code: I64, dense: bool) -> None:
        if positions:
            self.keys = [tuple(int(new_code[cast(int, v)]) if i in positions else v
                               for i, v in enumerate(key)) for key in self.keys]
        if self.string_accs:
            live = self._live_rows()
            for a in self.string_accs:
                column = self.ist[:live.shape[0], a]
                column[live] = _remapped(new_code, column[live])
                column[~live] = 0  # never read again; kept a valid code
        if dense:  # the id -> group table is indexed by code
            codes = np.flatnonzero(self.loc >= 0)
            if codes.size and codes[-1] >= new_code.shape[0]:
                raise ValueError(f"query {self.name!r} holds a group of an unknown code")
            loc = np.full(max(1, int(new_code.max(initial=-1)) + 1), -1, dtype=np.int64)
            loc[_remapped(new_code, codes)] = self.loc[codes]
            self.loc = loc

    # ------------------------------------------------------------ snapshots

    def state(self) -> tuple[Meta, Arrays]:
        groups = int(self.st[wk.ST_NG])
        rows = groups * self.plan.panes
        arrays: Arrays = {"cfg": self.cfg, "st": self.st, "loc": self.loc,
                  "base": self.base[:rows], "ist": self.ist[:rows], "fst": self.fst[:rows],
                  "xst": self.xst[:rows], "lastpane": self.lastpane[:groups],
                  "isact": self.isact[:groups], "active": self.active[:groups]}
        return {"name": self.name, "keys": [list(k) for k in self.keys],
                "dead": self.dead}, arrays

    def check_state(self, meta: Meta, arrays: Arrays, nstrings: int) -> None:
        """ValueError where `load_state` of these would take the kernel out of its arrays,
        or they are another query's."""
        if "cfg" not in arrays or not np.array_equal(arrays["cfg"], self.cfg):
            raise ValueError(f"snapshot of query {self.name!r} has another window or WHERE")
        check_state(self, meta, arrays, nstrings)

    def load_state(self, meta: Meta, arrays: Arrays) -> None:
        groups = int(arrays["st"][wk.ST_NG])
        self._allocate(max(groups, self.first_groups),
                       {k: arrays[k] for k in ("base", "ist", "fst", "xst", "lastpane",
                                               "isact", "active")})
        self.st = arrays["st"].astype(np.int64).copy()
        self.loc = arrays["loc"].astype(np.int64).copy()
        self.keys = [tuple(k) for k in meta["keys"]]
        self.key_values, self.key_parts = [], []
        self.dead = [tuple(d) for d in meta["dead"]]


class WindowQuerySet:
    """Many WINDOW queries over one stream, evaluated together with shared predicates.

    `process(batch)`, `punctuate(ts)` and `flush()` return the composite events of every
    query (each query's in the order its reference interpreter would give them);
    `dead_letters(name)` is a query's rejected events as (seq, reason)."""

    def __init__(self, schema: StreamSchema, strings: StringDictionary,
                 chunk: int = CHUNK, rows_capacity: int = FIRST_ROWS,
                 groups: int = FIRST_GROUPS, masked_at: int = MASKED_AT,
                 release_at: int = RELEASE_AT):
        if chunk <= 0 or chunk % 64:
            raise ValueError("chunk must be a positive multiple of 64")
        if rows_capacity < 1 or groups < 1:
            raise ValueError("rows_capacity and groups must be at least 1")
        self.groups = groups
        self.masked_at = masked_at
        self.release_at = release_at
        self.schema = schema
        self.strings = strings
        self.chunk = chunk
        self.rows_capacity = rows_capacity
        self.queries: dict[str, _Query] = {}
        self.predicates: dict[PredicateKey, _Predicate] = {}
        self.groupings: dict[tuple[str, ...], _Grouping] = {}
        self._tables: StringTables | None = None
        self._dummy_tables: tuple[I64, ...] = tuple(np.zeros(1, dtype=np.int64)
                                                    for _ in range(4))
        self._seen_strings = -1
        self._failed: dict[str, tuple[str, str]] = {}  # query -> (stage, reason)
        self._layout()

    # ------------------------------------------------------------ queries

    def __contains__(self, name: str) -> bool:
        return name in self.queries

    def __len__(self) -> int:
        return len(self.queries)

    @property
    def names(self) -> list[str]:
        return list(self.queries)

    def add(self, program: Any) -> None:
        """Start evaluating a query (from the next batch on, with fresh state), given its
        program (`cep_core.compiler.window.compile_window`)."""
        checked = program.checked
        if checked.name in self.queries:
            raise ValueError(f"query {checked.name!r} is already in the set")
        if checked.schema.stream != self.schema.stream:
            raise ValueError(f"query {checked.name!r} reads stream {checked.schema.stream!r}, "
                             f"this set reads {self.schema.stream!r}")
        plan_ = program.plan
        for compiled in program.predicates:
            predicate = self.predicates.get(compiled.key)
            if predicate is None:
                predicate = self.predicates[compiled.key] = _Predicate(compiled)
            predicate.users.add(checked.name)
        attrs = tuple(plan_.group_by)
        grouping = self.groupings.get(attrs)
        if grouping is None:
            grouping = self.groupings[attrs] = _Grouping(attrs, self.schema)
        grouping.users.add(checked.name)
        self.queries[checked.name] = _Query(program, self.rows_capacity, self.groups)
        self._layout()

    def remove(self, name: str) -> None:
        """Stop evaluating a query and drop its state; the others are untouched."""
        query = self.queries.pop(name)
        for key in [k for k, p in self.predicates.items() if name in p.users]:
            self.predicates[key].users.discard(name)
            if not self.predicates[key].users:
                del self.predicates[key]
        grouping = self.groupings[query.group_attrs]
        grouping.users.discard(name)
        if not grouping.users:
            del self.groupings[query.group_attrs]
        self._layout()

    def update(self, program: Any) -> None:
        """Replace a query by a new version of the same name (given its program); it starts
        afresh (windows, event time and row numbers), the others keep their state."""
        if program.checked.name in self.queries:
            self.remove(program.checked.name)
        self.add(program)

    def _layout(self) -> None:
        """Predicate rows and stacked columns after the set of queries changed."""
        self._order = list(self.predicates.values())
        row = {id(p): r for r, p in enumerate(self._order)}
        # Many predicates on one string attribute are evaluated together (mask_rows).
        by_attr: dict[str, list[int]] = {}
        for r, predicate in enumerate(self._order):
            if predicate.compiled.dense is not None:
                by_attr.setdefault(predicate.compiled.dense, []).append(r)
        self._masked = {attr: np.array(rows, dtype=np.int64)
                        for attr, rows in by_attr.items() if len(rows) >= self.masked_at}
        self._masks: dict[str, U64] = {}
        self._int_columns: list[str] = []
        self._float_columns: list[str] = []
        self._window_attrs: list[str] = []
        self._needs_tables = any(p.compiled.uses_tables for p in self._order)
        for query in self.queries.values():
            plan_ = query.plan
            for r, key in enumerate(query.predicate_keys):
                query.crow[r] = row[id(self.predicates[key])]
            for a, (kind, column) in enumerate(plan_.int_accs):
                query.icol[a] = _slot(self._int_columns, column)
                if kind in (wk.I_SMIN, wk.I_SMAX):
                    self._needs_tables = True
            for a, (_, column) in enumerate(plan_.float_accs):
                query.fcol[a] = _slot(self._float_columns, column)
            for a, column in enumerate(plan_.exact_sums):
                query.xcol[a] = _slot(self._float_columns, column)
            if not plan_.rows and plan_.window_attr not in self._window_attrs:
                self._window_attrs.append(plan_.window_attr)
        self._seen_strings = -1  # recompute constants' codes and tables

    # ------------------------------------------------------------ strings

    def _refresh_strings(self) -> tuple[I64, ...]:
        """Constants' codes, string tables and per-code predicate tables for the current
        dictionary; the string tables the kernels take."""
        strings = self.strings
        if self._seen_strings != len(strings):
            for predicate in self._order:
                predicate.codes = predicate.compiled.constants.codes(strings)
            if self._needs_tables:
                if self._tables is None:
                    self._tables = StringTables(strings)
                self._tables.refresh()
            size = len(strings)
            tables = self._table_arrays()
            for predicate in self._order:
                if predicate.compiled.dense is not None and predicate.table.shape[0] < size:
                    predicate.table = self._per_code(predicate, predicate.table.shape[0], size,
                                                     tables)
            for attr, rows in self._masked.items():  # extended for the new codes only
                old = self._masks.get(attr)
                done = 0 if old is None else old.shape[0]
                masks = np.zeros((size, (len(rows) + 63) >> 6), dtype=np.uint64)
                if old is not None:
                    masks[:done] = old
                for p, r in enumerate(rows):
                    masks[done:, p >> 6] |= (self._order[r].table[done:size].astype(np.uint64)
                                             << np.uint64(p & 63))
                self._masks[attr] = masks
            for query in self.queries.values():
                query.cover(self.groupings[query.group_attrs].size(strings))
            self._seen_strings = size
        return self._table_arrays()

    def _table_arrays(self) -> tuple[I64, ...]:
        if not self._needs_tables:
            return self._dummy_tables
        assert self._tables is not None  # made above when strings are refreshed
        return self._tables.arrays()

    def _per_code(self, predicate: _Predicate, old: int, size: int, tables: tuple[I64, ...]
                  ) -> U8:
        """A dense predicate's table extended to codes old..size-1 (the result for a code
        never changes: it is a function of the string)."""
        codes = np.arange(old, size, dtype=np.int64)
        words = np.zeros((size - old + 63) >> 6, dtype=np.uint64)
        compiled = predicate.compiled
        compiled.kernel(words, size - old, codes, compiled.ints, compiled.floats,
                        predicate.codes, *tables)
        table = np.zeros(size, dtype=np.uint8)
        table[:old] = predicate.table[:old]
        wk.unpack_bits(words, size - old, table[old:])
        return table

    # ------------------------------------------------------------ compaction

    def string_codes(self) -> I64:
        """Every string code the state holds: keys of the groups with data in a window
        still to be released (idle groups are forgotten first), their string min/max
        panes, and the KeyIndex keys still held. Query constants are not reported: they
        are encoded again after a compaction."""
        self.release_idle(force=True)
        codes = [_EMPTY_I]
        for query in self.queries.values():
            grouping = self.groupings[query.group_attrs]
            codes.append(query.string_codes(grouping.string_positions))
        for grouping in self.groupings.values():
            if grouping.index is not None and grouping.string_positions:
                codes.append(np.array(grouping.index.string_codes(grouping.string_positions),
                                      dtype=np.int64))
        return np.concatenate(codes)

    def remap_strings(self, new_code: I64) -> None:
        """Renumber every code held after `StringDictionary.compact`; per-code tables are
        cut down to the codes kept (a predicate's result is a function of the string)."""
        new_code = np.asarray(new_code, dtype=np.int64)
        for query in self.queries.values():
            grouping = self.groupings[query.group_attrs]
            query.remap_strings(grouping.string_positions, new_code,
                                grouping.kind is GroupKeyKind.DENSE)
        for grouping in self.groupings.values():
            if grouping.index is not None:
                grouping.index.remap_strings(grouping.string_positions, new_code)
        for predicate in self._order:
            if predicate.table.shape[0]:
                predicate.table = predicate.table[_kept(new_code, predicate.table.shape[0])]
        for attr, masks in self._masks.items():
            self._masks[attr] = masks[_kept(new_code, masks.shape[0])]
        self._seen_strings = -1  # constants' codes, string tables, id -> group tables

    def release_idle(self, force: bool = False) -> None:
        """Forget idle groups (and the key ids no query holds any more): always when
        `force`, else where at least `release_at` and as many as live are idle."""
        for query in self.queries.values():
            idle = query.idle_groups()
            if idle and (force or idle >= max(self.release_at, int(query.st[wk.ST_NACT]))):
                query.release_idle()
        for grouping in self.groupings.values():
            index = grouping.index
            if index is None:
                continue
            users = [self.queries[name] for name in grouping.users]
            groups = sum(int(q.st[wk.ST_NG]) for q in users)
            if not force and len(index.ids) < max(self.release_at, 2 * groups):
                continue
            held = np.zeros(len(index), dtype=bool)
            for query in users:
                loc = query.loc[:held.shape[0]]
                held[:loc.shape[0]] |= loc >= 0
            index.release([k for k in index.ids.values() if not held[k]])

    # ------------------------------------------------------------ streams

    def process(self, batch: Batch) -> list[Composite]:
        n = len(batch)
        if n == 0 or not self.queries:
            return []
        found: dict[str, list[Block]] = {name: [] for name in self.queries}
        for a in range(0, n, self.chunk):
            self._chunk(batch, a, min(n, a + self.chunk), found)
        return self._done(found)

    def punctuate(self, ts: int) -> list[Composite]:
        """Event time reaches ts: time windows ending below it are released."""
        return self._advance(int(ts), "punctuate")

    def flush(self) -> list[Composite]:
        """End of the stream: every time window still holding events is released."""
        return self._advance(wk.POS_INF, "flush")

    # ------------------------------------------------------------ containment

    def _run_one(self, query: _Query, stage: str, seq: int | None,
                 found: dict[str, list[Block]], run: Callable[[], None]) -> None:
        """`run()` for one query; if it raises, the query is failed (dropped from the set
        when the call ends, nothing of it released from this call) and the others go on."""
        if query.name in self._failed:
            return
        try:
            failpoints.hit(query.name, stage, seq)
            run()
        except Exception as e:  # noqa: BLE001 - contained to the query
            self._failed[query.name] = (stage, f"{type(e).__name__}: {e}")
            found[query.name] = []

    def _done(self, found: dict[str, list[Block]]) -> list[Composite]:
        for name in self._failed:
            found.pop(name, None)
            if name in self.queries:
                self.remove(name)
        out = self._ordered(found)
        self.release_idle()
        return out

    def take_failed(self) -> dict[str, tuple[str, str]]:
        """The queries that failed (and were dropped) since the last call: name ->
        (stage, reason)."""
        out, self._failed = self._failed, {}
        return out

    def dead_letters(self, name: str) -> list[tuple[int, str]]:
        return self.queries[name].dead

    def _chunk(self, batch: Batch, a: int, b: int, found: dict[str, list[Block]]) -> None:
        tables = self._refresh_strings()
        n = b - a
        columns: dict[str, npt.NDArray[Any]] = {}

        def column(name: str) -> npt.NDArray[Any]:
            if name not in columns:
                columns[name] = np.ascontiguousarray(batch.columns[name][a:b])
            return columns[name]

        pv = np.empty((len(self._order), (n + 63) >> 6), dtype=np.uint64)
        for attr, rows in self._masked.items():
            wk.mask_rows(pv, rows, self._masks[attr], column(attr))
        for r, predicate in enumerate(self._order):
            compiled = predicate.compiled
            if compiled.dense is not None:
                if compiled.dense not in self._masked:
                    wk.table_bits(pv[r], predicate.table, column(compiled.dense))
            else:
                compiled.kernel(pv[r], n, *(column(c) for c in compiled.columns),
                                compiled.ints, compiled.floats, predicate.codes, *tables)
        times: dict[str, tuple[I64, I64]] = {}
        for attr in self._window_attrs:
            wt = (np.ascontiguousarray(batch.ts[a:b], dtype=np.int64)
                  if attr == self.schema.time else column(attr).astype(np.int64, copy=False))
            pmx = np.empty(n + 1, dtype=np.int64)
            wk.prefix_max(wt, pmx)
            times[attr] = (wt, pmx)
        zeros = np.zeros(n, dtype=np.int64)
        kids = {attrs: grouping.ids(batch, a, b, zeros)
                for attrs, grouping in self.groupings.items()}
        for grouping in self.groupings.values():
            if grouping.kind is GroupKeyKind.GENERAL:  # the index may have grown
                size = grouping.size(self.strings)
                for name in grouping.users:
                    self.queries[name].cover(size)
        imat = _stack([column(c) for c in self._int_columns], n, np.int64)
        fmat = _stack([column(c) for c in self._float_columns], n, np.float64)
        seq = np.ascontiguousarray(batch.seq[a:b], dtype=np.int64)
        dl = np.empty(n, dtype=np.int64)
        last = int(seq[-1]) if n else None
        for query in self.queries.values():
            self._run_one(query, "process", last, found, partial(
                self._fold, query, pv, n, times, seq, kids, zeros, imat, fmat, tables, dl,
                found))

    def _fold(self, query: _Query, pv: U64, n: int, times: dict[str, tuple[I64, I64]], seq: I64,
              kids: dict[tuple[str, ...], I64], zeros: I64, imat: I64, fmat: F64,
              tables: tuple[I64, ...], dl: I64, found: dict[str, list[Block]]) -> None:
        plan_ = query.plan
        wt, pmx = times[plan_.window_attr] if not plan_.rows else (zeros, zeros)
        kid = kids[query.group_attrs]
        self._run(query, pv, n, wt, pmx, seq, kid, imat, fmat, tables[0], dl,
                  found[query.name])
        for i in dl[:query.st[wk.ST_DLN]].tolist():
            t = int(wt[i])
            end = -(-t // plan_.slide) * plan_.slide
            query.dead.append((int(seq[i]), f"late event: window time {t} is not above "
                                            f"the end {end} of an already emitted window "
                                            f"of query {query.name}"))

    def _advance(self, clock: int, stage: str = "punctuate") -> list[Composite]:
        found: dict[str, list[Block]] = {name: [] for name in self.queries}
        tables = self._refresh_strings()
        pv = np.zeros((len(self._order), 0), dtype=np.uint64)
        pmx = np.array([clock], dtype=np.int64)
        imat = np.zeros((len(self._int_columns), 0), dtype=np.int64)
        fmat = np.zeros((len(self._float_columns), 0), dtype=np.float64)
        for query in self.queries.values():
            if query.plan.rows:
                continue
            self._run_one(query, stage, None, found, partial(
                self._run, query, pv, 0, _EMPTY_I, pmx, _EMPTY_I, _EMPTY_I, imat, fmat,
                tables[0], _EMPTY_I, found[query.name]))
        return self._done(found)

    def _run(self, query: _Query, pv: U64, n: int, wt: I64, pmx: I64, seq: I64, kid: I64,
             imat: I64, fmat: F64, s_rank: I64, dl: I64, found: list[Block]) -> None:
        st = query.st
        st[wk.ST_DLN] = 0
        start = 0
        grouping = self.groupings[query.group_attrs]
        while True:
            st[wk.ST_NNEW] = 0
            status = wk.run_query(
                query.cfg, st, pv, query.crow, start, n, wt, pmx, seq, kid, query.loc,
                imat, fmat, s_rank, query.ikind, query.icol, query.fkind, query.fcol,
                query.xcol, query.base, query.ist, query.fst, query.xst, query.lastpane,
                query.isact, query.active, query.newk, query.out_i, query.out_f, dl)
            for kid_ in query.newk[:st[wk.ST_NNEW]].tolist():
                query.keys.append(grouping.key(kid_))
            self._drain(query, found)
            if status == wk.DONE:
                return
            if status == wk.NEED_GROUPS:
                query.grow_groups()
            elif st[wk.ST_NACT] > query.out_i.shape[0]:  # NEED_ROOM with an empty buffer
                size = 2 * int(st[wk.ST_NACT])
                query.out_i = np.zeros((size, query.out_i.shape[1]), np.int64)
                query.out_f = np.zeros((size, query.out_f.shape[1]), np.float64)
            start = int(st[wk.ST_POS])

    # ------------------------------------------------------------ results

    def _drain(self, query: _Query, found: list[Block]) -> None:
        """Take the result rows out of the kernel's buffer (turned into composite events
        once per call, by `_ordered`)."""
        count = int(query.st[wk.ST_OUTN])
        if count:
            query.st[wk.ST_OUTN] = 0
            found.append((query.out_i[:count].copy(), query.out_f[:count].copy()))

    def _ordered(self, found: dict[str, list[Block]]) -> list[Composite]:
        """Composite events of each query, in (window end, key) order, query after query."""
        out: list[Composite] = []
        for name, blocks in found.items():
            if blocks:
                out.extend(self._rows(self.queries[name], blocks))
        return out

    def _rows(self, query: _Query, blocks: list[Block]) -> list[Composite]:
        ints = np.concatenate([b[0] for b in blocks]) if len(blocks) > 1 else blocks[0][0]
        floats = np.concatenate([b[1] for b in blocks]) if len(blocks) > 1 else blocks[0][1]
        plan_ = query.plan
        self._decode_keys(query)
        groups = ints[:, wk.O_GROUP]
        order = np.lexsort((query.key_rank[groups], ints[:, wk.O_WINDOW]))
        ints, floats, groups = ints[order], floats[order], groups[order]
        counts = ints[:, wk.O_COUNT]
        ends = ints[:, wk.O_WINDOW] * plan_.slide
        group_list = groups.tolist()
        nf = len(plan_.float_accs)
        columns: list[Iterable[object]] = [
            itertools.repeat(query.name), [query.key_values[g] for g in group_list],
            ints[:, wk.O_LSEQ].tolist(), ints[:, wk.O_FSEQ].tolist(),
            (ends - plan_.range).tolist(), ends.tolist()]
        for _, how in plan_.items:
            tag = how[0]
            if tag is wk.Output.COUNT:
                column = counts.tolist()
            elif tag is wk.Output.INT:
                column = ints[:, wk.O_SIZE + how[1]].tolist()
                if how[2] == AttrType.STRING:
                    decode = self.strings.decode
                    column = [decode(code) for code in column]
            elif tag is wk.Output.FLOAT:
                column = floats[:, how[1]].tolist()
            elif tag is wk.Output.XSUM:
                column = floats[:, nf + how[1]].tolist()
            elif tag is wk.Output.AVG_X:  # float / int count: what Python's sum / len gives
                column = (floats[:, nf + how[1]] / counts).tolist()
            elif tag is wk.Output.AVG_INT:
                sums = ints[:, wk.O_SIZE + how[1]]
                if sums.size and np.abs(sums).max() > 2 ** 53:  # int / int, exactly rounded
                    column = [a / b for a, b in zip(sums.tolist(), counts.tolist())]
                else:
                    column = (sums.astype(np.float64) / counts).tolist()
            elif tag is wk.Output.KEY:
                column = [query.key_parts[g][how[1]] for g in group_list]
            else:  # the window attribute: the window end
                column = ends.tolist()
            columns.append(column)
        rows: list[Composite] = query.make_rows(zip(*columns))
        return rows

    def _decode_keys(self, query: _Query) -> None:
        """Decoded keys of the query's groups and their ranks in key order."""
        if len(query.key_values) == len(query.keys):
            return
        kinds = self.schema.attributes
        for key in query.keys[len(query.key_values):]:
            parts: list[object] = [decode_value(kinds[attr], value, self.strings)
                     for attr, value in zip(query.group_attrs, key)]
            query.key_parts.append(parts)
            query.key_values.append(None if not parts else parts[0] if len(parts) == 1
                                    else parts)
        orders = [orjson.dumps(k) for k in query.key_values]
        rank = np.empty(len(orders), dtype=np.int64)
        rank[sorted(range(len(orders)), key=orders.__getitem__)] = np.arange(len(orders))
        query.key_rank = rank

    # ------------------------------------------------------------ snapshots

    def state(self) -> tuple[Meta, Arrays]:
        """The whole state of every query (and the shared key indexes)."""
        meta: Meta = {"queries": [], "groupings": []}
        arrays: Arrays = {}
        for number, query in enumerate(self.queries.values()):
            query_meta, query_arrays = query.state()
            meta["queries"].append(query_meta)
            arrays.update({f"q{number}_{k}": v for k, v in query_arrays.items()})
        for attrs, grouping in self.groupings.items():
            if grouping.index is not None:
                meta["groupings"].append({"attrs": list(attrs),
                                          "keys": grouping.index.to_state()})
        return meta, arrays

    def load_state(self, meta: Meta, arrays: Arrays) -> None:
        """Put back a state taken from a set with the same queries."""
        names = [q["name"] for q in meta["queries"]]
        if sorted(names) != sorted(self.queries):
            raise ValueError(f"snapshot holds queries {names}, this set {list(self.queries)}")
        states = [(self.queries[query_meta["name"]], query_meta,
                   {k[len(f"q{number}_"):]: v for k, v in arrays.items()
                    if k.startswith(f"q{number}_")})
                  for number, query_meta in enumerate(meta["queries"])]
        for query, query_meta, query_arrays in states:  # all, before any changes
            query.check_state(query_meta, query_arrays, len(self.strings))
        indexes = {}
        for entry in meta["groupings"]:
            attrs = tuple(entry["attrs"])
            if attrs not in self.groupings:
                raise ValueError(f"snapshot groups by {list(attrs)}, which no query here does")
            indexes[attrs] = KeyIndex.from_state(list(attrs), entry["keys"])
        for query, query_meta, query_arrays in states:
            query.load_state(query_meta, query_arrays)
        for attrs, index in indexes.items():
            self.groupings[attrs].index = index
        self._seen_strings = -1


class WindowEngine(Engine):
    """One WINDOW query: a WindowQuerySet holding just it. Options: `chunk` (events per
    kernel call, a multiple of 64), `rows_capacity` (result rows per kernel call before
    Python drains them), `groups` (initial group capacity), `masked_at` (how many
    predicates on one string attribute are evaluated together), `release_at` (idle groups
    are forgotten once this many and as many as live); options meant for other engines
    are ignored."""

    # `options`: the engine options of a file (JSON or CLI values, each engine takes its own)
    def __init__(self, program: Any, strings: StringDictionary, **options: Any):
        checked = program.checked
        self.set = WindowQuerySet(checked.schema, strings,
                                  chunk=options.get("chunk", CHUNK),
                                  rows_capacity=options.get("rows_capacity", FIRST_ROWS),
                                  groups=options.get("groups", FIRST_GROUPS),
                                  masked_at=options.get("masked_at", MASKED_AT),
                                  release_at=options.get("release_at", RELEASE_AT))
        self.set.add(program)
        super().__init__(checked, strings)

    @property
    def dead_letters(self) -> list[tuple[int, str]]:
        return self.set.queries[self.checked.name].dead

    @dead_letters.setter
    def dead_letters(self, value: list[tuple[int, str]]) -> None:
        self.set.queries[self.checked.name].dead = value

    def process(self, batch: Batch) -> list[Composite]:
        return self.set.process(batch)

    def punctuate(self, ts: int) -> list[Composite]:
        return self.set.punctuate(ts)

    def flush(self) -> list[Composite]:
        return self.set.flush()

    def state(self) -> tuple[Meta, Arrays]:
        return self.set.state()

    def load_state(self, meta: Meta, arrays: Arrays) -> None:
        dead = self.dead_letters  # (the set's state has each query's: Engine.restore's)
        self.set.load_state(meta, arrays)
        self.dead_letters = dead

    def string_codes(self) -> I64:
        return self.set.string_codes()

    def remap_strings(self, new_code: I64) -> None:
        self.set.remap_strings(new_code)


# ---------------------------------------------------------------- helpers


def _remapped(new_code: I64, codes: I64) -> I64:
    """The new codes of codes the state holds (all kept by the compaction)."""
    out = new_code[codes]
    if (out < 0).any():
        raise ValueError("a string the WINDOW state holds was dropped by the compaction")
    return out


def _kept(new_code: I64, size: int) -> I64:
    """The old codes below `size` that a compaction kept, in order (their new codes are
    0, 1, ... since the renumbering keeps the order)."""
    return np.flatnonzero(new_code[:size] >= 0)


def _slot(names: list[str], name: str) -> int:
    if name not in names:
        names.append(name)
    return names.index(name)


def _stack(columns: list[npt.NDArray[Any]], n: int, dtype: type[_S]) -> npt.NDArray[_S]:
    if not columns:
        return np.zeros((0, n), dtype=dtype)
    out = np.empty((len(columns), n), dtype=dtype)
    for r, column in enumerate(columns):
        out[r] = column
    return out
