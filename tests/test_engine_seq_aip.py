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

# ---------------------------------------------------------------- random streams

SCHEMAS = {
    # stream: (types, parameter attribute and values, numeric attribute and values)
    "rfid": (["O", "R", "D", "C"], ("item", [1, 2]), ("item", [1, 2, 3])),
    "abc": (["A", "B", "C"], ("p", [0, 1]), ("v", [0, 1, 2, 3])),
    "stocks": (["AAPL", "AMZN", "AVID"], ("volume", [1, 2]), ("open", [9.5, 10.0, 10.25, 11.0])),
}
TYPE_ATTRIBUTE = {"rfid": "type", "abc": "type", "stocks": "ticker"}


def make_row(stream: str, kind: str, param, value, ts: int) -> dict:
    if stream == "rfid":
        return {"type": kind, "item": param, "ts": ts}
    if stream == "abc":
        return {"type": kind, "p": param, "v": value, "ts": ts}
    return {"ticker": kind, "ts": ts, "open": float(value), "peak": float(value) + 1,
            "low": float(value) - 1, "close": float(value), "volume": param}


def random_stream(rng: random.Random, stream: str, n: int) -> list:
    """n events of few types and values, time steps 0-3 with ties, now and then a
    punctuation or an event whose time goes backwards (a dead letter)."""
    types, (_, params), (_, values) = SCHEMAS[stream]
    weights = [rng.random() + 0.2 for _ in types]
    ts = 0
    out: list = []
    for seq in range(n):
        step = rng.choice([0, 0, 1, 1, 1, 2, 3]) if rng.random() > 0.02 else -2
        ts = max(ts + step, 0)
        if rng.random() < 0.05:
            out.append(Punctuation(ts + rng.randint(0, 6)))
        kind = rng.choices(types, weights)[0]
        out.append(Event(seq, ts, make_row(stream, kind, rng.choice(params),
                                           rng.choice(values), ts)))
    return out


# ---------------------------------------------------------------- random queries

STRATEGIES = ["skip-till-any-match", "skip-till-next-match", "strict-contiguity"]


def random_query(rng: random.Random, strategy: str) -> tuple[str, str]:
    """(stream, query text) of a random SEQ query under `strategy`."""
    stream = rng.choice(sorted(SCHEMAS))
    any_match = strategy == "skip-till-any-match"
    by_ts = rng.random() < 0.3
    if any_match and rng.random() < 0.25:
        return stream, random_tesla(rng, stream, by_ts)
    types, (param, _), (num, values) = SCHEMAS[stream]
    tattr = TYPE_ATTRIBUTE[stream]

    def pick() -> str:
        return "ANY" if rng.random() < 0.06 else rng.choice(types)

    items = []  # (kind, [(type, var)]), kind: single, kleene, and
    singles, kleenes = [], []
    names = iter(range(100))
    for _ in range(rng.randint(2, 4)):
        choice = rng.choice(["single"] * 5 + ["kleene", "kleene", "and"])
        if choice == "kleene" and len(kleenes) < (2 if rng.random() < 0.3 else 1):
            var = f"k{next(names)}"
            items.append(("kleene", [(pick(), var)]))
            kleenes.append(var)
        elif choice == "and":
            members = [(pick(), f"g{next(names)}") for _ in range(2)]
            items.append(("and", members))
            singles += [v for _, v in members]
        else:
            var = f"s{next(names)}"
            items.append(("single", [(pick(), var)]))
            singles.append(var)
    negation = rng.choice([None, None, "start", "middle", "end"])
    window = rng.choice([None, 4, 6, 9])
    if window is None and (kleenes or negation in ("start", "end") or not any_match):
        window = rng.choice([4, 6])
    rendered = []
    policies = ["", "", "", "EACH "] + (["LAST ", "FIRST "] if not by_ts else [])
    for k, (kind, members) in enumerate(items):
        if kind == "single":
            (t, v), = members
            flt = rng.choice(["", "", "", f"({num} > {values[0]})"])
            policy = rng.choice(policies) if any_match and k < len(items) - 1 else ""
            rendered.append(f"{policy}{t} {v}{flt}")
        elif kind == "kleene":
            (t, v), = members
            flt = rng.choice(["", "", f"({num} >= {values[1]})"])
            bounds = rng.choice(["{1,2}", "{1,3}", "{2,3}", "{1}", "{2,}", ""])
            rendered.append(rng.choice([f"KLEENE({t} {v}{flt}){bounds}", f"{t}+ {v}"]))
        else:
            rendered.append("AND(" + ", ".join(f"{t} {v}" for t, v in members) + ")")
    neg_vars = []
    if negation is not None:
        neg_vars.append("n9")
        neg = f"NOT({rng.choice(types)} n9{rng.choice(['', f'({num} > {values[0]})'])})"
        position = {"start": 0, "end": len(rendered),
                    "middle": rng.randint(1, len(rendered) - 1)}[negation]
        rendered.insert(position, neg)
        if window is not None and rng.random() < 0.2:
            neg_vars.append("n8")
            rendered.insert(rng.choice([0, len(rendered)]), f"NOT({rng.choice(types)} n8)")
    positives = singles + kleenes
    order = {}  # step index of every variable (AND members share one)
    for i, r in enumerate(rendered):
        for v in [*singles, *kleenes, *neg_vars]:
            if f" {v}" in r and (f" {v})" in r or f" {v}(" in r or f" {v}," in r or
                                 r.endswith(f" {v}") or f" {v}{{" in r):
                order[v] = i
    conjuncts = []
    for _ in range(rng.randint(0, 3)):
        template = rng.choice(["param", "param", "param", "num", "agg", "window", "or",
                               "const", "neg", "neg", "str"])
        a, b = rng.sample(positives, 2) if len(positives) > 1 else (positives[0],) * 2
        if template == "param" and a != b:
            conjuncts.append(f"{a}.{param} = {b}.{param}")
        elif template == "num" and a != b:
            conjuncts.append(f"{a}.{num} {rng.choice(['<', '<=', '>', '!='])} {b}.{num}")
        elif template == "agg" and kleenes:
            k = kleenes[0]
            func = rng.choice(["count", "sum", "avg", "min", "max", "last", "first"])
            other = rng.choice(singles) if singles else None
            if func == "count":
                conjuncts.append(f"count({k}) <= 2")
            elif other is not None:
                conjuncts.append(f"{func}({k}.{num}) >= {other}.{num}")
            else:
                conjuncts.append(f"{func}({k}.{num}) > {values[1]}")
        elif template == "window" and singles:
            anchor = rng.choice(singles)
            t = rng.choice(types)
            func = rng.choice(["count", "avg", "max", "sum"])
            arg = f"{t} WITHIN 3 ticks FROM {anchor}" if func == "count" else \
                f"{t}({param} = {anchor}.{param}).{num} WITHIN 3 FROM {anchor}"
            bound = 1 if func == "count" else values[1]
            conjuncts.append(f"{func}({arg}) {rng.choice(['>=', '<'])} {bound}")
        elif template == "or" and a != b:
            conjuncts.append(f"({a}.{num} > {values[2]} OR {b}.{param} = {a}.{param})")
        elif template == "const":
            conjuncts.append(rng.choice(["1 < 2", "2 < 1"]) if rng.random() < 0.3 else "1 < 2")
        elif template == "neg" and neg_vars:
            conjuncts.append(f"{rng.choice(neg_vars)}.{param} = {a}.{param}")
        elif template == "str" and a != b:
            conjuncts.append(rng.choice([f"{a}.{tattr} < {b}.{tattr}",
                                         f"lower({a}.{tattr}) != upper({b}.{tattr})",
                                         f"{a}.{tattr} >= 'B'"]))
    # A condition on a LAST/FIRST step may only mention later steps.
    policy_of = {}
    for r in rendered:
        for word in ("LAST", "FIRST"):
            if r.startswith(word + " "):
                policy_of[r.split()[2].split("(")[0]] = word
    kept = []
    for c in conjuncts:
        mentioned = [v for v in [*positives, *neg_vars] if f"{v}." in c or f"({v})" in c
                     or f"FROM {v}" in c]
        if any(v in policy_of and any(order[w] <= order[v] for w in mentioned if w != v)
               for v in mentioned):
            continue
        kept.append(c)
    emits = []
    if singles and rng.random() < 0.5:
        s = rng.choice(singles)
        emits += [f"e1 = {s}.{num}", f"e2 = {s}.{param}"]
        if len(singles) > 1:
            emits.append(f"e3 = {s}.{num} / {singles[-1]}.{num}")
            emits.append(f"e9 = {s}.{num} > {singles[-1]}.{num}")
            emits.append(f"e10 = {singles[-1]}.{tattr}")
    if kleenes and rng.random() < 0.5:
        k = kleenes[0]
        emits += [f"e4 = count({k}) + 1", f"e5 = avg({k}.{num})", f"e6 = first({k}.{param})",
                  f"e8 = max({k}.{param})"]
    if singles and rng.random() < 0.25:
        emits.append(f"e7 = min({rng.choice(types)}.{num} WITHIN 4 FROM {singles[0]})")
    partition = rng.choice(["", "", "", "", f" PARTITION BY {param}",
                            f" PARTITION BY {param}", f" PARTITION BY {param}, {tattr}"])
    text = f"QUERY q FROM {stream}{partition} PATTERN SEQ({', '.join(rendered)})"
    if kept:
        text += " WHERE " + " AND ".join(kept)
    if window is not None:
        text += f" WITHIN {window}"
    if by_ts:
        text += " ORDER BY ts"
    if not any_match:
        text += f" USING {strategy}"
    if emits:
        text += " EMIT " + ", ".join(emits)
    return stream, text


def random_tesla(rng: random.Random, stream: str, by_ts: bool) -> str:
    types, (param, _), (num, values) = SCHEMAS[stream]
    n = rng.randint(1, 3)
    names = [f"t{i}" for i in range(n + 1)]  # t0 the terminator, then back in time
    parts = [f"{rng.choice(types)} t0"]
    policies = {}
    for i in range(1, n + 1):
        choices = ["EACH"] if by_ts else ["EACH", "LAST", "FIRST"]
        policies[names[i]] = policy = rng.choice(choices)
        anchor = names[rng.randint(0, i - 1)]
        flt = rng.choice(["", "", f"({num} >= {values[1]})"])
        parts.append(f"{policy} {rng.choice(types)} {names[i]}{flt} "
                     f"WITHIN {rng.choice([2, 4, 6])} FROM {anchor}")
    conjuncts = []
    for i in range(1, n + 1):
        later = [j for j in range(i) if j == 0 or policies[names[j]] == "EACH"]
        if rng.random() < 0.6:
            conjuncts.append(f"{names[i]}.{param} = {names[rng.choice(later)]}.{param}")
        if rng.random() < 0.3:
            conjuncts.append(f"{names[i]}.{num} > {values[1]}")
    if rng.random() < 0.25:
        conjuncts.append(f"count({rng.choice(types)} WITHIN 4 FROM t0) >= 2")
    text = f"QUERY q FROM {stream} DETECT {', '.join(parts)}"
    if conjuncts:
        text += " WHERE " + " AND ".join(conjuncts)
    if rng.random() < 0.2:
        text += f" WITHIN {rng.choice([3, 6])}"
    if by_ts:
        text += " ORDER BY ts"
    text += f" EMIT a = t0.{num}, b = {names[-1]}.{param}"
    return text


def random_case(seed: int, strategy: str):
    rng = random.Random(seed)
    stream, text = random_query(rng, strategy)
    events = random_stream(rng, stream, rng.randint(5, 40))
    sizes = tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 3)))
    n = sum(1 for e in events if isinstance(e, Event))
    restore_at = rng.choice([None, rng.randint(1, max(n, 1))])
    return text, events, sizes, restore_at


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
