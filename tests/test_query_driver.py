"""`cep_core.testing.QueryDriver`: queries driven step by step with explicit time. A MATCH
releases on its last event, a SEQ with WITHIN (trailing negation, timed-out partial match)
and a WINDOW pane only when `advance_time` passes their time; a snapshot restored into a
fresh driver gives the same later steps; and at every step the jitted engines give what the
reference interpreter gives on the same prefix of the input (events and punctuations)."""

from __future__ import annotations

import random

import pytest

from cep_core import reference
from cep_core.composite import sort_key
from cep_core.events import Event, Punctuation
from cep_core.testing import QueryDriver, assert_steps_agree

MATCH = """QUERY rise FROM trades PARTITION BY symbol
PATTERN ( a b ) DEFINE a AS TRUE, b AS price > Last(price)
EMIT symbol = symbol, gain = Last(price) - First(price);"""
NOT_C = """QUERY t FROM abc PARTITION BY p PATTERN SEQ(A a, B b, NOT(C c))
WHERE a.v = c.v WITHIN 4;"""
PARTIAL = """QUERY o FROM abc PARTITION BY p PATTERN SEQ(A a, B b) WITHIN 4
USING skip-till-next-match ON TIMEOUT EMIT PARTIAL;"""
WINDOW = """QUERY w INTO totals SELECT p, count(*) AS n, sum(v) AS total
FROM abc [RANGE 10 SLIDE 10] GROUP BY p;"""
ALL_KINDS = f"""{NOT_C}
{PARTIAL}
{WINDOW}
QUERY m FROM abc PARTITION BY p PATTERN ( a b+ ) DEFINE a AS type = 'A',
  b AS type = 'B' AND v >= Last(v) EMIT v = Last(v), n = Count();
QUERY s SELECT count(*) AS n, max(v) AS top FROM abc [RANGE 6 SLIDE 3];"""


def trade(symbol: str, price: int, ts: int) -> dict:
    return {"symbol": symbol, "price": price, "volume": 1, "ts": ts, "seqNum": 0}


def abc(kind: str, p: int, v: int, ts: int) -> dict:
    return {"type": kind, "p": p, "v": v, "ts": ts}


ENGINES = ["jit", "reference"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_match_is_released_by_its_last_event(engine):
    driver = QueryDriver(MATCH, engine=engine)
    assert driver.push([trade("IBM", 10, 1), trade("MSFT", 5, 2)]) == []
    found = driver.push(trade("IBM", 12, 3))  # one event: a dict
    assert found == [{"query": "rise", "key": "IBM", "seq": 2, "start_seq": 0,
                      "symbol": "IBM", "gain": 2}]
    assert driver.advance_time(1_000) == [] and driver.end() == []
    assert driver.output == found and driver.dead_letters == []


@pytest.mark.parametrize("engine", ENGINES)
def test_a_seq_within_is_decided_only_when_time_passes_it(engine):
    driver = QueryDriver(NOT_C, engine=engine)
    assert driver.push([abc("A", 1, 7, 0), abc("B", 1, 0, 1)]) == []
    assert driver.push(abc("A", 2, 7, 3)) == []  # another partition: no release
    assert driver.advance_time(4) == []  # at first.ts + WITHIN a C may still come
    released = driver.advance_time(5)
    assert [(c["query"], c["key"], c["seq"], c["start_seq"]) for c in released] == \
        [("t", 1, 1, 0)]
    assert driver.end() == []


@pytest.mark.parametrize("engine", ENGINES)
def test_a_partial_match_times_out_on_advance_time(engine):
    driver = QueryDriver(PARTIAL, engine=engine)
    assert driver.push([abc("A", 1, 0, 0), abc("C", 1, 0, 2)]) == []
    assert driver.advance_time(4) == []
    timed_out = driver.advance_time(9)
    assert [(c["key"], c["timed_out"], list(c["events"])) for c in timed_out] == \
        [(1, True, ["a"])]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_window_pane_is_released_by_advance_time(engine):
    driver = QueryDriver(WINDOW, engine=engine)
    assert driver.push([abc("A", 1, 2, 1), abc("B", 1, 3, 4), abc("A", 2, 5, 10)]) == []
    assert driver.advance_time(10) == []  # (0, 10] holds time 10: still open
    assert [(c["key"], c["window_end"], c["n"], c["total"])
            for c in driver.advance_time(11)] == [(1, 10, 2, 5), (2, 10, 1, 5)]
    assert driver.push(abc("A", 1, 1, 12)) == []
    assert [(c["key"], c["window_end"], c["n"]) for c in driver.end()] == [(1, 20, 1)]


def steps(seed: int, count: int = 14) -> list[tuple]:
    """Pushes of a few abc events (a bad record in the first and sometimes later, now and
    then an event whose time goes back) and advances of time, then the end."""
    rng = random.Random(seed)
    out, ts = [], 0
    for _ in range(count):
        if rng.random() < 0.3:
            ts += rng.randint(0, 6)
            out.append(("advance_time", ts))
            continue
        batch = []
        for _ in range(rng.randint(1, 5)):
            ts += rng.choice([0, 1, 1, 2, 3])
            back = rng.random() < 0.05
            batch.append(abc(rng.choice("AABBC"), rng.randint(1, 3), rng.randint(0, 4),
                             ts - 3 if back else ts))
        if rng.random() < 0.1 or not out:
            batch.insert(1, {"type": "A", "p": 1, "v": "seven", "ts": ts})
        out.append(("push", batch))
    return out + [("end",)]


@pytest.mark.parametrize("seed", range(4))
def test_every_step_equals_the_reference_on_the_same_prefix(seed):
    driver = QueryDriver(ALL_KINDS)
    index = {q.name: q.index for q in driver.queries.queries}
    schema = driver.queries.schema
    prefix: list = []  # the input so far, as the reference interpreter takes it
    seq = 0
    for name, *args in steps(seed):
        getattr(driver, name)(*args)
        if name == "push":
            for record in args[0]:
                if isinstance(record["v"], int):
                    prefix.append(Event(seq, record["ts"], {a: record[a]
                                                            for a in schema.attributes}))
                seq += 1
        elif name == "advance_time":
            prefix.append(Punctuation(args[0]))
        so_far = sorted(driver.output, key=lambda c: sort_key(c, index[c["query"]]))
        expected = reference.run(driver.queries.queries, prefix, flush=name == "end")
        assert so_far == expected, f"after {name}"
    assert driver.output and any(d.source == "<records>" for d in driver.dead_letters)


@pytest.mark.parametrize("seed", range(4))
def test_each_step_of_jit_equals_the_reference_driver(seed):
    outputs = assert_steps_agree(ALL_KINDS, steps(seed))
    assert sum(map(len, outputs)) > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_restored_snapshot_gives_the_same_later_steps(engine):
    plan = steps(11, count=20)
    cut = 9
    first = QueryDriver(ALL_KINDS, engine=engine)
    for name, *args in plan[:cut]:
        getattr(first, name)(*args)
    saved = first.snapshot()
    resumed = QueryDriver(ALL_KINDS, engine=engine)
    resumed.restore(saved)
    later = [(getattr(first, name)(*args), getattr(resumed, name)(*args))
             for name, *args in plan[cut:]]
    assert [a for a, _ in later] == [b for _, b in later]
    assert sum(len(a) for a, _ in later) > 0
    whole = QueryDriver(ALL_KINDS, engine=engine)
    for name, *args in plan:
        getattr(whole, name)(*args)
    assert whole.output[len(whole.output) - len(resumed.output):] == resumed.output


def test_dead_letters_and_misuse():
    driver = QueryDriver(MATCH)
    driver.push([trade("IBM", 10, 1), {"symbol": "IBM", "price": "high", "ts": 2}])
    driver.push([{**trade("IBM", 11, 3), "seq": 0}])  # seq not above the last one
    reasons = [d.reason for d in driver.take_dead_letters()]
    assert reasons[0].startswith("attribute 'price': expected int") and len(reasons) == 2
    assert driver.dead_letters == []
    with pytest.raises(ValueError, match="fresh QueryDriver"):
        driver.restore(QueryDriver(MATCH).snapshot())
    with pytest.raises(ValueError, match="jit driver's snapshot"):
        QueryDriver(MATCH, engine="reference").restore(driver.snapshot())
    driver.end()
    with pytest.raises(ValueError, match="after end"):
        driver.push(trade("IBM", 12, 4))
    with pytest.raises(ValueError, match="engine must be one of"):
        QueryDriver(MATCH, engine="fast")
