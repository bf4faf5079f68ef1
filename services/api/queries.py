"""The queries' endpoints: list (with their state), one, check, add, replace, remove,
explain; each stream's pipeline and the queries' history."""

from __future__ import annotations

from aiohttp import web

from cep_core.control_ops import Kind, Op
from cep_service.api import checks
from cep_service.api import models as m
from cep_service.api.replies import NOT_LIVE, outcomes, wait_args
from cep_service.api.limits import LimitKind
from cep_service.api.state import api_of
from cep_service.api.errors import problem
from cep_service.api.openapi import Answer, Routes

ROUTES = Routes()


@ROUTES.route("GET", "/api/queries", "The live queries (the control topic's), with their "
              "state", {200: (m.QueryList, "the live queries, in order")},
              params=m.QueriesParams, kind=LimitKind.READ)
async def queries(request: web.Request, params: m.QueriesParams) -> Answer:
    api = api_of(request)
    live = await api.snapshot()
    found = [q for q in sorted(live.live.values(), key=lambda q: q.index)
             if params.stream is None or q.checked.schema.stream == params.stream]
    states = await api.states(found) if params.state == "true" else {}
    return {"queries": [api.query_entry(q, states.get(q.name)) for q in found]}


@ROUTES.route("POST", "/api/queries/validate", "Check a query text (parsed and checked, "
              "never run); changes nothing", {200: (m.QueryChecked, "checked: ok, or the "
                                                    "errors with line and column")},
              body=m.QueryCheck, change=True, checks=True)
async def validate_query(request: web.Request, body: m.QueryCheck) -> Answer:
    api = api_of(request)
    live = await api.snapshot()
    errors, checked = await api.check(checks.query_problems, body.text, live.registry)
    if not errors and not checked:
        errors = problem("no query in the text")
    return {"ok": not errors, "errors": errors, "queries": [
        {"name": q.name, "stream": q.schema.stream, "output": q.query.output,
         "live": q.name in live.live} for q in checked]}


@ROUTES.route("GET", "/api/queries/{name}", "One live query with its state",
              {200: (m.Query, "the query"), 404: NOT_LIVE}, kind=LimitKind.READ)
async def query(request: web.Request, name: str) -> Answer:
    api = api_of(request)
    live = (await api.snapshot()).live.get(name)
    if live is None:
        return 404, {"error": f"no live query {name!r}"}
    return api.query_entry(live, (await api.states([live]))[name])


async def _query_change(request: web.Request, op: Op, name: str | None = None,
                        body: m.QueryBody | None = None) -> Answer:
    api = api_of(request)
    wait, timeout = wait_args(body, api.config) if body is not None else \
        (True, float(api.config.timeout_s))
    return await api.changed(Kind.QUERY, op, name, body.text if body is not None else None,
                             name if op is Op.UPDATE else None, wait, timeout)


# Deliberately like services/api/streams.py's add/update/remove: route declarations (path, models,
# documented answers); the work is _query_change's
@ROUTES.route("POST", "/api/queries", "Add the queries of a text", outcomes(created=True),
              body=m.QueryBody, kind=LimitKind.CHANGE, change=True, secured=True, checks=True)
async def add_query(request: web.Request, body: m.QueryBody) -> Answer:
    return await _query_change(request, Op.ADD, body=body)


@ROUTES.route("PUT", "/api/queries/{name}", "Replace a live query", outcomes(),
              body=m.QueryBody, kind=LimitKind.CHANGE, change=True, secured=True, checks=True)
async def update_query(request: web.Request, name: str, body: m.QueryBody) -> Answer:
    return await _query_change(request, Op.UPDATE, name, body)


@ROUTES.route("DELETE", "/api/queries/{name}", "Remove a live query", outcomes(),
              kind=LimitKind.CHANGE, change=True, secured=True)
async def remove_query(request: web.Request, name: str) -> Answer:
    return await _query_change(request, Op.REMOVE, name)


@ROUTES.route("GET", "/api/queries/{name}/explain", "What the live query compiled to (cep "
              "explain): text, a graph, and its SVG drawing where Graphviz is installed",
              {200: (m.Explanation, "the explanation"), 404: NOT_LIVE},
              kind=LimitKind.READ, checks=True)
async def explain_query(request: web.Request, name: str) -> Answer:
    api = api_of(request)
    live = (await api.snapshot()).live.get(name)
    if live is None:
        return 404, {"error": f"no live query {name!r}"}
    return await api.check(checks.explained, live)


@ROUTES.route("GET", "/api/pipeline", "Each stream's pipeline: its processes as a graph "
              "with their rates, its keyed partitions (lag, seq, stream time, last frame), "
              "the last checkpoint of each process, and the composite events withheld with "
              "what they wait for", {200: (m.PipelineList, "a pipeline per stream"),
                                     404: (m.Error, "no stream of that name")},
              params=m.PipelineParams, kind=LimitKind.READ)
async def pipelines(request: web.Request, params: m.PipelineParams) -> Answer:
    api = api_of(request)
    live = await api.snapshot()
    if params.stream is not None and params.stream not in live.streams:
        return 404, {"error": f"no stream {params.stream!r}"}
    streams = [params.stream] if params.stream is not None else \
        sorted({q.checked.schema.stream for q in live.live.values()})
    return {"pipelines": await api.pipelines(streams)}


@ROUTES.route("GET", "/api/history", "The live queries over time (the last 10 minutes): "
              "per query its composites/s, partial matches and state bytes, as columns",
              {200: (m.History, "the points after `since`")}, params=m.HistoryParams,
              kind=LimitKind.READ)
async def history(request: web.Request, params: m.HistoryParams) -> Answer:
    return {"queries": api_of(request).history.since(params.since)}
