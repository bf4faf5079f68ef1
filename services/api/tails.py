"""The tails: a query's, or several queries', composite events as server-sent events."""

from __future__ import annotations

from aiohttp import web

from cep_service.api import models as m
from cep_service.api.replies import NOT_LIVE
from cep_service.api.limits import LimitKind
from cep_service.api.state import api_of
from cep_service.api.openapi import Answer, Routes
from cep_service.api.tail import TailFrom
from cep_service.api.tail import stream as tail_stream
from cep_service.stream.kafka import Topics

ROUTES = Routes()


@ROUTES.route("GET", "/api/queries/{name}/tail", "The query's composite events as "
              "server-sent events", {200: (None, "`event: composite`, `id: "
                                           "PARTITION:OFFSET`, `data:` one composite "
                                           "event as JSON"), 404: NOT_LIVE},
              params=m.TailParams, kind=LimitKind.TAIL, event_stream=True)
async def tail(request: web.Request, name: str, params: m.TailParams) -> Answer:
    api = api_of(request)
    live = (await api.snapshot()).live.get(name)
    if live is None:
        return 404, {"error": f"no live query {name!r}"}
    tag = Topics(live.checked.schema.stream, prefix=api.config.prefix).group("coordinator")
    start = TailFrom(params.start)
    replay = start is TailFrom.BEGINNING
    if replay:
        api.limits.enter(LimitKind.REPLAY)
    try:
        return await tail_stream(request, api.hub, {live.output: (tag, {name})},
                                 start, params.limit, params.idle_s)
    finally:
        if replay:
            api.limits.leave(LimitKind.REPLAY)


@ROUTES.route("GET", "/api/tail", "The composite events of several live queries (default: "
              "all) as server-sent events, from now on", {200: (None, "`event: composite`, "
                                                          "`id: PARTITION:OFFSET`, `data:` "
                                                          "one composite event as JSON"),
                                                     404: NOT_LIVE},
              params=m.TailManyParams, kind=LimitKind.TAIL, event_stream=True)
async def tail_many(request: web.Request, params: m.TailManyParams) -> Answer:
    api = api_of(request)
    live = (await api.snapshot()).live
    names = params.queries.split(",") if params.queries else sorted(live)
    missing = [n for n in names if n not in live]
    if missing or not names:
        return 404, {"error": f"no live query {missing[0]!r}" if missing else
                     "no live query to follow"}
    wanted: dict[str, tuple[str, set[str]]] = {}
    for name in names:
        query = live[name]
        tag = Topics(query.checked.schema.stream, prefix=api.config.prefix).group("coordinator")
        wanted.setdefault(query.output, (tag, set()))[1].add(name)
    return await tail_stream(request, api.hub, wanted, TailFrom.END, params.limit, params.idle_s)
