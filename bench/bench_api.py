"""Speed through the Python API against `cep run`, on the same data, in one run.

Generates 1M finance1 events (`cep gen finance1 --format jsonl` and `--format parquet`),
then for each format times, best of `--repeat`, each in a fresh process (Python start,
imports and kernel loads included; a first untimed run of each warms numba's cache):
`cep run FILE --engine jit -o /dev/null`, and a Python script doing the same through the
API (`cep.compile(text).run(path)`, composites written as JSON lines to /dev/null). Then,
in this process and warm: `QuerySet.run` over the file and over a pandas DataFrame of it.
Prints events/s of each and the API/`cep run` ratio (above 1: the API is faster).
Run: `.venv/bin/python bench/bench_api.py [--events 1000000] [--repeat 3] [--dir DIR]`.

`--http`: the HTTP API (`cep serve api`, a process of its own on the embedded broker, with
`--queries` live queries queued on its control topic) under load instead: `--clients`
concurrent clients each making `--requests` mixed requests (the query list with states,
one query, the streams, a query check, /healthz), latencies per kind (p50, p99, max) and
the 429s; then `--tails` tails that never read their socket, and the server's threads,
open files and resident memory before and after them, and the query list's latency while
they are open. Run: `.venv/bin/python bench/bench_api.py --http [--clients 200]
[--requests 20] [--tails 500] [--queries 10]` (docs/api.md, "Under load").
"""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
import pyarrow.parquet as pq
from bench_run import generate, generated_files_parser  # bench/ is on the path when this runs

import cep_core as cep
from cep_core.event_io import EventFormat
from cep_service.stream.broker import EmbeddedBroker, free_port, wait_for_port
from cep_service.stream.kafka import KafkaSettings, ensure_topics

ROOT = Path(__file__).resolve().parent.parent
CEP = Path(sys.executable).with_name("cep")
API_SCRIPT = """
import sys
from pathlib import Path
import cep_core as cep
result = cep.compile(Path(sys.argv[1]).read_text()).run(sys.argv[2])
result.composites.write("/dev/null")
"""


def timed(command: list) -> float:
    started = time.perf_counter()
    subprocess.run([str(c) for c in command], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def cep_command(*args) -> list:
    return ([str(CEP)] if CEP.exists() else [sys.executable, "-m", "cep_service.cli.main"]) + \
        list(args)


def main() -> None:
    parser = generated_files_parser(__doc__)
    parser.add_argument("--http", action="store_true", help="bench `cep serve api` instead")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--requests", type=int, default=20, help="per client")
    parser.add_argument("--tails", type=int, default=500)
    parser.add_argument("--queries", type=int, default=10)
    parser.add_argument("--profile", type=Path, default=None,
                        help="--http: the server's cProfile statistics to this file")
    args = parser.parse_args()
    if args.http:
        http_main(args)
        return
    directory = args.dir or Path(tempfile.gettempdir()) / f"bench_api_{args.events}"
    directory.mkdir(parents=True, exist_ok=True)
    files = generate(directory, args.events, csv=False)  # bench_run's files and events
    query = directory / "finance1.cep"
    queries = cep.compile(query.read_text())
    n = args.events
    print(f"{n:,} finance1 events, best of {args.repeat}; busy machines give noisy numbers")
    print(f"{'format':8} {'what':40} {'seconds':>8} {'events/s':>12}")
    for fmt, path in files.items():
        run = cep_command("run", query, "--events", path, "--engine", "jit", "-o", "/dev/null")
        api = [sys.executable, "-c", API_SCRIPT, query, path]
        timed(run), timed(api)  # warm numba's kernel cache and the OS's file cache
        cli_s = min(timed(run) for _ in range(args.repeat))
        api_s = min(timed(api) for _ in range(args.repeat))
        warm_s = min(_in_process(queries, path) for _ in range(args.repeat))
        rows = [("cep run --engine jit (process)", cli_s),
                ("cep.compile(..).run(path) (process)", api_s),
                ("QuerySet.run(path) (in process, warm)", warm_s)]
        if fmt is EventFormat.PARQUET:
            frame = pq.read_table(path).to_pandas()
            rows.append(("QuerySet.run(DataFrame) (in process)",
                         min(_in_process(queries, frame) for _ in range(args.repeat))))
        for what, seconds in rows:
            print(f"{fmt:8} {what:40} {seconds:8.3f} {n / seconds:12,.0f}")
        print(f"{fmt:8} {'API / cep run (processes, events/s)':40} {cli_s / api_s:8.2f}x")


def _in_process(queries, data) -> float:
    started = time.perf_counter()
    queries.run(data).composites.write("/dev/null")
    return time.perf_counter() - started


# ---------------------------------------------------------------- --http

UPS = """QUERY {name} FROM trades INTO {output} PARTITION BY symbol
PATTERN ( . up up ) DEFINE up AS price > Last(price)
EMIT symbol = symbol, n = Count();"""


def server_usage(pid: int) -> dict:
    """Threads, open files and resident memory (MiB) of a process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    ticks = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return {"threads": int(fields["Threads"]), "files": len(os.listdir(f"/proc/{pid}/fd")),
            "rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
            "cpu_s": round((int(ticks[11]) + int(ticks[12])) / os.sysconf("SC_CLK_TCK"), 2)}


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    if not ordered:
        return "-"

    def at(q):
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000
    return f"p50 {at(0.5):7.1f} ms  p99 {at(0.99):7.1f} ms  max {ordered[-1] * 1000:7.1f} ms"


def http_main(args) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the client's sockets
    run = uuid.uuid4().hex[:8]
    prefix = f"bench{run}"
    with EmbeddedBroker() as broker:
        settings = KafkaSettings(broker.bootstrap)
        outputs = [f"bench_ups_{run}_{i}" for i in range(args.queries)]
        ensure_topics(settings, {o: 2 for o in outputs})
        port = free_port()
        profile = ["-m", "cProfile", "-o", str(args.profile)] if args.profile else []
        server = subprocess.Popen(
            [sys.executable, *profile, "-m", "cep_service.cli.main", "serve", "api",
             "--bootstrap",
             broker.bootstrap, "--topic-prefix", prefix, "--api-port", str(port)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if k != "CEP_API_TOKEN"})
        try:
            wait_for_port("127.0.0.1", port, 120)
            url = f"http://127.0.0.1:{port}"
            asyncio.run(_http_bench(args, url, server.pid, outputs))
        finally:
            server.terminate()
            server.wait(60)


async def _http_bench(args, url: str, pid: int, outputs: list[str]) -> None:
    json = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for i, output in enumerate(outputs):  # queued: no pipeline is up
            async with session.post(f"{url}/api/queries", headers=json, json={
                    "text": UPS.format(name=f"ups{i}", output=output), "wait": False}) as r:
                assert r.status == 202, await r.text()
        async with session.get(f"{url}/api/queries") as r:  # warm: consumers made
            assert len((await r.json())["queries"]) == len(outputs)
        print(f"`cep serve api` on the embedded broker, {len(outputs)} live queries")
        before = server_usage(pid)
        kinds = [("GET /api/queries", "GET", "/api/queries", None),
                 ("GET /api/queries/{name}", "GET", "/api/queries/ups0", None),
                 ("GET /api/streams", "GET", "/api/streams", None),
                 ("POST /api/queries/validate", "POST", "/api/queries/validate",
                  {"text": UPS.format(name="x", output="x")}),
                 ("GET /healthz", "GET", "/healthz", None)]
        times: dict[str, list[float]] = {k[0]: [] for k in kinds}
        statuses: dict[int, int] = {}

        async def client(n: int, requests: int = args.requests) -> None:
            for i in range(requests):
                label, method, path, body = kinds[(n + i) % len(kinds)]
                started = time.perf_counter()
                async with session.request(method, url + path, json=body,
                                           headers=json if body else None) as r:
                    await r.read()
                times[label].append(time.perf_counter() - started)
                statuses[r.status] = statuses.get(r.status, 0) + 1

        # the tester's shape first: one mixed request from each client, all at once
        await asyncio.gather(*(client(n, 1) for n in range(args.clients)))
        burst = [t for values in times.values() for t in values]
        print(f"{args.clients} mixed requests at once: {percentiles(burst)}; statuses "
              f"{dict(sorted(statuses.items()))}")
        times = {k[0]: [] for k in kinds}
        statuses.clear()
        before = server_usage(pid)
        started = time.perf_counter()
        await asyncio.gather(*(client(n) for n in range(args.clients)))
        wall = time.perf_counter() - started
        total = sum(statuses.values())
        after_load = server_usage(pid)
        print(f"{args.clients} clients x {args.requests} mixed requests, each client's "
              f"one after another: {total} requests in {wall:.1f} s ({total / wall:,.0f}/s); "
              f"statuses {dict(sorted(statuses.items()))}; the server's CPU "
              f"{(after_load['cpu_s'] - before['cpu_s']) / total * 1000:.2f} ms a request")
        reads = [t for label, values in times.items() if label.startswith("GET /api")
                 for t in values]
        for label, values in times.items():
            print(f"  {label:28} {percentiles(values)}")
        print(f"  {'reads of /api together':28} {percentiles(reads)}")

        # idle tails: each reads the head of its stream, then never reads again
        readers, port = [], int(url.rsplit(":", 1)[1])
        for i in range(args.tails):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET /api/queries/ups{i % len(outputs)}/tail HTTP/1.1\r\n"
                         "Host: 127.0.0.1\r\n\r\n".encode())
            readers.append((reader, writer))
        for reader, _ in readers:
            await reader.readuntil(b": tail of ")
        with_tails = server_usage(pid)
        started = time.perf_counter()
        async with session.get(f"{url}/api/queries") as r:
            await r.read()
            listed = (r.status, time.perf_counter() - started)
        print(f"server before the load {before}, after it {after_load}")
        print(f"with {args.tails} idle tails open: {with_tails} (threads "
              f"{with_tails['threads'] - after_load['threads']:+d}, files "
              f"{with_tails['files'] - after_load['files']:+d}, memory "
              f"{with_tails['rss_mib'] - after_load['rss_mib']:+.1f} MiB); GET /api/queries "
              f"meanwhile: {listed[0]} in {listed[1] * 1000:.1f} ms")
        for _, writer in readers:
            writer.close()


if __name__ == "__main__":
    main()
