"""The backfill's engine task: the jitted `Engine` kernels over one Spark partition.

A task receives every event of its keys in seq order (Arrow batches from `mapInArrow`),
feeds them batch by batch to one `StreamEngines` (one engine per query, per-key state
inside), flushes at the end of the partition (the end of the input is event time +infinity,
as in `cep run`) and yields its composite events and rejected events as Arrow rows. The
composite rows are built from the engines' CompositeBatch columns (`body` by
`composite_json.lines`), not from a dict per composite event.
"""

from __future__ import annotations

# Deferred imports: pyspark and pandas (the `spark` extra, may be missing) load when a Spark job
# runs; the engines' Arrow core is used without them.

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs
import pyarrow.parquet as pq

from cep_core import composite_json
from cep_core.arrow_numpy import from_numpy
from cep_core.checked import CheckedQuery
from cep_core.composite_batch import ColumnBatch
from cep_core.runner import new_engines

RESULT_SCHEMA = ("kind string, query string, query_index int, key string, seq long, "
                 "start_seq long, reason string, body string")
COMPOSITE, REJECTED = "composite", "rejected"
# The composite events' output file (backfill_output): RESULT_SCHEMA's columns, body as
# `composite`.
COMPOSITE_COLUMNS = ["query", "query_index", "key", "seq", "start_seq", "body"]
COMPOSITE_SCHEMA = pa.schema([("query", pa.string()), ("query_index", pa.int32()),
                              ("key", pa.string()), ("seq", pa.int64()),
                              ("start_seq", pa.int64()), ("composite", pa.string())])


class RejectedRows:
    """An AccumulatorParam gathering rejected events, (query_index, query, seq, reason,
    raw) tuples: they are few, and sent this way the job's result (composite events only)
    is consumed once, by the Parquet write, and needs no cache. A task run again (a lost
    shuffle) adds its rows again: `unique_rejected` drops the copies."""

    def zero(self, value: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return []

    def addInPlace(self, value1: list[tuple[Any, ...]],  # noqa: N802 (PySpark's name)
                   value2: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        value1.extend(value2)
        return value1


def unique_rejected(rows: list[tuple]) -> list[tuple]:
    """Rejected rows without the copies of tasks run twice, by query and seq."""
    return list({(row[0], row[2]): row for row in rows}.values())


class PartitionRunner:
    """Called by mapInArrow once per partition; `rows` (an accumulator) counts events;
    `rejected` (an accumulator with `RejectedRows`) takes the rejected events, which
    are otherwise yielded as `rejected` rows."""

    def __init__(self, queries: list[CheckedQuery], kernel_cache: str, rows: Any = None,
                 options: dict[str, Any] | None = None, rejected: Any = None,
                 output: str | None = None,
                 group: int = 0):
        self.queries = queries
        self.kernel_cache = kernel_cache
        self.rows = rows
        self.options = options or {}
        self.rejected = rejected
        self.output = output  # write composites there (pyarrow) and yield their count
        self.group = group

    def _send(self, index: dict[str, int], rejected: list[tuple]) -> list[tuple]:
        """`rejected` rows to the accumulator (returning none) or back to be yielded."""
        if self.rejected is None or not rejected:
            return rejected
        self.rejected.add([(index[q.name], q.name, seq, reason, raw)
                           for q, seq, reason, raw in rejected])
        return []

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        if self.output is None:
            return self._results(batches)
        return self._write(self._results(batches))

    def _write(self, results: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Composite rows into one Parquet file of this task (named by its group and
        partition, so a task run again replaces its own file); yields their count."""
        from pyspark import TaskContext

        fs, directory = pa.fs.FileSystem.from_uri(self.output)
        task = TaskContext.get()
        assert task is not None, "_write runs in a Spark task, not on the driver"
        name = f"part-{self.group:03d}-{task.partitionId():05d}.parquet"
        count = 0
        with pq.ParquetWriter(fs.open_output_stream(f"{directory}/{name}"),
                              COMPOSITE_SCHEMA) as writer:
            for batch in results:
                composites = batch.filter(pc.equal(batch.column("kind"), COMPOSITE))
                if composites.num_rows:
                    writer.write_batch(pa.RecordBatch.from_arrays(
                        [composites.column(c) for c in COMPOSITE_COLUMNS],
                        schema=COMPOSITE_SCHEMA))
                    count += composites.num_rows
        yield pa.RecordBatch.from_arrays([pa.array([count], pa.int64())], ["composites"])

    def _results(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        os.environ["CEP_KERNEL_CACHE"] = self.kernel_cache  # the driver's kernel cache

        engines, encoder = new_engines(self.queries, **self.options)
        index = {q.name: q.index for q in self.queries}
        seen_rejected = 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            table = pa.Table.from_batches([batch])
            found = engines.process_columns(encoder.from_arrow(table))
            rejected = engines.dead_letters()
            fresh, seen_rejected = rejected[seen_rejected:], len(rejected)
            if self.rows is not None:
                self.rows.add(table.num_rows)
            yield from result_batches(found, index,
                                      self._send(index, _rejected_rows(fresh, table)))
        found = engines.flush_columns()
        rejected = engines.dead_letters()[seen_rejected:]
        yield from result_batches(found, index, self._send(
            index, [(q, seq, reason, None) for q, seq, reason in rejected]))


def _rejected_rows(rejected: list[tuple[Any, ...]], table: pa.Table) -> list[tuple[Any, ...]]:
    """(query, seq, reason, event JSON) of events an engine rejected in this batch: the
    event as `Event.to_json` gives it (seq, then the attributes in schema order)."""
    if not rejected:
        return []
    seqs = table.column("seq").to_numpy()
    rows = [int(np.searchsorted(seqs, seq)) for _, seq, _ in rejected]
    records = table.take(pa.array(rows)).to_pylist()
    return [(q, seq, reason, orjson.dumps(record).decode())
            for (q, seq, reason), record in zip(rejected, records)]


RESULT_NAMES = ["kind", "query", "query_index", "key", "seq", "start_seq", "reason", "body"]


def result_batches(found: list[Any], index: dict[str, int],
                   rejected: list[tuple[Any, ...]]) -> Iterator[pa.RecordBatch]:
    """Result rows: one record batch per engine CompositeBatch, built from its columns
    (`composite_json.lines` for `body`, no dict per composite), then the rejected events."""
    rows: list[dict] = []
    for batch in found:
        if not len(batch):
            continue
        if isinstance(batch, ColumnBatch):
            yield _column_rows(batch, index[batch.query])
        else:  # WINDOW composites come as dicts already
            rows.extend(batch.to_dicts())
    if rows or rejected:
        yield _dict_rows(rows, index, rejected)


def _column_rows(batch: ColumnBatch, query_index: int) -> pa.RecordBatch:
    n = len(batch)
    body = pc.utf8_slice_codeunits(composite_json.lines(batch), 0, -1)  # no newline
    return pa.RecordBatch.from_arrays([
        pa.array([COMPOSITE] * n, pa.string()),
        pa.array([batch.query] * n, pa.string()),
        pa.array(np.full(n, query_index, np.int32)),
        batch.keys.arrow().cast(pa.string()),
        from_numpy(np.asarray(batch.seq, np.int64)),
        from_numpy(np.asarray(batch.start_seq, np.int64)),
        pa.nulls(n, pa.string()),
        body.cast(pa.string()),
    ], names=RESULT_NAMES)


def _dict_rows(composites: list[dict], index: dict[str, int],
               rejected: list[tuple]) -> pa.RecordBatch:
    kind = [COMPOSITE] * len(composites) + [REJECTED] * len(rejected)
    query = [c["query"] for c in composites] + [q.name for q, *_ in rejected]
    return pa.RecordBatch.from_arrays([
        pa.array(kind, pa.string()),
        pa.array(query, pa.string()),
        pa.array([index[name] for name in query], pa.int32()),
        pa.array([orjson.dumps(c["key"]).decode() for c in composites]
                 + [None] * len(rejected), pa.string()),
        pa.array([c["seq"] for c in composites] + [seq for _, seq, *_ in rejected],
                 pa.int64()),
        pa.array([c["start_seq"] for c in composites] + [None] * len(rejected), pa.int64()),
        pa.array([None] * len(composites) + [reason for *_, reason, _ in rejected],
                 pa.string()),
        pa.array([orjson.dumps(c).decode() for c in composites]
                 + [body for *_, body in rejected], pa.string()),
    ], names=RESULT_NAMES)


def map_in_arrow(df: Any, func: Callable[..., Any], schema: str) -> Any:
    """`df.mapInArrow(func, schema)`. PySpark's public method insists on pandas only to
    wrap `func` (the workers exchange Arrow batches and never touch pandas); pandas is not
    a dependency here, so without it the same Arrow-iterator UDF is built directly."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        from pyspark.sql import DataFrame
        from pyspark.sql.udf import _create_udf
        from pyspark.util import PythonEvalType

        udf = _create_udf(func, returnType=schema,
                          evalType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
        column = udf(*[df[c] for c in df.columns])
        return DataFrame(df._jdf.mapInArrow(column._jc, False, None), df.sparkSession)
    return df.mapInArrow(func, schema)
