"""Timed-out partial matches (`ON TIMEOUT EMIT PARTIAL`) against the reference interpreter.

Runs (skip-till-next-match, strict-contiguity) are evaluated by incremental automata (AIP);
the planner sends these queries there and the CDP engine refuses them. A few fixed queries
(each compiles once) over hypothesis streams: few types and partitions, small time steps,
punctuations, now and then an event whose time goes backwards; random batch sizes and a
snapshot/restore somewhere in the middle.
"""

from __future__ import annotations

import pytest
from engine_harness import assert_same
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_query_text
from cep_core.engine.seq import NotSupportedError
from cep_core.engine_factory import create_engine, seq_engine
from cep_core.engine.seq_aip import SeqAipEngine
from cep_core.events import Event, Punctuation

QUERIES = {
    "kleene": """QUERY k FROM abc PARTITION BY p
        PATTERN SEQ(A a, KLEENE(B b){1,3}, C c) WHERE b.v >= a.v
        WITHIN 6 USING skip-till-next-match ON TIMEOUT EMIT PARTIAL EMIT n = count(b)""",
    "strict_and": """QUERY s FROM abc PATTERN SEQ(A a, AND(B b, C c), A z) WITHIN 5
        USING strict-contiguity ON TIMEOUT EMIT PARTIAL""",
    "trailing_not": """QUERY t FROM abc PARTITION BY p PATTERN SEQ(A a, B b, NOT(C c))
        WHERE a.v = c.v WITHIN 4 USING skip-till-next-match ON TIMEOUT EMIT PARTIAL""",
}


def _stream(draw_rows) -> list:
    out, ts = [], 0
    for seq, (step, kind, p, v, punct) in enumerate(draw_rows):
        ts = max(ts + step, 0)
        if punct is not None:
            out.append(Punctuation(ts + punct))
        out.append(Event(seq, ts, {"type": kind, "p": p, "v": v, "ts": ts}))
    return out


ROWS = st.lists(st.tuples(st.sampled_from([0, 1, 1, 2, 3, -2]), st.sampled_from("ABC"),
                          st.integers(0, 1), st.integers(0, 2),
                          st.one_of(st.none(), st.none(), st.none(), st.integers(0, 9))),
                max_size=60)


@pytest.mark.parametrize("name", sorted(QUERIES))
@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(rows=ROWS, sizes=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       restore=st.one_of(st.none(), st.integers(1, 60)))
def test_timeouts_equal_reference(name, rows, sizes, restore):
    queries = load_query_text(QUERIES[name])
    assert_same(queries, _stream(rows), sizes=tuple(sizes), restore_at=restore)


def _abc(rows):
    return [Event(i, ts, {"type": kind, "p": p, "v": 0, "ts": ts})
            for i, (kind, p, ts) in enumerate(rows)]


def test_punctuation_reports_a_quiet_partition():
    queries = load_query_text(QUERIES["kleene"])
    stream = _abc([("A", 0, 0), ("B", 0, 1), ("A", 1, 2)]) + [Punctuation(8)]
    strings = StringDictionary()
    engine = create_engine(queries[0], strings)
    assert isinstance(engine, SeqAipEngine)
    batch = BatchEncoder(queries[0].schema, strings).from_events(stream[:3])
    assert engine.process(batch) == []
    # 8 > 0 + 6 (partition 0's run: a and b so far); 8 > 2 + 6 is false for partition 1
    out = engine.punctuate(8)
    assert [(c["key"], c["seq"], c["timed_out"], sorted(c["events"])) for c in out] == \
        [(0, 1, True, ["a", "b"])]
    assert "n" not in out[0]
    assert [c["key"] for c in engine.flush()] == [1]


def test_cdp_refuses_and_the_planner_routes_to_aip():
    queries = load_query_text(QUERIES["strict_and"])
    with pytest.raises(NotSupportedError):
        seq_engine(queries[0], StringDictionary(), algorithm="cdp")
    assert isinstance(create_engine(queries[0], StringDictionary()), SeqAipEngine)
