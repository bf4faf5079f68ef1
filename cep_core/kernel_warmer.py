"""Compiling a query's kernels off the data path, before the query goes live.

numba compiles a kernel at its first call, so the first batch a new query sees would wait
for it (seconds to minutes cold). `warm(text, schema)` makes the query's engines in this
process and runs them over a small synthetic stream (every event type, each stage:
process, punctuate, snapshot, restore, flush), which compiles what they call into
numba's on-disk cache in the machine's kernel cache (`cep_core.home.kernel_cache_dir`).
A process that then makes the same engines loads the machine code from there instead.

`KernelWarmer` runs `warm` in a separate process (one at a time, started on first use), so
the caller's thread and GIL stay free: the splitter holds a new query's change back until
its kernels are warm and then applies it at the seq it has reached (the query's output is
`cep run`'s from that seq, as for any change), while events keep flowing to the live ones.
"""

from __future__ import annotations

# Deferred imports: the engines (numba) load in the process that warms, not in the one that
# only submits (the splitter).

import multiprocessing
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cep_core.events import Event
    from cep_core.schema import StreamSchema

SYNTHETIC_EVENTS = 512
NICE = 10  # the compiling child yields the cores to the data path


def synthetic_events(schema: StreamSchema, n: int = SYNTHETIC_EVENTS) -> list[Event]:
    """`n` valid events of the stream: every event type in turn, small repeating values,
    time rising by one second per event."""
    from cep_core.events import Event
    from cep_core.schema import NANOS_PER_UNIT, AttrType

    second = NANOS_PER_UNIT["s"] // NANOS_PER_UNIT[schema.time_unit] or 1
    types = list(getattr(schema, "types", None) or [])
    events = []
    for i in range(n):
        attrs: dict[str, object] = {}
        for name, kind in schema.attributes.items():
            if name == schema.time:
                attrs[name] = i * second
            elif name == getattr(schema, "type_attribute", None) and types:
                attrs[name] = types[i % len(types)]
            elif kind == AttrType.STRING:
                attrs[name] = "abc"[i % 3]
            elif kind == AttrType.FLOAT:
                attrs[name] = (i % 7) * 0.5
            elif kind == AttrType.BOOL:
                attrs[name] = i % 2 == 0
            else:
                attrs[name] = i % 7
        events.append(Event(i, i * second, attrs))
    return events


def warm(text: str, schema_json: str | None = None) -> dict[str, Any]:
    """Compile (or load) every kernel the queries of `text` call, over a synthetic stream;
    `schema_json` is the stream's schema where this process may not know it. Returns
    what it did: seconds spent and the queries warmed."""
    from cep_core.batch import BatchEncoder, StringDictionary
    from cep_core.checker import load_query_text
    from cep_core.schema import SchemaRegistry, StreamSchema
    from cep_core.stream_engines import StreamEngines, compile_timer

    started = time.perf_counter()
    registry = SchemaRegistry()
    if schema_json is not None:
        import orjson
        registry.add(StreamSchema.from_dict(orjson.loads(schema_json)))
    queries = load_query_text(text, registry)
    schema = queries[0].schema
    events = synthetic_events(schema)
    with compile_timer() as compiling:
        strings = StringDictionary()
        engines = StreamEngines(queries, strings)
        encoder = BatchEncoder(schema, strings)
        half = len(events) // 2
        engines.process(encoder.from_events(events[:half]))
        engines.punctuate(events[half].ts)
        saved = engines.snapshot()
        again = StreamEngines(queries, strings)
        again.restore(saved)
        again.process(encoder.from_events(events[half:]))
        again.flush()
    return {"queries": [q.name for q in queries], "compile_s": compiling.seconds,
            "total_s": time.perf_counter() - started,
            "failed": {name: str(f) for name, f in {**engines.failed, **again.failed}.items()}}


class KernelWarmer:
    """`submit(text, schema_json)` -> a Future of `warm`'s result, run in a child process
    (spawned: no fork of a process with threads and a Kafka client; `NICE`d, so the live
    queries' processes keep the cores while it compiles)."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    def submit(self, text: str, schema_json: str | None = None) -> Future[dict[str, Any]]:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                initializer=os.nice, initargs=(NICE,))
        return self._pool.submit(warm, text, schema_json)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
