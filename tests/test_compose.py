"""docker-compose.yml and the Dockerfile, read as files (PyYAML; no Docker engine needed),
and, where the Docker CLI has the compose plugin, as Docker Compose reads them.

Safe as shipped (issue 27): the image runs as an unprivileged user with a home, owning its
cache and state folders; no port is published on every interface by default (each names
a host IP, 127.0.0.1 unless CEP_BIND says otherwise); every CEP service has the
pipeline's settings (CEP_PARTITIONS, CEP_REPLICATION_FACTOR, CEP_COORDINATORS,
KAFKA_BOOTSTRAP) in its effective environment; the `queries` service registers the
example queries of CEP_STREAM (made at build time by docker/stream_queries.py, run here
as the Dockerfile runs it); every CEP service mounts the one kernel-cache volume where
CEP_KERNEL_CACHE points. Compose's variable interpolation (`${VAR:-default}`, nested,
`${VAR:?error}`, `$$`) is done here as Compose documents it."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PIPELINE_ENV = ("KAFKA_BOOTSTRAP", "CEP_PARTITIONS", "CEP_REPLICATION_FACTOR",
                "CEP_COORDINATORS")
LOOPBACK = {"127.0.0.1", "::1", "[::1]", "localhost"}
TOKEN = {"CEP_API_TOKEN": "test-token"}  # compose requires it (the API's bearer token)


# ------------------------------------------------------------------ reading the files

def interpolate(text, env: dict[str, str]):
    """`text` as Compose interpolates it with the variables `env` (strings only)."""
    if not isinstance(text, str):
        return text
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            depth, j = 1, i + 2
            while depth:
                if text.startswith("${", j):
                    depth, j = depth + 1, j + 2
                    continue
                depth -= text[j] == "}"
                j += 1
            out.append(_expression(text[i + 2:j - 1], env))
            i = j
        elif (bare := re.match(r"\$([A-Za-z_]\w*)", text[i:])) is not None:
            out.append(env.get(bare.group(1), ""))
            i += bare.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _expression(expression: str, env: dict[str, str]) -> str:
    name = re.match(r"[A-Za-z_]\w*", expression).group(0)
    rest = expression[len(name):]
    value = env.get(name)
    for op in (":-", "-", ":?", "?", ":+", "+"):
        if rest.startswith(op):
            operand = interpolate(rest[len(op):], env)
            unset = value is None or (op.startswith(":") and value == "")
            if op.endswith("-"):
                return operand if unset else value
            if op.endswith("?"):
                if unset:
                    raise ValueError(f"required variable {name}: {operand}")
                return value
            return "" if unset else operand
    assert rest == "", expression
    return value or ""


def interpolated(node, env: dict[str, str]):
    if isinstance(node, dict):
        return {k: interpolated(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolated(v, env) for v in node]
    return interpolate(node, env)


def compose(env: dict[str, str] | None = None) -> dict:
    """docker-compose.yml (YAML anchors and merge keys resolved) interpolated with `env`
    (the API token added), as if no other variable were set."""
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return interpolated(document, {**TOKEN, **(env or {})})


def dockerfile_final_stage() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile's last stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    instructions = [tuple(line.split(None, 1)) for line in lines
                    if line and not line.startswith("#")]
    last_from = max(i for i, (op, *_) in enumerate(instructions) if op.upper() == "FROM")
    return [(op.upper(), args) for op, args in instructions[last_from + 1:]]


def image_env() -> dict[str, str]:
    env = {}
    for op, args in dockerfile_final_stage():
        if op == "ENV":
            env.update(token.split("=", 1) for token in shlex.split(args))
    return env


def cep_services(config: dict) -> dict[str, dict]:
    """The services built from this repository's Dockerfile."""
    return {name: s for name, s in config["services"].items() if "build" in s}


def effective_env(service: dict) -> dict[str, str]:
    """The service's environment over the image's (list or mapping form)."""
    found = service.get("environment") or {}
    if isinstance(found, list):
        found = dict(item.split("=", 1) for item in found)
    return {**image_env(), **{k: str(v) for k, v in found.items()}}


def published(port) -> tuple[str | None, str]:
    """(host IP or None, the rest) of a published port, short or long syntax."""
    if isinstance(port, dict):
        return port.get("host_ip"), str(port.get("published"))
    port = str(port)
    if port.startswith("["):  # [::1]:8080:8080
        host, _, rest = port[1:].partition("]:")
        return host, rest
    parts = port.split(":")
    return (parts[0], ":".join(parts[1:])) if len(parts) == 3 else (None, port)


# ------------------------------------------------------------------ the checks

def test_interpolation_as_compose_documents_it():
    env = {"A": "a", "EMPTY": ""}
    assert interpolate("${A}-${B:-b}-${EMPTY:-e}-${EMPTY-e}-$$A-$A", env) == "a-b-e--$A-a"
    assert interpolate("${X:-/q/${A:-t}.cep}", env) == "/q/a.cep"
    assert interpolate("${X:-/q/${Y:-t}.cep}", env) == "/q/t.cep"
    with pytest.raises(ValueError, match="set it"):
        interpolate("${TOKEN:?set it}", env)


def test_image_runs_as_an_unprivileged_user_owning_its_folders():
    stage = dockerfile_final_stage()
    users = [args.strip() for op, args in stage if op == "USER"]
    assert users, "the image runs as root (no USER)"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users
    runs = " ".join(args for op, args in stage if op == "RUN")
    assert "useradd" in runs and "--create-home" in runs  # a user with a home
    uid = re.search(r"useradd[^&]*--uid (\d+)", runs).group(1)
    assert user in (uid, "cep")
    env = image_env()
    owned = [path for part in re.findall(r"chown -R (?:cep|10001):(?:cep|10001) ([^&]*)", runs)
             for path in part.split()]
    for folder in (env["CEP_KERNEL_CACHE"], env["CEP_HOME"]):  # writable by that user
        assert any(folder == path or folder.startswith(path + "/") for path in owned), folder
    user_at = max(i for i, (op, _) in enumerate(stage) if op == "USER")
    assert all(op != "RUN" for op, _ in stage[user_at:])  # nothing runs as root after it


def test_no_port_published_on_every_interface_by_default():
    config = compose()
    ports = {(name, str(p)) for name, s in config["services"].items()
             for p in s.get("ports", [])}
    assert {name for name, _ in ports} >= {"kafka", "api", "grafana", "prometheus"}
    for name, service in config["services"].items():
        for port in service.get("ports", []):
            host, _ = published(port)
            assert host in LOOPBACK, f"{name} publishes {port} on every interface"
    # configurable: CEP_BIND moves every published port
    for name, service in compose({"CEP_BIND": "0.0.0.0"})["services"].items():
        for port in service.get("ports", []):
            assert published(port)[0] == "0.0.0.0", (name, port)


def test_every_cep_service_has_the_pipeline_settings():
    settings = {"CEP_PARTITIONS": "8", "CEP_REPLICATION_FACTOR": "3", "CEP_COORDINATORS": "2",
                "CEP_STREAM": "orders"}
    services = cep_services(compose(settings))
    assert set(services) >= {"queries", "splitter", "worker", "coordinator", "coordinator-1",
                             "api"}
    for name, service in services.items():
        env = effective_env(service)
        for variable in PIPELINE_ENV:
            assert env.get(variable), f"{name} has no {variable}"
        assert {k: env[k] for k in settings} == settings, name
        assert env["KAFKA_BOOTSTRAP"] == "kafka:9092", name
    assert effective_env(services["api"])["CEP_API_TOKEN"] == "test-token"
    defaults = cep_services(compose())
    assert {effective_env(s)["CEP_PARTITIONS"] for s in defaults.values()} == {"4"}


def _stream_queries_run() -> list[str]:
    """The arguments the Dockerfile gives docker/stream_queries.py (OUT_DIR first), once
    the folder of the image's CEP_SCHEMA_PATH exists (`cep check` refuses a missing one)."""
    schemas = image_env()["CEP_SCHEMA_PATH"]
    made = False
    for op, args in dockerfile_final_stage():
        for step in args.split("&&") if op == "RUN" else ():
            made = made or (step.split()[:2] == ["mkdir", "-p"] and schemas in step.split())
            if "stream_queries.py" not in step:
                continue
            assert made, f"{schemas} is made after stream_queries.py runs"
            words = shlex.split(step)
            return words[words.index(next(w for w in words if w.endswith("stream_queries.py")))
                         + 1:]
    raise AssertionError("the Dockerfile does not run docker/stream_queries.py")


def test_queries_service_registers_the_queries_of_cep_stream(tmp_path):
    out_dir, *args = _stream_queries_run()
    assert out_dir == "/app/queries"
    expanded = []
    for arg in args:  # the shell's globs, relative to WORKDIR /app (the repository here)
        expanded += sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(arg)) \
            if "*" in arg else [arg]
    (tmp_path / "schemas").mkdir()  # the image's CEP_SCHEMA_PATH: an empty folder
    made = subprocess.run([sys.executable, str(ROOT / "docker" / "stream_queries.py"),
                           str(tmp_path / "queries"), *expanded], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "CEP_SCHEMA_PATH": str(tmp_path / "schemas")})
    assert made.returncode == 0, made.stderr
    files = {line.split()[0]: line.split()[1:] for line in made.stdout.splitlines()}
    assert files["trades"] == ["examples/finance.cep", "examples/recognize.cep"]
    assert files["orders"] == ["examples/own_stream/orders.cep"]
    assert set(files) >= {"rfid", "sensors", "stocks", "ticks", "bids"}
    written = sorted(str(p) for p in (tmp_path / "queries").glob("*.cep"))
    checked = subprocess.run(
        [sys.executable, "-m", "cep_service.cli.main", "check", "--json", "--schema",
         "examples/own_stream/schemas", *written],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    streams = {Path(r["file"]).stem: {q["stream"] for q in r["queries"]}
               for r in map(json.loads, checked.stdout.splitlines())}
    assert streams == {stream: {stream} for stream in files}  # each file: its stream only
    for stream in files:
        command = cep_services(compose({"CEP_STREAM": stream}))["queries"]["command"]
        assert command[:2] == ["query", "add"]
        assert command[2] == f"{out_dir}/{stream}.cep", command
    assert cep_services(compose())["queries"]["command"][2] == f"{out_dir}/trades.cep"
    mine = "/etc/cep/schemas/my.cep"  # CEP_QUERIES: another file in the container
    assert cep_services(compose({"CEP_QUERIES": mine}))["queries"]["command"][2] == mine


def test_kernel_cache_volume_where_cep_kernel_cache_points_in_every_service():
    config = compose()
    sources = set()
    for name, service in cep_services(config).items():
        cache = effective_env(service)["CEP_KERNEL_CACHE"]
        mounts = {}
        for volume in service.get("volumes", []):
            if isinstance(volume, dict):
                mounts[volume["target"]] = volume.get("source")
            else:
                source, target = volume.split(":")[:2]
                mounts[target] = source
        assert cache in mounts, f"{name} does not mount the kernel cache at {cache}"
        sources.add(mounts[cache])
    assert len(sources) == 1, sources  # one cache, shared
    volume = sources.pop()
    assert "/" not in volume and volume in config["volumes"]  # a named volume
    assert image_env()["CEP_KERNEL_CACHE"] == "/var/cache/cep/kernels"


def _compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        found = subprocess.run(["docker", "compose", "version"], capture_output=True,
                               timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return found.returncode == 0


if _compose_available():

    def test_compose_file_as_docker_reads_it():
        refused = subprocess.run(["docker", "compose", "config"], cwd=ROOT,
                                 capture_output=True, text=True, timeout=60,
                                 env={k: v for k, v in os.environ.items()
                                      if k != "CEP_API_TOKEN"})
        assert refused.returncode != 0 and "CEP_API_TOKEN" in refused.stderr
        result = subprocess.run(["docker", "compose", "config", "--format", "json"],
                                cwd=ROOT, capture_output=True, text=True, timeout=60,
                                env={**os.environ, "CEP_API_TOKEN": "test-token"})
        assert result.returncode == 0, result.stderr
        config = json.loads(result.stdout)
        services = config["services"]
        for name in ("splitter", "worker", "coordinator"):
            assert "/readyz" in " ".join(services[name]["healthcheck"]["test"]), name
            targets = [v["target"] for v in services[name]["volumes"]]
            assert "/etc/cep/schemas" in targets, name
        kafka_volumes = services["kafka"]["volumes"]
        assert [v["source"] for v in kafka_volumes if v["type"] == "volume"] == ["kafka-data"]
        assert "kafka-data" in config["volumes"]


def test_the_image_builds_its_wheel_from_everything_the_build_reads():
    """The wheel stage copies the build's own files (pyproject.toml, setup.py, which maps the
    folders to the installed names) and every folder setup.py packages."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    copied = {source for line in text.splitlines() if line.startswith("COPY ")
              and "--from" not in line for source in line.split()[1:-1]}
    folders = re.search(r"FOLDERS = (\{.*?\})", (ROOT / "setup.py").read_text(), re.S).group(1)
    assert {"pyproject.toml", "setup.py", "README.md"} <= copied
    assert set(ast.literal_eval(folders).values()) <= copied
