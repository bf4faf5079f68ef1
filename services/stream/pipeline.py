"""One stream's pipeline in one process (splitter, K workers, coordinator as threads, or
the chained pipeline as one thread): for tests. `cep serve` runs the same classes as
processes (the splitter or the chain inside its Faust app, services/stream/splitter_app.py);
here the splitter's loop sends its own pulses.

The threads check queries and make engines, which import numba and the compilers on first
use; Python's import locks can fail such imports from several threads at once
(`_DeadlockError`, "partially initialized module 'numba.core.caching'"), so the pipeline
imports them all (`import_engines`) before it starts a thread.

`wait_progressing` waits for a condition as long as the pipeline moves (`progress()`:
seqs, offsets and counters bounded by the input), for tests on loaded machines."""

from __future__ import annotations

# Deferred imports: the engines' modules (numba, the compilers) load in `import_engines`,
# once, before the threads start; importing this module loads none of them.

import importlib
import os
import pkgutil
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from cep_core.schema import SchemaRegistry

from cep_service.stream.chained import Chained
from cep_service.stream.coordinator import Coordinator
from cep_service.stream.kafka import KafkaSettings, Topics, ensure_topics
from cep_service.stream.metrics import Metrics
from cep_service.stream.splitter import Splitter
from cep_service.stream.worker import Worker


def create_topics(settings: KafkaSettings, topics: Topics, partitions: int,
                  outputs: Sequence[str] = (), source_partitions: int = 1) -> None:
    ensure_topics(settings, {topics.source: source_partitions, topics.control: 1,
                             topics.keyed: partitions,
                             **{topics.matches_of(k): partitions for k in range(topics.shards)},
                             topics.state: 1, topics.status: 1, topics.dead_letters: 1,
                             topics.late: 1,
                             **{o: 1 for o in outputs}},
                  compacted=(topics.control, topics.state), any_count=(topics.source,))


def import_engines() -> None:
    """Import, in this thread, every module the pipeline's threads import when they check
    a query (the compilers) or make and run engines (numba, its cache, the engines and
    kernels), and ready numba's cache loads (`cache_load.ready`): once, before threads
    start, so that no two threads import them at once. About 0.6 s the first time."""
    import cep_core.compiler
    import cep_core.engine
    import cep_core.kernels

    for package in (cep_core.engine, cep_core.compiler, cep_core.kernels):
        for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            importlib.import_module(module.name)
    for name in ("cep_core.admission", "cep_core.engine_factory", "cep_core.stream_engines"):
        importlib.import_module(name)
    from cep_core.engine import cache_load

    cache_load.ready()


class LocalPipeline:
    """Splitter, workers and coordinator as threads; `stop()` stops them in order."""

    def __init__(self, settings: KafkaSettings, topics: Topics, workers: int = 1,
                 partitions: int = 4, pulse_ms: int = 100,
                 on_output: Callable[[list[tuple[str, dict]]], object] | None = None,
                 registry: SchemaRegistry | None = None,
                 metrics_ports: Sequence[int] = (), splitter_options: dict | None = None,
                 worker_options: dict | None = None, coordinator_options: dict | None = None,
                 chained: bool = False) -> None:
        """`metrics_ports`: Prometheus ports of the splitter, each worker, the coordinator
        (in that order; empty: no endpoints). `chained`: the chained pipeline
        (services/stream/chained.py) in one thread instead (`worker_options` go to it;
        `workers` and `coordinator_options` do not apply)."""
        import_engines()  # before any thread of this process checks a query
        ports = list(metrics_ports) or [0] * (workers + 2)
        self.metrics = [Metrics("splitter", ports[0])] + \
            [Metrics("worker", port) for port in ports[1:-1]] + [Metrics("coordinator",
                                                                          ports[-1])]
        self.settings, self.topics = settings, topics
        self.chained = chained
        self.stops: list[threading.Event] = []
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self.splitter: Splitter
        if chained:  # one thread: splitter, workers and coordinators chained
            chain = Chained(settings, topics, partitions, pulse_ms, registry=registry,
                            metrics=self.metrics[0], **(splitter_options or {}),
                            **(worker_options or {}))
            self.splitter = chain
            self.metrics = self.metrics[:1]
            self.workers: list[Worker] = []
            self.coordinators = chain.coordinators
            self.coordinator = self.coordinators[0]
            return
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

    def _thread(self, target: Callable[[threading.Event], object], name: str) -> None:
        stop = threading.Event()

        def body() -> None:
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
        for k, coordinator in enumerate(self.coordinators if not self.chained else ()):
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

    def progress(self) -> tuple:
        """What moves while the pipeline works through its input, every part bounded by it
        (no pulse counts): the splitter's position and last seq, each service's events in
        and out, dead letters and late events, each coordinator's seq watermarks, received
        composites and ends released, and the files in the kernel cache (kernels compiled
        so far). Equal twice: nothing moved in between."""
        counters = tuple(metric._value.get() for m in self.metrics
                         for metric in (m.events_in, m.events_out, m.dead_letters,
                                        m.late_events))
        merged = tuple((tuple(c.merger.upto), c.merger.received, len(c.merger.ended))
                       for c in self.coordinators)
        return (self.splitter.position, self.splitter.last_seq, counters, merged,
                kernel_files())

    def __enter__(self) -> LocalPipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_for(condition: Callable[[], object], timeout_s: float, what: str,
             interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def wait_progressing(condition: Callable[[], object], progress: Callable[[], Any], what: str,
                     stall_s: float = 300, interval_s: float = 0.05,
                     progress_every_s: float = 1.0) -> None:
    """Wait until `condition()` holds, for as long as it takes while `progress()` (any
    comparable value, e.g. `LocalPipeline.progress`) keeps changing: the deadline is
    `stall_s` seconds after the last change, never a fixed budget, so a slow or loaded
    machine only waits longer, and a pipeline that stopped moving fails with what it
    last showed. `progress()` is asked at most every `progress_every_s` seconds."""
    last = progress()
    moved = checked = time.monotonic()
    while not condition():
        now = time.monotonic()
        if now - checked >= progress_every_s:
            current = progress()
            checked = time.monotonic()
            if current != last:
                last, moved = current, checked
            elif checked - moved > stall_s:
                raise TimeoutError(f"no progress for {stall_s:.0f} s waiting for {what} "
                                   f"(progress stayed at {last!r})")
        time.sleep(interval_s)


def flush_progressing(producer: Any, what: str = "messages", stall_s: float = 300,
                      moved: Callable[[], object] | None = None) -> None:
    """`producer.flush()` until every message is acknowledged, for as long as the number
    still waiting changes at least every `stall_s` seconds; `moved()` is called at each
    change."""
    left = producer.flush(1)
    since = time.monotonic()
    while left:
        now_left = producer.flush(1)
        if now_left != left:
            left, since = now_left, time.monotonic()
            if moved is not None:
                moved()
        elif time.monotonic() - since > stall_s:
            raise TimeoutError(f"{left} {what} not acknowledged, and none for "
                               f"{stall_s:.0f} s")


def kernel_files() -> int:
    """How many files the kernel cache holds (`cep_core.home.kernel_cache_dir`): grows as
    kernels are generated and compiled, so a cold start shows progress while it compiles."""
    from cep_core.home import kernel_cache_dir

    count = 0
    for _, _, files in os.walk(kernel_cache_dir()):
        count += len(files)
    return count
