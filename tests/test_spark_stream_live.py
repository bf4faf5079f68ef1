"""The Spark streaming job's queries changing while it runs (services/spark_stream/live.py):
a query added on the control topic and one removed from the query file mid-stream; the
unchanged query's output is that of an uninterrupted run, the removed one's stops where
the change holds from, the added one's is `cep run`'s over the events from there. And
checkpoints the job refuses: another version's, another stream's or source's, other
shards.

Waits are on the job's own progress (`processAllAvailable`, the control records polled),
never on the clock.
"""

from __future__ import annotations

import uuid

import orjson
import pytest

pytest.importorskip("pyspark")

from cep_core.checker import load_query_text  # noqa: E402
from cep_core.control_message import ControlMessage  # noqa: E402
from cep_core.schema import SchemaRegistry  # noqa: E402
from cep_service.backfill.output import first_difference, read_composites  # noqa: E402
from cep_service.spark_stream.job import (  # noqa: E402
                                          CheckpointRefused,
                                          FileSource,
                                          claim_checkpoint,
                                          start,
                                          write_manifest,
                                          )
from cep_service.spark_stream.live import LiveJob, QueryWatch, read_changes  # noqa: E402
from cep_service.spark_stream.sinks import FileSink  # noqa: E402
from test_spark_stream import EXAMPLES, event_files, example, reference  # noqa: E402

BIG = ("QUERY big FROM trades PARTITION BY symbol PATTERN ( . up+ ) "
       "DEFINE up AS price > Last(price) EMIT n = Count();")


def test_queries_change_while_the_job_runs(spark, kafka_bootstrap, tmp_path):
    from cep_service.stream.control import publish
    from cep_service.stream.kafka import KafkaSettings, ensure_topics

    queries, lines, texts = example("finance")
    names = [q.name for q in queries]
    assert names == ["mshape", "activity"], names
    settings = KafkaSettings.from_env(kafka_bootstrap)
    control = f"control_{uuid.uuid4().hex[:8]}"
    ensure_topics(settings, {control: 1})
    query_file = tmp_path / "finance.cep"
    query_file.write_text((EXAMPLES / "finance.cep").read_text())
    inputs, checkpoint, out = tmp_path / "in", str(tmp_path / "ck"), tmp_path / "out"
    event_files(inputs, lines[:600], per_file=200, end=False)  # three micro-batches

    watch = QueryWatch(SchemaRegistry(), query_file, (settings, control))
    live = LiveJob(watch, checkpoint, lambda qs, ts: start(
        spark, qs, FileSource(str(inputs), max_files=1), FileSink(str(out)), checkpoint, ts))
    live.start()
    try:
        live.job.processAllAvailable()
        publish(settings, control, ControlMessage("add", "big", BIG))
        kept = "\n\n".join(t for n, t in texts.items() if n != "mshape")
        query_file.write_text(kept + "\n")
        while set(live.running.texts) != {"activity", "big"}:  # the changes taken
            assert live.job.isActive
            live.check(0.2)
        for i in range(600, len(lines), 200):  # the rest of the stream, after the change
            (inputs / f".{i:08d}.jsonl").write_bytes(b"".join(lines[i:i + 200]))
            (inputs / f".{i:08d}.jsonl").rename(inputs / f"{i:08d}.jsonl")
        (inputs / "99999999.end").write_bytes(b"")
        live.job.processAllAvailable()
    finally:
        live.stop()
    assert live.job.exception() is None
    changes = read_changes(checkpoint)
    assert 1 <= len(changes) <= 2 and changes[0]["at"] == 600, changes
    assert sorted(n for c in changes for n in c["added"]) == ["big"]
    assert sorted(n for c in changes for n in c["removed"]) == ["mshape"]
    got = read_composites(str(out / "composites"))
    want = reference(queries, lines, tmp_path)
    assert first_difference({"cep run": [c for c in want if c["query"] == "activity"],
                             "spark": [c for c in got if c["query"] == "activity"]}) is None
    assert [c for c in got if c["query"] == "mshape"] == \
        [c for c in want if c["query"] == "mshape" and c["seq"] < 600]
    added = reference(watch.current().queries[-1:], lines[600:], tmp_path)
    assert added
    shifted = [{**c, "seq": c["seq"] - 600, "start_seq": c["start_seq"] - 600}
               for c in got if c["query"] == "big"]
    assert first_difference({"cep run": added, "spark": shifted}) is None


def test_foreign_and_old_checkpoints_refused(spark, tmp_path):
    """A checkpoint of an older layout (no manifest), another format, another stream or
    source, or other shards: refused before Spark starts, with what to do."""
    queries, _, texts = example("finance")
    source = FileSource(str(tmp_path / "in"))

    def refused(checkpoint, **options) -> str:
        with pytest.raises(CheckpointRefused) as e:
            start(spark, queries, source, FileSink(str(tmp_path / "out")), str(checkpoint),
                  texts, **options)
        return str(e.value)

    old = tmp_path / "old"
    (old / "spark" / "offsets").mkdir(parents=True)
    (old / "spark" / "offsets" / "0").write_text("v1\n{}\n{\"last\":\"a\"}\n")
    assert "older version" in refused(old) and "new checkpoint" in refused(old)

    other = tmp_path / "other"
    write_manifest(str(other), "trades", f"files:{tmp_path / 'in'}", 2)
    manifest = other / "cep_job.json"
    data = orjson.loads(manifest.read_bytes())
    manifest.write_bytes(orjson.dumps({**data, "cep_spark_stream": 99}))
    assert "format 99" in refused(other)
    manifest.write_bytes(orjson.dumps({**data, "stream": "bids"}))
    assert "stream 'bids'" in refused(other)
    manifest.write_bytes(orjson.dumps({**data, "source": "kafka:trades"}))
    assert "read kafka:trades" in refused(other)
    manifest.write_bytes(orjson.dumps(data))
    assert "2 shards" in refused(other, shards=3)
    manifest.write_bytes(b"{not json")
    assert "manifest" in refused(other)
    manifest.write_bytes(orjson.dumps(data))
    assert claim_checkpoint(str(other), "trades", f"files:{tmp_path / 'in'}", None) == 2
    assert claim_checkpoint(str(tmp_path / "new"), "trades", "files:x", None) is None

    # a new checkpoint takes the shards asked for, not the shuffle partitions
    shards = int(spark.conf.get("spark.sql.shuffle.partitions")) + 1
    (tmp_path / "in").mkdir(exist_ok=True)
    start(spark, queries, source, FileSink(str(tmp_path / "out")), str(tmp_path / "fresh"),
          texts, shards=shards).stop()
    assert orjson.loads((tmp_path / "fresh" / "cep_job.json").read_bytes())["shards"] == shards


def test_kafka_connector_detected_or_the_python_source(spark):
    """Spark's own Kafka source where its connector's class loads (not on this machine:
    the job falls back to its Python source), else cep_kafka; a wrong choice refused."""
    from cep_service.spark_stream.job import KafkaSource, kafka_reader
    from cep_service.spark_stream.spark_kafka import connector_available

    assert connector_available(spark, "org.apache.spark.sql.SparkSession")
    assert not connector_available(spark, "org.example.NoSuchConnector")
    here = connector_available(spark)
    assert kafka_reader(spark, KafkaSource("b:9092", "t")) == ("spark" if here else "python")
    assert kafka_reader(spark, KafkaSource("b:9092", "t", reader="python")) == "python"
    with pytest.raises(ValueError, match="unknown Kafka reader"):
        kafka_reader(spark, KafkaSource("b:9092", "t", reader="jvm"))


def test_path_for_sparks_kafka_source(spark, kafka_bootstrap, tmp_path, monkeypatch):
    """The job's path for Spark's own Kafka source (the sequencer a stateful step, its
    carry in Spark's state) over the same columns from `cep_kafka_records`: a 3-partition
    topic, 300 records per micro-batch, the composite events of `cep run` over the records
    in the job's logged order."""
    from test_spark_stream import _finance, _produce, _written, logged_order

    from cep_service.spark_stream import spark_kafka
    from cep_service.spark_stream.job import KafkaSource, register_sources
    from cep_service.spark_stream.sinks import KafkaSink
    from cep_service.stream.kafka import KafkaSettings, ensure_topics

    def records(spark, bootstrap, topic, max_records):
        register_sources(spark)
        return (spark.readStream.format("cep_kafka_records").option("bootstrap", bootstrap)
                .option("topic", topic).option("checkpoint", str(tmp_path / "raw"))
                .option("max_records", str(max_records)).load())

    monkeypatch.setattr(spark_kafka, "kafka_records", records)
    # Deliberately like tests/test_spark_stream.py's test_several_source_partitions: each test
    # states its topic, records and checks in full; this one reads through Spark's own Kafka
    # source and checks its checkpoint too.
    settings = KafkaSettings.from_env(kafka_bootstrap)
    tag = uuid.uuid4().hex[:8]
    queries, texts = _finance(tag)
    ensure_topics(settings, {f"trades_{tag}": 3, f"tops_{tag}": 1, f"stats_{tag}": 1})
    _, lines, _ = example("finance")
    _produce(settings, f"trades_{tag}", lines,
             [orjson.dumps(orjson.loads(line)["symbol"]) for line in lines])
    checkpoint = tmp_path / "checkpoint"
    job = start(spark, queries, KafkaSource(kafka_bootstrap, f"trades_{tag}", max_records=300,
                                            reader="spark"),
                KafkaSink(kafka_bootstrap, {q.name: q.query.output for q in queries}),
                str(checkpoint), texts)
    try:
        job.processAllAvailable()
    finally:
        job.stop()
    assert orjson.loads((checkpoint / "cep_job.json").read_bytes())["source"] == \
        f"spark-kafka:trades_{tag}"
    order = logged_order(settings, f"trades_{tag}", checkpoint)
    assert sorted(order) == sorted(lines)
    assert len(list((checkpoint / "spark" / "commits").glob("[0-9]*"))) >= 4
    assert first_difference({"cep run": reference(queries, order, tmp_path),
                             "spark": _written(settings, queries)}) is None


def test_file_larger_than_a_read_block(tmp_path):
    """A JSON lines file over `cep run`'s 4 MiB read block (50,000 events): every event
    read (pyarrow's files have no readline, which the reader needs past a block's end)."""
    from cep_core.workloads import WORKLOADS, write_events
    from cep_service.spark_stream.file_source import FileStep, FileStepReader
    from cep_service.spark_stream.sequencer import EVENT, KIND, Carry, CarryStore

    workload = WORKLOADS["finance0"]
    table = workload.generate(50_000, 1)
    (tmp_path / "in").mkdir()
    path = write_events(table, tmp_path / "in" / "0001.jsonl")
    assert path.stat().st_size > 4 << 20
    queries = load_query_text(workload.query_text(seed=1))
    options = {"path": str(tmp_path / "in"), "checkpoint": str(tmp_path / "ck"),
               "schema": orjson.dumps(queries[0].schema.to_dict()).decode()}
    CarryStore(options["checkpoint"]).put({"last": ""}, Carry())
    reader = FileStepReader(options)
    rows = list(reader._rows(FileStep({"last": ""}, {"last": path.name}, [path.name])))
    assert sum(b.column(KIND).to_pylist().count(EVENT) for b in rows) == 50_000


def test_cli_refusals_before_spark_starts(tmp_path):
    """`cep spark stream` without queries, or --control without a broker: a clear error
    and exit 2, before any Spark session."""
    from typer.testing import CliRunner

    from cep_service.cli.main import app

    runner = CliRunner()
    base = ["spark", "stream", "--input-dir", str(tmp_path), "--output", str(tmp_path / "o"),
            "--checkpoint", str(tmp_path / "ck")]
    result = runner.invoke(app, base)
    assert result.exit_code == 2 and "give a query file, or --control" in result.output
    env = {"KAFKA_BOOTSTRAP": ""}
    result = runner.invoke(app, [*base, "--control", "cep.queries", "--stream", "trades"],
                           env=env)
    assert result.exit_code == 2 and "--control needs a broker" in result.output
    assert not (tmp_path / "ck").exists()


def test_slots_hash_as_spark_does(spark):
    """The state keys' slots are found with Spark's hash computed in Python (no Spark job at
    a start): the same value as Spark's `hash` for strings of every tail length, non-ASCII
    ones, negative and large ints."""
    from pyspark.sql import functions as F

    from cep_service.spark_stream.job import spark_hash

    groups = ['["symbol"]', "[]", "", "a", "ab", "abc", "abcd", "héllo wörld!", '["a","b"]',
              "!dead", "ÿ"]
    rows = [(g, s, t) for g in groups for s in (0, 1, 7, -3) for t in (0, 1, 255, 70000)]
    frame = spark.createDataFrame(rows, "g string, s int, t int")
    for g, s, t, h in frame.select("g", "s", "t", F.hash("g", "s", "t")).collect():
        assert spark_hash(g, s, t) == h, (g, s, t)
