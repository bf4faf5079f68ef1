"""Idle-key eviction in the SEQ engines (option `idle_timeout`, as MATCH's).

With an idle time longer than the window (the streams here have no lag between
partitions) results equal the reference's, by CDP and by AIP (runs with timed-out partial
matches, and skip-till-any-match forced to AIP), while `metrics()["evicted_keys"]` counts
the partitions whose state was dropped.
"""

from __future__ import annotations

import random

import pytest
from engine_harness import assert_same

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_query_text
from cep_core.engine_factory import create_engine, seq_aip_engine, seq_engine
from cep_core.events import Event, Punctuation

ANY_MATCH = """QUERY c FROM abc PARTITION BY p PATTERN SEQ(A a, B b, NOT(C c))
    WHERE a.v = c.v WITHIN 4"""
RUNS = """QUERY k FROM abc PARTITION BY p
    PATTERN SEQ(A a, KLEENE(B b){1,3}, C c) WHERE b.v >= a.v
    WITHIN 6 USING skip-till-next-match ON TIMEOUT EMIT PARTIAL EMIT n = count(b)"""


def drifting_stream(seed: int, n: int = 400) -> list:
    """Partitions come and go: event i belongs to one of three partitions of generation
    i // 25, time advances by 0-2 per event, a punctuation now and then."""
    rng = random.Random(seed)
    out, ts = [], 0
    for i in range(n):
        ts += rng.choice([0, 1, 1, 2])
        if rng.random() < 0.03:
            out.append(Punctuation(ts + rng.randint(0, 3)))
        p = (i // 25) * 3 + rng.randint(0, 2)
        kind = rng.choice("AABBC")
        out.append(Event(i, ts, {"type": kind, "p": p, "v": rng.randint(0, 2), "ts": ts}))
    return out


def run_engine(engine, stream) -> list[dict]:
    encoder = BatchEncoder(engine.schema, engine.strings)
    out = []
    for i in range(0, len(stream), 16):
        chunk = stream[i:i + 16]
        events = [e for e in chunk if isinstance(e, Event)]
        out += engine.process(encoder.from_events(events))
        for p in chunk:
            if isinstance(p, Punctuation):
                out += engine.punctuate(p.ts)
    return out + engine.flush()


CASES = [(ANY_MATCH, seq_engine, {}), (ANY_MATCH, seq_aip_engine, {}),
         (RUNS, create_engine, {})]


@pytest.mark.parametrize("text,factory,options", CASES, ids=["cdp", "aip_any", "aip_runs"])
@pytest.mark.parametrize("seed", [1])
def test_eviction_keeps_results_and_counts(text, factory, options, seed):
    queries = load_query_text(text)
    stream = drifting_stream(seed)
    assert_same(queries, stream, sizes=(16, 5), restore_at=200, factory=factory,
                idle_timeout=12, **options)
    engine = factory(queries[0], StringDictionary(), idle_timeout=12)
    plain = factory(queries[0], StringDictionary())
    found = run_engine(engine, stream)
    assert found and len(found) == len(run_engine(plain, stream))
    assert engine.metrics()["evicted_keys"] >= 20  # 16 generations of 3 partitions
    assert plain.metrics()["evicted_keys"] == 0
    assert engine.metrics()["stored_events"] < plain.metrics()["stored_events"]


@pytest.mark.parametrize("factory", [seq_engine, seq_aip_engine])
def test_counter_counts_idle_partitions_with_state(factory):
    queries = load_query_text(ANY_MATCH)
    strings = StringDictionary()
    engine = factory(queries[0], strings, idle_timeout=10)
    encoder = BatchEncoder(queries[0].schema, strings)
    rows = [("A", 1, 1, 0), ("B", 1, 2, 0),  # 1: a match waiting for its NOT until > 5
            ("A", 0, 20, 0)]  # the clock moves to 20; partition 1's event time stays at 2
    events = [Event(i, ts, {"type": k, "p": p, "v": v, "ts": ts})
              for i, (k, p, ts, v) in enumerate(rows)]
    assert engine.process(encoder.from_events(events)) == []
    # partition 1 is idle for 18 >= 10 but holds a pending match: kept
    assert engine.metrics()["evicted_keys"] == 0
    out = engine.punctuate(25)  # releases the match, then evicts partition 1
    assert [c["seq"] for c in out] == [1] and engine.metrics()["evicted_keys"] == 1
    assert engine.punctuate(29) == [] and engine.metrics()["evicted_keys"] == 1
    assert engine.punctuate(30) == [] and engine.metrics()["evicted_keys"] == 2
    assert engine.punctuate(60) == [] and engine.metrics()["evicted_keys"] == 2
    with pytest.raises(ValueError):
        factory(queries[0], StringDictionary(), idle_timeout=0)


def released_on_drift(queries, factory):
    """(engine, partitions seen) after a stream of partitions that never come back through
    `factory` engines with idle_timeout 12: the output across a restore is the reference's,
    and more than half the partitions gave their ids back."""
    stream = drifting_stream(7, n=2000)  # 80 generations of 3 partitions
    assert_same(queries, stream, sizes=(16, 5), restore_at=1000, factory=factory,
                idle_timeout=12)
    engine = factory(queries[0], StringDictionary(), idle_timeout=12)
    assert run_engine(engine, stream)
    seen = len({e.attrs["p"] for e in stream if isinstance(e, Event)})
    assert engine.metrics()["released_keys"] > seen // 2
    return engine, seen


def test_cdp_forgets_idle_partitions_and_reuses_their_ids():
    """Partitions that never come back: once idle and empty they give their ids to new
    partitions, so the id range stays near the partitions live within the timeout, and
    the output (across a snapshot and restore) is still the reference's."""
    queries = load_query_text(ANY_MATCH)
    engine, seen = released_on_drift(queries, seq_engine)
    assert len(engine.keys) < seen // 4  # without release: one id per partition ever seen
    again = seq_engine(queries[0], StringDictionary(), idle_timeout=12)
    again.restore(engine.snapshot())
    assert again.metrics() == engine.metrics()
    assert sorted(again.keys.free) == sorted(engine.keys.free)


@pytest.mark.parametrize("text", [
    "QUERY n FROM abc PATTERN SEQ(A a, B b) WITHIN 4",
    "QUERY m FROM abc PATTERN ( a b ) DEFINE a AS type = 'A', b AS type = 'B'"])
def test_the_one_key_of_an_unpartitioned_query_is_released_again_and_again(text):
    """No PARTITION BY: the single key goes idle (a punctuation moves the clock past it),
    is released and comes back, again and again."""
    queries = load_query_text(text)
    stream, ts = [], 0
    for i in range(60):
        if i and i % 10 == 0:  # a quiet gap (no match open) the punctuation announces
            stream.append(Punctuation(ts + 30))
            ts += 50
        ts += 1
        stream.append(Event(i, ts, {"type": "AB"[i % 2], "p": 0, "v": 0, "ts": ts}))
    assert_same(queries, stream, sizes=(3,), restore_at=30, idle_timeout=20)
    engine = create_engine(queries[0], StringDictionary(), idle_timeout=20)
    encoder = BatchEncoder(engine.schema, engine.strings)
    found, pending = [], []
    for item in stream + [Punctuation(ts + 30)]:
        if isinstance(item, Punctuation):
            found += engine.process(encoder.from_events(pending)) + engine.punctuate(item.ts)
            pending = []
        else:
            pending.append(item)
    assert found
    metrics = engine.metrics() if callable(engine.metrics) else engine.metrics
    assert metrics["released_keys"] >= 4
