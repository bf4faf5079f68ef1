"""Spark's own Kafka source, where its connector is on the classpath (`spark-submit
--packages org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>`): the job reads the
topic with `spark.readStream.format("kafka")` instead of its Python source (`cep_kafka`).

Spark's source gives a micro-batch's records as rows, split into tasks by Kafka partition,
and no task learns the micro-batch's offsets (which key the Python source's carries). So
the records go to one task (`coalesce(1)`, no shuffle), which sorts them by (partition,
offset), stamps them as the Python source does (`sequence_run`: the same seqs, checks, dead
letters and ends) from the carry of the micro-batch before, and packs them by state key
(`Packer`); the engines' step (`ShardRunner`) follows, as after the Python source. (Spark
runs one `applyInPandasWithState` per streaming query, so the carry cannot be a state of
its own.) The carry is found by offsets (`OffsetCarries`): a step leaves its carry under
every partition's next offset; the next step takes the one left under the largest offset
not past the first record it has of its lowest partition. A step run again after a
restart finds the same carry: what it left itself lies past its records.

`connector_available` says whether the connector's classes load in the driver's JVM; the
job uses Spark's source then (`KafkaSource.reader`: "auto"), and its Python source
otherwise or when told ("python"). Not run on this machine (the connector is not on PyPI
and Maven Central is not reachable from it): this path is tested over the same columns
from a Python source (`cep_kafka_records`, tests/test_spark_stream_live.py); the connector
itself is not.
"""

from __future__ import annotations

# Deferred imports: none; pyspark is imported at the top (this module is loaded only where the
# `spark` extra is installed).

from collections.abc import Iterable, Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import numpy as np
from pyspark.sql import functions as F

from cep_service.spark_stream.packed import PACKED_DDL, Packer, Route
from cep_service.spark_stream.sequencer import Carry, Sequencer, sequence_run, stream_schema

CONNECTOR_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
# the columns the sequencer step takes (Spark's Kafka source has them, `end` from headers)
RAW_COLUMNS = ("partition", "offset", "value", "__cep_end")
END_EXPR = "exists(coalesce(headers, array()), h -> h.key = 'kind' AND " \
    "cast(h.value AS string) = 'end')"


def connector_available(spark: Any, class_name: str = CONNECTOR_CLASS) -> bool:
    """Whether Spark's Kafka connector (`class_name`) loads in the driver's JVM: jars
    given with --packages or --jars are on the context class loader."""
    try:
        jvm = spark._jvm
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(class_name, False, loader)
        return True
    except Exception:  # noqa: BLE001 - Py4JJavaError (ClassNotFoundException), no JVM (Connect)
        return False


def kafka_records(spark: Any, bootstrap: str, topic: str, max_records: int = 0) -> Any:
    """Spark's Kafka source over `topic`, from its earliest offsets, with headers."""
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("includeHeaders", "true").option("failOnDataLoss", "true"))
    if max_records:
        reader = reader.option("maxOffsetsPerTrigger", str(max_records))
    return reader.load()


def sequenced(records: Any, schema_json: str, routes: list[Route], topic: str,
              partitions: int, checkpoint: str) -> Any:
    """Spark's Kafka rows (`partition`, `offset`, `value`, `headers`) -> the packed rows of
    the sequencer (`PACKED_DDL`), one task per micro-batch (see the module)."""
    if "__cep_end" not in records.columns:
        records = records.withColumn("__cep_end", F.expr(END_EXPR))
    return records.select(*RAW_COLUMNS).coalesce(1).mapInArrow(
        SequenceStep(schema_json, routes, topic, partitions, checkpoint), PACKED_DDL)


class OffsetCarries:
    """Carries in `<checkpoint>/sequencer/`, one file per (partition, next offset): a step
    writes its carry, with every partition's next offset (-1: none read yet), under each."""

    def __init__(self, checkpoint: str):
        self.fs, root = pafs.FileSystem.from_uri(checkpoint)
        self.root = f"{root.rstrip('/')}/sequencer"

    def get(self, partition: int, first: int) -> tuple[Carry, dict[int, int]]:
        """The carry, and every partition's next offset, left under the largest offset of
        `partition` not past `first` (none: the stream's start)."""
        prefix = f"k{partition}_"
        found = []
        for info in self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True)):
            name = info.base_name
            if name.startswith(prefix) and name.endswith(".json"):
                at = int(name[len(prefix):-5]) - 1
                if at <= first:
                    found.append((at, info.path))
        if not found:
            return Carry(), {}
        with self.fs.open_input_stream(max(found)[1]) as f:
            data = orjson.loads(f.read())
        return Carry(**data["carry"]), {int(p): o for p, o in data["next"].items()}

    def put(self, nexts: dict[int, int], carry: Carry) -> None:
        self.fs.create_dir(self.root, recursive=True)
        data = orjson.dumps({"carry": orjson.loads(carry.to_json()),
                             "next": {str(p): o for p, o in nexts.items()}})
        for p, o in nexts.items():
            path = f"{self.root}/k{p}_{o + 1:020d}.json"
            with self.fs.open_output_stream(path + ".tmp") as f:
                f.write(data)
            self.fs.move(path + ".tmp", path)


class SequenceStep:
    """`mapInArrow`'s function: a micro-batch's records (one task) in (partition, offset)
    order through the `Sequencer`, from the carry of the micro-batch before."""

    def __init__(self, schema_json: str, routes: list[Route], topic: str, partitions: int,
                 checkpoint: str) -> None:
        self.schema_json = schema_json
        self.routes = routes
        self.topic = topic
        self.partitions = partitions
        self.checkpoint = checkpoint

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        table = pa.Table.from_batches(list(batches))
        if not table.num_rows:
            return
        table = table.sort_by([("partition", "ascending"), ("offset", "ascending")])
        parts = table.column("partition").to_numpy()
        offsets = table.column("offset").to_numpy()
        lowest = int(parts[0])
        carries = OffsetCarries(self.checkpoint)
        first = int(offsets[0])
        carry, before = carries.get(lowest, first)
        nexts = {p: -1 for p in range(self.partitions)} | before
        sequencer = Sequencer(stream_schema({"schema": self.schema_json}), carry)
        packer = Packer(self.routes)
        values = table.column("value").to_pylist()
        ends = table.column("__cep_end").to_numpy(zero_copy_only=False)
        bounds = [0, *(np.flatnonzero(np.diff(parts)) + 1), len(parts)]
        for lo, hi in zip(bounds, bounds[1:]):
            p = int(parts[lo])
            for batch in sequence_run(sequencer, p, [v or b"" for v in values[lo:hi]],
                                      offsets[lo:hi].astype(np.int64),
                                      ends[lo:hi].astype(bool), self.partitions, self.topic):
                packed = packer.pack(batch)
                if packed is not None:
                    yield packed
            nexts[p] = int(offsets[hi - 1]) + 1
        carries.put(nexts, sequencer.carry)
