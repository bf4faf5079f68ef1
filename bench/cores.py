"""`cep bench cores`: what each service's core costs apart from Kafka, fed from memory.

The M-shape query over synthetic trades (as `cep bench e2e`), 4 keyed
partitions. Each core is timed alone on input made before the clock starts:

- `splitter_json_events_per_s`: the routing core (services/stream/routing.py) taking one JSON
  event per message, in steps of `batch` messages (the splitter's batch size).
- `splitter_framed_events_per_s`: the same events as framed Arrow batches of 10k.
- `worker_events_per_s`: the partition cores (services/stream/partition.py) taking the keyed
  frames the router sent (events counted once per route, as the workers see them).
- `coordinator_composites_per_s`: the `Merger` taking the match frames and releasing.

`run_realistic` times the splitter's JSON path alone on users' data (the realistic
workloads as `cep gen` writes them: ISO-8601 times, fields and nested objects the schema
does not name, long strings), each routed by its own MATCH query, beside finance1 in the
same rounds (interleaved: the ratios hold on a busy machine).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

import pyarrow as pa

from cep_core.control_ops import Op
from cep_core.workloads import WORKLOADS, jsonl_lines
from cep_service.stream import frames
from cep_service.stream.control import ControlMessage
from cep_service.stream.merge import Merger
from cep_service.stream.demo import STREAM, demo_queries, trade_lines
from cep_service.stream.kafka import Topics
from cep_service.stream.partition import PartitionState
from cep_service.stream.routing import Router, message, records

PARTITIONS = 4


def _router(stream: str = STREAM, queries: list[tuple[str, str]] | None = None) -> Router:
    router = Router(Topics(stream, source=f"src.{stream}"), PARTITIONS)
    for name, text in queries or demo_queries()[:1]:  # M-shape, as `cep bench e2e`
        change = ControlMessage(Op.ADD, name, text)
        router.apply_control(message(0, 0, change.to_json(), None, change.key), False)
    router.setup_schema()
    router.source_partitions = frozenset({0})
    router.announce()
    return router


def _timed(run: Callable[[], object]) -> float:
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


def _measure(lines: list[bytes], table: pa.Table, batch: int) -> dict:
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
    worker_events = sum(f.get("count", 0) for _, f in keyed
                        if f is not None and f.kind is frames.EVENTS)
    match_frames = [frame for topic, value, _, p, headers in matches
                    if topic == topics.matches
                    and (frame := frames.frame_of(message(p, 0, value, headers))) is not None]
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


REALISTIC = ("iot", "activity", "clicks")


def run_realistic(events: int = 200_000, batch: int = 20_000, *,
                  workloads: Sequence[str] = REALISTIC,
                  rounds: int = 3) -> dict:
    """The splitter's JSON events/s on each workload's file lines (best of `rounds`, the
    workloads taken in turn each round), with finance1 first as the baseline; each
    workload's ratio to it."""
    names = ["finance1", *workloads]
    steps = {name: _json_steps(name, events, batch) for name in names}
    for name in names:  # warm-up: imports, the block parser's first use
        _split(_realistic_router(name), steps[name][:1])
    best = dict.fromkeys(names, 0.0)
    for _ in range(rounds):
        for name in names:
            run = functools.partial(_split, _realistic_router(name), steps[name])
            best[name] = max(best[name], events / _timed(run))
    return {"events": events, "batch": batch,
            **{f"{name}_json_events_per_s": round(rate) for name, rate in best.items()},
            **{f"{name}_to_finance1": round(best[name] / best["finance1"], 2)
               for name in workloads}}


def written_lines(name: str, events: int, seed: int = 1) -> list[bytes]:
    """The workload's events as `cep gen` writes them (JSON lines), one line each, without
    `seq` (the splitter gives the positions). Used by `cep bench e2e --workload` too."""
    table = WORKLOADS[name].written(events, seed)
    if "seq" in table.column_names:
        table = table.drop_columns(["seq"])
    return b"".join(jsonl_lines(b) for b in table.to_batches(1 << 20)).splitlines()


def _json_steps(name: str, events: int, batch: int) -> list[list]:
    """The workload's events as `cep gen` writes them, one JSON line a message."""
    lines = written_lines(name, events)
    steps = [records(lines[at:at + batch], 0, at) for at in range(0, events, batch)]
    return steps + [[message(0, events, b"", [("kind", b"end")])]]


def _realistic_router(name: str) -> Router:
    workload = WORKLOADS[name]
    text = workload.query_text(seed=1)
    first = text[text.index("QUERY"):].split(";")[0] + ";"  # its MATCH query, keyed
    return _router(workload.stream, [(first.split()[1], first)])


if __name__ == "__main__":
    import sys

    import orjson

    if sys.argv[1:2] == ["--realistic"]:
        print(orjson.dumps(run_realistic(*map(int, sys.argv[2:]))).decode())
    else:
        print(orjson.dumps(run_bench(*map(int, sys.argv[1:]))).decode())
