"""The streams' endpoints: list, one, check, register, change, remove."""

from __future__ import annotations

from aiohttp import web

from cep_core.control_ops import Kind, Op
from cep_service.api import checks
from cep_service.api import models as m
from cep_service.api.replies import outcomes, wait_args
from cep_service.api.limits import LimitKind
from cep_service.api.state import api_of
from cep_service.api.openapi import Answer, Routes

ROUTES = Routes()


@ROUTES.route("GET", "/api/streams", "Every stream: schema files and the control topic's",
              {200: (m.StreamList, "the streams")}, kind=LimitKind.READ)
async def streams(request: web.Request) -> Answer:
    return (await api_of(request).snapshot()).stream_list


@ROUTES.route("POST", "/api/streams/validate", "Check a stream schema (or import a JSON "
              "Schema); changes nothing", {200: (m.StreamChecked, "checked: ok, or the "
                                                 "errors")},
              body=m.StreamCheck, change=True, checks=True, broker=False)
async def validate_stream(request: web.Request, body: m.StreamCheck) -> Answer:
    data = body.model_dump(by_alias=True, exclude_unset=True)
    return await api_of(request).check(checks.checked_stream, data)


@ROUTES.route("GET", "/api/streams/{name}", "One stream",
              {200: (m.Stream, "the stream"), 404: (m.Error, "no stream of that name")},
              kind=LimitKind.READ)
async def stream(request: web.Request, name: str) -> Answer:
    found = (await api_of(request).snapshot()).streams.get(name)
    if found is None:
        return 404, {"error": f"no stream {name!r}"}
    return found


async def _stream_change(request: web.Request, op: Op, name: str | None = None,
                         body: m.StreamBody | None = None) -> Answer:
    api = api_of(request)
    wait, timeout = wait_args(body, api.config) if body is not None else \
        (True, float(api.config.timeout_s))
    text = None
    if body is not None:
        data = body.model_dump(by_alias=True, exclude_unset=True)
        name, text = await api.check(checks.stream_named, data, name)
    return await api.changed(Kind.STREAM, op, name, text, None, wait, timeout)


# Deliberately like services/api/queries.py's add/update/remove: route declarations (path, models,
# documented answers); the work is _stream_change's
@ROUTES.route("POST", "/api/streams", "Register a stream", outcomes(created=True),
              body=m.StreamBody, kind=LimitKind.CHANGE, change=True, secured=True, checks=True)
async def add_stream(request: web.Request, body: m.StreamBody) -> Answer:
    return await _stream_change(request, Op.ADD, body=body)


@ROUTES.route("PUT", "/api/streams/{name}", "Change a stream", outcomes(),
              body=m.StreamBody, kind=LimitKind.CHANGE, change=True, secured=True, checks=True)
async def update_stream(request: web.Request, name: str, body: m.StreamBody) -> Answer:
    return await _stream_change(request, Op.UPDATE, name, body)


@ROUTES.route("DELETE", "/api/streams/{name}", "Remove a stream registered on the "
              "control topic", outcomes(), kind=LimitKind.CHANGE, change=True, secured=True)
async def remove_stream(request: web.Request, name: str) -> Answer:
    return await _stream_change(request, Op.REMOVE, name)
