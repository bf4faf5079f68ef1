"""`cep bench cores`: what each service's core costs apart from Kafka, fed from memory.

The M-shape query over synthetic trades (as `cep bench e2e`), 4 keyed
partitions. Each core is timed alone on input made before the clock starts:

- `splitter_json_events_per_s`: the routing core (services/stream/routing.py) taking one JSON
  event per message, in steps of `batch` messages (the splitter's batch size).
- `splitter_framed_events_per_s`: the same events as framed Arrow batches of 10k.
- `worker_events_per_s`: the partition cores (services/stream/partition.py) taking the keyed
  frames the router sent (events counted once per route, as the workers see them).
- `coordinator_composites_per_s`: the `Merger` taking the match frames and releasing.
"""

from __future__ import annotations

import time

from cep_core.workloads import WORKLOADS
from services.stream import frames
from services.stream.control import ControlMessage
from services.stream.coordinator import Merger
from services.stream.demo import STREAM, demo_queries, trade_lines
from services.stream.kafka import Topics
from services.stream.partition import PartitionState
from services.stream.routing import Router, message, records

PARTITIONS = 4


def _router() -> Router:
    router = Router(Topics(STREAM, source=f"src.{STREAM}"), PARTITIONS)
    for name, text in demo_queries()[:1]:  # M-shape, as `cep bench e2e`
        change = ControlMessage("add", name, text)
        router.apply_control(message(0, 0, change.to_json(), None, change.key), False)
    router.setup_schema()
    router.source_partitions = frozenset({0})
    router.announce()
    return router


def _timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def _split(router: Router, steps: list[list]) -> list[tuple]:
    out = []
    for step in steps:
        router.take(step)
        out.extend(router.out.take())
    return out


def run_bench(events: int = 200_000, batch: int = 20_000) -> dict:
    """Each core timed alone, after a warm-up run of all of them (kernels loaded)."""
    lines = trade_lines(events)
    table = WORKLOADS["finance1"].generate(events, 1).drop_columns(["seq"])
    _measure(lines[:10_000], table.slice(0, 10_000), batch)
    return _measure(lines, table, batch)


def _measure(lines: list[bytes], table, batch: int) -> dict:
    events = len(lines)
    json_steps = [records(lines[at:at + batch], 0, at) for at in range(0, events, batch)]
    json_steps.append([message(0, events, b"", [("kind", b"end")])])
    framed = [frames.encode_table(table.slice(at, 10_000)) for at in range(0, events, 10_000)]
    framed_steps = [records(framed, 0, 0, [("kind", b"events")])]

    router = _router()
    announce = router.out.take()  # the live set, handed to the partitions before the clock
    sent: list[tuple] = []
    json_s = _timed(lambda: sent.extend(_split(router, json_steps)))
    framed_s = _timed(lambda: _split(_router(), framed_steps))

    topics = router.topics
    keyed = [(p, frames.frame_of(message(p, 0, value, headers)))
             for topic, value, _, p, headers in sent if topic == topics.keyed]
    parts = [PartitionState(p, STREAM, router.queries.registry, topics=topics)
             for p in range(PARTITIONS)]
    matches: list[tuple] = []
    for topic, value, _, p, headers in announce:
        if topic != topics.keyed:
            continue
        parts[p].handle(frames.frame_of(message(p, 0, value, headers)), 0)
        matches.extend(parts[p].sent.take())

    def work() -> None:
        for i, (p, frame) in enumerate(keyed):
            parts[p].handle(frame, i + 1)
            matches.extend(parts[p].sent.take())

    worker_s = _timed(work)
    worker_events = sum(f.get("count", 0) for _, f in keyed if f.kind == frames.EVENTS)
    match_frames = [frames.frame_of(message(p, 0, value, headers))
                    for topic, value, _, p, headers in matches
                    if topic == topics.matches]
    merger = Merger(PARTITIONS, STREAM, router.queries.registry)
    released: list = []

    def merge() -> None:
        for frame in match_frames:
            merger.feed(frame)
            released.extend(merger.release())

    coordinator_s = _timed(merge)
    return {"events": events, "batch": batch,
            "splitter_json_events_per_s": round(events / json_s),
            "splitter_framed_events_per_s": round(events / framed_s),
            "worker_events_per_s": round(worker_events / worker_s),
            "coordinator_composites_per_s": round(len(released) / coordinator_s),
            "composites": len(released)}


if __name__ == "__main__":
    import sys

    import orjson

    print(orjson.dumps(run_bench(*map(int, sys.argv[1:]))).decode())
