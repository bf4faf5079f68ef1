"""Typer commands of the streaming service: `cep serve`, `cep demo`, `cep bench e2e`,
`cep bench cores` (and, from services/cli/live.py, `cep query` and `cep stream`).
Registered on the main app by services/cli/main.py.

Every option also reads an environment variable (CEP_STREAM, CEP_PARTITIONS, ...;
KAFKA_BOOTSTRAP for the broker); extra librdkafka settings come from CEP_KAFKA_* variables
or `--kafka-config`.
"""


# Deferred imports: the services (Kafka, Faust, aiohttp, the engines, logging.config), the API
# and the benchmarks load when their command runs: the CLI registers these commands for every
# `cep` invocation.

import dataclasses
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from cep_service.cli.common import (
    Bootstrap,
    CliErrorType,
    Control,
    Guard,
    KafkaConfig,
    Partitions,
    SchemaPaths,
    Source,
    Stream,
    TopicPrefix,
    export_schema_paths,
    kafka_settings,
)

if TYPE_CHECKING:
    from cep_service.stream.kafka import KafkaSettings, Topics

Coordinators = Annotated[int, typer.Option(
    envvar="CEP_COORDINATORS", min=1, help="Coordinator shards (docs/scaling.md); every "
    "role must be given the same count.")]


class Role(StrEnum):
    chained = "chained"
    splitter = "splitter"
    worker = "worker"
    coordinator = "coordinator"
    api = "api"
    all = "all"


# The options every process of `cep serve all` is given as they were given to it (the
# broker, the source and control topics are given as resolved); the API's go to the API.
PASSED_DOWN = ("stream", "partitions", "pulse_ms", "linger_ms", "topic_prefix", "web_port",
               "allowed_lateness_ms", "idle_timeout_ms", "replication_factor",
               "coordinators", "kafka_config", "max_ahead", "max_ahead_of_clock", "idleness")


@dataclass(frozen=True)
class ServeOptions:
    """`cep serve`'s options (each field is the option `--field-name`), and the command
    lines of the processes `cep serve all` starts, built from them."""

    bootstrap: str
    stream: str
    partitions: int
    distributed: bool
    workers: int
    coordinators: int
    shard: int
    pulse_ms: int
    linger_ms: float
    source: str
    control: str
    topic_prefix: str
    kafka_config: Path | None
    allowed_lateness_ms: int
    idle_timeout_ms: int
    max_ahead: str | None
    max_ahead_of_clock: str | None
    idleness: str | None
    metrics_port: int
    web_port: int
    replication_factor: int
    schema: list[Path] | None
    api_port: int
    api_host: str | None
    api_metrics: list[str] | None
    api_allowed_host: list[str] | None
    api_cors_origin: list[str] | None
    api_require_token: bool

    def child_argv(self, bootstrap: str, topics: "Topics") -> list[str]:
        """What every process of `cep serve all` is given (`topics`: the resolved names)."""
        argv = ["--bootstrap", bootstrap, "--source", topics.source,
                "--control", topics.control]
        for name in PASSED_DOWN:
            value = getattr(self, name)
            if value is not None:
                argv += ["--" + name.replace("_", "-"), str(value)]
        return argv

    def api_argv(self, metrics_urls: list[str]) -> list[str]:
        """The API's own options, reading the other processes' metrics at `metrics_urls`."""
        return ["--api-port", str(self.api_port)] + \
            [f"--api-metrics={url}" for url in metrics_urls] + \
            (["--api-host", self.api_host] if self.api_host else []) + \
            [f"--api-allowed-host={h}" for h in self.api_allowed_host or []] + \
            [f"--api-cors-origin={o}" for o in self.api_cors_origin or []] + \
            (["--api-require-token"] if self.api_require_token else [])

    def plan(self, bootstrap: str, topics: "Topics") -> list[tuple[str, list[str]]]:
        """The processes of `cep serve all` (role, command-line options): the chained
        pipeline, or with `distributed` one per role; each with the next metrics port, and
        the API with `api_port`."""
        common = self.child_argv(bootstrap, topics)
        roles: list[tuple[str, list[str]]] = \
            [("splitter", [])] + [("worker", [])] * self.workers + \
            [("coordinator", ["--shard", str(k)]) for k in range(self.coordinators)] \
            if self.distributed else [("chained", [])]
        plan = [(role, common + (["--metrics-port", str(self.metrics_port + i)]
                                 if self.metrics_port else []) + extra)
                for i, (role, extra) in enumerate(roles)]
        if self.api_port:  # the API reads the others' metrics
            urls = [f"http://127.0.0.1:{self.metrics_port + i}/metrics"
                    for i in range(len(roles))] if self.metrics_port else []
            plan.append(("api", common + self.api_argv(urls)))
        return plan


def _serve(role: Role, options: ServeOptions, cli_error: CliErrorType) -> None:
    """Run a role of the streaming pipeline (`all`: start the processes of each)."""
    from cep_service.stream.kafka import Topics
    from cep_service.stream.pipeline import create_topics
    from cep_service.stream.serve import configure_logging, run_all, stop_flag

    o = options
    export_schema_paths(o.schema, cli_error)
    settings = kafka_settings(o.bootstrap, o.kafka_config)
    settings.replication_factor = o.replication_factor
    topics = Topics(o.stream, o.source, o.control, o.topic_prefix, o.coordinators)
    if o.shard >= o.coordinators:
        raise cli_error(f"--shard {o.shard}: not below --coordinators {o.coordinators}", 2)
    if role is Role.all and not o.distributed and o.workers > 1:
        print(f"note: --workers {o.workers} applies to --distributed; the chained "
              "pipeline runs every keyed partition in one process", file=sys.stderr)
    if role is Role.all:  # the children inherit CEP_SCHEMA_PATH
        stopping = stop_flag()
        create_topics(settings, topics, o.partitions)
        raise typer.Exit(run_all(o.plan(settings.bootstrap, topics), stopping))
    configure_logging(role.value)
    if role is Role.api:
        _serve_api(settings, topics, o.api_host, o.api_port or 8080, o.api_metrics,
                   cli_error, o.api_allowed_host or [], o.api_cors_origin or [],
                   o.api_require_token)
        return
    _run_role(role, o, settings, topics)


def _run_role(role: Role, o: ServeOptions, settings: "KafkaSettings",
              topics: "Topics") -> None:
    """One process of the pipeline: chained, splitter, worker or coordinator."""
    from cep_service.stream.metrics import Metrics
    from cep_service.stream.pipeline import create_topics
    from cep_service.stream.serve import stop_flag

    metrics = Metrics(role.value, o.metrics_port)
    if role in (Role.splitter, Role.chained):  # a Faust app: it handles signals
        from cep_core.home import state_dir
        from cep_service.stream.chained import Chained
        from cep_service.stream.splitter import Splitter
        from cep_service.stream.splitter_app import serve_splitter
        datadir = state_dir("faust")  # first: a folder that cannot be made fails fast
        create_topics(settings, topics, o.partitions)
        options: dict[str, Any] = dict(metrics=metrics, linger_ms=o.linger_ms,
                                       allowed_lateness_ms=o.allowed_lateness_ms,
                                       max_ahead=o.max_ahead,
                                       max_ahead_of_clock=o.max_ahead_of_clock,
                                       idleness=o.idleness)
        splitter = Splitter(settings, topics, o.partitions, o.pulse_ms, **options) \
            if role is Role.splitter else \
            Chained(settings, topics, o.partitions, o.pulse_ms,
                    idle_timeout_ms=o.idle_timeout_ms or None, **options)
        raise typer.Exit(serve_splitter(splitter, o.web_port, datadir))
    stopping = stop_flag()
    if role is Role.worker:
        from cep_service.stream.worker import Worker
        Worker(settings, topics, metrics=metrics,
               idle_timeout_ms=o.idle_timeout_ms or None).run(stopping)
    else:
        from cep_service.stream.coordinator import Coordinator
        Coordinator(settings, topics, o.partitions, metrics=metrics,
                    shard=o.shard).run(stopping)


def register(app: typer.Typer, bench_app: typer.Typer, guard: Guard,
             cli_error: CliErrorType) -> None:
    """Add the service commands to the `cep` app (guard: cli's error handling); `cep query`
    and `cep stream` come from services/cli/live.py."""
    from cep_service.cli import live as live_cli

    live_cli.register(app, guard, cli_error)
    _register_serve(app, guard, cli_error)
    _register_demo(app, guard, cli_error)
    _register_benches(bench_app, guard, cli_error)


# Deliberately like services/cli/live.py register: each command module registers its typer
# commands
def _register_serve(app: typer.Typer, guard: Guard, cli_error: CliErrorType) -> None:
    @app.command()
    def serve(
        role: Annotated[Role, typer.Argument(help="chained (splitter, workers and "
                                             "coordinator in one process, Kafka only at "
                                             "the edges), splitter, worker, coordinator, "
                                             "api (HTTP API and web console), or all "
                                             "(chained, or with --distributed one process "
                                             "per role; the API with --api-port).")],
        bootstrap: Bootstrap = "127.0.0.1:9092",
        stream: Stream = "trades",
        partitions: Partitions = 4,
        distributed: Annotated[bool, typer.Option(
            "--distributed", envvar="CEP_DISTRIBUTED", help="all: one process per role, "
            "talking through the broker's internal topics (for roles spread over several "
            "machines; default: the chained pipeline, docs/scaling.md).")] = False,
        workers: Annotated[int, typer.Option(envvar="CEP_WORKERS", min=1,
                                             help="all --distributed: how many worker "
                                             "processes.")] = 1,
        coordinators: Coordinators = 1,
        shard: Annotated[int, typer.Option(
            envvar="CEP_COORDINATOR_SHARD", min=0, help="coordinator: which shard this "
            "process is, 0 to --coordinators - 1 (all: one process per shard).")] = 0,
        pulse_ms: Annotated[int, typer.Option(envvar="CEP_PULSE_MS", min=1,
                                              help="Pulse cadence of the splitter.")] = 100,
        linger_ms: Annotated[float, typer.Option(envvar="CEP_LINGER_MS", min=0, help=
                                                 "splitter: after a batch's first record, "
                                                 "wait this long for more.")] = 5,
        source: Source = "",
        control: Control = "",
        topic_prefix: TopicPrefix = "",
        kafka_config: KafkaConfig = None,
        allowed_lateness_ms: Annotated[int, typer.Option(
            envvar="CEP_ALLOWED_LATENESS_MS", min=0, help="splitter: reorder events within "
            "this lateness per source partition; later ones go to cep.<stream>.late (0: no "
            "reordering; engines dead-letter time going backwards).")] = 0,
        idle_timeout_ms: Annotated[int, typer.Option(
            envvar="CEP_IDLE_TIMEOUT_MS", min=0, help="worker: evict the state of keys idle "
            "this long in event time (at least each query's window; 0: never).")] = 3_600_000,
        max_ahead: Annotated[str | None, typer.Option(
            "--max-ahead", envvar="CEP_MAX_AHEAD", metavar="DURATION", help="splitter: an "
            "event more than this after the stream's time is a dead letter, too far ahead "
            "(a duration, an integer in the stream's time unit, or none; default: the "
            "schema's max_ahead, else 366 days; docs/semantics.md).")] = None,
        max_ahead_of_clock: Annotated[str | None, typer.Option(
            "--max-ahead-of-clock", envvar="CEP_MAX_AHEAD_OF_CLOCK", metavar="DURATION",
            help="splitter: the same bound against the wall clock (default: the schema's "
            "max_ahead_of_clock, else none).")] = None,
        idleness: Annotated[str | None, typer.Option(
            "--idleness", envvar="CEP_IDLENESS", metavar="DURATION", help="splitter: after "
            "this long by the wall clock without events, each pulse advances the stream's "
            "time by the wall clock, releasing the windows and sequences that wait for "
            "later events; output then depends on arrival times (default: the schema's "
            "idleness, else never; docs/semantics.md).")] = None,
        metrics_port: Annotated[int, typer.Option(envvar="CEP_METRICS_PORT", help=
                                                  "Prometheus metrics port (0: off; all: "
                                                  "each process gets the next port).")] = 0,
        web_port: Annotated[int, typer.Option(envvar="CEP_WEB_PORT", help="splitter: port "
                                              "of the Faust web server (GET /status/).")]
        = 6066,
        replication_factor: Annotated[int, typer.Option(
            envvar="CEP_REPLICATION_FACTOR", min=1, help="Replication factor of the topics "
            "the services create (internal topics, INTO topics).")] = 1,
        schema: SchemaPaths = None,
        api_port: Annotated[int, typer.Option(envvar="CEP_API_PORT", min=0, help="api: its "
                                              "port (default 8080); all: also run the API "
                                              "on this port (0: not).")] = 0,
        api_host: Annotated[str | None, typer.Option(
            envvar="CEP_API_HOST", metavar="ADDR", help="api: the address to listen on "
            "(default 0.0.0.0 with CEP_API_TOKEN set, else 127.0.0.1, the only one allowed "
            "without a token).")] = None,
        api_metrics: Annotated[list[str] | None, typer.Option(
            "--api-metrics", metavar="URL", help="api: a service's Prometheus endpoint to "
            "read per-query partial matches from (repeatable).")] = None,
        api_allowed_host: Annotated[list[str] | None, typer.Option(
            "--api-allowed-host", envvar="CEP_API_ALLOWED_HOSTS", metavar="NAME",
            help="api: a Host name the API answers besides localhost, 127.0.0.1 and [::1], "
            "any port (repeatable; the variable: names apart by spaces; *: any; "
            "docs/api.md).")] = None,
        api_cors_origin: Annotated[list[str] | None, typer.Option(
            "--api-cors-origin", envvar="CEP_API_CORS_ORIGINS", metavar="ORIGIN",
            help="api: an origin (scheme://host[:port]) whose web pages may call the API "
            "and make changes: CORS (repeatable; the variable: origins apart by spaces; "
            "default: none).")] = None,
        api_require_token: Annotated[bool, typer.Option(
            "--api-require-token", envvar="CEP_API_REQUIRE_TOKEN", help="api: do not start "
            "without CEP_API_TOKEN, on loopback too.")] = False,
    ) -> None:
        """Run a service of the streaming pipeline until SIGTERM (finishes its batch,
        commits, exits 0)."""

        values = dict(locals())  # the options as given, by name (ServeOptions' fields)
        guard(lambda: _serve(role, ServeOptions(**{
            f.name: values[f.name] for f in dataclasses.fields(ServeOptions)}), cli_error))


def _register_demo(app: typer.Typer, guard: Guard, cli_error: CliErrorType) -> None:
    @app.command()
    def demo(
        count: Annotated[int, typer.Option("--count", "--events", "-n", min=1, metavar="N",
                                           help="How many trades (--events N: the old "
                                           "name).")] = 20000,
        distributed: Annotated[bool, typer.Option(
            "--distributed", help="One process per role (splitter, workers, coordinator) "
            "talking through the broker (default: the chained pipeline, one process).")] =
        False,
        workers: Annotated[int, typer.Option(min=1, help="--distributed: worker "
                                             "processes.")] = 2,
        coordinators: Annotated[int, typer.Option(min=1, help="Coordinator shards (its "
                                                  "two INTO topics go to different shards "
                                                  "with 2).")] = 1,
        verify: Annotated[bool, typer.Option("--verify", help="Non-interactive: compare "
                                             "with the reference interpreter; exit 1 if "
                                             "different.")] = False,
        rate: Annotated[float | None, typer.Option(
            min=0, help="Events/s to produce (0: as fast as possible; default: 0 with "
            "--verify, else 2000).")] = None,
        bootstrap: Annotated[str | None, typer.Option(
            "--bootstrap", envvar="KAFKA_BOOTSTRAP", metavar="HOST:PORT",
            help="A broker (default: start the embedded one).")] = None,
        api_port: Annotated[int, typer.Option(
            min=0, help="The API and web console on 127.0.0.1 at this port (a free one if "
            "taken; 0: none; default: 8080, none with --verify).")] = 8080,
        hold: Annotated[bool, typer.Option(
            "--hold", help="Keep the pipeline and the console up after the trades, until "
            "Ctrl-C.")] = False,
    ) -> None:
        """The streaming pipeline end to end on a synthetic trade stream."""

        def body() -> None:
            from rich.console import Console

            from cep_service.stream.demo import ServiceFailed, run_demo
            from cep_service.stream.serve import exit_on_signals

            exit_on_signals()  # SIGTERM/SIGHUP stop the services and broker, as Ctrl-C does
            chosen = rate if rate is not None else (0 if verify else 2000)
            try:
                ok = run_demo(count, workers, verify, bootstrap, chosen, Console(),
                              0 if verify else api_port, hold, coordinators, distributed)
            except ServiceFailed as e:
                raise cli_error(str(e)) from None
            if not ok:
                raise typer.Exit(1)

        guard(body)


def _register_benches(bench_app: typer.Typer, guard: Guard,
                      cli_error: CliErrorType) -> None:
    @bench_app.command("e2e")
    def e2e(
        count: Annotated[int, typer.Option("--count", "--events", "-n", min=1000, metavar="N",
                                           help="How many events (--events N: the old "
                                           "name).")] = 200_000,
        workers: Annotated[int, typer.Option(min=1, help="Worker processes (distributed).")]
        = 1,
        coordinators: Annotated[int, typer.Option(min=1, help="Coordinator shards.")] = 1,
        latency_s: Annotated[float, typer.Option(help="Seconds of the latency run.")] = 8,
        latency_rate: Annotated[float | None, typer.Option(
            min=0, help="Events/s of the latency run (default: half of events_per_s).")] =
        None,
        bootstrap: Annotated[str | None, typer.Option(
            "--bootstrap", envvar="KAFKA_BOOTSTRAP", metavar="HOST:PORT",
            help="A broker (default: start the embedded one).")] = None,
        mode: Annotated[list[str] | None, typer.Option(
            "--mode", metavar="MODE", help="chained or distributed (repeatable; default: "
            "both, side by side).")] = None,
        workload: Annotated[str, typer.Option(
            metavar="NAME", help="The events and queries: finance1 (trades, the M-shape "
            "query) or a realistic workload (iot, activity, clicks: its events as cep gen "
            "writes them, its MATCH, SEQ and WINDOW queries).")] = "finance1",
        as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
        record: Annotated[bool, typer.Option(
            "--record", help="Also write the table into docs/benchmarks.md (a checkout's; "
            "make bench does).")] = False,
    ) -> None:
        """Source topic to composite-event topic throughput and latency (M-shape, or a
        workload's queries), the chained and the distributed pipeline side by side."""

        def body() -> None:
            from cep_service.bench.e2e import MODES, record_result, run_bench
            from cep_core.workloads import WORKLOADS

            wrong = [m for m in mode or () if m not in MODES]
            if wrong:
                raise cli_error(f"--mode {wrong[0]}: not one of {', '.join(MODES)}", 2)
            if workload not in WORKLOADS:
                raise cli_error(f"--workload {workload}: not one of "
                                f"{', '.join(WORKLOADS)}", 2)
            result = run_bench(count, workers, bootstrap, latency_s, latency_rate or 0,
                               coordinators, tuple(mode or MODES), workload)
            print(orjson.dumps(result).decode() if as_json else result)
            if record:
                record_result(result, "cep bench e2e " + " ".join(sys.argv[3:]))

        guard(body)

    @bench_app.command("live")
    def live(
        queries: Annotated[int, typer.Option("--live", min=1, help="Query shapes live from "
                                             "the start.")] = 10,
        adds: Annotated[int, typer.Option(min=1, help="New shapes added one by one while "
                                          "the stream runs.")] = 10,
        rate: Annotated[float, typer.Option(min=1, help="Events/s of the stream.")] = 2000,
        quiet_s: Annotated[float, typer.Option(help="Seconds before and after the adds.")] =
        5,
        workers: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 1,
        bootstrap: Annotated[str | None, typer.Option(
            "--bootstrap", envvar="KAFKA_BOOTSTRAP", metavar="HOST:PORT",
            help="A broker (default: start the embedded one).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
    ) -> None:
        """Queries added to a running pipeline into an empty kernel cache: time from
        accepted to live, and the live queries' latency before and during the adds
        (CEP_WARM_KERNELS=0: without compiling off the data path)."""

        def body() -> None:
            from cep_service.bench.live import run_live_bench

            result = run_live_bench(queries, adds, rate, quiet_s, workers, bootstrap)
            print(orjson.dumps(result).decode() if as_json else result)

        guard(body)

    @bench_app.command("cores")
    def cores(
        count: Annotated[int, typer.Option("--count", "-n", min=20000, metavar="N",
                                           help="How many events.")] = 200_000,
        batch: Annotated[int, typer.Option(min=1, help="Messages per splitter step.")] =
        20_000,
        as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
        realistic: Annotated[bool, typer.Option(
            "--realistic", help="Instead: the splitter's JSON path on users' data (the iot, "
            "activity and clicks workloads) beside finance1, interleaved.")] = False,
    ) -> None:
        """Each service's core alone, fed from memory (no broker): splitter events/s (JSON
        and framed), worker events/s, coordinator composites/s (M-shape)."""

        def body() -> None:
            from cep_service.bench.cores import run_bench, run_realistic

            result = run_realistic(count, batch) if realistic else run_bench(count, batch)
            print(orjson.dumps(result).decode() if as_json else result)

        guard(body)


def _serve_api(settings: "KafkaSettings", topics: "Topics", host: str | None, port: int,
               metrics_urls: list[str] | None, cli_error: CliErrorType,
               allowed_hosts: Sequence[str] = (), cors_origins: Sequence[str] = (),
               require_token: bool = False) -> None:
    from cep_service.api.app import TOKEN_ENV, ApiConfig, bind_host, serve_api

    token = os.environ.get(TOKEN_ENV) or None
    try:
        bind_host(host, token, require_token)
        config = ApiConfig(settings, topics.prefix, topics.control, token,
                           metrics_urls=metrics_urls or [], allowed_hosts=allowed_hosts,
                           cors_origins=cors_origins, require_token=require_token)
    except ValueError as e:
        raise cli_error(str(e), 2) from None
    serve_api(config, host, port)
