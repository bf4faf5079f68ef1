"""The jitted MATCH_RECOGNIZE engine (cep_core/compiler/recognize.py, cep_core/engine/
recognize.py) against the reference interpreter, which answers as Flink 2.3 does: Flink's
committed statements, a generated family (quantifiers greedy and reluctant, every skip
mode, DEFINEs with PREV/LAST/FIRST/aggregates, WITHIN), several batch splits, punctuation,
snapshots mid-stream and string compaction; and the planner (engine_factory) that sends a
query the compiler does not take to the interpreter engine."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

from cep_core import reference
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_query_text
from cep_core.compiler.recognize import RecognizeUnsupported, compile_recognize
from cep_core.compiler.recognize_automaton import count_facts, decide
from cep_core.engine.recognize import RecognizeEngine
from cep_core.engine.recognize_interpreter import RecognizeInterpreterEngine
from cep_core.engine_factory import compile_program, create_engine
from cep_core.errors import QueryError, QueryErrors
from cep_core.events import Event, Punctuation
from cep_core.kernels import recognize_runtime as rt
from cep_core.workloads import MSHAPE_RECOGNIZE_DEFINE
from cep_core.recognize_pattern import recognize_elements
from cep_core.reference.recognize import RecognizeRuntimeError
from engine_harness import FULL, jit_run, new_shapes, reference_run
from tests.recognize_flink import differential

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("recognize_flink_*.json"))


def jit(checked, strings, **options):
    return RecognizeEngine(compile_recognize(checked), strings, **options)


def _checked(text: str):
    try:
        [checked] = load_query_text(text.replace("ORDER BY rowtime", "ORDER BY ts"))
    except (QueryError, QueryErrors):
        return None  # Flink refuses it, and so do we
    return checked


def _strict(text: str):
    [checked] = load_query_text(text)
    return checked


def _events(rows: list[dict]) -> list[Event]:
    return [Event(i, row["ts"], dict(row)) for i, row in enumerate(rows)]


def _fixture_statements():
    out = []
    for fixture in FIXTURES:
        spec = json.loads(fixture.read_text())
        for name in sorted(spec["statements"]):
            out.append((f"{fixture.stem}-{name}", spec["statements"][name], spec["rows"]))
    return out


STATEMENTS = _fixture_statements()
ACCEPTED = [(name, text, rows) for name, text, rows in STATEMENTS if _checked(text)]


def _same(checked, stream, sizes, restore_at=None, compact=False):
    """The jit's composites and dead letters equal the reference's (or both stop with
    the same error); returns the reference's composites."""
    try:
        want = reference_run([checked], stream)
    except RecognizeRuntimeError as e:
        with pytest.raises(RecognizeRuntimeError) as stopped:
            jit_run([checked], stream, sizes, restore_at, factory=jit, compact=compact)
        assert str(stopped.value) == str(e)
        return []
    got = jit_run([checked], stream, sizes, restore_at, factory=jit, compact=compact)
    assert got[0] == want[0], _first_difference(want[0], got[0])
    assert got[1] == want[1]
    return want[0]


def _beside_interpreter(checked, events):
    """The jit engine and the interpreter engine after each processed `events` as one
    batch, and their composite events."""
    strings = StringDictionary()
    engine = jit(checked, strings)
    other = RecognizeInterpreterEngine(checked, StringDictionary())
    got = engine.process(BatchEncoder(checked.schema, strings).from_events(events))
    want = other.process(BatchEncoder(checked.schema, other.strings).from_events(events))
    return engine, other, got, want


def _first_difference(want, got) -> str:
    for i, (w, g) in enumerate(zip(want, got)):
        if w != g:
            return f"#{i}: reference {w}, jit {g}"
    return f"reference {len(want)} composites, jit {len(got)}"


def test_the_compiler_takes_every_statement_flink_answers():
    # every committed statement the checker accepts compiles (`ORDER BY ts, col` too: the
    # engine sorts the rows of a time before the kernel takes them)
    assert len(ACCEPTED) >= 50
    for _, text, _ in ACCEPTED:
        compile_recognize(_checked(text))




# A few of Flink's statements in `make test` (each compiles its own kernels), all of them in
# `make test-full`.
_DRAWN = ACCEPTED if FULL else random.Random(32).sample(ACCEPTED, 4)


@pytest.mark.parametrize("name, text, rows", _DRAWN, ids=[d[0] for d in _DRAWN])
def test_flinks_statements_give_the_references_answers(name, text, rows):
    checked = _checked(text)
    events = _events(rows)
    found = _same(checked, events, (1000,))
    for sizes in ((1,), (7, 3, 50)):
        _same(checked, events, sizes)
    _same(checked, events, (9,), restore_at=len(events) // 2)
    assert found or name  # (some statements find nothing: the others find plenty)


def test_the_drawn_statements_find_matches():
    # the differential above is not vacuous
    found = 0
    for _, text, rows in _DRAWN:
        try:
            found += len(reference.run([_checked(text)], _events(rows)))
        except RecognizeRuntimeError:
            pass
    assert found > 20


@pytest.mark.parametrize("seed", range(new_shapes(2, 40)))
def test_a_generated_family_with_punctuation_splits_and_restores(seed):
    rng = random.Random(1000 + seed)
    rows = differential.rows(160, rng)
    checked = None
    while checked is None:
        checked = _checked(differential.statement(rng))
    events = _events(rows)
    stream: list = []
    for e in events:
        stream.append(e)
        if e.seq % 13 == 12:
            stream.append(Punctuation(e.ts + 2500))
    _same(checked, stream, (5, 17))
    _same(checked, stream, (4,), restore_at=rng.randrange(10, 150), compact=True)


SKIPS = ["AFTER MATCH SKIP PAST LAST ROW", "AFTER MATCH SKIP TO NEXT ROW",
         "AFTER MATCH SKIP TO FIRST B", "AFTER MATCH SKIP TO LAST B"]


WITHINS = ["", "WITHIN INTERVAL '5' SECOND"]
# each skip mode once in `make test` (with and without WITHIN in turn), every pair in full
_SKIP_CASES = [(s, w) for s in SKIPS for w in WITHINS] if FULL else \
    [(s, WITHINS[i % 2]) for i, s in enumerate(SKIPS)]


@pytest.mark.parametrize("skip, within", _SKIP_CASES)
def test_every_skip_mode_with_and_without_within(skip, within):
    text = ("SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
            "MEASURES FIRST(A.price) AS fa, LAST(B.price) AS lb, COUNT(*) AS n, "
            "AVG(B.price) AS ab, MIN(price) AS lo, SUM(B.volume) AS vb, "
            "LAST(B.price, 1) AS lb1, FIRST(B.price, 1) AS fb1, LAST(price, 1) AS pp, "
            f"MATCH_ROWTIME() AS at ONE ROW PER MATCH {skip} PATTERN (A B+? C) {within} "
            "DEFINE B AS B.price <= PREV(price) OR B.volume > 7, "
            "C AS C.price > A.price AND C.price / 2 > MIN(B.price) / 3) AS T")
    checked = _strict(text)
    rows = differential.rows(300, random.Random(7))
    found = _same(checked, _events(rows), (11, 2))
    assert len(found) > 5


def test_three_valued_logic_and_java_arithmetic():
    # NOT of an unknown is unknown (B's first row has no LAST(B.price, 1)); int / and %
    # truncate toward zero; AVG of ints is an int
    text = ("SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
            "MEASURES AVG(B.price) AS ab, (0 - SUM(B.price)) / 7 AS q, "
            "(0 - SUM(B.price)) % 7 AS r, LAST(B.price, 2) AS lb2 ONE ROW PER MATCH "
            "PATTERN (A B{2,4}? C) "
            "DEFINE B AS NOT (B.price < LAST(B.price, 1)) AND B.price IN (48, 49, 50, 51, 52) "
            "OR (LAST(B.price, 1) IS NULL AND B.volume > 2), "
            "C AS C.price < COALESCE(LAST(B.price, 1), 0) + 3) AS T")
    checked = _strict(text)
    found = _same(checked, _events(differential.rows(400, random.Random(3))), (13,))
    assert any(c["q"] != c["ab"] for c in found) and any(c["lb2"] is None for c in found)


def test_a_match_held_back_is_held_and_leaves_with_its_release_time():
    [checked] = load_query_text(
        "SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
        "MEASURES MATCH_ROWTIME() AS at, COUNT(*) AS n ONE ROW PER MATCH "
        "AFTER MATCH SKIP TO NEXT ROW PATTERN (A B*? C) WITHIN INTERVAL '4' SECOND "
        "DEFINE A AS A.volume > 5, C AS C.price > A.price + 10) AS T")
    # the match from row 1 completes on row 3 (65 > 50 + 10) while the one from row 0
    # (60: it needs more than 70) is alive: it waits until row 6 (75), or WITHIN
    prices = [60, 50, 50, 65, 50, 50, 75, 50, 61, 50, 50, 50, 50, 72, 50, 50]
    volume = [9, 9, 1, 1, 1, 1, 1, 9, 9, 1, 1, 1, 1, 1, 1, 1]
    events = [Event(i, 1000 * (i + 1), {"symbol": "S", "price": p, "volume": v,
                                        "ts": 1000 * (i + 1), "seqNum": i})
              for i, (p, v) in enumerate(zip(prices, volume))]
    strings = StringDictionary()
    engine = jit(checked, strings)
    other = RecognizeInterpreterEngine(checked, StringDictionary())
    encoder = BatchEncoder(checked.schema, strings)
    other_encoder = BatchEncoder(checked.schema, other.strings)
    held = []
    for cut in range(1, len(events) + 1):
        engine.process(encoder.from_events(events[cut - 1:cut]))
        other.process(other_encoder.from_events(events[cut - 1:cut]))
        assert engine.held_seq() == other.held_seq(), cut
        held.append(engine.held_seq())
    assert any(h is not None for h in held)
    found = _same(checked, events, (1,))
    assert any(c["at"] > 1000 * (c["seq"] + 1) for c in found)  # left after its last row


def test_a_skip_to_a_missing_variable_stops_the_query_as_flinks_does():
    text = ("SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
            "MEASURES COUNT(*) AS n ONE ROW PER MATCH AFTER MATCH SKIP TO LAST B "
            "PATTERN (A B* C) DEFINE B AS B.price > 1000, C AS C.price > 0) AS T")
    checked = _strict(text)
    events = _events(differential.rows(20, random.Random(1)))
    with pytest.raises(RecognizeRuntimeError, match="a match without B"):
        reference.run([checked], events)
    _same(checked, events, (3,))


def test_a_skip_that_stops_the_query_names_the_first_row_it_stops_on_in_a_batch():
    # two partitions, both stopping: the message names the earlier row in the batch (the
    # kernel of a query whose skip can stop it takes rows in their order, not key by key)
    text = ("SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
            "MEASURES COUNT(*) AS n ONE ROW PER MATCH AFTER MATCH SKIP TO FIRST B "
            "PATTERN (A B* C) DEFINE B AS B.price > 1000, C AS C.price > 0) AS T")
    checked = _strict(text)
    rows = [{"symbol": s, "price": 5, "volume": 1, "ts": 1_000 * (i + 1), "seqNum": i}
            for i, s in enumerate("BAAB")]  # A's match ends on seq 2, B's on seq 3
    with pytest.raises(RecognizeRuntimeError, match="rows 1-2"):
        reference.run([checked], _events(rows))
    for sizes in ((4,), (1,), (2, 2)):
        _same(checked, _events(rows), sizes)


def test_the_planner_runs_the_jit_where_it_compiles_and_the_interpreter_elsewhere():
    text = next(text for _, text, _ in ACCEPTED if "PATTERN (A" in text)  # it has an A
    ok = _checked(text)
    assert isinstance(create_engine(ok, StringDictionary()), RecognizeEngine)
    assert compile_program(ok) is compile_recognize(ok)
    far = _checked(text.replace("MEASURES ", "MEASURES LAST(A.price, 4) AS far, ", 1))
    assert far is not None
    with pytest.raises(RecognizeUnsupported, match="an offset over 3"):
        compile_recognize(far)
    assert isinstance(create_engine(far, StringDictionary()), RecognizeInterpreterEngine)
    assert compile_program(far) is not None  # the check still takes it: the interpreter runs it


def test_the_interpreter_engines_state_is_refused_with_the_reason():
    name, text, rows = ACCEPTED[0]
    checked = _checked(text)
    other = RecognizeInterpreterEngine(checked, StringDictionary())
    other.process(BatchEncoder(checked.schema, other.strings).from_events(_events(rows)[:30]))
    with pytest.raises(ValueError, match="not the jitted MATCH_RECOGNIZE engine's state"):
        jit(checked, StringDictionary()).restore(other.snapshot())


@pytest.mark.parametrize("chunk", [3, 64, 16384])
def test_rows_stepped_key_by_key_leave_in_the_order_of_the_batch(monkeypatch, chunk):
    # the kernel steps a chunk of rows key by key (cep_core/engine/recognize.py CHUNK):
    # composite events and dead letters still come in the interpreter engine's order, with
    # rows of five symbols interleaved, a row whose time goes back, and growing arrays
    import cep_core.engine.recognize as engine_module

    monkeypatch.setattr(engine_module, "CHUNK", chunk)
    text = ("SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
            "MEASURES FIRST(A.price) AS fa, LAST(C.price) AS lc, COUNT(*) AS n, "
            "MATCH_ROWTIME() AS at ONE ROW PER MATCH AFTER MATCH SKIP TO NEXT ROW "
            "PATTERN (A B*? C) WITHIN INTERVAL '9' SECOND "
            "DEFINE B AS B.price <= PREV(price), C AS C.price > A.price) AS T")
    checked = _strict(text)
    rng = random.Random(5)
    price = dict.fromkeys("PQRST", 50)
    events = []
    for i in range(600):
        symbol = rng.choice("PQRST")
        price[symbol] = max(1, price[symbol] + rng.randint(-3, 3))
        ts = 1000 * (i + 1) - (5000 if i == 300 else 0)  # row 300 goes back in time
        events.append(Event(i, ts, {"symbol": symbol, "price": price[symbol],
                                    "volume": 1, "ts": ts, "seqNum": i}))
    engine, other, got, want = _beside_interpreter(checked, events)
    assert len(want) > 100 and got == want
    assert engine.dead_letters == other.dead_letters and engine.dead_letters
    assert engine.flush() == other.flush()


def _typed_events(stream: str, count: int, pages: list[str]) -> list[Event]:
    """Rows of the clicks schema (string, bool and int columns) or of the ticks schema
    (float prices), keys interleaved, drawn with seed 7."""
    rng = random.Random(7)
    events = []
    for i in range(count):
        ts = 1000 * (i + 1)
        if stream == "clicks":
            row = {"session": rng.choice("uvwxy"), "page": rng.choice(pages),
                   "url": "/", "referrer": "", "bot": rng.random() < 0.3,
                   "latency": rng.randint(1, 9), "ts": ts}
        else:
            row = {"symbol": rng.choice("PQRST"), "price": rng.randint(90, 110) / 4,
                   "volume": rng.randint(1, 5), "time": ts}
        events.append(Event(i, ts, row))
    return events


_GROUPED = {
    "clicks": ("SELECT * FROM clicks MATCH_RECOGNIZE (PARTITION BY session ORDER BY ts "
               "MEASURES FIRST(A.latency) AS fl, LAST(B.page) AS lp, LAST(B.bot) AS lb, "
               "COUNT(*) AS n ONE ROW PER MATCH AFTER MATCH SKIP TO NEXT ROW "
               "PATTERN (A B+? C) DEFINE A AS NOT A.bot, "
               "B AS B.latency > PREV(latency) OR B.bot, "
               "C AS C.page = 'cart' AND NOT C.bot) AS T"),
    "ticks": ("SELECT * FROM ticks MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY time "
              "MEASURES FIRST(A.price) AS fa, LAST(B.price) AS lb, SUM(B.volume) AS v "
              "ONE ROW PER MATCH AFTER MATCH SKIP TO NEXT ROW PATTERN (A B+ C) "
              "DEFINE B AS B.price > PREV(price) AND B.volume > 2, "
              "C AS C.price < A.price) AS T"),
}


@pytest.mark.parametrize("stream", sorted(_GROUPED))
def test_bool_string_and_float_columns_pass_through_the_grouping(monkeypatch, stream):
    # the kernel's grouping copies each row's columns key by key (bool, string codes,
    # floats): small chunks, keys interleaved, the interpreter engine's answers
    import cep_core.engine.recognize as engine_module

    monkeypatch.setattr(engine_module, "CHUNK", 7)
    checked = _strict(_GROUPED[stream])
    events = _typed_events(stream, 500, ["home", "cart"])
    engine, other, got, want = _beside_interpreter(checked, events)
    assert len(want) > 20 and got == want
    assert engine.flush() == other.flush()


def test_a_keys_queue_of_partial_matches_stays_sorted_by_start():
    # the kernel appends to a key's new queue instead of sifting a heap
    # (compiler/recognize_kernel.py _step_lines): each queue must be sorted by start, the start
    # computation last, after every row, for every skip mode and WITHIN
    rows = differential.rows(300, random.Random(11))
    for skip, within in _SKIP_CASES:
        checked = _strict(
            "SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
            f"MEASURES COUNT(*) AS n ONE ROW PER MATCH {skip} PATTERN (A B+? C* D) "
            f"{within} DEFINE B AS B.price <= PREV(price) OR B.volume > 6, "
            "C AS C.price > LAST(B.price), D AS D.price > A.price) AS T")
        strings = StringDictionary()
        engine = jit(checked, strings)
        encoder = BatchEncoder(checked.schema, strings)
        for start in range(0, len(rows), 7):
            try:
                engine.process(encoder.from_events(_events(rows)[start:start + 7]))
            except RecognizeRuntimeError:
                break
            a = engine.arrays
            for k in range(len(engine.keys)):
                queue = a["ph"][k, :a["key_i"][k, rt.K_NPART]]
                starts = a["rec_i"][queue, rt.START]
                assert queue[-1] == 0 and (starts[1:] >= starts[:-1]).all(), (skip, within)


def test_the_automaton_bounds_each_states_row_counts():
    # count_facts: per automaton state, each variable's row count (and the match's) in
    # every record in that state; states no record is ever in (entered by PROCEED only)
    # get no branch in the kernel's step
    checked = _strict(
        "SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
        "MEASURES COUNT(*) AS n ONE ROW PER MATCH PATTERN (S R1+ D1+ R2+? D2* E) "
        "DEFINE R1 AS R1.price > S.price, D1 AS D1.price < LAST(R1.price), "
        "R2 AS R2.price > LAST(D1.price), D2 AS D2.price < LAST(R2.price), "
        "E AS E.price < S.price) AS T")
    program = compile_recognize(checked)
    names = [e.var for e in recognize_elements(checked.query.body.pattern)]
    facts = count_facts(program.tables, program.start_state, names)
    many = None
    rows = [[(0, 0)] * 7,  # (the match, S, R1, D1, R2, D2, E)
            [(1, 1), (1, 1)] + [(0, 0)] * 5,  # after S
            [(2, many), (1, 1), (1, many)] + [(0, 0)] * 4,  # R1's loop
            [(3, many), (1, 1), (1, many), (1, many)] + [(0, 0)] * 3,
            [(4, many), (1, 1), (1, many), (1, many), (1, many), (0, 0), (0, 0)],
            [(5, many), (1, 1), (1, many), (1, many), (1, many), (1, many), (0, 0)],
            # the final state: after E, D2 may have no rows (5: at least 5)
            [(5, many), (1, 1), (1, many), (1, many), (1, many), (0, many), (1, 1)]]
    known = [f for f in facts if f is not None]
    assert [[f[v] for v in [None, *names]] for f in known] == rows
    never = [s for s, f in enumerate(facts) if f is None]
    assert never and all(f"s == {s}:" not in program.source for s in never)
    assert f"s == {facts.index(known[2])}:" in program.source
    assert decide((1, many), "<=", 1) is None and decide((2, many), "<=", 1) is False
    assert decide((0, 0), "==", 0) is True and decide((5, many), ">", 4) is True
    assert decide((1, 3), "<", 4) is True and decide((1, 3), "==", 4) is False


def test_defines_and_takes_are_generated_per_state_without_the_count_tests_it_decides():
    # B's DEFINE after A (no B row yet: LAST(B.price, 1) is NULL, A.price is not) and in
    # B's loop (LAST(B.price, 1) is there) tests no row count; C's reads LAST(B.price, 1),
    # NULL where B has one row only: its generic form keeps that test. Each take knows
    # whether the match had rows, and its variable.
    checked = _strict(
        "SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
        "MEASURES FIRST(A.price) AS fa, MAX(price) AS hi ONE ROW PER MATCH "
        "PATTERN (A B+ C) "
        "DEFINE B AS B.price > COALESCE(LAST(B.price, 1), A.price), "
        "C AS C.price < LAST(B.price, 1)) AS T")
    program = compile_recognize(checked)
    source, width = program.source, program.rec_ints
    functions = dict(re.findall(r"\ndef (\w+)\(.*\n((?:    .*\n|\n)*)", source))
    # a record's cell, as the functions index their flat views
    count_test = re.compile(r"rec_i\[U\(\((r|dst)\) \* \d+ \+ \d+\)\] (==|<=|<|>|>=) \d+")
    b_forms = [body for name, body in functions.items() if name.startswith("d1_")]
    assert len(b_forms) == 2 and not any(count_test.search(body) for body in b_forms)
    assert "d1(" not in source  # B's generic DEFINE is never called
    assert count_test.search(functions["d2"]) and "<= 1)" in functions["d2"]
    takes = [body for name, body in functions.items() if name.startswith("take")]
    assert takes and not any("if v ==" in body or count_test.search(body) for body in takes)
    # the take from the start state (the match's first row) writes where it starts
    assert sum(f"rec_i[U((dst) * {width} + {rt.START})] = idx" in body for body in takes) == 2
    _same(checked, _events(differential.rows(300, random.Random(5))), (13, 2))


def test_the_start_computations_new_record_is_zeroed_not_copied_from_record_0():
    # record 0 (the start computation) is zeros but its START, which every take from it
    # writes: the first step writes constants instead of loading record 0 column by column
    # (the computations layout: SUM(B.price) differs between partial matches of one start)
    checked = _strict(
        "SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
        "MEASURES FIRST(A.price) AS fa, SUM(B.price) AS sb ONE ROW PER MATCH "
        "PATTERN (A B+ C) "
        "DEFINE B AS B.price > A.price, C AS C.price < LAST(B.price)) AS T")
    program = compile_recognize(checked)
    assert program.layout == rt.COMPUTATIONS
    source = program.source
    first_step = source.split("\n            c = 0\n", 1)[1].split("lp[nlp] = 0", 1)[0]
    assert f"rif[U((d) * {program.rec_ints} + c_)] = 0" in first_step
    assert "(rif, rff, c, d," not in first_step  # no copying take
    assert "(rif, rff, d," in first_step
    _same(checked, _events(differential.rows(300, random.Random(7))), (13, 2))


# ---------------------------------------------------------------- the runs layout

_RUNS_MEASURES = ["COUNT(*) AS n", "MAX(price) AS hi", "SUM(volume) AS vol",
                  "FIRST(A.seqNum) AS first_seq", "LAST(price) AS last_price",
                  "FIRST(price, 1) AS second", "AVG(price) AS mean", "MIN(volume) AS lo"]


def _runs_statement(rng: random.Random) -> str:
    """A statement whose partial matches of one start read alike (`_runs_plan`): A, the
    first row, then variables whose DEFINEs read A's row, the row before (PREV, or LAST
    of the variable before as the M-shape does) and the current row."""
    n = rng.randint(2, 5)
    names = ["A", "B", "C", "D", "E"][:n]
    middle = ["", "+", "*", "?", "{2}", "{1,3}", "+?", "*?", "{2,}"]
    last = ["", "{2}", "+?", "*?", "{1,3}?", "?"]
    quantified = [""] + [rng.choice(middle) for _ in names[1:-1]] + [rng.choice(last)]
    pattern = " ".join(v + q for v, q in zip(names, quantified))
    defines = []
    for i, v in enumerate(names[1:], 1):
        before = names[i - 1]
        prev = f"COALESCE(LAST({v}.price, 1), LAST({before}.price))"
        tests = [f"{v}.price > A.price", f"{v}.price < A.price", f"{v}.price >= {prev}",
                 f"{v}.price < {prev}", f"{v}.price <= PREV(price)", f"{v}.volume > 4",
                 f"{v}.price - A.price > 2", "COUNT(*) < 6"]
        test = " AND ".join(rng.sample(tests, rng.randint(1, 2)))
        if rng.random() < 0.2:
            test = f"({test}) OR {v}.volume = 9"
        defines.append(f"{v} AS {test}")
    skip = rng.choice(["AFTER MATCH SKIP PAST LAST ROW", "AFTER MATCH SKIP TO NEXT ROW", ""])
    within = rng.choice(["", "", "WITHIN INTERVAL '9' SECOND"])
    measures = ", ".join(rng.sample(_RUNS_MEASURES, rng.randint(1, 4)) +
                         [f"LAST({names[-1]}.seqNum) AS last_seq"])
    return ("SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
            f"MEASURES {measures} ONE ROW PER MATCH {skip} PATTERN ({pattern}) {within} "
            f"DEFINE {', '.join(defines)}) AS T")


def _flat_rows(count: int, rng: random.Random) -> list[dict]:
    """Prices in a narrow band (many DEFINEs hold at once: partial matches of one start
    branch and meet again, several in one state of a run)."""
    return [{"symbol": rng.choice("AB"), "price": rng.randint(48, 52),
             "volume": rng.randint(1, 9), "ts": 1_000 * (i + 1), "seqNum": i}
            for i in range(count)]


def test_the_runs_layout_is_taken_where_partial_matches_of_one_start_read_alike():
    mshape = compile_recognize(_strict(MSHAPE_SQL))
    assert mshape.layout == rt.STATES  # runs of one partial match each (below)
    # one branch-free step for every state: no dispatch on a computation's state, and the
    # DEFINEs that read alike (the first row, the row before) generated once
    assert "s == " not in mshape.source and "x6 != 0" not in mshape.source
    assert len(re.findall(r"\ndef d\d", mshape.source)) == 4
    base = ("SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
            "MEASURES {m} ONE ROW PER MATCH {skip} PATTERN (A B+ C) "
            "DEFINE B AS B.price > {b}, C AS C.price < LAST(B.price)) AS T")
    runs = dict(m="COUNT(*) AS n, MAX(price) AS hi", skip="", b="A.price")
    assert compile_recognize(_strict(base.format(**runs))).layout == rt.STATES
    branching = base.replace("B+ C", "B*? C+ D").replace(
        "C.price < LAST(B.price)", "C.price >= A.price, D AS D.price < A.price")
    assert compile_recognize(_strict(branching.format(**runs))).layout == rt.RUNS
    for other in (dict(runs, m="SUM(B.price) AS sb"),  # B's rows differ per partial match
                  dict(runs, m="COUNT(B.price) AS nb"),
                  dict(runs, b="LAST(B.price, 2)"),  # two rows back, B's or A's
                  dict(runs, skip="AFTER MATCH SKIP TO LAST B")):
        assert compile_recognize(_strict(base.format(**other))).layout == rt.COMPUTATIONS


MSHAPE_SQL = ("SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
              "MEASURES FIRST(S.seqNum) AS first_seq, LAST(E.seqNum) AS last_seq, "
              "COUNT(*) AS n, MAX(price) AS max_price ONE ROW PER MATCH "
              f"AFTER MATCH SKIP PAST LAST ROW {MSHAPE_RECOGNIZE_DEFINE}) AS T")


@pytest.mark.parametrize("seed", range(new_shapes(6, 60)))
def test_runs_give_the_references_answers_in_any_batches_and_across_a_restore(seed):
    rng = random.Random(7000 + seed)
    statements = [_strict(MSHAPE_SQL)] if seed == 0 else []
    while len(statements) < 4:
        checked = _checked(_runs_statement(rng))  # (None: Flink refuses it)
        if checked is not None and compile_recognize(checked).layout in (rt.RUNS, rt.STATES):
            statements.append(checked)
    for checked in statements:
        for rows in (differential.rows(240, rng), _flat_rows(240, rng)):
            events = _events(rows)
            _same(checked, events, (1000,))
            _same(checked, events, (rng.randint(1, 9), rng.randint(1, 40)),
                  restore_at=rng.randrange(len(events)))


def test_runs_of_one_partial_match_are_stepped_by_a_table_of_states():
    # the M-shape's greedy quantifiers: from every state, at most one TAKE edge fires on a
    # row (after R1+, D1 takes a row only where R1 does not hold); R2 and D2 both stay in
    # R2's loop unless the row is below the row before (`>=` against `<` of the same
    # operands), so a run is one state, stepped by one lookup
    program = compile_recognize(_strict(MSHAPE_SQL))
    assert program.layout == rt.STATES
    assert "STEP = np.array(" in program.source
    # indexed by the DEFINEs' conjuncts: a run's two comparisons with its first row's price
    # (`<` is `>=`'s negation: ints), and once per row the one with the row before
    assert "    base = q0 * 4\n" in program.source
    assert "v = STEP[U(x * 8 + base + (p0 | (p1 << 1)))]" in program.source
    assert len(program.rows.counts) == 5  # S R1 D1 R2 D2's loops, numbered 1-5
    # one column for the five counts, and no start time (no WITHIN)
    assert max(program.rows.ints.values()) + 1 == 6
    # the key's row keeps the price before alone: LAST(E.seqNum), which no DEFINE reads,
    # a completed match takes from its last row
    assert len(program.rows.key_ints) == 1 and "rec_i[dst, 16] = a1" in \
        program.source.split("def run_end(")[1].split("\n\n")[0]
    assert program.rows.widths[0] == 8  # (rows of whole cache lines)
    # the same but D2 may hold where R2 does (`<=`): a run in R2 goes on in both
    overlapping = MSHAPE_SQL.replace("D2.price < COALESCE(LAST(D2.price, 1)",
                                     "D2.price <= COALESCE(LAST(D2.price, 1)")
    assert overlapping != MSHAPE_SQL
    assert compile_recognize(_strict(overlapping)).layout == rt.RUNS
    rng = random.Random(11)
    for text in (MSHAPE_SQL, overlapping):
        events = _events(_flat_rows(400, rng))
        assert _same(_strict(text), events, (1000,))
        _same(_strict(text), events, (1, 7, 60), restore_at=150)


def test_a_run_completing_before_any_other_ends_the_step_past_last_row():
    # AFTER MATCH SKIP PAST LAST ROW: a match completed by the key's first live run, with
    # none waiting, leaves on this row and every run with it, so the runs after it are not
    # stepped; not so where the skip keeps later runs (TO NEXT ROW), nor where a match
    # waits (it is not the first), nor past an earlier run
    past = compile_recognize(_strict(MSHAPE_SQL)).source
    assert "            if w == 0 and waiting == 0:\n                w = 1\n                break" \
        in past
    next_row = MSHAPE_SQL.replace("SKIP PAST LAST ROW", "SKIP TO NEXT ROW")
    assert compile_recognize(_strict(next_row)).layout == rt.STATES
    assert "waiting == 0" not in compile_recognize(_strict(next_row)).source
    within = MSHAPE_SQL.replace("PATTERN (S R1+ D1+ R2+? D2* E)",
                                "PATTERN (S R1+ D1+ R2+? D2* E) WITHIN INTERVAL '40' SECOND")
    assert "waiting = key_i[k, 2]" in compile_recognize(_strict(within)).source.replace(
        "kif[U((k) * 5 + 2)]", "key_i[k, 2]")  # (after `advance`, which may release some)
    rng = random.Random(14)
    for text in (MSHAPE_SQL, next_row, within):
        for rows in (_flat_rows(500, rng), differential.rows(500, rng)):
            events = _events(rows)
            assert _same(_strict(text), events, (1000,)) or text == within
            _same(_strict(text), events, (1, 9, 80), restore_at=rng.randrange(500))


def test_float_comparisons_are_each_a_conjunct_of_the_table_and_answer_as_the_reference():
    # a float may be NaN, where `<` and `>=` both fail: neither stands for the other's
    # negation, so a run's step compares three times and the row's two bits are its own
    text = (MSHAPE_SQL.replace("FROM quotes", "FROM ticks")
            .replace("ORDER BY ts", "ORDER BY time")
            .replace("S.seqNum", "S.volume").replace("E.seqNum", "E.volume"))
    program = compile_recognize(_strict(text))
    assert program.layout == rt.STATES
    assert "    base = q0 * 8 + q1 * 16\n" in program.source
    assert "v = STEP[U(x * 32 + base + (p0 | (p1 << 1) | (p2 << 2)))]" in program.source
    rng = random.Random(12)
    rows = [{"symbol": rng.choice("AB"), "price": rng.choice([49.5, 50.0, 50.25, 51.0]),
             "volume": i, "time": 1_000 * (i + 1)} for i in range(400)]
    events = [Event(i, row["time"], row) for i, row in enumerate(rows)]
    assert _same(_strict(text), events, (1000,))
    _same(_strict(text), events, (1, 7, 60), restore_at=150)


def test_a_snapshot_whose_runs_keep_their_start_time_restores_without_it():
    # before 2026-11-30 a run kept its start time (START_TS) without WITHIN too: such a
    # snapshot's columns move to this version's places; one lacking a column is refused
    checked = _strict(MSHAPE_SQL)
    program = compile_recognize(checked)
    rows = program.rows
    assert rt.START_TS not in rows.ints  # (no WITHIN: nothing reads it)
    events = _events(differential.rows(300, random.Random(6)))
    strings = StringDictionary()
    encoder = BatchEncoder(checked.schema, strings)
    want = jit(checked, strings).process(encoder.from_events(events))
    first = jit(checked, strings)
    got = first.process(encoder.from_events(events[:170]))
    meta, arrays = first.state()
    assert arrays["key_i"][:, rt.K_NPART].max() >= 2
    # the old places (`run_rows` then): START_TS after where and when a run started
    firsts = [rt.START_SEQ, rt.START]
    run = firsts + sorted((set(rows.run_ints) | {rt.START_TS}) - set(firsts))
    places = {c: j for j, c in enumerate(run)}
    key = {c: len(firsts) + j for j, c in enumerate(sorted(rows.key_ints))}
    ph = np.full(arrays["ph"].shape[:2] + (8,), -7, np.int64)
    for column in rows.run_ints:
        ph[:, 1:, places[column]] = arrays["ph"][:, 1:, rows.ints[column]]
    for column in rows.key_ints:
        ph[:, 0, key[column]] = arrays["ph"][:, 0, rows.ints[column]]
    places |= key
    described = " ".join(f"i{c}>{j}" for c, j in sorted(places.items())) + " padded"
    assert described != rows.describe()
    second = jit(checked, strings)
    second.load_state(dict(meta, rows=described), dict(arrays, ph=ph))
    got += second.process(encoder.from_events(events[170:]))
    assert want and got == want
    lacking = " ".join(f"i{c}>{j}" for c, j in sorted(places.items())[1:])
    for bad in (lacking, "i1>99", 5):
        with pytest.raises(ValueError, match="snapshot's runs keep other columns"):
            jit(checked, strings).load_state(dict(meta, rows=bad), dict(arrays, ph=ph))


def test_a_runs_snapshot_of_a_query_now_kept_as_states_restores_or_is_refused():
    # a run of one partial match: its counts become its state's number; counts that are
    # not one partial match are not this query's runs
    checked = _strict(MSHAPE_SQL)
    program = compile_recognize(checked)
    events = _events(differential.rows(300, random.Random(5)))
    strings = StringDictionary()
    encoder = BatchEncoder(checked.schema, strings)
    whole = jit(checked, strings)
    want = whole.process(encoder.from_events(events))
    first = jit(checked, strings)
    got = first.process(encoder.from_events(events[:170]))
    meta, arrays = first.state()
    rows, npart = program.rows, arrays["key_i"][:, rt.K_NPART]
    assert npart.max() >= 2
    # the same state as the runs layout keeps it: every count in a column of its own
    places = {c: j for j, c in enumerate(sorted(set(rows.ints) | set(rows.counts)))}
    ph = np.zeros(arrays["ph"].shape[:2] + (len(places),), np.int64)
    for column in rows.run_ints:
        ph[:, 1:, places[column]] = arrays["ph"][:, 1:, rows.ints[column]]
    for column in rows.key_ints:
        ph[:, 0, places[column]] = arrays["ph"][:, 0, rows.ints[column]]
    state = arrays["ph"][:, 1:, rows.ints[rows.counts[0]]]
    for number, column in enumerate(rows.counts, 1):
        ph[:, 1:, places[column]] = state == number
    described = " ".join(f"i{c}>{j}" for c, j in sorted(places.items()))
    runs_meta = dict(meta, layout=rt.RUNS, rows=described)
    second = jit(checked, strings)
    second.load_state(runs_meta, dict(arrays, ph=ph))
    live = np.arange(ph.shape[1] - 1)[None, :] < npart[:, None]
    assert np.array_equal(second.state()[1]["ph"][:, 1:][live], arrays["ph"][:, 1:][live])
    got += second.process(encoder.from_events(events[170:]))
    assert want and got == want
    key = int(np.flatnonzero(npart)[0])
    for bad in (2, 0):  # two partial matches of a run, or none
        damaged = ph.copy()
        damaged[key, 1, places[rows.counts[0]]] = bad
        damaged[key, 1, places[rows.counts[1]]] = 0 if bad == 0 else 1
        damaged[key, 1, [places[c] for c in rows.counts[2:]]] = 0
        with pytest.raises(ValueError, match="other numbers of partial matches"):
            jit(checked, strings).load_state(runs_meta, dict(arrays, ph=damaged))
    with pytest.raises(ValueError, match="snapshot's runs: not a place"):
        jit(checked, strings).load_state(dict(runs_meta, rows="x1>2"), dict(arrays, ph=ph))
    with pytest.raises(ValueError, match="snapshot's ph is not this query's"):
        jit(checked, strings).load_state(runs_meta, dict(arrays, ph=ph[:, :, :4]))


def test_a_run_stands_for_several_partial_matches_in_one_state():
    # after A, B*? both stays in B and goes on to C; the next row the one in B goes to C
    # too: two partial matches of one start in C's loop, each completing on D, in the
    # completed queue twice as Flink's has them
    checked = _strict(
        "SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
        "MEASURES COUNT(*) AS n, LAST(D.seqNum) AS last_seq ONE ROW PER MATCH "
        "PATTERN (A B*? C+ D) DEFINE B AS B.price >= A.price, C AS C.price >= A.price, "
        "D AS D.price < A.price) AS T")
    program = compile_recognize(checked)
    assert program.layout == rt.RUNS
    mult = [int(c) for c in re.findall(r"x\d+ = phf\[U\(\(c\) \* \d+ \+ (\d+)\)\]",
                                        program.source)]
    assert mult
    engine = jit(checked, StringDictionary())
    encoder = BatchEncoder(checked.schema, engine.strings)
    rows = [{"symbol": "A", "price": p, "volume": 1, "ts": 1_000 * (i + 1), "seqNum": i}
            for i, p in enumerate([10, 11, 12, 13, 5])]
    most = 0
    for event in _events(rows):
        engine.process(encoder.from_events([event]))
        runs = engine.arrays["ph"][0, :engine.arrays["key_i"][0, rt.K_NPART]]
        most = max(most, int(runs[:, mult].max(initial=0)))
    assert most >= 2
    assert _same(checked, _events(rows), (1,))


def test_a_snapshot_of_the_other_layout_is_refused_with_the_reason():
    checked = _strict(MSHAPE_SQL)
    engine = jit(checked, StringDictionary())
    encoder = BatchEncoder(checked.schema, engine.strings)
    engine.process(encoder.from_events(_events(differential.rows(50, random.Random(3)))))
    meta, arrays = engine.state()
    other = jit(checked, StringDictionary())
    with pytest.raises(ValueError, match="keeps partial matches as computations"):
        other.load_state(dict(meta, layout=rt.COMPUTATIONS), arrays)
    with pytest.raises(ValueError, match="snapshot's ph is not this query's"):
        other.load_state(meta, dict(arrays, ph=arrays["ph"][:, :, :3]))
    with pytest.raises(ValueError, match="records keep other columns"):
        other.load_state(dict(meta, record=meta["record"].replace("max/", "min/")), arrays)
    other.load_state(meta, arrays)  # and the real one is restored
    assert other.state()[1]["ph"].tobytes() == arrays["ph"].tobytes()


def test_a_computations_snapshot_from_before_the_runs_layout_restores():
    # the release before wrote no layout, no record columns and four columns of key_i;
    # the computations layout numbers its record columns as it did, so such a snapshot
    # restores and goes on as one uninterrupted engine
    checked = _strict(
        "SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
        "MEASURES FIRST(A.price) AS fa, SUM(B.price) AS sb ONE ROW PER MATCH "
        "PATTERN (A B+ C) DEFINE B AS B.price > A.price, C AS C.price < LAST(B.price)) AS T")
    assert compile_recognize(checked).layout == rt.COMPUTATIONS
    events = _events(differential.rows(200, random.Random(4)))
    strings = StringDictionary()
    whole = jit(checked, strings)
    encoder = BatchEncoder(checked.schema, strings)
    want = whole.process(encoder.from_events(events))
    first = jit(checked, strings)
    got = first.process(encoder.from_events(events[:90]))
    meta, arrays = first.state()
    old_meta = {k: v for k, v in meta.items() if k not in ("layout", "record")}
    old_arrays = dict(arrays, key_i=arrays["key_i"][:, :4])
    second = jit(checked, strings)
    second.load_state(old_meta, old_arrays)
    got += second.process(encoder.from_events(events[90:]))
    assert want and got == want



# Snapshots (`Engine.snapshot()`) that 4cbfb86 took of runs-layout queries mid-stream, when
# a run's row of ph/pf was as wide as a record, its columns where a record has them: the
# M-shape, with WITHIN, and _RUNS_TYPED's (floats; strings and bools), each after its first
# `cut` rows (made at that commit by a script over these tests' statements and rows).
WIDE_ROWS = Path(__file__).parent / "fixtures" / "recognize_runs_wide_rows.npz"


@pytest.mark.parametrize("name", ["mshape", "mshape_within", "ticks", "clicks"])
def test_a_runs_snapshot_from_before_the_narrow_rows_restores(name):
    with np.load(WIDE_ROWS) as fixture:
        text, cut = str(fixture[f"{name}/statement"]), int(fixture[f"{name}/cut"])
        rows = json.loads(str(fixture[f"{name}/rows"]))
        snapshot = fixture[f"{name}/snapshot"].tobytes()
    checked = _strict(text)
    program = compile_recognize(checked)
    assert program.layout in (rt.RUNS, rt.STATES) and program.rows.widths[0] < program.rec_ints
    time = "time" if name == "ticks" else "ts"
    events = [Event(i, row[time], row) for i, row in enumerate(rows)]
    whole = jit(checked, StringDictionary())
    want = whole.process(BatchEncoder(checked.schema, whole.strings).from_events(events))
    want += whole.flush()
    first = jit(checked, StringDictionary())
    got = first.process(BatchEncoder(checked.schema, first.strings).from_events(events[:cut]))
    second = jit(checked, StringDictionary())
    second.restore(snapshot)  # the old rows, moved to where this version keeps them
    assert _live(second, program) == _live(first, program)
    after = second.process(BatchEncoder(checked.schema, second.strings).from_events(
        events[cut:])) + second.flush()
    assert got and after and got + after == want
    meta, arrays = second.state()
    with pytest.raises(ValueError, match="runs keep other columns"):
        jit(checked, StringDictionary()).load_state(dict(meta, rows="i1>0"), arrays)
    old = {k: v for k, v in meta.items() if k != "rows"}
    with pytest.raises(ValueError, match="snapshot's ph is not this query's"):
        jit(checked, StringDictionary()).load_state(old, dict(arrays, ph=arrays["ph"][:, :, :3]))
    with pytest.raises(ValueError, match="snapshot's ph is not this query's"):
        jit(checked, StringDictionary()).load_state(old, arrays)  # narrow, yet says it is not


def _live(engine, program) -> list:
    """What an engine of the runs or states layout holds, per key: its row, its key's row
    and runs, its completed matches' records in its queue's order (not their counts, which
    the states layout's do not keep, nor their start time where the runs do not keep it:
    no WITHIN) (not the queues' capacities or what lies past them)."""
    a = engine.arrays
    unkept = set(program.rows.counts) | ({rt.START_TS} - set(program.rows.ints))
    kept = [c for c in range(program.rec_ints) if c not in unkept]
    held = []
    for k in range(len(engine.keys)):
        npart, ncomp = a["key_i"][k, rt.K_NPART], a["key_i"][k, rt.K_NCOMP]
        held.append((a["key_i"][k, :rt.K_BRANCHES].tolist(),
                     a["ph"][k, :npart + 1].tolist(), a["pf"][k, :npart + 1].tolist(),
                     [(a["rec_i"][h, kept].tolist(), a["rec_f"][h].tolist())
                      for h in a["ch"][k, :ncomp]]))
    return held


_RUNS_TYPED = {
    "ticks": ("SELECT * FROM ticks MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY time "
              "MEASURES FIRST(A.price) AS fa, MAX(price) AS hi, SUM(price) AS s, "
              "LAST(C.price) AS lc, AVG(price) AS m ONE ROW PER MATCH "
              "AFTER MATCH SKIP PAST LAST ROW PATTERN (A B+ C) "
              "DEFINE B AS B.price > PREV(price) AND B.price > A.price, "
              "C AS C.price < A.price) AS T"),
    "clicks": ("SELECT * FROM clicks MATCH_RECOGNIZE (PARTITION BY session ORDER BY ts "
               "MEASURES FIRST(A.page) AS fp, LAST(C.page) AS lp, LAST(C.bot) AS lb, "
               "COUNT(*) AS n ONE ROW PER MATCH AFTER MATCH SKIP TO NEXT ROW "
               "PATTERN (A B*? C) DEFINE A AS NOT A.bot, "
               "B AS B.latency > PREV(latency) OR B.bot, "
               "C AS C.page = 'cart' AND C.page <> FIRST(A.page)) AS T"),
    # patterns that branch (B*? and C+ may both take a row): the runs layout's counts
    "ticks branching": (
        "SELECT * FROM ticks MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY time "
        "MEASURES FIRST(A.price) AS fa, MAX(price) AS hi, SUM(price) AS s, "
        "LAST(D.price) AS ld, AVG(price) AS m ONE ROW PER MATCH "
        "AFTER MATCH SKIP TO NEXT ROW PATTERN (A B*? C+ D) "
        "DEFINE B AS B.price >= A.price, C AS C.price >= A.price, "
        "D AS D.price < A.price) AS T"),
    "clicks branching": (
        "SELECT * FROM clicks MATCH_RECOGNIZE (PARTITION BY session ORDER BY ts "
        "MEASURES FIRST(A.page) AS fp, LAST(D.page) AS lp, LAST(D.bot) AS lb, "
        "COUNT(*) AS n ONE ROW PER MATCH AFTER MATCH SKIP TO NEXT ROW "
        "PATTERN (A B*? C+ D) DEFINE A AS NOT A.bot, B AS B.latency > 2, "
        "C AS C.latency > 4 OR C.bot, "
        "D AS D.page = 'cart' AND D.page <> FIRST(A.page)) AS T"),
}


@pytest.mark.parametrize("stream", sorted(_RUNS_TYPED))
def test_runs_keep_float_string_and_bool_columns(stream):
    # a run's columns and its key's row hold floats (pf), string codes (remapped when the
    # dictionary is compacted) and bools: against the interpreter engine and the reference
    checked = _strict(_RUNS_TYPED[stream])
    program = compile_recognize(checked)
    assert program.layout == (rt.RUNS if "branching" in stream else rt.STATES)
    assert program.rec_floats > 1 if "ticks" in stream else program.string_columns
    events = _typed_events(stream.split()[0], 600, ["home", "cart", "list"])
    engine, other, got, want = _beside_interpreter(checked, events)
    assert len(want) > 50 and got == want
    assert engine.flush() == other.flush()
    for sizes, restore_at in (((7, 3, 50), 300), ((1,), 123)):
        _same(checked, events, sizes, restore_at=restore_at, compact=True)


def test_the_kernel_calls_nothing_on_a_row_where_numba_can_inline_it():
    # a call left in the kernel's loop over rows, even one it never makes, costs every row
    # (docs/benchmarks.md); numba cannot inline a call of more than 30 arguments, which
    # CPython passes as *args: a query with many MEASURES keeps the call, and its answers
    inline = "inline='always', _nrt=False)\ndef {}("
    mshape = compile_recognize(_strict(MSHAPE_SQL)).source
    assert all(inline.format(name) in mshape for name in ("release", "emit"))
    assert "advance(" not in mshape.split("\ndef kernel(")[1]  # no WITHIN: no block for it
    within = MSHAPE_SQL.replace("PATTERN (S R1+ D1+ R2+? D2* E)",
                                "PATTERN (S R1+ D1+ R2+? D2* E) WITHIN INTERVAL '1' MINUTE")
    assert inline.format("advance") in compile_recognize(_strict(within)).source
    # the computations layout keeps its calls (inlined, its kernels compile much longer)
    steps = compile_recognize(_strict(MSHAPE_SQL.replace(
        "AFTER MATCH SKIP PAST LAST ROW", "AFTER MATCH SKIP TO LAST R2")))
    assert steps.layout == rt.COMPUTATIONS
    assert "inline='always'" not in steps.source and "INLINE_RUNTIME" not in steps.source
    assert "INLINE_RUNTIME = True" in mshape
    measures = ", ".join(f"{f}(price) AS m{j}" for j, f in enumerate(["MAX", "MIN", "SUM"] * 4))
    wide = _strict(MSHAPE_SQL.replace("MAX(price) AS max_price", measures))
    source = compile_recognize(wide).source
    assert inline.format("release") not in source and "def release(" in source
    rng = random.Random(11)
    events = _events(differential.rows(600, rng))
    assert _same(wide, events, (1000,)) and _same(wide, events, (7, 13), restore_at=300)
