"""String compaction in the WINDOW engines (WindowEngine, WindowQuerySet), against the
reference interpreter.

The harness compacts the dictionary after every batch with slack 1 (every string the
engines do not report is dropped), so a group key or string min/max held but not
reported, or not remapped, gives a wrong composite event. Also: several WINDOW queries on
one stream compacted through StreamEngines, and a stream whose group keys never come back,
where compaction keeps the dictionary and the group arrays bounded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cep_core import reference
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.stream_engines import StreamEngines
from cep_core.kernels import window_kernels as wk
from cep_core.compiler.window import compile_window
from cep_core.engine.window import RELEASE_AT, WindowEngine
from cep_core.events import Event, Punctuation
from engine_harness import assert_same
from test_engine_window import (SETTINGS, WINDOW_FILES, check, draw_batching, tick_streams,
                                window_example, window_queries)

ROOT = Path(__file__).resolve().parent.parent


def _fresh_keys(stream: list, period: int) -> list:
    """The stream with symbols that change every `period` events and never come back."""
    return [Event(item.seq, item.ts, {**item.attrs,
                                      "symbol": f"{item.attrs['symbol']}{item.seq // period}"})
            if isinstance(item, Event) else item for item in stream]


@st.composite
def streams(draw, max_events: int = 60):
    stream = draw(tick_streams(max_events), label="stream")
    period = draw(st.sampled_from([None, 1, 3, 10]), label="fresh keys every")
    return stream if period is None else _fresh_keys(stream, period)


# Deliberately like tests/test_engine_window.py's random test: the same draw, here with
# compaction after every batch
@SETTINGS
@given(data=st.data())
def test_random_queries_compacted_after_every_batch_equal_the_reference(data):
    checked = check(data.draw(window_queries(), label="query"))
    stream = data.draw(streams(), label="stream")
    sizes, restore_at = draw_batching(data, stream)
    options = data.draw(st.fixed_dictionaries({
        "chunk": st.sampled_from([64, 1 << 16]),
        "rows_capacity": st.sampled_from([1, 256]),
        "groups": st.sampled_from([1, 8]),
        "masked_at": st.sampled_from([1, 4]),
        "release_at": st.sampled_from([1, 64])}), label="options")
    assert_same([checked], stream, sizes=sizes, restore_at=restore_at, compact=True,
                **options)


class _ForgetfulWindowEngine(WindowEngine):
    """Forgets every idle group after each batch, punctuation and flush."""

    def process(self, batch):
        out = super().process(batch)
        self.set.release_idle(force=True)
        return out

    def punctuate(self, ts):
        out = super().punctuate(ts)
        self.set.release_idle(force=True)
        return out


def _forgetful_window_engine(checked, strings, **options):
    return _ForgetfulWindowEngine(compile_window(checked), strings, **options)


@SETTINGS
@given(data=st.data())
def test_random_queries_forgetting_idle_groups_equal_the_reference(data):
    """No compaction: idle groups (and key ids) are forgotten after every step."""
    checked = check(data.draw(window_queries(), label="query"))
    stream = data.draw(streams(), label="stream")
    sizes = tuple(data.draw(st.lists(st.integers(1, 25), min_size=1, max_size=4),
                            label="batch sizes"))
    restore_at = data.draw(st.none() | st.integers(0, 40), label="restore at")
    assert_same([checked], stream, sizes=sizes, restore_at=restore_at,
                factory=_forgetful_window_engine, groups=1, rows_capacity=2)


@pytest.mark.parametrize("path", WINDOW_FILES, ids=lambda p: p.name)
def test_examples_compacted_equal_the_reference(path):
    queries, events = window_example(path)
    out = assert_same(queries, events, sizes=(97, 1, 500), restore_at=len(events) // 2,
                      compact=True)
    assert out


# ---------------------------------------------------------------- the query set


def _run_compacting(queries, stream, sizes, restore_at=None, compact=True, peaks=None,
                    **options):
    """StreamEngines over the stream in batches, compacting its strings after each batch
    and optionally restarting from a snapshot; (output in order, dead letters, engines).
    `peaks` gets the largest dictionary, group capacity, id -> group table and key index
    seen after a batch."""
    strings = StringDictionary()
    engines = StreamEngines(queries, strings, **options)
    encoder = BatchEncoder(queries[0].schema, strings)
    found, position, k = [], 0, 0
    while position < len(stream):
        if isinstance(stream[position], Punctuation):
            found.extend(engines.punctuate(stream[position].ts))
            position += 1
            continue
        chunk = []
        while position < len(stream) and len(chunk) < sizes[k % len(sizes)] and \
                isinstance(stream[position], Event):
            chunk.append(stream[position])
            position += 1
        k += 1
        found.extend(engines.process(encoder.from_events(chunk)))
        if compact:
            engines.compact_strings(slack=1.0, minimum=0)
        _peak(peaks, engines)
        if restore_at is not None and k == restore_at:
            data = engines.snapshot()
            strings = StringDictionary()
            engines = StreamEngines(queries, strings, **options)
            encoder = BatchEncoder(queries[0].schema, strings)
            engines.restore(data)
    found.extend(engines.flush())
    dead = sorted((q.name, seq, reason) for q, seq, reason in engines.dead_letters())
    return engines.order(found), dead, engines


def _peak(peaks: dict | None, engines: StreamEngines) -> None:
    if peaks is None:
        return
    windows = engines.windows
    sizes = {"strings": len(engines._strings),
             "groups": max(q.lastpane.shape[0] for q in windows.queries.values()),
             "loc": max(q.loc.shape[0] for q in windows.queries.values()),
             "index": max([len(g.index) for g in windows.groupings.values()
                           if g.index is not None] or [0])}
    for name, size in sizes.items():
        peaks[name] = max(peaks.get(name, 0), size)


def _reference(queries, stream):
    rejected: list = []
    out = reference.run(queries, stream, rejected=rejected)
    return out, sorted((q.name, e.seq, reason) for q, e, reason in rejected)


@SETTINGS
@given(data=st.data())
def test_query_set_compacted_through_stream_engines_equals_the_reference(data):
    queries = [check(data.draw(window_queries(f"q{i}"), label=f"q{i}")) for i in range(4)]
    for q in queries:  # reference.run orders by the query's place in the list
        q.index = queries.index(q)
    stream = data.draw(streams(80), label="stream")
    sizes = data.draw(st.lists(st.integers(1, 15), min_size=1, max_size=3), label="sizes")
    restore_at = data.draw(st.none() | st.integers(1, 8), label="restore after batch")
    options = {"chunk": 64, "rows_capacity": 2, "groups": 1,
               "masked_at": data.draw(st.sampled_from([1, 2, 4]), label="masked at")}
    expected, expected_dead = _reference(queries, stream)
    got, dead, _ = _run_compacting(queries, stream, sizes, restore_at, **options)
    assert got == expected
    assert dead == expected_dead


# ---------------------------------------------------------------- keys that never come back

BOUNDED = [
    "QUERY by_symbol SELECT symbol, count(*) AS n, min(symbol) AS lo, max(price) AS hi "
    "FROM ticks [RANGE 300 ms SLIDE 100 ms] WHERE symbol != 'K7' GROUP BY symbol",
    "QUERY by_pair SELECT symbol, volume, max(symbol) AS top, sum(price) AS total "
    "FROM ticks [RANGE 200 ms SLIDE 100 ms] GROUP BY symbol, volume",
    "QUERY overall SELECT count(*) AS n, max(symbol) AS top FROM ticks [ROWS 40 SLIDE 20]",
]


def _ticks_with_new_keys(count: int) -> list:
    """Ten events every 10 ms, a new symbol every 5 events: no symbol comes back."""
    return [Event(seq, 10 * (seq // 10), {"symbol": f"K{seq // 5}", "price": float(seq % 7),
                                          "volume": seq % 3, "time": 10 * (seq // 10)})
            for seq in range(count)]


def test_compaction_keeps_strings_and_groups_bounded_when_keys_never_come_back():
    queries = [check(text) for text in BOUNDED]
    for number, q in enumerate(queries):
        q.index = number
    stream = _ticks_with_new_keys(6000)  # 1200 symbols; a 300 ms window sees 60 of them
    peaks: dict = {}
    got, dead, _ = _run_compacting(queries, stream, sizes=[50, 7, 200], peaks=peaks)
    expected, expected_dead = _reference(queries, stream)
    assert got == expected and dead == expected_dead
    # Held after a compaction: the symbols of the panes of unreleased windows (about 60).
    bound = 150
    assert peaks["strings"] < bound
    assert max(peaks["groups"], peaks["loc"], peaks["index"]) < 400
    # Without compaction the dictionary holds every symbol ever seen.
    control: dict = {}
    _run_compacting(queries, stream, sizes=[50, 7, 200], compact=False, peaks=control)
    assert control["strings"] >= 1200 > bound
    assert control["loc"] >= 1200


def test_idle_groups_are_forgotten_between_compactions():
    """Groups with no data in an unreleased window are dropped as they pile up, even with
    no compaction: the group arrays and the key ids stay bounded, the output equals the
    reference."""
    queries = [check(BOUNDED[0]), check(BOUNDED[1])]
    for number, q in enumerate(queries):
        q.index = number
    stream = _ticks_with_new_keys(4000)  # 800 symbols, 1,600 (symbol, volume) pairs
    got, dead, engines = _run_compacting(queries, stream, sizes=[40], compact=False)
    expected, expected_dead = _reference(queries, stream)
    assert got == expected and dead == expected_dead
    for query in engines.windows.queries.values():
        assert int(query.st[wk.ST_NG]) <= 2 * RELEASE_AT + 100
        assert query.lastpane.shape[0] <= 512
    assert len(engines.windows.groupings[("symbol", "volume")].index) <= 512
