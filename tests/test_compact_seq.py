"""String compaction in the SEQ engines (CDP, AIP, GPU): `string_codes()` reports every
string code their state holds and `remap_strings(new_code)` renumbers it.

The harness compacts after every batch, keeping only the strings the engines report (slack
1), so a code held but not reported, or not renumbered, turns into a wrong composite event
against the reference: on the SEQ examples, on queries and streams of the strategies of
tests/test_engine_seq.py and tests/test_engine_seq_aip.py (sensor areas renamed as time
goes on, so strings come and go), with snapshots taken after compactions, by CDP and by AIP.
On a stream whose keys never come back, the dictionary stays bounded by the keys live
within the idle timeout.

Kernels compile slowly, so a few queries are drawn once and hypothesis varies the streams.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from engine_harness import assert_same, example_queries
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from random_seq import RUN_STREAMS, random_query, random_stream

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_queries, load_query_text
from cep_core.engine_factory import create_engine
from cep_core.stream_engines import compact_strings
from cep_core.event_io import read_events
from cep_core.events import Event, Punctuation

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("algorithm", ["auto", "aip"])
@pytest.mark.parametrize("path, name", example_queries("seq"))
def test_examples_with_compaction(path, name, algorithm):
    [q] = [q for q in load_queries(path) if q.name == name]
    events, _ = read_events(EXAMPLES / "data" / f"{q.schema.stream}.jsonl", q.schema)
    out = assert_same([q], events, sizes=(200, 7), restore_at=len(events) // 2,
                      compact=True, algorithm=algorithm)
    assert out


# ---------------------------------------------------------------- generated streams

def drift(events: list, every: int = 6) -> list:
    """Sensor areas renamed by time (`n` at ts 13 becomes `n2`): strings come and go."""
    out = []
    for e in events:
        if isinstance(e, Event) and "area" in e.attrs:
            e = Event(e.seq, e.ts, {**e.attrs, "area": f"{e.attrs['area']}{e.ts // every}"})
        out.append(e)
    return out


def _settings(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow],
                    phases=[Phase.explicit, Phase.generate])  # shrinking would recompile


def _example(file: str, name: str) -> str:
    """The text of one query of an example file."""
    return next(chunk for chunk in (EXAMPLES / file).read_text().split(";")
                if re.search(rf"^QUERY {name}\b", chunk, re.MULTILINE))


# Queries drawn once (kernels compile slowly): random_query(random.Random(seed)) of
# tests/random_seq.py, as tests/test_engine_seq.py draws them (16: PARTITION BY area, kind,
# Kleene max/first over areas, kind order, a window aggregate; 48: TESLA steps with the area
# equated, under AIP an equality class on a string) and SEQ examples (fire_each: the area
# equated; not_cancelled; ORDER BY ts over tickers), whose kernels the example tests share.
ANY_MATCH_QUERIES = [random_query(random.Random(16)), random_query(random.Random(48)),
                     ("sensors", _example("fire.cep", "fire_each")),
                     ("rfid", _example("rfid.cep", "not_cancelled")),
                     ("stocks", _example("stocks.cep", "falling_opens_ts"))]
# (stream, query) as tests/test_engine_seq_aip.py draws them (PARTITION BY p, type), and an
# example query
RUN_QUERIES = [random_query(random.Random(4), "skip-till-next-match", RUN_STREAMS),
               ("rfid", _example("rfid.cep", "duplicate_orders_next"))]


def _differential(stream_name: str, text: str, stream_seed: int, run_stream,
                  **options) -> None:
    rng = random.Random(stream_seed)
    events = drift(run_stream(rng, stream_name, rng.randint(5, 60)))
    sizes = tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 3)))
    n = sum(1 for e in events if isinstance(e, Event))
    restore_at = rng.choice([None, rng.randint(1, max(n, 1))])
    try:
        assert_same(load_query_text(text), events, sizes=sizes, restore_at=restore_at,
                    compact=True, **options)
    except AssertionError as e:
        raise AssertionError(f"{text}\nsizes {sizes} restore_at {restore_at}\n{e}") from None


@_settings(150)
@given(query=st.sampled_from(ANY_MATCH_QUERIES), stream_seed=st.integers(0, 2 ** 32 - 1),
       algorithm=st.sampled_from(["cdp", "aip"]))
def test_generated_any_match_with_compaction(query, stream_seed, algorithm):
    _differential(*query, stream_seed, random_stream, algorithm=algorithm)


@_settings(30)
@given(query=st.sampled_from(RUN_QUERIES), stream_seed=st.integers(0, 2 ** 32 - 1))
def test_generated_runs_with_compaction(query, stream_seed):
    _differential(*query, stream_seed, random_stream)


# ---------------------------------------------------------------- keys that never return

MINUTE = 60_000
# the area is the partition key; fire_each equates the area of its steps (under AIP an
# equality class: instances kept per area)
KEYED = """QUERY keyed FROM sensors PARTITION BY area PATTERN SEQ(Smoke s, Temp t)
    WHERE t.value >= s.value WITHIN 5 minutes EMIT v = t.value"""
IDLE = 8 * MINUTE


def passing_areas(seed: int, n: int) -> list:
    """Every 10 events three new areas, never seen again; time advances by 0-40 s."""
    rng = random.Random(seed)
    out, ts = [], 0
    for i in range(n):
        ts += rng.choice([0, 1, 1, 2]) * 20_000
        if rng.random() < 0.03:
            out.append(Punctuation(ts + rng.randint(0, 3) * 20_000))
        area = f"area-{i // 10}-{rng.randint(0, 2)}"
        out.append(Event(i, ts, {"kind": rng.choice(["Temp", "Smoke"]), "area": area,
                                 "value": rng.choice([44.5, 46.0, 48.0]), "ts": ts}))
    return out


def _largest_dictionary(queries, stream, **options) -> int:
    """Runs the stream, compacting after every batch; the largest dictionary size."""
    strings = StringDictionary()
    encoder = BatchEncoder(queries[0].schema, strings)
    engines = [create_engine(q, strings, **options) for q in queries]
    largest = 0
    for i in range(0, len(stream), 16):
        chunk = stream[i:i + 16]
        batch = encoder.from_events([e for e in chunk if isinstance(e, Event)])
        for engine in engines:
            engine.process(batch)
            for p in (p for p in chunk if isinstance(p, Punctuation)):
                engine.punctuate(p.ts)
        compact_strings(engines, strings, slack=1.0, minimum=0)
        largest = max(largest, len(strings))
    return largest


@pytest.mark.parametrize("algorithm", ["cdp", "aip"])
def test_dictionary_stays_bounded_when_keys_never_return(algorithm):
    queries = load_query_text(KEYED + ";\n" + _example("fire.cep", "fire_each"))
    stream = passing_areas(3, 1500)
    out = assert_same(queries, stream, sizes=(16, 5), restore_at=700, compact=True,
                      algorithm=algorithm, idle_timeout=IDLE)
    assert {c["query"] for c in out} == {"keyed", "fire_each"}
    seen = len({e.attrs["area"] for e in stream if isinstance(e, Event)})
    largest = _largest_dictionary(queries, stream, algorithm=algorithm, idle_timeout=IDLE)
    assert seen > 400 and largest < 40  # without compaction: every area ever seen


# ---------------------------------------------------------------- the GPU engine

# keyed by the event type: Temp appears late (after many areas), so its code moves when
# the areas before it are dropped
BY_KIND = """QUERY by_kind FROM sensors PARTITION BY kind PATTERN SEQ(Temp s, Temp t)
    WHERE t.area = s.area WITHIN 2 minutes EMIT area = t.area"""


def test_gpu_engine_with_compaction():
    """The GPU SEQ engine's keys and column rings, on numba's CUDA simulator where there
    is no GPU (as tests/gpu)."""
    from cep_accel.gpu import device

    assert device.use_simulator_if_no_gpu() != "none"
    from cep_accel.gpu.seq_engine import GpuSeqEngine

    queries = load_query_text(BY_KIND + ";\n" + _example("fire.cep", "fire_each"))
    stream = passing_areas(5, 300)
    stream = [Event(e.seq, e.ts, {**e.attrs, "kind": "Smoke"})
              if isinstance(e, Event) and e.seq < 40 else e for e in stream]
    out = assert_same(queries, stream, sizes=(16, 5), restore_at=150, compact=True,
                      factory=GpuSeqEngine)
    assert {c["query"] for c in out} == {"by_kind", "fire_each"}
