"""MATCH_RECOGNIZE over HTTP (issue 32, item 3): the console's editor checks as you type
through /api/queries/validate, which locates Flink's refusals at line and column; a Flink
statement pasted as it is (no QUERY line: named after its alias) goes live with a
running pipeline, its SSE tail is the reference interpreter's composite events, and
/explain draws Flink's automaton."""

from __future__ import annotations

import uuid

from cep_core import reference
from cep_core.checker import load_query_text
from cep_core.event_io import read_events
from cep_service.api.app import ApiConfig, ApiThread
from cep_service.stream.kafka import Topics
from cep_service.stream.live_changes import services_view
from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_for
from tests.test_api import TOKEN, TRADES, call, settings, tail_while_producing  # noqa: F401

STATEMENT = """SELECT * FROM trades MATCH_RECOGNIZE (
  PARTITION BY symbol
  ORDER BY ts
  MEASURES FIRST(A.price) AS start_price, LAST(B.price) AS bottom, COUNT(*) AS n
  ONE ROW PER MATCH
  AFTER MATCH SKIP TO NEXT ROW
  PATTERN (A B+ C)
  DEFINE B AS B.price < PREV(price), C AS C.price > PREV(price)
) AS {name}"""


def test_the_editor_sees_flinks_refusals_where_they_are_written(settings):  # noqa: F811
    run = uuid.uuid4().hex[:8]
    config = ApiConfig(settings, topic_prefix=f"mr{run}", token=TOKEN, timeout_s=5)
    with ApiThread(config) as api:
        good = STATEMENT.format(name=f"V{run}")
        code, checked = call(api, "POST", "/api/queries/validate", {"text": good}, token=None)
        assert code == 200 and checked["ok"] is True, checked
        assert checked["queries"] == [{"name": f"V{run}", "stream": "trades",
                                       "output": f"V{run}", "live": False}]
        for wrong, message, line in [
                ("PATTERN (A B+ C)", "PATTERN (A B C+)", 7),  # greedy last: Flink refuses
                ("ORDER BY ts", "ORDER BY price", 3),
                ("C AS C.price", "X AS C.price", 8)]:
            bad = good.replace(wrong, message)
            code, checked = call(api, "POST", "/api/queries/validate", {"text": bad},
                                 token=None)
            assert code == 200 and checked["ok"] is False, bad
            error = checked["errors"][0]
            assert error["line"] == line and error["column"] >= 1, error
            assert error["source_line"] == bad.splitlines()[line - 1]


def test_a_flink_statement_added_over_http_tails_the_references_rows(settings):  # noqa: F811
    run = uuid.uuid4().hex[:8]
    name = f"V{run}"
    topics = Topics("trades", source=f"src.trades.{run}", prefix=f"mr{run}")
    create_topics(settings, topics, 2, [name])
    text = STATEMENT.format(name=name)
    queries = load_query_text(text)
    events, _ = read_events(TRADES, queries[0].schema)
    expected = reference.run(queries, events)
    assert len(expected) > 20
    config = ApiConfig(settings, topic_prefix=topics.prefix, token=TOKEN, timeout_s=120)
    with LocalPipeline(settings, topics, workers=2, partitions=2), ApiThread(config) as api:
        wait_for(lambda: any(e["role"] == "splitter" for e in
                             services_view(settings, topics.status).values()), 60,
                 "the splitter's presence record")
        code, added = call(api, "POST", "/api/queries", {"text": text})
        assert code == 201 and added["outcome"] == "applied", added
        assert tail_while_producing(api, settings, topics, name, len(expected)) == expected
        code, explained = call(api, "GET", f"/api/queries/{name}/explain")
        assert code == 200 and explained["kind"] == "match_recognize", explained
        assert "--take B" in explained["text"]
        code, removed = call(api, "DELETE", f"/api/queries/{name}")
        assert code == 200 and removed["outcome"] == "applied", removed
