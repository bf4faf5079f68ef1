"""A PySpark streaming data source over a Kafka topic (confluent-kafka), for where Spark's
own Kafka connector is not on the classpath: `spark.readStream.format("cep_kafka")`.

Offsets: the next offset of every source partition. Each micro-batch (a step of the
splitter's model: `sequencer.py`) is one Spark input partition that reads its records
partition by partition, in ascending order, and stamps them with the `Sequencer` from the
carry of the step before (`CarryStore`, beside the job's checkpoint). Messages are one
JSON event each, or an end-of-input marker (header kind=end in every partition, as
`cep_service.stream.kafka.produce_end` writes it).

Options: `bootstrap`, `topic`, `stream` (the schema's name), `schemas` (a schema
directory, optional), `checkpoint` (the job's), `routes` (the state keys,
`packed.routes_option`), `max_records` (records per micro-batch, optional). Rows: the
sequencer's, packed by state key (`packed.py`).
"""

from __future__ import annotations

# Deferred imports: none; pyspark is imported at the top (this module is loaded only where the
# `spark` extra is installed).

import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from confluent_kafka import TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from cep_service.spark_stream.packed import PACKED_DDL, pack_all, routes_of
from cep_service.spark_stream.sequencer import (
    Carry,
    CarryStore,
    Sequencer,
    sequence_run,
    stream_schema,
)
from cep_service.stream.checkpoint import broker_watermarks
from cep_service.stream.kafka import KafkaSettings

END_HEADER = ("kind", b"end")


class KafkaStep(InputPartition):
    def __init__(self, start: dict, end: dict):
        super().__init__(orjson.dumps([start, end]))
        self.start, self.end = start, end


# Deliberately like services/spark_stream/file_source.py's FileEventSource and
# KafkaRecordsSource below: a PySpark data source declares its name, schema and reader each in
# its own class.
class KafkaEventSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cep_kafka"

    def schema(self) -> str:
        return PACKED_DDL

    def streamReader(self, schema: Any) -> KafkaStepReader:  # noqa: N802
        return KafkaStepReader(self.options)


class KafkaStepReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        self.topic = options["topic"]
        self.max_records = int(options.get("max_records") or 0)

    def _settings(self) -> KafkaSettings:
        return KafkaSettings.from_env(self.options["bootstrap"])

    def _watermarks(self) -> dict[int, tuple[int, int]]:
        settings = self._settings()
        consumer = settings.consumer()
        try:
            topic = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            partitions = sorted(topic.partitions) if topic and topic.error is None else []
        finally:
            consumer.close()
        if not partitions:
            raise RuntimeError(f"source topic {self.topic!r} does not exist")
        marks = broker_watermarks(settings, [(self.topic, p) for p in partitions])
        out = {}
        for p in partitions:
            mark = marks[(self.topic, p)]
            if mark is None:  # listed above, gone from the broker since
                raise RuntimeError(f"partition {p} of source topic {self.topic!r} is gone")
            out[p] = mark
        return out

    def initialOffset(self) -> dict:  # noqa: N802
        """The earliest offsets (a new checkpoint), with the empty carry stored for them."""
        offset = {str(p): low for p, (low, _) in self._watermarks().items()}
        CarryStore(self.options["checkpoint"]).put(offset, Carry())
        return offset

    def getDefaultReadLimit(self) -> ReadMaxRows | ReadAllAvailable:  # noqa: N802
        return ReadMaxRows(self.max_records) if self.max_records else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802
        high = {str(p): h for p, (_, h) in self._watermarks().items()}
        end = {p: max(start.get(p, 0), h) for p, h in high.items()}
        if isinstance(limit, ReadMaxRows):
            end = _limited(start, end, limit.max_rows)
        return end

    def partitions(self, start: dict, end: dict) -> list[KafkaStep]:
        return [KafkaStep(start, end)]

    # Spark hands back each partition `partitions` made: a KafkaStep
    def read(self, partition: KafkaStep) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        """The step's rows, packed by state key (`packed.py`)."""
        yield from pack_all(routes_of(self.options), self._rows(partition))

    def _rows(self, partition: KafkaStep) -> Iterator[pa.RecordBatch]:
        options = self.options
        schema = stream_schema(options)
        store = CarryStore(options["checkpoint"])
        sequencer = Sequencer(schema, store.get(partition.start))
        count = len(partition.end)
        for p, messages in _read_runs(self._settings(), self.topic, partition.start,
                                       partition.end):
            ends = np.array([END_HEADER in (m.headers() or []) for m in messages], bool)
            yield from sequence_run(sequencer, p, [m.value() or b"" for m in messages],
                                    np.array([m.offset() for m in messages], np.int64), ends,
                                    count, self.topic)
        store.put(partition.end, sequencer.carry)

    def commit(self, end: dict) -> None:
        pass


def _limited(start: dict, end: dict, most: int) -> dict:
    """At most `most` records: an equal share per partition, the rest in partition order."""
    share = max(1, most // max(1, len(end)))
    out, left = {}, most
    for p in sorted(end, key=int):
        take = min(end[p] - start.get(p, 0), share, left)
        out[p], left = start.get(p, 0) + take, left - take
    for p in sorted(end, key=int):
        take = min(end[p] - out[p], left)
        out[p], left = out[p] + take, left - take
    return out


def _read_runs(settings: KafkaSettings, topic: str, start: dict, end: dict,
               timeout_s: float = 120.0) -> Iterator[tuple[int, list[Any]]]:
    """(partition, its messages from start to end) in ascending partition order."""
    wanted = {int(p): (start.get(p, 0), end[p]) for p in end if end[p] > start.get(p, 0)}
    if not wanted:
        return
    consumer = settings.consumer()
    got: dict[int, list] = {p: [] for p in wanted}
    try:
        consumer.assign([TopicPartition(topic, p, first) for p, (first, _) in wanted.items()])
        # Deliberately like services/stream/checkpoint.py's broker_watermarks: the same
        # assign-and-poll-until-deadline loop, but this one keeps the records of a range and
        # that one only waits for each partition's high watermark.
        pending = set(wanted)
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} partitions {sorted(pending)} took over "
                                   f"{timeout_s} s")
            for message in consumer.consume(10000, 0.1):
                if message.error():
                    continue
                p = message.partition()
                if p in pending and message.offset() < wanted[p][1]:
                    got[p].append(message)
                    if message.offset() >= wanted[p][1] - 1:
                        pending.discard(p)
    finally:
        consumer.close()
    for p in sorted(got):
        yield p, got[p]


RECORDS_DDL = "partition int, offset long, value binary, " \
    "headers array<struct<key: string, value: binary>>"


# Deliberately like KafkaEventSource above: a PySpark data source declares its name, schema and
# reader each in its own class.
class KafkaRecordsSource(DataSource):
    """`cep_kafka_records`: the topic's records as Spark's own Kafka source gives them
    (`partition`, `offset`, `value`, `headers`), read over confluent-kafka: the input of
    the job's path for Spark's source (`spark_kafka.sequenced`) where the connector is not
    on the classpath (its tests). Options: `bootstrap`, `topic`, `checkpoint`."""

    @classmethod
    def name(cls) -> str:
        return "cep_kafka_records"

    def schema(self) -> str:
        return RECORDS_DDL

    def streamReader(self, schema: Any) -> KafkaRecordsReader:  # noqa: N802
        return KafkaRecordsReader(self.options)


class KafkaRecordsReader(KafkaStepReader):
    def read(self, partition: KafkaStep) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        for p, messages in _read_runs(self._settings(), self.topic, partition.start,
                                       partition.end):
            for m in messages:
                yield (p, m.offset(), m.value(), list(m.headers() or []))
