"""The Spark backfill: run queries over history (Parquet, JSON lines, CSV) at scale.

    decode (Arrow tasks, cep_core's decoders) -> seq check -> per query group:
    repartition by the group's keys -> sort by seq within partitions -> mapInArrow(engines)
    -> composite events (Parquet) + dead letters (Parquet) [-> Kafka]

or, for inputs pyarrow opens and few partitions (`scan.py`): per query group, engine tasks
that each read the whole input with `cep run`'s reader and keep their keys (no shuffle).

Which queries may be split by key is decided in `plan.py`; input decoding in `ingest.py`
and `parquet.py`; the engine task in `engines.py`; output layout and readers in
`output.py`. The output equals `cep run` (reference or jit) on the same input.
"""

from __future__ import annotations

# Deferred imports: pyspark (the `spark` extra, may be missing) loads when a session starts, and
# Kafka (confluent_kafka) only when results are produced to a topic.

import os
import sys
import time
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from cep_core.checked import CheckedQuery
from cep_core.home import kernel_cache_dir
from cep_service.backfill.engines import (
    COMPOSITE,
    RESULT_SCHEMA,
    PartitionRunner,
    RejectedRows,
    map_in_arrow,
    unique_rejected,
)
from cep_service.backfill.ingest import accept, list_inputs, read_decoded
from cep_service.backfill.output import read_composites
from cep_service.backfill.parquet import BAD, GOOD, SplitCounts, parquet_input
from cep_service.backfill.plan import describe, plan
from cep_service.backfill.progress import SparkProgress
from cep_service.backfill.scan import (
    AUTO,
    BAD_ROWS,
    GOOD_ROWS,
    SHUFFLE,
    ScanInput,
    scan_frame,
    scan_input,
    use_scan,
)

ARROW_BATCH_ROWS = 65_536
DEAD_LETTER_SCHEMA = ("stage int, query_index int, source string, line long, position long, "
                      "reason string, raw string")


@dataclass
class BackfillResult:
    events: int  # good events run through the queries
    dead_letters: int  # bad input records plus events an engine rejected
    composites: int
    seconds: float
    plan: list[str] = field(default_factory=list)
    exchange: str = "shuffle"  # how keyed groups got their events: "shuffle" or "scan"

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        return (f"backfill: {self.events:,} events ({self.dead_letters:,} dead letters), "
                f"{self.composites:,} composite events in {self.seconds:.2f}s "
                f"({self.events_per_second:,.0f} events/s)")


def spark_session(master: str = "local[*]", shuffle_partitions: int | None = None,
                  app_name: str = "cep-backfill", **conf: Any) -> Any:
    """A SparkSession for backfills: UI off, case-sensitive names (attributes may differ
    only in case), Python workers on this interpreter with this process's kernel cache.
    `shuffle_partitions` (the partitions of each keyed group): default, the cores Spark
    has (`defaultParallelism`), one engine task per core."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 8))
               .config("spark.sql.caseSensitive", "true")
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(ARROW_BATCH_ROWS))
               .config("spark.executorEnv.CEP_KERNEL_CACHE", str(kernel_cache_dir())))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if shuffle_partitions is None:
        spark.conf.set("spark.sql.shuffle.partitions",
                       str(spark.sparkContext.defaultParallelism))
    return spark


def run_backfill(spark: Any, queries: list[CheckedQuery], inputs: list[str], output: str,
                 dead_letters: str | None = None, partitions: int | None = None,
                 console: Any = None, to_kafka: str | None = None,
                 bootstrap: str | None = None, exchange: str = AUTO) -> BackfillResult:
    """Run `queries` (one stream) over the input files; write composite events to `output`
    and dead letters to `dead_letters` (default: `<output>_dead_letters`), both Parquet.
    `partitions`: Spark partitions of each keyed group (default: shuffle partitions).
    `exchange`: how engine tasks get their keys' events: "shuffle" (Spark's repartition
    and sort), "scan" (each task scans the input, `scan.py`) or "auto"."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    streams = sorted({q.schema.stream for q in queries})
    if len(streams) != 1:
        raise ValueError(f"the queries read several streams ({', '.join(streams)}); a "
                         "backfill takes one stream per query file")
    schema = queries[0].schema
    dead_letters = dead_letters or f"{output.rstrip('/')}_dead_letters"
    partitions = partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
    started = time.perf_counter()
    rows = spark.sparkContext.accumulator(0)
    rejected_rows = spark.sparkContext.accumulator([], RejectedRows())
    bad_splits = spark.sparkContext.accumulator({}, SplitCounts())
    groups = plan(queries)

    def job() -> BackfillResult:
        files = list_inputs(spark, inputs)
        source = scan_input(files) if exchange != SHUFFLE else None
        scan = use_scan(exchange, source, partitions)
        if console is not None:
            console.print("exchange: " + (f"scan (each of {partitions} engine tasks of a keyed "
                                          "group reads the whole input)" if scan else
                                          "shuffle (repartition by key, sort by seq)"),
                          markup=False, style="dim")
            if not scan and (schema.ahead_bound is not None or
                             schema.ahead_of_clock_bound is not None):
                console.print("note: the shuffle exchange does not refuse events too far "
                              "ahead of the stream's time as cep run does (max_ahead, "
                              "docs/backfill.md); --exchange scan does", markup=False,
                              style="yellow")
        out_dir = _pyarrow_directory(output)  # tasks write there, or Spark does
        result_schema = "composites long" if out_dir else RESULT_SCHEMA
        if scan:
            assert source is not None, "use_scan is true only with a source"
            return _scan_job(spark, source, schema, groups, partitions, out_dir,
                             result_schema, output, dead_letters, rows, rejected_rows)
        direct = parquet_input(spark, files)
        cached = None
        if direct is not None and direct.splits_ordered:  # every dead letter found in tasks
            good = direct.frame(spark, schema, GOOD, bad_counts=bad_splits)
        else:
            cached = (direct.frame(spark, schema) if direct is not None
                      else read_decoded(spark, files, schema))
            cached = cached.persist(StorageLevel.MEMORY_AND_DISK)  # the seq check and the
            decoded = accept(cached)                                # rest read it
            good = decoded.where(F.col("_error").isNull()).select("seq", *schema.attributes)
        results = []
        for g, group in enumerate(groups):
            keyed = (good.repartition(partitions, *group.keys) if group.keys
                     else good.repartition(1))
            runner = PartitionRunner(list(group.queries), str(kernel_cache_dir()), rows,
                                     rejected=rejected_rows, output=out_dir, group=g)
            results.append(map_in_arrow(keyed.sortWithinPartitions("seq"), runner,
                                        result_schema))
        n_composites = _composites_written(spark, results, out_dir, output)
        rejected_list = _rejected_list(rejected_rows)
        bad_ids = [split for split, count in bad_splits.value.items() if count]
        if cached is None and not bad_ids and _write_dead_letters(rejected_list, dead_letters):
            pass  # no bad input record: the driver wrote the engines' rejections
        else:
            if cached is None:  # decode again only the splits that have dead letters
                assert direct is not None  # (cached is None only for direct input)
                decoded = direct.frame(spark, schema, BAD, split_ids=bad_ids)
            bad_input = decoded.where(F.col("_error").isNotNull()).select(
                F.lit(0).alias("stage"), F.lit(None).cast("int").alias("query_index"),
                F.element_at(F.array(*[F.lit(f.source) for f in files]), F.col("_file") + 1)
                .alias("source"), F.col("_line").alias("line"),
                F.col("_position").alias("position"), F.col("_error").alias("reason"),
                F.col("_raw").alias("raw"))
            rejected = spark.createDataFrame(rejected_list, DEAD_LETTER_SCHEMA)
            bad_input.unionByName(rejected).coalesce(1).write.mode("overwrite") \
                .parquet(dead_letters)
        n_rejected = len(rejected_list)
        if cached is None:
            assert direct is not None
            n_bad = sum(bad_splits.value.values())
            n_good = direct.rows - n_bad
        else:
            good_or_bad = {row["good"]: row["count"] for row in decoded.groupBy(
                F.col("_error").isNull().alias("good")).count().collect()}
            n_good, n_bad = good_or_bad.get(True, 0), good_or_bad.get(False, 0)
            cached.unpersist()
        return BackfillResult(n_good, n_bad + n_rejected, n_composites, 0.0,
                              describe(groups), "shuffle")

    if console is not None:
        for line in describe(groups):
            console.print(f"plan: {line}", markup=False, style="dim")
        with SparkProgress(spark, console, rows):
            result = job()
    else:
        result = job()
    if to_kafka:
        produce_to_kafka(output, to_kafka, bootstrap)
    result.seconds = time.perf_counter() - started
    return result


def _scan_job(spark: Any, source: ScanInput, schema: Any, groups: Any, partitions: int,
              out_dir: str | None, result_schema: str, output: str, dead_letters: str,
              rows: Any, rejected_rows: Any) -> BackfillResult:
    """The job with the scan exchange (`scan.py`): one Spark stage of engine tasks; the
    first task of the first group reports the input's counts and dead letters."""
    counts = spark.sparkContext.accumulator({}, SplitCounts())
    input_dead = spark.sparkContext.accumulator({}, SplitCounts())  # position -> row
    results = []
    for g, group in enumerate(groups):
        runner = PartitionRunner(list(group.queries), str(kernel_cache_dir()), rows,
                                 rejected=rejected_rows, output=out_dir, group=g)
        results.append(scan_frame(spark, source, schema, group.keys, partitions, runner,
                                  result_schema,
                                  report=(counts, input_dead) if g == 0 else None))
    n_composites = _composites_written(spark, results, out_dir, output)
    rejected_list = _rejected_list(rejected_rows)
    letters = [input_dead.value[p] for p in sorted(input_dead.value)] + rejected_list
    if not _write_dead_letters(letters, dead_letters):
        spark.createDataFrame(letters, DEAD_LETTER_SCHEMA).coalesce(1).write \
            .mode("overwrite").parquet(dead_letters)
    return BackfillResult(counts.value.get(GOOD_ROWS, 0),
                          counts.value.get(BAD_ROWS, 0) + len(rejected_list), n_composites,
                          0.0, describe(groups), "scan")


def _composites_written(spark: Any, results: list[Any], out_dir: str | None, output: str) -> int:
    """Runs the engine tasks (`results`: their DataFrames); the composite events are then
    in `output`: written by the tasks (they return counts) or here by Spark's writer."""
    from pyspark.sql import functions as F

    found = reduce(lambda a, b: a.unionByName(b), results)  # composite events only
    if out_dir:
        return sum(row[0] for row in found.collect())
    (found.where(F.col("kind") == COMPOSITE)
     .select("query", "query_index", "key", "seq", "start_seq", F.col("body").alias("composite"))
     .write.mode("overwrite").parquet(output))
    return spark.read.parquet(output).count()  # from the Parquet footers


def _rejected_list(rejected_rows: Any) -> list[tuple[Any, ...]]:
    """The events the engines rejected, as dead-letter rows (DEAD_LETTER_SCHEMA)."""
    return [(1, index, f"query {name}", None, seq, reason, raw)
            for index, name, seq, reason, raw in unique_rejected(rejected_rows.value)]


def _pyarrow_directory(output: str) -> str | None:
    """`output` emptied and made, as a URI pyarrow opens in the tasks; None where pyarrow
    cannot open it (Spark's writer then writes it)."""
    uri = output if "://" in output or output.startswith("file:") else os.path.abspath(output)
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
        if fs.get_file_info(path).type != pafs.FileType.NotFound:
            fs.delete_dir(path)
        fs.create_dir(path)
    except (OSError, ValueError):
        return None
    return uri


def _write_dead_letters(rows: list[tuple], dead_letters: str) -> bool:
    """`rows` (DEAD_LETTER_SCHEMA) as the one file of the dead-letters directory, written
    by pyarrow here; False where pyarrow cannot open it."""
    directory = _pyarrow_directory(dead_letters)
    if directory is None:
        return False
    schema = pa.schema([("stage", pa.int32()), ("query_index", pa.int32()),
                        ("source", pa.string()), ("line", pa.int64()),
                        ("position", pa.int64()), ("reason", pa.string()),
                        ("raw", pa.string())])
    fs, path = pa.fs.FileSystem.from_uri(directory)
    table = pa.Table.from_pylist([dict(zip(schema.names, row)) for row in rows], schema)
    with fs.open_output_stream(f"{path}/part-00000.parquet") as out:
        pq.write_table(table, out)
    return True


def produce_to_kafka(output: str, topic: str, bootstrap: str | None) -> int:
    """Produce the composite events of a backfill output to `topic`, in output order: one
    JSON per message, the partition key as JSON for the message key."""
    bootstrap = bootstrap or os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise ValueError("--to-kafka needs a broker: pass --bootstrap or set KAFKA_BOOTSTRAP")
    from cep_service.stream.kafka import KafkaSettings  # CEP_KAFKA_* security settings too

    producer = KafkaSettings.from_env(bootstrap).producer(**{"enable.idempotence": True})
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    composites = read_composites(output)
    for composite in composites:
        value, key = orjson.dumps(composite), orjson.dumps(composite.get("key"))
        while True:
            try:
                producer.produce(topic, value, key=key, on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(30)
    if errors or remaining:
        raise RuntimeError(f"producing to {topic} failed: "
                           f"{errors[0] if errors else f'{remaining} messages undelivered'}")
    return len(composites)
