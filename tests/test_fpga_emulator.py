"""The circuit emulator against the reference interpreter, from packed tuples (no UDP)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep_accel.fpga.emulator import Circuit
from cep_accel.fpga.plan import CircuitConfig, compile_fpga, pack_tuples
from cep_core import reference
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_queries, load_query_text
from cep_core.events import Event
from cep_core.schema import SchemaRegistry, StreamSchema

SCHEMA = StreamSchema("ev", {"k": "int", "x": "int", "s": "string", "ts": "timestamp"}, "ts")
QUERIES = {
    "alt_star": "QUERY q FROM ev PARTITION BY k PATTERN (A (B | C*) D) "
                "DEFINE A AS x = 1, B AS x = 2, C AS x >= 2, D AS x <= 3;",
    "overlapping": "QUERY q FROM ev PARTITION BY k PATTERN (A . B+ | A C | C C C) "
                   "DEFINE A AS x < 3, B AS x > 1 AND s != 'c', C AS s = 'a' OR x = 4;",
    "unpartitioned": "QUERY q FROM ev PATTERN (A B* C?) DEFINE A AS x = 0, B AS x > 0, "
                     "C AS s = 'b';",
}
MARATHON = load_queries("examples/marathon.cep")[0]
CHECKPOINTS = ["Staten Island", "Brooklyn", "Queens", "Bronx", "Manhattan", "Harlem"]


def checked(name: str):
    registry = SchemaRegistry()
    registry.add(SCHEMA)
    return load_query_text(QUERIES[name], registry)[0]


def ev_events(records):
    return [Event(i, i, {"k": k, "x": x, "s": s, "ts": i}) for i, (k, x, s) in enumerate(records)]


def marathon_events(records):
    return [Event(i, 60_000 * i, {"runner": k, "checkpoint": CHECKPOINTS[c], "ts": 60_000 * i})
            for i, (k, c) in enumerate(records)]


def emulate(q, events, config):
    strings = StringDictionary()
    plan = compile_fpga(q, strings)
    batch = BatchEncoder(q.schema, strings).from_events(events)
    circuit = Circuit(plan, config)
    return [tuple(r) for r in circuit.run(pack_tuples(plan, batch)).tolist()], circuit


def expected(q, events):
    out = reference.run([q], events)
    return [(c["key"] if c["key"] is not None else 0, c["seq"], c["start_seq"]) for c in out]


ev_records = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4), st.sampled_from("abc")),
                      max_size=150)
marathon_records = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 5)), max_size=200)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(QUERIES)), ev_records)
def test_emulator_gives_the_reference_matches(name, records):
    q = checked(name)
    events = ev_events(records)
    got, circuit = emulate(q, events, CircuitConfig(elements=8))
    assert got == expected(q, events)
    assert circuit.counts()["discarded"] == 0


@settings(max_examples=40, deadline=None)
@given(marathon_records)
def test_emulator_gives_the_reference_matches_on_the_marathon(records):
    events = marathon_events(records)
    got, _ = emulate(MARATHON, events, CircuitConfig(elements=7))
    assert got == expected(MARATHON, events)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["alt_star", "overlapping"]), ev_records)
def test_discarded_tuples_are_counted_and_are_the_only_difference(name, records):
    """With 2 elements for 6 partitions tuples are dropped; the matches are the reference's
    over the stream without the dropped tuples (their partition held no state then)."""
    q = checked(name)
    events = ev_events(records)
    got, circuit = emulate(q, events, CircuitConfig(elements=2))
    dropped = set(circuit.dropped.tolist())
    assert circuit.counts()["discarded"] == len(dropped)
    assert got == expected(q, [e for e in events if e.seq not in dropped])


def test_more_partitions_than_elements_discards():
    events = marathon_events([(k, 0) for k in range(10)] + [(k, 4) for k in range(10)])
    got, circuit = emulate(MARATHON, events, CircuitConfig(elements=4))
    # Runners 0-3 take the elements; 4-9 are discarded at Staten Island, then 0-3 cheat.
    assert circuit.counts()["discarded"] == 6
    assert got == [(k, 10 + k, k) for k in range(4)]


def test_idle_timers_free_elements_and_drop_their_partial_matches():
    # Runner 0 starts a match, then 30 tuples of runner 1 (no state): with a tick every 2
    # tuples runner 0's 4-bit timer (15) runs out, so its Manhattan does not match.
    records = [(0, 0)] + [(1, 5)] * 30 + [(0, 4), (2, 0), (2, 4)]
    events = marathon_events(records)
    got, circuit = emulate(MARATHON, events, CircuitConfig(elements=4, tick_tuples=2))
    assert circuit.counts()["expired"] == 1
    assert got == [(2, 33, 32)]
    got, circuit = emulate(MARATHON, events, CircuitConfig(elements=4, tick_tuples=4))
    assert circuit.counts()["expired"] == 0
    assert got == [(0, 31, 0), (2, 33, 32)]


@pytest.mark.parametrize("elements", [1, 3, 64])
def test_many_partitions_reuse_elements(elements):
    """Thousands of partitions through few elements: the partition hash stays consistent
    (every allocation is freed again), compared against the reference when lossless."""
    rng = np.random.default_rng(elements)
    records = list(zip(rng.integers(0, 3000, 6000).tolist(), rng.integers(0, 6, 6000).tolist()))
    events = marathon_events(records)
    got, circuit = emulate(MARATHON, events, CircuitConfig(elements=elements))
    dropped = set(circuit.dropped.tolist())
    assert got == expected(MARATHON, [e for e in events if e.seq not in dropped])
