"""The composite events of a finite run (`cep run`), as columns: the engines'
CompositeBatches and their deterministic order (`cep_core.composite_order`).

`Composites` is a read-only sequence of the composite dicts (built only when asked for:
indexing, iterating, `to_dicts()`, `==`), and writes them without building them:
`write(out)` picks JSON lines, Parquet or an Arrow IPC file by the suffix of `out`;
`to_arrow()` is every composite in one Arrow table (columns in docs/semantics.md, "Composite
events as Arrow, Parquet"). `read_table` gives back the exact dicts from such a table.

pyarrow is imported only where it is used: `cep run` with the reference engine and JSON lines
out (`Composites.from_dicts`) does without it.
"""

from __future__ import annotations

# Deferred imports: pyarrow and the Arrow-built columns (composite_batch, composite_order,
# composite_json) load when composites are first ordered or written, so `cep run --engine reference`
# and the Python API's import stay without pyarrow.

import sys
from collections.abc import Iterator, Sequence
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, overload

import numpy as np
import numpy.typing as npt
import orjson

from cep_core.event_io import write_jsonl

if TYPE_CHECKING:
    import pyarrow as pa

    from cep_core.composite_batch import CompositeBatch

# Columns every composite may have, in the order they come in a composite's JSON object.
STANDARD = ("query", "key", "seq", "start_seq", "events", "window_start", "window_end",
            "timed_out")
METADATA = b"cep.queries"  # per query: its columns in JSON order and its Kleene variables
CHUNK_ROWS = 65536  # composites turned into JSON text or Arrow columns at a time

# Where composites are written: a path, a binary stream, or None / "-" for stdout.
Out = str | Path | IO[bytes] | None


class OutputFormat(StrEnum):
    """What `Composites.write` writes; the value is how `cep run` names it."""

    JSON_LINES = "JSON lines"
    PARQUET = "Parquet"
    ARROW_IPC = "Arrow IPC"


def output_format(out: Out) -> OutputFormat:
    """What `Composites.write` writes to `out`: by its suffix, .parquet PARQUET, .arrow
    ARROW_IPC, anything else (None or "-": stdout) JSON_LINES."""
    suffix = Path(str(out)).suffix.lower() if out is not None else ""
    return {".parquet": OutputFormat.PARQUET,
            ".arrow": OutputFormat.ARROW_IPC}.get(suffix, OutputFormat.JSON_LINES)


class Composites(Sequence[dict[str, Any]]):
    def __init__(self, batches: list[CompositeBatch], query_index: dict[str, int],
                 ordered: bool = False) -> None:
        """`batches` in the order the engines gave them; `ordered`: they are already in
        output order (e.g. the reference interpreter's list)."""
        self.batches = [b for b in batches if len(b)]
        self.query_index = query_index
        self._dicts: list[dict[str, Any]] | None = None
        self._order: npt.NDArray[np.int64] | None = \
            np.arange(len(self), dtype=np.int64) if ordered else None

    @classmethod
    def from_dicts(cls, rows: list[dict[str, Any]]) -> Composites:
        """Composite dicts already in output order (no batches, no pyarrow)."""
        composites = cls([], {}, ordered=True)
        composites._dicts = rows
        composites._order = np.arange(len(rows), dtype=np.int64)
        return composites

    def _batches(self) -> list[CompositeBatch]:
        if self._dicts is not None and not self.batches:
            from cep_core.composite_batch import RowBatch

            return [RowBatch(self._dicts)] if self._dicts else []
        return self.batches

    def __len__(self) -> int:
        if self._dicts is not None:
            return len(self._dicts)
        return sum(len(b) for b in self.batches)

    def order(self) -> npt.NDArray[np.int64]:
        """Output position -> index into the batches' composites, concatenated."""
        if self._order is None:
            from cep_core.composite_order import order as output_order

            self._order = output_order(self.batches, self.query_index)
        return self._order

    def to_dicts(self) -> list[dict[str, Any]]:
        if self._dicts is None:
            found = [c for b in self.batches for c in b.to_dicts()]
            self._dicts = [found[i] for i in self.order().tolist()]
        return self._dicts

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        return self.to_dicts()[i]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.to_dicts())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Composites):
            other = other.to_dicts()
        return isinstance(other, list) and self.to_dicts() == other

    def __repr__(self) -> str:
        return f"Composites({len(self)} composite events in {len(self.batches)} batches)"

    # ------------------------------------------------------------ JSON lines

    def json_lines(self) -> pa.Array:
        """Every composite's JSON line (with its newline), in output order."""
        import pyarrow as pa

        from cep_core import composite_json

        chunks = list(self.json_chunks(max(len(self), 1)))
        return pa.concat_arrays(chunks) if chunks else composite_json.lines_of([])

    def json_chunks(self, rows: int = CHUNK_ROWS) -> Iterator[pa.Array]:
        """The JSON lines (large_string arrays) in output order, `rows` composites at a
        time: each chunk's composites taken from their batches and turned into text, so
        memory holds one chunk's text and its intermediates, not the whole output's
        (870,000 SEQ composites are 384 MB of text; building it at once cost more in
        fresh memory pages than in work)."""
        import pyarrow as pa

        from cep_core import composite_json
        from cep_core.arrow_numpy import from_numpy

        for parts, back in self._chunks(rows):
            texts = pa.concat_arrays([composite_json.lines(part) for part in parts])
            yield texts if back is None else texts.take(from_numpy(back))

    def _chunks(self, rows: int) -> Iterator[
            tuple[list[CompositeBatch], npt.NDArray[np.intp] | None]]:
        """Per chunk of `rows` output positions: the chunk's composites as one batch per
        batch they come from, and the permutation that puts those batches' rows, one
        after another, in output order (None where they are in it already)."""
        batches = self._batches()
        if not batches:
            return
        order = self.order()
        starts = np.cumsum([0] + [len(b) for b in batches])
        for i in range(0, len(order), rows):
            positions = order[i:i + rows]
            which = np.searchsorted(starts, positions, side="right") - 1
            by_batch = np.argsort(which, kind="stable")
            parts: list[CompositeBatch] = []
            for at in np.split(by_batch, np.flatnonzero(np.diff(which[by_batch])) + 1):
                b = int(which[at[0]])
                parts.append(batches[b].take(positions[at] - starts[b]))
            yield parts, None if _is_identity(by_batch) else np.argsort(by_batch)

    def write_jsonl(self, out: Out = None, chunk_rows: int = CHUNK_ROWS) -> int:
        """JSON lines to `out` (a path, a binary stream, or None / "-" for stdout),
        byte for byte what orjson gives for each composite dict, `chunk_rows` composites
        at a time (`json_chunks`). Returns the count."""
        if self._dicts is not None and not self.batches:  # dicts already: orjson each

            return write_jsonl(self._dicts, out)
        from cep_core import composite_json

        def write_to(stream: IO[bytes]) -> int:
            written = 0
            for texts in self.json_chunks(chunk_rows):
                composite_json.write([texts], stream)
                written += len(texts)
            stream.flush()
            return written

        if out is None or str(out) == "-":
            return write_to(sys.stdout.buffer)
        if isinstance(out, (str, Path)):
            with open(out, "wb") as f:
                return write_to(f)
        return write_to(out)

    # ------------------------------------------------------------ Arrow, Parquet

    def to_arrow(self) -> pa.Table:
        """One table, rows in output order: the STANDARD columns that occur, then every
        query's EMIT/SELECT fields (null in other queries' rows)."""
        import pyarrow as pa

        from cep_core.arrow_numpy import from_numpy

        meta = orjson.dumps(self._query_meta())
        batches = self._batches()
        if batches:
            return _arrow_of(batches, meta).take(from_numpy(self.order()))
        return pa.table({"query": pa.array([], pa.string()),
                         "key": pa.array([], pa.string()),
                         "seq": pa.array([], pa.int64()),
                         "start_seq": pa.array([], pa.int64())}
                        ).replace_schema_metadata({METADATA: meta})

    def _query_meta(self) -> dict[str, dict[str, list[str]]]:
        meta: dict[str, dict[str, list[str]]] = {}
        for b in self._batches():
            for query, names, kleene in _shapes(b):
                entry = meta.setdefault(query, {"columns": [], "kleene": []})
                entry["columns"] = list(dict.fromkeys(entry["columns"] + names))
                entry["kleene"] = sorted(set(entry["kleene"]) | set(kleene))
        return meta

    def write(self, out: Out = None, chunk_rows: int = CHUNK_ROWS) -> int:
        """By `out`'s suffix (`output_format`): .parquet (Parquet), .arrow (Arrow IPC
        file), anything else (or None / "-": stdout) JSON lines, `chunk_rows` composites at
        a time. Returns the number of composites."""
        fmt = output_format(out)
        if fmt is OutputFormat.JSON_LINES:
            return self.write_jsonl(out, chunk_rows)
        import pyarrow as pa

        tables = self.arrow_chunks(chunk_rows)
        schema = next(tables)
        if fmt is OutputFormat.ARROW_IPC:
            with pa.ipc.new_file(str(out), schema) as writer:
                for table in tables:
                    writer.write_table(table)
            return len(self)
        import pyarrow.parquet as pq

        # Dictionaries only for strings (query names, keys and string attributes repeat);
        # seqs are unique, so a dictionary of a number column is work that never pays.
        strings = [field.name for field in schema
                   if pa.types.is_string(field.type) or pa.types.is_large_string(field.type)]
        with pq.ParquetWriter(out, schema, use_dictionary=strings) as writer:
            for table in tables:
                writer.write_table(table)
        return len(self)

    def arrow_chunks(self, rows: int = CHUNK_ROWS) -> Iterator[pa.Schema | pa.Table]:
        """`to_arrow()`'s schema first, then its rows as tables of that schema, `rows`
        composites at a time. Composites that came as dicts (the reference interpreter's,
        WINDOW's) are one table: their columns' types come from their values."""
        import pyarrow as pa

        from cep_core.arrow_numpy import from_numpy
        from cep_core.composite_batch import ColumnBatch

        batches = self._batches()
        if not batches or not all(isinstance(b, ColumnBatch) for b in batches):
            table = self.to_arrow()
            yield table.schema
            yield table
            return
        # The schema to_arrow's concatenation gives, from one composite of each batch.
        meta = orjson.dumps(self._query_meta())
        schema = _arrow_of([b.take(np.zeros(1, np.int64)) for b in batches], meta).schema
        yield schema
        for parts, back in self._chunks(rows):
            table = _arrow_of(parts, meta)
            columns = [table.column(f.name).cast(f.type) if f.name in table.column_names
                       else pa.nulls(table.num_rows, f.type) for f in schema]
            table = pa.Table.from_arrays(columns, schema=schema)
            yield table if back is None else table.take(from_numpy(back))


def _arrow_of(batches: list[CompositeBatch], meta: bytes) -> pa.Table:
    """The batches' composites as to_arrow's columns, in batch order, with `meta` (the
    queries' shapes) as the schema's metadata."""
    import pyarrow as pa

    table = pa.concat_tables([pa.Table.from_batches([_arrow(b)]) for b in batches],
                             promote_options="permissive")
    names = [n for n in STANDARD if n in table.column_names]
    names += [n for n in table.column_names if n not in STANDARD]
    return table.select(names).replace_schema_metadata({METADATA: meta})


def _is_identity(order: npt.NDArray[np.intp]) -> bool:
    return bool(np.array_equal(order, np.arange(len(order))))


def _arrow(batch: CompositeBatch) -> pa.RecordBatch:
    from cep_core.composite_batch import ColumnBatch

    if isinstance(batch, ColumnBatch):
        return batch.to_arrow()
    return _rows_arrow(batch.to_dicts())


def _rows_arrow(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """Dicts -> the columns ColumnBatch.to_arrow gives (key as JSON, events as a list of
    {variable, seq, attributes...})."""
    import pyarrow as pa

    names = list(dict.fromkeys(name for row in rows for name in row))
    arrays = []
    for name in names:
        values = [row.get(name) for row in rows]
        if name == "key":
            values = [orjson.dumps(v).decode() for v in values]
        elif name == "events":
            values = [None if v is None else _flat_events(v) for v in values]
        arrays.append(pa.array(values))
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _flat_events(events: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for variable, bound in events.items():
        for event in bound if isinstance(bound, list) else [bound]:
            out.append({"variable": variable, **event})
    return out


def _shapes(batch: CompositeBatch) -> Iterator[tuple[str, list[str], list[str]]]:
    """(query, column names in JSON order without timed_out, Kleene variables) of the
    batch's composites."""
    from cep_core.composite_batch import ColumnBatch

    if isinstance(batch, ColumnBatch):
        names = ["query", "key", "seq", "start_seq"]
        kleene = []
        if batch.events is not None:
            names.append("events")
            kleene = [v for v, k in zip(batch.events.var_names, batch.events.var_kleene) if k]
        names += [n for n in batch.extra if n != "timed_out"] + [f.name for f in batch.fields]
        yield batch.query, names, kleene
        return
    for row in batch.to_dicts():
        kleene = [v for v, bound in (row.get("events") or {}).items()
                  if isinstance(bound, list)]
        yield row["query"], [n for n in row if n != "timed_out"], kleene


def read_table(table: pa.Table) -> list[dict[str, Any]]:
    """The composite dicts of a table written by `Composites.to_arrow` (read back from
    Parquet or Arrow IPC), exactly as JSON lines would give them."""
    meta = orjson.loads(table.schema.metadata[METADATA])
    out: list[dict[str, Any]] = []
    for row in table.to_pylist():
        query = meta[row["query"]]
        timed_out = row.get("timed_out") is True
        names = [n for n in query["columns"] if not timed_out or n in STANDARD]
        composite: dict[str, Any] = {}
        for name in names:
            value = row[name]
            if name == "key":
                value = orjson.loads(value)
            elif name == "events":
                value = _grouped_events(value, set(query["kleene"]))
            composite[name] = value
        if timed_out:  # after events, in place of the EMIT fields
            composite["timed_out"] = True
        out.append(composite)
    return out


def _grouped_events(elements: list[dict[str, Any]], kleene: set[str]) -> dict[str, Any]:
    events: dict[str, Any] = {}
    for element in elements:
        variable = element.pop("variable")
        if variable in kleene:
            events.setdefault(variable, []).append(element)
        else:
            events[variable] = element
    return events


def read(path: str | Path) -> list[dict[str, Any]]:
    """The composite dicts of a .parquet or .arrow file written by `Composites.write`."""
    if output_format(path) is OutputFormat.PARQUET:
        import pyarrow.parquet as pq

        return read_table(pq.read_table(path))
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        return read_table(pa.ipc.open_file(source).read_all())
