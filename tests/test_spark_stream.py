"""The queries as a Spark Structured Streaming job (services/spark_stream/): composite
events identical to `cep run` (the reference interpreter) for every example query file,
whatever the micro-batch size, from files and from Kafka (the embedded broker), across a
stop and restart from the checkpoint, and with queries added and removed between runs.

One Spark session for the module (conftest's `spark`, local[2]); the streams are the small
example files. Waits are on the job's own progress (`processAllAvailable`, the commits in
its checkpoint), never on the clock.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from cep_core.checker import load_queries, load_query_text  # noqa: E402
from cep_core.event_reader import read_table  # noqa: E402
from cep_core.runner import run_checked  # noqa: E402
from cep_service.backfill.output import first_difference, read_composites  # noqa: E402
from cep_service.spark_stream.job import FileSource, KafkaSource, query_texts, start  # noqa: E402
from cep_service.spark_stream.sinks import FileSink, KafkaSink  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FULL = os.environ.get("CEP_TEST_FULL") == "1"


def reference(queries, lines: list[bytes], tmp_path: Path) -> list[dict]:
    path = tmp_path / f"all-{uuid.uuid4().hex}.jsonl"
    path.write_bytes(b"".join(lines))
    table, _ = read_table(path, queries[0].schema)
    composites, _ = run_checked(queries, table, engine="reference")
    return composites.to_dicts()


def event_files(folder: Path, lines: list[bytes], per_file: int, end: bool = True) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(0, len(lines), per_file):
        (folder / f"{i:08d}.jsonl").write_bytes(b"".join(lines[i:i + per_file]))
    if end:
        (folder / "99999999.end").write_bytes(b"")


def example(name: str):
    """(queries, the lines of their example data, their texts)"""
    queries = load_queries(EXAMPLES / f"{name}.cep")
    data = EXAMPLES / "data" / f"{queries[0].schema.stream}.jsonl"
    return (queries, data.read_bytes().splitlines(keepends=True),
            query_texts((EXAMPLES / f"{name}.cep").read_text()))


def run_files(spark, queries, texts, folder: Path, root: Path,
              max_files: int = 0) -> list[dict]:
    job = start(spark, queries, FileSource(str(folder), max_files=max_files),
                FileSink(str(root / "out")), str(root / "checkpoint"), texts)
    try:
        job.processAllAvailable()
    finally:
        job.stop()
    return read_composites(str(root / "out" / "composites"))


# MATCH, WINDOW (time and ROWS), SEQ with negation, Kleene and TESLA steps; all of them
# with CEP_TEST_FULL=1
EXAMPLE_FILES = ["finance", "auction", "fire", "marathon", "r4", "rfid", "stocks", "ticks"] \
    if FULL else ["fire"]  # finance: the tests below


def test_every_example_as_cep_run(spark, tmp_path):
    """Every example query file over its data, cut into files of 300 events (all taken
    in one micro-batch here; micro-batch sizes below): the composite events of `cep run`."""
    for name in EXAMPLE_FILES:
        queries, lines, texts = example(name)
        event_files(tmp_path / name / "in", lines, per_file=300)
        got = run_files(spark, queries, texts, tmp_path / name / "in", tmp_path / name)
        want = reference(queries, lines, tmp_path)
        assert want, name
        assert first_difference({"cep run": want, "spark": got}) is None, name


@pytest.mark.parametrize("per_file,max_files", [(97, 3)] +
                         ([(1200, 0), (1, 50), (13, 0)] if FULL else []))
def test_any_micro_batch_size(spark, tmp_path, per_file, max_files):
    queries, lines, texts = example("finance")
    event_files(tmp_path / "in", lines, per_file)
    got = run_files(spark, queries, texts, tmp_path / "in", tmp_path, max_files)
    assert first_difference({"cep run": reference(queries, lines, tmp_path),
                             "spark": got}) is None


def test_restart_from_checkpoint_and_query_changes(spark, tmp_path):
    """Stopped after a few committed micro-batches and started again on the same
    checkpoint, with one query removed and one added: the kept query's composite events
    are those of an uninterrupted run (none lost, none twice); the removed one's stop at
    the restart; the added one runs from the first micro-batch after it."""
    queries, lines, texts = example("finance")
    kept = [q for q in queries if q.name == "activity"]
    event_files(tmp_path / "in", lines, per_file=200)
    root = tmp_path / "job"
    job = start(spark, queries, FileSource(str(tmp_path / "in"), max_files=1),
                FileSink(str(root / "out")), str(root / "checkpoint"), texts)
    commits = root / "checkpoint" / "spark" / "commits"
    try:
        while len(list(commits.glob("[0-9]*"))) < 2 and job.isActive:
            job.awaitTermination(0.2)  # the job's own commits decide, not the time
    finally:
        job.stop()
    assert job.exception() is None
    restart = 200 * len(list(commits.glob("[0-9]*")))  # the first seq after the restart
    assert restart < 1200
    big = ("QUERY big FROM trades PARTITION BY symbol PATTERN ( . up+ ) "
           "DEFINE up AS price > Last(price) EMIT n = Count();")
    added = load_query_text(big)
    added[0].index = 2
    got = run_files(spark, kept + added, {**texts, **query_texts(big)}, tmp_path / "in", root,
                    max_files=1)
    want = reference(queries, lines, tmp_path)
    assert first_difference({"cep run": [c for c in want if c["query"] == "activity"],
                             "spark": [c for c in got if c["query"] == "activity"]}) is None
    assert [c for c in got if c["query"] == "mshape"] == \
        [c for c in want if c["query"] == "mshape" and c["seq"] < restart]
    later = reference(added, lines[restart:], tmp_path)
    assert later
    shifted = [{**c, "seq": c["seq"] - restart, "start_seq": c["start_seq"] - restart}
               for c in got if c["query"] == "big"]
    assert first_difference({"cep run": later, "spark": shifted}) is None


def _produce(settings, topic: str, lines: list[bytes], keys: list[bytes] | None = None):
    from cep_service.stream.kafka import produce, produce_end

    producer = settings.producer()
    for i, line in enumerate(lines):
        produce(producer, topic, line.strip(), key=None if keys is None else keys[i])
    produce_end(producer, topic)
    producer.flush(30)


def _finance(tag: str):
    """finance.cep writing into topics of its own: (queries, texts)"""
    text = (EXAMPLES / "finance.cep").read_text()
    text = text.replace("INTO double_tops", f"INTO tops_{tag}")
    text = text.replace("INTO trade_stats", f"INTO stats_{tag}")
    return load_query_text(text), query_texts(text)


def _written(settings, queries) -> list[dict]:
    import orjson

    from cep_core.composite import sort_key
    from cep_service.stream.kafka import read_all

    index = {q.name: q.index for q in queries}
    out = [orjson.loads(m.value()) for q in queries for m in read_all(settings, q.query.output)]
    return sorted(out, key=lambda c: sort_key(c, index[c["query"]]))


@pytest.mark.skipif(not FULL, reason="CEP_TEST_FULL=1 (several partitions below covers "
                    "the Kafka source and sink by default)")
def test_kafka_source_and_sink(spark, kafka_bootstrap, tmp_path):
    """From a source topic to the queries' INTO topics, 500 records per micro-batch: the
    composite events of `cep run`, each once."""
    from cep_service.stream.kafka import KafkaSettings, ensure_topics

    settings = KafkaSettings.from_env(kafka_bootstrap)
    tag = uuid.uuid4().hex[:8]
    queries, texts = _finance(tag)
    ensure_topics(settings, {f"trades_{tag}": 1, f"tops_{tag}": 2, f"stats_{tag}": 1})
    _, lines, _ = example("finance")
    _produce(settings, f"trades_{tag}", lines)
    job = start(spark, queries, KafkaSource(kafka_bootstrap, f"trades_{tag}", max_records=500),
                KafkaSink(kafka_bootstrap, {q.name: q.query.output for q in queries}),
                str(tmp_path / "checkpoint"), texts)
    try:
        job.processAllAvailable()
    finally:
        job.stop()
    assert first_difference({"cep run": reference(queries, lines, tmp_path),
                             "spark": _written(settings, queries)}) is None


def logged_order(settings, topic: str, checkpoint: Path) -> list[bytes]:
    """The source records in the order the job took them: micro-batch by micro-batch
    (Spark's offset log), source partition by partition, offset by offset."""
    import orjson

    from cep_service.stream.kafka import read_all

    by_partition: dict[int, dict[int, bytes]] = {}
    for m in read_all(settings, topic):
        if m.value():
            by_partition.setdefault(m.partition(), {})[m.offset()] = m.value() + b"\n"
    ends = [orjson.loads(path.read_text().splitlines()[-1]) for path in sorted(
        (checkpoint / "spark" / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))]
    order, before = [], {}
    for end in ends:
        for p in sorted(end, key=int):
            records = by_partition.get(int(p), {})
            order += [records[o] for o in range(before.get(p, 0), end[p]) if o in records]
        before = end
    return order


def test_several_source_partitions(spark, kafka_bootstrap, tmp_path):
    """A 3-partition source topic keyed by symbol, 300 records per micro-batch: the
    composite events of `cep run` over the records in the job's logged order."""
    import orjson

    from cep_service.stream.kafka import KafkaSettings, ensure_topics

    # Deliberately like tests/test_spark_stream_live.py's test_path_for_sparks_kafka_source: each
    # test states its topic, records and checks in full; that one reads through Spark's own
    # Kafka source and checks its checkpoint too.
    settings = KafkaSettings.from_env(kafka_bootstrap)
    tag = uuid.uuid4().hex[:8]
    queries, texts = _finance(tag)
    ensure_topics(settings, {f"trades_{tag}": 3, f"tops_{tag}": 1, f"stats_{tag}": 1})
    _, lines, _ = example("finance")
    _produce(settings, f"trades_{tag}", lines,
             [orjson.dumps(orjson.loads(line)["symbol"]) for line in lines])
    checkpoint = tmp_path / "checkpoint"
    job = start(spark, queries, KafkaSource(kafka_bootstrap, f"trades_{tag}", max_records=300),
                KafkaSink(kafka_bootstrap, {q.name: q.query.output for q in queries}),
                str(checkpoint), texts)
    try:
        job.processAllAvailable()
    finally:
        job.stop()
    order = logged_order(settings, f"trades_{tag}", checkpoint)
    assert sorted(order) == sorted(lines)
    assert first_difference({"cep run": reference(queries, order, tmp_path),
                             "spark": _written(settings, queries)}) is None


@pytest.mark.skipif(not FULL, reason="CEP_TEST_FULL=1: two Spark sessions of their own")
def test_killed_and_restarted(tmp_path):
    """`cep spark stream` in local[1], killed (SIGKILL, its JVM and Python workers with
    it) once its checkpoint holds three commits, then started again on the checkpoint:
    the composite events of `cep run`, none twice."""
    import signal
    import subprocess
    import sys

    queries, lines, _ = example("finance")
    event_files(tmp_path / "in", lines, per_file=100)
    command = [sys.executable, "-m", "cep_service.cli.main", "spark", "stream",
               str(EXAMPLES / "finance.cep"), "--input-dir", str(tmp_path / "in"),
               "--output", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "checkpoint"),
               "--master", "local[1]", "--max-files", "1", "--once"]
    commits = tmp_path / "checkpoint" / "spark" / "commits"
    first = subprocess.Popen(command, start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        while len(list(commits.glob("[0-9]*"))) < 3:
            assert first.poll() is None, "the job ended before it was killed"
            try:
                first.wait(0.2)  # its commits decide when, not the time
            except subprocess.TimeoutExpired:
                pass
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert len(list(commits.glob("[0-9]*"))) < 13  # killed mid-stream
    subprocess.run(command, check=True, stderr=subprocess.DEVNULL, timeout=600)
    got = read_composites(str(tmp_path / "out" / "composites"))
    assert first_difference({"cep run": reference(queries, lines, tmp_path),
                             "spark": got}) is None
