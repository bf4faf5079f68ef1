"""Where the job's composite events go, once per micro-batch (`foreachBatch`), so that a
micro-batch run again after a restart (Spark runs the last one again when its commit was
not logged) writes nothing twice:

- `FileSink`: `OUT/composites/batch-<id>.parquet` (the backfill's layout, read back by
  `cep_service.backfill.output.read_composites`) and `OUT/dead_letters/batch-<id>.parquet`,
  each written under a hidden name and renamed: a batch's file is whole or absent, and a
  batch run again replaces it with the same rows.
- `KafkaSink`: each composite event to its query's INTO topic as the service writes it
  (value: the composite JSON; key: its key as JSON; murmur2 partitioner), with headers
  `cep.batch` and `cep.n` (its place in the batch's messages to that partition). Before
  producing a batch, the sink reads the last message of each partition it writes: what a
  killed run already delivered of this batch is not produced again (the producer is
  idempotent, so a partition holds a prefix of what was sent to it).
"""

from __future__ import annotations

# Deferred imports: the Kafka consumer and the broker's watermarks load only for the Kafka sink.

import time
from collections.abc import Iterable
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cep_service.backfill.engines import COMPOSITE, COMPOSITE_COLUMNS, COMPOSITE_SCHEMA
from cep_service.spark_stream.packed import unpack_results
from cep_service.stream.kafka import KafkaSettings, flush_all, produce

DEAD_SCHEMA = pa.schema([("kind", pa.string()), ("query", pa.string()), ("seq", pa.int64()),
                         ("reason", pa.string()), ("body", pa.string())])
BATCH_HEADER, NUMBER_HEADER = "cep.batch", "cep.n"


def _composites(table: pa.Table) -> pa.Table:
    """The composite rows in a deterministic order (a shuffle's row order is not): by seq,
    query, start seq, key, then the whole JSON."""
    rows = table.filter(pc.equal(table.column("kind"), COMPOSITE))
    rows = pa.Table.from_arrays([rows.column(c).cast(f.type) for c, f in
                                 zip(COMPOSITE_COLUMNS, COMPOSITE_SCHEMA)],
                                schema=COMPOSITE_SCHEMA)
    return rows.sort_by([(c, "ascending") for c in
                         ("seq", "query_index", "start_seq", "key", "composite")])


def _others(table: pa.Table) -> pa.Table:
    rows = table.filter(pc.not_equal(table.column("kind"), COMPOSITE))
    return rows.select(DEAD_SCHEMA.names).cast(DEAD_SCHEMA)


class FileSink:
    def __init__(self, output: str):
        self.fs, self.root = pafs.FileSystem.from_uri(output)
        self.root = self.root.rstrip("/")

    def __call__(self, df: Any, batch_id: int) -> None:
        self.write(unpack_results(df.toArrow()), batch_id)

    def write(self, table: pa.Table, batch_id: int) -> None:
        for folder, rows in (("composites", _composites(table)),
                             ("dead_letters", _others(table))):
            directory = f"{self.root}/{folder}"
            self.fs.create_dir(directory, recursive=True)
            name = f"batch-{batch_id:010d}.parquet"
            with self.fs.open_output_stream(f"{directory}/.{name}") as f:
                pq.write_table(rows, f)
            self.fs.move(f"{directory}/.{name}", f"{directory}/{name}")


class KafkaSink:
    def __init__(self, bootstrap: str, topics: dict[str, str], dead_letters: str | None = None):
        self.bootstrap = bootstrap
        self.topics = topics  # query name -> INTO topic
        self.dead_letters = dead_letters

    def __call__(self, df: Any, batch_id: int) -> None:
        self.write(unpack_results(df.toArrow()), batch_id)

    def write(self, table: pa.Table, batch_id: int) -> None:
        settings = KafkaSettings.from_env(self.bootstrap)
        producer = settings.producer(**{"enable.idempotence": True})
        messages = [(self.topics[query], key.encode(), body.encode()) for query, key, body in
                    zip(*(_composites(table).column(c).to_pylist()
                          for c in ("query", "key", "composite")))]
        if self.dead_letters:
            messages += [(self.dead_letters, b"null", orjson.dumps(row)) for row in
                         _others(table).to_pylist()]
        partitions = {t: len(producer.list_topics(t, timeout=10).topics[t].partitions)
                      for t in {m[0] for m in messages}}
        placed = [(t, murmur2_partition(key, partitions[t]), key, value)
                  for t, key, value in messages]
        done = delivered(settings, {(t, p) for t, p, _, _ in placed}, batch_id)
        numbers: dict[tuple, int] = {}
        for topic, p, key, value in placed:
            n = numbers[(topic, p)] = numbers.get((topic, p), -1) + 1
            if n >= done.get((topic, p), 0):
                produce(producer, topic, value, key=key, partition=p, headers=[
                    (BATCH_HEADER, str(batch_id).encode()), (NUMBER_HEADER, str(n).encode())])
        flush_all(producer, 60)


def delivered(settings: KafkaSettings, partitions: Iterable[tuple[str, int]],
              batch_id: int) -> dict[tuple, int]:
    """How many messages of batch `batch_id` each (topic, partition) holds already (all of
    them, as a large number, when a later batch was written there)."""
    from confluent_kafka import TopicPartition

    from cep_service.stream.checkpoint import broker_watermarks

    out: dict[tuple, int] = {}
    marks = broker_watermarks(settings, partitions)
    last: dict[tuple, int] = {tp: high - 1 for tp, mark in marks.items()
                              if mark and (high := mark[1]) > mark[0]}
    if not last:
        return out
    consumer = settings.consumer()
    try:
        consumer.assign([TopicPartition(t, p, offset) for (t, p), offset in last.items()])
        pending = dict(last)
        deadline = time.monotonic() + 60
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer reading the last message of {sorted(pending)}")
            for message in consumer.consume(100, 1.0):
                tp = (message.topic(), message.partition())
                if message.error() or pending.get(tp) != message.offset():
                    continue
                del pending[tp]
                headers: dict[str, Any] = dict(message.headers() or [])
                if BATCH_HEADER in headers:
                    batch = int(headers[BATCH_HEADER])
                    if batch > batch_id:
                        out[tp] = 1 << 62
                    elif batch == batch_id:
                        out[tp] = int(headers[NUMBER_HEADER]) + 1
    finally:
        consumer.close()
    return out


def murmur2_partition(key: bytes, partitions: int) -> int:
    """Kafka's default partition of a keyed message (Java's and librdkafka's murmur2)."""
    m, r, length = 0x5BD1E995, 24, len(key)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(key[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = length % 4
    if tail:
        rest = key[length - tail:]
        if tail >= 3:
            h ^= rest[2] << 16
        if tail >= 2:
            h ^= rest[1] << 8
        h ^= rest[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions
