"""The backfill's Parquet outputs, their readers, and the comparison of outputs.

Composite events vary in shape by query, so the layout is lossless rather than typed:

| column | type | |
| --- | --- | --- |
| query | string | the query's name |
| query_index | int | its place in the query file (part of the output order) |
| key | string | the partition / group key as JSON (`null` when none) |
| seq, start_seq | long | as in the composite event |
| composite | string | the whole composite event as JSON (orjson: field order kept, floats exact) |

Dead letters: `stage` (0 input, 1 engine), `query_index` (engine stage), `source`, `line`
(JSON lines and CSV inputs: the record's line in its file, 1-based; null otherwise),
`position`, `reason`, `raw`: the fields of `cep_core.event_io.DeadLetter.to_json`.
The readers give back exactly the dicts `cep run` writes, in its order.
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from cep_core.composite import sort_key

DEAD_LETTER_FIELDS = ("source", "line", "position", "reason", "raw")


def read_composites(path: str) -> list[dict]:
    """The composite events of a backfill output, in `cep_core.composite.sort_key` order."""
    table = _read(path, ["query_index", "composite"])
    pairs = [(orjson.loads(text), index) for index, text in
             zip(table.column("query_index").to_pylist(), table.column("composite").to_pylist())]
    pairs.sort(key=lambda pair: sort_key(pair[0], pair[1]))
    return [composite for composite, _ in pairs]


def read_dead_letters(path: str) -> list[dict]:
    """Dead letters as `DeadLetter.to_json` dicts, in `cep run`'s order: bad input records
    by position, then events the engines rejected, query by query, by seq."""
    names = pq.ParquetDataset(path).schema.names  # outputs written before `line` lack it
    table = _read(path, ["stage", "query_index",
                         *(f for f in DEAD_LETTER_FIELDS if f in names)])
    rows = table.to_pylist()
    rows.sort(key=lambda r: (r["stage"], r["query_index"] or 0, r["position"]))
    return [{name: r[name] for name in DEAD_LETTER_FIELDS
             if name in r and (name != "line" or r[name] is not None)} for r in rows]


def _read(path: str, columns: list[str]) -> pa.Table:
    return pq.read_table(path, columns=columns)


def first_difference(outputs: dict[str, list[dict]]) -> str | None:
    """None when every named output holds the same list of dicts; else where the first
    one that differs from the first output parts from it. Any number of outputs (the
    reference interpreter, the jit engine, the backfill, the streaming service, ...)."""
    names = list(outputs)
    if not names:
        return None
    base_name, base = names[0], outputs[names[0]]
    for name in names[1:]:
        other = outputs[name]
        for i, (a, b) in enumerate(zip(base, other)):
            if a != b:
                return f"{name} differs from {base_name} at #{i}: {b!r} != {a!r}"
        if len(base) != len(other):
            return (f"{name} has {len(other)} items, {base_name} {len(base)}; first extra: "
                    f"{(other if len(other) > len(base) else base)[min(len(base), len(other))]!r}")
    return None
