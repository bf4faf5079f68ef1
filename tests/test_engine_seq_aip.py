"""The jitted SEQ engine by incremental automata (AIP) against the reference interpreter.

Differential tests with hypothesis: random SEQ queries over the rfid, abc and stocks schemas
(2-4 positive items, parameters, a NOT at the start, middle or end, bounded and unbounded
Kleene closure with aggregates, AND groups, window aggregates, ORDER BY ts, EMIT; under
skip-till-any-match also EACH/LAST/FIRST and TESLA rules) for each of the three strategies,
over random streams (few types and values, small time steps with ties, the odd backwards
event and punctuation), fed in batches of random sizes with a snapshot/restore somewhere in
the middle, must give exactly the reference's composite events and dead letters. Every
seed draws a fresh query; examples are derandomized, so a second run reuses numba's cache.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
from engine_harness import assert_same, example_queries, jit_run, new_shapes
from random_seq import STRATEGIES, make_row, random_case
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_queries, load_query_text
from cep_core.engine.seq import NotSupportedError
from cep_core.engine.seq_aip import AipOverflowError
from cep_core.engine_factory import seq_aip_engine
from cep_core.event_io import read_events
from cep_core.events import Event, Punctuation

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
EXAMPLES_PER_STRATEGY = int(os.environ.get("SEQ_AIP_EXAMPLES", new_shapes(2, 6)))


def _differential(seed: int, strategy: str) -> None:
    text, events, sizes, restore_at = random_case(seed, strategy)
    queries = load_query_text(text)
    try:
        assert_same(queries, events, sizes=sizes, restore_at=restore_at,
                    factory=seq_aip_engine)
    except AssertionError as e:
        raise AssertionError(f"seed {seed}\n{text}\nsizes {sizes} restore_at {restore_at}"
                             f"\n{e}") from None


def _settings():
    return settings(max_examples=EXAMPLES_PER_STRATEGY, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow],
                    phases=[Phase.explicit, Phase.generate])  # shrinking would recompile


@_settings()
@given(st.integers(0, 2 ** 32 - 1))
def test_any_match_equals_reference(seed):
    _differential(seed, "skip-till-any-match")


@_settings()
@given(st.integers(0, 2 ** 32 - 1))
def test_next_match_equals_reference(seed):
    _differential(seed, "skip-till-next-match")


@_settings()
@given(st.integers(0, 2 ** 32 - 1))
def test_strict_contiguity_equals_reference(seed):
    _differential(seed, "strict-contiguity")


# ---------------------------------------------------------------- the examples


@pytest.mark.parametrize("path, name", example_queries("seq"))
def test_examples_equal_reference(path, name):
    [q] = [q for q in load_queries(path) if q.name == name]
    events, _ = read_events(EXAMPLES / "data" / f"{q.schema.stream}.jsonl", q.schema)
    out = assert_same([q], events, sizes=(1000, 7), restore_at=len(events) // 2,
                      factory=seq_aip_engine)
    assert out, f"{name} finds nothing in its sample data"


# ---------------------------------------------------------------- specific behaviour


def _events(stream: str, rows: list[tuple]) -> list[Event]:
    return [Event(i, ts, make_row(stream, kind, param, value, ts))
            for i, (kind, param, value, ts) in enumerate(rows)]


def _engine(q, **options):
    strings = StringDictionary()
    return seq_aip_engine(q, strings, **options), BatchEncoder(q.schema, strings)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_time_going_backwards_is_a_dead_letter_per_partition(strategy):
    [q] = load_query_text("QUERY q FROM abc PARTITION BY p PATTERN SEQ(A a, B b) WITHIN 5 "
                          f"USING {strategy}")
    rows = [("A", 0, 1, 10), ("A", 1, 1, 12), ("B", 0, 1, 11), ("B", 1, 1, 11),
            ("B", 0, 2, 13)]
    assert_same([q], _events("abc", rows), sizes=(2,), factory=seq_aip_engine)
    _, dead = jit_run([q], _events("abc", rows), factory=seq_aip_engine)
    assert dead == [("q", 3, "event time goes backwards")]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_trailing_negation_waits_for_punctuation_and_flush(strategy):
    [q] = load_query_text("QUERY q FROM rfid PATTERN SEQ(O o, D d, NOT(C c)) "
                          f"WHERE c.item = o.item WITHIN 10 USING {strategy}")
    rows = [("O", 1, 1, 0), ("D", 1, 1, 3), ("C", 2, 2, 5), ("O", 1, 1, 20), ("D", 1, 1, 21)]
    stream = _events("rfid", rows)
    stream = stream[:3] + [Punctuation(11)] + stream[3:]
    out = assert_same([q], stream, sizes=(1,), factory=seq_aip_engine)
    assert [c["seq"] for c in out] == [1, 4]
    engine, encoder = _engine(q)
    assert engine.process(encoder.from_events(stream[:3])) == []
    assert [c["seq"] for c in engine.punctuate(11)] == [1]
    assert engine.process(encoder.from_events(stream[4:])) == []
    assert [c["seq"] for c in engine.flush()] == [4]


def test_between_negation_kills_waiting_instances():
    """A cancelling event kills the instances waiting for the step after the NOT; the
    instances it could not cancel (another item) survive."""
    [q] = load_query_text("QUERY q FROM rfid PATTERN SEQ(O o, NOT(C c), D d) "
                          "WHERE c.item = o.item AND d.item = o.item WITHIN 100")
    rows = [("O", 1, 0, 0), ("O", 2, 0, 1), ("C", 1, 0, 2), ("D", 1, 0, 3), ("D", 2, 0, 4)]
    out = assert_same([q], _events("rfid", rows), sizes=(1,), factory=seq_aip_engine)
    assert [c["seq"] for c in out] == [4]
    engine, encoder = _engine(q)
    engine.process(encoder.from_events(_events("rfid", rows[:3])))
    assert engine.metrics()["instances"] == 1  # the O of item 1 was killed


def test_last_and_first_are_resolved_among_completed_instances():
    """R4: for each B, the latest A within 3 minutes before it with the same p."""
    [q] = [q for q in load_queries(EXAMPLES / "r4.cep")]
    rows = [("A", 1, 0, 0), ("A", 1, 0, 60_000), ("A", 2, 0, 70_000), ("B", 1, 20, 100_000),
            ("A", 1, 0, 110_000), ("B", 1, 30, 120_000), ("C", 1, 0, 130_000)]
    out = assert_same([q], _events("abc", rows), sizes=(1, 3), factory=seq_aip_engine)
    assert [(c["events"]["a"]["seq"], c["events"]["b"]["seq"]) for c in out] == \
        [(1, 3), (4, 5)]


def test_refuses_last_under_order_by_ts():
    [q] = load_query_text("QUERY q FROM abc DETECT C c, LAST B b WITHIN 5 FROM c ORDER BY ts")
    with pytest.raises(NotSupportedError, match="LAST/FIRST under ORDER BY ts"):
        seq_aip_engine(q, StringDictionary())
    [q] = load_query_text("QUERY q FROM abc DETECT C c, EACH B b WITHIN 5 FROM c ORDER BY ts")
    seq_aip_engine(q, StringDictionary())  # EACH is fine


KLEENE_BLOWUP = "QUERY q FROM abc PATTERN SEQ(A a, KLEENE(B k), C c) WITHIN 100"


def test_instance_cap_error_and_count():
    [q] = load_query_text(KLEENE_BLOWUP)
    rows = [("A", 0, 0, 0)] + [("B", 0, 0, i) for i in range(1, 17)] + [("C", 0, 0, 30)]
    engine, encoder = _engine(q, max_instances=1000)
    with pytest.raises(AipOverflowError, match="max_instances"):
        engine.process(encoder.from_events(_events("abc", rows)))
    engine, encoder = _engine(q, max_instances=1000, on_overflow="count")
    out = engine.process(encoder.from_events(_events("abc", rows)))
    assert engine.metrics()["instances"] <= 1000 and engine.metrics()["overflows"] > 0
    assert 0 < len(out) < 2 ** 16 - 1
    # 2^16 subsets (instances) are within the default cap.
    engine, encoder = _engine(q)
    out = engine.process(encoder.from_events(_events("abc", rows)))
    assert len(out) == 2 ** 16 - 1


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_memory_is_bounded_by_the_window(strategy):
    [q] = load_query_text("QUERY q FROM abc PATTERN SEQ(A a, KLEENE(C k){1,2}, B b) "
                          f"WHERE a.p = b.p WITHIN 50 USING {strategy}")
    engine, encoder = _engine(q)
    rows = [("ACB"[i % 3], i % 7, 0, i) for i in range(30_000)]
    for start in range(0, len(rows), 1000):
        chunk = _events("abc", rows[start:start + 1000])
        engine.process(encoder.from_events(
            [Event(e.seq + start, e.ts, e.attrs) for e in chunk]))
    m = engine.metrics()
    assert m["stored_events"] < 600 and m["instances"] < 5000, m
    assert len(engine.IT) < 65536 and m["pool_nodes"] < 70_000, m


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_many_partitions_long_stream(strategy):
    """Segment and arena regrowth, eviction, pool compaction and pending matches across
    many partitions and batches."""
    [q] = load_query_text("QUERY q FROM rfid PARTITION BY item PATTERN SEQ(O o, "
                          "KLEENE(R r){1,3}, D d, NOT(C c)) WHERE c.item = o.item WITHIN 30 "
                          f"USING {strategy} EMIT n = count(r)")
    rng = random.Random(11)
    rows, ts = [], 0
    for _ in range(3000):
        ts += rng.choice([0, 1, 1, 2])
        rows.append((rng.choice("OORRDDC"), rng.randint(1, 25), 0, ts))
    out = assert_same([q], _events("rfid", rows), sizes=(97, 13), restore_at=1500,
                      factory=seq_aip_engine)
    assert strategy == "strict-contiguity" or len(out) > 20


def test_equality_class_keys_instances_by_value():
    """R5 (Cugola & Margara) on a small stream: instances are kept per att value."""
    from cep_core.workloads import WORKLOADS

    spec = WORKLOADS["r5"]
    table = spec.generate(3000, 3)
    text = spec.query_text(seed=3).replace("100000", "400")
    queries = load_query_text(text)
    schema = queries[0].schema
    from cep_core.event_io import decode_record

    att = np.asarray(table.column("att"))
    table = table.set_column(table.schema.get_field_index("att"), "att",
                             [(att % 40 + 1).astype(np.int64)])
    events = [decode_record(row, schema, i) for i, row in enumerate(table.to_pylist())]
    out = assert_same(queries, events, sizes=(500, 77), restore_at=1500,
                      factory=seq_aip_engine)
    assert len(out) > 100
    engine, _ = _engine(queries[0])
    assert engine.class_attr == "att"
