"""The API's state behind its handlers (services/api/app.py): its configuration
(`ApiConfig`), and `Api`, what the handlers share: the limits, the pools, what reads keep,
the tails, and a change's way to the control topic and back.

Nothing blocks the event loop: what a read needs from the broker and the services'
metrics is loaded on a small fixed pool (`IO_THREADS`), one load per key at a time and
kept `cache_s` (services/api/limits.py, SingleFlight); checking a query or a stream (and
explaining one) is CPU work on `CHECK_THREADS` threads of its own (services/api/checks.py);
a change waits for its outcome on a thread of a pool as large as the changes' limit; the
tails share one thread and one consumer (services/api/tail.py). Each kind of request has a
limit in flight (`ApiConfig.limits`, CEP_API_MAX_* variables): one more is 429 with
Retry-After, never queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from cep_core.control_message import ControlMessageError, LiveSet, replayed
from cep_core.control_ops import Kind, Op, Outcome
from cep_service.api import checks
from cep_service.api import models as m
from cep_service.api.errors import invalid, problem
from cep_service.api.guard import Guard
from cep_service.api.history import History
from cep_service.api.limits import LimitKind, Limits, SingleFlight
from cep_service.api.pipeline import Drawings, endpoint_figures, look, pipeline, process_figures
from cep_service.api.tail import TailHub
from cep_service.stream.control import control_log, publish
from cep_service.stream.kafka import Topics, ensure_topics
from cep_service.stream.status import QueryState
from cep_service.stream.live_changes import (
    EXIT,
    live_items,
    query_changes,
    services_view,
    stream_changes,
    wait_outcomes,
)

CHECK_THREADS = 2  # threads that check (and explain) query and stream texts
CHECKS_AT_ONCE = 8  # checks running or waiting for a thread; one more is refused (429)
IO_THREADS = 4  # threads that load what reads need from the broker and the metrics
# Requests in flight per kind; one more is 429 with Retry-After. read: GETs of /api;
# check: checks running or waiting for a checking thread; change: changes waiting for
# their outcome (each on a thread); tail: open tails; replay: tails from the beginning
# (each has a consumer of its own).
LIMITS = {LimitKind.READ: 512, LimitKind.CHECK: CHECKS_AT_ONCE, LimitKind.CHANGE: 16,
          LimitKind.TAIL: 1000, LimitKind.REPLAY: 8}
LIMIT_ENV = {kind: f"CEP_API_MAX_{kind.upper()}S" for kind in LIMITS}
# the INTO topics' end consumer: it reads records only to learn the high-watermarks
RATES_CONSUMER = {"queued.min.messages": 1000, "queued.max.messages.kbytes": 1024}
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


def _limit_kind(name: str) -> LimitKind | None:
    try:
        return LimitKind(name)
    except ValueError:
        return None


class ApiConfig:
    """allowed_hosts: Host names let in besides loopback ones (`*`: any);
    cors_origins: origins whose pages may call the API (CORS) and make changes;
    require_token: refuse to start without a token, on loopback too; limits: requests in
    flight per kind (LIMITS; each defaults to its CEP_API_MAX_* variable, then LIMITS);
    tail_buffer: events a tail may have unsent before its reader is dropped. A bad origin,
    host or limit is a ValueError here."""

    def __init__(self, settings: Any, topic_prefix: str = "", control: str = "",
                 token: str | None = None, timeout_s: float = 30,
                 metrics_urls: Iterable[str] = (), cache_s: float = 1.0,
                 allowed_hosts: Iterable[str] = (), cors_origins: Iterable[str] = (),
                 require_token: bool = False, limits: dict | None = None,
                 tail_buffer: int | None = None):
        self.settings, self.prefix, self.token = settings, topic_prefix, token or None
        self.control = Topics("", control=control, prefix=topic_prefix).control
        self.timeout_s, self.metrics_urls, self.cache_s = timeout_s, list(metrics_urls), cache_s
        self.allowed_hosts, self.cors_origins = list(allowed_hosts), list(cors_origins)
        self.require_token = require_token
        self.limits = {kind: _positive_env(LIMIT_ENV[kind], default)
                       for kind, default in LIMITS.items()}
        for given, value in (limits or {}).items():
            kind = _limit_kind(given)
            if kind is None or not isinstance(value, int) or value < 1:
                raise ValueError(f"limit {given}={value!r}: one of {', '.join(LIMITS)}, "
                                 "a positive integer")
            self.limits[kind] = value
        self.tail_buffer = tail_buffer or _positive_env(TAIL_BUFFER_ENV, TAIL_BUFFER)
        Guard(self.allowed_hosts, self.cors_origins)  # the check


class Snapshot:
    """What reads need of the control topic's live set, made once per load (on an I/O
    thread: a registry looks schema files up): `live` (name -> live query), `registry`,
    `streams` (every stream's answer, as the model sends it)."""

    def __init__(self, live: LiveSet) -> None:
        self.live, self.registry = live.live, live.registry
        self.streams = {n: m.Stream.model_validate(stream_entry(live.registry, n))
                        for n in live.registry.names()}
        self.stream_list = m.StreamList(streams=list(self.streams.values()))


def stream_entry(registry: Any, name: str) -> dict[str, Any]:
    schema = registry.get(name)
    registered = registry.streams.get(name)
    return {"name": name, "source": "control" if registered else "file",
            "version": registered[1] if registered else None, "schema": schema.to_dict()}


class Api:
    """The handlers' state: the limits, the pools, what reads keep, the tails."""

    def __init__(self, config: ApiConfig):
        self.config = config
        self.limits = Limits(config.limits)
        self._records: tuple[float, list] | None = None
        self._rates: dict[str, tuple[float, int]] = {}
        self._ends: Consumer | None = None  # one consumer at the end of every INTO topic
        self._end_parts: dict[str, list] = {}  # INTO topic -> its partitions, assigned
        self._into_topics: set[str] = set()  # the INTO topics to look at
        self._lock = threading.Lock()
        self._checks = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="api-check")
        self._io = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="api-io")
        self._changes = ThreadPoolExecutor(config.limits[LimitKind.CHANGE],
                                           thread_name_prefix="api-change")
        self.kept = SingleFlight(self._io, config.cache_s)
        self.hub = TailHub(config.settings, config.tail_buffer)
        self.history = History()
        self.drawings = Drawings()
        self._scraped: dict[str, tuple] = {}  # metrics URL -> (time, events in, out)

    # ------------------------------------------------------------ checking texts

    async def check(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the checking threads, awaited from the event loop (429 when
        CHECKS_AT_ONCE checks run or wait already)."""
        self.limits.enter(LimitKind.CHECK)
        try:
            return await asyncio.wrap_future(self._checks.submit(fn, *args))
        finally:
            self.limits.leave(LimitKind.CHECK)

    def checked(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the checking threads, from another thread (a change)."""
        self.limits.enter(LimitKind.CHECK)
        try:
            return self._checks.submit(fn, *args).result()
        finally:
            self.limits.leave(LimitKind.CHECK)

    async def changed(self, *args: Any) -> tuple[int, dict[str, Any]]:
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

    def live(self, fresh: bool = False) -> LiveSet:
        return replayed(self.records(fresh))

    async def snapshot(self, max_age_s: float | None = None) -> Snapshot:
        """The live set of the control topic (queries, registry, the streams' entries),
        loaded on the I/O threads (see SingleFlight for its age)."""
        return await self.kept.get("live", lambda: Snapshot(self.live(True)), max_age_s)

    async def status_view(self, stream: str) -> dict:
        topic = Topics(stream, prefix=self.config.prefix).status
        return await self.kept.get(("status", stream),
                                   lambda: services_view(self.config.settings, topic))

    async def into(self, topics: list[str]) -> dict[str, tuple[int | None, float | None]]:
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

    def query_entry(self, query: Any, state: dict[str, Any] | None) -> dict[str, Any]:
        entry = {"name": query.name, "stream": query.checked.schema.stream,
                 "output": query.output, "index": query.index, "text": query.text}
        if state is not None:
            entry["state"] = state
        return entry

    async def states(self, queries: Sequence[Any]) -> dict[str, dict[str, Any]]:
        """The state of each query (by name), from what reads keep: one load per stream's
        status topic, INTO topic and the metrics, whatever the number of queries."""
        streams = sorted({q.checked.schema.stream for q in queries})
        topics = sorted({q.output for q in queries})
        looked: list[Any] = await asyncio.gather(
            *(self.status_view(s) for s in streams), self.into(topics), self.metrics())
        *views, rates, scraped = looked
        held = {}  # stream -> (query -> its live item, query -> its partitions)
        for stream, view in zip(streams, views):
            parts: dict[str, set] = {}
            for entry in view.values():
                for p, live in entry["partitions"].items():
                    for name in (live or {}).get("queries") or {}:
                        parts.setdefault(name, set()).add(p)
            held[stream] = ({i["name"]: i for i in live_items(view, Kind.QUERY)}, parts)
        states = {q.name: self.state(q, held[q.checked.schema.stream], rates[q.output],
                                     scraped) for q in queries}
        self.history.add(states)
        return states

    @staticmethod
    def state(query: Any, held: tuple[Any, Any], rate: tuple[Any, Any],
              scraped: dict[str, Any] | None) -> dict[str, Any]:
        items, parts = held
        item = items.get(query.name)
        partitions = sorted(parts.get(query.name, ()))
        total, per_s = rate
        out = {"live": item is not None, "services": item["services"] if item else [],
               "partitions": partitions, "into_records": total,
               "composites_per_s": per_s,
               "failed": item is not None and item["state"] == QueryState.FAILED,
               "reason": item.get("reason") if item else None}
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
        out: dict[str, tuple] = {}
        now = time.monotonic()
        for topic in topics:
            assigned = self._end_parts.get(topic)
            highs = [consumer.get_watermark_offsets(tp, cached=True)[1]
                     for tp in assigned or ()]
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
            errors, _ = self.checked(checks.query_problems, text, self.live().registry)
            if errors:
                return 422, {"outcome": Outcome.INVALID, "errors": errors, "changes": []}
        try:
            if kind is Kind.QUERY:
                changes = query_changes(op, name, text or "", "<query>", only, records)
            elif name is None:
                raise ControlMessageError("a stream change needs the stream's name")
            else:
                changes = stream_changes(op, name, text, records)
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
            return 202, {"outcome": Outcome.SENT, "errors": [], "changes": [
                {"kind": m.kind, "name": m.name, "op": m.op, **c, "outcome": Outcome.SENT}
                for c, m, _ in sent]}
        found = wait_outcomes(settings, sent, self.config.prefix, self.config.control,
                              timeout_s)
        worst = max(found, key=lambda o: EXIT[o["outcome"]])["outcome"]
        errors = [e for o in found if o["outcome"] == Outcome.REFUSED
                  for e in o.get("errors") or problem(o["reason"])]
        status = {Outcome.APPLIED: 201 if op is Op.ADD else 200, Outcome.QUEUED: 202,
                  Outcome.REFUSED: 409, Outcome.TIMED_OUT: 504}[worst]
        return status, {"outcome": worst, "errors": errors, "changes": found}


API = web.AppKey("api", Api)


def api_of(request: web.Request) -> Api:
    """The Api of the app a request came to."""
    return request.app[API]
