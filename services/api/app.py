"""`cep serve api`: streams and queries over HTTP (aiohttp), and the web console.

Every change goes through the control topic with the functions of `cep query` / `cep
stream` (services/cli/live.py: check, publish, wait for the outcome, list), so a response
says what the CLI says: applied everywhere, refused (with the checker's reason, line and
column), queued (no pipeline of that stream is up) or timed out. Query text is only
parsed and checked, never executed here. Composite events of a query are tailed from its
INTO topic as server-sent events (services/api/tail.py). The endpoints are
in areas, each a table of its own (services/api/openapi.py's `Routes`: every handler
declared with its request and response models, services/api/models.py):
services/api/probes.py, streams.py, queries.py and tails.py; `make_app` joins them, serves
the OpenAPI 3.1 document they make, and the console (static files in
services/api/console/). The handlers' state is services/api/state.py's `Api`, what the
checking threads run services/api/checks.py. docs/api.md has the endpoints.

Token rule: with CEP_API_TOKEN set every change (POST, PUT, DELETE other than validate)
needs `Authorization: Bearer <token>`; without it the API binds to 127.0.0.1 only (and with
--api-require-token does not start). The Host, Origin, content-type and CORS rules and the
JSON errors are services/api/guard.py's.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import threading
from pathlib import Path

import orjson
from aiohttp import web

from cep_service.api import probes, queries, streams, tails
from cep_service.api.state import (  # noqa: F401  (their home was here)
                                   API,
                                   CHECK_THREADS,
                                   CHECKS_AT_ONCE,
                                   Api,
                                   ApiConfig,
                                   )
from cep_service.api.guard import TOKEN_ENV, Guard, error_response, loopback
from cep_service.api.limits import LimitKind
from cep_service.api.openapi import Routes
from cep_service.stream.serve import log

CONSOLE = Path(__file__).resolve().parent / "console"
MAX_BODY = 1024 * 1024
SWITCH_INTERVAL_S = 0.0005  # `cep serve api` only (a process of its own)
# The areas' endpoints, in order: one table for the routes and the OpenAPI document
ROUTES = Routes.joined(probes.ROUTES, streams.ROUTES, queries.ROUTES, tails.ROUTES)


def bind_host(host: str | None, token: str | None, require_token: bool = False) -> str:
    """The address to listen on: without a token, loopback only, and nowhere with
    `require_token` (ValueError otherwise)."""
    if require_token and not token:
        raise ValueError(f"{TOKEN_ENV} is not set and --api-require-token asks for one")
    if host is None:
        return "0.0.0.0" if token else "127.0.0.1"
    if not token and not loopback(host):
        raise ValueError(f"{TOKEN_ENV} is not set: the API binds to 127.0.0.1 only, not "
                         f"{host!r} (set a token to listen elsewhere)")
    return host


def make_app(config: ApiConfig, bound: str | None = None) -> web.Application:
    """The app; `bound`: the address it listens on (a non-loopback one is an allowed
    Host)."""
    api = Api(config)
    guard = Guard(config.allowed_hosts, config.cors_origins, config.token, bound, MAX_BODY)
    document = orjson.dumps(ROUTES.document(token=bool(config.token)))
    app = web.Application(middlewares=[guard.middleware], client_max_size=MAX_BODY)
    app[API] = api
    ROUTES.add_to(app, lambda request: request.app[API].limits)

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(body=document, content_type="application/json")

    async def console(request: web.Request) -> web.FileResponse:
        return web.FileResponse(CONSOLE / "index.html")

    console_files = {p.relative_to(CONSOLE).as_posix() for p in CONSOLE.rglob("*")
                     if p.is_file()}

    async def console_file(request: web.Request) -> web.StreamResponse:
        name = request.match_info["file"]
        if name not in console_files:
            return error_response(404, f"no such endpoint: GET {request.path}")
        return web.FileResponse(CONSOLE / name)

    async def closing(app: web.Application) -> None:
        api.hub.stop()

    async def closed(app: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, api.close)

    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/", console)
    app.router.add_get("/console/{file:.+}", console_file)
    app.on_response_prepare.append(guard.on_response_prepare)
    app.on_shutdown.append(closing)
    app.on_cleanup.append(closed)
    return app


def raise_open_files_limit(wanted: int) -> int:
    """The soft limit of open files raised toward `wanted` (at most the hard limit): each
    tail is a socket. Returns the soft limit then."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def serve_api(config: ApiConfig, host: str | None, port: int) -> None:
    """Serve until SIGTERM / SIGINT."""
    bound = bind_host(host, config.token, config.require_token)
    files = raise_open_files_limit(config.limits[LimitKind.TAIL]
                                   + config.limits[LimitKind.READ] + 256)
    # The checking threads hold the GIL for milliseconds at a time (a check is ~2 ms of
    # Python): hand it back to the event loop every SWITCH_INTERVAL_S, not every 5 ms.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    log("api_listening", host=bound, port=port, token=bool(config.token),
        allowed_hosts=config.allowed_hosts, cors_origins=config.cors_origins,
        limits={kind.value: n for kind, n in config.limits.items()}, open_files=files)
    web.run_app(make_app(config, bound), host=bound, port=port, print=None, access_log=None,
                handle_signals=True, backlog=1024)


class ApiThread:
    """The API served from a thread of this process (tests, embedding): `url` once
    started; `stop()` closes it."""

    def __init__(self, config: ApiConfig, host: str = "127.0.0.1", port: int = 0):
        self.config, self.port = config, port
        self.host = bind_host(host, config.token, config.require_token)
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="api", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.runner = web.AppRunner(make_app(self.config, self.host), access_log=None,
                                        shutdown_timeout=5)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, self.host, self.port)
            self.loop.run_until_complete(site.start())
            server = site._server
            assert isinstance(server, asyncio.Server)  # started just above
            self.port = server.sockets[0].getsockname()[1]
        except BaseException as e:
            self.error = e
            raise
        finally:
            self.started.set()
        self.loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ApiThread:
        self.error = None
        self.thread.start()
        if not self.started.wait(30) or self.error is not None:
            raise RuntimeError(f"the API did not start: {self.error}")
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)

    def __enter__(self) -> ApiThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
