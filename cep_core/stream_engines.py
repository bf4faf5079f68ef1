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

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from cep_core import failpoints, snapshot_format
from cep_core.ast import QueryKind
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checked import CheckedQuery
from cep_core.composite import sort_key
from cep_core.composite_batch import CompositeBatch, RowBatch, to_dicts
from cep_core.composites import Composites
from cep_core.engine import cache_load
from cep_core.engine_factory import create_engine
from cep_core.events import Event, Punctuation
from cep_core.placement import Placement, Target, check_placement

if TYPE_CHECKING:
    import pyarrow as pa

    from cep_core.batch import Batch
    from cep_core.engine.base import Engine
    from cep_core.engine.window import WindowQuerySet

    Part = Engine | WindowQuerySet  # what holds queries' state: an engine, the WINDOW set

_T = TypeVar("_T")
# An event an engine rejected: (query, seq, reason).
Rejected = tuple[CheckedQuery, int, str]


class _HoldsStrings(Protocol):
    def string_codes(self) -> npt.ArrayLike: ...

    def remap_strings(self, new_code: npt.NDArray[np.int64]) -> None: ...


def compact_strings(parts: list[_HoldsStrings], strings: StringDictionary, slack: float = 2.0,
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


def _columns(part: Part, method: str, *args: object) -> list[CompositeBatch]:
    """`part.<method>_columns(*args)`, or its dicts as one RowBatch where the part (the
    WINDOW query set, GPU engines) builds dicts."""
    columns: Callable[..., list[CompositeBatch]] | None = getattr(part, f"{method}_columns",
                                                                  None)
    if columns is not None:
        return columns(*args)
    rows: list[dict[str, Any]] = getattr(part, method)(*args)
    return [RowBatch(rows)] if rows else []


def batches(stream: Iterable[Event | Punctuation], size: int
            ) -> Iterator[list[Event] | Punctuation]:
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


@dataclass(frozen=True)
class QueryFailure:
    """A query whose engine failed: where (`stage`), at which event (`seq`, the last of the
    batch being processed, where there was one) and why."""

    query: str
    stage: str
    reason: str
    seq: int | None = None

    def __str__(self) -> str:
        at = f" (batch up to seq {self.seq})" if self.seq is not None else ""
        return f"query {self.query!r} failed in {self.stage}{at}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.query, "stage": self.stage, "reason": self.reason,
                "seq": self.seq}


def _reason(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _last_seq(batch: object) -> int | None:
    seq = getattr(batch, "seq", None)
    return int(seq[-1]) if seq is not None and len(seq) else None


class StreamEngines:
    """Every query over one stream: WINDOW queries share one WindowQuerySet (each distinct
    predicate evaluated once per event); MATCH and SEQ queries get an engine each.

    `process`, `punctuate` and `flush` return composite events, query after query;
    `order()` puts any list of them in the deterministic output order.

    Containment: a query whose engine raises (when it is made, or in process, punctuate,
    flush, snapshot or restore) is dropped alone: its state goes, `failed[name]` says where
    and why (a `QueryFailure`; `take_failures()` hands each out once), and the other
    queries go on exactly as they would without it. A WINDOW query that fails in its own
    kernel call is dropped alone from the shared set; a failure in the set's shared
    predicate stage drops every WINDOW query of the set.

    `placement` ("cpu", "gpu", "auto"; None: the CPU, unreported) places MATCH and SEQ
    queries (`create_engine`); `report` then gets one `Placement` per query, WINDOW
    queries last (they always share the CPU query set)."""

    def __init__(self, queries: list[CheckedQuery], strings: StringDictionary, *,
                 placement: str | None = None, report: list[Placement] | None = None,
                 **options: Any) -> None:
        if placement is not None:
            check_placement(placement)
        cache_load.install()
        self.queries = {q.name: q for q in queries}
        self.indexes = {q.name: q.index for q in queries}  # failed queries' too
        self.failed: dict[str, QueryFailure] = {}
        self._failures: list[QueryFailure] = []  # not handed out yet
        self._strings = strings
        self._compact_at = 0.0  # dictionary size at which compact_strings looks again
        self.engines: list[Engine] = []
        for q in queries:
            if q.query.kind is not QueryKind.WINDOW:
                engine = self._made(q, placement or "cpu", options)
                if engine is not None:
                    self.engines.append(engine)
        windows = [q for q in queries if q.query.kind is QueryKind.WINDOW]
        if placement is not None and report is not None:
            report.extend(e.placement for e in self.engines)
            report.extend(Placement(q.name, Target.CPU, "WINDOW queries run on the CPU (shared "
                                    "panes)") for q in windows)
        self.windows: WindowQuerySet | None = None
        if windows:
            from cep_core.engine.window import WindowQuerySet
            known = ("chunk", "rows_capacity", "groups", "masked_at", "release_at")
            self.windows = WindowQuerySet(windows[0].schema, strings,
                                          **{k: v for k, v in options.items() if k in known})
            for q in windows:
                self._add_window(q)

    def _made(self, checked: CheckedQuery, placement: str, options: dict[str, Any]
              ) -> Engine | None:
        """The query's engine, or None when making it failed (the query is failed)."""
        try:
            failpoints.hit(checked.name, "compile")
            return create_engine(checked, self._strings, placement, **options)
        except Exception as e:  # noqa: BLE001 - a query's failure is contained
            self._fail(checked.name, "compile", e)
            return None

    def _add_window(self, checked: CheckedQuery) -> None:
        from cep_core.compiler.window import compile_window
        assert self.windows is not None  # made before its first query is added
        try:
            failpoints.hit(checked.name, "compile")
            self.windows.add(compile_window(checked))
        except Exception as e:  # noqa: BLE001
            self._fail(checked.name, "compile", e)

    # ------------------------------------------------------------ containment

    def _fail(self, name: str, stage: str, error: BaseException | str,
              seq: int | None = None) -> None:
        """Drop query `name` (its engine and state) and record why."""
        checked = self.queries.pop(name, None)
        if checked is None:
            return
        if checked.query.kind is QueryKind.WINDOW:
            if self.windows is not None and name in self.windows:
                self.windows.remove(name)
        else:
            self.engines = [e for e in self.engines if e.checked.name != name]
        failure = QueryFailure(name, stage, error if isinstance(error, str) else
                               _reason(error), seq)
        self.failed[name] = failure
        self._failures.append(failure)

    def _window_failpoints(self, stage: str) -> None:
        """CEP_FAILPOINTS for the WINDOW queries at a stage the shared set does as one
        (snapshot, restore)."""
        assert self.windows is not None  # asked for where there is a WINDOW query set
        for name in list(self.windows.names):
            try:
                failpoints.hit(name, stage)
            except Exception as e:  # noqa: BLE001
                self._fail(name, stage, e)

    def take_failures(self) -> list[QueryFailure]:
        """Failures since the last call (a service reports each once)."""
        out, self._failures = self._failures, []
        return out

    def _each_engine(self, stage: str, call: Callable[[Engine], Iterable[_T]],
                     seq: int | None = None) -> list[_T]:
        out: list[_T] = []
        for engine in list(self.engines):
            name = engine.checked.name
            try:
                failpoints.hit(name, stage, seq)
                out.extend(call(engine))
            except Exception as e:  # noqa: BLE001
                self._fail(name, stage, e, seq)
        return out

    def _window_call(self, stage: str, call: Callable[[WindowQuerySet], list[_T]],
                     seq: int | None = None) -> list[_T]:
        """`call(windows)` with the set's own per-query failures taken in; a failure of
        the whole set fails each of its queries."""
        if self.windows is None or not len(self.windows):
            return []
        try:
            out = call(self.windows)
        except Exception as e:  # noqa: BLE001
            for name in self.windows.names:
                self._fail(name, stage, f"{_reason(e)} (in the stage the WINDOW queries "
                                        "of the stream share)", seq)
            return []
        for name, (where, error) in self.windows.take_failed().items():
            self._fail(name, where, error, seq)
        return out

    def _parts(self) -> Iterator[Part]:
        yield from self.engines
        if self.windows is not None:
            yield self.windows

    def order(self, composites: list[dict[str, Any]]) -> list[dict[str, Any]]:
        index = self.indexes
        return sorted(composites, key=lambda c: sort_key(c, index[c["query"]]))

    def process(self, batch: Batch) -> list[dict[str, Any]]:
        return to_dicts(self.process_columns(batch))

    def process_columns(self, batch: Batch) -> list[CompositeBatch]:
        """`process` as columns: the composite events of every query, no dict per event
        (WINDOW queries' are built as dicts still)."""
        seq = _last_seq(batch)
        out = self._each_engine("process", lambda e: e.process_columns(batch), seq)
        by_query: dict[str, list[dict[str, Any]]] = {}
        for row in self._window_call("process", lambda w: w.process(batch), seq):
            by_query.setdefault(row["query"], []).append(row)
        out += [RowBatch(rows) for rows in by_query.values()]
        return out

    def punctuate(self, ts: int) -> list[dict[str, Any]]:
        return to_dicts(self.punctuate_columns(ts))

    def flush(self) -> list[dict[str, Any]]:
        return to_dicts(self.flush_columns())

    def punctuate_columns(self, ts: int) -> list[CompositeBatch]:
        return self._ended("punctuate", lambda part: _columns(part, "punctuate", ts))

    def flush_columns(self) -> list[CompositeBatch]:
        return self._ended("flush", lambda part: _columns(part, "flush"))

    def _ended(self, stage: str, call: Callable[[Part], list[CompositeBatch]]
               ) -> list[CompositeBatch]:
        return self._each_engine(stage, call) + self._window_call(stage, call)

    def composites(self, batches: list[CompositeBatch]) -> Composites:
        """`batches` (in the order the engines gave them) as output-ordered Composites."""
        return Composites(batches, dict(self.indexes))

    # ------------------------------------------------------------ run-time changes

    def add(self, checked: CheckedQuery, **options: Any) -> None:
        """Start a query (fresh state) without touching the others."""
        if checked.name in self.queries:
            raise ValueError(f"query {checked.name!r} is already running")
        self.queries[checked.name] = checked
        self.indexes[checked.name] = checked.index
        self.failed.pop(checked.name, None)
        if checked.query.kind is not QueryKind.WINDOW:
            engine = self._made(checked, options.pop("placement", "cpu"), options)
            if engine is not None:
                self.engines.append(engine)
            return
        if self.windows is None:
            from cep_core.engine.window import WindowQuerySet
            self.windows = WindowQuerySet(checked.schema, self._strings)
        self._add_window(checked)

    def remove(self, name: str) -> None:
        """Stop a query and drop its state; the others keep theirs (a failed query is
        forgotten)."""
        if self.failed.pop(name, None) is not None and name not in self.queries:
            return
        checked = self.queries.pop(name)
        if checked.query.kind is QueryKind.WINDOW:
            assert self.windows is not None  # it holds the WINDOW queries
            self.windows.remove(name)
        else:
            self.engines = [e for e in self.engines if e.checked.name != name]

    def update(self, checked: CheckedQuery, **options: Any) -> None:
        if checked.name in self.queries or checked.name in self.failed:
            self.remove(checked.name)
        self.add(checked, **options)

    def snapshot(self) -> bytes:
        """The state of every query (and the string dictionary) as bytes; a query whose
        snapshot fails is failed and left out. `failed` is not part of it: whoever keeps
        the live set keeps which queries failed (the worker's partition snapshot does)."""
        blobs = self._each_engine("snapshot", lambda e: [(e.checked.name, np.frombuffer(
            e.snapshot(with_strings=False), dtype=np.uint8))])
        arrays = {f"e{i}": blob for i, (_, blob) in enumerate(blobs)}
        meta: dict[str, Any] = {"strings": self._strings.strings,
                "engines": [name for name, _ in blobs], "windows": None}
        if self.windows is not None:
            self._window_failpoints("snapshot")
            state = self._window_call("snapshot", lambda w: [w.state()])
            if state:
                window_meta, window_arrays = state[0]
                meta["windows"] = window_meta
                arrays.update({f"w_{k}": v for k, v in window_arrays.items()})
        return snapshot_format.pack_arrays("engines", meta, arrays)

    def restore(self, data: bytes | memoryview) -> None:
        """Put back a snapshot taken from engines with the same queries."""
        meta, arrays = snapshot_format.unpack_arrays("engines", data)
        for s in meta["strings"]:
            self._strings.code(s)
        if self._strings.strings[:len(meta["strings"])] != meta["strings"]:
            raise ValueError("snapshot was taken with another string dictionary")
        by_name = {e.checked.name: e for e in self.engines}
        for i, name in enumerate(meta["engines"]):
            engine = by_name.get(name)
            if engine is None:
                continue  # failed since (while being made again)
            try:
                failpoints.hit(name, "restore")
                engine.restore(arrays[f"e{i}"].tobytes())
            except Exception as e:  # noqa: BLE001
                self._fail(name, "restore", e)
        if meta["windows"] is not None and self.windows is not None:
            self._window_failpoints("restore")
            def load(windows: WindowQuerySet) -> list[None]:
                windows.load_state(meta["windows"], {k[2:]: v for k, v in arrays.items()
                                                     if k.startswith("w_")})
                return []

            self._window_call("restore", load)

    def compact_strings(self, slack: float = 2.0, minimum: int = 4096) -> int:
        """`compact_strings` over every query of the stream. After a look that found most
        strings in use, the next look waits until the dictionary has grown `slack` times
        (asking every engine for its codes costs ~1 ms per thousand keys)."""
        if len(self._strings) < max(minimum, self._compact_at):
            return 0
        dropped = compact_strings(list(self._parts()), self._strings, slack, minimum)
        self._compact_at = slack * len(self._strings)
        return dropped

    def held(self) -> int | None:
        """The smallest seq of a composite event an engine holds back after the last event
        it processed (a MATCH_RECOGNIZE match waiting behind an earlier partial one:
        `held_seq`); None when none is held. A merge releases nothing past it."""
        held = [seq for e in self.engines if hasattr(e, "held_seq")
                for seq in [e.held_seq()] if seq is not None]
        return min(held, default=None)

    def dead_letters(self) -> list[Rejected]:
        """(query, seq, reason) of every event an engine rejected."""
        out = [(e.checked, seq, reason) for e in self.engines for seq, reason in e.dead_letters]
        if self.windows is not None:
            out.extend((self.queries[name], seq, reason) for name in self.windows.names
                       for seq, reason in self.windows.dead_letters(name))
        return out

    def take_dead_letters(self) -> list[Rejected]:
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

    def __init__(self) -> None:
        from numba.core import event

        self._listener = event.TimingListener()  # type: ignore[no-untyped-call]  # numba's

    @property
    def seconds(self) -> float:
        return self._listener.duration if self._listener.done else 0.0


@contextmanager
def compile_timer() -> Iterator[CompileTimer]:
    """`with compile_timer() as t: ...`: `t.seconds` is the time inside the block spent in
    numba compilation (and cache loads), so callers can report processing rates without
    it. Uses numba's documented `numba:compiler_lock` event."""
    from numba.core import event

    timer = CompileTimer()
    with event.install_listener("numba:compiler_lock", timer._listener):
        yield timer


def run(queries: list[CheckedQuery], stream: Iterable[Event | Punctuation],
        batch_size: int = 65536, flush: bool = True, rejected: list[Rejected] | None = None,
        failures: list[QueryFailure] | None = None, **options: Any) -> list[dict[str, Any]]:
    """Every composite event of `queries` over a finite stream, in deterministic order
    (the same list `cep_core.reference.run` gives). Rejected events are appended to
    `rejected` as (query, seq, reason), and the queries that failed (contained: the others
    ran on) to `failures` as QueryFailure. `options` go to `StreamEngines` (`placement`,
    `report` among them)."""
    if not queries:
        return []
    strings = StringDictionary()
    engines = StreamEngines(queries, strings, **options)
    found = run_engines(engines, BatchEncoder(queries[0].schema, strings), stream, batch_size,
                        flush, rejected).to_dicts()
    if failures is not None:
        failures.extend(engines.take_failures())
    return found


def run_table(engines: StreamEngines, encoder: BatchEncoder, table: pa.Table,
              slice_rows: int = 65536, flush: bool = True,
              rejected: list[Rejected] | None = None) -> Composites:
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
                flush: bool = True, rejected: list[Rejected] | None = None) -> Composites:
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
