"""Parquet inputs read by pyarrow in the tasks (`services/backfill/parquet.py`): the splits,
the footer-based seq-order proof that lets the job skip the driver's seq check and the
cache, and the same composite events and dead letters as `cep run` either way: through
Spark's shuffle, and through engine tasks that each read the whole input
(`services/backfill/scan.py`)."""

from __future__ import annotations

from pathlib import Path

import os
import subprocess
import sys

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cep_core.checker import load_queries
from cep_core.event_io import EventFormat, read_events
from cep_core.schema import SchemaRegistry
from cep_service.backfill.job import run_backfill
from cep_service.backfill.ingest import InputFile
from cep_service.backfill.output import first_difference, read_composites, read_dead_letters
from cep_service.backfill.parquet import parquet_input
from cep_service.backfill.scan import key_partitions, use_scan
from cep_service.cli.common import Engine, run_queries

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TYPES = pa.schema([("seq", pa.int64()), ("symbol", pa.string()), ("price", pa.int64()),
                   ("volume", pa.int64()), ("ts", pa.int64()), ("seqNum", pa.int64())])


@pytest.fixture(scope="module")
def finance():
    return load_queries(EXAMPLES / "finance.cep", SchemaRegistry())


def trades(seq_of=lambda i: 10 * i) -> list[dict]:
    lines = (EXAMPLES / "data" / "trades.jsonl").read_text().splitlines()
    return [{"seq": seq_of(i), **orjson.loads(line)} for i, line in enumerate(lines)]


def write(records: list[dict], path: Path, row_group_size: int) -> Path:
    pq.write_table(pa.Table.from_pylist(records, schema=TYPES), path,
                   row_group_size=row_group_size)
    return path


def assert_like_cep_run(spark, queries, path: Path, tmp_path: Path, exchange: str = "auto",
                        partitions: int = 2):
    events, dead = read_events(path, queries[0].schema)
    composites, rejected = run_queries(queries, events, Engine.JIT)
    out = tmp_path / "out"
    result = run_backfill(spark, queries, [str(path)], str(out), partitions=partitions,
                          exchange=exchange)
    difference = first_difference({"cep run": composites, "backfill": read_composites(
        str(out))})
    assert difference is None, difference
    assert read_dead_letters(f"{out}_dead_letters") == [d.to_json() for d in dead + rejected]
    assert result.dead_letters == len(dead) + len(rejected)
    assert result.events == len(events)
    return result


def test_ordered_seqs_skip_the_driver_check(spark, finance, tmp_path):
    """Seqs rise from row group to row group (footer statistics), so the tasks find every
    dead letter: a null price, a seq going back within its split."""
    records = trades()
    records[7]["price"] = None
    records[300]["seq"] = records[298]["seq"]
    records[500]["seq"] = 500 * 10 - 1  # still above the one before: accepted
    path = write(records, tmp_path / "trades.parquet", row_group_size=200)
    source = parquet_input(spark, [InputFile(str(path), str(path), EventFormat.PARQUET)])
    assert source.splits_ordered
    assert [s.position for s in source.splits] == list(range(0, 1200, 200))
    assert assert_like_cep_run(spark, finance, path, tmp_path).exchange == "scan"  # auto
    for exchange in ("shuffle", "scan"):
        for partitions in (1, 3):
            result = assert_like_cep_run(spark, finance, path, tmp_path, exchange, partitions)
            assert result.exchange == exchange


def test_a_seq_jump_across_splits_falls_back_to_the_driver_check(spark, finance, tmp_path):
    records = trades()
    records[250]["seq"] = 5_000  # rejects the rows after it up to seq 5000, in later splits
    path = write(records, tmp_path / "trades.parquet", row_group_size=200)
    assert not parquet_input(spark, [InputFile(str(path), str(path), EventFormat.PARQUET)]) \
        .splits_ordered
    for exchange, ran in (("auto", "scan"), ("shuffle", "shuffle")):
        assert assert_like_cep_run(spark, finance, path, tmp_path, exchange).exchange == ran


def test_large_row_groups_are_cut_for_every_core(spark, tmp_path):
    """One row group of 1200 rows: cut in row ranges (2 cores, 16 KiB splits); the cut
    pieces' seq ranges come from the seq column, read alone."""
    path = write(trades(), tmp_path / "one.parquet", row_group_size=10_000)
    source = parquet_input(spark, [InputFile(str(path), str(path), EventFormat.PARQUET)])
    assert len(source.splits) >= 2 and source.rows == 1200
    assert sum(s.rows for s in source.splits) == 1200
    assert source.splits_ordered
    backwards = trades(seq_of=lambda i: 20_000 - i)
    path = write(backwards, tmp_path / "backwards.parquet", row_group_size=10_000)
    assert not parquet_input(spark, [InputFile(str(path), str(path), EventFormat.PARQUET)]) \
        .splits_ordered


def test_json_lines_inputs_keep_spark_s_reader(spark, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("{}\n")
    assert parquet_input(spark, [InputFile(str(path), str(path), EventFormat.JSONL)]) is None


def test_clean_input_with_engine_rejections(spark, finance, tmp_path):
    """No bad record in the input: the dead letters are only the events the engines
    reject (an event time going backwards), written without a Spark job."""
    records = trades()
    records[50]["ts"] -= 600_000
    path = write(records, tmp_path / "trades.parquet", row_group_size=300)
    events, dead = read_events(path, finance[0].schema)
    assert not dead
    for exchange in ("scan", "shuffle"):
        assert_like_cep_run(spark, finance, path, tmp_path, exchange)
        assert read_dead_letters(f"{tmp_path / 'out'}_dead_letters")


def test_scan_needs_inputs_pyarrow_opens():
    with pytest.raises(ValueError, match="--exchange scan needs inputs that pyarrow can open"):
        use_scan("scan", None, 2)
    assert not use_scan("auto", None, 2)
    with pytest.raises(ValueError, match="exchange must be"):
        use_scan("sideways", None, 2)


def test_many_partitions_shuffle_and_auto_says_so(spark, finance, tmp_path):
    path = write(trades(), tmp_path / "trades.parquet", row_group_size=300)
    assert assert_like_cep_run(spark, finance, path, tmp_path, "auto", 17).exchange \
        == "shuffle"


def test_key_partitions_are_alike_in_every_process():
    """A scan's tasks are separate processes: equal keys must land in equal partitions
    there too (Python's own str hash is salted per process)."""
    batch = pa.record_batch({
        "symbol": pa.array(["IBM", "AAPL", None, "IBM", "", "AAPL", None]),
        "price": pa.array([0.0, -0.0, 1.5, 0.0, None, 2.0, 1.5]),
    })
    here = key_partitions(batch, ("symbol", "price"), 5)
    assert here.tolist()[0] == here.tolist()[3]  # IBM, 0.0 and IBM, 0.0
    zero, minus_zero = key_partitions(pa.record_batch({"price": pa.array([0.0, -0.0])}),
                                      ("price",), 7).tolist()
    assert zero == minus_zero
    assert set(key_partitions(batch, ("symbol",), 3).tolist()) <= {0, 1, 2}
    spread = key_partitions(pa.record_batch({"symbol": pa.array(
        [f"S{i}" for i in range(400)])}), ("symbol",), 4)
    assert np.bincount(spread, minlength=4).min() > 60  # every partition gets keys
    script = ("import pyarrow as pa, sys; from cep_service.backfill.scan import key_partitions; "
              "b = pa.record_batch({'symbol': pa.array(['IBM', 'AAPL', None, 'IBM', '', "
              "'AAPL', None]), 'price': pa.array([0.0, -0.0, 1.5, 0.0, None, 2.0, 1.5])}); "
              "print(key_partitions(b, ('symbol', 'price'), 5).tolist())")
    for seed in ("1", "2"):
        there = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                               check=True, env={**os.environ, "PYTHONHASHSEED": seed},
                               cwd=Path(__file__).resolve().parent.parent).stdout
        assert orjson.loads(there) == here.tolist()
