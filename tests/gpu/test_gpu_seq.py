"""GPU CDP (cep_accel.gpu.seq_engine) against the reference interpreter: example rules, R5,
generated streams, snapshots, host-resident columns. Runs on the CUDA simulator (see
conftest.py), on a real GPU with CEP_GPU_DEVICE=1."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conftest import SCALE  # noqa: E402
from engine_harness import assert_same  # noqa: E402

from cep_accel.gpu.seq_engine import GpuSeqEngine  # noqa: E402
from cep_core.checker import load_queries, load_query_text  # noqa: E402
from cep_core.event_io import read_events  # noqa: E402
from cep_core.events import Event  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def example(query_file: str, data: str, n: int):
    queries = load_queries(ROOT / "examples" / query_file)
    events, _ = read_events(ROOT / "examples" / "data" / data, queries[0].schema)
    return queries, events[:n]


@pytest.mark.parametrize("name", ["fire_each", "fire_last", "fire_first", "fire_avg"])
def test_fire_rules(name):
    queries, events = example("fire.cep", "sensors.jsonl", 600 * SCALE)
    q = next(q for q in queries if q.name == name)
    got = assert_same([q], events, sizes=(9, 31), factory=GpuSeqEngine)
    assert got, "the sample stream has matches"


def test_r4_each_then_last_with_restore():
    queries, events = example("r4.cep", "abc.jsonl", 150 * SCALE)
    got = assert_same(queries, events, sizes=(5, 17), restore_at=60 * SCALE,
                      factory=GpuSeqEngine)
    assert len(got) > 5


R5 = """
QUERY r5_{p} FROM rules INTO r5
DETECT C c, {P} B b WITHIN {w} FROM c, {P} A a WITHIN {w} FROM b
WHERE a.att = c.att AND b.att = c.att
EMIT att = c.att;
"""


def rules_stream(n: int, att_max: int, seed: int = 3, types="ABCDE"):
    rng = np.random.default_rng(seed)
    kinds = rng.integers(0, len(types), n).tolist()
    atts = rng.integers(1, att_max + 1, n).tolist()
    return [Event(i, i + 1, {"type": types[k], "att": a, "ts": i + 1})
            for i, (k, a) in enumerate(zip(kinds, atts))]


@pytest.mark.parametrize("policy", ["EACH", "LAST", "FIRST"])
def test_r5_small(policy):
    [q] = load_query_text(R5.format(p=policy.lower(), P=policy, w=40))
    got = assert_same([q], rules_stream(250 * SCALE, 4), sizes=(64,), factory=GpuSeqEngine)
    assert got


def test_host_resident_columns_when_device_memory_is_short():
    [q] = load_query_text(R5.format(p="each", P="EACH", w=40))
    stream = rules_stream(200 * SCALE, 4)
    got = assert_same([q], stream, sizes=(50,), factory=GpuSeqEngine,
                      device_memory_budget=1)
    assert got
    from cep_core.batch import StringDictionary
    engine = GpuSeqEngine(q, StringDictionary(), device_memory_budget=1)
    from cep_core.batch import BatchEncoder
    engine.process(BatchEncoder(q.schema, engine.strings).from_events(stream[:20]))
    assert engine.resident == "host"


PARTITIONED = """
QUERY pq FROM sensors INTO out
PARTITION BY area
DETECT Smoke s, {P} Temp t WITHIN 30 ms FROM s
WHERE t.value > s.value - {d}
EMIT area = s.area, v = t.value, hot = max(Temp(value > 1.5).value WITHIN 20 ms FROM s),
     n = count(Temp WITHIN 20 ms FROM s), mean = avg(Temp.value WITHIN 20 ms FROM s),
     lo = min(Temp(area = s.area).value WITHIN 20 ms FROM s);
"""

sensor_events = st.lists(
    st.tuples(st.sampled_from(["Temp", "Smoke"]), st.sampled_from(["n", "s"]),
              st.integers(0, 4).map(lambda v: v / 2), st.integers(0, 6)),
    min_size=1, max_size=40)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=sensor_events, policy=st.sampled_from(["EACH", "LAST", "FIRST"]),
       d=st.integers(0, 2))
def test_generated_partitioned_streams(rows, policy, d):
    [q] = load_query_text(PARTITIONED.format(P=policy, d=d))
    ts, stream = 0, []
    for i, (kind, area, value, gap) in enumerate(rows):
        ts += gap
        if i % 11 == 10:
            ts -= 3  # now and then an event back in time: a dead letter
        stream.append(Event(i, ts, {"kind": kind, "area": area, "value": value, "ts": ts}))
    assert_same([q], stream, sizes=(6, 13), factory=GpuSeqEngine)
