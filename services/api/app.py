"""`cep serve api`: streams and queries over HTTP (aiohttp), and the web console.

Every change goes through the control topic with the functions of `cep query` / `cep
stream` (services/cli/live.py: check, publish, wait for the outcome, list), so a response
says what the CLI says: applied everywhere, refused (with the checker's reason, line and
column), queued (no pipeline of that stream is up) or timed out. Query text is only
parsed and checked, never executed here. Composite events of a query are tailed from its
INTO topic as server-sent events. The OpenAPI 3.1 document is services/api/openapi.py;
the console is static files in services/api/console/. docs/api.md has the endpoints.

Token rule: with CEP_API_TOKEN set every change (POST, PUT, DELETE other than validate)
needs `Authorization: Bearer <token>`; without it the API binds to 127.0.0.1 only (and with
--api-require-token does not start). The Host, Origin, content-type and CORS rules and the
JSON errors are services/api/guard.py's. Checking a query or a stream is CPU work: it runs
on a small pool of threads of its own, never on the event loop.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
from aiohttp import web
from confluent_kafka import OFFSET_END, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from cep_core.checker import load_query_text
from cep_core.control_message import ControlMessageError, check_stream, replayed
from cep_core.errors import QueryError, QueryErrors
from cep_core.explain import explain
from services.api.errors import Refused
from services.api.guard import TOKEN_ENV, Guard, error_response, json_response, loopback
from services.api.openapi import openapi_document
from services.api.tail import tail_query
from services.stream.control import control_log, publish
from services.stream.kafka import Topics, ensure_topics
from services.stream.live_changes import (
    EXIT,
    live_items,
    query_changes,
    services_view,
    stream_changes,
    stream_text_from_json_schema,
    wait_outcomes,
)
from services.stream.serve import log

CONSOLE = Path(__file__).resolve().parent / "console"
MAX_BODY = 1024 * 1024
CHECK_THREADS = 2  # threads that check query and stream texts
CHECKS_AT_ONCE = 8  # checks running or waiting for a thread; one more is refused (503)
LOCATED = re.compile(r"^<query (?P<query>[^>]*)>:(?P<line>\d+):(?P<column>\d+): "
                     r"error: (?P<message>.*)$", re.M)
CONFLICT = ("is live already", "exists already")
MISSING = ("no live query", "no stream")


class ApiConfig:
    """allowed_hosts: Host names let in besides loopback ones (`*`: any);
    cors_origins: origins whose pages may call the API (CORS) and make changes;
    require_token: refuse to start without a token, on loopback too. A bad origin or host
    is a ValueError here."""

    def __init__(self, settings, topic_prefix: str = "", control: str = "",
                 token: str | None = None, timeout_s: float = 30, metrics_urls=(),
                 cache_s: float = 1.0, allowed_hosts=(), cors_origins=(),
                 require_token: bool = False):
        self.settings, self.prefix, self.token = settings, topic_prefix, token or None
        self.control = Topics("", control=control, prefix=topic_prefix).control
        self.timeout_s, self.metrics_urls, self.cache_s = timeout_s, list(metrics_urls), cache_s
        self.allowed_hosts, self.cors_origins = list(allowed_hosts), list(cors_origins)
        self.require_token = require_token
        Guard(self.allowed_hosts, self.cors_origins)  # the check


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


def located_errors(text: str) -> list[dict]:
    """A reason as errors: each checker line `<query NAME>:line:col: error: message` with
    its line and column; each other line (the source and caret lines under a located one
    aside) with null line and column."""
    out = []
    for line in text.splitlines():
        found = LOCATED.match(line)
        if found:
            out.append({"message": found["message"], "line": int(found["line"]),
                        "column": int(found["column"]), "query": found["query"],
                        "source_line": None})
        elif line.strip() and not line.startswith("    "):
            out.append({"message": line, "line": None, "column": None, "query": None,
                        "source_line": None})
    return out or [{"message": text, "line": None, "column": None, "query": None,
                    "source_line": None}]


def query_problems(text: str, registry) -> tuple[list[dict], list]:
    """(errors, checked queries) of a query text, checked against `registry`."""
    lines = text.splitlines()
    try:
        return [], load_query_text(text, registry, "<query>")
    except (QueryErrors, QueryError) as e:
        errors = e.errors if isinstance(e, QueryErrors) else [e]
        return [{"message": err.message, "line": err.pos.line or None,
                 "column": err.pos.column or None, "query": None,
                 "source_line": lines[err.pos.line - 1]
                 if 0 < err.pos.line <= len(lines) else None} for err in errors], []


class Api:
    """The handlers; Kafka work runs in threads (confluent-kafka blocks)."""

    def __init__(self, config: ApiConfig):
        self.config = config
        self._records: tuple[float, list] | None = None
        self._rates: dict[str, tuple[float, int]] = {}
        self._ends: dict[str, object] = {}  # INTO topic -> consumer at its end
        self._lock = threading.Lock()
        self.closing = threading.Event()  # set at shutdown: open tails end
        self._checks = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="api-check")
        self._checking = 0  # checks running or waiting for a thread
        self._checking_lock = threading.Lock()

    # ------------------------------------------------------------ checking texts

    def _check_begins(self) -> None:
        with self._checking_lock:
            if self._checking >= CHECKS_AT_ONCE:
                raise Refused(503, {"error": f"{CHECKS_AT_ONCE} checks are running or "
                                    "waiting: retry"}, {"Retry-After": "1"})
            self._checking += 1

    def _check_ends(self) -> None:
        with self._checking_lock:
            self._checking -= 1

    async def check(self, fn, *args):
        """fn(*args) on the checking threads, awaited from the event loop."""
        self._check_begins()
        try:
            return await asyncio.wrap_future(self._checks.submit(fn, *args))
        finally:
            self._check_ends()

    def checked(self, fn, *args):
        """fn(*args) on the checking threads, from another thread (a change)."""
        self._check_begins()
        try:
            return self._checks.submit(fn, *args).result()
        finally:
            self._check_ends()

    # ------------------------------------------------------------ reading the topics

    def records(self, fresh: bool = False) -> list:
        now = time.monotonic()
        if fresh or self._records is None or now - self._records[0] > self.config.cache_s:
            self._records = (now, control_log(self.config.settings, self.config.control))
        return self._records[1]

    def live(self, fresh: bool = False):
        return replayed(self.records(fresh))

    def status_view(self, stream: str) -> dict:
        return services_view(self.config.settings, Topics(stream, prefix=self.config.prefix)
                             .status)

    def query_entry(self, query, with_state: bool) -> dict:
        entry = {"name": query.name, "stream": query.checked.schema.stream,
                 "output": query.output, "index": query.index, "text": query.text}
        if with_state:
            entry["state"] = self.state(query)
        return entry

    def state(self, query) -> dict:
        stream = query.checked.schema.stream
        view = self.status_view(stream)
        held = next((i for i in live_items(view, "query") if i["name"] == query.name), None)
        partitions = sorted({p for e in view.values() for p, live in e["partitions"].items()
                             if query.name in ((live or {}).get("queries") or {})})
        total, rate = self.output_rate(query.output)
        out = {"live": held is not None, "services": held["services"] if held else [],
               "partitions": partitions, "into_records": total,
               "composites_per_s": rate,
               "failed": held is not None and held["state"] == "failed",
               "reason": held.get("reason") if held else None}
        out.update(self.scraped(query.name))
        return out

    def output_rate(self, topic: str) -> tuple[int | None, float | None]:
        """Records on the INTO topic and their rate since the last look (shared by the
        queries writing the same topic): the fetch high-watermarks of a consumer kept per
        topic at its end (ListOffsets is not trusted, docs/broker.md)."""
        with self._lock:
            consumer = self._ends.get(topic)
            if consumer is None:
                consumer = self.config.settings.consumer()
                metadata = consumer.list_topics(topic, timeout=5).topics.get(topic)
                if metadata is None or metadata.error is not None:
                    consumer.close()
                    return None, None
                consumer.assign([TopicPartition(topic, p, OFFSET_END)
                                 for p in metadata.partitions])
                self._ends[topic] = consumer
            consumer.consume(1000, 0.3)
            highs = [consumer.get_watermark_offsets(tp, cached=True)[1]
                     for tp in consumer.assignment()]
        if any(h < 0 for h in highs):
            return None, None
        total, now = sum(highs), time.monotonic()
        before = self._rates.get(topic)
        self._rates[topic] = (now, total)
        if before is None or now - before[0] < 0.05:
            return total, None
        return total, round((total - before[1]) / (now - before[0]), 3)

    def close(self) -> None:
        self._checks.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for consumer in self._ends.values():
                consumer.close()
            self._ends.clear()

    def scraped(self, query: str) -> dict:
        """The query's partial matches and the services' events in, from their Prometheus
        endpoints (`--metrics URL`), summed."""
        if not self.config.metrics_urls:
            return {}
        partial, events_in = None, 0.0
        for url in self.config.metrics_urls:
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    text = reply.read().decode()
            except OSError:
                continue
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == "cep_partial_matches" and \
                            sample.labels.get("query") == query:
                        partial = (partial or 0) + int(sample.value)
                    elif sample.name == "cep_events_in_total":
                        events_in += sample.value
        return {"partial_matches": partial, "events_in": events_in}

    # ------------------------------------------------------------ changes

    def change(self, kind: str, op: str, name: str | None, text: str | None,
               only: str | None, wait: bool, timeout_s: float) -> tuple[int, dict]:
        records = self.records(fresh=True)
        if kind == "query" and op != "remove":
            errors, _ = self.checked(query_problems, text, self.live().registry)
            if errors:
                return 422, {"outcome": "invalid", "errors": errors, "changes": []}
        try:
            changes = query_changes(op, name, text or "", "<query>", only, records) \
                if kind == "query" else stream_changes(op, name, text, records)
        except ControlMessageError as e:
            reason = str(e)
            status = 409 if any(c in reason for c in CONFLICT) else \
                404 if any(m in reason for m in MISSING) else 422
            return status, {"outcome": "invalid", "errors": located_errors(reason),
                            "changes": []}
        if not changes:
            return 422, {"outcome": "invalid", "changes": [], "errors": located_errors(
                f"the text defines no query {only!r}")}
        settings = self.config.settings
        ensure_topics(settings, {self.config.control: 1}, compacted=(self.config.control,))
        sent = []
        for message, key, stream_of in changes:
            offset = publish(settings, self.config.control, message, key)
            sent.append(({"key": key.decode(), "offset": offset}, message, stream_of))
        self._records = None
        if not wait:
            return 202, {"outcome": "sent", "errors": [], "changes": [
                {"kind": m.kind, "name": m.name, "op": m.op, **c, "outcome": "sent"}
                for c, m, _ in sent]}
        found = wait_outcomes(settings, sent, self.config.prefix, self.config.control,
                              timeout_s)
        worst = max(found, key=lambda o: EXIT[o["outcome"]])["outcome"]
        errors = [e for o in found if o["outcome"] == "refused"
                  for e in located_errors(o["reason"])]
        status = {"applied": 201 if op == "add" else 200, "queued": 202, "refused": 409,
                  "timed_out": 504}[worst]
        return status, {"outcome": worst, "errors": errors, "changes": found}


async def _body(request: web.Request) -> dict:
    try:
        data = orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        raise Refused(400, {"error": f"not JSON: {e}"}) from None
    if not isinstance(data, dict):
        raise Refused(400, {"error": "the body is a JSON object"})
    return data


def _wait_args(data: dict, config: ApiConfig) -> tuple[bool, float]:
    wait, timeout = data.get("wait", True), data.get("timeout_s", config.timeout_s)
    if not isinstance(wait, bool) or isinstance(timeout, bool) or \
            not isinstance(timeout, (int, float)) or not 0.1 <= timeout <= 300:
        raise Refused(400, {"error": "wait is a boolean, timeout_s a number of seconds in "
                                 "[0.1, 300]"})
    return wait, float(timeout)


def _text_of(data: dict, field: str = "text") -> str:
    text = data.get(field)
    if not isinstance(text, str) or not text.strip():
        raise Refused(400, {"error": f"{field}: a non-empty string"})
    return text


def _stream_text(data: dict, name: str | None = None) -> str:
    """A stream schema's JSON text from `schema` (as schemas/*.json) or `json_schema` (a
    JSON Schema of one event, with optional `time`, `time_unit`, `type_attribute`,
    `skip_optional`)."""
    if isinstance(data.get("schema"), dict):
        return orjson.dumps(data["schema"]).decode()
    if "json_schema" in data:
        options = {k: data[k] for k in ("time", "time_unit", "type_attribute")
                   if isinstance(data.get(k), str)}
        if isinstance(data.get("skip_optional"), bool):
            options["skip_optional"] = data["skip_optional"]
        named = name or data.get("name")
        try:
            return stream_text_from_json_schema(data["json_schema"], named if
                                                isinstance(named, str) else None, **options)
        except ControlMessageError as e:
            raise Refused(422, {"outcome": "invalid", "errors": located_errors(str(e)),
                                "changes": []}) from None
    raise Refused(400, {"error": "give schema (a stream schema) or json_schema (a JSON "
                                 "Schema of one event)"})


def _stream_name(text: str) -> str:
    try:
        name = orjson.loads(text).get("stream")
    except AttributeError:
        name = None
    if not isinstance(name, str):
        raise Refused(422, {"outcome": "invalid", "changes": [], "errors": located_errors(
            'a stream schema names its stream ("stream")')})
    return name


def _checked_stream(data: dict) -> dict:
    """The answer of /api/streams/validate (a checking thread's work)."""
    try:
        text = _stream_text(data)
    except Refused as e:
        if e.status != 422:
            raise
        return {"ok": False, "errors": e.body["errors"]}
    name = _stream_name(text)
    try:
        schema = check_stream(name, text)
    except ControlMessageError as e:
        return {"ok": False, "errors": located_errors(str(e))}
    return {"ok": True, "errors": [], "schema": schema.to_dict()}


def _stream_named(data: dict, name: str | None) -> tuple[str, str]:
    """(name, schema text) of a stream change's body (a checking thread's work)."""
    text = _stream_text(data, name)
    given = _stream_name(text)
    if name is not None and given != name:
        raise Refused(422, {"outcome": "invalid", "changes": [], "errors": located_errors(
            f"the schema describes stream {given!r}, not {name!r}")})
    return given, text


API = web.AppKey("api", Api)


def make_app(config: ApiConfig, bound: str | None = None) -> web.Application:
    """The app; `bound`: the address it listens on (a non-loopback one is an allowed
    Host)."""
    api = Api(config)
    guard = Guard(config.allowed_hosts, config.cors_origins, config.token, bound, MAX_BODY)
    routes = web.RouteTableDef()

    @routes.get("/healthz")
    async def healthz(request):
        return json_response({"alive": True})

    @routes.get("/readyz")
    async def readyz(request):
        try:
            await asyncio.to_thread(api.records, True)
        except Exception as e:  # the broker does not answer: not ready
            return json_response({"ready": False, "control_topic": config.control,
                                  "reason": str(e)}, 503)
        return json_response({"ready": True, "control_topic": config.control})

    @routes.get("/openapi.json")
    async def openapi(request):
        return json_response(openapi_document())

    @routes.get("/")
    async def console(request):
        return web.FileResponse(CONSOLE / "index.html")

    console_files = {p.name for p in CONSOLE.iterdir() if p.is_file()}

    @routes.get("/console/{file}")
    async def console_file(request):
        name = request.match_info["file"]
        if name not in console_files:
            return error_response(404, f"no such endpoint: GET {request.path}")
        return web.FileResponse(CONSOLE / name)

    # ---------------------------------------------------------------- streams

    @routes.get("/api/streams")
    async def streams(request):
        live = await asyncio.to_thread(api.live)
        return json_response({"streams": [_stream_entry(live.registry, n)
                                          for n in live.registry.names()]})

    @routes.get("/api/streams/{name}")
    async def stream(request):
        live = await asyncio.to_thread(api.live)
        name = request.match_info["name"]
        if live.registry.get(name) is None:
            return error_response(404, f"no stream {name!r}")
        return json_response(_stream_entry(live.registry, name))

    @routes.post("/api/streams/validate")
    async def validate_stream(request):
        data = await _body(request)
        return json_response(await api.check(_checked_stream, data))

    async def stream_change(request, op: str, name: str | None = None):
        data = await _body(request) if op != "remove" else {}
        wait, timeout = _wait_args(data, config)
        text = None
        if op != "remove":
            name, text = await api.check(_stream_named, data, name)
        status, body = await asyncio.to_thread(api.change, "stream", op, name, text, None,
                                               wait, timeout)
        return json_response(body, status)

    @routes.post("/api/streams")
    async def add_stream(request):
        return await stream_change(request, "add")

    @routes.put("/api/streams/{name}")
    async def update_stream(request):
        return await stream_change(request, "update", request.match_info["name"])

    @routes.delete("/api/streams/{name}")
    async def remove_stream(request):
        return await stream_change(request, "remove", request.match_info["name"])

    # ---------------------------------------------------------------- queries

    @routes.get("/api/queries")
    async def queries(request):
        stream = request.query.get("stream")
        with_state = request.query.get("state", "true") != "false"

        def listed():
            live = api.live()
            return [api.query_entry(q, with_state) for q in
                    sorted(live.live.values(), key=lambda q: q.index)
                    if stream is None or q.checked.schema.stream == stream]
        return json_response({"queries": await asyncio.to_thread(listed)})

    @routes.get("/api/queries/{name}")
    async def query(request):
        name = request.match_info["name"]

        def found():
            live = api.live().live.get(name)
            return None if live is None else api.query_entry(live, True)
        entry = await asyncio.to_thread(found)
        return json_response(entry) if entry else error_response(404, f"no live query {name!r}")

    @routes.post("/api/queries/validate")
    async def validate_query(request):
        data = await _body(request)
        text = data.get("text")
        if not isinstance(text, str):
            return error_response(400, "text: a string")
        live = await asyncio.to_thread(api.live)
        errors, checked = await api.check(query_problems, text, live.registry)
        if not errors and not checked:
            errors = [{"message": "no query in the text", "line": None, "column": None,
                       "query": None, "source_line": None}]
        return json_response({"ok": not errors, "errors": errors, "queries": [
            {"name": q.name, "stream": q.schema.stream, "output": q.query.output,
             "live": q.name in live.live} for q in checked]})

    async def query_change(request, op: str, name: str | None = None):
        data = await _body(request) if op != "remove" else {}
        wait, timeout = _wait_args(data, config)
        text = _text_of(data) if op != "remove" else None
        status, body = await asyncio.to_thread(api.change, "query", op, name, text,
                                               name if op == "update" else None, wait,
                                               timeout)
        return json_response(body, status)

    @routes.post("/api/queries")
    async def add_query(request):
        return await query_change(request, "add")

    @routes.put("/api/queries/{name}")
    async def update_query(request):
        return await query_change(request, "update", request.match_info["name"])

    @routes.delete("/api/queries/{name}")
    async def remove_query(request):
        return await query_change(request, "remove", request.match_info["name"])

    @routes.get("/api/queries/{name}/explain")
    async def explain_query(request):
        name = request.match_info["name"]

        def explained():
            live = api.live().live.get(name)
            if live is None:
                return None
            found = explain(live.checked)
            try:
                svg = found.svg()
            except RuntimeError:
                svg = None
            return {**found.to_json(), "text": found.text(), "dot": found.dot(), "svg": svg}
        entry = await asyncio.to_thread(explained)
        return json_response(entry) if entry else error_response(404, f"no live query {name!r}")

    @routes.get("/api/queries/{name}/tail")
    async def tail(request):
        return await tail_query(request, api, request.match_info["name"])

    async def closing(app):
        api.closing.set()

    async def closed(app):
        await asyncio.to_thread(api.close)

    app = web.Application(middlewares=[guard.middleware], client_max_size=MAX_BODY)
    app[API] = api
    app.on_response_prepare.append(guard.on_response_prepare)
    app.on_shutdown.append(closing)
    app.on_cleanup.append(closed)
    app.add_routes(routes)
    return app


def _stream_entry(registry, name: str) -> dict:
    schema = registry.get(name)
    registered = registry.streams.get(name)
    return {"name": name, "source": "control" if registered else "file",
            "version": registered[1] if registered else None, "schema": schema.to_dict()}


def serve_api(config: ApiConfig, host: str | None, port: int) -> None:
    """Serve until SIGTERM / SIGINT."""
    bound = bind_host(host, config.token, config.require_token)
    log("api_listening", host=bound, port=port, token=bool(config.token),
        allowed_hosts=config.allowed_hosts, cors_origins=config.cors_origins)
    web.run_app(make_app(config, bound), host=bound, port=port, print=None, access_log=None,
                handle_signals=True)


class ApiThread:
    """The API served from a thread of this process (tests, embedding): `url` once
    started; `stop()` closes it."""

    def __init__(self, config: ApiConfig, host: str = "127.0.0.1", port: int = 0):
        self.config, self.port = config, port
        self.host = bind_host(host, config.token, config.require_token)
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, name="api", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.runner = web.AppRunner(make_app(self.config, self.host), access_log=None,
                                        shutdown_timeout=5)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, self.host, self.port)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
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

    def __exit__(self, *exc) -> None:
        self.stop()
