"""Composite events as columns: what the jitted engines return.

An engine call returns `CompositeBatch`es: numpy columns copied from its kernel's output
arrays, no Python object per composite event. `to_dicts()` builds the JSON objects of
docs/semantics.md (exactly what `cep_core.reference` gives) for the edges that need them: Kafka
messages, files, tests. `to_arrow()` gives the same events as one Arrow record batch, again
without a Python object per event: `query`, `key` (JSON text), `seq`, `start_seq`, for SEQ
`events` (a list of {variable, seq, attributes...} structs in binding order), then the
EMIT/SELECT fields.
"""

from __future__ import annotations

import gc
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import CodeType
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa

from cep_core.arrow_numpy import array, segment_rows
from cep_core.schema import AttrType

Int64s = npt.NDArray[np.int64]
Nulls = npt.NDArray[Any]  # bool or int: nonzero is a NULL
# Rows (tuples of field values) -> composite dicts, as `row_builder` makes it.
RowsBuilder = Callable[[Iterable[tuple[Any, ...]]], list[dict[str, Any]]]

ARROW_TYPES = {"int": pa.int64(), "timestamp": pa.int64(), "float": pa.float64(),
               "bool": pa.bool_(), "string": pa.string()}


class CompositeBatch(ABC):
    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def to_dicts(self) -> list[dict[str, Any]]: ...

    @abstractmethod
    def to_arrow(self) -> pa.RecordBatch: ...

    @abstractmethod
    def take(self, rows: Int64s) -> CompositeBatch:
        """The composites at these row positions, in this order, as a batch of their own."""


def to_dicts(batches: list[CompositeBatch]) -> list[dict[str, Any]]:
    return [c for b in batches for c in b.to_dicts()]


def count(batches: list[CompositeBatch]) -> int:
    return sum(len(b) for b in batches)


@dataclass
class Field:
    """One output column: `values` as the kernel wrote them (strings as dictionary codes);
    `nulls` marks SQL NULLs; a list field (Collect) has `offsets` (n + 1) into `values`."""
    name: str
    kind: str
    values: npt.NDArray[Any]
    nulls: Nulls | None = None
    offsets: Int64s | None = None

    def take(self, rows: Int64s) -> Field:
        values = np.asarray(self.values)
        nulls = None if self.nulls is None else np.asarray(self.nulls)[rows]
        if self.offsets is None:
            return Field(self.name, self.kind, values[rows], nulls)
        offsets = np.asarray(self.offsets, np.int64)
        starts = offsets[rows]
        counts = offsets[rows + 1] - starts
        taken = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(counts, out=taken[1:])
        return Field(self.name, self.kind, values[segment_rows(starts, counts)], nulls, taken)


class Decoder:
    """Kernel values -> the Python values the reference gives (a string dictionary's codes
    -> strings), column at a time."""

    def __init__(self, strings: list[str]) -> None:
        self.strings = strings  # the live list of a StringDictionary (append-only)

    def values(self, kind: str, column: npt.NDArray[Any]) -> list[Any]:
        out: list[Any]
        if kind == AttrType.STRING:
            out = list(map(self.strings.__getitem__, column.tolist()))
        elif kind == AttrType.BOOL:
            out = (column != 0).tolist()
        elif kind == AttrType.FLOAT:
            out = column.astype(np.float64).tolist()
        else:
            out = column.tolist()
        return out

    def field(self, f: Field, n: int) -> list[Any]:
        if f.offsets is not None:
            flat = self.values(f.kind, f.values)
            bounds = f.offsets.tolist()
            return [flat[bounds[m]:bounds[m + 1]] for m in range(n)]
        values = self.values(f.kind, f.values)
        if f.nulls is not None:
            for m in np.flatnonzero(f.nulls).tolist():
                values[m] = None
        return values

    def arrow(self, kind: str, column: npt.NDArray[Any],
              nulls: Nulls | None = None) -> pa.Array:
        mask = None if nulls is None else np.asarray(nulls, np.bool_)
        if kind == AttrType.STRING:  # only the strings used, not the whole dictionary
            codes = np.asarray(column, np.int64)
            if mask is not None:
                codes = np.where(mask, -1, codes)  # a NULL's code is whatever was there
            used, inverse = np.unique(codes, return_inverse=True)
            values = array([self.strings[c] if c >= 0 else None for c in used.tolist()],
                           pa.string())
            return values.take(array(inverse.reshape(-1), pa.int64(), mask=mask))
        if kind == AttrType.BOOL:
            column = column != 0
        return array(column, ARROW_TYPES[kind], mask=mask)

    def arrow_field(self, f: Field) -> pa.Array:
        if f.offsets is not None:
            return pa.ListArray.from_arrays(array(f.offsets, pa.int32()),
                                            self.arrow(f.kind, f.values))
        return self.arrow(f.kind, f.values, f.nulls)


@dataclass
class Keys:
    """The `key` of each composite: per-event ids and how to decode distinct ones.
    Decoding is lazy (at `to_dicts`/`to_arrow`), so `ids` must keep their meaning: engines
    that give evicted keys' ids to new keys pass key values (codes) instead, or a `decode`
    holding the keys taken when the batch was made. String codes are append-only."""
    ids: Int64s
    decode: Callable[[Int64s], list[Any]]  # distinct ids -> keys (None, value or list)

    def values(self) -> list[Any]:
        distinct, inverse = np.unique(self.ids, return_inverse=True)
        keys = self.decode(distinct)
        return [keys[i] for i in inverse.reshape(-1).tolist()]

    def arrow(self) -> pa.Array:
        distinct, inverse = np.unique(self.ids, return_inverse=True)
        text = [orjson.dumps(k).decode() for k in self.decode(distinct)]
        return array(text, pa.string()).take(array(inverse.reshape(-1), pa.int64()))


@dataclass
class BoundEvents:
    """SEQ: the events each composite binds, as an element table in binding order.
    Composite m binds elements `start[m] : start[m] + count[m]`; element e is variable
    `var[e]` bound to the event `seq[e]` whose attributes are `attrs[name][e]`. With
    `in_variable_order`, every composite binds each variable once, in the pattern's order.
    """
    start: Int64s
    count: Int64s
    var: Int64s
    seq: Int64s
    attrs: dict[str, tuple[str, npt.NDArray[Any]]]  # name -> (kind, column)
    var_names: list[str]
    var_kleene: list[bool]
    in_variable_order: bool = False

    def take(self, rows: Int64s) -> BoundEvents:
        count = np.asarray(self.count, np.int64)[rows]
        elements = segment_rows(np.asarray(self.start, np.int64)[rows], count)
        return BoundEvents(np.cumsum(count) - count, count, np.asarray(self.var)[elements],
                           np.asarray(self.seq)[elements],
                           {name: (kind, np.asarray(column)[elements])
                            for name, (kind, column) in self.attrs.items()},
                           self.var_names, self.var_kleene, self.in_variable_order)

    def owner(self) -> Int64s:
        """The composite each element belongs to (elements are stored composite after
        composite)."""
        return np.repeat(np.arange(len(self.start)), self.count)

    def element_order(self) -> Int64s:
        """Element indices in the order of `dicts()`' events: within each composite, the
        variables in order of first binding, each with its elements in binding order."""
        if self.in_variable_order and not any(self.var_kleene):
            return np.arange(len(self.seq))
        pair = self.owner() * max(len(self.var_names), 1) + np.asarray(self.var, np.int64)
        _, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
        return np.argsort(first[inverse.reshape(-1)], kind="stable")

    def dicts(self, decoder: Decoder) -> list[dict[str, Any]]:
        # Each distinct event once ({"seq": .., **attributes}), shared by every use.
        unique, first, inverse = np.unique(self.seq, return_index=True, return_inverse=True)
        names = ["seq"] + list(self.attrs)
        columns = [unique.tolist()] + [decoder.values(kind, column[first])
                                       for kind, column in self.attrs.values()]
        base = [dict(zip(names, row)) for row in zip(*columns)]
        elements = [base[k] for k in inverse.reshape(-1).tolist()]
        names_of, kleene = self.var_names, self.var_kleene
        width = len(names_of)
        if self.in_variable_order and not any(kleene):
            return [dict(zip(names_of, elements[s:s + width]))
                    for s in range(0, len(elements), width)]
        var_of = self.var.tolist()
        grouped = []
        for start, n in zip(self.start.tolist(), self.count.tolist()):
            events: dict[str, Any] = {}
            for e in range(start, start + n):
                var = var_of[e]
                if kleene[var]:
                    events.setdefault(names_of[var], []).append(elements[e])
                else:
                    events[names_of[var]] = elements[e]
            grouped.append(events)
        return grouped

    def arrow(self, decoder: Decoder) -> pa.Array:
        names = array(self.var_names, pa.string()).take(array(self.var, pa.int64()))
        fields = [names, array(self.seq, pa.int64())]
        fields += [decoder.arrow(kind, column) for kind, column in self.attrs.values()]
        elements = pa.StructArray.from_arrays(fields, ["variable", "seq", *self.attrs])
        offsets = np.append(self.start, self.start[-1] + self.count[-1]) if len(self.start) \
            else np.zeros(1, np.int64)
        return pa.ListArray.from_arrays(array(offsets, pa.int32()), elements)


class ColumnBatch(CompositeBatch):
    """Composite events of one query as columns (see the module docstring). `extra`
    holds fields that come right after start_seq/events as constant values (e.g.
    SEQ's "timed_out")."""

    def __init__(self, query: str, decoder: Decoder, keys: Keys, seq: Int64s,
                 start_seq: Int64s, fields: list[Field],
                 events: BoundEvents | None = None, extra: dict[str, Any] | None = None):
        self.query, self.decoder, self.keys = query, decoder, keys
        self.seq, self.start_seq, self.fields = seq, start_seq, fields
        self.events, self.extra = events, extra or {}

    def __len__(self) -> int:
        return len(self.seq)

    def take(self, rows: Int64s) -> ColumnBatch:
        rows = np.asarray(rows, np.int64)
        keys = Keys(np.asarray(self.keys.ids)[rows], self.keys.decode)
        return ColumnBatch(self.query, self.decoder, keys, np.asarray(self.seq)[rows],
                           np.asarray(self.start_seq)[rows],
                           [f.take(rows) for f in self.fields],
                           None if self.events is None else self.events.take(rows), self.extra)

    def to_dicts(self) -> list[dict[str, Any]]:
        n = len(self.seq)
        if n == 0:
            return []
        names = ["query", "key", "seq", "start_seq"]
        columns: list[Iterable[Any]] = [itertools.repeat(self.query), self.keys.values(),
                                        self.seq.tolist(), self.start_seq.tolist()]
        if self.events is not None:
            names.append("events")
            columns.append(self.events.dicts(self.decoder))
        for name, value in self.extra.items():
            names.append(name)
            columns.append(itertools.repeat(value))
        for f in self.fields:
            names.append(f.name)
            columns.append(self.decoder.field(f, n))
        return rows_of(names, columns)

    def to_arrow(self) -> pa.RecordBatch:
        n = len(self.seq)
        names = ["query", "key", "seq", "start_seq"]
        arrays = [array([self.query] * n, pa.string()), self.keys.arrow(),
                  array(self.seq, pa.int64()), array(self.start_seq, pa.int64())]
        if self.events is not None:
            names.append("events")
            arrays.append(self.events.arrow(self.decoder))
        for name, value in self.extra.items():
            names.append(name)
            arrays.append(pa.array([value] * n))
        for f in self.fields:
            names.append(f.name)
            arrays.append(self.decoder.arrow_field(f))
        return pa.RecordBatch.from_arrays(arrays, names=names)


class RowBatch(CompositeBatch):
    """Composite events of one query that an engine built as dicts already (WINDOW)."""

    def __init__(self, rows: list[dict[str, Any]]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def to_dicts(self) -> list[dict[str, Any]]:
        return self.rows

    def take(self, rows: Int64s) -> RowBatch:
        return RowBatch([self.rows[i] for i in np.asarray(rows).tolist()])

    def to_arrow(self) -> pa.RecordBatch:
        names = list(dict.fromkeys(name for row in self.rows for name in row))
        arrays = []
        for name in names:
            values = [row.get(name) for row in self.rows]
            if name == "key":
                values = [orjson.dumps(v).decode() for v in values]
            arrays.append(pa.array(values))
        return pa.RecordBatch.from_arrays(arrays, names=names)


def rows_of(names: list[str], columns: list[Iterable[Any]]) -> list[dict[str, Any]]:
    """Dicts with the given field names from parallel columns. The cyclic collector is
    paused meanwhile: dicts of plain values make no cycles, and many new dicts in a row
    would trigger it again and again."""
    build = _BUILDERS.get(tuple(names))
    if build is None:
        build = _BUILDERS[tuple(names)] = row_builder(names)
    paused = gc.isenabled()
    gc.disable()
    try:
        return build(zip(*columns))
    finally:
        if paused:
            gc.enable()


_BUILDERS: dict[tuple[str, ...], RowsBuilder] = {}


def row_builder(names: list[str]) -> RowsBuilder:
    """`rows -> [dict, ...]` with the given field names, as a dict display with constant
    keys (CPython builds those in one step: about twice as fast as dict(zip(names, row)),
    an eighth faster than keys read from variables). The source holds only made-up names
    (`'K0'`, `'K1'`, ...); the compiled code's constants are then swapped for the field
    names, so no name is ever written into code."""
    width = len(names)
    values = ", ".join(f"v{i}" for i in range(width))
    display = ", ".join(f"'K{i}': v{i}" for i in range(width))
    placeholders = {f"K{i}": name for i, name in enumerate(names)}

    def swapped(code: CodeType) -> CodeType:
        consts: list[object] = []
        for c in code.co_consts:
            if isinstance(c, str):
                c = placeholders.get(c, c)
            elif isinstance(c, tuple):
                c = tuple(placeholders.get(x, x) if isinstance(x, str) else x for x in c)
            elif hasattr(c, "co_consts"):
                c = swapped(c)
            consts.append(c)
        return code.replace(co_consts=tuple(consts))

    code = compile(f"lambda rows: [{{{display}}} for {values} in rows]", "<rows>", "eval")
    build: RowsBuilder = eval(swapped(code), {})  # noqa: S307
    return build
