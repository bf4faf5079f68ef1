"""The same queries as a Spark Structured Streaming job (`cep spark stream`):

    source (cep_kafka: Kafka over confluent-kafka | cep_files: a directory of event files)
      -> the sequencer, one task per micro-batch (sequencer.py): seqs, dead letters, ends
      -> every event routed to one shard of each query group (plan.py; hash of the
         PARTITION BY keys), ends to every shard, dead letters to their own key
      -> groupBy(group, shard).applyInPandasWithState(ShardRunner): the cep_core engines,
         their snapshot in Spark's state store (keyed_state.py)
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
from services.backfill.engines import RESULT_SCHEMA
from services.backfill.plan import plan
from services.spark_stream.keyed_state import DEAD_GROUP, STATE_SCHEMA, ShardRunner, fingerprint
from services.spark_stream.sequencer import END, EVENT, KIND

GROUP, SHARD = "__cep_group", "__cep_shard"


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


def read_rows(spark, queries: list[CheckedQuery], source, checkpoint: str):
    """The sequencer's rows (kind, seq, the attributes, dead) as a streaming DataFrame."""
    register_sources(spark)
    reader = (spark.readStream.option("schema", orjson.dumps(queries[0].schema.to_dict()).decode())
              .option("checkpoint", checkpoint))
    if isinstance(source, KafkaSource):
        return (reader.format("cep_kafka").option("bootstrap", source.bootstrap)
                .option("topic", source.topic)
                .option("max_records", str(source.max_records)).load())
    return (reader.format("cep_files").option("path", source.path)
            .option("max_files", str(source.max_files)).load())


def routes(queries: list[CheckedQuery], shards: int) -> dict[str, int]:
    """Each query group's name and its number of shards."""
    return {group_name(g.keys): shards if g.keys else 1 for g in plan(queries)}


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
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    streams = sorted({q.schema.stream for q in queries})
    if len(streams) != 1:
        raise ValueError(f"the queries read several streams ({', '.join(streams)}); a "
                         "streaming job takes one stream per query file")
    shards = shards or int(spark.conf.get("spark.sql.shuffle.partitions"))
    checkpoint = checkpoint.rstrip("/")
    rows = read_rows(spark, queries, source, checkpoint)
    groups = plan(queries)

    def route(group: str, shard):
        return F.struct(F.lit(group).alias("g"), shard.cast("int").alias("s"))

    event_routes = F.array(*[route(group_name(g.keys), F.pmod(F.hash(*[
        F.col(f"`{k}`") for k in g.keys]), F.lit(shards)) if g.keys else F.lit(0))
        for g in groups])
    every_route = F.array(*[route(name, F.lit(s)) for name, n in routes(queries, shards).items()
                            for s in range(n)])
    kind = F.col(KIND)
    routed = (rows.withColumn("__route", F.explode(
        F.when(kind == EVENT, event_routes).when(kind == END, every_route)
        .otherwise(F.array(route(DEAD_GROUP, F.lit(0))))))
        .select(F.col("__route.g").alias(GROUP), F.col("__route.s").alias(SHARD),
                *[F.col(f"`{c}`") for c in rows.columns]))
    runner = ShardRunner(checkpoint, {group_name(g.keys): list(g.queries) for g in groups},
                         str(kernel_cache_dir()), drop=[GROUP, SHARD],
                         fingerprints={q.name: fingerprint(texts[q.name]) for q in queries})
    results = routed.groupBy(GROUP, SHARD).applyInPandasWithState(
        runner, RESULT_SCHEMA, STATE_SCHEMA, "append", GroupStateTimeout.NoTimeout)
    writer = (results.writeStream.foreachBatch(sink)
              .option("checkpointLocation", f"{checkpoint}/spark")
              .queryName(f"cep-{streams[0]}"))
    if trigger_s:
        writer = writer.trigger(processingTime=f"{trigger_s} seconds")
    return writer.start()


