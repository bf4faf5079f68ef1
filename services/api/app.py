"""`cep serve api`: streams and queries over HTTP (aiohttp), and the web console.

Every change goes through the control topic with the functions of `cep query` / `cep
stream` (services/cli/live.py: check, publish, wait for the outcome, list), so a response
says what the CLI says: applied everywhere, refused (with the checker's reason, line and
column), queued (no pipeline of that stream is up) or timed out. Query text is only
parsed and checked, never executed here. Composite events of a query are tailed from its
INTO topic as server-sent events (services/api/tail.py). Each handler is declared with its
request and response models (services/api/models.py) by `ROUTES.route`, from which
services/api/openapi.py serves the OpenAPI 3.1 document; the console is static files in
services/api/console/. docs/api.md has the endpoints.

Token rule: with CEP_API_TOKEN set every change (POST, PUT, DELETE other than validate)
needs `Authorization: Bearer <token>`; without it the API binds to 127.0.0.1 only (and with
--api-require-token does not start). The Host, Origin, content-type and CORS rules and the
JSON errors are services/api/guard.py's.

Nothing blocks the event loop: what a read needs from the broker and the services'
metrics is loaded on a small fixed pool (`IO_THREADS`), one load per key at a time and
kept `cache_s` (services/api/limits.py, SingleFlight); checking a query or a stream (and
explaining one) is CPU work on `CHECK_THREADS` threads of its own; a change waits for its
outcome on a thread of a pool as large as the changes' limit; the tails share one thread
and one consumer (services/api/tail.py). Each kind of request has a limit in flight
(`ApiConfig.limits`, CEP_API_MAX_* variables): one more is 429 with Retry-After, never
queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
from aiohttp import web
from confluent_kafka import OFFSET_END, KafkaException, TopicPartition

from cep_core.checker import load_query_text
from cep_core.control_message import ControlMessageError, check_stream, replayed
from cep_core.control_ops import Kind, Op
from cep_core.errors import Category, QueryError, QueryErrors
from cep_core.explain import explain
from services.api import models as m
from services.api.errors import Refused, invalid, problem, problems
from services.api.guard import TOKEN_ENV, Guard, error_response, loopback
from services.api.history import History
from services.api.limits import Limits, SingleFlight
from services.api.openapi import Routes
from services.api.pipeline import Drawings, endpoint_figures, look, pipeline, process_figures
from services.api.tail import TailHub
from services.api.tail import stream as tail_stream
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
CHECK_THREADS = 2  # threads that check (and explain) query and stream texts
CHECKS_AT_ONCE = 8  # checks running or waiting for a thread; one more is refused (429)
IO_THREADS = 4  # threads that load what reads need from the broker and the metrics
# Requests in flight per kind; one more is 429 with Retry-After. read: GETs of /api;
# check: checks running or waiting for a checking thread; change: changes waiting for
# their outcome (each on a thread); tail: open tails; replay: tails from the beginning
# (each has a consumer of its own).
LIMITS = {"read": 512, "check": CHECKS_AT_ONCE, "change": 16, "tail": 1000, "replay": 8}
LIMIT_ENV = {kind: f"CEP_API_MAX_{kind.upper()}S" for kind in LIMITS}
# the INTO topics' end consumer: it reads records only to learn the high-watermarks
RATES_CONSUMER = {"queued.min.messages": 1000, "queued.max.messages.kbytes": 1024}
SWITCH_INTERVAL_S = 0.0005  # `cep serve api` only (a process of its own)
TAIL_BUFFER = 1024  # composite events a tail may have unsent before it is dropped
TAIL_BUFFER_ENV = "CEP_API_TAIL_BUFFER"


def _positive_env(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={raw!r}: a positive integer")
    return value


class ApiConfig:
    """allowed_hosts: Host names let in besides loopback ones (`*`: any);
    cors_origins: origins whose pages may call the API (CORS) and make changes;
    require_token: refuse to start without a token, on loopback too; limits: requests in
    flight per kind (LIMITS; each defaults to its CEP_API_MAX_* variable, then LIMITS);
    tail_buffer: events a tail may have unsent before its reader is dropped. A bad origin,
    host or limit is a ValueError here."""

    def __init__(self, settings, topic_prefix: str = "", control: str = "",
                 token: str | None = None, timeout_s: float = 30, metrics_urls=(),
                 cache_s: float = 1.0, allowed_hosts=(), cors_origins=(),
                 require_token: bool = False, limits: dict | None = None,
                 tail_buffer: int | None = None):
        self.settings, self.prefix, self.token = settings, topic_prefix, token or None
        self.control = Topics("", control=control, prefix=topic_prefix).control
        self.timeout_s, self.metrics_urls, self.cache_s = timeout_s, list(metrics_urls), cache_s
        self.allowed_hosts, self.cors_origins = list(allowed_hosts), list(cors_origins)
        self.require_token = require_token
        self.limits = {kind: _positive_env(LIMIT_ENV[kind], default)
                       for kind, default in LIMITS.items()}
        for kind, value in (limits or {}).items():
            if kind not in LIMITS or not isinstance(value, int) or value < 1:
                raise ValueError(f"limit {kind}={value!r}: one of {', '.join(LIMITS)}, "
                                 "a positive integer")
            self.limits[kind] = value
        self.tail_buffer = tail_buffer or _positive_env(TAIL_BUFFER_ENV, TAIL_BUFFER)
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


def query_problems(text: str, registry) -> tuple[list[dict], list]:
    """(errors, checked queries) of a query text, checked against `registry`."""
    try:
        return [], load_query_text(text, registry, "<query>")
    except (QueryErrors, QueryError) as e:
        return [err.with_source(text).problem().to_json() for err in e.errors], []


class Snapshot:
    """What reads need of the control topic's live set, made once per load (on an I/O
    thread: a registry looks schema files up): `live` (name -> live query), `registry`,
    `streams` (every stream's answer, as the model sends it)."""

    def __init__(self, live):
        self.live, self.registry = live.live, live.registry
        self.streams = {n: m.Stream.model_validate(_stream_entry(live.registry, n))
                        for n in live.registry.names()}
        self.stream_list = m.StreamList(streams=list(self.streams.values()))


class Api:
    """The handlers' state: the limits, the pools, what reads keep, the tails."""

    def __init__(self, config: ApiConfig):
        self.config = config
        self.limits = Limits(config.limits)
        self._records: tuple[float, list] | None = None
        self._rates: dict[str, tuple[float, int]] = {}
        self._ends = None  # one consumer at the end of every INTO topic looked at
        self._end_parts: dict[str, list] = {}  # INTO topic -> its partitions, assigned
        self._into_topics: set[str] = set()  # the INTO topics to look at
        self._lock = threading.Lock()
        self._checks = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="api-check")
        self._io = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="api-io")
        self._changes = ThreadPoolExecutor(config.limits["change"],
                                           thread_name_prefix="api-change")
        self.kept = SingleFlight(self._io, config.cache_s)
        self.hub = TailHub(config.settings, config.tail_buffer)
        self.history = History()
        self.drawings = Drawings()
        self._scraped: dict[str, tuple] = {}  # metrics URL -> (time, events in, out)

    # ------------------------------------------------------------ checking texts

    async def check(self, fn, *args):
        """fn(*args) on the checking threads, awaited from the event loop (429 when
        CHECKS_AT_ONCE checks run or wait already)."""
        self.limits.enter("check")
        try:
            return await asyncio.wrap_future(self._checks.submit(fn, *args))
        finally:
            self.limits.leave("check")

    def checked(self, fn, *args):
        """fn(*args) on the checking threads, from another thread (a change)."""
        self.limits.enter("check")
        try:
            return self._checks.submit(fn, *args).result()
        finally:
            self.limits.leave("check")

    async def changed(self, *args) -> tuple[int, dict]:
        """`change(*args)` on a change thread (as many as the changes' limit: none
        waits); what reads keep is dropped after it."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._changes,
                                                                    self.change, *args)
        finally:
            self.kept.forget()

    # ------------------------------------------------------------ reading the topics

    def records(self, fresh: bool = False) -> list:
        now = time.monotonic()
        if fresh or self._records is None or now - self._records[0] > self.config.cache_s:
            self._records = (now, control_log(self.config.settings, self.config.control))
        return self._records[1]

    def live(self, fresh: bool = False):
        return replayed(self.records(fresh))

    async def snapshot(self, max_age_s: float | None = None) -> Snapshot:
        """The live set of the control topic (queries, registry, the streams' entries),
        loaded on the I/O threads (see SingleFlight for its age)."""
        return await self.kept.get("live", lambda: Snapshot(self.live(True)), max_age_s)

    async def status_view(self, stream: str) -> dict:
        topic = Topics(stream, prefix=self.config.prefix).status
        return await self.kept.get(("status", stream),
                                   lambda: services_view(self.config.settings, topic))

    async def into(self, topics) -> dict[str, tuple[int | None, float | None]]:
        """(records, rate) of each INTO topic: one load looks at every topic asked for
        so far (the first time a topic is asked for, a new load is waited for)."""
        new = set(topics) - self._into_topics
        if new:
            self._into_topics |= new
            self.kept.forget("into")
        for _ in range(2):  # a load begun before the new topics came lacks them
            found = await self.kept.get("into", lambda: self.output_rates(
                sorted(self._into_topics)))
            if all(t in found for t in topics):
                break
            self.kept.forget("into")
        return {t: found.get(t, (None, None)) for t in topics}

    async def metrics(self) -> dict | None:
        if not self.config.metrics_urls:
            return None
        return await self.kept.get("metrics", self.scrape)

    def query_entry(self, query, state: dict | None) -> dict:
        entry = {"name": query.name, "stream": query.checked.schema.stream,
                 "output": query.output, "index": query.index, "text": query.text}
        if state is not None:
            entry["state"] = state
        return entry

    async def states(self, queries) -> dict[str, dict]:
        """The state of each query (by name), from what reads keep: one load per stream's
        status topic, INTO topic and the metrics, whatever the number of queries."""
        streams = sorted({q.checked.schema.stream for q in queries})
        topics = sorted({q.output for q in queries})
        *found, rates, scraped = await asyncio.gather(
            *(self.status_view(s) for s in streams), self.into(topics), self.metrics())
        held = {}  # stream -> (query -> its live item, query -> its partitions)
        for stream, view in zip(streams, found):
            parts: dict[str, set] = {}
            for entry in view.values():
                for p, live in entry["partitions"].items():
                    for name in (live or {}).get("queries") or {}:
                        parts.setdefault(name, set()).add(p)
            held[stream] = ({i["name"]: i for i in live_items(view, Kind.QUERY)}, parts)
        found = {q.name: self.state(q, held[q.checked.schema.stream], rates[q.output],
                                    scraped) for q in queries}
        self.history.add(found)
        return found

    @staticmethod
    def state(query, held: tuple, rate: tuple, scraped: dict | None) -> dict:
        items, parts = held
        held = items.get(query.name)
        partitions = sorted(parts.get(query.name, ()))
        total, per_s = rate
        out = {"live": held is not None, "services": held["services"] if held else [],
               "partitions": partitions, "into_records": total,
               "composites_per_s": per_s,
               "failed": held is not None and held["state"] == "failed",
               "reason": held.get("reason") if held else None}
        if scraped is not None:
            out.update(partial_matches=scraped["partial"].get(query.name),
                       state_bytes=scraped["state_bytes"].get(query.name),
                       events_in=scraped["events_in"])
        return out

    def output_rates(self, topics: list[str]) -> dict[str, tuple]:
        """Records on each INTO topic and their rate since the last look (shared by the
        queries writing the same topic): the fetch high-watermarks of one consumer kept
        at the end of every topic (ListOffsets is not trusted, docs/broker.md). An I/O
        thread's work, one look at a time. A topic not there yet is (None, None)."""
        with self._lock:
            if self._ends is None:
                # records are fetched only to learn the high-watermarks: keep few queued
                self._ends = self.config.settings.consumer(**RATES_CONSUMER)
            consumer = self._ends
        for topic in topics:
            if topic in self._end_parts:
                continue
            metadata = consumer.list_topics(topic, timeout=5).topics.get(topic)
            if metadata is None or metadata.error is not None or not metadata.partitions:
                continue
            parts = [TopicPartition(topic, p, OFFSET_END) for p in metadata.partitions]
            consumer.incremental_assign(parts)
            self._end_parts[topic] = parts
        # A fetch brings the high-watermarks, but none is made while the consumer's queue
        # is full (it stopped at the 100,000 records of queued.min.messages: the rate was
        # 0 from then on): from the last high-watermark on, the queue is dropped first.
        for parts in self._end_parts.values():
            for tp in parts:
                high = consumer.get_watermark_offsets(tp, cached=True)[1]
                if high >= 0:
                    with contextlib.suppress(KafkaException):  # not fetched from yet
                        consumer.seek(TopicPartition(tp.topic, tp.partition, high))
        if self._end_parts:
            consumer.consume(1000, 0.3)
        out, now = {}, time.monotonic()
        for topic in topics:
            parts = self._end_parts.get(topic)
            highs = [consumer.get_watermark_offsets(tp, cached=True)[1]
                     for tp in parts or ()]
            if not highs or any(h < 0 for h in highs):
                out[topic] = (None, None)
                continue
            total = sum(highs)
            before = self._rates.get(topic)
            self._rates[topic] = (now, total)
            rate = None if before is None or now - before[0] < 0.05 else \
                round((total - before[1]) / (now - before[0]), 3)
            out[topic] = (total, rate)
        return out

    def scrape(self) -> dict:
        """From the services' Prometheus endpoints (`--metrics URL`, an I/O thread's
        work): the queries' partial matches and state bytes and the services' events in,
        summed; each endpoint's process (services/api/pipeline.py), by service name."""
        partial: dict[str, int] = {}
        state_bytes: dict[str, int] = {}
        processes: dict[str, dict] = {}
        events_in = 0.0
        for url in self.config.metrics_urls:
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    figures = endpoint_figures(reply.read().decode())
            except (OSError, ValueError):
                continue
            for labels, value in figures.get("cep_partial_matches", ()):
                partial[labels["query"]] = partial.get(labels["query"], 0) + int(value)
            for labels, value in figures.get("cep_engine_state", ()):
                if labels.get("measure") == "state_bytes":
                    query = labels["query"]
                    state_bytes[query] = state_bytes.get(query, 0) + int(value)
            now = time.time()
            found = process_figures(figures, self._scraped.get(url), now)
            self._scraped[url] = look(found, now)
            events_in += found["events_in"]
            processes[found["service"] or url] = found
        return {"partial": partial, "state_bytes": state_bytes, "events_in": events_in,
                "processes": processes}

    async def pipelines(self, streams: list[str]) -> list[dict]:
        """The pipeline view of each stream (services/api/pipeline.py), its graph drawn on
        an I/O thread when its shape is new."""
        live = await self.snapshot()
        views = await asyncio.gather(*(self.status_view(s) for s in streams))
        scraped = await self.metrics()
        out = []
        for stream, view in zip(streams, views):
            outputs = sorted({q.output for q in live.live.values()
                              if q.checked.schema.stream == stream})
            rates = await self.into(outputs) if outputs else {}
            per_s = [r for _, r in rates.values() if r is not None]
            found = pipeline(stream, Topics(stream, prefix=self.config.prefix), view,
                             (scraped or {}).get("processes", {}),
                             {"composites_per_s": round(sum(per_s), 3) if per_s else None,
                              "tails": len(self.hub.tails)}, self.config.settings.bootstrap)
            schema = live.streams.get(stream)
            found["time_unit"] = schema.stream_schema.get("time_unit") if schema else None
            found["svg"] = await asyncio.get_running_loop().run_in_executor(
                self._io, self.drawings.svg, found)
            out.append(found)
        return out

    def stats(self) -> dict:
        """The server's own counters: limits, tails, threads (tests, the benchmark)."""
        return {"limits": self.limits.stats(), "tails": dict(self.hub.counters),
                "open_tails": len(self.hub.tails), "threads": threading.active_count(),
                "loads": sum(self.kept.loads.values())}

    def close(self) -> None:
        """After the loop's part of stopping (the hub's `stop`): not on the loop."""
        self.hub.join()
        for pool in (self._checks, self._io, self._changes):
            pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            if self._ends is not None:
                self._ends.close()
                self._ends = None

    # ------------------------------------------------------------ changes

    def change(self, kind: Kind, op: Op, name: str | None, text: str | None,
               only: str | None, wait: bool, timeout_s: float) -> tuple[int, dict]:
        records = self.records(fresh=True)
        if kind is Kind.QUERY and op is not Op.REMOVE:
            errors, _ = self.checked(query_problems, text, self.live().registry)
            if errors:
                return 422, {"outcome": "invalid", "errors": errors, "changes": []}
        try:
            changes = query_changes(op, name, text or "", "<query>", only, records) \
                if kind is Kind.QUERY else stream_changes(op, name, text, records)
        except ControlMessageError as e:
            return invalid(e)
        if not changes:
            return invalid(ControlMessageError(f"the text defines no query {only!r}"))
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
                  for e in o.get("errors") or problem(o["reason"])]
        status = {"applied": 201 if op is Op.ADD else 200, "queued": 202, "refused": 409,
                  "timed_out": 504}[worst]
        return status, {"outcome": worst, "errors": errors, "changes": found}



def _stream_text(data: dict, name: str | None = None) -> str:
    """A stream schema's JSON text from `schema` (as schemas/*.json) or `json_schema` (a
    JSON Schema of one event, with optional `time`, `time_unit`, `type_attribute`,
    `skip_optional`): the fields of a StreamCheck body given."""
    if "schema" in data:
        return orjson.dumps(data["schema"]).decode()
    options = {k: data[k] for k in ("time", "time_unit", "type_attribute", "skip_optional")
               if k in data}
    try:
        return stream_text_from_json_schema(data["json_schema"], name or data.get("name"),
                                            **options)
    except ControlMessageError as e:
        raise Refused(e.category, invalid(e)[1]) from None


def _stream_name(text: str) -> str:
    try:
        name = orjson.loads(text).get("stream")
    except AttributeError:
        name = None
    if not isinstance(name, str):
        raise Refused(Category.INVALID, {"outcome": "invalid", "changes": [], "errors": problem(
            'a stream schema names its stream ("stream")')})
    return name


def _checked_stream(data: dict) -> dict:
    """The answer of /api/streams/validate (a checking thread's work)."""
    try:
        text = _stream_text(data)
        name = _stream_name(text)
    except Refused as e:
        return {"ok": False, "errors": e.body["errors"]}
    try:
        schema = check_stream(name, text)
    except ControlMessageError as e:
        return {"ok": False, "errors": problems(e)}
    return {"ok": True, "errors": [], "schema": schema.to_dict()}


def _stream_named(data: dict, name: str | None) -> tuple[str, str]:
    """(name, schema text) of a stream change's body (a checking thread's work)."""
    text = _stream_text(data, name)
    given = _stream_name(text)
    if name is not None and given != name:
        raise Refused(Category.INVALID, {"outcome": "invalid", "changes": [], "errors": problem(
            f"the schema describes stream {given!r}, not {name!r}")})
    return given, text


def _stream_entry(registry, name: str) -> dict:
    schema = registry.get(name)
    registered = registry.streams.get(name)
    return {"name": name, "source": "control" if registered else "file",
            "version": registered[1] if registered else None, "schema": schema.to_dict()}


def _explained(query) -> dict:
    """What `cep explain` says of a live query (a checking thread's work: CPU, and
    Graphviz's dot in a child process)."""
    found = explain(query.checked)
    try:
        svg = found.svg()
    except RuntimeError:
        svg = None
    return {**found.to_json(), "text": found.text(), "dot": found.dot(), "svg": svg}


API = web.AppKey("api", Api)
ROUTES = Routes()
ERROR = (m.Error, "")
NOT_LIVE = (m.Error, "no live query of that name")


def _outcomes(created: bool = False) -> dict:
    """A change's answers (each an Outcome)."""
    return {201 if created else 200: (m.Outcome, "applied"),
            202: (m.Outcome, "queued, or sent (not waited for)"),
            404: (m.Outcome, "nothing of that name is live"),
            409: (m.Outcome, "refused: live already, or by the splitter"),
            422: (m.Outcome, "does not check (errors with line, column); nothing was "
                  "written"),
            504: (m.Outcome, "no outcome in time")}


def _api(request: web.Request) -> Api:
    return request.app[API]


def _wait_args(body, config: ApiConfig) -> tuple[bool, float]:
    given = body.model_fields_set
    return body.wait, body.timeout_s if "timeout_s" in given else float(config.timeout_s)


# ---------------------------------------------------------------- probes


@ROUTES.route("GET", "/healthz", "The process serves", {200: (m.Alive, "serving")},
              broker=False, guarded=False)
async def healthz(request):
    return {"alive": True}


@ROUTES.route("GET", "/readyz", "The broker answers a read of the control topic",
              {200: (m.Ready, "ready"), 503: (m.Ready, "not ready: the broker does not "
                                                       "answer")},
              broker=False, guarded=False)
async def readyz(request):
    api = _api(request)
    try:
        await api.snapshot(api.config.cache_s)  # a read of the control topic that recent
    except Exception as e:  # the broker does not answer: not ready
        return 503, {"ready": False, "control_topic": api.config.control, "reason": str(e)}
    return {"ready": True, "control_topic": api.config.control}


# ---------------------------------------------------------------- streams


@ROUTES.route("GET", "/api/streams", "Every stream: schema files and the control topic's",
              {200: (m.StreamList, "the streams")}, kind="read")
async def streams(request):
    return (await _api(request).snapshot()).stream_list


@ROUTES.route("POST", "/api/streams/validate", "Check a stream schema (or import a JSON "
              "Schema); changes nothing", {200: (m.StreamChecked, "checked: ok, or the "
                                                 "errors")},
              body=m.StreamCheck, change=True, checks=True, broker=False)
async def validate_stream(request, body):
    data = body.model_dump(by_alias=True, exclude_unset=True)
    return await _api(request).check(_checked_stream, data)


@ROUTES.route("GET", "/api/streams/{name}", "One stream",
              {200: (m.Stream, "the stream"), 404: (m.Error, "no stream of that name")},
              kind="read")
async def stream(request, name):
    found = (await _api(request).snapshot()).streams.get(name)
    if found is None:
        return 404, {"error": f"no stream {name!r}"}
    return found


async def _stream_change(request, op: Op, name: str | None = None, body=None):
    api = _api(request)
    wait, timeout = _wait_args(body, api.config) if body is not None else \
        (True, float(api.config.timeout_s))
    text = None
    if body is not None:
        data = body.model_dump(by_alias=True, exclude_unset=True)
        name, text = await api.check(_stream_named, data, name)
    return await api.changed(Kind.STREAM, op, name, text, None, wait, timeout)


@ROUTES.route("POST", "/api/streams", "Register a stream", _outcomes(created=True),
              body=m.StreamBody, kind="change", change=True, secured=True, checks=True)
async def add_stream(request, body):
    return await _stream_change(request, Op.ADD, body=body)


@ROUTES.route("PUT", "/api/streams/{name}", "Change a stream", _outcomes(),
              body=m.StreamBody, kind="change", change=True, secured=True, checks=True)
async def update_stream(request, name, body):
    return await _stream_change(request, Op.UPDATE, name, body)


@ROUTES.route("DELETE", "/api/streams/{name}", "Remove a stream registered on the "
              "control topic", _outcomes(), kind="change", change=True, secured=True)
async def remove_stream(request, name):
    return await _stream_change(request, Op.REMOVE, name)


# ---------------------------------------------------------------- queries


@ROUTES.route("GET", "/api/queries", "The live queries (the control topic's), with their "
              "state", {200: (m.QueryList, "the live queries, in order")},
              params=m.QueriesParams, kind="read")
async def queries(request, params):
    api = _api(request)
    live = await api.snapshot()
    found = [q for q in sorted(live.live.values(), key=lambda q: q.index)
             if params.stream is None or q.checked.schema.stream == params.stream]
    states = await api.states(found) if params.state == "true" else {}
    return {"queries": [api.query_entry(q, states.get(q.name)) for q in found]}


@ROUTES.route("POST", "/api/queries/validate", "Check a query text (parsed and checked, "
              "never run); changes nothing", {200: (m.QueryChecked, "checked: ok, or the "
                                                    "errors with line and column")},
              body=m.QueryCheck, change=True, checks=True)
async def validate_query(request, body):
    api = _api(request)
    live = await api.snapshot()
    errors, checked = await api.check(query_problems, body.text, live.registry)
    if not errors and not checked:
        errors = problem("no query in the text")
    return {"ok": not errors, "errors": errors, "queries": [
        {"name": q.name, "stream": q.schema.stream, "output": q.query.output,
         "live": q.name in live.live} for q in checked]}


@ROUTES.route("GET", "/api/queries/{name}", "One live query with its state",
              {200: (m.Query, "the query"), 404: NOT_LIVE}, kind="read")
async def query(request, name):
    api = _api(request)
    live = (await api.snapshot()).live.get(name)
    if live is None:
        return 404, {"error": f"no live query {name!r}"}
    return api.query_entry(live, (await api.states([live]))[name])


async def _query_change(request, op: Op, name: str | None = None, body=None):
    api = _api(request)
    wait, timeout = _wait_args(body, api.config) if body is not None else \
        (True, float(api.config.timeout_s))
    return await api.changed(Kind.QUERY, op, name, body.text if body is not None else None,
                             name if op is Op.UPDATE else None, wait, timeout)


@ROUTES.route("POST", "/api/queries", "Add the queries of a text", _outcomes(created=True),
              body=m.QueryBody, kind="change", change=True, secured=True, checks=True)
async def add_query(request, body):
    return await _query_change(request, Op.ADD, body=body)


@ROUTES.route("PUT", "/api/queries/{name}", "Replace a live query", _outcomes(),
              body=m.QueryBody, kind="change", change=True, secured=True, checks=True)
async def update_query(request, name, body):
    return await _query_change(request, Op.UPDATE, name, body)


@ROUTES.route("DELETE", "/api/queries/{name}", "Remove a live query", _outcomes(),
              kind="change", change=True, secured=True)
async def remove_query(request, name):
    return await _query_change(request, Op.REMOVE, name)


@ROUTES.route("GET", "/api/queries/{name}/explain", "What the live query compiled to (cep "
              "explain): text, a graph, and its SVG drawing where Graphviz is installed",
              {200: (m.Explanation, "the explanation"), 404: NOT_LIVE},
              kind="read", checks=True)
async def explain_query(request, name):
    api = _api(request)
    live = (await api.snapshot()).live.get(name)
    if live is None:
        return 404, {"error": f"no live query {name!r}"}
    return await api.check(_explained, live)


@ROUTES.route("GET", "/api/pipeline", "Each stream's pipeline: its processes as a graph "
              "with their rates, its keyed partitions (lag, seq, stream time, last frame), "
              "the last checkpoint of each process, and the composite events withheld with "
              "what they wait for", {200: (m.PipelineList, "a pipeline per stream"),
                                     404: (m.Error, "no stream of that name")},
              params=m.PipelineParams, kind="read")
async def pipelines(request, params):
    api = _api(request)
    live = await api.snapshot()
    if params.stream is not None and params.stream not in live.streams:
        return 404, {"error": f"no stream {params.stream!r}"}
    streams = [params.stream] if params.stream is not None else \
        sorted({q.checked.schema.stream for q in live.live.values()})
    return {"pipelines": await api.pipelines(streams)}


@ROUTES.route("GET", "/api/history", "The live queries over time (the last 10 minutes): "
              "per query its composites/s, partial matches and state bytes, as columns",
              {200: (m.History, "the points after `since`")}, params=m.HistoryParams,
              kind="read")
async def history(request, params):
    return {"queries": _api(request).history.since(params.since)}


@ROUTES.route("GET", "/api/queries/{name}/tail", "The query's composite events as "
              "server-sent events", {200: (None, "`event: composite`, `id: "
                                           "PARTITION:OFFSET`, `data:` one composite "
                                           "event as JSON"), 404: NOT_LIVE},
              params=m.TailParams, kind="tail", event_stream=True)
async def tail(request, name, params):
    api = _api(request)
    live = (await api.snapshot()).live.get(name)
    if live is None:
        return 404, {"error": f"no live query {name!r}"}
    tag = Topics(live.checked.schema.stream, prefix=api.config.prefix).group("coordinator")
    replay = params.start == "beginning"
    if replay:
        api.limits.enter("replay")
    try:
        return await tail_stream(request, api.hub, {live.output: (tag, {name})},
                                 params.start, params.limit, params.idle_s)
    finally:
        if replay:
            api.limits.leave("replay")


@ROUTES.route("GET", "/api/tail", "The composite events of several live queries (default: "
              "all) as server-sent events, from now on", {200: (None, "`event: composite`, "
                                                          "`id: PARTITION:OFFSET`, `data:` "
                                                          "one composite event as JSON"),
                                                     404: NOT_LIVE},
              params=m.TailManyParams, kind="tail", event_stream=True)
async def tail_many(request, params):
    api = _api(request)
    live = (await api.snapshot()).live
    names = params.queries.split(",") if params.queries else sorted(live)
    missing = [n for n in names if n not in live]
    if missing or not names:
        return 404, {"error": f"no live query {missing[0]!r}" if missing else
                     "no live query to follow"}
    wanted: dict[str, tuple[str, set]] = {}
    for name in names:
        query = live[name]
        tag = Topics(query.checked.schema.stream, prefix=api.config.prefix).group("coordinator")
        wanted.setdefault(query.output, (tag, set()))[1].add(name)
    return await tail_stream(request, api.hub, wanted, "end", params.limit, params.idle_s)


def make_app(config: ApiConfig, bound: str | None = None) -> web.Application:
    """The app; `bound`: the address it listens on (a non-loopback one is an allowed
    Host)."""
    api = Api(config)
    guard = Guard(config.allowed_hosts, config.cors_origins, config.token, bound, MAX_BODY)
    document = orjson.dumps(ROUTES.document(token=bool(config.token)))
    app = web.Application(middlewares=[guard.middleware], client_max_size=MAX_BODY)
    app[API] = api
    ROUTES.add_to(app, lambda request: request.app[API].limits)

    async def openapi(request):
        return web.Response(body=document, content_type="application/json")

    async def console(request):
        return web.FileResponse(CONSOLE / "index.html")

    console_files = {p.relative_to(CONSOLE).as_posix() for p in CONSOLE.rglob("*")
                     if p.is_file()}

    async def console_file(request):
        name = request.match_info["file"]
        if name not in console_files:
            return error_response(404, f"no such endpoint: GET {request.path}")
        return web.FileResponse(CONSOLE / name)

    async def closing(app):
        api.hub.stop()

    async def closed(app):
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
    files = raise_open_files_limit(config.limits["tail"] + config.limits["read"] + 256)
    # The checking threads hold the GIL for milliseconds at a time (a check is ~2 ms of
    # Python): hand it back to the event loop every SWITCH_INTERVAL_S, not every 5 ms.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    log("api_listening", host=bound, port=port, token=bool(config.token),
        allowed_hosts=config.allowed_hosts, cors_origins=config.cors_origins,
        limits=config.limits, open_files=files)
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
