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

# ---------------------------------------------------------------- random streams

SCHEMAS = {
    # stream: (types, parameter attribute and values, numeric attribute and values)
    "rfid": (["O", "R", "D", "C"], ("item", [1, 2]), ("item", [1, 2, 3])),
    "abc": (["A", "B", "C"], ("p", [0, 1]), ("v", [0, 1, 2, 3])),
    "sensors": (["Temp", "Smoke"], ("area", ["n", "s"]), ("value", [44.5, 45.0, 46.5, 50.0])),
    "stocks": (["AAPL", "AMZN", "AVID"], ("volume", [1, 2]), ("open", [9.5, 10.0, 10.25, 11.0])),
}


TYPE_ATTRIBUTE = {"rfid": "type", "abc": "type", "sensors": "kind", "stocks": "ticker"}


def make_row(stream: str, kind: str, param, value, ts: int) -> dict:
    if stream == "rfid":
        return {"type": kind, "item": param, "ts": ts}
    if stream == "abc":
        return {"type": kind, "p": param, "v": value, "ts": ts}
    if stream == "sensors":
        return {"kind": kind, "area": param, "value": float(value), "ts": ts}
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


def random_query(rng: random.Random) -> tuple[str, str]:
    stream = rng.choice(sorted(SCHEMAS))
    if rng.random() < 0.25:
        return stream, random_tesla(rng, stream)
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
    if window is None and (kleenes or negation in ("start", "end")):
        window = rng.choice([4, 6])
    rendered = []
    for kind, members in items:
        if kind == "single":
            (t, v), = members
            flt = rng.choice(["", "", "", f"({num} > {values[0]})"])
            policy = rng.choice(["", "", "", "EACH ", "LAST ", "FIRST "])
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
        template = rng.choice(["param", "param", "num", "agg", "window", "or", "const",
                               "neg", "neg", "str"])
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
            conjuncts.append("1 < 2")
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
    if rng.random() < 0.3:
        text += " ORDER BY ts"
    if emits:
        text += " EMIT " + ", ".join(emits)
    return stream, text


def random_tesla(rng: random.Random, stream: str) -> str:
    types, (param, _), (num, values) = SCHEMAS[stream]
    n = rng.randint(1, 3)
    names = [f"t{i}" for i in range(n + 1)]  # t0 the terminator, then back in time
    parts = [f"{rng.choice(types)} t0"]
    policies = {}
    for i in range(1, n + 1):
        policies[names[i]] = policy = rng.choice(["EACH", "LAST", "FIRST"])
        anchor = names[rng.randint(0, i - 1)]
        flt = rng.choice(["", "", f"({num} >= {values[1]})"])
        parts.append(f"{policy} {rng.choice(types)} {names[i]}{flt} "
                     f"WITHIN {rng.choice([2, 4, 6])} FROM {anchor}")
    # A condition on a LAST/FIRST step may only mention later steps (smaller index here).
    conjuncts = []
    for i in range(1, n + 1):
        later = [j for j in range(i) if j == 0 or policies[names[j]] == "EACH"]
        if rng.random() < 0.5:
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
    if rng.random() < 0.25:
        text += " ORDER BY ts"
    text += f" EMIT a = t0.{num}, b = {names[-1]}.{param}"
    return text


def random_case(seed: int):
    rng = random.Random(seed)
    stream, text = random_query(rng)
    events = random_stream(rng, stream, rng.randint(5, 30))
    sizes = tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 3)))
    n = sum(1 for e in events if isinstance(e, Event))
    restore_at = rng.choice([None, rng.randint(1, max(n, 1))])
    return text, events, sizes, restore_at


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
    with pytest.raises(ValueError, match="unknown SEQ algorithm"):
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
