"""A stream's queries on the jitted engines: `StreamEngines` holds one engine per checked
query (made by `cep_core.engine_factory.create_engine`, placed on the CPU or a GPU) over
one string dictionary, adds,
replaces and removes queries, orders their composite events and snapshots them together.
`run()` is the batch counterpart of `cep_core.reference.run` and gives identical composite
events; `run_table`/`run_engines` feed an Arrow table or event batches through.
"""

from __future__ import annotations

# Deferred imports: numba (`numba.core.event`) and WINDOW's compiler and engine load when a jit run
# starts, so `cep run` can import the engines in a second thread while pyarrow parses, and a stream
# without WINDOW queries never imports them.

from collections.abc import Iterable
from contextlib import contextmanager

import numpy as np

from cep_core import snapshot_format
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import CheckedQuery
from cep_core.composite import sort_key
from cep_core.composite_batch import CompositeBatch, RowBatch, to_dicts
from cep_core.composites import Composites
from cep_core.engine import cache_load
from cep_core.engine_factory import create_engine
from cep_core.events import Event, Punctuation
from cep_core.placement import Placement, check_placement


def compact_strings(parts, strings: StringDictionary, slack: float = 2.0,
                    minimum: int = 4096) -> int:
    """Drop the strings that no engine in `parts` holds any more (keys that were released
    and never came back), when `strings` has more than `slack` times as many as are held
    (and at least `minimum`). Returns how many strings were dropped. Anything else holding
    codes of `strings` (batches, composite batches not yet decoded) is invalid after."""
    if len(strings) < minimum:
        return 0
    live = np.unique(np.concatenate([np.empty(0, np.int64)] + [
        np.asarray(part.string_codes(), np.int64).ravel() for part in parts]))
    if len(strings) <= slack * len(live):
        return 0
    before = len(strings)
    new_code = strings.compact(live)
    for part in parts:
        part.remap_strings(new_code)
    return before - len(strings)


def _columns(part, method: str, *args) -> list[CompositeBatch]:
    """`part.<method>_columns(*args)`, or its dicts as one RowBatch where the part (the
    WINDOW query set, GPU engines) builds dicts."""
    columns = getattr(part, f"{method}_columns", None)
    if columns is not None:
        return columns(*args)
    rows = getattr(part, method)(*args)
    return [RowBatch(rows)] if rows else []


def batches(stream: Iterable[Event | Punctuation], size: int):
    """Groups events into lists of at most `size`; a punctuation is yielded on its own."""
    pending: list[Event] = []
    for item in stream:
        if isinstance(item, Punctuation):
            if pending:
                yield pending
                pending = []
            yield item
            continue
        pending.append(item)
        if len(pending) >= size:
            yield pending
            pending = []
    if pending:
        yield pending


class StreamEngines:
    """Every query over one stream: WINDOW queries share one WindowQuerySet (each distinct
    predicate evaluated once per event); MATCH and SEQ queries get an engine each.

    `process`, `punctuate` and `flush` return composite events, query after query;
    `order()` puts any list of them in the deterministic output order.

    `placement` ("cpu", "gpu", "auto"; None: the CPU, unreported) places MATCH and SEQ
    queries (`create_engine`); `report` then gets one `Placement` per query, WINDOW
    queries last (they always share the CPU query set)."""

    def __init__(self, queries: list[CheckedQuery], strings: StringDictionary, *,
                 placement: str | None = None, report: list | None = None, **options):
        if placement is not None:
            check_placement(placement)
        cache_load.install()
        self.queries = {q.name: q for q in queries}
        self._strings = strings
        self._compact_at = 0.0  # dictionary size at which compact_strings looks again
        self.engines = [create_engine(q, strings, placement or "cpu", **options)
                        for q in queries if q.query.kind != "window"]
        windows = [q for q in queries if q.query.kind == "window"]
        if placement is not None and report is not None:
            report.extend(e.placement for e in self.engines)
            report.extend(Placement(q.name, "cpu", "WINDOW queries run on the CPU (shared "
                                    "panes)") for q in windows)
        self.windows = None
        if windows:
            from cep_core.compiler.window import compile_window
            from cep_core.engine.window import WindowQuerySet
            known = ("chunk", "rows_capacity", "groups", "masked_at", "release_at")
            self.windows = WindowQuerySet(windows[0].schema, strings,
                                          **{k: v for k, v in options.items() if k in known})
            for q in windows:
                self.windows.add(compile_window(q))

    def _parts(self):
        yield from self.engines
        if self.windows is not None:
            yield self.windows

    def order(self, composites: list[dict]) -> list[dict]:
        index = {name: q.index for name, q in self.queries.items()}
        return sorted(composites, key=lambda c: sort_key(c, index[c["query"]]))

    def process(self, batch) -> list[dict]:
        return to_dicts(self.process_columns(batch))

    def process_columns(self, batch) -> list[CompositeBatch]:
        """`process` as columns: the composite events of every query, no dict per event
        (WINDOW queries' are built as dicts still)."""
        out = [b for engine in self.engines for b in engine.process_columns(batch)]
        if self.windows is not None:
            by_query: dict[str, list[dict]] = {}
            for row in self.windows.process(batch):
                by_query.setdefault(row["query"], []).append(row)
            out += [RowBatch(rows) for rows in by_query.values()]
        return out

    def punctuate(self, ts: int) -> list[dict]:
        return [c for part in self._parts() for c in part.punctuate(ts)]

    def flush(self) -> list[dict]:
        return [c for part in self._parts() for c in part.flush()]

    def punctuate_columns(self, ts: int) -> list[CompositeBatch]:
        return [b for part in self._parts() for b in _columns(part, "punctuate", ts)]

    def flush_columns(self) -> list[CompositeBatch]:
        return [b for part in self._parts() for b in _columns(part, "flush")]

    def composites(self, batches: list[CompositeBatch]) -> Composites:
        """`batches` (in the order the engines gave them) as output-ordered Composites."""
        return Composites(batches, {name: q.index for name, q in self.queries.items()})

    # ------------------------------------------------------------ run-time changes

    def add(self, checked: CheckedQuery, **options) -> None:
        """Start a query (fresh state) without touching the others."""
        if checked.name in self.queries:
            raise ValueError(f"query {checked.name!r} is already running")
        self.queries[checked.name] = checked
        if checked.query.kind != "window":
            self.engines.append(create_engine(checked, self._strings, **options))
            return
        from cep_core.compiler.window import compile_window
        if self.windows is None:
            from cep_core.engine.window import WindowQuerySet
            self.windows = WindowQuerySet(checked.schema, self._strings)
        self.windows.add(compile_window(checked))

    def remove(self, name: str) -> None:
        """Stop a query and drop its state; the others keep theirs."""
        checked = self.queries.pop(name)
        if checked.query.kind == "window":
            self.windows.remove(name)
        else:
            self.engines = [e for e in self.engines if e.checked.name != name]

    def update(self, checked: CheckedQuery, **options) -> None:
        if checked.name in self.queries:
            self.remove(checked.name)
        self.add(checked, **options)

    def snapshot(self) -> bytes:
        """The state of every query (and the string dictionary) as bytes."""
        arrays = {f"e{i}": np.frombuffer(e.snapshot(with_strings=False), dtype=np.uint8)
                  for i, e in enumerate(self.engines)}
        meta = {"strings": self._strings.strings,
                "engines": [e.checked.name for e in self.engines], "windows": None}
        if self.windows is not None:
            window_meta, window_arrays = self.windows.state()
            meta["windows"] = window_meta
            arrays.update({f"w_{k}": v for k, v in window_arrays.items()})
        return snapshot_format.pack_arrays("engines", meta, arrays)

    def restore(self, data: bytes) -> None:
        """Put back a snapshot taken from engines with the same queries."""
        meta, arrays = snapshot_format.unpack_arrays("engines", data)
        for s in meta["strings"]:
            self._strings.code(s)
        if self._strings.strings[:len(meta["strings"])] != meta["strings"]:
            raise ValueError("snapshot was taken with another string dictionary")
        by_name = {e.checked.name: e for e in self.engines}
        for i, name in enumerate(meta["engines"]):
            by_name[name].restore(arrays[f"e{i}"].tobytes())
        if meta["windows"] is not None:
            self.windows.load_state(meta["windows"], {k[2:]: v for k, v in arrays.items()
                                                      if k.startswith("w_")})

    def compact_strings(self, slack: float = 2.0, minimum: int = 4096) -> int:
        """`compact_strings` over every query of the stream. After a look that found most
        strings in use, the next look waits until the dictionary has grown `slack` times
        (asking every engine for its codes costs ~1 ms per thousand keys)."""
        if len(self._strings) < max(minimum, self._compact_at):
            return 0
        dropped = compact_strings(list(self._parts()), self._strings, slack, minimum)
        self._compact_at = slack * len(self._strings)
        return dropped

    def dead_letters(self) -> list[tuple[CheckedQuery, int, str]]:
        """(query, seq, reason) of every event an engine rejected."""
        out = [(e.checked, seq, reason) for e in self.engines for seq, reason in e.dead_letters]
        if self.windows is not None:
            out.extend((self.queries[name], seq, reason) for name in self.windows.names
                       for seq, reason in self.windows.dead_letters(name))
        return out

    def take_dead_letters(self) -> list[tuple[CheckedQuery, int, str]]:
        """`dead_letters()`, then forgotten (a service that has sent them on keeps neither
        them nor a count in memory or in snapshots)."""
        out = self.dead_letters()
        for e in self.engines:
            e.dead_letters.clear()
        if self.windows is not None:
            for name in self.windows.names:
                self.windows.dead_letters(name).clear()
        return out


class CompileTimer:
    """Seconds numba spent compiling kernels, or loading them from its on-disk cache, while
    `compile_timer()` was active (numba holds its compiler lock for both)."""

    def __init__(self):
        from numba.core import event

        self._listener = event.TimingListener()

    @property
    def seconds(self) -> float:
        return self._listener.duration if self._listener.done else 0.0


@contextmanager
def compile_timer():
    """`with compile_timer() as t: ...`: `t.seconds` is the time inside the block spent in
    numba compilation (and cache loads), so callers can report processing rates without
    it. Uses numba's documented `numba:compiler_lock` event."""
    from numba.core import event

    timer = CompileTimer()
    with event.install_listener("numba:compiler_lock", timer._listener):
        yield timer


def run(queries: list[CheckedQuery], stream: Iterable[Event | Punctuation],
        batch_size: int = 65536, flush: bool = True, rejected: list | None = None,
        **options) -> list[dict]:
    """Every composite event of `queries` over a finite stream, in deterministic order
    (the same list `cep_core.reference.run` gives). Rejected events are appended to
    `rejected` as (query, seq, reason). `options` go to `StreamEngines` (`placement`,
    `report` among them)."""
    if not queries:
        return []
    strings = StringDictionary()
    return run_engines(StreamEngines(queries, strings, **options),
                       BatchEncoder(queries[0].schema, strings), stream, batch_size, flush,
                       rejected).to_dicts()


def run_table(engines: StreamEngines, encoder: BatchEncoder, table, slice_rows: int = 65536,
              flush: bool = True, rejected: list | None = None) -> Composites:
    """`run_engines` over a table of events (`seq`, then the stream's attributes, as
    `cep_core.event_reader.read_table` gives), `slice_rows` rows per batch: no Event
    objects. The same composite events as `run_engines` over the table's events."""
    found: list[CompositeBatch] = []
    for start in range(0, table.num_rows, slice_rows):
        found.extend(engines.process_columns(encoder.from_arrow(table.slice(start,
                                                                            slice_rows))))
    if flush:
        found.extend(engines.flush_columns())
    if rejected is not None:
        rejected.extend(engines.dead_letters())
    return engines.composites(found)


def run_engines(engines: StreamEngines, encoder: BatchEncoder,
                stream: Iterable[Event | Punctuation], batch_size: int = 65536,
                flush: bool = True, rejected: list | None = None) -> Composites:
    """`run` over engines already made (sharing `encoder`'s string dictionary), as
    Composites: columns in deterministic order, dicts only when asked for."""
    found: list[CompositeBatch] = []
    for chunk in batches(stream, batch_size):
        if isinstance(chunk, Punctuation):
            found.extend(engines.punctuate_columns(chunk.ts))
        else:
            found.extend(engines.process_columns(encoder.from_events(chunk)))
    if flush:
        found.extend(engines.flush_columns())
    if rejected is not None:
        rejected.extend(engines.dead_letters())
    return engines.composites(found)
