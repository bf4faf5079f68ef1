"""The API's bounds under load (services/api/limits.py, services/api/tail.py; docs/api.md
"Under load"), asserted on the server's own counters, never on timing: a kind of request
over its limit in flight is 429 with Retry-After (reads, changes, tails, replays); reads
asking at once wait on one load of what they need, made on the I/O threads while the
event loop answers; a tail reader that does not read is dropped once its buffer is full;
tails add no thread (OS threads of the process, librdkafka's included) and share one
consumer. Most run through aiohttp's test client with the broker's side stubbed (a fake
consumer); the last opens tails on the session's broker."""

from __future__ import annotations

import asyncio
import os
import queue
import socket
import threading
import uuid
from types import SimpleNamespace

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

import cep_service.api.state as state_module
from cep_service.api.app import API, ApiConfig, make_app
from cep_service.api.tail import TailHub
from cep_service.stream.checkpoint import PIPELINE_HEADER
from cep_service.stream.kafka import KafkaSettings, Topics
from tests.test_api_guard import until

NOWHERE = KafkaSettings("127.0.0.1:1")
JSON = {"Content-Type": "application/json"}
QUERY = orjson.dumps({"text": "QUERY ups FROM trades INTO ups PARTITION BY symbol\n"
                              "PATTERN ( . up up ) DEFINE up AS price > Last(price)\n"
                              "EMIT symbol = symbol;"})
TAG = Topics("trades").group("coordinator")


def os_threads() -> int:
    """The process's threads as the kernel counts them (librdkafka's too)."""
    return len(os.listdir("/proc/self/task"))


def live_query(name: str = "ups", output: str = "ups_out", stream: str = "trades"):
    schema = SimpleNamespace(stream=stream)
    return SimpleNamespace(name=name, output=output, index=0, text="QUERY ...",
                           checked=SimpleNamespace(schema=schema))


def fake_live(*queries):
    return SimpleNamespace(live={q.name: q for q in queries}, registry=SimpleNamespace(
        names=lambda: [], get=lambda name: None, streams={}))


class FakeMessage:
    def __init__(self, topic: str, offset: int, value: bytes, tag: str = TAG):
        self._topic, self._offset, self._value, self._tag = topic, offset, value, tag

    def error(self):
        return None

    def topic(self):
        return self._topic

    def partition(self):
        return 0

    def offset(self):
        return self._offset

    def value(self):
        return self._value

    def headers(self):
        return [(PIPELINE_HEADER, self._tag.encode())]


class FakeConsumer:
    """A consumer whose records are those put in `records` (a queue the test fills)."""

    def __init__(self, broker):
        self.broker = broker

    def list_topics(self, topic, timeout=None):
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions={0: None},
                                                              error=None)})

    def assign(self, parts):
        pass

    incremental_assign = incremental_unassign = assign

    def position(self, parts):
        return [SimpleNamespace(offset=0) for _ in parts]

    def consume(self, count, timeout):
        out = []
        try:
            out.append(self.broker.records.get(timeout=timeout or None) if timeout
                       else self.broker.records.get_nowait())
        except queue.Empty:
            return out
        self.broker.taken += 1
        return out

    def close(self):
        self.broker.closed += 1


class FakeBroker:
    def __init__(self):
        self.records: queue.SimpleQueue = queue.SimpleQueue()
        self.made = self.closed = self.taken = 0

    def consumer(self):
        self.made += 1
        return FakeConsumer(self)


def serve(scenario, broker: FakeBroker | None = None, live=None, **options):
    """scenario(client, api) against make_app(ApiConfig(**options)) with the control
    topic's live set `live` and the tails' consumers from `broker`."""
    async def main():
        app = make_app(ApiConfig(NOWHERE, **options))
        api = app[API]
        api.live = lambda fresh=False: live if live is not None else fake_live()
        if broker is not None:
            api.hub = TailHub(broker, api.config.tail_buffer)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            await scenario(client, api)
    asyncio.run(main())


# ---------------------------------------------------------------- reads


def test_reads_over_the_limit_are_429_and_wait_on_one_load():
    release, threads = threading.Event(), []

    def held(fresh=False):
        threads.append(threading.current_thread().name)
        assert release.wait(60), "never released"
        return fake_live()

    async def scenario(client, api):
        api.live = held
        pending = [asyncio.ensure_future(client.get("/api/streams")) for _ in range(3)]
        await until(lambda: api.limits.in_flight["read"] == 3 and threads)
        reply = await client.get("/api/queries")
        assert reply.status == 429 and reply.headers["Retry-After"] == "1"
        assert "read requests are in flight" in (await reply.json())["error"]
        assert api.limits.refused["read"] == 1
        assert (await client.get("/healthz")).status == 200  # the loop answers
        release.set()
        for reply in await asyncio.gather(*pending):
            assert reply.status == 200 and await reply.json() == {"streams": []}
        assert api.kept.loads["live"] == 1  # three reads, one load
        assert threads == ["api-io_0"]  # on an I/O thread, not the event loop
        assert api.limits.in_flight["read"] == 0 and api.limits.peak["read"] == 3
    serve(scenario, limits={"read": 3})


def test_listing_queries_reads_each_status_topic_once_off_the_loop(monkeypatch):
    """Query states come from one load per stream's status topic and INTO topic however
    many queries and clients there are, on the I/O threads."""
    release, loads = threading.Event(), []

    def view(settings, topic):
        loads.append((topic, threading.current_thread().name))
        assert release.wait(60), "never released"
        return {}
    monkeypatch.setattr(state_module, "services_view", view)
    queries = [live_query(f"q{i}", output="shared_out") for i in range(20)]

    async def scenario(client, api):
        api.output_rates = lambda topics: {t: (7, None) for t in topics}
        pending = [asyncio.ensure_future(client.get("/api/queries")) for _ in range(10)]
        await until(lambda: loads)
        assert (await client.get("/healthz")).status == 200
        release.set()
        for reply in await asyncio.gather(*pending):
            body = await reply.json()
            assert reply.status == 200 and len(body["queries"]) == 20
            assert body["queries"][3]["state"]["into_records"] == 7
        assert [topic for topic, _ in loads] == [Topics("trades").status]
        assert loads[0][1].startswith("api-io_")
        assert api.kept.loads["into"] == 1
    serve(scenario, live=fake_live(*queries))


# ---------------------------------------------------------------- changes


def test_changes_over_the_limit_are_429():
    release, begun = threading.Event(), []

    def change(*args):
        begun.append(threading.current_thread().name)
        assert release.wait(60), "never released"
        return 202, {"outcome": "sent", "errors": [], "changes": []}

    async def scenario(client, api):
        api.change = change
        pending = [asyncio.ensure_future(client.delete(f"/api/queries/q{i}"))
                   for i in range(2)]
        await until(lambda: len(begun) == 2)
        reply = await client.delete("/api/queries/q9")
        assert reply.status == 429 and reply.headers["Retry-After"] == "1"
        assert api.limits.refused["change"] == 1
        release.set()
        assert [r.status for r in await asyncio.gather(*pending)] == [202, 202]
        assert all(name.startswith("api-change_") for name in begun)
    serve(scenario, limits={"change": 2})


# ---------------------------------------------------------------- tails


def raw_tail(port: int, path: str) -> socket.socket:
    """A client that asks for a tail and never reads (a small receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    sock.setblocking(False)
    return sock


def test_tails_over_the_limit_are_429_and_add_no_thread():
    broker = FakeBroker()

    async def scenario(client, api):
        first = raw_tail(client.port, "/api/queries/ups/tail")
        await until(lambda: len(api.hub.tails) == 1 and all(t.ready for t in api.hub.tails))
        threads = os_threads()
        socks = [raw_tail(client.port, "/api/queries/ups/tail") for _ in range(39)]
        await until(lambda: len(api.hub.tails) == 40 and
                    all(t.ready for t in api.hub.tails))
        assert os_threads() == threads  # 39 more tails, not one more thread
        assert broker.made == 1  # one consumer shared by the tails from the end
        reply = await client.get("/api/queries/ups/tail")
        assert reply.status == 429 and reply.headers["Retry-After"] == "1"
        assert api.limits.refused["tail"] == 1
        for sock in [first, *socks]:
            sock.close()
        # a closed client is noticed at the next write: one event for all
        broker.records.put(FakeMessage("ups_out", 0, b'{"query": "ups"}'))
        await until(lambda: not api.hub.tails and api.limits.in_flight["tail"] == 0)
    serve(scenario, broker, live=fake_live(live_query()), limits={"tail": 40})


def test_a_tail_whose_client_goes_ends_without_an_event():
    broker = FakeBroker()

    async def scenario(client, api):
        socks = [raw_tail(client.port, "/api/queries/ups/tail") for _ in range(3)]
        await until(lambda: len(api.hub.tails) == 3)
        socks[1].close()
        await until(lambda: len(api.hub.tails) == 2)  # the sweep, no event needed
        assert api.hub.counters["closed"] == 1 and api.limits.in_flight["tail"] == 2
        for sock in socks:
            sock.close()
        await until(lambda: not api.hub.tails)
    serve(scenario, broker, live=fake_live(live_query()))


def test_replays_over_their_limit_are_429():
    broker = FakeBroker()

    async def scenario(client, api):
        socks = [raw_tail(client.port, "/api/queries/ups/tail?from=beginning")
                 for _ in range(2)]
        await until(lambda: len(api.hub.tails) == 2 and broker.made == 2)
        reply = await client.get("/api/queries/ups/tail?from=beginning")
        assert reply.status == 429 and api.limits.refused["replay"] == 1
        for sock in socks:
            sock.close()
        broker.records.put(FakeMessage("ups_out", 0, b'{"query": "ups"}'))
        broker.records.put(FakeMessage("ups_out", 1, b'{"query": "ups"}'))
        await until(lambda: not api.hub.tails and broker.closed == 2)
    serve(scenario, broker, live=fake_live(live_query()), limits={"replay": 2})


def test_a_tail_that_does_not_read_is_dropped():
    broker = FakeBroker()
    big = orjson.dumps({"query": "ups", "pad": "x" * 65536})

    async def scenario(client, api):
        sock = raw_tail(client.port, "/api/queries/ups/tail")
        await until(lambda: len(api.hub.tails) == 1 and all(t.ready for t in api.hub.tails))
        [tail] = api.hub.tails
        for offset in range(4000):  # the socket's buffers fill, then the tail's
            broker.records.put(FakeMessage("ups_out", offset, big))
            await until(lambda taken=offset + 1: broker.taken == taken)
            for _ in range(5):
                await asyncio.sleep(0)
            if tail.dropped:
                break
        assert tail.dropped and api.hub.counters["dropped"] == 1
        assert len(tail.chunks) == 0  # what it held is let go
        await until(lambda: not api.hub.tails and api.limits.in_flight["tail"] == 0)
        sock.close()
        # another reader of the same query is not the dropped one's business
        assert (await client.get("/healthz")).status == 200
    serve(scenario, broker, live=fake_live(live_query()), tail_buffer=8)


def test_the_composite_events_of_the_query_reach_its_tail():
    broker = FakeBroker()

    async def scenario(client, api):
        reply = await client.get("/api/queries/ups/tail?limit=2")
        assert reply.status == 200
        assert (await reply.content.readuntil(b"\n\n")).startswith(b": tail of ups_out")
        assert await reply.content.readuntil(b"\n\n") == b"event: ready\ndata: {}\n\n"
        broker.records.put(FakeMessage("ups_out", 0, b'{"query": "other"}'))
        broker.records.put(FakeMessage("ups_out", 1, b'{"query": "ups", "n": 1}',
                                       tag="another.pipeline"))
        broker.records.put(FakeMessage("ups_out", 2, b'{"query": "ups", "n": 2}'))
        broker.records.put(FakeMessage("ups_out", 3, b'{"query": "ups", "n": 3}'))
        assert await reply.text() == (
            'event: composite\nid: 0:2\ndata: {"query":"ups","n":2}\n\n'
            'event: composite\nid: 0:3\ndata: {"query":"ups","n":3}\n\n')
    serve(scenario, broker, live=fake_live(live_query()))


def test_tails_on_the_broker_share_one_consumer_and_add_no_thread(kafka_bootstrap):
    """On the session's broker: librdkafka's threads are made for the first tail's
    shared consumer, none for the next ones."""
    from cep_service.stream.kafka import ensure_topics

    settings = KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)
    output = f"tails_{uuid.uuid4().hex[:8]}"
    ensure_topics(settings, {output: 2})

    async def scenario(client, api):
        api.hub = TailHub(settings, api.config.tail_buffer)
        socks = [raw_tail(client.port, "/api/queries/ups/tail")]
        await until(lambda: len(api.hub.tails) == 1 and all(t.ready for t in api.hub.tails))
        threads = os_threads()
        socks += [raw_tail(client.port, "/api/queries/ups/tail") for _ in range(29)]
        await until(lambda: len(api.hub.tails) == 30 and
                    all(t.ready for t in api.hub.tails))
        assert os_threads() == threads
        assert api.hub.counters["consumers"] == 1
        for sock in socks:
            sock.close()
    serve(scenario, live=fake_live(live_query(output=output)))


# ---------------------------------------------------------------- what reads keep


def test_a_kept_value_is_served_while_one_load_renews_it():
    """Older than max_age_s, a kept value is still answered while one load renews it;
    a failed load keeps nothing (the next read waits for a new one and sees its error)."""
    from concurrent.futures import ThreadPoolExecutor

    from cep_service.api.limits import SingleFlight

    release, loads = threading.Event(), []

    def load(value):
        def run():
            loads.append(value)
            assert release.wait(60), "never released"
            if isinstance(value, Exception):
                raise value
            return value
        return run

    async def main():
        with ThreadPoolExecutor(2) as pool:
            kept = SingleFlight(pool, max_age_s=0.0, stale_s=3600)
            release.set()
            assert await kept.get("k", load(1)) == 1
            release.clear()
            # stale (max_age_s 0): answered at once, one renewal for the three readers
            assert [await kept.get("k", load(2)) for _ in range(3)] == [1, 1, 1]
            assert kept.loads["k"] == 2
            await until(lambda: loads == [1, 2])
            release.set()
            await until(lambda: "k" not in kept._loading)
            assert await kept.get("k", load(3)) == 2  # the renewed one (and a renewal)
            await until(lambda: "k" not in kept._loading)
            kept.forget("k")
            with pytest.raises(RuntimeError, match="broker"):
                await kept.get("k", load(RuntimeError("broker down")))
            assert "k" not in kept._values
            # a fresh read (an explicit max age) waits for the load
            assert await kept.get("k", load(4), max_age_s=0.0) == 4
    asyncio.run(main())
