"""The Spark backfill (real PySpark, local[2], one session for the module) gives the same
composite events and dead letters as `cep run` with the reference interpreter and with the
jit engine, for every query kind, with 1, 2 and 8 Spark partitions per keyed group.

Input splits are made small (16 KiB) so that every file is read by several decode tasks: the
positions (default seqs) and the "seq does not increase" check then cross split borders.
"""

from __future__ import annotations

import csv
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep_core.checker import load_queries, load_query_text
from cep_core.event_io import read_events
from cep_core.schema import SchemaRegistry
from cep_service.backfill.job import run_backfill
from cep_service.backfill.output import first_difference, read_composites, read_dead_letters
from cep_service.backfill.plan import plan, split_keys
from cep_service.cli.common import Engine, run_queries

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def cep_run_outputs(queries, path) -> tuple[dict[str, list[dict]], list[dict]]:
    """Composite events of `cep run --engine reference` and `--engine jit` on one file, and
    the reference run's dead letters (as `cep run --dead-letters` writes them)."""
    events, dead = read_events(path, queries[0].schema)
    outputs, dead_letters = {}, []
    for engine in (Engine.REFERENCE, Engine.JIT):
        composites, rejected = run_queries(queries, events, engine)
        outputs[f"cep run --engine {engine.value}"] = composites
        if engine is Engine.REFERENCE:
            dead_letters = [d.to_json() for d in dead + rejected]
    return outputs, dead_letters


def assert_backfill_matches(spark, queries, inputs: list[Path], tmp_path: Path,
                            partitions: int, expected_from: Path | None = None):
    """Backfill `inputs` with each exchange (the scan, `auto` here, and Spark's shuffle);
    compare with `cep run` on `expected_from` (default: the one input), whose dead letters
    then name that file as their source."""
    expected, dead = cep_run_outputs(queries, expected_from or inputs[0])  # compiles kernels
    for exchange in ("auto", "shuffle"):
        out = tmp_path / f"out{partitions}{exchange}"
        result = run_backfill(spark, queries, [str(p) for p in inputs], str(out),
                              partitions=partitions, exchange=exchange)
        assert result.exchange == ("scan" if exchange == "auto" else "shuffle")
        got = read_composites(str(out))
        difference = first_difference({**expected, f"backfill ({exchange})": got})
        assert difference is None, difference
        dead_letters = read_dead_letters(f"{out}_dead_letters")
        if expected_from is not None:
            for d in dead_letters:
                if not d["source"].startswith("query "):
                    d["source"] = str(expected_from)
        assert dead_letters == dead, exchange
        assert result.composites == len(got)
        assert result.dead_letters == len(dead)
    return got, dead


# ------------------------------------------------------------------ messy inputs


def trades_lines() -> list[str]:
    """examples/data/trades.jsonl with every kind of bad record mixed in: a blank line,
    broken JSON, a missing and a mistyped attribute, a seq going backwards, an event time
    going backwards in its partition (rejected by the engines: MATCH and the WINDOW's
    lateness), and a seq jump near the end that makes the following records fail the
    seq check across split borders."""
    lines = (EXAMPLES / "data" / "trades.jsonl").read_text().splitlines()
    record = orjson.loads(lines[50])
    record["ts"] -= 600_000
    lines[50] = orjson.dumps(record).decode()
    late = next(i for i in range(600, 1100) if '"GOOG"' in lines[i])
    record = orjson.loads(lines[late])
    record["ts"] -= 600_000
    lines[late] = orjson.dumps(record).decode()
    jump = orjson.loads(lines[1150])
    jump["seq"] = 5000
    lines[1150] = orjson.dumps(jump).decode()
    back = orjson.loads(lines[40])
    back["seq"] = 5
    lines[40] = orjson.dumps(back).decode()
    lines[30] = lines[30].replace('"price":', '"price":"abc","was":')
    lines[20] = lines[20].replace('"price":', '"cost":')
    lines.insert(10, '{"symbol": "IBM", "price": 1')
    lines.insert(3, "   ")
    return lines


@pytest.fixture(scope="module")
def finance():
    return load_queries(EXAMPLES / "finance.cep", SchemaRegistry())


@pytest.fixture(scope="module")
def messy_jsonl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("messy") / "trades.jsonl"
    path.write_text("\n".join(trades_lines()) + "\n")
    return path


@pytest.mark.parametrize("partitions", [1, 2, 8])
def test_match_and_window_over_messy_jsonl(spark, finance, messy_jsonl, tmp_path, partitions):
    got, dead = assert_backfill_matches(spark, finance, [messy_jsonl], tmp_path, partitions)
    assert {c["query"] for c in got} == {"mshape", "activity"}
    broken = [d for d in dead if d["reason"].startswith("not valid JSON")]
    assert [(d["line"], d["position"]) for d in broken] == [(12, 10)]  # line 4 is blank
    reasons = " | ".join(d["reason"] for d in dead)
    for expected in ("not valid JSON", "missing attribute 'price'", "expected int",
                     "seq 5 does not increase", "previous seq 5000", "event time goes back",
                     "late event"):
        assert expected in reasons


@pytest.mark.parametrize("partitions", [1, 2, 8])
def test_seq_queries_partitioned_and_not(spark, tmp_path, partitions):
    queries = load_queries(EXAMPLES / "rfid.cep", SchemaRegistry())
    assert {split_keys(q) for q in queries} == {(), ("item",)}
    got, _ = assert_backfill_matches(spark, queries, [EXAMPLES / "data" / "rfid.jsonl"],
                                     tmp_path, partitions)
    assert len({c["query"] for c in got}) == len(queries)


def test_windows_time_and_rows(spark, tmp_path):
    queries = load_queries(EXAMPLES / "auction.cep", SchemaRegistry())
    assert plan(queries)[0].keys == ()  # GROUP BY and ROWS windows: one partition
    got, _ = assert_backfill_matches(spark, queries, [EXAMPLES / "data" / "bids.jsonl"],
                                     tmp_path, 8)
    assert {c["query"] for c in got} == {"top_bid", "per_bidder", "last_bids"}


def test_csv_input(spark, finance, tmp_path):
    rows = [orjson.loads(line) for line in trades_lines()[:400] if line.startswith('{"symbol":"')
            and '"seq"' not in line and '"price":' in line and '"was"' not in line]
    path = tmp_path / "trades.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["symbol", "price", "volume", "ts", "seqNum"])
        for i, r in enumerate(rows):
            writer.writerow([r["symbol"], "12.5" if i == 7 else r["price"], r["volume"],
                             r["ts"], r["seqNum"]])
            if i == 9:
                writer.writerow(["IBM", 1])
            if i == 11:
                writer.writerow([])
    _, dead = assert_backfill_matches(spark, finance, [path], tmp_path, 2)
    # (record index, line): the header is line 1, the blank row after row 11 a line too
    found = {(d["position"], d["line"]) for d in dead if d["source"] == str(path)}
    assert found >= {(7, 9), (10, 12)}
    assert all(line is not None for _, line in found)


def test_parquet_inputs_read_as_one_stream(spark, finance, tmp_path):
    """Two Parquet files (typed columns: the columnar decoder, nulls and a NaN falling
    back to the row decoder) are one stream, positions counting on from the first."""
    lines = [line for line in trades_lines() if line.strip()]
    records = []
    for line in lines[:600]:
        try:
            r = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(r.get("price"), int) and "seq" not in r:
            records.append(r)
    table = pa.Table.from_pylist(records, schema=pa.schema(
        [("symbol", pa.string()), ("price", pa.float64()), ("volume", pa.int64()),
         ("ts", pa.timestamp("ms", tz="UTC")), ("seqNum", pa.int32())]))
    price = table.column("price").to_pylist()
    price[5], price[8] = None, float("nan")
    table = table.set_column(1, "price", pa.array(price, pa.float64()))
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(table.slice(0, 250), first, row_group_size=40)
    pq.write_table(table.slice(250), second, row_group_size=40)
    whole = tmp_path / "whole.parquet"
    pq.write_table(table, whole)
    float_price = load_query_text((EXAMPLES / "finance.cep").read_text(), _float_trades())
    _, dead = assert_backfill_matches(spark, float_price, [first, second], tmp_path, 2,
                                      expected_from=whole)
    assert [d["position"] for d in dead][:2] == [5, 8]


def _float_trades() -> SchemaRegistry:
    registry = SchemaRegistry()
    registry.add(_trades_schema(price="float"))
    return registry


def _trades_schema(price: str):
    from cep_core.schema import StreamSchema
    return StreamSchema("trades", {"symbol": "string", "price": price, "volume": "int",
                                   "ts": "timestamp", "seqNum": "int"}, "ts", "ms")


# ------------------------------------------------------------------ generated streams

MSHAPE_AND_WINDOW = """
QUERY ups FROM trades PARTITION BY symbol
PATTERN ( . rise+ drop )
DEFINE rise AS price > Last(price), drop AS price < First(price)
EMIT n = Count(), hi = Max(price);
QUERY stats SELECT symbol, count(*) AS n, max(price) AS hi
FROM trades [RANGE 10 seconds SLIDE 5 seconds] GROUP BY symbol;
QUERY rows SELECT count(*) AS n, sum(volume) AS v FROM trades [ROWS 4 SLIDE 2];
"""

trade = st.tuples(st.sampled_from(["A", "B", "C"]), st.integers(1, 6), st.integers(0, 3000),
                  st.booleans())


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(trade, min_size=1, max_size=60), st.sampled_from([1, 2, 8]))
def test_generated_streams(spark, tmp_path_factory, stream, partitions):
    queries = load_query_text(MSHAPE_AND_WINDOW)
    ts, lines = 1_000, []
    for i, (symbol, price, gap, broken) in enumerate(stream):
        ts += gap
        record = {"symbol": symbol, "price": price, "volume": i, "ts": ts, "seqNum": i}
        lines.append("{oops" if broken and i % 3 == 0 else orjson.dumps(record).decode())
    path = tmp_path_factory.mktemp("gen") / "trades.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert_backfill_matches(spark, queries, [path], path.parent, partitions)


# ------------------------------------------------------------------ CLI and Kafka


def test_cli_backfill_and_a_missing_input(spark, tmp_path):
    from typer.testing import CliRunner

    from cep_service.cli.main import app

    out = tmp_path / "cli_out"
    runner = CliRunner()
    result = runner.invoke(app, ["backfill", str(EXAMPLES / "marathon.cep"), "--input",
                                 str(EXAMPLES / "data" / "checkpoints.jsonl"), "--output",
                                 str(out), "--master", "local[2]", "--partitions", "2"])
    assert result.exit_code == 0, result.output
    queries = load_queries(EXAMPLES / "marathon.cep", SchemaRegistry())
    expected, _ = cep_run_outputs(queries, EXAMPLES / "data" / "checkpoints.jsonl")
    got = read_composites(str(out))
    assert got and first_difference({**expected, "backfill": got}) is None
    assert f"{len(got):,} composite events" in result.output
    assert "events/s" in result.output
    assert "exchange: scan" in result.output  # auto, 2 partitions, a local file

    shuffled = runner.invoke(app, ["backfill", str(EXAMPLES / "marathon.cep"), "--input",
                                   str(EXAMPLES / "data" / "checkpoints.jsonl"), "--output",
                                   str(out), "--master", "local[2]", "--exchange", "shuffle"])
    assert shuffled.exit_code == 0, shuffled.output
    assert "exchange: shuffle" in shuffled.output
    assert first_difference({**expected, "backfill": read_composites(str(out))}) is None

    missing = runner.invoke(app, ["backfill", str(EXAMPLES / "marathon.cep"), "--input",
                                  str(tmp_path / "nope.jsonl"), "--output", str(out)])
    assert missing.exit_code == 1
    assert "nope.jsonl: no such file" in missing.output


def test_to_kafka(spark, tmp_path, kafka_bootstrap):
    from confluent_kafka import Consumer, TopicPartition

    queries = load_queries(EXAMPLES / "rfid.cep", SchemaRegistry())
    out, topic = tmp_path / "kafka_out", f"backfill-{tmp_path.name}"
    run_backfill(spark, queries, [str(EXAMPLES / "data" / "rfid.jsonl")], str(out),
                 partitions=2, to_kafka=topic, bootstrap=kafka_bootstrap)
    expected = read_composites(str(out))
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": topic,
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        messages = []
        for _ in range(100):
            batch = consumer.consume(num_messages=1000, timeout=0.5)
            messages.extend(m for m in batch if m.error() is None)
            if len(messages) >= len(expected):
                break
    finally:
        consumer.close()
    received = [(orjson.loads(m.key()), orjson.loads(m.value())) for m in messages]
    assert all(key == composite["key"] for key, composite in received)
    assert sorted(orjson.dumps(c) for _, c in received) == \
        sorted(orjson.dumps(c) for c in expected)


@pytest.mark.parametrize("query_file, events_file", [
    ("marathon.cep", "checkpoints.jsonl"), ("rfid.cep", "rfid.jsonl"),
    ("ticks.cep", "ticks.jsonl")])
def test_backfill_equals_the_streaming_service(spark, kafka_bootstrap, tmp_path, query_file,
                                               events_file):
    """The same file through the Spark backfill and through the running service (splitter,
    2 workers, coordinator on a real broker): the same composite events per INTO topic, in
    the same order."""
    import uuid

    from cep_service.stream.kafka import KafkaSettings, read_all
    from cep_service.stream.pipeline import LocalPipeline
    from stream_harness import file_records, produce_to_end, topics_with_queries

    path = EXAMPLES / "data" / events_file
    queries = load_queries(EXAMPLES / query_file, SchemaRegistry())
    run_backfill(spark, queries, [str(path)], str(tmp_path / "out"), partitions=2)
    backfilled = read_composites(str(tmp_path / "out"))

    settings = KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)
    run = uuid.uuid4().hex[:8]
    stream = queries[0].schema.stream
    _, topics, before = topics_with_queries(settings, EXAMPLES / query_file,
                                            f"src.{stream}.{run}", f"bf{run}")
    with LocalPipeline(settings, topics, workers=2) as pipeline:
        produce_to_end(settings, pipeline, topics.source, file_records(path))
    assert backfilled
    for q in queries:
        served = [orjson.loads(m.value())
                  for m in read_all(settings, q.query.output)[before[q.query.output]:]]
        assert served == [c for c in backfilled if c["query"] == q.name], q.name
