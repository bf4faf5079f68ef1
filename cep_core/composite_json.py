"""JSON lines of composite events built from their columns, byte for byte what
`orjson.dumps(composite_dict)` gives, without a dict per composite.

Values become JSON text a column at a time: ints by Arrow's cast, floats by one orjson call
over the numpy column (cut at its commas), strings and keys once per distinct value; the
pieces are joined with `pyarrow.compute.binary_join_element_wise`, and Kleene lists and
SEQ's `events` objects with `binary_join` over list arrays. A batch's lines are one Arrow
string array whose data buffer is the file's bytes. Arrays and scalars are made from
buffers (`_texts`, `from_numpy`), never by `pa.array`/`pa.scalar`, which import pandas
where it is installed (0.2-0.3 s of a `cep run`).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cep_core.arrow_numpy import from_numpy
from cep_core.composite_batch import BoundEvents, ColumnBatch, CompositeBatch, Decoder, Field
from cep_core.schema import AttrType

TEXT = pa.large_string()


class _BinaryOut(Protocol):
    def write(self, data: memoryview, /) -> object: ...


def lines(batch: CompositeBatch) -> pa.Array:
    """One JSON line (ending in a newline) per composite of the batch, as large_string."""
    if not isinstance(batch, ColumnBatch):
        return _from_bytes([orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)
                            for row in batch.to_dicts()])
    n = len(batch)
    parts: list[pa.Array | pa.Scalar] = [
        _const("{" + _name("query") + _json(batch.query) + "," + _name("key")),
        _keys(batch), _const("," + _name("seq")), _ints(batch.seq),
        _const("," + _name("start_seq")), _ints(batch.start_seq)]
    if batch.events is not None:
        parts += [_const("," + _name("events")), _events(batch.events, batch.decoder)]
    for name, value in batch.extra.items():
        parts.append(_const("," + _name(name) + _json(value)))
    for f in batch.fields:
        parts += [_const("," + _name(f.name)), _field(batch.decoder, f, n)]
    parts.append(_const("}\n"))
    return _join(parts, n)


def lines_of(texts: list[str]) -> pa.Array:
    """Texts as the large_string array `lines` gives."""
    return _texts(texts)


def write(arrays: list[pa.Array], out: _BinaryOut) -> None:
    """Writes the texts of large_string arrays (no nulls) to a binary stream, in bulk."""
    for array in arrays:
        if len(array) == 0:
            continue
        offsets = np.frombuffer(array.buffers()[1], np.int64, len(array) + 1, array.offset * 8)
        out.write(memoryview(array.buffers()[2])[offsets[0]:offsets[-1]])


# ------------------------------------------------------------------ pieces


def _json(value: object) -> str:
    return orjson.dumps(value).decode()


def _name(name: str) -> str:
    return _json(name) + ":"


def _const(text: str) -> pa.Scalar:
    return _texts([text])[0]


def _texts(texts: list[str]) -> pa.Array:
    return _from_bytes([t.encode() for t in texts])


def _from_bytes(texts: list[bytes]) -> pa.Array:
    """UTF-8 texts as a large_string array."""
    offsets = np.zeros(len(texts) + 1, np.int64)
    np.cumsum([len(t) for t in texts], out=offsets[1:])
    return pa.LargeStringArray.from_buffers(len(texts), pa.py_buffer(offsets),
                                            pa.py_buffer(b"".join(texts)))


def _indices(values: npt.NDArray[Any]) -> pa.Array:
    return from_numpy(np.asarray(values, np.int64).reshape(-1))


def _join(parts: list[pa.Array | pa.Scalar], n: int) -> pa.Array:
    if n == 0:
        return _texts([])
    if all(isinstance(p, pa.Scalar) for p in parts):
        return _texts(["".join(p.as_py() for p in parts)] * n)
    return pc.binary_join_element_wise(*parts, _const(""))


def _ints(column: npt.NDArray[Any]) -> pa.Array:
    return pc.cast(from_numpy(np.asarray(column, np.int64)), TEXT)


def _floats(column: npt.NDArray[Any]) -> pa.Array:
    """orjson's text of each float (its shortest round-trip form; NaN and infinities as
    null), cut out of one orjson call over the whole column."""
    column = np.ascontiguousarray(column, np.float64)
    if len(column) == 0:
        return _texts([])
    text = orjson.dumps(column, option=orjson.OPT_SERIALIZE_NUMPY)  # b"[1.5,2e-7,...]"
    body = np.frombuffer(text, np.uint8)[1:-1]
    comma = body == ord(",")
    ends = np.append(np.flatnonzero(comma), len(body))
    lengths = np.diff(ends, prepend=-1) - 1
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return pa.LargeStringArray.from_buffers(len(column), pa.py_buffer(offsets),
                                            pa.py_buffer(body[~comma].tobytes()))


def _strings(decoder: Decoder, codes: npt.NDArray[Any]) -> pa.Array:
    """Dictionary codes -> JSON string literals, each distinct string encoded once."""
    used, inverse = np.unique(np.asarray(codes, np.int64), return_inverse=True)
    texts = _texts([_json(decoder.strings[c]) for c in used.tolist()])
    return texts.take(_indices(inverse))


def _values(decoder: Decoder, kind: str, column: npt.NDArray[Any]) -> pa.Array:
    if kind == AttrType.STRING:
        return _strings(decoder, column)
    if kind == AttrType.FLOAT:
        return _floats(column)
    if kind == AttrType.BOOL:
        return pc.if_else(from_numpy(np.asarray(column) != 0), _const("true"), _const("false"))
    return _ints(column)


def _field(decoder: Decoder, f: Field, n: int) -> pa.Array:
    if f.offsets is not None:  # Collect: a list per composite
        values = _values(decoder, f.kind, f.values)
        listed = pa.LargeListArray.from_arrays(_indices(f.offsets), values)
        return _bracketed(listed, "[", "]")
    if f.nulls is None or not np.any(f.nulls):
        return _values(decoder, f.kind, f.values)
    nulls = np.asarray(f.nulls, np.bool_)
    values = f.values
    if f.kind == AttrType.STRING:  # a NULL's code is whatever the kernel left there
        if not decoder.strings:  # no string at all: every value is NULL
            return _texts(["null"] * n)
        values = np.where(nulls, 0, values)
    return pc.if_else(from_numpy(nulls), _const("null"), _values(decoder, f.kind, values))


def _bracketed(listed: pa.Array, opening: str, closing: str) -> pa.Array:
    return pc.binary_join_element_wise(_const(opening), pc.binary_join(listed, _const(",")),
                                       _const(closing), _const(""))


def _keys(batch: ColumnBatch) -> pa.Array:
    distinct, inverse = np.unique(batch.keys.ids, return_inverse=True)
    texts = _texts([_json(k) for k in batch.keys.decode(distinct)])
    return texts.take(_indices(inverse))


def _events(events: BoundEvents, decoder: Decoder) -> pa.Array:
    """`{"var":{"seq":..,attrs..},"kleene":[{..},{..}],...}` per composite."""
    n_el = len(events.seq)
    order = events.element_order()
    var = np.asarray(events.var, np.int64)[order]
    # Each distinct event's text once (as dicts() shares one dict per event), then taken.
    seqs, first, inverse = np.unique(np.asarray(events.seq)[order], return_index=True,
                                     return_inverse=True)
    rows = order[first]
    parts: list[pa.Array | pa.Scalar] = [_const("{" + _name("seq")), _ints(seqs)]
    for name, (kind, column) in events.attrs.items():
        parts += [_const("," + _name(name)), _values(decoder, kind, np.asarray(column)[rows])]
    parts.append(_const("}"))
    elements = _join(parts, len(seqs)).take(_indices(inverse))
    owner = events.owner()
    kleene = np.asarray(events.var_kleene + [False], np.bool_)[var]
    group = owner * max(len(events.var_names), 1) + var
    starts = np.ones(n_el, np.bool_)
    starts[1:] = group[1:] != group[:-1]
    ends = np.ones(n_el, np.bool_)
    ends[:-1] = starts[1:]
    # An element opens its variable's group ("v": or "v":[) and may close a Kleene list.
    openings = _texts([""] + [_name(v) + bracket for v in events.var_names
                              for bracket in ("", "[")])
    opening = np.where(starts, 1 + 2 * var + kleene, 0)
    closing = np.where(ends & kleene, 1, 0)
    texts = pc.binary_join_element_wise(openings.take(_indices(opening)), elements,
                                        _texts(["", "]"]).take(_indices(closing)),
                                        _const(""))
    offsets = np.concatenate([[0], np.cumsum(events.count)]).astype(np.int64)
    return _bracketed(pa.LargeListArray.from_arrays(_indices(offsets), texts), "{", "}")
