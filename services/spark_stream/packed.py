"""Events and results packed for Spark: a few rows of Arrow IPC instead of a row per event.

Spark moves a row at a time between its stages (the Python source's batches into JVM
rows, the shuffle and its sort, Arrow batches to the Python worker, pandas); at a few
hundred thousand events per micro-batch that row path, not the engines, was the job's
cost. So the source routes the sequencer's rows itself and hands Spark one row per
(query group, shard) and sequencer batch: `PACKED_DDL`, the rows for that shard as an
Arrow IPC stream (`__cep_rows`, the sequencer's `row_schema`), with the batch's place in
the step (`__cep_part`) so the shard reads them back in the sequencer's order. Results
come back the same way: one IPC stream per engines' output batch (`RESULTS_DDL`), unpacked
by the sinks (`unpack_results`).

Routing, as the job did with Spark expressions before: an event goes to one shard of
each query group (MATCH/SEQ with PARTITION BY: a hash of its keys, `pandas`' `hash_array`,
the same in every process; the rest to shard 0), an end of input to every shard of every
group, a dead letter to `DEAD_GROUP`.
"""

from __future__ import annotations

# Deferred imports: pandas (0.3-1 s to import) only where rows are hashed or results packed,
# not in the process Spark starts for a streaming source's planning (offsets, partitions),
# which imports this module at every start of the query.

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cep_service.spark_stream.sequencer import DEAD, END, EVENT, KIND

GROUP, SHARD, SLOT = "__cep_group", "__cep_shard", "__cep_slot"  # the state's key
PART, ROWS = "__cep_part", "__cep_rows"
PACKED_DDL = f"{GROUP} string, {SHARD} int, {SLOT} int, {PART} long, {ROWS} binary"
PACKED_SCHEMA = pa.schema([pa.field(GROUP, pa.string()), pa.field(SHARD, pa.int32()),
                           pa.field(SLOT, pa.int32()), pa.field(PART, pa.int64()),
                           pa.field(ROWS, pa.binary())])
RESULTS = "__cep_results"
RESULTS_DDL = f"{RESULTS} binary"
# the engines' result rows (cep_service.backfill.engines.RESULT_SCHEMA) in Arrow
RESULT_ARROW = pa.schema([("kind", pa.string()), ("query", pa.string()),
                          ("query_index", pa.int32()), ("key", pa.string()),
                          ("seq", pa.int64()), ("start_seq", pa.int64()),
                          ("reason", pa.string()), ("body", pa.string())])
DEAD_GROUP = "!dead"  # the route of the sequencer's dead letters (no engines)


@dataclass(frozen=True)
class Route:
    group: str  # the query group's name in the state's keys
    keys: tuple[str, ...]  # its PARTITION BY attributes (none: one shard)
    shards: int
    # each shard's slot: the third part of its state key, chosen (`job.balanced_slots`)
    # so that Spark's hash partitioning puts the shards in different tasks
    slots: tuple[int, ...] = ()

    def slot(self, shard: int) -> int:
        return self.slots[shard] if self.slots else 0


def routes_option(routes: list[Route]) -> str:
    return orjson.dumps([[r.group, list(r.keys), r.shards, list(r.slots)]
                         for r in routes]).decode()


def routes_of(options: dict) -> list[Route]:
    return [Route(g, tuple(k), n, tuple(s)) for g, k, n, s in orjson.loads(options["routes"])]


# Events cross Spark (the source's rows into the JVM, the shuffle, the Arrow to the shard's
# Python worker) compressed: zstd makes the trades stream's rows 4.6 times smaller (12.3 MB
# -> 2.6 MB per 200k events) for 0.03 s to write and 0.02 s to read, and every copy in
# between moves that much less.
ROWS_IPC = pa.ipc.IpcWriteOptions(compression="zstd")


def to_ipc(batch: pa.RecordBatch | pa.Table,
           options: pa.ipc.IpcWriteOptions | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write(batch)
    return sink.getvalue().to_pybytes()


def from_ipc(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


def shard_of(batch: pa.RecordBatch, keys: tuple[str, ...], shards: int) -> np.ndarray:
    """Each row's shard by its `keys` (a hash stable across processes and runs)."""
    if not keys or shards == 1:
        return np.zeros(batch.num_rows, np.int64)
    import pandas as pd

    hashes = np.zeros(batch.num_rows, np.uint64)
    for key in keys:
        column = pc.dictionary_encode(batch.column(key))  # hash each distinct value once
        values = pd.util.hash_array(column.dictionary.to_numpy(zero_copy_only=False))
        codes = column.indices.to_numpy(zero_copy_only=False)
        hashes = hashes * np.uint64(1_000_003) + values[codes]  # wraps: same everywhere
    return (hashes % np.uint64(shards)).astype(np.int64)


class Packer:
    """Packs one step's sequencer batches, numbering them in the order they come."""

    def __init__(self, routes: list[Route]):
        self.routes = routes
        self.part = 0

    def pack(self, batch: pa.RecordBatch | None) -> pa.RecordBatch | None:
        if batch is None or not batch.num_rows:
            return None
        kinds = batch.column(KIND)
        event = pc.equal(kinds, EVENT).to_numpy(zero_copy_only=False)
        end = pc.equal(kinds, END).to_numpy(zero_copy_only=False)
        dead = pc.equal(kinds, DEAD).to_numpy(zero_copy_only=False)
        groups, shards, slots, blobs = [], [], [], []

        def add(group: str, shard: int, slot: int, rows: np.ndarray) -> None:
            if len(rows):
                groups.append(group)
                shards.append(shard)
                slots.append(slot)
                blobs.append(to_ipc(batch.take(pa.array(rows)), ROWS_IPC))

        if event.any() or end.any():
            for route in self.routes:
                place = shard_of(batch, route.keys, route.shards)
                for shard in range(route.shards):
                    add(route.group, shard, route.slot(shard),
                        np.flatnonzero((event & (place == shard)) | end))
        add(DEAD_GROUP, 0, 0, np.flatnonzero(dead))
        part = self.part
        self.part += 1
        n = len(blobs)
        if not n:
            return None
        return pa.RecordBatch.from_arrays(
            [pa.array(groups, pa.string()), pa.array(shards, pa.int32()),
             pa.array(slots, pa.int32()), pa.array([part] * n, pa.int64()),
             pa.array(blobs, pa.binary())],
            schema=PACKED_SCHEMA)


def pack_all(routes: list[Route],
             batches: Iterable[pa.RecordBatch | None]) -> Iterator[pa.RecordBatch]:
    """A step's sequencer batches, packed by state key (`Packer`): what a source's `read`
    yields."""
    packer = Packer(routes)
    for batch in batches:
        packed = packer.pack(batch)
        if packed is not None:
            yield packed


def unpack_rows(frames: Iterable[Any]) -> pa.Table:
    """A state key's packed rows (pandas frames of `PACKED_DDL`) -> the sequencer's rows,
    in the sequencer's order."""
    parts = sorted(((part, blob) for frame in frames
                    for part, blob in zip(frame[PART].tolist(), frame[ROWS].tolist())),
                   key=lambda p: p[0])
    return pa.concat_tables([from_ipc(blob) for _, blob in parts])


def pack_results(batch: pa.RecordBatch | pa.Table) -> Any:
    """One result row: the engines' rows as zstd-compressed Arrow IPC (composite JSON
    bodies shrink about 5 times; they cross from the shard's Python worker into the JVM,
    to the driver and into its Python as these bytes)."""
    import pandas as pd

    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    return pd.DataFrame({RESULTS: [to_ipc(table.cast(RESULT_ARROW), ROWS_IPC)]})


def unpack_results(table: pa.Table) -> pa.Table:
    """The job's output rows (`RESULTS_DDL`, as `foreachBatch` gives them) -> the
    engines' result rows (`RESULT_ARROW`)."""
    tables = [from_ipc(blob) for blob in table.column(RESULTS).to_pylist() if blob]
    return pa.concat_tables(tables) if tables else RESULT_ARROW.empty_table()
