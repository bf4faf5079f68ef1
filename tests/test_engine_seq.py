"""The jitted SEQ engine (CDP) against the reference interpreter.

Differential tests with hypothesis: random SEQ queries (PATTERN SEQ and TESLA rules over the
rfid, abc, sensors and stocks schemas: 2-5 positive items, parameters, a NOT at the start,
middle or end, bounded Kleene closure, AND groups, EACH/LAST/FIRST with WITHIN ... FROM,
window aggregates, ORDER BY ts, EMIT) over random streams (few types and values, small time
steps with ties, the odd backwards event and punctuation), fed in batches of random sizes
with a snapshot/restore somewhere in the middle, must give exactly the reference's
composite events and dead letters. Every kernel is generated, compiled and cached once per
distinct query (the examples are derandomized, so a second run reuses numba's disk cache).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from engine_harness import assert_same, example_queries, jit_run, new_shapes
from random_seq import make_row, random_case
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_queries, load_query_text
from cep_core.event_io import read_events
from cep_core.events import Event, Punctuation
from cep_core.schema import SchemaRegistry, StreamSchema
from cep_core.engine_factory import create_engine, seq_engine
from cep_core.engine.seq import NotSupportedError, SeqEngine, SeqOverflowError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@settings(max_examples=int(os.environ.get("SEQ_EXAMPLES", new_shapes(12, 50))), deadline=None,
          derandomize=True, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.generate])  # shrinking a seed would only recompile
@given(st.integers(0, 2 ** 32 - 1))
def test_cdp_equals_reference_on_random_queries(seed):
    """Each seed draws a query and a stream (random.Random(seed), so that every example
    is a fresh query rather than a small mutation of the last one)."""
    text, events, sizes, restore_at = random_case(seed)
    queries = load_query_text(text)
    try:
        assert_same(queries, events, sizes=sizes, restore_at=restore_at, algorithm="cdp")
    except AssertionError as e:
        raise AssertionError(f"seed {seed}\n{text}\nsizes {sizes} restore_at {restore_at}"
                             f"\n{e}") from None


# ---------------------------------------------------------------- the examples


@pytest.mark.parametrize("path, name", example_queries("seq"))
def test_examples_equal_reference(path, name):
    """Every SEQ example through the planner (CDP for skip-till-any-match)."""
    [q] = [q for q in load_queries(path) if q.name == name]
    events, _ = read_events(EXAMPLES / "data" / f"{q.schema.stream}.jsonl", q.schema)
    out = assert_same([q], events, sizes=(1000, 7), restore_at=len(events) // 2)
    assert out, f"{name} finds nothing in its sample data"


# ---------------------------------------------------------------- specific behaviour


def _events(stream: str, rows: list[tuple]) -> list[Event]:
    return [Event(i, ts, make_row(stream, kind, param, value, ts))
            for i, (kind, param, value, ts) in enumerate(rows)]


def test_time_going_backwards_is_a_dead_letter_per_partition():
    [q] = load_query_text("QUERY q FROM abc PARTITION BY p PATTERN SEQ(A a, B b) WITHIN 5")
    rows = [("A", 0, 1, 10), ("A", 1, 1, 12), ("B", 0, 1, 11), ("B", 1, 1, 11),
            ("B", 0, 2, 13)]
    out = assert_same([q], _events("abc", rows), sizes=(2,))
    assert len(out) == 2
    _, dead = jit_run([q], _events("abc", rows))
    assert dead == [("q", 3, "event time goes backwards")]


def test_trailing_negation_waits_for_punctuation_and_flush():
    [q] = load_query_text("QUERY q FROM rfid PATTERN SEQ(O o, D d, NOT(C c)) "
                          "WHERE c.item = o.item WITHIN 10")
    rows = [("O", 1, 1, 0), ("D", 1, 1, 3), ("C", 2, 2, 5), ("O", 1, 1, 20), ("D", 1, 1, 21)]
    stream = _events("rfid", rows)
    stream = stream[:3] + [Punctuation(11)] + stream[3:]
    out = assert_same([q], stream, sizes=(1,))
    assert [c["seq"] for c in out] == [1, 4]
    strings = StringDictionary()
    engine = create_engine(q, strings)
    encoder = BatchEncoder(q.schema, strings)
    assert engine.process(encoder.from_events(stream[:3])) == []
    assert [c["seq"] for c in engine.punctuate(11)] == [1]
    assert engine.process(encoder.from_events(stream[4:])) == []
    assert [c["seq"] for c in engine.flush()] == [4]


def test_terminators_that_fill_the_output_and_pending_arrays_are_redone():
    """One terminator building more matches than the kernel's first output arrays (64)
    and pending table (16) hold: its enumeration is undone and redone with larger ones,
    also when its partition already has pending matches linked before it."""
    [plain] = load_query_text("QUERY q FROM abc PARTITION BY p PATTERN SEQ(A a, B b) "
                              "WITHIN 1000")
    [pending] = load_query_text("QUERY q FROM abc PARTITION BY p PATTERN "
                                "SEQ(A a, B b, NOT(C c)) WHERE c.v = a.v WITHIN 1000")
    rows = [("A", i % 2, i % 3, i) for i in range(150)] + [("B", 0, 0, 150)]
    rows += [("B", 1, 0, 151), ("C", 0, 1, 152), ("B", 0, 0, 153), ("A", 1, 0, 154),
             ("B", 1, 0, 155)]
    for q in (plain, pending):
        for sizes in ((1,), (7,), (1000,)):
            out = assert_same([q], _events("abc", rows), sizes=sizes)
            assert len(out) > 150


KLEENE_BLOWUP = "QUERY q FROM abc PATTERN SEQ(A a, KLEENE(B k), C c) WITHIN 100"


def test_kleene_blowup_is_capped():
    [q] = load_query_text(KLEENE_BLOWUP)
    rows = [("A", 0, 0, 0)] + [("B", 0, 0, i) for i in range(1, 17)] + [("C", 0, 0, 30)]
    strings = StringDictionary()
    batch = BatchEncoder(q.schema, strings).from_events(_events("abc", rows))
    engine = create_engine(q, strings, max_matches_per_event=1000)
    with pytest.raises(SeqOverflowError, match="max_matches_per_event"):
        engine.process(batch)
    engine = create_engine(q, StringDictionary(), max_matches_per_event=1000,
                           on_overflow="count")
    out = engine.process(BatchEncoder(q.schema, engine.strings).from_events(
        _events("abc", rows)))
    assert len(out) == 1000 and engine.metrics()["overflows"] == 1
    # 2^16 - 1 subsets are within the default limits.
    engine = create_engine(q, StringDictionary())
    out = engine.process(BatchEncoder(q.schema, engine.strings).from_events(
        _events("abc", rows)))
    assert len(out) == 2 ** 16 - 1


def test_algorithm_choice():
    [q] = load_query_text("QUERY q FROM abc PATTERN SEQ(A a, B b) WITHIN 5")
    engine = create_engine(q, StringDictionary())
    assert isinstance(engine, SeqEngine) and engine.algorithm == "cdp"
    assert create_engine(q, StringDictionary(), algorithm="cdp").algorithm == "cdp"
    with pytest.raises(NotSupportedError, match="algorithm 'aip'"):
        seq_engine(q, StringDictionary(), algorithm="aip")
    with pytest.raises(ValueError, match="SEQ algorithm must be one of"):
        seq_engine(q, StringDictionary(), algorithm="nfa")
    [q] = load_query_text("QUERY q FROM abc PATTERN SEQ(A a, B b) WITHIN 5 "
                          "USING skip-till-next-match")
    with pytest.raises(NotSupportedError, match="skip-till-next-match"):
        seq_engine(q, StringDictionary())
    assert create_engine(q, StringDictionary()).algorithm == "aip"


def test_memory_is_bounded_by_the_window():
    [q] = load_query_text("QUERY q FROM abc PATTERN SEQ(A a, B b) WHERE a.p = b.p "
                          "WITHIN 50")
    strings = StringDictionary()
    engine = create_engine(q, strings)
    encoder = BatchEncoder(q.schema, strings)
    rows = [("AB"[i % 2], i % 7, 0, i) for i in range(20_000)]
    for start in range(0, len(rows), 1000):
        chunk = _events("abc", rows[start:start + 1000])
        engine.process(encoder.from_events(
            [Event(e.seq + start, e.ts, e.attrs) for e in chunk]))
    assert engine.metrics()["stored_events"] < 400
    assert all(len(a) < 2048 for a in engine.AI)


def test_many_partitions_long_stream():
    """Arena regrowth, eviction and pending matches across many partitions and batches."""
    [q] = load_query_text("QUERY q FROM rfid PARTITION BY item PATTERN SEQ(O o, KLEENE(R r){1,2}, "
                          "D d, NOT(C c)) WHERE c.item = o.item WITHIN 30 EMIT n = count(r)")
    rng = random.Random(11)
    rows, ts = [], 0
    for _ in range(3000):
        ts += rng.choice([0, 1, 1, 2])
        rows.append((rng.choice("OORRDDC"), rng.randint(1, 25), 0, ts))
    out = assert_same([q], _events("rfid", rows), sizes=(97, 13), restore_at=1500)
    assert len(out) > 40


def test_bool_attributes_and_a_stream_of_its_own():
    registry = SchemaRegistry()
    registry.add(StreamSchema.from_dict({
        "stream": "flags", "attributes": {"kind": "string", "on": "bool", "x": "float",
                                          "ts": "timestamp"},
        "time": "ts", "time_unit": "ms", "type_attribute": "kind", "types": ["A", "B"]}))
    [q] = load_query_text("QUERY q FROM flags PATTERN SEQ(A a(on), NOT(B n(NOT on)), B+ b) "
                          "WHERE a.on = b.on AND n.x > a.x WITHIN 5 "
                          "EMIT f = a.on, g = last(b.on), h = a.x > 1.0", registry)
    rng = random.Random(1)
    events, ts = [], 0
    for i in range(200):
        ts += rng.choice([0, 1, 2])
        events.append(Event(i, ts, {"kind": rng.choice("AB"), "on": rng.random() < 0.6,
                                    "x": rng.choice([0.5, 1.5, 2.5]), "ts": ts}))
    out = assert_same([q], events, sizes=(7, 3), restore_at=100)
    assert out and all(c["f"] is True for c in out)
