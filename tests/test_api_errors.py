"""Each category of error (cep_core/errors.py) through the real app: its HTTP status from
services/api/errors.py's one map, and its body with the problems as fields (message,
query, line, column, source_line), never parsed back out of a message. No broker: the
control topic's records are given (a live query `ups`), and every refusal here comes
before anything is published (malformed 400, admission 429, unavailable 503 and internal
500 are tests/test_api_guard.py's)."""

from __future__ import annotations

import orjson

from cep_core.errors import Category, Problem
from cep_service.api.errors import STATUS
from tests.test_api_guard import JSON, QUERY, answer, serve

LIVE = [(b"query/ups", orjson.dumps({"op": "add", "name": "ups", "text": QUERY["text"]}), 0)]
BAD = "QUERY bad FROM trades INTO x\nPATTERN ( a )\nDEFINE a AS symbol > 3\nEMIT symbol = symbol;"


def serve_real(scenario, records=()):
    """`scenario(client, api)` with the app's own change (refusals only: nothing that
    gets through could be published) on the control `records` given."""
    async def real(client, api):
        del api.change
        api.records = lambda fresh=False: list(records)
        await scenario(client, api)
    serve(real)


def test_every_category_has_a_status():
    assert set(STATUS) == set(Category)
    assert Problem("m", "q", 1, 2, "x").to_json() == {
        "message": "m", "query": "q", "line": 1, "column": 2, "source_line": "x"}


def test_invalid_is_422_with_the_checkers_line_and_column():
    async def scenario(client, api):
        code, body = await answer(await client.post("/api/queries", data=orjson.dumps(
            {"text": BAD}), headers=JSON))
        assert code == STATUS[Category.INVALID] == 422 and body["outcome"] == "invalid"
        error, = body["errors"]
        assert (error["line"], error["source_line"]) == (3, "DEFINE a AS symbol > 3")
        assert error["column"] > 1 and "cannot compare" in error["message"]
        assert body["changes"] == []

        code, body = await answer(await client.put("/api/queries/ups", data=orjson.dumps(
            {"text": QUERY["text"].replace("QUERY ups", "QUERY other")}), headers=JSON))
        assert code == 422 and body["errors"] == [Problem(
            "the text defines no query 'ups'").to_json()]
    serve_real(scenario, LIVE)


def test_a_stream_change_that_breaks_a_live_query_is_422_located_in_the_query():
    schema = {"stream": "trades", "time": "ts", "attributes": {
        "symbol": "string", "volume": "int", "ts": "timestamp"}}

    async def breaking(client, api):
        code, body = await answer(await client.put("/api/streams/trades", data=orjson.dumps(
            {"schema": schema}), headers=JSON))
        assert code == 422, body
        head, *located = body["errors"]
        assert "would break the live query 'ups'" in head["message"]
        assert head["line"] is None and head["query"] is None
        assert located and all(e["query"] == "ups" and e["line"] for e in located)
    serve_real(breaking, LIVE)


def test_not_found_is_404():
    async def scenario(client, api):
        for method, path, said in (("DELETE", "/api/queries/nothere", "no live query"),
                                   ("DELETE", "/api/streams/nothere", "no stream"),
                                   ("PUT", "/api/queries/nothere", "no live query")):
            body = orjson.dumps({"text": QUERY["text"].replace("ups", "nothere")}) \
                if method == "PUT" else None
            code, answered = await answer(await client.request(method, path, data=body,
                                                               headers=JSON))
            assert code == STATUS[Category.NOT_FOUND] == 404, (path, answered)
            assert answered["outcome"] == "invalid" and said in \
                answered["errors"][0]["message"]
    serve_real(scenario, LIVE)


def test_conflict_is_409():
    async def scenario(client, api):
        code, body = await answer(await client.post("/api/queries", data=orjson.dumps(QUERY),
                                                    headers=JSON))
        assert code == STATUS[Category.CONFLICT] == 409
        assert "is live already" in body["errors"][0]["message"]
        trades = {"stream": "trades", "time": "ts", "attributes": {"ts": "timestamp"}}
        code, body = await answer(await client.post("/api/streams", data=orjson.dumps(
            {"schema": trades}), headers=JSON))
        assert code == 409 and "exists already" in body["errors"][0]["message"]
    serve_real(scenario, LIVE)
