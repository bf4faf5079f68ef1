"""Columnar batches: what the jitted engines consume.

A `Batch` holds one numpy column per attribute of a stream (ints and timestamps as int64,
floats as float64, bools as bool, strings dictionary-encoded to int64 codes) plus `seq` and
`ts` (int64). Strings are encoded with a `StringDictionary` shared by everything that works
on the stream, so that string constants in queries and partition keys can be compared as
integers.
"""

from __future__ import annotations

# Deferred imports: pyarrow, for `from_arrow` only: the FPGA and GPU commands and the splitter's
# encoders build batches without Arrow.

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from cep_core.events import Event
from cep_core.schema import AttrType, StreamSchema

if TYPE_CHECKING:
    import pyarrow as pa

# A decoded column value, as the reference interpreter sees it.
Value = str | float | int | bool

NUMPY_TYPES = {"int": np.int64, "timestamp": np.int64, "float": np.float64, "bool": np.bool_,
               "string": np.int64}


class StringDictionary:
    """Mapping between strings and dense int64 codes (0, 1, 2, ...).

    Codes are only appended, except by `compact`, which drops the strings nothing holds any
    more and renumbers the rest; `generation` counts compactions, so that tables derived
    from the codes know when to rebuild."""

    def __init__(self, strings: list[str] | None = None):
        self.strings: list[str] = []
        self.codes: dict[str, int] = {}
        self.generation = 0
        for s in strings or []:
            self.code(s)

    def code(self, s: str) -> int:
        code = self.codes.get(s)
        if code is None:
            code = self.codes[s] = len(self.strings)
            self.strings.append(s)
        return code

    def encode(self, values: Sequence[str]) -> npt.NDArray[np.int64]:
        return np.fromiter((self.code(v) for v in values), dtype=np.int64, count=len(values))

    def decode(self, code: int) -> str:
        return self.strings[code]

    def compact(self, keep: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Keep only the strings of codes `keep`, renumbered 0, 1, ... in their old order
        (so the renumbering preserves the order of codes). Returns old code -> new code
        (-1 for a dropped string), for everything holding codes to remap itself with."""
        kept = np.unique(np.asarray(keep, dtype=np.int64))
        if len(kept) and (kept[0] < 0 or kept[-1] >= len(self.strings)):
            raise ValueError(f"codes to keep outside 0..{len(self.strings) - 1}")
        new_code = np.full(len(self.strings), -1, dtype=np.int64)
        new_code[kept] = np.arange(len(kept), dtype=np.int64)
        self.strings = [self.strings[c] for c in kept.tolist()]
        self.codes = {s: i for i, s in enumerate(self.strings)}
        self.generation += 1
        return new_code

    def __len__(self) -> int:
        return len(self.strings)


def decode_value(kind: str, value: Any, strings: StringDictionary) -> Value:
    """A column or kernel value of attribute type `kind` as the Python value the reference
    interpreter gives."""
    if kind == AttrType.STRING:
        return strings.decode(int(value))
    if kind == AttrType.FLOAT:
        return float(value)
    if kind == AttrType.BOOL:
        return bool(value)
    if kind in (AttrType.INT, AttrType.TIMESTAMP):
        return int(value)
    raise TypeError(f"cannot decode a {kind}")


@dataclass
class Batch:
    seq: npt.NDArray[np.int64]
    ts: npt.NDArray[np.int64]
    columns: dict[str, npt.NDArray[Any]]

    def __len__(self) -> int:
        return len(self.seq)

    def slice(self, start: int, stop: int) -> Batch:
        return Batch(self.seq[start:stop], self.ts[start:stop],
                     {k: v[start:stop] for k, v in self.columns.items()})


class BatchEncoder:
    """Turns events of one stream into Batches, encoding strings with one dictionary."""

    def __init__(self, schema: StreamSchema, strings: StringDictionary | None = None):
        self.schema = schema
        self.strings = strings if strings is not None else StringDictionary()

    def from_events(self, events: list[Event]) -> Batch:
        n = len(events)
        columns: dict[str, npt.NDArray[Any]] = {}
        for name, kind in self.schema.attributes.items():
            values = [e.attrs[name] for e in events]
            if kind == AttrType.STRING:
                columns[name] = self.strings.encode(values)
            else:
                columns[name] = np.array(values, dtype=NUMPY_TYPES[kind]).reshape(n)
        return Batch(np.fromiter((e.seq for e in events), np.int64, n),
                     np.fromiter((e.ts for e in events), np.int64, n), columns)

    def from_arrow(self, table: pa.Table) -> Batch:
        """A pyarrow Table with the schema's attributes (and optionally `seq`) as a Batch,
        column by column: strings are dictionary-encoded once per distinct value."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from cep_core.arrow_numpy import to_numpy

        n = table.num_rows
        columns: dict[str, npt.NDArray[Any]] = {}
        for name, kind in self.schema.attributes.items():
            column = table.column(name).combine_chunks()
            if kind == AttrType.STRING:
                encoded = column if pa.types.is_dictionary(column.type) \
                    else pc.dictionary_encode(column)
                mapping = self.strings.encode(encoded.dictionary.to_pylist())
                columns[name] = mapping[to_numpy(encoded.indices)]
            else:
                if pa.types.is_timestamp(column.type):
                    column = column.cast(pa.int64())
                columns[name] = to_numpy(column).astype(NUMPY_TYPES[kind], copy=False)
        seq = to_numpy(table.column("seq")).astype(np.int64) if "seq" in table.column_names \
            else np.arange(n, dtype=np.int64)
        return Batch(seq, columns[self.schema.time].astype(np.int64, copy=False), columns)

    def decode_value(self, name: str, value: Any) -> Value:
        """A column value back as the Python value the reference interpreter would see."""
        return decode_value(self.schema.attributes[name], value, self.strings)
