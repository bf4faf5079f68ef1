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

from dataclasses import dataclass

import orjson

from cep_core.checked import CheckedQuery
from cep_core.home import kernel_cache_dir
from services.backfill.plan import plan
from services.spark_stream.keyed_state import STATE_SCHEMA, ShardRunner, fingerprint
from services.spark_stream.packed import GROUP, RESULTS_DDL, SHARD, SLOT, Route, routes_option


@dataclass(frozen=True)
class KafkaSource:
    bootstrap: str
    topic: str
    max_records: int = 0  # per micro-batch; 0: all available


@dataclass(frozen=True)
class FileSource:
    path: str
    max_files: int = 0  # per micro-batch; 0: all available


def group_name(keys: tuple[str, ...]) -> str:
    """A query group's name in the state's keys: its PARTITION BY list (stable when
    queries are added or removed)."""
    return orjson.dumps(list(keys)).decode()


def register_sources(spark) -> None:
    from services.spark_stream.file_source import FileEventSource
    from services.spark_stream.kafka_source import KafkaEventSource

    spark.dataSource.register(KafkaEventSource)
    spark.dataSource.register(FileEventSource)


def read_rows(spark, queries: list[CheckedQuery], source, checkpoint: str,
              routes: list[Route]):
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


def balanced_slots(spark, routes: list[Route], partitions: int, tries: int = 256) -> list[Route]:
    """`routes` with a slot for each shard such that Spark's hash partitioning (a pmod of
    `hash(group, shard, slot)`, the state's key) puts the i-th state key in partition
    i mod `partitions`: shards in tasks of their own, not two in one by chance. Spark's
    own hash decides (one small job), so a restart with the same groups and shards finds
    the same slots, and the same state keys."""
    from pyspark.sql import functions as F

    keys = [(r.group, s) for r in routes for s in range(r.shards)]
    candidates = spark.createDataFrame([(g, s, slot) for g, s in keys for slot in range(tries)],
                                       f"{GROUP} string, {SHARD} int, {SLOT} int")
    found: dict[tuple, int] = {}
    for g, s, slot, p in candidates.select(
            GROUP, SHARD, SLOT, F.pmod(F.hash(GROUP, SHARD, SLOT), F.lit(partitions))).collect():
        found.setdefault((g, s, p), slot)  # the smallest slot landing in p
    target = {key: i % partitions for i, key in enumerate(keys)}
    return [Route(r.group, r.keys, r.shards, tuple(
        found.get((r.group, s, target[(r.group, s)]), 0) for s in range(r.shards)))
        for r in routes]


def query_texts(file_text: str) -> dict[str, str]:
    """Each query's text in a query file, by name (what its fingerprint is taken of)."""
    from services.stream.control import split_query_file

    return dict(split_query_file(file_text))


def start(spark, queries: list[CheckedQuery], source, sink, checkpoint: str,
          texts: dict[str, str], shards: int | None = None, trigger_s: float | None = None):
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
    shards = shards or int(spark.conf.get("spark.sql.shuffle.partitions"))
    checkpoint = checkpoint.rstrip("/")
    routes = balanced_slots(spark, state_routes(queries, shards), shards)
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


