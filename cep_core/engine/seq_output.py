"""SEQ output arrays -> composite events as columns; every SEQ engine (CDP, AIP, GPU) shares
this.

A SEQ kernel reports `n_out` matches and `n_el` bound elements:
- `om[m]` = (partition id, first element, element count) of match m;
- `oe_i[e]` = (variable, seq, int attributes...) and `oe_f[e]` = float attributes of element
  e (the layout's slots say where each attribute is);
- `ovi`/`ovf`/`ovn[m, j]` = EMIT item j of match m (int or float) and whether it is NULL.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from cep_core import ast
from cep_core.batch import StringDictionary
from cep_core.composite_batch import BoundEvents, ColumnBatch, Decoder, Field, Keys
from cep_core.engine.keys import Key, KeyIndex
from cep_core.kernels.seq_layout import Row
from cep_core.schema import AttrType, StreamSchema

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
_S = TypeVar("_S", bound=np.generic)


class SeqEngineView(Protocol):
    """What `SeqOutput` reads of its engine (`SeqEngineBase`, the GPU's SEQ engine)."""

    # The compiler's SeqPlan and Layout (cep_core.engine does not import cep_core.compiler).
    plan: Any
    layout: Any

    @property
    def schema(self) -> StreamSchema: ...

    @property
    def query(self) -> ast.Query: ...

    @property
    def strings(self) -> StringDictionary: ...

    @property
    def keys(self) -> KeyIndex: ...

    def decode_key(self, attrs: list[str], key: Key) -> object: ...


def _copy(column: npt.NDArray[_S]) -> npt.NDArray[_S]:
    """A contiguous copy (a one-column slice would otherwise stay a view of the kernel's
    output, which composite batches must not share)."""
    return np.array(column, copy=True, order="C")


class SeqOutput:
    """Decoding plan of one SEQ engine: `engine` has `plan`, `layout`, `schema`, `query`,
    `strings`, `keys` (a KeyIndex) and `decode_key`."""

    def __init__(self, engine: SeqEngineView):
        self.engine = engine
        self.attr_plan: list[tuple[str, Row, int, str]] = []
        for name, kind in engine.schema.attributes.items():
            where, col = engine.layout.slots[name]
            self.attr_plan.append((name, where, col + 1 if where == Row.INT else col, kind))
        self.var_names = [v.name for v in engine.plan.positive]
        self.var_kleene = [v.name in engine.plan.kleene_vars for v in engine.plan.positive]
        types = engine.plan.checked.types
        self.emit_plan = [(item.name, types[item.expr]) for item in engine.plan.body.emit]
        self.decoded_keys: dict[int, object] = {}

    def forget_keys(self, ids: I64 | None = None) -> None:
        """Drop decoded keys: all, or those of released partition ids."""
        if ids is None:
            self.decoded_keys = {}
        else:
            for p in ids.tolist():
                self.decoded_keys.pop(p, None)

    def _keys(self, ids: I64) -> list[object]:
        engine = self.engine
        if not engine.keys.attrs:
            return [None] * len(ids)
        cache = self.decoded_keys
        out: list[object] = []
        for p in ids.tolist():
            if p not in cache:
                cache[p] = engine.decode_key(engine.keys.attrs, engine.keys.values[p])
            out.append(cache[p])
        return out

    def _key_column(self, ids: I64) -> Keys:
        """The composites' keys, taken now: released partition ids go to other keys."""
        distinct = np.unique(ids)
        keys = dict(zip(distinct.tolist(), self._keys(distinct)))
        return Keys(ids, lambda d: [keys[p] for p in d.tolist()])

    def columns(self, n_out: int, n_el: int, om: I64, oe_i: I64, oe_f: F64, ovi: I64, ovf: F64,
                ovn: I64, timed_out: bool = False) -> ColumnBatch:
        """The matches as columns (copies: kernels reuse their output arrays). Timed-out
        partial matches (`timed_out`) carry the variables bound so far, no EMIT fields,
        and "timed_out": true."""
        om, oe_i, oe_f = om[:n_out], oe_i[:n_el], oe_f[:n_el]
        seqs = _copy(oe_i[:, 1])
        starts = _copy(om[:, 1])
        if n_out:
            high = np.maximum.reduceat(seqs, starts)
            low = np.minimum.reduceat(seqs, starts)
        else:
            high = low = np.zeros(0, np.int64)
        attrs = {name: (kind, _copy(oe_f[:, col] if where == Row.FLOAT
                                                    else oe_i[:, col]))
                 for name, where, col, kind in self.attr_plan}
        events = BoundEvents(starts, _copy(om[:, 2]),
                             _copy(oe_i[:, 0]), seqs, attrs, self.var_names,
                             self.var_kleene, in_variable_order=not timed_out)
        fields: list[Field] = []
        if not timed_out:
            for j, (name, kind) in enumerate(self.emit_plan):
                source = ovf[:n_out, j] if kind == AttrType.FLOAT else ovi[:n_out, j]
                fields.append(Field(name, kind, _copy(source),
                                    _copy(ovn[:n_out, j])))
        strings = self.engine.strings.strings
        return ColumnBatch(self.engine.query.name, Decoder(strings),
                           self._key_column(_copy(om[:, 0])), high, low,
                           fields, events, {"timed_out": True} if timed_out else None)
