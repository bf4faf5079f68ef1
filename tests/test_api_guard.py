"""The API's safety rules (services/api/guard.py, docs/api.md "Safety") through aiohttp's
test client, no broker: each refusal (a foreign Host 421, a change from another origin
403, a body that is not JSON 415, a preflight from an origin not allowed 403, the token
401), each allowed case (loopback and allowed hosts, the API's own origin, an allowed
origin with its CORS headers), JSON errors for every status (404, 405, 413, 500; an
unreachable broker 503 with Retry-After), and query checking off the event loop on a
bounded pool. The control topic's records are stubbed (none) and so is a change's
publishing where a request is let through."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

import cep_service.api.app as app_module
import cep_service.api.checks as checks_module
from cep_service.api.app import API, CHECKS_AT_ONCE, ApiConfig, bind_host, make_app
from cep_service.api.guard import host_name, normal_origin
from cep_service.errors import BrokerUnreachable
from cep_service.stream.kafka import KafkaSettings

ROOT = Path(__file__).resolve().parent.parent
NOWHERE = KafkaSettings("127.0.0.1:1")
JSON = {"Content-Type": "application/json"}
QUERY = {"text": "QUERY ups FROM trades INTO ups PARTITION BY symbol\n"
                 "PATTERN ( . up up ) DEFINE up AS price > Last(price)\n"
                 "EMIT symbol = symbol;"}
BODY = orjson.dumps(QUERY)
TOKEN = "guard-token"


def serve(scenario, bound: str | None = None, **options):
    """Run `scenario(client, api)` against the app of ApiConfig(**options); changes that
    get through are recorded in api.changes instead of published."""
    async def main():
        app = make_app(ApiConfig(NOWHERE, **options), bound)
        api = app[API]
        api.records = lambda fresh=False: []
        api.changes = []

        def change(kind, op, name, text, only, wait, timeout_s):
            api.changes.append((kind, op, name))
            return 202, {"outcome": "sent", "errors": [], "changes": []}
        api.change = change
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            await scenario(client, api)
    asyncio.run(main())


async def answer(response) -> tuple[int, dict]:
    assert response.content_type == "application/json", await response.text()
    return response.status, await response.json()


async def status_for_host(client, host: str) -> int:
    """The status of GET /api/queries with that Host header."""
    code, _ = await answer(await client.get("/api/queries", headers={"Host": host}))
    return code


async def until(condition, polls: int = 6000) -> None:
    """Poll `condition` (each poll yields to the loop); fail after `polls` polls."""
    for _ in range(polls):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail("the condition never held")


def own(client) -> str:
    return f"http://127.0.0.1:{client.port}"


# ---------------------------------------------------------------- Host


def test_a_foreign_host_is_refused_421():
    async def scenario(client, api):
        for method, path, body in (("GET", "/api/queries", None), ("GET", "/", None),
                                   ("POST", "/api/queries", BODY),
                                   ("POST", "/api/queries/validate", BODY)):
            code, error = await answer(await client.request(
                method, path, data=body, headers={**JSON, "Host": "attacker.example"}))
            assert code == 421 and "attacker.example" in error["error"]
        assert await status_for_host(client, "127.0.0.1.attacker.example") == 421
        assert await status_for_host(client, "a b") == 421
        assert api.changes == []
        # the probes answer whatever the Host (an orchestrator dials an address)
        code, alive = await answer(await client.get("/healthz",
                                                    headers={"Host": "10.0.0.7:8080"}))
        assert (code, alive) == (200, {"alive": True})
    serve(scenario)


def test_loopback_and_allowed_hosts_are_served():
    async def scenario(client, api):
        for host in ("localhost", "LOCALHOST:8080", "localhost.:1", "127.0.0.1:9",
                     "127.0.0.2", "[::1]", "[::1]:8080", "api.example:8443",
                     "API.Example"):
            code, body = await answer(await client.get("/api/queries",
                                                       headers={"Host": host}))
            assert (code, body) == (200, {"queries": []}), host
        assert await status_for_host(client, "other.example") == 421
    serve(scenario, allowed_hosts=["api.example"])


def test_the_bound_address_and_star():
    async def bound(client, api):
        assert await status_for_host(client, "10.1.2.3:8080") == 200
        assert await status_for_host(client, "10.1.2.4:8080") == 421
    serve(bound, bound="10.1.2.3", token=TOKEN)

    async def wildcard(client, api):  # 0.0.0.0 names no host
        assert await status_for_host(client, "0.0.0.0:8080") == 421
    serve(wildcard, bound="0.0.0.0", token=TOKEN)

    async def star(client, api):
        assert await status_for_host(client, "anything.example") == 200
    serve(star, allowed_hosts=["*"])


# ---------------------------------------------------------------- Origin, content type, token


def test_a_change_from_another_origin_is_refused_403():
    async def scenario(client, api):
        for origin in ("http://evil.example", "null", f"http://127.0.0.1:{client.port + 1}",
                       f"https://127.0.0.1:{client.port}", "http://localhost:"
                       f"{client.port}"):
            for content_type in ("text/plain", "application/json"):
                for path in ("/api/queries", "/api/queries/validate", "/api/streams"):
                    code, error = await answer(await client.post(path, data=BODY, headers={
                        "Content-Type": content_type, "Origin": origin}))
                    assert code == 403 and "another origin" in error["error"], (origin, path)
            code, _ = await answer(await client.delete("/api/queries/ups",
                                                       headers={"Origin": origin}))
            assert code == 403
            code, _ = await answer(await client.put("/api/queries/ups", data=BODY,
                                                    headers={**JSON, "Origin": origin}))
            assert code == 403
        # no Origin, but the browser says the request comes from another site
        code, _ = await answer(await client.post("/api/queries", data=BODY, headers={
            **JSON, "Sec-Fetch-Site": "cross-site"}))
        assert code == 403
        assert api.changes == []
        # reads are answered, but with no CORS header the page cannot read them
        reply = await client.get("/api/queries", headers={"Origin": "http://evil.example"})
        assert reply.status == 200 and "Access-Control-Allow-Origin" not in reply.headers
    serve(scenario)


def test_the_apis_own_origin_and_no_origin_are_let_through():
    async def scenario(client, api):
        code, sent = await answer(await client.post("/api/queries", data=BODY, headers={
            **JSON, "Origin": own(client), "Sec-Fetch-Site": "same-origin"}))
        assert (code, sent["outcome"]) == (202, "sent")
        code, _ = await answer(await client.post("/api/queries", data=BODY, headers={
            "Content-Type": "application/json; charset=utf-8", "Origin": own(client)}))
        assert code == 202
        code, _ = await answer(await client.post("/api/queries", data=BODY, headers=JSON))
        assert code == 202  # curl, the CLI: no page behind it
        code, _ = await answer(await client.post("/api/queries", data=BODY, headers={
            **JSON, "Origin": f"http://localhost:{client.port}",
            "Host": f"localhost:{client.port}"}))
        assert code == 202
        code, _ = await answer(await client.delete("/api/queries/ups",
                                                   headers={"Origin": own(client)}))
        assert code == 202  # a DELETE without a body needs no content type
        code, checked = await answer(await client.post(
            "/api/queries/validate", data=BODY, headers={**JSON, "Origin": own(client)}))
        assert code == 200 and checked["ok"] is True
        assert api.changes == [("query", "add", None)] * 4 + [("query", "remove", "ups")]
    serve(scenario)


def test_a_change_needs_a_json_body_415():
    async def scenario(client, api):
        for content_type in ("text/plain", "application/x-www-form-urlencoded",
                             "multipart/form-data; boundary=x", "application/jsonp", None):
            headers = {} if content_type is None else {"Content-Type": content_type}
            for method, path in (("POST", "/api/queries"), ("POST", "/api/queries/validate"),
                                 ("POST", "/api/streams"), ("POST", "/api/streams/validate"),
                                 ("PUT", "/api/queries/ups"), ("PUT", "/api/streams/s")):
                code, error = await answer(await client.request(
                    method, path, data=BODY, skip_auto_headers=["Content-Type"],
                    headers=headers))
                assert code == 415 and "application/json" in error["error"], (method, path)
        code, _ = await answer(await client.delete("/api/queries/ups", data=b"{}",
                                                   headers={"Content-Type": "text/plain"}))
        assert code == 415
        code, _ = await answer(await client.post("/api/queries", headers=JSON))
        assert code == 400  # typed JSON, but empty
        assert api.changes == []
    serve(scenario)


def test_the_token_on_loopback_too():
    with pytest.raises(ValueError, match="--api-require-token"):
        bind_host(None, None, require_token=True)
    with pytest.raises(ValueError, match="--api-require-token"):
        bind_host("127.0.0.1", None, require_token=True)
    assert bind_host(None, TOKEN, require_token=True) == "0.0.0.0"
    assert bind_host("127.0.0.1", TOKEN, require_token=True) == "127.0.0.1"

    async def scenario(client, api):
        code, error = await answer(await client.post("/api/queries", data=BODY, headers=JSON))
        assert code == 401 and "Bearer" in error["error"]
        code, _ = await answer(await client.post("/api/queries", data=BODY, headers={
            **JSON, "Authorization": f"Bearer {TOKEN}", "Origin": "http://evil.example"}))
        assert code == 403  # the token does not let another origin's page in
        code, _ = await answer(await client.post("/api/queries", data=BODY, headers={
            **JSON, "Authorization": f"Bearer {TOKEN}"}))
        assert code == 202
        code, _ = await answer(await client.post("/api/queries/validate", data=BODY,
                                                 headers=JSON))
        assert code == 200  # validate changes nothing: no token
        assert api.changes == [("query", "add", None)]
    serve(scenario, token=TOKEN, require_token=True)


def test_serve_api_refuses_to_start_without_the_token_it_requires():
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEP_API_")}
    refused = subprocess.run([sys.executable, "-m", "cep_service.cli.main", "serve", "api",
                              "--api-require-token", "--bootstrap", "127.0.0.1:1"],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "CEP_API_TOKEN is not set and --api-require-token" in refused.stderr
    env["CEP_API_CORS_ORIGINS"] = "http://ok.example ftp://bad.example"
    refused = subprocess.run([sys.executable, "-m", "cep_service.cli.main", "serve", "api",
                              "--bootstrap", "127.0.0.1:1"], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "'ftp://bad.example'" in refused.stderr


# ---------------------------------------------------------------- CORS


def test_no_cors_by_default():
    async def scenario(client, api):
        reply = await client.options("/api/queries", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        code, error = await answer(reply)
        assert code == 403 and "--api-cors-origin" in error["error"]
        assert not any(k.startswith("Access-Control-") for k in reply.headers)
        reply = await client.options("/api/queries")  # not a preflight
        assert reply.status == 204
        assert set(reply.headers["Allow"].split(", ")) == {"GET", "HEAD", "POST", "OPTIONS"}
        code, _ = await answer(await client.options("/nothing/here", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}))
        assert code == 404
    serve(scenario)


def test_cors_for_the_allowed_origins():
    app_origin = "https://app.example"

    async def scenario(client, api):
        reply = await client.options("/api/queries/ups", headers={
            "Origin": app_origin, "Access-Control-Request-Method": "PUT",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert reply.status == 204
        assert reply.headers["Access-Control-Allow-Origin"] == app_origin
        assert {"GET", "PUT", "DELETE"} <= set(
            reply.headers["Access-Control-Allow-Methods"].split(", "))
        assert {"Authorization", "Content-Type"} <= set(
            reply.headers["Access-Control-Allow-Headers"].split(", "))
        assert "Origin" in reply.headers["Vary"]
        assert int(reply.headers["Access-Control-Max-Age"]) > 0

        reply = await client.get("/api/queries", headers={"Origin": app_origin})
        assert reply.status == 200
        assert reply.headers["Access-Control-Allow-Origin"] == app_origin
        assert "Origin" in reply.headers["Vary"]
        code, _ = await answer(await client.post("/api/queries", data=BODY, headers={
            **JSON, "Origin": app_origin}))
        assert code == 202  # an allowed origin may change
        reply = await client.post("/api/queries", data=b"x", headers={
            **JSON, "Origin": app_origin})  # its errors carry the header too
        assert reply.status == 400
        assert reply.headers["Access-Control-Allow-Origin"] == app_origin

        reply = await client.get("/api/queries", headers={"Origin": "http://evil.example"})
        assert "Access-Control-Allow-Origin" not in reply.headers
        code, _ = await answer(await client.options("/api/queries", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}))
        assert code == 403
        assert api.changes == [("query", "add", None)]
    serve(scenario, cors_origins=["HTTPS://App.Example:443/"])


def test_origins_and_hosts_are_normalized_and_checked():
    assert normal_origin("HTTP://Example.COM:80") == "http://example.com"
    assert normal_origin("http://example.com:8080/") == "http://example.com:8080"
    assert normal_origin("http://[::1]:3000") == "http://[::1]:3000"
    for bad in ("example.com", "ftp://example.com", "http://example.com/app",
                "http://u:p@example.com", "http://example.com:x", "null", "*"):
        with pytest.raises(ValueError, match="not an origin"):
            normal_origin(bad)
    with pytest.raises(ValueError, match="not an origin"):
        ApiConfig(NOWHERE, cors_origins=["*"])
    with pytest.raises(ValueError, match="not a host name"):
        ApiConfig(NOWHERE, allowed_hosts=["http://x/"])
    assert host_name("[::1]:8080") == "::1" and host_name("::1") == "::1"
    assert host_name("Example.com.:80") == "example.com"
    assert host_name("example.com:http") is None and host_name("[::1]x") is None


# ---------------------------------------------------------------- JSON errors


def test_every_error_is_json():
    async def scenario(client, api):
        code, error = await answer(await client.get("/no/such/thing"))
        assert code == 404 and "/no/such/thing" in error["error"]
        code, error = await answer(await client.get("/console/nothing.js"))
        assert code == 404
        for method in ("DELETE", "PATCH"):
            reply = await client.request(method, "/api/queries", data=b"x",
                                         headers={"Content-Type": "text/plain"})
            code, error = await answer(reply)
            assert code == 405 and "POST" in reply.headers["Allow"], method
            assert "POST" in error["error"]
        code, error = await answer(await client.post(
            "/api/queries", data=b'{"text": "' + b"x" * (2 * 1024 * 1024) + b'"}',
            headers=JSON))
        assert code == 413 and "too large" in error["error"]
        code, error = await answer(await client.post("/api/queries", data=b"[1]",
                                                     headers=JSON))
        assert code == 400 and error["error"]
        code, error = await answer(await client.get("/api/queries/ups/tail?from=middle"))
        assert code == 400

        def fails(*args):
            raise RuntimeError("a bug")
        api.change = fails
        code, error = await answer(await client.post("/api/queries", data=BODY, headers=JSON))
        assert code == 500 and "a bug" not in error["error"]
    serve(scenario)


def test_an_unreachable_broker_is_503_with_retry_after():
    async def scenario(client, api):
        def unreachable(fresh=False):
            raise BrokerUnreachable("broker 127.0.0.1:1: Local: Broker transport failure")
        api.records = unreachable
        for method, path, body in (("GET", "/api/queries", None),
                                   ("GET", "/api/queries/ups", None),
                                   ("GET", "/api/streams", None),
                                   ("GET", "/api/queries/ups/tail", None),
                                   ("POST", "/api/queries/validate", BODY)):
            reply = await client.request(method, path, data=body, headers=JSON)
            code, error = await answer(reply)
            assert code == 503 and "broker is unreachable" in error["error"], path
            assert int(reply.headers["Retry-After"]) > 0
        code, ready = await answer(await client.get("/readyz"))
        assert code == 503 and ready["ready"] is False
    serve(scenario)


# ---------------------------------------------------------------- checking off the loop


def test_checking_a_query_leaves_the_event_loop_free(monkeypatch):
    """The check is held until /healthz has answered: had it run on the event loop,
    /healthz could not answer (the test would fail, not wait on a clock)."""
    release, threads = threading.Event(), []
    real = checks_module.query_problems

    def held(text, registry):
        threads.append(threading.current_thread().name)
        assert release.wait(60), "never released"
        return real(text, registry)
    monkeypatch.setattr(checks_module, "query_problems", held)

    async def scenario(client, api):
        checking = asyncio.ensure_future(client.post("/api/queries/validate", data=BODY,
                                                     headers=JSON))
        await until(lambda: threads or checking.done())  # the check has begun
        assert not checking.done(), await (await checking).text()
        code, alive = await answer(await client.get("/healthz"))
        assert (code, alive) == (200, {"alive": True})
        assert not checking.done()
        release.set()
        code, checked = await answer(await checking)
        assert code == 200 and checked["ok"] is True
        assert threads == ["api-check_0"]

        release.clear()  # an add checks on the same threads (and does not send)
        del api.change  # the real one: the check refuses before anything is published
        monkeypatch.setattr(checks_module, "query_problems", lambda text, registry: (
            threads.append(threading.current_thread().name) or
            ([{"message": "no", "line": 1, "column": 1}], [])))
        code, invalid = await answer(await client.post("/api/queries", data=BODY,
                                                       headers=JSON))
        assert code == 422 and invalid["outcome"] == "invalid"
        assert threads[-1].startswith("api-check_")
    serve(scenario)


def test_checks_are_bounded(monkeypatch):
    release, begun = threading.Event(), []

    def held(text, registry):
        begun.append(1)
        assert release.wait(60), "never released"
        return [], []
    monkeypatch.setattr(checks_module, "query_problems", held)

    async def scenario(client, api):
        pending = [asyncio.ensure_future(client.post(
            "/api/queries/validate", data=BODY, headers=JSON)) for _ in range(CHECKS_AT_ONCE)]
        await until(lambda: api.limits.in_flight["check"] == CHECKS_AT_ONCE and
                    len(begun) == app_module.CHECK_THREADS)
        reply = await client.post("/api/queries/validate", data=BODY, headers=JSON)
        code, error = await answer(reply)
        assert code == 429 and reply.headers["Retry-After"] == "1"
        assert api.limits.refused["check"] == 1
        assert len(begun) == app_module.CHECK_THREADS  # the others wait for a thread
        release.set()
        for done in await asyncio.gather(*pending):
            assert done.status == 200
        assert api.limits.in_flight["check"] == 0
    serve(scenario)
