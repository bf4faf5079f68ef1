"""The same queries as a Spark Structured Streaming job (`cep spark stream`):

    source (cep_kafka: Kafka over confluent-kafka | cep_files: a directory of event files)
      -> the sequencer, one task per micro-batch (sequencer.py): seqs, dead letters, ends
      -> in the same task, every event routed to one shard of each query group (plan.py;
         hash of the PARTITION BY keys), ends to every shard, dead letters to their own
         key, packed as one Arrow IPC row per state key and sequencer batch (packed.py)
      -> groupBy(group, shard, slot).applyInPandasWithState(ShardRunner): the engines,
         their snapshot in Spark's state store (keyed_state.py); results packed likewise
      -> foreachBatch: Parquet files by batch id, or Kafka INTO topics (sinks.py)

Everything the job keeps lives under its checkpoint directory: Spark's (`spark/`: offsets,
commits, state) and the sequencer's carries (`sequencer/`). Restarted on the same
checkpoint, the job goes on from the last committed micro-batch, with the same output.
"""

from __future__ import annotations

# Deferred imports: pyspark, and the data sources (which import it at their top), load when a job
# starts, so the routing names can be imported where the `spark` extra is missing.

import os
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from cep_core.checked import CheckedQuery
from cep_core.home import kernel_cache_dir
from cep_service.backfill.plan import plan
from cep_service.spark_stream.keyed_state import STATE_SCHEMA, ShardRunner, fingerprint
from cep_service.spark_stream.packed import GROUP, RESULTS_DDL, SHARD, SLOT, Route, routes_option


class Reader(StrEnum):
    """Which source reads the job's rows (its value is how a KafkaSource names it)."""

    AUTO = "auto"  # Kafka: SPARK where Spark's connector loads (spark_kafka.py), else PYTHON
    SPARK = "spark"  # Spark's own Kafka source
    PYTHON = "python"  # the job's Python Kafka source (cep_kafka, over confluent-kafka)
    FILES = "files"  # a FileSource's (cep_files)


_KAFKA_READERS = (Reader.AUTO, Reader.SPARK, Reader.PYTHON)


@dataclass(frozen=True)
class KafkaSource:
    bootstrap: str
    topic: str
    max_records: int = 0  # per micro-batch; 0: all available
    reader: str = Reader.AUTO  # one of _KAFKA_READERS, as text or the enum


@dataclass(frozen=True)
class FileSource:
    path: str
    max_files: int = 0  # per micro-batch; 0: all available


def session_conf() -> dict[str, str]:
    """Spark settings for a session the job starts itself (local mode: the driver's JVM is
    the executor). The JVM's C1 compiler only (`-XX:TieredStopAtLevel=1`): at 1M events in
    micro-batches its optimizing C2 compiler threads took 3-4 of the JVM's 6-7 CPU seconds
    and kept compiling (a first job of 250k events did not lower it); with C1 alone the JVM
    used 4.8 s and the job 20% less CPU (docs/spark_streaming.md, Performance).
    `CEP_SPARK_JVM_OPTIONS` replaces the options ("" for the JVM's defaults). Under
    spark-submit the JVM exists already and its own options hold."""
    options = os.environ.get("CEP_SPARK_JVM_OPTIONS", "-XX:TieredStopAtLevel=1")
    return {"spark.driver.extraJavaOptions": options} if options else {}


def group_name(keys: tuple[str, ...]) -> str:
    """A query group's name in the state's keys: its PARTITION BY list (stable when
    queries are added or removed)."""
    return orjson.dumps(list(keys)).decode()


def register_sources(spark: Any) -> None:
    from cep_service.spark_stream.file_source import FileEventSource
    from cep_service.spark_stream.kafka_source import KafkaEventSource, KafkaRecordsSource

    spark.dataSource.register(KafkaEventSource)
    spark.dataSource.register(KafkaRecordsSource)
    spark.dataSource.register(FileEventSource)


def kafka_reader(spark: Any, source: KafkaSource) -> Reader:
    """Which Kafka source the job uses: SPARK (Spark's own, its connector on the
    classpath) or PYTHON (`cep_kafka`, over confluent-kafka)."""
    from cep_service.spark_stream.spark_kafka import connector_available

    if source.reader not in _KAFKA_READERS:
        raise ValueError(f"unknown Kafka reader {source.reader!r} (auto, spark, python)")
    if source.reader != Reader.AUTO:
        return Reader(source.reader)
    return Reader.SPARK if connector_available(spark) else Reader.PYTHON


def _spark_kafka_rows(spark: Any, queries: list[CheckedQuery], source: KafkaSource,
                      routes: list[Route], checkpoint: str) -> Any:
    from cep_service.spark_stream import spark_kafka
    from cep_service.stream.kafka import KafkaSettings

    consumer = KafkaSettings.from_env(source.bootstrap).consumer()
    try:
        topic = consumer.list_topics(source.topic, timeout=10).topics.get(source.topic)
    finally:
        consumer.close()
    if topic is None or topic.error is not None:
        raise ValueError(f"source topic {source.topic!r} does not exist")
    records = spark_kafka.kafka_records(spark, source.bootstrap, source.topic,
                                        source.max_records)
    return spark_kafka.sequenced(records, orjson.dumps(queries[0].schema.to_dict()).decode(),
                                 routes, source.topic, len(topic.partitions), checkpoint)


def read_rows(spark: Any, queries: list[CheckedQuery], source: KafkaSource | FileSource,
              checkpoint: str, routes: list[Route]) -> Any:
    """The sequencer's rows, packed by state key (`packed.py`), as a streaming DataFrame."""
    register_sources(spark)
    reader = (spark.readStream.option("schema", orjson.dumps(queries[0].schema.to_dict()).decode())
              .option("checkpoint", checkpoint)
              .option("routes", routes_option(routes)))
    if isinstance(source, KafkaSource):
        return (reader.format("cep_kafka").option("bootstrap", source.bootstrap)
                .option("topic", source.topic)
                .option("max_records", str(source.max_records)).load())
    return (reader.format("cep_files").option("path", source.path)
            .option("max_files", str(source.max_files)).load())


def state_routes(queries: list[CheckedQuery], shards: int) -> list[Route]:
    """Each query group's route: its name, PARTITION BY keys and number of shards."""
    return [Route(group_name(g.keys), tuple(g.keys), shards if g.keys else 1)
            for g in plan(queries)]


def balanced_slots(routes: list[Route], partitions: int, tries: int = 256) -> list[Route]:
    """`routes` with a slot for each shard such that Spark's hash partitioning (a pmod of
    `hash(group, shard, slot)`, the state's key) puts the i-th state key in partition
    i mod `partitions`: shards in tasks of their own, not two in one by chance. Spark's
    hash computed here (`spark_hash`, tested against Spark's own), so a start or a restart
    for a change of queries runs no Spark job for it; the same groups and shards give the
    same slots, and the same state keys."""
    keys = [(r.group, s) for r in routes for s in range(r.shards)]
    target = {key: i % partitions for i, key in enumerate(keys)}
    found = {key: next((slot for slot in range(tries)
                        if spark_hash(key[0], key[1], slot) % partitions == target[key]), 0)
             for key in keys}
    return [Route(r.group, r.keys, r.shards, tuple(found[(r.group, s)] for s in range(r.shards)))
            for r in routes]


_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k1: int) -> int:
    k1 = (k1 * 0xCC9E2D51) & _M32
    return (_rotl(k1, 15) * 0x1B873593) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    h1 = _rotl(h1 ^ k1, 13)
    return (h1 * 5 + 0xE6546B64) & _M32


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    return h1 ^ (h1 >> 16)


def spark_hash(group: str, shard: int, slot: int) -> int:
    """Spark SQL's `hash(group, shard, slot)` (Murmur3 x86_32, seed 42, a string then two
    ints; the string's tail bytes one by one, signed, as Spark's hashUnsafeBytes does), as
    a signed 32-bit int."""
    h = 42
    data = group.encode()
    aligned = len(data) - len(data) % 4
    for i in range(0, aligned, 4):
        h = _mix_h1(h, _mix_k1(int.from_bytes(data[i:i + 4], "little")))
    for byte in data[aligned:]:
        h = _mix_h1(h, _mix_k1((byte - 256 if byte > 127 else byte) & _M32))
    h = _fmix(h, len(data))
    for value in (shard, slot):
        h = _fmix(_mix_h1(h, _mix_k1(value & _M32)), 4)
    return h - (1 << 32) if h & 0x80000000 else h


CHECKPOINT_FORMAT = 1  # of the job's checkpoint: the state's keys and values, the carries
MANIFEST = "cep_job.json"


class CheckpointRefused(ValueError):
    """A checkpoint this job cannot go on from, and what to do."""


def source_name(source: KafkaSource | FileSource, reader: Reader = Reader.PYTHON) -> str:
    if isinstance(source, KafkaSource):
        return f"{'spark-kafka' if reader is Reader.SPARK else 'kafka'}:{source.topic}"
    return f"files:{source.path.rstrip('/')}"


def _manifest_path(checkpoint: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(checkpoint)
    return fs, root.rstrip("/")


def claim_checkpoint(checkpoint: str, stream: str, source: str, shards: int | None) -> int | None:
    """The shards of the job that `checkpoint` holds (None: a new checkpoint); refuses
    (CheckpointRefused) one made by another version of the job's layout, for another
    stream or source, or with other shards: Spark would start from offsets and state
    that mean something else, or fail on them with a message of its own."""
    import pyarrow.fs as pafs

    fs, root = _manifest_path(checkpoint)
    new = f"start a new checkpoint (another --checkpoint) to run {stream} from the source's " \
        "beginning"
    try:
        with fs.open_input_stream(f"{root}/{MANIFEST}") as f:
            data = f.read()
    except FileNotFoundError:
        spark = fs.get_file_info(f"{root}/spark/offsets")
        if spark.type != pafs.FileType.NotFound:
            raise CheckpointRefused(
                f"checkpoint {checkpoint} was made by an older version of cep spark stream "
                f"(no {MANIFEST}: state keys before the packed rows); this version cannot "
                f"go on from it: {new}, or finish it with the version that made it") from None
        return None
    try:
        manifest = orjson.loads(data)
        found = manifest["cep_spark_stream"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise CheckpointRefused(f"{checkpoint}/{MANIFEST} is not a cep spark stream "
                                f"checkpoint's manifest: {new}") from None
    if found != CHECKPOINT_FORMAT:
        raise CheckpointRefused(
            f"checkpoint {checkpoint} has format {found}, this version of cep spark stream "
            f"reads format {CHECKPOINT_FORMAT}: {new}, or finish it with the version that "
            "made it")
    if manifest.get("stream") != stream:
        raise CheckpointRefused(
            f"checkpoint {checkpoint} is a job of stream {manifest.get('stream')!r}; these "
            f"queries read {stream!r}: {new}")
    if manifest.get("source") != source:
        raise CheckpointRefused(
            f"checkpoint {checkpoint} read {manifest.get('source')}, not {source}: its "
            f"offsets mean nothing there; {new}")
    if shards is not None and manifest.get("shards") != shards:
        raise CheckpointRefused(
            f"checkpoint {checkpoint} has {manifest.get('shards')} shards per query group, "
            f"not {shards}: the state's keys would change and lose the queries' state; "
            f"leave --shards out (or give {manifest.get('shards')}), or {new}")
    return int(manifest["shards"])


def write_manifest(checkpoint: str, stream: str, source: str, shards: int) -> None:
    fs, root = _manifest_path(checkpoint)
    fs.create_dir(root, recursive=True)
    with fs.open_output_stream(f"{root}/{MANIFEST}.tmp") as f:
        f.write(orjson.dumps({"cep_spark_stream": CHECKPOINT_FORMAT, "stream": stream,
                              "source": source, "shards": shards}))
    fs.move(f"{root}/{MANIFEST}.tmp", f"{root}/{MANIFEST}")


def query_texts(file_text: str) -> dict[str, str]:
    """Each query's text in a query file, by name (what its fingerprint is taken of)."""
    from cep_service.stream.control import split_query_file

    return dict(split_query_file(file_text))


def start(spark: Any, queries: list[CheckedQuery], source: KafkaSource | FileSource,
          sink: Any, checkpoint: str, texts: dict[str, str], shards: int | None = None,
          trigger_s: float | None = None) -> Any:
    """Start the streaming query; returns Spark's StreamingQuery. `texts`: each query's
    text (`query_texts`): a query keeps its state across a restart while its text is
    the same. `shards`: state keys per keyed query group (default:
    spark.sql.shuffle.partitions); fixed by the first run of a checkpoint, like the
    shuffle partitions."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    streams = sorted({q.schema.stream for q in queries})
    if len(streams) != 1:
        raise ValueError(f"the queries read several streams ({', '.join(streams)}); a "
                         "streaming job takes one stream per query file")
    checkpoint = checkpoint.rstrip("/")
    reader = kafka_reader(spark, source) if isinstance(source, KafkaSource) else Reader.FILES
    name = source_name(source, reader)
    # a new checkpoint: the shards asked for, else the shuffle partitions
    shards = claim_checkpoint(checkpoint, streams[0], name, shards) or shards or \
        int(spark.conf.get("spark.sql.shuffle.partitions"))
    write_manifest(checkpoint, streams[0], name, shards)
    routes = balanced_slots(state_routes(queries, shards), shards)
    if reader is Reader.SPARK:
        assert isinstance(source, KafkaSource)  # (only a Kafka source has the SPARK reader)
        rows = _spark_kafka_rows(spark, queries, source, routes, checkpoint)
    else:
        rows = read_rows(spark, queries, source, checkpoint, routes)
    groups = plan(queries)
    runner = ShardRunner(checkpoint, {group_name(g.keys): list(g.queries) for g in groups},
                         str(kernel_cache_dir()),
                         fingerprints={q.name: fingerprint(texts[q.name]) for q in queries})
    # the source's rows are keyed already (one per state key and sequencer batch): no
    # routing in Spark, a shuffle of a few rows
    results = rows.groupBy(GROUP, SHARD, SLOT).applyInPandasWithState(
        runner, RESULTS_DDL, STATE_SCHEMA, "append", GroupStateTimeout.NoTimeout)
    writer = (results.writeStream.foreachBatch(sink)
              .option("checkpointLocation", f"{checkpoint}/spark")
              .queryName(f"cep-{streams[0]}"))
    if trigger_s:
        writer = writer.trigger(processingTime=f"{trigger_s} seconds")
    return writer.start()


