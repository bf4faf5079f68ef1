"""The AIP SEQ engine forgets idle partitions (option `idle_timeout`), as CDP does.

Partitions that never come back: once idle and holding nothing (no stored events, no
instances, no pending match) they give their ids to new partitions; under an equality
class, instance keys (partition, class value) without instances give theirs to new
instance keys. The id ranges stay near what is live within the timeout, and the output,
across a snapshot and restore, is still the reference's.
"""

from __future__ import annotations

import pytest
from test_engine_seq_idle import ANY_MATCH, RUNS, drifting_stream, released_on_drift, run_engine

from cep_core.batch import StringDictionary
from cep_core.checker import load_query_text
from cep_core.engine_factory import seq_aip_engine
from cep_core.events import Event

# v is equated across every positive variable: instances are kept per (partition, v)
CLASS = """QUERY e FROM abc PARTITION BY p PATTERN SEQ(A a, B b, C c)
    WHERE a.v = b.v AND b.v = c.v WITHIN 8"""


@pytest.mark.parametrize("text", [ANY_MATCH, RUNS, CLASS], ids=["any", "runs", "class"])
def test_aip_forgets_idle_partitions_and_reuses_their_ids(text):
    queries = load_query_text(text)
    engine, seen = released_on_drift(queries, seq_aip_engine)
    metrics = engine.metrics()
    assert len(engine.keys) < seen // 4  # without release: one id per partition ever seen
    assert engine.Q < seen // 2 * (3 if engine.class_attr else 1)
    if engine.class_attr is not None:  # (p, v) keys: up to 3 values per partition
        assert metrics["released_instance_keys"] > seen
    again = seq_aip_engine(queries[0], StringDictionary(), idle_timeout=12)
    again.restore(engine.snapshot())
    assert again.metrics() == engine.metrics()
    assert sorted(again.keys.free) == sorted(engine.keys.free)
    assert again.qfree[:again.n_qfree].tolist() == engine.qfree[:engine.n_qfree].tolist()


def test_without_timeout_nothing_is_released():
    queries = load_query_text(CLASS)
    engine = seq_aip_engine(queries[0], StringDictionary())
    run_engine(engine, drifting_stream(7, n=600))
    seen = len({e.attrs["p"] for e in drifting_stream(7, n=600) if isinstance(e, Event)})
    assert engine.metrics()["released_keys"] == 0
    assert engine.metrics()["released_instance_keys"] == 0
    assert len(engine.keys) == seen
