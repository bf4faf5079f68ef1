"""The backfill's engine task: the jitted `Engine` kernels over one Spark partition.

A task receives every event of its keys in seq order (Arrow batches from `mapInArrow`),
feeds them batch by batch to one `StreamEngines` (one engine per query, per-key state
inside), flushes at the end of the partition (the end of the input is event time +infinity,
as in `cep run`) and yields its composite events and rejected events as Arrow rows.
"""

from __future__ import annotations

import os

import numpy as np
import orjson
import pyarrow as pa

from cep_core.checker import CheckedQuery

RESULT_SCHEMA = ("kind string, query string, query_index int, key string, seq long, "
                 "start_seq long, reason string, body string")
COMPOSITE, REJECTED = "composite", "rejected"


class PartitionRunner:
    """Called by mapInArrow once per partition; `rows` (an accumulator) counts events."""

    def __init__(self, queries: list[CheckedQuery], kernel_cache: str, rows=None,
                 options: dict | None = None):
        self.queries = queries
        self.kernel_cache = kernel_cache
        self.rows = rows
        self.options = options or {}

    def __call__(self, batches):
        os.environ["CEP_KERNEL_CACHE"] = self.kernel_cache  # the driver's kernel cache
        from cep_core.runner import new_engines

        engines, encoder = new_engines(self.queries, **self.options)
        index = {q.name: q.index for q in self.queries}
        seen_rejected = 0
        for batch in batches:
            table = pa.Table.from_batches([batch])
            if table.num_rows == 0:
                continue
            composites = engines.process(encoder.from_arrow(table))
            rejected = engines.dead_letters()
            fresh, seen_rejected = rejected[seen_rejected:], len(rejected)
            if self.rows is not None:
                self.rows.add(table.num_rows)
            if composites or fresh:
                yield _result_batch(composites, index, _rejected_rows(fresh, table))
        composites = engines.flush()
        rejected = engines.dead_letters()[seen_rejected:]
        if composites or rejected:
            yield _result_batch(composites, index, [(q, seq, reason, None)
                                                    for q, seq, reason in rejected])


def _rejected_rows(rejected, table: pa.Table) -> list[tuple]:
    """(query, seq, reason, event JSON) of events an engine rejected in this batch: the
    event as `Event.to_json` gives it (seq, then the attributes in schema order)."""
    if not rejected:
        return []
    seqs = table.column("seq").to_numpy()
    rows = [int(np.searchsorted(seqs, seq)) for _, seq, _ in rejected]
    records = table.take(pa.array(rows)).to_pylist()
    return [(q, seq, reason, orjson.dumps(record).decode())
            for (q, seq, reason), record in zip(rejected, records)]


def _result_batch(composites: list[dict], index: dict[str, int],
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
    ], names=["kind", "query", "query_index", "key", "seq", "start_seq", "reason", "body"])


def map_in_arrow(df, func, schema: str):
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
