"""The jitted WINDOW engine against the reference interpreter (cep_core/reference/window.py).

Differential tests: random WINDOW queries (time windows with random RANGE/SLIDE, ROWS
windows, WATTR on a non-time attribute, random WHERE trees, optional GROUP BY, random
aggregates) over random tick streams (few symbols, mostly non-decreasing time with late
events, punctuations) in batches of random sizes, with a snapshot/restore in the middle;
a WindowQuerySet running several queries at once, with queries added, updated and removed
between batches; the example query files on their sample data; exact float sums.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep_core import reference
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_queries, load_query_text
from cep_core.composite import sort_key
from cep_core.engine_factory import create_engine
from cep_core.compiler.window import compile_window
from cep_core.engine.window import WindowEngine, WindowQuerySet
from cep_core.kernels.window_kernels import exact_sum, mask_rows, table_bits
from cep_core.event_io import read_events
from cep_core.events import Event, Punctuation
from engine_harness import assert_same

ROOT = Path(__file__).resolve().parent.parent
# CEP_WINDOW_EXAMPLES=500 runs a longer search.
SETTINGS = settings(max_examples=int(os.environ.get("CEP_WINDOW_EXAMPLES", 40)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---------------------------------------------------------------- generators

SYMBOLS = ["A", "B", "C", "AB", "a"]
PRICES = [0.1, 0.2, 0.3, 1.5, 2.675, 10.0, 99.99, 1e16, -1e16, -3.25, 0.0, 1e-3, 7.0]


@st.composite
def comparisons(draw):
    kind = draw(st.integers(0, 9))
    symbols = st.sampled_from(SYMBOLS)
    op = draw(st.sampled_from(["=", "!=", "<", "<=", ">", ">="]))
    # Deliberately like each other, the branches below: one filter shape each, drawn by kind
    if kind == 0:
        chosen = draw(st.lists(symbols, min_size=1, max_size=3))
        negated = draw(st.booleans())
        return (f"symbol {'NOT ' if negated else ''}IN ("
                + ", ".join(f"'{s}'" for s in chosen) + ")")
    if kind == 1:
        return f"symbol {op} '{draw(symbols)}'"
    if kind == 2:
        return f"price {op} {draw(st.sampled_from([0.2, 1.5, 10.0, -1.0, 50.5]))}"
    if kind == 3:
        return f"volume {op} {draw(st.integers(0, 500))}"
    if kind == 4:
        return f"volume IN ({draw(st.integers(0, 9)) * 50}, {draw(st.integers(0, 9)) * 50})"
    if kind == 5:
        return f"price * 2 {op} volume"
    if kind == 6:
        return f"lower(symbol) = '{draw(st.sampled_from(['a', 'b', 'ab']))}'"
    if kind == 7:
        return f"length(symbol) {op} {draw(st.integers(0, 2))}"
    if kind == 8:
        return f"time % {draw(st.integers(2, 5))} = 0"
    return f"volume / 100 {op} {draw(st.sampled_from([1, 2.5]))}"


def conditions(depth: int = 3):
    leaf = comparisons()
    if depth == 0:
        return leaf

    @st.composite
    def tree(draw):
        kind = draw(st.integers(0, 4))
        if kind <= 1:
            return draw(leaf)
        if kind == 2:
            return f"NOT ({draw(conditions(depth - 1))})"
        op = "AND" if kind == 3 else "OR"
        return f"({draw(conditions(depth - 1))}) {op} ({draw(conditions(depth - 1))})"

    return tree()


AGGREGATES = ["count(*)", "count(price)", "count(symbol)", "sum(price)", "sum(volume)",
              "avg(price)", "avg(volume)", "min(price)", "max(price)", "min(volume)",
              "max(volume)", "min(symbol)", "max(symbol)", "max(time)", "min(time)"]


@st.composite
def window_queries(draw, name: str = "w"):
    rows = draw(st.integers(0, 3)) == 0
    if rows:
        slide = draw(st.integers(1, 4))
        window = f"[ROWS {slide * draw(st.integers(1, 4))} SLIDE {slide}]"
        window_attr = None
    else:
        slide = draw(st.sampled_from([50, 100, 250, 1000]))
        panes = draw(st.integers(1, 5))
        window_attr = draw(st.sampled_from([None, "time", "time", "volume"]))
        wattr = f" WATTR {window_attr}" if window_attr else ""
        window = f"[RANGE {slide * panes} ms SLIDE {slide} ms{wattr}]"
        window_attr = window_attr or "time"
    group = draw(st.sampled_from([[], [], ["symbol"], ["volume"], ["symbol", "volume"],
                                  ["price"]]))
    items = [f"{a} AS a{i}" for i, a in enumerate(
        draw(st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=4)))]
    extra = list(group)
    if window_attr is not None and window_attr not in group and draw(st.booleans()):
        extra.append(window_attr)
    select = ", ".join(draw(st.permutations(extra + items)))
    where = f" WHERE {draw(conditions())}" if draw(st.integers(0, 4)) else ""
    group_by = f" GROUP BY {', '.join(group)}" if group else ""
    return f"QUERY {name} SELECT {select} FROM ticks {window}{where}{group_by}"


@st.composite
def tick_streams(draw, max_events: int = 60):
    n = draw(st.integers(0, max_events))
    t = draw(st.sampled_from([0, 10, -1000, 1_330_612_200_000]))
    items: list = []
    for seq in range(n):
        step = draw(st.sampled_from([0, 0, 7, 25, 50, 100, 120, 400, 1300, -60, -300]))
        t += step
        if draw(st.integers(0, 9)) == 0:
            items.append(Punctuation(t + draw(st.sampled_from([-500, -50, 0, 49, 260, 2000]))))
        items.append(Event(seq, t, {"symbol": draw(st.sampled_from(SYMBOLS)),
                                    "price": draw(st.sampled_from(PRICES)),
                                    "volume": draw(st.integers(0, 9)) * 50 + draw(
                                        st.sampled_from([0, 0, 1, 30])),
                                    "time": t}))
    return items


def check(text: str):
    (checked,) = load_query_text(text)
    return checked


def draw_batching(data, stream: list) -> tuple[tuple[int, ...], int | None]:
    """Batch sizes to feed `stream` in, and the event count to snapshot and restore at."""
    events = sum(isinstance(item, Event) for item in stream)
    sizes = tuple(data.draw(st.lists(st.integers(1, 25), min_size=1, max_size=4),
                            label="batch sizes"))
    restore_at = data.draw(st.none() | st.integers(0, max(events, 0)), label="restore at")
    return sizes, restore_at


# ---------------------------------------------------------------- one query


# Deliberately like tests/test_compact_window.py's random test: the same draw, there with
# compaction after every batch
@SETTINGS
@given(data=st.data())
def test_random_queries_equal_the_reference(data):
    checked = check(data.draw(window_queries(), label="query"))
    stream = data.draw(tick_streams(), label="stream")
    sizes, restore_at = draw_batching(data, stream)
    options = data.draw(st.fixed_dictionaries({
        "chunk": st.sampled_from([64, 128, 1 << 16]),
        "rows_capacity": st.sampled_from([1, 2, 256]),  # small: the kernel stops and resumes
        "groups": st.sampled_from([1, 8]),
        "masked_at": st.sampled_from([1, 4])}), label="options")
    assert_same([checked], stream, sizes=sizes, restore_at=restore_at, **options)


def test_create_engine_builds_the_window_engine():
    checked = check("QUERY w SELECT count(*) FROM ticks [RANGE 1 minute SLIDE 1 minute]")
    engine = create_engine(checked, StringDictionary(), algorithm="ignored")
    assert isinstance(engine, WindowEngine)


def test_late_events_and_punctuation_like_the_reference():
    checked = check("QUERY w SELECT symbol, max(price) AS hi, count(*) AS n, sum(price) AS s "
                    "FROM ticks [RANGE 300 ms SLIDE 100 ms] WHERE volume > 10 GROUP BY symbol")
    stream = [Event(0, 50, {"symbol": "A", "price": 1.0, "volume": 20, "time": 50}),
              Event(1, 250, {"symbol": "B", "price": 2.0, "volume": 20, "time": 250}),
              Event(2, 210, {"symbol": "A", "price": 3.0, "volume": 20, "time": 210}),
              Event(3, 60, {"symbol": "A", "price": 4.0, "volume": 20, "time": 60}),
              Event(4, 60, {"symbol": "A", "price": 4.0, "volume": 5, "time": 60}),
              Punctuation(420),
              Event(5, 301, {"symbol": "A", "price": 5.0, "volume": 20, "time": 301}),
              Event(6, 1000, {"symbol": "B", "price": 6.0, "volume": 20, "time": 1000})]
    for sizes in [(1,), (2,), (10,)]:
        out = assert_same([checked], stream, sizes=sizes, restore_at=3)
        assert out
    rejected: list = []
    reference.run([checked], stream, rejected=rejected)
    assert [e.seq for _, e, _ in rejected] == [3, 5]


def test_float_sums_are_exact_and_order_free():
    # 1e16 + 1.0 + 1.0 - 1e16: left to right gives 0.0 (or 2.0 pane-wise); exact is 2.0.
    checked = check("QUERY w SELECT sum(price) AS s, avg(price) AS m "
                    "FROM ticks [RANGE 200 ms SLIDE 100 ms]")
    prices = [1e16, 1.0, 1.0, -1e16, 0.1, 0.2, 0.3]
    times = [10, 20, 30, 40, 150, 160, 170]  # window (-100, 100] holds the first four
    stream = [Event(i, t, {"symbol": "A", "price": p, "volume": 1, "time": t})
              for i, (t, p) in enumerate(zip(times, prices))]
    out = assert_same([checked], stream, sizes=(1, 3))
    assert {"s": 2.0, "m": 0.5} in [{"s": r["s"], "m": r["m"]} for r in out]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), max_size=30))
def test_exact_sum_is_fsum(values):
    try:
        expected = math.fsum(values)
    except OverflowError:
        return
    assert exact_sum(np.array(values, dtype=np.float64)) == expected


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 150), st.integers(1, 300), st.integers(0, 2 ** 32 - 1))
def test_mask_rows_equals_per_predicate_tables(predicates, events, seed):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 7, events).astype(np.int64)
    tables = rng.integers(0, 2, (predicates, 7)).astype(np.uint8)
    words = (events + 63) >> 6
    expected = np.zeros((predicates, words), dtype=np.uint64)
    for p in range(predicates):
        table_bits(expected[p], tables[p], codes)
    masks = np.zeros((7, (predicates + 63) >> 6), dtype=np.uint64)
    for p in range(predicates):
        masks[:, p >> 6] |= tables[p].astype(np.uint64) << np.uint64(p & 63)
    rows = rng.permutation(predicates).astype(np.int64)  # any row order
    got = np.full((predicates, words), 7, dtype=np.uint64)
    mask_rows(got, rows, masks, codes)
    assert (got[rows] == expected).all()


# ---------------------------------------------------------------- the query set


def _reference(checked, items, flush=True):
    rejected: list = []
    out = reference.run([checked], items, flush=flush, rejected=rejected)
    return out, sorted((e.seq, reason) for _, e, reason in rejected)


def _split(stream, sizes):
    """The stream as a schedule of steps: lists of events (batches) and punctuations."""
    steps, position, k = [], 0, 0
    while position < len(stream):
        if isinstance(stream[position], Punctuation):
            steps.append(stream[position])
            position += 1
            continue
        size = sizes[k % len(sizes)]
        k += 1
        chunk = []
        while position < len(stream) and len(chunk) < size and \
                isinstance(stream[position], Event):
            chunk.append(stream[position])
            position += 1
        steps.append(chunk)
    return steps


def _items(steps):
    for step in steps:
        if isinstance(step, Punctuation):
            yield step
        else:
            yield from step


@SETTINGS
@given(data=st.data())
def test_query_set_equals_each_query_alone_across_changes(data):
    texts = [data.draw(window_queries(f"q{i}"), label=f"q{i}") for i in range(4)]
    queries = {c.name: c for c in map(check, texts)}
    # Share predicates for real: q3 reuses q0's WHERE when it has one.
    base = queries["q0"].query.body.where
    stream = data.draw(tick_streams(80), label="stream")
    steps = _split(stream, data.draw(st.lists(st.integers(1, 15), min_size=1, max_size=3),
                                     label="sizes"))
    change_at = data.draw(st.integers(0, len(steps)), label="change at")
    update_text = data.draw(window_queries("q1"), label="q1 v2")
    restore_at = data.draw(st.integers(0, len(steps)), label="restore at")
    if base is not None and data.draw(st.booleans(), label="share"):
        queries["q3"].query.body.where = base

    strings = StringDictionary()
    encoder = BatchEncoder(queries["q0"].schema, strings)
    options = {"chunk": 64, "rows_capacity": 2, "groups": 1,
               "masked_at": data.draw(st.sampled_from([1, 2, 4]), label="masked at")}
    qset = WindowQuerySet(queries["q0"].schema, strings, **options)
    for name in ("q0", "q1", "q3"):
        qset.add(compile_window(queries[name]))
    got: dict[str, list] = {name: [] for name in queries}
    got["q1v2"] = []
    updated = check(update_text)

    def collect(rows, q1_version):
        for row in rows:
            name = row["query"]
            if name == "q1" and q1_version == 2:
                name = "q1v2"
            got[name].append(row)

    version = 1
    for number, step in enumerate(steps):
        if number == change_at:  # add q2, update q1, remove q3
            qset.add(compile_window(queries["q2"]))
            qset.update(compile_window(updated))
            version = 2
            qset.remove("q3")
        if number == restore_at:
            meta, arrays = qset.state()
            dead = {name: list(qset.dead_letters(name)) for name in qset.names}
            strings = StringDictionary(list(strings.strings))
            encoder = BatchEncoder(queries["q0"].schema, strings)
            fresh = WindowQuerySet(queries["q0"].schema, strings, **options)
            for name in qset.names:
                fresh.add(compile_window(qset.queries[name].checked))
            fresh.load_state(meta, arrays)
            for name in qset.names:
                assert fresh.dead_letters(name) == dead[name]
            qset = fresh
        if isinstance(step, Punctuation):
            collect(qset.punctuate(step.ts), version)
        else:
            collect(qset.process(encoder.from_events(step)), version)
    if change_at >= len(steps):
        qset.add(compile_window(queries["q2"]))
        qset.update(compile_window(updated))
        version = 2
        qset.remove("q3")
    collect(qset.flush(), version)

    before, after = steps[:change_at], steps[change_at:]
    expected = {
        "q0": _reference(queries["q0"], list(_items(steps))),
        "q1": _reference(queries["q1"], list(_items(before)), flush=False),
        "q1v2": _reference(updated, list(_items(after))),
        "q2": _reference(queries["q2"], list(_items(after))),
        "q3": _reference(queries["q3"], list(_items(before)), flush=False),
    }
    for name, (rows, _) in expected.items():
        index = 0
        mine = sorted(got[name], key=lambda c: sort_key(c, index))
        assert mine == rows, name
    assert sorted(qset.dead_letters("q0")) == expected["q0"][1]
    assert sorted(qset.dead_letters("q2")) == expected["q2"][1]
    assert sorted(qset.dead_letters("q1")) == expected["q1v2"][1]


def test_query_set_shares_predicates():
    strings = StringDictionary()
    texts = [f"QUERY q{i} SELECT max(price) AS hi, time FROM ticks "
             f"[RANGE 4 minutes SLIDE 1 minute WATTR time] "
             f"WHERE symbol IN ('A', 'B') AND (volume > {100 * (i % 3)} OR price < 10) "
             f"GROUP BY symbol" for i in range(6)]
    queries = [check(t) for t in texts]
    qset = WindowQuerySet(queries[0].schema, strings)
    for q in queries:
        qset.add(compile_window(q))
    # one IN predicate for all, three distinct ORs; the ORs share one compiled kernel
    assert len(qset.predicates) == 4
    kernels = {id(p.compiled.kernel) for p in qset.predicates.values()
               if p.compiled.dense is None}
    assert len(kernels) == 1
    qset.remove("q0")
    assert len(qset.predicates) == 4
    qset.remove("q3")
    assert len(qset.predicates) == 3


# ---------------------------------------------------------------- examples


WINDOW_FILES = [p for p in sorted((ROOT / "examples").glob("*.cep"))
                if any(q.query.kind == "window" for q in load_queries(p))]


def window_example(path: Path) -> tuple[list, list]:
    """The WINDOW queries of an example file, and the events of its stream's sample data."""
    queries = [q for q in load_queries(path) if q.query.kind == "window"]
    schema = queries[0].schema
    events, _ = read_events(ROOT / "examples" / "data" / f"{schema.stream}.jsonl", schema)
    return queries, events


@pytest.mark.parametrize("path", WINDOW_FILES, ids=lambda p: p.name)
def test_examples_equal_the_reference(path):
    queries, events = window_example(path)
    out = assert_same(queries, events, sizes=(97, 1, 500), restore_at=len(events) // 2)
    assert out
