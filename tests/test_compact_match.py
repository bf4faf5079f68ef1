"""String compaction in the MATCH engine (`MatchEngine.string_codes/remap_strings`).

The harness (`compact=True`) compacts the dictionary after every batch, dropping every
string the engine does not report: a code held but not reported, or not remapped, gives a
wrong composite event (or a wrong rejection) against the reference. Covered: the MATCH
queries of examples/*.cep, random queries and streams (the strategies of
tests/test_engine_match.py), both key paths (lookup table and `KeyIndex`), candidates in
slots and in key rows, Collect logs, string Last()/Max()/Min(), string comparisons and
lower/upper, snapshots taken after a compaction; and a stream of keys that never come back,
where the dictionary must stay bounded by the keys live within the idle timeout.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.stream_engines import compact_strings
from cep_core.engine_factory import match_engine
from cep_core.event_io import read_events
from tests.engine_harness import assert_same, new_shapes, reference_run
from tests.test_engine_match import (
    EXAMPLES,
    MIXED,
    _example_cases,
    events,
    match_queries,
    query,
    random_walks,
    streams,
)


@pytest.mark.parametrize(("path", "queries"), list(_example_cases()))
def test_examples_equal_the_reference_when_compacted_after_every_batch(path, queries):
    stream, _dead = read_events(EXAMPLES / "data" / f"{queries[0].schema.stream}.jsonl",
                                queries[0].schema)
    got = assert_same(queries, stream, sizes=(7, 1, 30), restore_at=len(stream) // 2,
                      compact=True)
    assert got, f"{path.name}: no composite events on the sample data"


@settings(max_examples=new_shapes(8, 25), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data())
def test_random_queries_equal_the_reference_when_compacted(data):
    """Random queries of test_engine_match, partitioned also by a non-string attribute
    (candidates then hold strings that no key holds)."""
    text = data.draw(match_queries(), label="query")
    partition = data.draw(st.sampled_from(["", "PARTITION BY flag ", "PARTITION BY symbol ",
                                           "PARTITION BY symbol, flag "]))
    for old in ("PARTITION BY symbol, flag ", "PARTITION BY symbol "):
        text = text.replace(old, "")
    queries = query(text.replace("PATTERN", partition + "PATTERN", 1))
    for _ in range(3):
        stream = data.draw(streams())
        sizes = tuple(data.draw(st.lists(st.integers(1, 20), min_size=1, max_size=3)))
        restore_at = data.draw(st.one_of(st.none(), st.integers(0, max(0, len(stream)))))
        assert_same(queries, stream, sizes=sizes, restore_at=restore_at, compact=True)


STRINGY = """
    QUERY s FROM mixed {partition}
    PATTERN ( a b+ c ) DEFINE a AS symbol >= 'M', b AS Max(symbol) >= symbol,
        c AS lower(symbol) <= lower(First(symbol)) AND upper(Last(symbol)) >= upper(symbol)
    EMIT hi = Max(symbol), lo = Min(symbol), up = upper(Last(symbol)), n = length(symbol),
         names = Collect(symbol), k = symbol
"""


@pytest.mark.parametrize("partition", ["PARTITION BY flag", "PARTITION BY symbol",
                                       "PARTITION BY symbol, flag", ""])
def test_string_aggregates_collect_and_functions_survive_compaction(partition):
    """Candidates in slots holding First/Max/Min of strings, a Collect log of strings,
    string Last(); new strings keep arriving (words drawn from a growing vocabulary)."""
    queries = query(STRINGY.format(partition=partition))
    rng = np.random.default_rng(5)
    words = [f"{'zMaNb'[int(rng.integers(0, 5))]}{int(rng.integers(0, 8 + i // 20))}"
             for i in range(600)]
    rows = [{"symbol": word, "price": 0, "volume": 0, "ratio": 0.0,
             "flag": bool(rng.integers(0, 2)), "ts": i} for i, word in enumerate(words)]
    got = assert_same(queries, events(rows), sizes=(1, 7, 50), restore_at=300, compact=True)
    assert got


def test_per_key_candidates_and_last_values_survive_compaction():
    """Aggregate-free predicates without Collect: candidates live in the key rows."""
    for partition in ("flag", "symbol"):
        queries = query(f"""
            QUERY h FROM mixed PARTITION BY {partition}
            PATTERN ( a+ b | a . c )
            DEFINE a AS price > 0 AND symbol != 'S3', b AS price = 0 AND Last(symbol) <= symbol,
                   c AS volume = 3
            EMIT n = Count(), first = First(symbol), top = Max(symbol), s = upper(symbol)
        """)
        assert match_engine(queries[0], StringDictionary()).program.per_key
        got = assert_same(queries, random_walks(2000, keys=6), sizes=(1, 13, 400),
                          restore_at=777, compact=True)
        assert len({c["first"] for c in got}) > 1


# ---------------------------------------------------------------- keys that never come back

GONE = """
    QUERY r FROM mixed PARTITION BY {key}
    PATTERN ( a b* c ) DEFINE a AS price = 0, b AS price > 0 AND Last(symbol) = symbol,
        c AS volume = 4 AND lower(symbol) >= 'k'
    EMIT n = Count(), top = Max(price), names = Collect(symbol), first = First(symbol)
"""
TIMEOUT = 3_000  # more than any key's life (200 events, 2,000 time units)


def passing_keys(n: int = 6000) -> list:
    """20 keys live at a time; the window slides by one key every 10 events, so each key
    lives 200 events and never comes back (620 distinct keys)."""
    rng = np.random.default_rng(5)
    rows = []
    for i in range(n):
        k = i // 10 + int(rng.integers(0, 20))
        rows.append({"symbol": f"K{k}", "price": int(rng.integers(0, 4)),
                     "volume": int(rng.integers(0, 6)), "ratio": 0.0, "flag": k % 2 == 0,
                     "ts": i * 10})
    return events(rows)


@pytest.mark.parametrize("key", ["symbol", "symbol, flag"])
def test_dictionary_stays_bounded_when_keys_never_come_back(key):
    """"symbol" takes the lookup-table path, two attributes the KeyIndex path."""
    [q] = query(GONE.format(key=key))
    stream = passing_keys()
    expected, expected_dead = reference_run([q], stream)
    assert expected
    assert_same([q], stream, sizes=(97,), restore_at=3000, idle_timeout=TIMEOUT, compact=True)

    strings = StringDictionary()
    engine = match_engine(q, strings, idle_timeout=TIMEOUT)
    encoder = BatchEncoder(MIXED, strings)
    got, sizes = [], []
    for lo in range(0, len(stream), 97):
        got += engine.process(encoder.from_events(stream[lo:lo + 97]))
        compact_strings([engine], strings, slack=2.0, minimum=64)
        sizes.append(len(strings))
    assert got == expected and engine.dead_letters == []
    distinct = len({e.attrs["symbol"] for e in stream})
    # Live within the timeout: about 20 + 30 keys (and their lower/upper-cased forms).
    assert max(sizes) < distinct // 3, (max(sizes), distinct)  # without compaction: 1238
    assert engine.metrics["released_keys"] > distinct // 2


def test_dropping_a_string_the_state_holds_is_an_error():
    [q] = query(STRINGY.format(partition="PARTITION BY flag"))
    strings = StringDictionary()
    engine = match_engine(q, strings)
    words = ["zeta", "mu", "nu"]  # one partial match: First zeta, Max zeta, Last nu
    engine.process(BatchEncoder(MIXED, strings).from_events(events([
        {"symbol": w, "price": 0, "volume": 0, "ratio": 0.0, "flag": True, "ts": i}
        for i, w in enumerate(words)])))
    held = np.unique(engine.string_codes())
    assert sorted(strings.decode(c) for c in held.tolist()) == ["mu", "nu", "zeta"]
    new_code = strings.compact(held[1:])
    with pytest.raises(ValueError, match="dropped a string MATCH state holds"):
        engine.remap_strings(new_code)
