"""One stream's pipeline in one process (splitter, K workers, coordinator as threads):
for tests. `cep serve` runs the same classes as processes (the splitter inside its Faust
app, services/stream/splitter_app.py); here the splitter's loop sends its own pulses."""

from __future__ import annotations

import threading
import time

from services.stream.coordinator import Coordinator
from services.stream.kafka import KafkaSettings, Topics, ensure_topics
from services.stream.metrics import Metrics
from services.stream.splitter import Splitter
from services.stream.worker import Worker


def create_topics(settings: KafkaSettings, topics: Topics, partitions: int,
                  outputs: list[str] = (), source_partitions: int = 1) -> None:
    ensure_topics(settings, {topics.source: source_partitions, topics.control: 1,
                             topics.keyed: partitions,
                             **{topics.matches_of(k): partitions for k in range(topics.shards)},
                             topics.state: 1, topics.status: 1, topics.dead_letters: 1,
                             topics.late: 1,
                             **{o: 1 for o in outputs}},
                  compacted=(topics.control, topics.state), any_count=(topics.source,))


class LocalPipeline:
    """Splitter, workers and coordinator as threads; `stop()` stops them in order."""

    def __init__(self, settings: KafkaSettings, topics: Topics, workers: int = 1,
                 partitions: int = 4, pulse_ms: int = 100, on_output=None, registry=None,
                 metrics_ports: list[int] = (), splitter_options: dict | None = None,
                 worker_options: dict | None = None, coordinator_options: dict | None = None):
        """`metrics_ports`: Prometheus ports of the splitter, each worker, the coordinator
        (in that order; empty: no endpoints)."""
        ports = list(metrics_ports) or [0] * (workers + 2)
        self.metrics = [Metrics("splitter", ports[0])] + \
            [Metrics("worker", port) for port in ports[1:-1]] + [Metrics("coordinator",
                                                                          ports[-1])]
        self.settings, self.topics = settings, topics
        self.splitter = Splitter(settings, topics, partitions, pulse_ms, registry=registry,
                                 metrics=self.metrics[0], **(splitter_options or {}))
        self.workers = [Worker(settings, topics, registry, metrics=self.metrics[1 + i],
                               **(worker_options or {}))
                        for i in range(workers)]
        shard_metrics = [self.metrics[-1]] + [Metrics("coordinator", 0)
                                              for _ in range(1, topics.shards)]
        self.coordinators = [
            Coordinator(settings, topics, partitions, registry, on_output=on_output,
                        metrics=shard_metrics[k], shard=k, **(coordinator_options or {}))
            for k in range(topics.shards)]
        self.metrics += shard_metrics[1:]
        self.coordinator = self.coordinators[0]
        self.stops: list[threading.Event] = []
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def _thread(self, target, name: str) -> None:
        stop = threading.Event()

        def body():
            try:
                target(stop)
            except BaseException as e:  # surfaced by stop()
                self.errors.append(e)
                raise

        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        self.stops.append(stop)
        self.threads.append(thread)

    def start(self) -> LocalPipeline:
        self._thread(self.splitter.run, "splitter")
        for i, worker in enumerate(self.workers):
            self._thread(worker.run, f"worker-{i}")
        for k, coordinator in enumerate(self.coordinators):
            self._thread(coordinator.run, f"coordinator-{k}")
        return self

    def stop(self, timeout_s: float = 30) -> None:
        for stop, thread in zip(self.stops, self.threads):
            stop.set()
            thread.join(timeout_s)
        for metrics in self.metrics:
            metrics.close()
        if self.errors:
            raise self.errors[0]

    def __enter__(self) -> LocalPipeline:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_for(condition, timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
