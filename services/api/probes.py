"""The probes: the process serves (`/healthz`), the broker answers (`/readyz`)."""

from __future__ import annotations

from aiohttp import web

from cep_service.api import models as m
from cep_service.api.state import api_of
from cep_service.api.openapi import Answer, Routes

ROUTES = Routes()


@ROUTES.route("GET", "/healthz", "The process serves", {200: (m.Alive, "serving")},
              broker=False, guarded=False)
async def healthz(request: web.Request) -> Answer:
    return {"alive": True}


@ROUTES.route("GET", "/readyz", "The broker answers a read of the control topic",
              {200: (m.Ready, "ready"), 503: (m.Ready, "not ready: the broker does not "
                                                       "answer")},
              broker=False, guarded=False)
async def readyz(request: web.Request) -> Answer:
    api = api_of(request)
    try:
        await api.snapshot(api.config.cache_s)  # a read of the control topic that recent
    except Exception as e:  # the broker does not answer: not ready
        return 503, {"ready": False, "control_topic": api.config.control, "reason": str(e)}
    return {"ready": True, "control_topic": api.config.control}
