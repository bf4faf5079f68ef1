"""`cep spark stream`: the queries as a Spark Structured Streaming job
(services/spark_stream/, docs/spark_streaming.md)."""


# Deferred imports: pyspark (the `spark` extra, may be missing) and the job's modules load when
# the command runs, not for every `cep` invocation.

import os
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cep_service.cli.common import (
    CliError,
    SchemaOption,
    guard,
    load_query_file,
    schema_registry,
    stderr,
)

if TYPE_CHECKING:
    from cep_core.checked import CheckedQuery

spark_app = typer.Typer(help="Run queries on Spark (streaming; `cep backfill` for history).",
                        no_args_is_help=True)


@spark_app.command("stream")
def stream(
    checkpoint: Annotated[str, typer.Option(
        metavar="DIR", help="The job's checkpoint (Spark's offsets, commits and state; the "
        "sequencer's carries): start again on it to go on where the job stopped.")],
    query_file: Annotated[Path | None, typer.Argument(
        help="The query file (read again when it changes: queries added, removed or "
        "changed take effect between micro-batches).")] = None,
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
    control: Annotated[str | None, typer.Option(
        metavar="TOPIC", help="Also run the stream's live queries of this control topic (the "
        "service's, e.g. cep.queries), following its changes between micro-batches.")]
    = None,
    stream_name: Annotated[str | None, typer.Option(
        "--stream", metavar="NAME", help="The stream (without a query file: its queries "
        "come from --control).")] = None,
    schema: SchemaOption = None,
) -> None:
    """Run the queries as a Spark Structured Streaming job, until Ctrl-C (or --once)."""

    def body() -> None:
        from cep_service.extras import require

        require("pyspark", "spark", "cep spark stream")
        from cep_service.backfill.job import spark_session
        from cep_service.spark_stream.job import FileSource, KafkaSource, session_conf, start
        from cep_service.spark_stream.live import LiveJob, NoQueries, QueryWatch
        from cep_service.spark_stream.sinks import FileSink, KafkaSink
        from cep_service.stream.kafka import KafkaSettings

        if (topic is None) == (input_dir is None):
            raise CliError("give one source: --topic or --input-dir", 2)
        if (output is None) == (not to_kafka):
            raise CliError("give one output: --output or --to-kafka", 2)
        broker = bootstrap or os.environ.get("KAFKA_BOOTSTRAP")
        if (topic or to_kafka) and not broker:
            raise CliError("Kafka needs a broker: pass --bootstrap or set KAFKA_BOOTSTRAP", 2)
        if query_file is None and control is None:
            raise CliError("give a query file, or --control (with --stream)", 2)
        if control and not broker:
            raise CliError("--control needs a broker: pass --bootstrap or set "
                           "KAFKA_BOOTSTRAP", 2)
        registry = schema_registry(schema)
        if query_file is not None:
            load_query_file(query_file, registry)  # located errors before Spark starts
        try:
            watch = QueryWatch(registry, query_file, (KafkaSettings.from_env(broker), control)
                               if control else None, stream_name,
                               log=lambda line: stderr.print(line, markup=False))
        except (NoQueries, ValueError) as e:
            raise CliError(str(e)) from None
        source: KafkaSource | FileSource
        if topic:
            assert broker is not None  # a topic without a broker was refused above
            source = KafkaSource(broker, topic, max_records)
        else:
            assert input_dir is not None  # no source at all was refused above
            source = FileSource(input_dir, max_files)
        spark = spark_session(master, shuffle_partitions=shards, app_name="cep-stream",
                              **session_conf())

        def start_job(queries: "list[CheckedQuery]", texts: dict[str, str]) -> Any:
            sink: KafkaSink | FileSink
            if to_kafka:
                assert broker is not None  # --to-kafka without a broker was refused above
                sink = KafkaSink(broker, {q.name: q.query.output for q in queries})
            else:
                assert output is not None  # no output at all was refused above
                sink = FileSink(output)
            return start(spark, queries, source, sink, checkpoint, texts, shards, trigger)

        live = LiveJob(watch, checkpoint, start_job,
                       log=lambda line: stderr.print(line, markup=False))
        try:
            live.start()
        except (NoQueries, ValueError) as e:
            raise CliError(str(e)) from None
        stderr.print(f"streaming {watch.stream} (checkpoint {checkpoint}); Ctrl-C stops",
                     markup=False, style="dim")
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: live.job.stop())
        try:
            live.run(once=once)
        except KeyboardInterrupt:
            pass
        finally:
            live.stop()
        progress = live.job.lastProgress or {}
        stderr.print(f"stopped after micro-batch {progress.get('batchId', '-')}"
                     + (f" ({live.restarts} restarts for query changes)" if live.restarts
                        else ""), markup=False)

    guard(body)
