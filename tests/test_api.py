"""`cep serve api` against the session's broker and a running pipeline (splitter, workers,
coordinator as threads): a stream (as a JSON Schema) and a query created over HTTP go
live, composite events read from the SSE tail are those of the reference interpreter on
the same events; a query that does not check is a 4xx with line and column; a change
without the token is refused; without a token the API binds to loopback only."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest

from cep_core import reference
from cep_core.checker import load_query_text
from cep_core.event_io import read_events
from cep_core.schema import SchemaRegistry
from cep_core.schema_import import stream_schema_from_json_schema
from cep_service.api.app import ApiConfig, ApiThread, bind_host
from cep_service.stream.live_changes import services_view
from cep_service.stream.kafka import KafkaSettings, Topics, flush_all, produce, produce_end
from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_for

ROOT = Path(__file__).resolve().parent.parent
TRADES = ROOT / "examples" / "data" / "trades.jsonl"
TOKEN = "s3cret-token"
UPS = """QUERY {name} FROM {stream} INTO {output} PARTITION BY symbol
PATTERN ( . up up ) DEFINE up AS price > Last(price)
EMIT symbol = symbol, n = Count();"""


def call(api: ApiThread, method: str, path: str, body=None, token: str | None = TOKEN,
         timeout: float = 150) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(api.url + path, method=method, headers=headers,
                                     data=None if body is None else orjson.dumps(body))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def sse_events(url: str, timeout: float = 150) -> list[dict]:
    """The `data:` of each `composite` event of a server-sent event stream, until it ends."""
    out, event = [], None
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        for raw in reply:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "composite":
                out.append(json.loads(line[6:]))
    return out


def tail_while_producing(api: ApiThread, settings: KafkaSettings, topics: Topics, query: str,
                         limit: int) -> list[dict]:
    """The first `limit` composite events of a query's tail from the beginning, while
    examples/data/trades.jsonl is written to the source topic and ended."""
    got: list[dict] = []
    tail = threading.Thread(target=lambda: got.extend(sse_events(
        f"{api.url}/api/queries/{query}/tail?from=beginning&limit={limit}")))
    tail.start()
    producer = settings.producer()
    for line in TRADES.read_bytes().splitlines():
        produce(producer, topics.source, line)
    produce_end(producer, topics.source)
    flush_all(producer, 30)
    tail.join(150)
    assert not tail.is_alive()
    return got


@pytest.fixture
def settings(kafka_bootstrap):
    return KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)


def json_schema_of(stream: str) -> dict:
    integer = {"type": "integer"}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": stream,
            "type": "object", "required": ["symbol", "price", "volume", "ts", "seqNum"],
            "properties": {"symbol": {"type": "string"}, "price": integer, "volume": integer,
                           "ts": integer, "seqNum": integer}}


def test_without_a_token_only_loopback():
    assert bind_host(None, None) == "127.0.0.1"
    assert bind_host(None, TOKEN) == "0.0.0.0"
    assert bind_host("::1", None) == "::1"
    with pytest.raises(ValueError, match="CEP_API_TOKEN is not set"):
        bind_host("0.0.0.0", None)


def test_checks_token_probes_and_openapi(settings):
    run = uuid.uuid4().hex[:8]
    config = ApiConfig(settings, topic_prefix=f"api{run}", token=TOKEN, timeout_s=5)
    with ApiThread(config) as api:
        assert call(api, "GET", "/healthz") == (200, {"alive": True})
        code, ready = call(api, "GET", "/readyz")
        assert code == 200 and ready["ready"] is True
        code, document = call(api, "GET", "/openapi.json")
        assert code == 200 and document["openapi"] == "3.1.0"
        assert "/api/queries/{name}/tail" in document["paths"]

        bad = "QUERY bad FROM trades INTO x\nPATTERN ( a )\nDEFINE a AS symbol > 3\n" \
              "EMIT symbol = symbol;"
        code, checked = call(api, "POST", "/api/queries/validate", {"text": bad}, token=None)
        assert code == 200 and checked["ok"] is False
        error = checked["errors"][0]
        assert error["line"] == 3 and error["column"] > 1
        assert error["source_line"] == "DEFINE a AS symbol > 3"

        code, refused = call(api, "POST", "/api/queries", {"text": bad}, token=None)
        assert code == 401 and "Bearer" in refused["error"]
        code, refused = call(api, "DELETE", "/api/queries/bad", token="wrong")
        assert code == 401
        code, invalid = call(api, "POST", "/api/queries", {"text": bad})
        assert code == 422 and invalid["outcome"] == "invalid"
        assert (invalid["errors"][0]["line"], invalid["errors"][0]["column"]) == \
            (error["line"], error["column"])
        code, missing = call(api, "DELETE", "/api/queries/nothere")
        assert code == 404 and "no live query 'nothere'" in missing["errors"][0]["message"]

        good = UPS.format(name="ups", stream="trades", output=f"ups_{run}")
        code, checked = call(api, "POST", "/api/queries/validate", {"text": good})
        assert code == 200 and checked["ok"] is True
        assert checked["queries"] == [{"name": "ups", "stream": "trades",
                                       "output": f"ups_{run}", "live": False}]
        code, queued = call(api, "POST", "/api/queries", {"text": good})  # nobody is up
        assert code == 202 and queued["outcome"] == "queued", queued
        code, again = call(api, "POST", "/api/queries", {"text": good})
        assert code == 409 and "is live already" in again["errors"][0]["message"]
        code, listed = call(api, "GET", "/api/queries?state=false")
        assert [q["name"] for q in listed["queries"]] == ["ups"]


def test_stream_and_query_over_http_tail_equals_reference(settings):
    run = uuid.uuid4().hex[:8]
    stream, output = f"web{run}", f"web_ups_{run}"
    topics = Topics(stream, source=f"src.{stream}", prefix=f"api{run}")
    create_topics(settings, topics, 2, [output])
    document = json_schema_of(stream)
    schema = stream_schema_from_json_schema(document, time="ts")
    registry = SchemaRegistry()
    registry.add(schema)
    text = UPS.format(name="rises", stream=stream, output=output)
    queries = load_query_text(text, registry)
    events, _ = read_events(TRADES, queries[0].schema)
    expected = reference.run(queries, events)
    assert expected

    config = ApiConfig(settings, topic_prefix=topics.prefix, token=TOKEN, timeout_s=120)
    with LocalPipeline(settings, topics, workers=2, partitions=2), \
            ApiThread(config) as api:
        wait_for(lambda: any(e["role"] == "splitter" for e in
                             services_view(settings, topics.status).values()), 60,
                 "the splitter's presence record")
        code, made = call(api, "POST", "/api/streams", {"json_schema": document, "time": "ts"})
        assert code == 201 and made["outcome"] == "applied", made
        code, listed = call(api, "GET", f"/api/streams/{stream}")
        assert code == 200 and listed["source"] == "control" and listed["version"] == 1
        code, added = call(api, "POST", "/api/queries", {"text": text})
        assert code == 201 and added["outcome"] == "applied", added
        assert added["changes"][0]["said"].startswith("query rises: add applied from seq")

        assert tail_while_producing(api, settings, topics, "rises", len(expected)) == expected

        code, query = call(api, "GET", "/api/queries/rises")
        assert code == 200 and query["output"] == output
        assert query["state"]["live"] is True and query["state"]["partitions"] == [0, 1]
        assert len(query["state"]["services"]) == 4  # splitter, 2 workers, coordinator
        assert query["state"]["into_records"] == len(expected)
        assert query["state"]["failed"] is False and query["state"]["reason"] is None

        code, explained = call(api, "GET", "/api/queries/rises/explain")
        assert code == 200 and explained["kind"] == "MATCH", explained
        assert explained["text"].startswith("query rises (MATCH): PATTERN ( . up up )")
        assert len(explained["nodes"]) == 4 and explained["svg"].lstrip().startswith("<")
        code, missing = call(api, "GET", "/api/queries/nothing/explain")
        assert code == 404 and "no live query" in missing["error"]

        breaking = {**schema.to_dict(), "attributes": {
            k: v for k, v in schema.to_dict()["attributes"].items() if k != "price"}}
        code, refused = call(api, "PUT", f"/api/streams/{stream}", {"schema": breaking})
        assert code == 422 and "would break the live query 'rises'" in \
            refused["errors"][0]["message"]
        assert refused["errors"][1]["query"] == "rises" and refused["errors"][1]["line"]
        code, removed = call(api, "DELETE", "/api/queries/rises")
        assert code == 200 and removed["outcome"] == "applied", removed


def test_cli_stream_add_from_jsonschema(settings):
    import os
    import subprocess
    import sys

    from cep_service.stream.control import control_records

    prefix = f"cli{uuid.uuid4().hex[:8]}"
    document = ROOT / "examples" / "own_stream" / "orders.jsonschema.json"
    env = {**os.environ, "KAFKA_BOOTSTRAP": settings.bootstrap, "CEP_TOPIC_PREFIX": prefix}
    added = subprocess.run([sys.executable, "-m", "cep_service.cli.main", "stream", "add",
                            "--from-jsonschema", str(document), "--skip-optional",
                            "--type-attribute", "kind", "--no-wait"], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert added.returncode == 0, added.stderr
    [(key, value)] = control_records(settings, Topics("", prefix=prefix).control)
    made = stream_schema_from_json_schema(json.loads(document.read_text()),
                                          skip_optional=True, type_attribute="kind")
    assert key == b"stream/orders"
    assert json.loads(json.loads(value)["text"]) == made.to_dict()
    again = subprocess.run([sys.executable, "-m", "cep_service.cli.main", "stream", "add",
                            "--from-jsonschema", str(document), "--no-wait"], env=env,
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 1 and "note: not in required" in again.stderr


def test_serve_api_without_a_token_refuses_another_address(settings):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "CEP_API_TOKEN"}
    refused = subprocess.run([sys.executable, "-m", "cep_service.cli.main", "serve", "api",
                              "--api-host", "0.0.0.0", "--bootstrap", settings.bootstrap],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "CEP_API_TOKEN is not set: the API binds to 127.0.0.1 only" in refused.stderr


def test_serve_all_runs_the_api(settings, tmp_path):
    """`cep serve all --api-port`: the API is one of its processes, and a query added
    through it is applied by the pipeline's processes."""
    import os
    import signal
    import subprocess
    import sys

    from cep_service.stream.broker import free_port

    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.all.{run}", prefix=f"all{run}")
    port = free_port()
    env = {**os.environ, "KAFKA_BOOTSTRAP": settings.bootstrap, "CEP_API_TOKEN": TOKEN,
           "CEP_SESSION_TIMEOUT_MS": "2000"}
    log = open(tmp_path / "serve.log", "wb")
    serve = subprocess.Popen([sys.executable, "-m", "cep_service.cli.main", "serve", "all",
                              "--partitions", "2", "--source", topics.source,
                              "--topic-prefix", topics.prefix, "--web-port", str(free_port()),
                              "--api-port", str(port), "--api-host", "127.0.0.1"],
                             env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    api = type("Running", (), {"url": f"http://127.0.0.1:{port}"})()
    try:
        def up() -> bool:
            try:
                roles = {e["role"] for e in services_view(settings, topics.status).values()}
                return call(api, "GET", "/readyz", timeout=5)[0] == 200 and \
                    {"splitter", "worker", "coordinator"} <= roles
            except OSError:
                return False
        wait_for(up, 120, "the API and the pipeline of cep serve all", interval_s=0.5)
        text = UPS.format(name="ups", stream="trades", output=f"all_ups_{run}")
        code, added = call(api, "POST", "/api/queries", {"text": text})
        assert code == 201 and added["outcome"] == "applied", added
        code, query = call(api, "GET", "/api/queries/ups")
        assert code == 200 and query["state"]["live"] is True
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(120)
