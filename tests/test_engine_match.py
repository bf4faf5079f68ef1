"""The jitted MATCH engine against the reference interpreter (tests/engine_harness.py):
identical composite events and rejected events, whatever the batch sizes, across a
snapshot/restore in the middle of the stream.

- every MATCH query of examples/*.cep on its sample data;
- random queries (a small query generator: regexes over 1-4 predicates, comparisons with
  constants, aggregates at positions that cannot start a match, random EMIT) on random
  streams (2-3 symbols, small value ranges, event time that sometimes goes backwards);
- the engine's own machinery: growing every array, the Collect log, key ids beyond a
  lookup table, idle-key eviction, the 63-position limit.

Each random query compiles one kernel (about a second; numba caches it on disk), so each
example runs its query on several streams.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cep_core import regex_analysis as ra
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_queries, load_query_text
from cep_core.compiler.match import compile_match
from cep_core.engine_factory import match_engine
from cep_core.errors import QueryErrors
from cep_core.event_io import read_events
from cep_core.events import Event, Punctuation
from cep_core.schema import SchemaRegistry, StreamSchema
from tests.engine_harness import assert_same, jit_run, new_shapes, reference_run

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# A stream with every attribute type, for the random queries.
MIXED = StreamSchema("mixed", {"symbol": "string", "price": "int", "volume": "int",
                               "ratio": "float", "flag": "bool", "ts": "timestamp"}, "ts")


def registry() -> SchemaRegistry:
    reg = SchemaRegistry()
    reg.add(MIXED)
    return reg


def query(text: str):
    return load_query_text(text, registry())


def events(rows: list[dict]) -> list[Event]:
    return [Event(seq, row["ts"], dict(row)) for seq, row in enumerate(rows)]


# ---------------------------------------------------------------- examples


def _example_cases():
    for path in sorted(EXAMPLES.glob("*.cep")):
        queries = [q for q in load_queries(path) if q.query.kind == "match"]
        if queries:
            yield pytest.param(path, queries, id=path.name)


@pytest.mark.parametrize(("path", "queries"), list(_example_cases()))
@pytest.mark.parametrize("sizes", [(1,), (7, 1, 30), (100_000,)])
def test_examples_equal_the_reference(path, queries, sizes):
    stream, _dead = read_events(EXAMPLES / "data" / f"{queries[0].schema.stream}.jsonl",
                                queries[0].schema)
    got = assert_same(queries, stream, sizes=sizes, restore_at=len(stream) // 2)
    assert got, f"{path.name}: no composite events on the sample data"


# ---------------------------------------------------------------- random queries

NAMES = ["p0", "p1", "p2", "p3"]
SYMBOLS = ["A", "B", "C"]


@st.composite
def regexes(draw, names: list[str], depth: int = 0):
    """Regex text over `names` and `.`."""
    leaf = st.sampled_from(names + ["."])
    if depth >= 3:
        return draw(leaf)
    kind = draw(st.sampled_from(["leaf", "leaf", "cat", "alt", "rep", "rep"]))
    if kind == "leaf":
        return draw(leaf)
    if kind == "rep":
        item = draw(regexes(names, depth + 1))
        ops = draw(st.lists(st.sampled_from("*+?"), min_size=1, max_size=2))
        return f"({item}){''.join(ops)}"
    parts = draw(st.lists(regexes(names, depth + 1), min_size=2, max_size=3))
    return " ".join(f"({p})" for p in parts) if kind == "cat" else \
        " | ".join(f"({p})" for p in parts)


STATIC_PREDICATES = [
    "price > {n}", "price <= {n}", "price = {n}", "volume >= {n}", "volume != {n}",
    "symbol = '{s}'", "symbol != '{s}'", "symbol IN ('{s}', 'C')", "symbol > '{s}'",
    "price % 2 = 0", "price + volume > {n}", "NOT (price < {n}) AND volume < 4",
    "price < {n} OR symbol = '{s}'", "ratio > {f}", "flag", "NOT flag OR price > {n}",
    "price / (volume - 2) > 1", "abs(price - volume) <= 1", "length(lower(symbol)) = 1",
    "greatest(price, volume) >= {n}", "floor(ratio) = 1",
]
AGGREGATE_PREDICATES = [
    "price > First(price)", "price >= Last(price)", "price < Last(price)",
    "Count() < {n}", "Max(price) > {n}", "Min(price) <= price", "Sum(volume) > {n}",
    "Average(price) > {f}", "Delta(ts) <= {n}", "Min(symbol) = '{s}'", "Max(symbol) > symbol",
    "Last(symbol) != symbol", "price - First(price) >= 1 AND price >= Last(price)",
    "First(flag) = flag", "Sum(ratio) < {f} * 3", "Last(ratio) <= ratio",
    "price >= First(price) AND price < Last(price)",
]
EMITS = [
    "Count()", "First(price)", "Last(price)", "Max(price)", "Min(symbol)", "Sum(volume)",
    "Average(price)", "Delta(ts)", "Collect(price)", "Collect(symbol)", "symbol", "price",
    "price / First(price)", "volume % 3", "Max(ratio)", "Sum(ratio)", "Collect(flag)",
    "First(flag)", "Last(symbol)", "Average(ratio) * 2", "upper(Max(symbol))",
    "Count() * 10 + price", "Min(ratio)", "flag AND price > 2",
]


def _fill(template: str, draw) -> str:
    return template.format(n=draw(st.integers(0, 6)), s=draw(st.sampled_from(SYMBOLS)),
                           f=draw(st.sampled_from(["0.5", "1.25", "2.0", "3.5"])))


@st.composite
def match_queries(draw):
    """Text of a random MATCH query over the `mixed` stream that the checker accepts."""
    count = draw(st.integers(1, 4))
    names = NAMES[:count]
    pattern = draw(regexes(names))
    if draw(st.booleans()):  # a first step, so that later predicates may read aggregates
        pattern = f"{draw(st.sampled_from(['.', names[0]]))} ({pattern})"
    if not any(name in pattern.replace("(", " ").replace(")", " ").split() for name in names):
        pattern = f"({pattern}) p0"
    used = [n for n in names if n in pattern.replace("(", " ").replace(")", " ").split()]
    parsed = query(f"QUERY q FROM mixed PATTERN ( {pattern} ) DEFINE " +
                   ", ".join(f"{n} AS price > 0" for n in used))[0]
    regex = parsed.query.body.pattern
    assume(not ra.matches_only_empty(regex))
    starters = ra.first_symbols(regex)
    defines = []
    for name in used:
        pool = STATIC_PREDICATES
        if name not in starters and draw(st.integers(0, 3)) > 0:
            pool = AGGREGATE_PREDICATES
        defines.append(f"{name} AS {_fill(draw(st.sampled_from(pool)), draw)}")
    emits = draw(st.lists(st.sampled_from(EMITS), max_size=4, unique=True))
    emit = ""
    if emits:
        emit = " EMIT " + ", ".join(f"e{i} = {_fill(e, draw)}" for i, e in enumerate(emits))
    partition = draw(st.sampled_from(["PARTITION BY symbol ", "PARTITION BY symbol ", "",
                                      "PARTITION BY symbol, flag "]))
    return (f"QUERY q FROM mixed {partition}PATTERN ( {pattern} ) DEFINE "
            f"{', '.join(defines)}{emit}")


@st.composite
def streams(draw, max_size: int = 60):
    size = draw(st.integers(0, max_size))
    symbols = SYMBOLS[:draw(st.integers(2, 3))]
    rows, ts = [], 0
    for number in range(size):
        step = draw(st.sampled_from([0, 0, 1, 1, 2, 3, -2]))  # sometimes backwards
        ts = max(0, ts + step)
        rows.append({"symbol": draw(st.sampled_from(symbols)), "price": draw(st.integers(0, 6)),
                     "volume": draw(st.integers(0, 5)),
                     "ratio": draw(st.sampled_from([0.0, 0.5, 1.25, 2.0, 3.5, -1.5])),
                     "flag": draw(st.booleans()), "ts": ts, "seqNum": 100 + number})
    return events(rows)  # fits both `mixed` and `trades`


def _runs(draw, queries, count: int) -> None:
    for _ in range(count):
        stream = draw(streams())
        sizes = tuple(draw(st.lists(st.integers(1, 20), min_size=1, max_size=3)))
        restore_at = draw(st.one_of(st.none(), st.integers(0, max(0, len(stream)))))
        assert_same(queries, stream, sizes=sizes, restore_at=restore_at)


@settings(max_examples=new_shapes(20, 50), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data())
def test_random_queries_equal_the_reference(data):
    text = data.draw(match_queries(), label="query")
    _runs(data.draw, query(text), 4)


# Fresh queries on every run (each compiles a kernel), beyond the fixed ones above.
@settings(max_examples=new_shapes(3, 10), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data())
def test_fresh_random_queries_equal_the_reference(data):
    text = data.draw(match_queries(), label="query")
    _runs(data.draw, query(text), 3)


# The finance workload's pattern shape (on the trades stream) with random predicates.
@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_m_shape_variants_equal_the_reference(data):
    rise = data.draw(st.sampled_from(["price > First(price) AND price >= Last(price)",
                                      "price >= Last(price)", "price > Min(price)"]))
    drop = data.draw(st.sampled_from(["price >= First(price) AND price < Last(price)",
                                      "price < Last(price)", "price < Max(price)"]))
    text = f"""QUERY m FROM trades PARTITION BY symbol
        PATTERN ( . rise+ drop+ rise+ drop* deep )
        DEFINE rise AS {rise}, drop AS {drop},
               deep AS price < First(price) AND price < Last(price)
        EMIT symbol = symbol, seqNum = First(seqNum), n = Count(), hi = Max(price),
             path = Collect(price)"""
    _runs(data.draw, load_query_text(text), 6)


# ---------------------------------------------------------------- engine machinery

M_SHAPE = """
    QUERY m FROM mixed PARTITION BY symbol
    PATTERN ( . rise+ drop+ rise+ drop* deep )
    DEFINE rise AS price > First(price) AND price >= Last(price),
           drop AS price >= First(price) AND price < Last(price),
           deep AS price < First(price) AND price < Last(price)
    EMIT symbol = symbol, first = First(price), n = Count(), hi = Max(price),
         path = Collect(price), flags = Collect(flag), mean = Average(ratio)
"""


def random_walks(n: int, keys: int, seed: int = 7, gap: int = 1) -> list[Event]:
    rng = np.random.default_rng(seed)
    price = {k: 50 for k in range(keys)}
    rows = []
    for i in range(n):
        k = int(rng.integers(0, keys))
        price[k] += int(rng.choice([-2, -1, 0, 1, 2]))
        rows.append({"symbol": f"S{k}", "price": price[k], "volume": int(rng.integers(0, 5)),
                     "ratio": float(rng.integers(0, 8)) / 4, "flag": bool(rng.integers(0, 2)),
                     "ts": i * gap})
    return events(rows)


def test_arrays_grow_and_results_stay_the_same():
    """Many keys (slots double), long partial matches (candidates per slot double, the
    Collect log is compacted and grows), many matches per batch (outputs double)."""
    queries = query(M_SHAPE)
    stream = random_walks(10_000, keys=40)
    got = assert_same(queries, stream, sizes=(10_000,))
    assert len(got) > 300
    assert_same(queries, stream, sizes=(1, 50, 999), restore_at=2001)
    engine = match_engine(queries[0], StringDictionary())
    engine.process(BatchEncoder(MIXED, engine.strings).from_events(stream))
    assert engine.nslots >= 32 and engine.cap > 4 and engine.out_cap > 256


@pytest.mark.parametrize(("time_unit", "gap", "written", "units"),
                         [("ms", 250, "2 seconds", 2000), ("s", 7, "1 minute", 60)])
def test_a_duration_compared_with_delta_is_in_the_streams_time_unit(time_unit, gap, written,
                                                                     units):
    """`Delta(ts) <= 2 seconds` is `Delta(ts) <= 2000` on a stream timed in ms and
    `<= 2` in s: the same composite events as the number, on both engines."""
    reg = SchemaRegistry()
    reg.add(StreamSchema("timed", dict(MIXED.attributes), "ts", time_unit))
    text = """
        QUERY quick FROM timed PARTITION BY symbol
        PATTERN ( a b+ c )
        DEFINE a AS price > 0, b AS Delta(ts) <= {limit} AND price >= Last(price),
               c AS {limit} >= Delta(ts) AND price < Last(price)
        EMIT took = Delta(ts), n = Count()
    """
    with_duration = load_query_text(text.format(limit=written), reg)
    stream = random_walks(3000, keys=3, gap=gap)
    expected = reference_run(load_query_text(text.format(limit=units), reg), stream)
    assert reference_run(with_duration, stream) == expected
    assert len(expected[0]) > 20
    assert max(c["took"] for c in expected[0]) <= units
    longer = reference_run(load_query_text(text.format(limit=units * 3), reg), stream)
    assert max(c["took"] for c in longer[0]) > units  # the limit decides matches
    assert_same(with_duration, stream, sizes=(7, 1, 500), restore_at=1500)


def test_collect_log_keeps_what_long_matches_need():
    queries = query("""
        QUERY c FROM mixed PARTITION BY symbol
        PATTERN ( a b* c )
        DEFINE a AS price = 0, b AS price > 0, c AS price = 0 AND volume = 9
        EMIT n = Count(), prices = Collect(price), syms = Collect(symbol)
    """)
    # 7 keys in turn; all start at 0-6, die and restart at 1000-1006 (old log entries
    # become garbage), and match at 3500-3506 (about 360 events each).
    rows = []
    for i in range(4000):
        price = 0 if i < 7 or 1000 <= i < 1007 or 3500 <= i < 3507 else 1 + i % 5
        volume = 9 if 3500 <= i < 3507 else 0
        rows.append({"symbol": f"K{i % 7}", "price": price, "volume": volume, "ratio": 0.0,
                     "flag": False, "ts": i})
    stream = events(rows)
    got = assert_same(queries, stream, sizes=(64, 3000, 5), restore_at=1500)
    assert len(got) == 7
    assert got and max(c["n"] for c in got) > 256


def test_aggregate_free_and_bit_parallel_keep_the_earliest_start():
    queries = query("""
        QUERY h FROM mixed PARTITION BY symbol
        PATTERN ( a+ b | a . c )
        DEFINE a AS price > 0, b AS price = 0, c AS volume = 3
        EMIT n = Count(), first = First(ts), path = Collect(price)
    """)
    assert not compile_match(queries[0]).aggregate_mode
    stream = random_walks(2000, keys=3)
    assert_same(queries, stream, sizes=(1, 13, 400), restore_at=777)


def test_time_going_backwards_is_rejected_per_partition():
    queries = query("""
        QUERY b FROM mixed PARTITION BY symbol
        PATTERN ( a b ) DEFINE a AS price = 1, b AS price = 2 EMIT s = symbol
    """)
    rows = [("A", 1, 10), ("B", 1, 5), ("A", 2, 9), ("A", 2, 10), ("B", 2, 4), ("B", 2, 5)]
    stream = events([{"symbol": s, "price": p, "volume": 0, "ratio": 0.0, "flag": True,
                      "ts": t} for s, p, t in rows])
    got, dead = jit_run(queries, stream, sizes=(1,))
    assert [(c["start_seq"], c["seq"]) for c in got] == [(0, 3), (1, 5)]
    assert dead == [("b", 2, 'event time goes backwards in partition "A"'),
                    ("b", 4, 'event time goes backwards in partition "B"')]
    assert_same(queries, stream, sizes=(2,), restore_at=3)


def test_partition_keys_beyond_a_lookup_table():
    """Integer keys spread too far for a table fall back to KeyIndex, also mid-stream."""
    queries = load_query_text("""
        QUERY cheat FROM checkpoints PARTITION BY runner
        PATTERN ( A NOTB* C ) DEFINE A AS checkpoint = 'Staten Island',
            NOTB AS checkpoint != 'Brooklyn', C AS checkpoint = 'Queens'
        EMIT runner = runner, n = Count()
    """)
    route = ["Staten Island", "Queens", "Brooklyn", "Staten Island", "Bronx", "Queens"]
    rows = []
    for i, runner in enumerate([1, 2, 3] * 6 + [10**12, 5, -7] * 6):
        rows.append({"runner": runner, "checkpoint": route[(i // 3) % 6], "ts": i})
    stream = events(rows)
    got = assert_same(queries, stream, sizes=(18, 1, 4), restore_at=20)
    assert {c["key"] for c in got} >= {1, 10**12}
    assert_same(queries, stream, sizes=(5,), restore_at=10)


def test_idle_eviction_changes_nothing_when_longer_than_any_match():
    queries = query("""
        QUERY e FROM mixed PARTITION BY symbol
        PATTERN ( a b* c ) DEFINE a AS price = 0, b AS price > 0, c AS volume = 4
        EMIT n = Count(), path = Collect(price)
    """)
    # Keys come and go: each is busy for a while (partial matches open), then quiet.
    rng = np.random.default_rng(3)
    rows = []
    for i in range(3000):
        k = (i // 150) * 3 + int(rng.integers(0, 3))
        rows.append({"symbol": f"K{k}", "price": int(rng.integers(0, 4)),
                     "volume": int(rng.integers(0, 6)), "ratio": 0.0, "flag": False,
                     "ts": i * 10})
    stream = events(rows)
    expected, expected_dead = reference_run(queries, stream)
    longest = max(stream[c["seq"]].ts - stream[c["start_seq"]].ts for c in expected)
    engine_out, dead = jit_run(queries, stream, sizes=(37,), restore_at=1500,
                               idle_timeout=longest + 10)
    assert engine_out == expected and dead == expected_dead
    engine = match_engine(queries[0], StringDictionary(), idle_timeout=longest + 10)
    engine.process(BatchEncoder(MIXED, engine.strings).from_events(stream))
    assert engine.metrics["evicted_keys"] > 0
    # A short timeout evicts partial matches that would have completed.
    short = match_engine(queries[0], StringDictionary(), idle_timeout=5)
    encoder = BatchEncoder(MIXED, short.strings)
    out = []
    for lo in range(0, len(stream), 10):
        out += short.process(encoder.from_events(stream[lo:lo + 10]))
    assert short.metrics["evicted_keys"] > engine.metrics["evicted_keys"]
    assert len(out) < len(expected)


@pytest.mark.parametrize("key", ["symbol", "symbol, flag"])
def test_idle_keys_are_forgotten_and_their_ids_reused(key):
    """Keys that never come back: idle ones lose their ids (and rows, lookup entries) to
    new keys, so the id range stays near the keys live within the timeout, and the output
    (across a snapshot and restore) is still the reference's. "symbol" takes the lookup-
    table path, two attributes the KeyIndex path."""
    [q] = query(f"""
        QUERY r FROM mixed PARTITION BY {key}
        PATTERN ( a b* c ) DEFINE a AS price = 0, b AS price > 0, c AS volume = 4
        EMIT n = Count(), top = Max(price)
    """)
    rng = np.random.default_rng(5)
    rows = []
    for i in range(6000):  # 40 live keys at a time, the window slides by one per 50 events
        k = i // 50 + int(rng.integers(0, 40))
        rows.append({"symbol": f"K{k}", "price": int(rng.integers(0, 4)),
                     "volume": int(rng.integers(0, 6)), "ratio": 0.0, "flag": k % 2 == 0,
                     "ts": i * 10})
    stream = events(rows)
    timeout = 25_000  # > any key's life (2,000 events), so no match is cut short
    expected = reference_run([q], stream)
    assert expected[0]
    assert jit_run([q], stream, sizes=(97,), restore_at=3000, idle_timeout=timeout) == expected
    engine = match_engine(q, StringDictionary(), idle_timeout=timeout)
    encoder = BatchEncoder(MIXED, engine.strings)
    for lo in range(0, len(stream), 97):
        engine.process(encoder.from_events(stream[lo:lo + 97]))
    distinct = len({r["symbol"] for r in rows})
    assert engine.metrics["released_keys"] > distinct // 3
    assert len(engine.keys) < distinct * 3 // 4  # without release: one id per key ever seen
    again = match_engine(q, StringDictionary(), idle_timeout=timeout)
    again.restore(engine.snapshot())
    assert len(again.keys) == len(engine.keys)
    assert sorted(again.keys.free_ids().tolist()) == sorted(engine.keys.free_ids().tolist())


def test_punctuation_advances_the_eviction_clock():
    queries = query("""
        QUERY p FROM mixed PARTITION BY symbol
        PATTERN ( a b ) DEFINE a AS price = 0, b AS price = 1
    """)
    stream = events([{"symbol": "A", "price": 0, "volume": 0, "ratio": 0.0, "flag": False,
                      "ts": 0}])
    engine = match_engine(queries[0], StringDictionary(), idle_timeout=100)
    engine.process(BatchEncoder(MIXED, engine.strings).from_events(stream))
    assert engine.punctuate(50) == [] and engine.metrics["evicted_keys"] == 0
    assert engine.punctuate(100) == [] and engine.metrics["evicted_keys"] == 1
    assert_same(queries, stream + [Punctuation(1000)], idle_timeout=100)


# Deliberately like tests/gpu/test_gpu_match.py's test of that name: the same case on the
# GPU engine, which runs only where a GPU is
def test_no_partition_and_several_partition_attributes():
    for partition in ("", "PARTITION BY symbol, volume"):
        queries = query(f"""
            QUERY k FROM mixed {partition}
            PATTERN ( a . b? c ) DEFINE a AS price > 2, b AS flag, c AS price < Last(price)
            EMIT k = symbol, n = Count(), r = ratio
        """)
        assert_same(queries, random_walks(1500, keys=4, seed=11), sizes=(3, 100),
                    restore_at=600)


STRING_ORDERING = """
    QUERY s FROM mixed PARTITION BY flag
    PATTERN ( a b+ c ) DEFINE a AS symbol >= 'M', b AS Max(symbol) >= symbol,
        c AS lower(symbol) < lower(First(symbol))
    EMIT hi = Max(symbol), lo = Min(symbol), up = upper(Last(symbol)), n = length(symbol)
"""


def word_rows(n: int) -> list[dict]:
    """n rows whose symbols are mixed-case words that keep arriving, with a random flag."""
    words = ["zeta", "Alpha", "mu", "Nu", "beta", "omega", "Mu", "kappa", "zz", "a"]
    rng = np.random.default_rng(5)
    return [{"symbol": words[int(rng.integers(0, len(words)))], "price": 0, "volume": 0,
             "ratio": 0.0, "flag": bool(rng.integers(0, 2)), "ts": i} for i in range(n)]


def test_string_ordering_and_functions_after_new_strings_arrive():
    queries = query(STRING_ORDERING)
    got = assert_same(queries, events(word_rows(600)), sizes=(1, 7, 50), restore_at=300)
    assert got


def test_more_than_63_positions_is_refused_clearly():
    """Refused by the check itself (cep_core.admission), with the compiler's own words."""
    pattern = " ".join(["a"] * 64)
    with pytest.raises(QueryErrors, match="64 positions.*at most 63"):
        query(f"QUERY big FROM mixed PATTERN ( {pattern} ) DEFINE a AS price > 0")
    ok = query(f"QUERY ok FROM mixed PATTERN ( {' '.join(['a'] * 63)} ) "
               "DEFINE a AS price > 0 EMIT n = Count()")
    assert_same(ok, random_walks(300, keys=1), sizes=(1, 64), restore_at=100)


def test_snapshot_is_independent_of_the_engine_it_came_from():
    queries = query(M_SHAPE)
    stream = random_walks(1200, keys=5)
    strings = StringDictionary()
    encoder = BatchEncoder(MIXED, strings)
    engine = match_engine(queries[0], strings)
    first = engine.process(encoder.from_events(stream[:600]))
    data = engine.snapshot()
    rest_a = engine.process(encoder.from_events(stream[600:]))
    strings_b = StringDictionary()
    restored = match_engine(queries[0], strings_b)
    restored.restore(data)
    rest_b = restored.process(BatchEncoder(MIXED, strings_b).from_events(stream[600:]))
    assert rest_a == rest_b
    assert first + rest_a == reference_run(queries, stream)[0]


@pytest.mark.parametrize("workload", ["finance0", "marathon"])
def test_batches_bigger_than_a_chunk_give_the_same_composites(workload, monkeypatch):
    """A batch over CHUNK events is processed chunk by chunk; the result is the same."""
    from cep_core.engine import match as match_module
    from cep_core.workloads import WORKLOADS

    spec = WORKLOADS[workload]
    table = spec.generate(5_000, 3)
    queries = load_query_text(spec.query_text(seed=3), path=f"<{workload}>")
    checked = [q for q in queries if q.query.kind == "match"][0]

    def composites():
        strings = StringDictionary()
        engine = match_engine(checked, strings)
        batch = BatchEncoder(checked.schema, strings).from_arrow(table)
        return engine.process(batch) + engine.flush(), engine.dead_letters

    whole = composites()
    monkeypatch.setattr(match_module, "CHUNK", 777)
    assert composites() == whole
    assert len(whole[0]) > 0
