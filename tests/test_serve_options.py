"""`cep serve all` starts its processes with command lines built from one options object
(services/cli/serve.py, `ServeOptions`): the processes of each shape, and every child's
command line read back by `cep serve` itself gives the options it was built from."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from cep_service.cli.serve import PASSED_DOWN, ServeOptions, _register_serve
from cep_service.stream.topics import Topics

OPTIONS = ServeOptions(
    bootstrap="broker:9092", stream="trades", partitions=3, distributed=True, workers=2,
    coordinators=2, shard=0, pulse_ms=50, linger_ms=2.5, source="", control="",
    topic_prefix="run1", kafka_config=Path("/etc/kafka.properties"),
    allowed_lateness_ms=100, idle_timeout_ms=0, max_ahead="1h", max_ahead_of_clock=None,
    idleness="5s", metrics_port=9100, web_port=6070, replication_factor=3, schema=None,
    api_port=8081, api_host="0.0.0.0", api_metrics=None, api_allowed_host=["cep.example"],
    api_cors_origin=["https://app.example"], api_require_token=True)
TOPICS = Topics("trades", "", "", "run1", 2)


def serve_command():
    app = typer.Typer(add_completion=False)
    _register_serve(app, guard=lambda body: body(), cli_error=RuntimeError)
    return typer.main.get_command(app)


def test_the_processes_of_each_shape():
    plan = OPTIONS.plan("broker:9092", TOPICS)
    assert [role for role, _ in plan] == ["splitter", "worker", "worker", "coordinator",
                                          "coordinator", "api"]
    assert [argv[argv.index("--metrics-port") + 1] for _, argv in plan[:-1]] == [
        "9100", "9101", "9102", "9103", "9104"]
    assert plan[3][1][-2:] == ["--shard", "0"] and plan[4][1][-2:] == ["--shard", "1"]
    api = plan[-1][1]
    assert [a for a in api if a.startswith("--api-metrics=")] == [
        f"--api-metrics=http://127.0.0.1:{9100 + i}/metrics" for i in range(5)]
    assert api[api.index("--api-host") + 1] == "0.0.0.0" and "--api-require-token" in api
    assert "--api-allowed-host=cep.example" in api
    assert "--api-cors-origin=https://app.example" in api
    chained = dataclasses.replace(OPTIONS, distributed=False, metrics_port=0, api_port=0)
    assert [(role, "--metrics-port" in argv) for role, argv in
            chained.plan("broker:9092", TOPICS)] == [("chained", False)]


def test_a_childs_command_line_gives_the_options_back():
    command = serve_command()
    for role, argv in OPTIONS.plan("broker:9092", TOPICS):
        params = command.make_context("serve", [role, *argv]).params
        for name in PASSED_DOWN:
            given = getattr(OPTIONS, name)
            found = Path(params[name]) if isinstance(given, Path) else params[name]
            assert found == given, (role, name)
        assert (params["bootstrap"], params["source"], params["control"]) == (
            "broker:9092", "trades", "run1.cep.queries")
        if role == "api":
            assert (params["api_port"], params["api_host"], params["api_require_token"],
                    list(params["api_allowed_host"]), list(params["api_cors_origin"])) == (
                8081, "0.0.0.0", True, ["cep.example"], ["https://app.example"])


def test_the_options_are_the_commands():
    """Every option of `cep serve` is a field of ServeOptions and back (the command builds
    the object from its parameters by name)."""
    names = {p.name for p in serve_command().params} - {"role"}
    assert names == {f.name for f in dataclasses.fields(ServeOptions)}
