"""Soak run: the streaming pipeline at a steady rate for minutes; is memory flat?

Starts the embedded broker (or uses the one `--bootstrap` names) and `cep serve
splitter|worker|coordinator` as separate processes (one topic prefix per run), registers a
MATCH query (M-shape, PARTITION BY symbol) and a WINDOW query (examples/finance.cep), then
produces trades at `--rate` events/s for `--minutes`. The symbols slide: `--active-keys`
symbols are live at a time and the window of live symbols moves by one every `--key-stride`
events, so keys keep going idle and the workers' idle-key eviction (`--idle-timeout-ms`,
event time; 1 ms of event time per event) is what keeps their state bounded
(`--key-universe N`: symbol numbers wrap around modulo N, so evicted keys come back and the
set of keys ever seen stays bounded). A thread consumes the output topics so nothing backs up.
Every `--interval` seconds the RSS (VmRSS from /proc/PID/status) of each service process and
of the broker is sampled; the samples go to a CSV and a PNG, and a summary is printed: first,
peak and last RSS, the slope of a linear fit over the second half (MiB/min) and the growth
that fit gives over the second half (percent of its mean). The broker's memory engine keeps
every record, so its RSS grows by design; only the services must stay flat.

    .venv/bin/python bench/soak.py --minutes 10 --rate 10000 --key-universe 60000

The CPU seconds of each process are sampled too (the summary gives each one's share of a
core over the run and over its last minute). On the embedded broker the clients use the
settings chosen for tansu (services/stream/kafka.py; docs/reliability.md, "Soak");
`--bootstrap HOST:PORT` for an Apache Kafka.
"""

from __future__ import annotations

# Deferred imports: matplotlib (the `fpga` extra, may be missing) loads only when a chart is drawn.

import argparse
import csv
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.request import urlopen

import numpy as np
import orjson
import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cep_service.stream.broker import EmbeddedBroker, free_port  # noqa: E402
from cep_service.stream.control import ControlMessage, publish, split_query_file  # noqa: E402
from cep_service.stream.frames import encode_table  # noqa: E402
from cep_service.stream.kafka import KafkaSettings, Topics, produce, read_all  # noqa: E402
from cep_service.stream.pipeline import create_topics  # noqa: E402
from cep_service.stream.status import StatusEvent  # noqa: E402

QUERIES = ROOT / "examples" / "finance.cep"
ROLES = ("splitter", "worker", "coordinator")
WINDOW_SYMBOLS = ("GOOG", "AAPL", "YHOO")  # the WINDOW query's symbols
TICK_S = 0.01


def rss_mib(pid: int) -> float | None:
    """VmRSS of a process in MiB (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port: int, names: tuple[str, ...]) -> dict[str, float]:
    """Values of unlabelled Prometheus samples from a service's metrics endpoint."""
    out = {}
    try:
        with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            for line in response.read().decode().splitlines():
                name, _, value = line.partition(" ")
                if name in names:
                    out[name] = float(value)
    except OSError:
        pass
    return out


class Services:
    """The three roles as `cep serve ROLE` processes, each in its own session."""

    def __init__(self, settings: KafkaSettings, topics: Topics, idle_timeout_ms: int,
                 checkpoint_ms: int, logs: Path):
        self.processes: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        for role in ROLES:
            self.ports[role] = free_port()
            env = {**os.environ, "KAFKA_BOOTSTRAP": settings.bootstrap, "CEP_ROLE": role,
                   "CEP_SESSION_TIMEOUT_MS": "2000", "CEP_TOPIC_PREFIX": topics.prefix,
                   "CEP_SOURCE_TOPIC": topics.source, "CEP_CONTROL_TOPIC": topics.control,
                   "CEP_STREAM": topics.stream, "CEP_IDLE_TIMEOUT_MS": str(idle_timeout_ms),
                   "CEP_METRICS_PORT": str(self.ports[role]),
                   "CEP_CHECKPOINT_MS": str(checkpoint_ms),
                   "CEP_CHECKPOINT_BATCHES": str(10**9),
                   "CEP_WEB_PORT": str(free_port())}
            with open(logs / f"{role}.log", "ab") as log:
                self.processes[role] = subprocess.Popen(
                    [sys.executable, "-m", "cep_service.cli.main", "serve", role], env=env,
                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def check_alive(self) -> None:
        for role, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"{role} exited with code {process.returncode}")

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM in pipeline order; SIGKILL the group of any that does not exit."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


class OutputCounter(threading.Thread):
    """Reads the INTO topics from the start and counts their records."""

    def __init__(self, settings: KafkaSettings, outputs: list[str]):
        super().__init__(daemon=True, name="outputs")
        self.consumer = settings.consumer()
        self.consumer.assign([TopicPartition(t, 0, OFFSET_BEGINNING) for t in outputs])
        self.counts = dict.fromkeys(outputs, 0)
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                for message in self.consumer.consume(10000, 0.2):
                    if not message.error():
                        self.counts[message.topic()] += 1
        finally:
            self.consumer.close()


class Load:
    """Trades at a steady rate: event i has ts = start + i ms and a symbol from the sliding
    window of live symbols; a share of the events are the WINDOW query's symbols."""

    def __init__(self, active_keys: int, key_stride: int, key_universe: int = 0,
                 seed: int = 1):
        self.active_keys, self.key_stride = active_keys, key_stride
        self.key_universe = key_universe
        self.rng = np.random.default_rng(seed)
        self.sent = 0
        self.ts0 = 1_704_067_200_000

    def table(self, n: int) -> pa.Table:
        i = np.arange(self.sent, self.sent + n)
        keys = i // self.key_stride + self.rng.integers(0, self.active_keys, n)
        if self.key_universe:
            keys %= self.key_universe
        symbols = np.char.add("S", keys.astype(str)).astype(object)
        windowed = self.rng.random(n) < 0.02
        symbols[windowed] = np.array(WINDOW_SYMBOLS, dtype=object)[keys[windowed] % 3]
        self.sent += n
        return pa.table({"symbol": pa.array(symbols, pa.string()),
                         "price": 10_000 + self.rng.integers(-300, 301, n),
                         "volume": self.rng.integers(1, 500, n),
                         "ts": self.ts0 + i, "seqNum": i})

    def send(self, producer, topic: str, n: int, framed: bool) -> None:
        """n events: one Arrow frame (header kind=events), or one JSON per message."""
        table = self.table(n)
        if framed:
            produce(producer, topic, encode_table(table), headers=[("kind", b"events")])
            return
        for row in table.to_pylist():
            produce(producer, topic, orjson.dumps(row))


def register_queries(settings: KafkaSettings, topics: Topics, run: str) -> list[str]:
    outputs = []
    texts = []
    for name, text in split_query_file(QUERIES.read_text()):
        for output in ("double_tops", "trade_stats"):
            if f"INTO {output}" in text:
                text = text.replace(f"INTO {output}", f"INTO {output}_{run}")
                outputs.append(f"{output}_{run}")
        texts.append((name, text))
    create_topics(settings, topics, 4, outputs)
    for name, text in texts:
        publish(settings, topics.control, ControlMessage("add", name, text))
    return outputs


def wait_live(settings: KafkaSettings, topics: Topics, timeout_s: float) -> None:
    """Until the coordinator reports the registered queries live on every partition."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(orjson.loads(m.value()).get("event") == StatusEvent.QUERY_LIVE
               for m in read_all(settings, topics.status, idle_s=0.1)):
            return
        time.sleep(0.5)
    raise TimeoutError(f"queries not live after {timeout_s} s")


def soak(args, samples: list[dict]) -> None:
    """Run the soak, appending a sample every `args.interval` seconds to `samples`."""
    run = uuid.uuid4().hex[:8]
    logs = Path(tempfile.mkdtemp(prefix=f"cep-soak-{run}-"))
    print(f"logs: {logs}", flush=True)
    broker = None if args.bootstrap else EmbeddedBroker(log=logs / "broker.log").start()
    services = counter = None
    try:
        settings = KafkaSettings.from_env(args.bootstrap or broker.bootstrap,
                                          session_timeout_ms=2000)
        topics = Topics("trades", source=f"src.soak.{run}", prefix=f"soak{run}")
        outputs = register_queries(settings, topics, run)
        services = Services(settings, topics, args.idle_timeout_ms, args.checkpoint_ms,
                            logs)
        counter = OutputCounter(settings, outputs)
        counter.start()
        producer = settings.producer()
        load = Load(args.active_keys, args.key_stride, args.key_universe)
        load.send(producer, topics.source, 1000, args.framed)  # warm-up: joins, kernels
        producer.flush(30)
        wait_live(settings, topics, 300)
        pids = {role: p.pid for role, p in services.processes.items()}
        pids["broker"] = broker.process.pid if broker is not None else None
        per_tick = max(1, round(args.rate * TICK_S))
        started = time.monotonic()
        end = started + args.minutes * 60
        next_sample = started
        tick = 0
        while time.monotonic() < end:
            due = started + tick * TICK_S
            if time.monotonic() < due:
                time.sleep(max(0.0, due - time.monotonic()))
            load.send(producer, topics.source, per_tick, args.framed)
            producer.poll(0)
            tick += 1
            if time.monotonic() >= next_sample:
                services.check_alive()
                samples.append(sample(started, pids, services, load, counter))
                next_sample += args.interval
                print(progress(samples[-1]), flush=True)
                if (samples[-1]["broker_rss_mib"] or 0) > args.max_broker_mib:
                    print("stopping early: broker RSS over --max-broker-mib", flush=True)
                    break
        producer.flush(30)
        samples.append(sample(started, pids, services, load, counter))
    finally:
        if services is not None:
            services.stop()
        if counter is not None:
            counter.stopping.set()
            counter.join(10)
        if broker is not None:
            broker.stop()


def sample(started: float, pids: dict[str, int], services: Services, load: Load,
           counter: OutputCounter) -> dict:
    row = {"t_s": round(time.monotonic() - started, 2), "produced": load.sent}
    for role, pid in pids.items():
        rss = None if pid is None else rss_mib(pid)
        row[f"{role}_rss_mib"] = None if rss is None else round(rss, 1)
        cpu = None if pid is None else cpu_s(pid)
        row[f"{role}_cpu_s"] = None if cpu is None else round(cpu, 2)
    splitter = scrape(services.ports["splitter"], ("cep_events_in_total",))
    worker = scrape(services.ports["worker"], ("cep_consumer_lag", "cep_evicted_keys"))
    row["splitter_events_in"] = splitter.get("cep_events_in_total")
    row["worker_lag"] = worker.get("cep_consumer_lag")
    row["evicted_keys"] = worker.get("cep_evicted_keys")
    row["outputs"] = sum(counter.counts.values())
    return row


def progress(row: dict) -> str:
    rss = " ".join(f"{r}={row[f'{r}_rss_mib']:.0f}" for r in (*ROLES, "broker")
                   if row[f"{r}_rss_mib"] is not None)
    cpu = " ".join(f"{r}={row[f'{r}_cpu_s']:.0f}" for r in (*ROLES, "broker")
                   if row.get(f"{r}_cpu_s") is not None)
    return (f"t={row['t_s']:6.0f}s produced={row['produced']} "
            f"splitter_in={row['splitter_events_in']} lag={row['worker_lag']} "
            f"evicted={row['evicted_keys']} outputs={row['outputs']} RSS MiB: {rss} "
            f"CPU s: {cpu}")


def summarize(samples: list[dict], flat_pct: float) -> tuple[list[dict], bool]:
    t = np.array([s["t_s"] for s in samples]) / 60
    half = t >= t[-1] / 2
    rows, flat = [], True
    for role in (*ROLES, "broker"):
        rss = np.array([s[f"{role}_rss_mib"] or np.nan for s in samples])
        second = half & ~np.isnan(rss)
        if second.sum() < 2:  # not sampled (a broker not started here)
            continue
        slope, intercept = np.polyfit(t[second], rss[second], 1)
        growth = slope * (t[second][-1] - t[second][0]) / rss[second].mean() * 100
        row = {"process": role, "first_mib": round(float(rss[0]), 1),
               "peak_mib": round(float(np.nanmax(rss)), 1),
               "last_mib": round(float(rss[~np.isnan(rss)][-1]), 1),
               "slope_mib_per_min": round(float(slope), 2),
               "second_half_growth_pct": round(float(growth), 2)}
        cpu = np.array([s.get(f"{role}_cpu_s") or np.nan for s in samples])
        if not np.isnan(cpu).all():  # share of one core: whole run, last minute
            seen = ~np.isnan(cpu)
            last = seen & (t >= t[seen][-1] - 1)
            row["cpu_core_share"] = round(float((cpu[seen][-1] - cpu[seen][0]) / max(
                1e-9, (t[seen][-1] - t[seen][0]) * 60)), 3)
            row["cpu_core_share_last_min"] = round(float((cpu[last][-1] - cpu[last][0]) / max(
                1e-9, (t[last][-1] - t[last][0]) * 60)), 3)
        if role != "broker":  # grows by design: not judged
            row["flat"] = bool(abs(growth) < flat_pct)
            flat &= row["flat"]
        rows.append(row)
    return rows, flat


def kept_up(samples: list[dict], rate: float) -> bool:
    """Whether the splitter had taken in all but at most 5 s of the input at every sample
    (the pipeline neither stalled nor fell behind)."""
    return all((s["splitter_events_in"] or 0) >= s["produced"] - 5 * rate for s in samples)


def write_csv(samples: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(samples[0]))
        writer.writeheader()
        writer.writerows(samples)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: float(v) if v not in ("", None) else None for k, v in row.items()}
                for row in csv.DictReader(f)]


def plot(samples: list[dict], path: Path, title: str,
         compare: tuple[str, list[dict]] | None = None) -> None:
    """Services on top, the broker (memory storage keeps every record) below; `compare`:
    (label, samples) of another run whose services are drawn dashed on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t_s"] / 60 for s in samples]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True,
                                         height_ratios=(2, 1))
    colors = dict(zip(ROLES, ("tab:blue", "tab:orange", "tab:green")))
    for role in ROLES:
        top.plot(t, [s[f"{role}_rss_mib"] for s in samples], label=role, color=colors[role])
    if compare is not None:
        label, other = compare
        for role in ROLES:
            top.plot([s["t_s"] / 60 for s in other], [s[f"{role}_rss_mib"] for s in other],
                     color=colors[role], linestyle="--", alpha=0.7, label=f"{role}, {label}")
    broker = [np.nan if s["broker_rss_mib"] is None else s["broker_rss_mib"] for s in samples]
    bottom.plot(t, broker, color="tab:red", linestyle="--",
                label="embedded broker (memory storage keeps every record)"
                if not np.isnan(broker).all() else "broker: not sampled (--bootstrap)")
    behind = [s["t_s"] / 60 for s in samples if (s["splitter_events_in"] or 0) <
              s["produced"] - 5 * samples[-1]["produced"] / samples[-1]["t_s"]]
    if behind:  # the pipeline stopped keeping up: RSS after this is not RSS under load
        for axis in (top, bottom):
            axis.axvline(behind[0], color="grey", linestyle=":",
                         label=f"input backlog > 5 s from {behind[0]:.1f} min")
    top.set_title(title)
    for axis in (top, bottom):
        axis.set_ylabel("RSS (MiB)")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right", ncol=2 if compare and axis is top else 1,
                    fontsize="small")
    bottom.set_xlabel("minutes")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Deliberately like bench/bench_match.py's and bench/spark_stream.py's options: argparse
    # declarations, each benchmark its own
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate", type=float, default=10_000,
                        help="events/s (the embedded broker keeps every record in memory: "
                        "~1.4 GiB after 10 min, 4.1 GiB after 30 at 10k/s)")
    parser.add_argument("--json", dest="framed", action="store_false",
                        help="one JSON event per source message instead of one Arrow frame "
                        "per 10 ms tick")
    parser.add_argument("--interval", type=float, default=5, help="seconds between samples")
    parser.add_argument("--idle-timeout-ms", type=int, default=60_000,
                        help="workers' idle-key eviction, event time (1 ms per event)")
    parser.add_argument("--checkpoint-ms", type=int, default=30_000,
                        help="services' checkpoint interval: every snapshot goes to the "
                        "state topic, which tansu's memory storage keeps whole (at the 1 s "
                        "default the broker grew ~11 MiB/s)")
    parser.add_argument("--bootstrap",
                        help="use this running broker (HOST:PORT) instead of starting the "
                        "embedded one; its RSS is then not sampled")
    parser.add_argument("--active-keys", type=int, default=5000)
    parser.add_argument("--key-universe", type=int, default=0,
                        help="symbol numbers wrap modulo this (0: new symbols forever)")
    parser.add_argument("--key-stride", type=int, default=20,
                        help="events between two moves of the live-symbol window")
    parser.add_argument("--max-broker-mib", type=float, default=10_240,
                        help="stop early when the broker's RSS (it keeps every record) "
                        "passes this (the machine is shared)")
    parser.add_argument("--flat-pct", type=float, default=5.0,
                        help="flat: second-half growth of each service under this percent")
    parser.add_argument("--csv", type=Path,
                        default=Path(tempfile.gettempdir()) / "soak_rss.csv")
    parser.add_argument("--png", type=Path,
                        default=Path(tempfile.gettempdir()) / "soak_rss.png")
    parser.add_argument("--from-csv", type=Path,
                        help="no run: plot and summarize the samples of an earlier run")
    parser.add_argument("--compare", type=Path,
                        help="also draw the services of the run in this CSV (dashed)")
    parser.add_argument("--compare-label", default="compared run",
                        help="legend text for --compare")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, interrupt)
    if args.from_csv:
        samples = read_csv(args.from_csv)
    else:
        samples = []
        try:
            soak(args, samples)
        except KeyboardInterrupt:
            print("interrupted: everything stopped", file=sys.stderr)
            return 130
        finally:
            if samples:
                write_csv(samples, args.csv)
    rate = samples[-1]["produced"] / samples[-1]["t_s"]
    plot(samples, args.png, f"Soak: {rate:,.0f} events/s for {samples[-1]['t_s'] / 60:.1f} "
         f"min ({'Arrow frames' if args.framed else 'JSON'} input), idle timeout "
         f"{args.idle_timeout_ms} ms"
         + (f", {args.key_universe:,} symbols in all" if args.key_universe else ""),
         (args.compare_label, read_csv(args.compare)) if args.compare else None)
    rows, flat = summarize(samples, args.flat_pct)
    last = samples[-1]
    print(orjson.dumps({"events": last["produced"], "seconds": last["t_s"],
                        "events_per_s": round(rate), "splitter_events_in":
                        last["splitter_events_in"], "kept_up": kept_up(samples, rate),
                        "worker_lag": last["worker_lag"],
                        "evicted_keys": last["evicted_keys"], "outputs": last["outputs"]}
                       ).decode())
    for row in rows:
        print(orjson.dumps(row).decode())
    print(f"services flat (second-half growth < {args.flat_pct}%): {flat}; "
          f"csv {args.csv}, plot {args.png}")
    if not kept_up(samples, rate):
        print("INCONCLUSIVE: the pipeline fell behind the input (see the plot's marker); "
              "RSS while it is idle says nothing about RSS under load")
        return 2
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
