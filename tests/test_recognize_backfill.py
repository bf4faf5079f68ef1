"""MATCH_RECOGNIZE in the Spark backfill (issue 32, item 3), real PySpark in local mode:
partitioned by its PARTITION BY (or in one ordered task without one), beside a MATCH
query, over examples' trades with bad records mixed in, it gives the composite events and
dead letters of `cep run` (reference and jit), with 3 Spark partitions per keyed group."""

from __future__ import annotations

from pathlib import Path

import pytest

from cep_core.checker import load_queries, load_query_text
from cep_core.schema import SchemaRegistry
from cep_service.backfill.plan import plan
from tests.test_backfill import assert_backfill_matches, trades_lines
from tests.test_recognize_service import MR

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def messy_trades(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("messy") / "trades.jsonl"
    path.write_text("\n".join(trades_lines()) + "\n")
    return path


def _queries(order: str = "ts"):
    """MATCH mshape, the Flink M-shape by symbol (its rows of one time ordered by `order`),
    and a V-shape over the whole stream with WITHIN (its partial matches end with time),
    one file's order."""
    text = (EXAMPLES / "finance.cep").read_text().split("QUERY activity")[0]
    text += MR.format(output="mr_tops").replace("ORDER BY ts", f"ORDER BY {order}")
    text += """QUERY dips INTO dips
SELECT * FROM trades MATCH_RECOGNIZE (
  ORDER BY ts
  MEASURES FIRST(A.seqNum) AS first_num, LAST(B.price) AS bottom, COUNT(*) AS n
  AFTER MATCH SKIP TO NEXT ROW
  PATTERN (A B+ C)
  WITHIN INTERVAL '20' SECOND
  DEFINE B AS B.price < PREV(price), C AS C.price > PREV(price)
) AS D;
"""
    queries = load_query_text(text, SchemaRegistry())
    assert [q.name for q in queries] == ["mshape", "mr_mshape", "dips"]
    return queries


@pytest.mark.parametrize("partitions, order", [(3, "ts"), (3, "ts, price DESC")])
def test_backfill_equals_cep_run(spark, messy_trades, tmp_path, partitions, order):
    queries = _queries(order)
    assert sorted(g.keys for g in plan(queries)) == [(), ("symbol",)]
    got, dead = assert_backfill_matches(spark, queries, [messy_trades], tmp_path, partitions)
    by_query = {name: [c for c in got if c["query"] == name]
                for name in ("mshape", "mr_mshape", "dips")}
    assert len(by_query["mr_mshape"]) > 20 and len(by_query["dips"]) > 20
    reasons = " | ".join(d["reason"] for d in dead if d["source"] == "query mr_mshape")
    assert "event time goes backwards in partition" in reasons


def test_the_finance_file_still_plans_as_before():
    queries = load_queries(EXAMPLES / "finance.cep", SchemaRegistry())
    assert [g.names for g in plan(queries)] == [["mshape"], ["activity"]]
