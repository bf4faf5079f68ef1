"""Unit-testing queries without a broker: a query text and a few events as dicts in, the
composite events as dicts out (docs/python.md, "Testing queries"; examples/test_my_queries.py).

    from cep_core.testing import run_query, assert_engines_agree

    def test_big_trade():
        found = run_query("QUERY big FROM trades INTO big PATTERN (b) "
                          "DEFINE b AS volume > 1000 EMIT symbol = symbol;", [
            {"symbol": "IBM", "price": 100, "volume": 5000, "ts": 0, "seqNum": 0}])
        assert [c["symbol"] for c in found] == ["IBM"]

`QueryDriver` drives queries step by step with explicit time, as Kafka Streams'
TopologyTestDriver does: `push(events)`, `advance_time(ts)` (a punctuation) and `end()`
each return the composite events that step released; `snapshot()`/`restore()` in between.
`assert_steps_agree` runs steps through the jitted engines and the reference interpreter
and checks that every step gives the same composite events.
"""

from __future__ import annotations

# Deferred imports: the reference interpreter and the reader of its Events load only for a
# QueryDriver on the reference engine (a jit driver never imports them).

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from cep_core.api import QuerySet, Stream, compile, read_batch
from cep_core.event_io import DeadLetter
from cep_core.runner import EngineName
from cep_core.time_guard import TimeGuard, wall_clock_units

if TYPE_CHECKING:
    from cep_core.composites import Composites
    from cep_core.reference import Interpreter

__all__ = ["QueryDriver", "assert_engines_agree", "assert_steps_agree", "run_query"]


def _queries(text: str | QuerySet, schema: Any) -> QuerySet:
    return text if isinstance(text, QuerySet) else compile(text, schema)


def run_query(text: str | QuerySet, events: Iterable[dict[str, Any]], schema: Any = None, *,
              engine: str = EngineName.JIT, dead_letters: list[DeadLetter] | None = None,
              ) -> list[dict[str, Any]]:
    """The composite events of the queries of `text` over `events`, as dicts in output
    order (what `cep run` writes as JSON lines). `schema` as `cep.compile` takes it (None:
    the built-in streams). An event's `seq` is its index in the list unless it has one.
    Records that are not valid events and events an engine rejected are appended to
    `dead_letters` when given (else they are ignored)."""
    result = _queries(text, schema).run(list(events), engine=engine)
    if dead_letters is not None:
        dead_letters.extend(result.dead_letters)
    return result.to_dicts()


def assert_engines_agree(text: str | QuerySet, events: Iterable[dict[str, Any]],
                         schema: Any = None) -> list[dict[str, Any]]:
    """Assert that the jitted engine gives exactly the composite events and dead letters of
    the reference interpreter (the oracle) over `events`; returns the composites."""
    queries = _queries(text, schema)
    rows = list(events)
    jit = queries.run(rows, engine=EngineName.JIT)
    reference = queries.run(rows, engine=EngineName.REFERENCE)
    expected, got = reference.to_dicts(), jit.to_dicts()
    if got != expected:
        raise AssertionError(_difference("", expected, got))
    expected_dead = [d.to_json() for d in reference.dead_letters]
    got_dead = [d.to_json() for d in jit.dead_letters]
    if got_dead != expected_dead:
        raise AssertionError(f"dead letters differ:\n  reference: {expected_dead}\n"
                             f"  jit:       {got_dead}")
    return got


def _difference(where: str, expected: list[dict[str, Any]], got: list[dict[str, Any]]) -> str:
    """How the jit engines' composites differ from the reference's: counts and the first
    composite that differs."""
    first = next((k for k, (a, b) in enumerate(zip(expected, got)) if a != b),
                 min(len(expected), len(got)))
    return (f"{where}jit gives {len(got)} composite events, the reference {len(expected)}; "
            f"first difference at #{first}:\n  reference: {_at(expected, first)}\n"
            f"  jit:       {_at(got, first)}")


def _at(rows: list[dict[str, Any]], i: int) -> str:
    return repr(rows[i]) if i < len(rows) else "(none)"


class QueryDriver:
    """Queries driven step by step with explicit time, no broker and no wall clock:

        driver = QueryDriver(text, schema)
        driver.push([...])         # events: the composite events they released
        driver.advance_time(5000)  # event time reaches 5000: windows, WITHIN, time-outs
        driver.end()               # end of input: what was still pending

    Each step returns its composite events as dicts in output order (what `cep run`
    writes); `output` holds every step's. `push` takes what `QuerySet.run` takes (dicts,
    one dict, a pyarrow Table, a DataFrame, a file); an event's `seq` is its position in
    all the input pushed so far unless it has one, and seqs must keep increasing. Bad
    records and events an engine rejected collect in `dead_letters`.

    `engine="jit"` (the default) runs the numba kernels of `cep run --engine jit` and the
    service (`QuerySet.stream()`), `engine="reference"` the reference interpreter; over
    the same steps both give the same composite events at every step (`assert_steps_agree`).
    `snapshot()` is the state as bytes, `restore(data)` puts it into a fresh driver of the
    same queries and engine (jit: a `Stream` snapshot; reference: the input so far, which
    `restore` replays)."""

    def __init__(self, queries: str | QuerySet, schema: Any = None, *, engine: str = EngineName.JIT,
                 placement: str | None = None) -> None:
        self.engine = EngineName.of(engine)
        self.queries = _queries(queries, schema)
        self._stream: Stream | _ReferenceStream = Stream(self.queries, placement) \
            if self.engine is EngineName.JIT else _ReferenceStream(self.queries)
        self.output: list[dict[str, Any]] = []  # every step's composite events, step after step
        self.time: int | None = None  # the last advance_time
        self.ended = False

    def push(self, events: Any, fmt: str | None = None) -> list[dict[str, Any]]:
        """Run events (anything `QuerySet.run` takes, or one dict); the composite events
        they released."""
        self._open("push")
        if isinstance(events, Mapping):
            events = [events]
        return self._step(self._stream._push(events, fmt))

    def advance_time(self, ts: int) -> list[dict[str, Any]]:
        """A punctuation: event time reaches `ts` (an int in the stream's time unit) with
        no event. The composite events that releases: windows that end before it, SEQ
        matches whose WITHIN it passes (negations decided, partial matches timed out)."""
        self._open("advance_time")
        self.time = int(ts)
        return self._step(self._stream._advance_time(self.time))

    def end(self) -> list[dict[str, Any]]:
        """The end of input (`cep run` at the end of its file): what was still pending.
        The driver takes no step after it."""
        self._open("end")
        self.ended = True
        return self._step(self._stream._flush())

    @property
    def dead_letters(self) -> list[DeadLetter]:
        """Records that are not valid events and events an engine rejected, so far."""
        return self._stream.dead_letters

    def take_dead_letters(self) -> list[DeadLetter]:
        """`dead_letters`, then forgotten."""
        return self._stream.take_dead_letters()

    def snapshot(self) -> bytes:
        """The engines' state (not `output` nor `dead_letters`) as bytes."""
        return self._stream.snapshot()

    def restore(self, data: bytes) -> None:
        """Put back a `snapshot()` of a driver of the same queries and engine; this driver
        must be fresh (no step taken yet)."""
        if self.output or self.dead_letters or self.time is not None or self.ended \
                or self._stream._position:
            raise ValueError("restore into a fresh QueryDriver (this one took steps)")
        self._stream.restore(data)

    def _open(self, step: str) -> None:
        if self.ended:
            raise ValueError(f"{step}() after end(): the input has ended")

    def _step(self, composites: Composites) -> list[dict[str, Any]]:
        found = composites.to_dicts()
        self.output.extend(found)
        return found

    def __repr__(self) -> str:
        return (f"QueryDriver({', '.join(self.queries.names)}, engine={self.engine}, "
                f"{len(self.output)} composite events)")


_REFERENCE_SNAPSHOT = "cep_reference_driver"


class _ReferenceStream:
    """`Stream`'s steps on the reference interpreter (one per query), reading batches as
    `Stream` reads them. Its snapshot is the input so far (events and punctuations), which
    `restore` replays into fresh interpreters."""

    def __init__(self, queries: QuerySet) -> None:
        from cep_core.reference import interpreter_for

        self.queries = queries
        self.schema = queries.schema
        self._interpreters = [(q, interpreter_for(q)) for q in queries.queries]
        self._position = 0
        self._last_seq = -1
        self._guard = TimeGuard.of(self.schema)  # events too far ahead (as Stream's)
        self._log: list[Any] = []  # [seq, ts, attrs] per event, ts per punctuation (JSON)
        self.dead_letters: list[DeadLetter] = []

    def _push(self, data: Any, fmt: str | None = None) -> Composites:
        from cep_core.event_reader import events_from_table

        if self._guard.ahead_of_clock is not None:  # the wall clock of this push, as Stream
            self._guard.now = wall_clock_units(self.schema.time_unit)
        table, dead, self._position, self._last_seq = read_batch(
            data, self.schema, fmt, self._position, self._last_seq, self._guard)
        self.dead_letters.extend(dead)
        events = events_from_table(table, self.schema)
        self._log.extend([e.seq, e.ts, e.attrs] for e in events)
        return self._each(lambda interp: [c for e in events for c in interp.process(e)])

    def _advance_time(self, ts: int) -> Composites:
        self._guard.advance(int(ts))
        self._log.append(ts)
        return self._each(lambda interp: interp.punctuate(ts))

    def _flush(self) -> Composites:
        return self._each(lambda interp: interp.flush())

    def _each(self, step: Callable[[Interpreter], list[dict[str, Any]]]) -> Composites:
        from cep_core.composite import sort_key
        from cep_core.composites import Composites

        found: list[tuple[tuple[int, int, list[int], int, bytes], dict[str, Any]]] = []
        for q, interp in self._interpreters:
            found.extend((sort_key(c, q.index), c) for c in step(interp))
            self.dead_letters.extend(
                DeadLetter(f"query {q.name}", event.seq, orjson.dumps(event.to_json()), reason)
                for event, reason in interp.dead_letters)
            interp.dead_letters.clear()
        found.sort(key=lambda pair: pair[0])
        return Composites.from_dicts([c for _, c in found])

    def take_dead_letters(self) -> list[DeadLetter]:
        taken, self.dead_letters = self.dead_letters, []
        return taken

    def snapshot(self) -> bytes:
        return orjson.dumps({_REFERENCE_SNAPSHOT: 1, "queries": self.queries.names,
                             "position": self._position, "last_seq": self._last_seq,
                             "log": self._log})

    def restore(self, data: bytes) -> None:
        from cep_core.events import Event

        try:
            state = orjson.loads(data)
        except orjson.JSONDecodeError:
            state = None
        if not isinstance(state, dict) or state.get(_REFERENCE_SNAPSHOT) != 1:
            raise ValueError("not a snapshot of a QueryDriver on the reference engine "
                             "(a jit driver's snapshot restores only into a jit driver)")
        if state["queries"] != self.queries.names:
            raise ValueError(f"the snapshot is of queries {state['queries']}, this driver "
                             f"runs {self.queries.names}")
        log = [Event(*item) if isinstance(item, list) else item for item in state["log"]]
        for _, interp in self._interpreters:  # what they release now was released before
            for item in log:
                interp.process(item) if isinstance(item, Event) else interp.punctuate(item)
            interp.dead_letters.clear()  # the snapshot's driver had them
        self._log = state["log"]
        self._position, self._last_seq = state["position"], state["last_seq"]


def assert_steps_agree(text: str | QuerySet, steps: Iterable[tuple[Any, ...]], schema: Any = None
                       ) -> list[list[dict[str, Any]]]:
    """Run `steps` through a jit QueryDriver and a reference one and assert that each step
    gives the same composite events and dead letters. A step is `("push", events)`,
    `("advance_time", ts)` or `("end",)`. Returns the composite events of each step."""
    queries = _queries(text, schema)
    jit, reference = QueryDriver(queries), QueryDriver(queries, engine="reference")
    out: list[list[dict[str, Any]]] = []
    for i, (name, *args) in enumerate(steps):
        if name not in ("push", "advance_time", "end"):
            raise ValueError(f"step #{i}: {name!r} is not push, advance_time nor end")
        expected: list[dict[str, Any]] = getattr(reference, name)(*args)
        got: list[dict[str, Any]] = getattr(jit, name)(*args)
        if got != expected:
            raise AssertionError(_difference(f"step #{i} ({name}): ", expected, got))
        expected_dead = _letters(reference.take_dead_letters())
        got_dead = _letters(jit.take_dead_letters())
        if got_dead != expected_dead:
            raise AssertionError(f"step #{i} ({name}): dead letters differ:\n  reference: "
                                 f"{expected_dead}\n  jit:       {got_dead}")
        out.append(got)
    return out


def _letters(letters: list[DeadLetter]) -> list[dict[str, Any]]:
    """Dead letters in one order whichever engine gave them (engines report query by
    query, in their own order)."""
    return sorted((d.to_json() for d in letters),
                  key=lambda d: (d.get("position", -1), d.get("source", ""), d.get("reason")))
