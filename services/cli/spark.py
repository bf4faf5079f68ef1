"""`cep spark stream`: the queries as a Spark Structured Streaming job
(services/spark_stream/, docs/spark_streaming.md)."""


# Deferred imports: pyspark (the `spark` extra, may be missing) and the job's modules load when
# the command runs, not for every `cep` invocation.

import os
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from services.cli.common import (
    CliError,
    SchemaOption,
    guard,
    load_query_file,
    schema_registry,
    stderr,
)

spark_app = typer.Typer(help="Run queries on Spark (streaming; `cep backfill` for history).",
                        no_args_is_help=True)


@spark_app.command("stream")
def stream(
    query_file: Annotated[Path, typer.Argument(help="The query file.")],
    checkpoint: Annotated[str, typer.Option(
        metavar="DIR", help="The job's checkpoint (Spark's offsets, commits and state; the "
        "sequencer's carries): start again on it to go on where the job stopped.")],
    topic: Annotated[str | None, typer.Option(metavar="TOPIC", help="Read the stream from "
                                              "this Kafka topic.")] = None,
    input_dir: Annotated[str | None, typer.Option(
        "--input-dir", metavar="DIR", help="Read the stream from event files arriving in "
        "this directory (.jsonl, .csv, .parquet, in name order; NAME.end ends the input).")]
    = None,
    output: Annotated[str | None, typer.Option(
        "--output", "--out", "-o", metavar="DIR", help="Write composite events as Parquet "
        "files, one per micro-batch, under DIR/composites (dead letters under "
        "DIR/dead_letters).")] = None,
    to_kafka: Annotated[bool, typer.Option(
        "--to-kafka", help="Produce composite events to each query's INTO topic.")] = False,
    bootstrap: Annotated[str | None, typer.Option(metavar="HOST:PORT", help="Kafka bootstrap "
                                                  "servers (default: $KAFKA_BOOTSTRAP).")]
    = None,
    master: Annotated[str, typer.Option(metavar="URL", help="Spark master.")] = "local[*]",
    shards: Annotated[int | None, typer.Option(min=1, help="State keys per keyed query group "
                                               "(default: the cores Spark has); fixed by a "
                                               "checkpoint's first run.")] = None,
    trigger: Annotated[float | None, typer.Option(
        metavar="SECONDS", help="Start a micro-batch every SECONDS (default: as soon as the "
        "last one ended).")] = None,
    max_records: Annotated[int, typer.Option(min=0, metavar="N", help="Kafka records per "
                                             "micro-batch (0: all there are).")] = 0,
    max_files: Annotated[int, typer.Option(min=0, metavar="N", help="Files per micro-batch "
                                           "(0: all there are).")] = 0,
    once: Annotated[bool, typer.Option("--once", help="Process what the source holds now, "
                                       "then stop (default: run until stopped).")] = False,
    schema: SchemaOption = None,
) -> None:
    """Run the queries as a Spark Structured Streaming job, until Ctrl-C (or --once)."""

    def body():
        from services.extras import require

        require("pyspark", "spark", "cep spark stream")
        from services.backfill.job import spark_session
        from services.spark_stream.job import FileSource, KafkaSource, query_texts, start
        from services.spark_stream.sinks import FileSink, KafkaSink

        if (topic is None) == (input_dir is None):
            raise CliError("give one source: --topic or --input-dir", 2)
        if (output is None) == (not to_kafka):
            raise CliError("give one output: --output or --to-kafka", 2)
        broker = bootstrap or os.environ.get("KAFKA_BOOTSTRAP")
        if (topic or to_kafka) and not broker:
            raise CliError("Kafka needs a broker: pass --bootstrap or set KAFKA_BOOTSTRAP", 2)
        queries = load_query_file(query_file, schema_registry(schema))
        source = KafkaSource(broker, topic, max_records) if topic else \
            FileSource(input_dir, max_files)
        sink = KafkaSink(broker, {q.name: q.query.output for q in queries}) if to_kafka \
            else FileSink(output)
        spark = spark_session(master, shuffle_partitions=shards, app_name="cep-stream")
        try:
            job = start(spark, queries, source, sink, checkpoint,
                        query_texts(query_file.read_text()), shards, trigger)
        except ValueError as e:
            raise CliError(str(e)) from None
        stderr.print(f"streaming {queries[0].schema.stream} (checkpoint {checkpoint}); "
                     "Ctrl-C stops", markup=False, style="dim")
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: job.stop())
        try:
            if once:
                job.processAllAvailable()
                job.stop()
            job.awaitTermination()
        except KeyboardInterrupt:
            job.stop()
        progress = job.lastProgress or {}
        stderr.print(f"stopped after micro-batch {progress.get('batchId', '-')}", markup=False)

    guard(body)
