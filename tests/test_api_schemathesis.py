"""schemathesis's command line with every check (`--checks all`) against the live API and
the document it serves at /openapi.json (the session's broker, no pipeline up, so changes
are queued on a control topic of this test's own): the coverage, fuzzing and stateful
phases, no failure. Once with a token (the changes document the bearer token as
required: a change without it must be 401) and once without (nothing documents it).
tests/test_api_schemathesis.toml says where JSON Schema cannot say all the API checks (a
query text that does not check is 422) and why use_after_free is left out. The examples
per operation and the seed are fixed, so a run is the same each time."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from cep_service.api import models
from cep_service.api.app import ApiConfig, ApiThread, make_app
from cep_service.stream.kafka import KafkaSettings

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "test_api_schemathesis.toml"
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
TOKEN = "schemathesis-token"


def schemathesis_command(url: str, token: str | None, examples: int, seed: int) -> list:
    command = [str(SCHEMATHESIS), "--no-color", "--config-file", str(CONFIG), "run",
               f"{url}/openapi.json", "--checks", "all", "--exclude-checks",
               "use_after_free", "--max-examples", str(examples), "--seed", str(seed),
               "--workers", "1", "--request-timeout", "30", "--generation-database", "none"]
    if token:
        command += ["-H", f"Authorization: Bearer {token}"]
    return command


@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "no-token"])
def test_schemathesis_finds_nothing(kafka_bootstrap, tmp_path, token):
    config = ApiConfig(KafkaSettings(kafka_bootstrap, session_timeout_ms=2000),
                       topic_prefix=f"fuzz{uuid.uuid4().hex[:8]}", token=token, timeout_s=2)
    with ApiThread(config) as api:
        run = subprocess.run(schemathesis_command(api.url, token, 15, 1), cwd=tmp_path,
                             capture_output=True, text=True, timeout=900,
                             env={**os.environ, "NO_COLOR": "1"})
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert "Coverage" in run.stdout and "Stateful" in run.stdout


def served(scenario, token=None):
    """scenario(client) against the app (no broker), its answer."""
    async def main():
        app = make_app(ApiConfig(KafkaSettings("127.0.0.1:1"), token=token))
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            return await scenario(client)
    return asyncio.run(main())


async def document(client) -> dict:
    return await (await client.get("/openapi.json")).json()


def test_the_token_is_documented_only_where_it_is_needed():
    with_token, without = served(document, TOKEN), served(document)
    secured = {(path, method) for path, ops in with_token["paths"].items()
               for method, op in ops.items() if "security" in op}
    assert secured == {("/api/queries", "post"), ("/api/queries/{name}", "put"),
                       ("/api/queries/{name}", "delete"), ("/api/streams", "post"),
                       ("/api/streams/{name}", "put"), ("/api/streams/{name}", "delete")}
    assert all("401" in with_token["paths"][p][m]["responses"] for p, m in secured)
    assert not any("security" in op or "401" in op["responses"]
                   for ops in without["paths"].values() for op in ops.values())
    assert "securitySchemes" not in without["components"]


def test_the_document_is_the_models():
    """A body's schema in the document is its model's; each handler's answer goes through
    the model of its status (services/api/openapi.py), so the two cannot drift."""
    found = served(document)
    schemas = found["components"]["schemas"]
    for name in ("QueryBody", "StreamBody", "QueryList", "Outcome", "Explanation"):
        model = getattr(models, name)
        assert set(schemas[name]["properties"]) == {
            f.alias or n for n, f in model.model_fields.items()}, name
    assert schemas["StreamBody"]["properties"]["schema"]["required"] == \
        ["stream", "attributes", "time"]  # the control message's own schema of a stream
    operation = found["paths"]["/api/queries"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"] == \
        {"$ref": "#/components/schemas/QueryBody"}
    assert {"400", "403", "413", "415", "421", "422", "429", "503"} <= \
        set(operation["responses"])
    assert operation["responses"]["429"]["headers"]["Retry-After"]["required"] is True


def test_a_validate_path_is_its_own_resource():
    """/api/queries/validate is not a {name}: its Allow lists its methods only (the
    tester's ST205), and a name that is not a name is 400, not a lookup."""
    async def scenario(client):
        reply = await client.options("/api/queries/validate")
        assert reply.status == 204
        assert set(reply.headers["Allow"].split(", ")) == {"OPTIONS", "POST"}
        reply = await client.get("/api/streams/validate")
        assert reply.status == 405
        assert set(reply.headers["Allow"].split(", ")) == {"POST"}
        reply = await client.get("/api/queries/0bad")
        assert reply.status == 400 and "not a name" in (await reply.json())["error"]
        reply = await client.get("/api/queries?state=null")
        assert reply.status == 400  # the tester's ST201: state is true or false
        reply = await client.post("/api/streams/validate", json={
            "json_schema": {"type": "object", "properties": {"a": {}}},
            "skip_optional": 0})
        assert reply.status == 400  # strict: 0 is not a boolean
    served(scenario)
