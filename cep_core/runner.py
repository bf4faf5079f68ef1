"""Running checked queries over a finite input: the one glue between readers and engines.

`run_checked` is what `cep run` (`cep_service.cli.main.run_queries`) and the Python API
(`cep_core.api.QuerySet.run`) call: the reference interpreter over Events, or the jitted
engines (optionally placed on a GPU) over a table as `event_reader.read_table` gives.
`new_engines` is the jitted engines' set-up, shared with `QuerySet.stream()`.
"""

from __future__ import annotations

# Deferred imports: numpy, pyarrow, numba (the stream engines, the GPU placement) and the reference
# interpreter load only for the engine and input a run uses: `cep run --engine reference` never
# imports numba or pyarrow, a jit run never imports the reference interpreter, and the Python API
# imports this module before any data is read.

import time
from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import orjson

from cep_core.choices import one_of
from cep_core.event_io import DeadLetter

if TYPE_CHECKING:
    import pyarrow as pa

    from cep_core.batch import BatchEncoder
    from cep_core.checked import CheckedQuery
    from cep_core.composites import Composites
    from cep_core.events import Event
    from cep_core.placement import Placement
    from cep_core.stream_engines import QueryFailure, StreamEngines



class EngineName(StrEnum):
    """The engines of a finite run (`cep run --engine`, `engine=`): the reference
    interpreter, or the jitted engines."""

    REFERENCE = "reference"
    JIT = "jit"

    @classmethod
    def of(cls, name: str) -> EngineName:
        """The engine of a name; ValueError names the engines."""
        return one_of(cls, name, "engine")


def new_engines(queries: list[CheckedQuery], placement: str | None = None,
                report: list[Placement] | None = None,
                **options: Any) -> tuple[StreamEngines, BatchEncoder]:
    """Fresh jitted engines for the queries (one stream) and the encoder of their batches.
    `placement` (cpu, gpu, auto; None: the CPU engines) places MATCH and SEQ queries as
    `cep_core.engine_factory.create_engine` decides; `report` gets one Placement per query;
    `options` go to the engines (`StreamEngines`)."""
    from cep_core import stream_engines as jit
    from cep_core.batch import BatchEncoder, StringDictionary

    strings = StringDictionary()
    engines = jit.StreamEngines(queries, strings, placement=placement, report=report,
                                **options)
    return engines, BatchEncoder(queries[0].schema, strings)


def run_checked(queries: list[CheckedQuery], events: Sequence[Event] | pa.Table,
                engine: str = EngineName.REFERENCE,
                placement: str | None = None, timings: dict[str, float] | None = None,
                report: list[Placement] | None = None,
                failures: list[QueryFailure] | None = None,
                ) -> tuple[Composites, list[DeadLetter]]:
    """Composite events of the queries over the events (Events, or a table as
    `event_reader.read_table` gives), in deterministic order (as
    `cep_core.composites.Composites`: columns, dicts only when asked for), with the events
    the engines rejected (time going backwards, late for a window) as DeadLetters.

    jit engine: `timings` (when given) gets `setup_s` (numba and engine imports, code
    generation), `compile_s` (numba compiling kernels or loading them from its cache while
    the events ran) and `process_s` (the rest: the events themselves); `report` the
    placement of each query when `placement` is given; `failures` the queries whose
    engine failed (`QueryFailure`s: contained, the other queries' output is whole)."""
    found: list[tuple[CheckedQuery, int, bytes, str]]
    table = events if hasattr(events, "num_rows") else None
    if EngineName.of(engine) is EngineName.REFERENCE:
        from cep_core import reference
        from cep_core.composites import Composites

        if table is not None:
            from cep_core.event_reader import events_from_table

            events = events_from_table(table, queries[0].schema)
        rejected_events: list[tuple[CheckedQuery, Event, str]] = []
        composites = Composites.from_dicts(reference.run(queries, events,
                                                         rejected=rejected_events))
        found = [(q, event.seq, orjson.dumps(event.to_json()), reason)
                 for q, event, reason in rejected_events]
    else:
        started = time.perf_counter()
        from cep_core import stream_engines as jit

        engines, encoder = new_engines(queries, placement, report)
        setup_s = time.perf_counter() - started
        rejected: list[tuple[CheckedQuery, int, str]] = []
        with jit.compile_timer() as compiling:
            started = time.perf_counter()
            composites = jit.run_engines(engines, encoder, events, rejected=rejected) \
                if table is None else jit.run_table(engines, encoder, table, rejected=rejected)
            run_s = time.perf_counter() - started
        if failures is not None:
            failures.extend(engines.failed.values())
        if timings is not None:
            timings.update(setup_s=setup_s, compile_s=compiling.seconds,
                           process_s=max(run_s - compiling.seconds, 0.0))
        found = [(q, seq, raw, reason) for (q, seq, reason), raw in
                 zip(rejected, events_json(events if table is None else table,
                                           [seq for _, seq, _ in rejected]))]
    return composites, [DeadLetter(f"query {q.name}", seq, raw, reason)
                        for q, seq, raw, reason in found]


def events_json(events: Sequence[Event] | pa.Table, seqs: list[int]) -> list[bytes]:
    """The JSON of the events with these seqs: Events, or rows of a table (whose seqs
    increase) found by binary search."""
    if not hasattr(events, "num_rows"):
        by_seq = {event.seq: event for event in events}
        return [orjson.dumps(by_seq[seq].to_json()) for seq in seqs]
    if not seqs:
        return []
    import numpy as np

    from cep_core.arrow_numpy import to_numpy
    from cep_core.event_reader import row_json

    table: pa.Table = events
    rows = np.searchsorted(to_numpy(table.column("seq")), seqs)
    return [row_json(table, int(row)) for row in rows]
