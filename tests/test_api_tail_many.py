"""GET /api/tail: one tail of several live queries' composite events (the console's
table), across INTO topics, each event only for a query asked for; unknown and malformed
names refused. On the session's broker; the composite events are written into the INTO
topics as the coordinator writes them (its pipeline tag), with no pipeline running."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid

import orjson

from cep_service.api.app import API, ApiConfig, ApiThread
from cep_service.stream.checkpoint import PIPELINE_HEADER
from cep_service.stream.control import ControlMessage, publish
from cep_service.stream.kafka import KafkaSettings, Topics, flush_all, produce
from cep_service.stream.pipeline import create_topics, wait_for

QUERY = """QUERY {name} FROM trades INTO {output} PARTITION BY symbol
PATTERN ( . up ) DEFINE up AS price > Last(price) EMIT symbol = symbol;"""


def events(url: str) -> list[dict]:
    with urllib.request.urlopen(url, timeout=120) as reply:
        text = reply.read().decode()
    return [json.loads(line[len("data: "):]) for line in text.splitlines()
            if line.startswith("data: {") and "query" in line]


def test_one_tail_brings_the_events_of_the_queries_asked_for(kafka_bootstrap):
    settings = KafkaSettings(kafka_bootstrap)
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", prefix=f"many{run}")
    outputs = {"a": f"many_a_{run}", "b": f"many_b_{run}", "c": f"many_b_{run}"}
    create_topics(settings, topics, 1, sorted(set(outputs.values())))
    for name, output in outputs.items():
        publish(settings, topics.control, ControlMessage("add", name, QUERY.format(
            name=name, output=output)))
    tag = [(PIPELINE_HEADER, topics.group("coordinator").encode())]
    with ApiThread(ApiConfig(settings, topic_prefix=topics.prefix)) as api:
        found: dict[str, list] = {}

        def read(key, path):
            found[key] = events(api.url + path)

        readers = [threading.Thread(target=read, args=(key, path)) for key, path in (
            ("all", "/api/tail?limit=3&idle_s=60"),
            ("a,c", "/api/tail?queries=a,c&limit=2&idle_s=60"))]
        for reader in readers:
            reader.start()
        hub = api.runner.app[API].hub
        # both placed (their `ready` sent) before the events come: tails start at the end
        wait_for(lambda: sum(t.ready for t in list(hub.tails)) == 2, 120, "the tails placed")
        producer = settings.producer()
        for seq, name in enumerate(("b", "a", "c")):
            produce(producer, outputs[name], orjson.dumps(
                {"query": name, "key": "K", "seq": seq, "symbol": "K"}), headers=tag)
            produce(producer, outputs[name], orjson.dumps(  # another pipeline's: not sent
                {"query": name, "key": "K", "seq": seq, "symbol": "K"}),
                headers=[(PIPELINE_HEADER, b"elsewhere")])
        flush_all(producer, 30)
        for reader in readers:
            reader.join(180)
        assert sorted(e["query"] for e in found["all"]) == ["a", "b", "c"]
        assert [e["query"] for e in found["a,c"]] == ["a", "c"]

        for path, status in (("/api/tail?queries=a,nope", 404),
                             ("/api/tail?queries=a;b", 400)):
            try:
                urllib.request.urlopen(api.url + path, timeout=60)
                raise AssertionError(path)
            except urllib.error.HTTPError as e:
                assert e.code == status, (path, e.code)

