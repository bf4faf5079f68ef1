"""The GPU MATCH engine (cep_accel.gpu.match_engine: one thread per partition key) against the
reference interpreter: the marathon and M-shape examples, overlapping predicates, every
incremental aggregate, generated streams for fixed queries, snapshots in the middle, idle
eviction, placement and `cep gpu verify`. Runs on the CUDA simulator (see conftest.py), on a
real GPU with CEP_GPU_DEVICE=1 (20x longer streams)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conftest import REAL, SCALE  # noqa: E402
from engine_harness import assert_same, jit_run, reference_run  # noqa: E402
from test_engine_match import STRING_ORDERING, word_rows  # noqa: E402

from cep_accel.gpu import placement  # noqa: E402
from cep_accel.gpu.match_engine import GpuMatchEngine  # noqa: E402
from cep_core import reference  # noqa: E402
from cep_core.batch import BatchEncoder, StringDictionary  # noqa: E402
from cep_core.checker import load_queries, load_query_text  # noqa: E402
from cep_core.engine_factory import match_engine  # noqa: E402
from cep_core.engine.seq import NotSupportedError  # noqa: E402
from cep_core.event_io import read_events  # noqa: E402
from cep_core.events import Event, Punctuation  # noqa: E402
from cep_core.schema import SchemaRegistry, StreamSchema  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MIXED = StreamSchema("mixed", {"symbol": "string", "price": "int", "volume": "int",
                               "ratio": "float", "flag": "bool", "ts": "timestamp"}, "ts")


def query(text: str):
    registry = SchemaRegistry()
    registry.add(MIXED)
    return load_query_text(text, registry)


def example(query_file: str, data: str, n: int):
    queries = [q for q in load_queries(ROOT / "examples" / query_file)
               if q.query.kind == "match"]
    events, _ = read_events(ROOT / "examples" / "data" / data, queries[0].schema)
    return queries, events[:n]


def walks(n: int, keys: int, seed: int = 7) -> list[Event]:
    """Random walks of `price` per symbol, with every attribute type."""
    rng = np.random.default_rng(seed)
    price = dict.fromkeys(range(keys), 5)
    out = []
    for i in range(n):
        k = int(rng.integers(0, keys))
        price[k] += int(rng.choice([-2, -1, 0, 1, 2]))
        out.append(Event(i, i // 2, {"symbol": f"S{k}", "price": price[k],
                                     "volume": int(rng.integers(0, 5)),
                                     "ratio": float(rng.integers(0, 8)) / 4,
                                     "flag": bool(rng.integers(0, 2)), "ts": i // 2}))
    return out


# ---------------------------------------------------------------- examples


def test_marathon_with_restore_in_the_middle():
    queries, events = example("marathon.cep", "checkpoints.jsonl", 590)
    got = assert_same(queries, events, sizes=(16, 41), restore_at=len(events) // 2,
                      factory=GpuMatchEngine)
    assert got, "the sample stream has cheaters"


def test_m_shape_grows_candidate_rows_and_restores():
    queries, events = example("finance.cep", "trades.jsonl", 400 * SCALE)
    got = assert_same(queries, events, sizes=(25, 64), restore_at=200 * SCALE,
                      factory=GpuMatchEngine)
    assert got, "the sample stream has double tops"
    engine = GpuMatchEngine(queries[0], StringDictionary())
    engine.process(BatchEncoder(queries[0].schema, engine.strings).from_events(events))
    assert engine.cap > 4, "the M-shape keeps more candidates than the first allocation"


# ---------------------------------------------------------------- predicates, aggregates

OVERLAPPING = """
    QUERY o FROM mixed PARTITION BY symbol
    PATTERN ( a (b | c)+ d | a c* e | . a? f )
    DEFINE a AS price > 4, b AS price > 2, c AS price > 3 OR flag, d AS volume = 0,
           e AS symbol = 'S1' AND ratio >= 1.25, f AS price % 3 = 0 AND NOT flag
    EMIT symbol = symbol, n = Count(), first = First(price), last = Last(price),
         mean = Average(ratio), lo = Min(symbol), up = upper(symbol), dt = Delta(ts)
"""

AGGREGATES = """
    QUERY g FROM mixed PARTITION BY symbol
    PATTERN ( a (b | c)* d )
    DEFINE a AS price >= 3,
           b AS price > First(price) AND Count() < 6 AND Max(symbol) >= symbol,
           c AS price <= Last(price) AND Sum(volume) > 1 OR Average(ratio) > 1.25,
           d AS Delta(ts) >= 2 AND Min(price) <= price AND Last(ratio) <= ratio
    EMIT n = Count(), hi = Max(price), lo = Min(ratio), total = Sum(volume),
         mean = Average(price), share = Sum(volume) / (price - 5), flag = First(flag),
         s = Last(symbol), span = Delta(ts)
"""


@pytest.mark.parametrize("text", [OVERLAPPING, AGGREGATES], ids=["overlapping", "aggregates"])
def test_fixed_queries_on_random_walks(text):
    got = assert_same(query(text), walks(300 * SCALE, keys=5), sizes=(1, 17, 60),
                      restore_at=150 * SCALE, factory=GpuMatchEngine)
    assert len(got) > 3


rows = st.lists(st.tuples(st.sampled_from(["S0", "S1", "S2"]), st.integers(0, 7),
                          st.integers(0, 3), st.sampled_from([0.0, 0.5, 1.25, 2.0]),
                          st.booleans(), st.sampled_from([0, 0, 1, 2, -1])),
                min_size=1, max_size=60)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=rows, which=st.sampled_from(["overlapping", "aggregates"]),
       sizes=st.lists(st.integers(1, 25), min_size=1, max_size=3),
       restore=st.integers(0, 70))
def test_generated_streams(rows, which, sizes, restore):
    text = OVERLAPPING if which == "overlapping" else AGGREGATES
    ts, stream = 0, []
    for i, (symbol, price, volume, ratio, flag, step) in enumerate(rows):
        ts += step  # now and then back in time: a dead letter in that partition
        stream.append(Event(i, ts, {"symbol": symbol, "price": price, "volume": volume,
                                    "ratio": ratio, "flag": flag, "ts": ts}))
    assert_same(query(text), stream, sizes=tuple(sizes),
                restore_at=restore if restore < len(stream) else None,
                factory=GpuMatchEngine)


# Deliberately like tests/test_engine_match.py's test of that name: the same case on the
# GPU engine, with the mixed stream's GPU columns
def test_no_partition_and_several_partition_attributes():
    for partition in ("", "PARTITION BY symbol, flag"):
        queries = query(f"""
            QUERY k FROM mixed {partition}
            PATTERN ( a . b? c ) DEFINE a AS price > 5, b AS flag, c AS price < Last(price)
            EMIT k = symbol, n = Count(), r = ratio
        """)
        got = assert_same(queries, walks(200 * SCALE, keys=4, seed=11), sizes=(3, 40),
                          restore_at=90, factory=GpuMatchEngine)
        assert got


def test_string_ordering_and_functions_after_new_strings_arrive():
    queries = query(STRING_ORDERING)
    stream = [Event(i, i, row) for i, row in enumerate(word_rows(200 * SCALE))]
    assert assert_same(queries, stream, sizes=(7, 50), restore_at=100,
                       factory=GpuMatchEngine)


# ---------------------------------------------------------------- eviction, placement, CLI


def test_idle_eviction_as_the_cpu_engine():
    [q] = query("""
        QUERY e FROM mixed PARTITION BY symbol
        PATTERN ( a b* c ) DEFINE a AS price > 5, b AS price > 0, c AS volume = 4
        EMIT n = Count()
    """)
    stream = walks(300 * SCALE, keys=6, seed=3)
    stream = stream[:150] + [Punctuation(stream[149].ts + 30)] + stream[150:]
    for timeout in (4, 1000):
        got, dead = jit_run([q], stream, sizes=(13,), restore_at=100,
                            factory=GpuMatchEngine, idle_timeout=timeout)
        want, want_dead = jit_run([q], stream, sizes=(13,), restore_at=100,
                                  idle_timeout=timeout)
        assert got == want and dead == want_dead
    assert (got, dead) == reference_run([q], stream)
    engines = [GpuMatchEngine(q, StringDictionary(), idle_timeout=4),
               match_engine(q, StringDictionary(), idle_timeout=4)]
    for engine in engines:
        engine.process(BatchEncoder(MIXED, engine.strings).from_events(stream[:150]))
        engine.punctuate(stream[149].ts + 30)
    assert engines[0].metrics["evicted_keys"] == engines[1].metrics["evicted_keys"] > 0
    assert engines[1].metrics["released_keys"] > 0  # the CPU engine also forgets idle keys


def test_placement_routes_match_queries():
    queries, events = example("marathon.cep", "checkpoints.jsonl", 200)
    [cheat] = queries
    forced = placement.place(cheat, "gpu")
    assert forced.target == "gpu" and "MATCH" in forced.reason
    auto = placement.place(cheat, "auto", expected_keys=10**6)
    if REAL:  # a million keys is past the GPU's minimum
        assert auto.target == "gpu" and "auto" in auto.reason
    else:
        assert auto.target == "cpu" and "no real GPU" in auto.reason
    [collect] = query("QUERY c FROM mixed PATTERN ( a b ) DEFINE a AS price > 1, "
                      "b AS price > 2 EMIT path = Collect(price)")
    where = placement.place(collect, "gpu")
    assert where.target == "cpu" and "Collect()" in where.reason
    with pytest.raises(NotSupportedError, match="Collect"):
        GpuMatchEngine(collect, StringDictionary())
    cpu_snapshot = match_engine(cheat, StringDictionary()).snapshot()
    with pytest.raises(ValueError, match="not a snapshot of the GPU MATCH engine"):
        GpuMatchEngine(cheat, StringDictionary()).restore(cpu_snapshot)
    report: list = []
    got = placement.run(queries, events, placement="gpu", batch_size=32, report=report)
    assert got == reference.run(queries, events) and got
    assert report[0].target == "gpu"


def test_cep_gpu_verify_on_the_marathon(tmp_path):
    from cep_service.cli.main import app
    lines = (ROOT / "examples/data/checkpoints.jsonl").read_text().splitlines()[:300]
    events = tmp_path / "checkpoints.jsonl"
    events.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(app, ["gpu", "verify", str(ROOT / "examples/marathon.cep"),
                                      "--events", str(events), "--batch-size", "50"])
    assert result.exit_code == 0, result.output
    assert "agree: cheat: gpu" in result.output
    assert "all 1 queries agree" in result.output
