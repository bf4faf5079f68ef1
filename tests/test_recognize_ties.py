"""`ORDER BY ts, col [ASC|DESC], ...` in the jitted MATCH_RECOGNIZE engine
(cep_core/engine/recognize_ties.py): the rows of one time wait, then go in sorted, and the
engine answers as the interpreter engine does, call for call and in the same order
(composite events, dead letters, held seqs), across batchings, punctuations, a snapshot and
string compaction; damaged snapshots of the waiting rows are refused."""

from __future__ import annotations

import itertools
import math
import random
import re

import numpy as np
import pytest

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_query_text
from cep_core.compiler.recognize import compile_recognize
from cep_core.engine.recognize import RecognizeEngine
from cep_core.engine.recognize_interpreter import RecognizeInterpreterEngine
from cep_core.engine_factory import create_engine
from cep_core.errors import QueryError, QueryErrors
from cep_core.events import Event
from cep_core.reference.recognize import RecognizeRuntimeError
from cep_core.schema import SchemaRegistry, StreamSchema
from cep_core.stream_engines import compact_strings
from engine_harness import new_shapes
from tests.recognize_flink import differential

REGISTRY = SchemaRegistry()
REGISTRY.add(StreamSchema.from_dict({"stream": "ticks", "attributes": {
    "symbol": "string", "price": "int", "volume": "int", "ts": "timestamp", "seqNum": "int",
    "venue": "string", "score": "float", "flag": "bool"}, "time": "ts", "time_unit": "ms"}))
ORDERS = ["ts, price", "ts, price DESC", "ts, venue", "ts, venue DESC, volume", "ts, score",
          "ts, score DESC, seqNum", "ts, flag, price DESC", "ts, volume DESC, price",
          "ts, seqNum DESC"]


def _statement(rng: random.Random):
    """differential.statement's family over `ticks`, with a secondary ORDER BY (strings,
    floats with NaN and -0.0, bools, DESC), WITHIN in about half."""
    while True:
        text = differential.statement(rng).replace("FROM quotes", "FROM ticks")
        if rng.random() < 0.5:
            text = re.sub(r"WITHIN INTERVAL '\d+' SECOND", "", text)
        text = text.replace("ORDER BY rowtime", "ORDER BY " + rng.choice(ORDERS))
        try:
            [checked] = load_query_text(text, REGISTRY)
            return checked
        except (QueryError, QueryErrors):
            continue  # Flink refuses it, and so do we


def _events(count: int, rng: random.Random) -> list[Event]:
    """Tied rows (about half share their time with the row before), some late."""
    rows = differential.tied_rows(count, rng)
    for row in rows:
        row["venue"] = rng.choice(["X", "Y", "Z", "x", "Ä"])
        row["score"] = rng.choice([0.5, 1.5, -0.0, 0.0, 2.25, math.nan])
        row["flag"] = rng.random() < 0.5
        if rng.random() < 0.05:
            row["ts"] -= rng.choice([1000, 2000, 5000])
    return [Event(i, row["ts"], dict(row)) for i, row in enumerate(rows)]


def _alike(a: list[dict], b: list[dict]) -> bool:
    """Equal composite events (a NaN measure, an AVG of NaN scores, equals a NaN)."""
    def plain(c: dict) -> dict:
        return {k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in c.items()}
    return [plain(c) for c in a] == [plain(c) for c in b]


def _side_by_side(checked, events, sizes, punctuations, restore_at, compact) -> None:
    """The jit engine beside the interpreter engine: every call's composite events, the dead
    letters and the held seq are the same, in order."""
    strings = StringDictionary()
    jit = RecognizeEngine(compile_recognize(checked), strings)
    other = RecognizeInterpreterEngine(checked, StringDictionary())
    ours, theirs = BatchEncoder(checked.schema, strings), BatchEncoder(checked.schema,
                                                                        other.strings)
    at, calls = 0, 0
    for size in itertools.cycle(sizes):
        if at >= len(events):
            break
        chunk, at, calls = events[at:at + size], at + size, calls + 1
        got, want = jit.process(ours.from_events(chunk)), other.process(theirs.from_events(chunk))
        assert _alike(got, want), (at, got[:2], want[:2])
        assert jit.dead_letters == other.dead_letters, at
        assert jit.held_seq() == other.held_seq(), at
        if calls in punctuations:
            ts = chunk[-1].ts + punctuations[calls]
            assert _alike(jit.punctuate(ts), other.punctuate(ts)), (at, ts)
            assert jit.dead_letters == other.dead_letters, at
        if compact:
            compact_strings([jit], strings, slack=1.0, minimum=0)
        if restore_at is not None and at >= restore_at:
            restore_at = None
            snapshot, dead = jit.snapshot(), jit.dead_letters
            strings = StringDictionary()
            ours = BatchEncoder(checked.schema, strings)
            jit = RecognizeEngine(compile_recognize(checked), strings)
            jit.restore(snapshot)
            jit.dead_letters = dead
    assert _alike(jit.flush(), other.flush())
    assert jit.dead_letters == other.dead_letters


@pytest.mark.parametrize("seed", range(new_shapes(3, 40)))
def test_rows_of_one_time_go_in_sorted_as_the_interpreter_sends_them(seed):
    rng = random.Random(5000 + seed)
    checked = _statement(rng)
    events = _events(rng.choice([60, 200]), rng)
    cases = [((1000,), {}, None, False), ((1,), {3: 500, 9: 0, 20: 1500}, None, False),
             ((7, 3), {2: 1000, 5: 0}, rng.randrange(5, len(events)), True)]
    for sizes, punctuations, restore_at, compact in cases:
        try:
            _side_by_side(checked, events, sizes, punctuations, restore_at, compact)
        except RecognizeRuntimeError:
            pass  # AFTER MATCH SKIP stopped the query: both engines, as Flink does


def test_a_query_with_a_secondary_order_runs_jitted_and_sorts_its_ties():
    [checked] = load_query_text(
        "SELECT * FROM ticks MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts, price DESC "
        "MEASURES FIRST(A.price) AS a, LAST(B.price) AS b ONE ROW PER MATCH "
        "AFTER MATCH SKIP PAST LAST ROW PATTERN (A B) DEFINE B AS B.price < A.price) AS T",
        REGISTRY)
    engine = create_engine(checked, StringDictionary())
    assert isinstance(engine, RecognizeEngine)
    rows = [(1000, 5), (1000, 9), (1000, 7), (2000, 1)]  # one time: 9, 7, 5 go in
    events = [Event(i, ts, {"symbol": "S", "price": p, "volume": 1, "ts": ts, "seqNum": i,
                            "venue": "X", "score": 0.0, "flag": False})
              for i, (ts, p) in enumerate(rows)]
    out = engine.process(BatchEncoder(checked.schema, engine.strings).from_events(events))
    assert [(c["a"], c["b"]) for c in out] == [(9, 7)]
    assert engine.held_seq() == 3  # the row of time 2000 waits
    assert [(c["a"], c["b"]) for c in engine.flush()] == [(5, 1)]


TWO_TIES = ("SELECT * FROM ticks MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY {order} "
            "MEASURES FIRST(A.venue) AS v, LAST(B.price) AS b ONE ROW PER MATCH "
            "AFTER MATCH SKIP PAST LAST ROW PATTERN (A B+ C) "
            "DEFINE B AS B.price > A.price, C AS C.price < A.price) AS T")


def _checked(order: str = "ts, venue DESC, price"):
    [checked] = load_query_text(TWO_TIES.format(order=order), REGISTRY)
    return checked


def _waiting():
    """An engine with rows waiting in both partitions, and its snapshot's meta and arrays."""
    checked = _checked()
    engine = RecognizeEngine(compile_recognize(checked), StringDictionary())
    events = _events(30, random.Random(3))
    events += [Event(30 + i, 99_000, dict(events[i].attrs, ts=99_000)) for i in range(4)]
    engine.process(BatchEncoder(checked.schema, engine.strings).from_events(events))
    meta, arrays = engine.state()
    assert len(set(arrays["tie_kid"].tolist())) == 2
    return checked, engine, meta, arrays


def _load(checked, strings, meta, arrays):
    engine = RecognizeEngine(compile_recognize(checked), strings)
    engine.load_state(meta, arrays)
    return engine


def test_waiting_rows_survive_a_snapshot_and_are_held():
    checked, engine, meta, arrays = _waiting()
    again = _load(checked, engine.strings, meta, arrays)
    meta2, arrays2 = again.state()
    assert meta2 == meta and arrays2.keys() == arrays.keys()
    for name in arrays:
        assert np.array_equal(arrays2[name], arrays[name], equal_nan=True), name
    assert again.held_seq() == engine.held_seq() <= int(arrays["tie_seq"].min())
    assert _alike(again.flush(), engine.flush())


def _damaged(arrays, name, change):
    out = {k: v.copy() for k, v in arrays.items()}
    out[name] = change(out[name])
    return out


@pytest.mark.parametrize("name, change, why", [
    ("tie_ts", lambda ts: ts + np.arange(len(ts)), "two times"),
    ("tie_kid", lambda kid: kid + 100, "a key the snapshot does not have"),
    ("tie_seq", lambda seq: seq.astype(np.float64), "seq is not"),
    ("tie_kid", lambda kid: kid[:-1], "not one length"),
    ("tie_rank", lambda rank: rank * 0, "order of partitions is damaged"),
])
def test_damaged_waiting_rows_are_refused_with_the_reason(name, change, why):
    checked, engine, meta, arrays = _waiting()
    with pytest.raises(ValueError, match=why):
        _load(checked, engine.strings, meta, _damaged(arrays, name, change))


def test_a_waiting_rows_string_code_must_be_a_strings():
    checked, engine, meta, arrays = _waiting()
    venue = engine._pending.names.index("venue")
    bad = _damaged(arrays, f"tie_col{venue}", lambda codes: codes + 10_000)
    with pytest.raises(ValueError, match="not a string's code"):
        _load(checked, engine.strings, meta, bad)


def test_waiting_rows_are_refused_by_a_query_without_a_secondary_order():
    _, engine, meta, arrays = _waiting()
    with pytest.raises(ValueError, match="does not have"):
        _load(_checked("ts"), engine.strings, meta, arrays)


@pytest.mark.parametrize("end", ["punctuate", "flush"])
def test_a_late_row_that_waited_is_a_dead_letter_when_its_time_ends(end):
    # a row earlier than its partition's last taken time waits with its time's rows; when
    # a punctuation or the flush ends that time it goes in late: both engines report it
    # then, not at the next batch (the interpreter engine reported it only then: found by
    # the ties fuzzer, seed 367)
    [checked] = load_query_text(
        "SELECT * FROM ticks MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts, venue DESC "
        "MEASURES FIRST(A.price) AS a ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW "
        "PATTERN (A B) DEFINE B AS B.price < A.price) AS T", REGISTRY)
    rows = [("A", 1000), ("A", 1000), ("B", 2000), ("A", -1000)]
    events = [Event(i, ts, {"symbol": s, "price": 5, "volume": 1, "ts": ts, "seqNum": i,
                            "venue": "X", "score": 0.0, "flag": False})
              for i, (s, ts) in enumerate(rows)]
    for engine in (RecognizeEngine(compile_recognize(checked), StringDictionary()),
                   RecognizeInterpreterEngine(checked, StringDictionary())):
        encoder = BatchEncoder(checked.schema, engine.strings)
        engine.process(encoder.from_events(events[:3]))
        engine.punctuate(1500)  # A's rows of time 1000 go in
        engine.process(encoder.from_events(events[3:]))
        assert engine.dead_letters == []  # it waits with its time's rows
        if end == "punctuate":
            engine.punctuate(4000)
        else:
            engine.flush()
        assert engine.dead_letters == [(3, 'event time goes backwards in partition "A"')], \
            type(engine).__name__
