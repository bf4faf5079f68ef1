"""MATCH_RECOGNIZE (SQL, Flink's semantics): parsed into the checked AST, refused where Flink
refuses with located reasons, and answered by the reference interpreter as Flink 2.3
answers (tests/fixtures/recognize_flink_*.json hold Flink's own answers; the live comparison
with Flink is tests/recognize_flink/differential.py, in `make test-full`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cep_core.reference as reference
from cep_core.checker import load_queries, load_query_text
from cep_core.errors import QueryError, QueryErrors
from cep_core.events import Event
from tests.recognize_flink import differential

# Flink's answers; each fixture says what made it (`made_by`): regenerate it that way after
# a change of the generator or of Flink
FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("recognize_flink_*.json"))

V_SHAPE = """QUERY vshape INTO alerts
SELECT * FROM quotes MATCH_RECOGNIZE (
  PARTITION BY symbol
  ORDER BY ts
  MEASURES FIRST(A.price) AS start_price, LAST(B.price) AS bottom, AVG(B.price) AS avg_b
  ONE ROW PER MATCH
  AFTER MATCH SKIP PAST LAST ROW
  PATTERN (A B+ C)
  DEFINE B AS B.price < PREV(price), C AS C.price > PREV(price)
) AS T;
"""


def events(prices: list[int], symbol: str = "S") -> list[Event]:
    return [Event(i, 1000 * (i + 1), {"symbol": symbol, "price": p, "volume": 1,
                                       "ts": 1000 * (i + 1), "seqNum": i})
            for i, p in enumerate(prices)]


def run(text: str, prices: list[int]) -> list[dict]:
    return reference.run(load_query_text(text), events(prices))


def test_a_v_shape_is_found_with_flinks_measures():
    [found] = run(V_SHAPE, [10, 8, 7, 9, 11])
    # AVG of an INT column is an INT in Flink: (8 + 7) / 2 = 7
    assert found == {"query": "vshape", "key": "S", "seq": 3, "start_seq": 0, "symbol": "S",
                     "start_price": 10, "bottom": 7, "avg_b": 7}


def test_a_statement_alone_is_a_query_named_after_its_alias():
    text = V_SHAPE.split("\n", 1)[1]
    [checked] = load_query_text(text)
    assert (checked.name, checked.query.output, checked.query.kind) == ("T", "T", "recognize")


def test_after_greedy_b_plus_the_next_variable_never_takes_a_row_b_takes():
    # C implies B (both "price below the previous"): Flink's NFA finds nothing, where SQL:2016
    # backtracking would give B one row less and C the last one.
    text = V_SHAPE.replace("C AS C.price > PREV(price)", "C AS C.price < PREV(price) - 1")
    assert run(text, [10, 8, 5, 2, 1, 9]) == []


def test_of_matches_ending_on_one_row_the_one_that_started_first_wins():
    # A=10 B=8,7 C=9 and A=8 B=7 C=9 both end at seq 3; SKIP PAST LAST ROW keeps the first
    assert [(c["start_seq"], c["seq"]) for c in run(V_SHAPE, [10, 8, 7, 9])] == [(0, 3)]
    # SKIP TO NEXT ROW keeps both: the second starts after the first one's first row
    text = V_SHAPE.replace("SKIP PAST LAST ROW", "SKIP TO NEXT ROW")
    assert [(c["start_seq"], c["seq"]) for c in run(text, [10, 8, 7, 9])] == [(0, 3), (1, 3)]


@pytest.mark.parametrize("change, message, line", [
    ("PATTERN (A B+ C)", "alternation (|)", 8),
    ("PATTERN (A B+ C)", "a quantifier on a group", 8),
    ("PATTERN (A B+ C)", "a greedy quantifier on the last variable", 8),
    ("PATTERN (A B+ C)", "a reluctant optional", 8),
    ("ONE ROW PER MATCH", "ALL ROWS PER MATCH", 6),
    ("ORDER BY ts", "ORDER BY takes the time attribute 'ts'", 4),
    ("PREV(price)", "PREV's offset is a whole number", 9),
    ("AFTER MATCH SKIP PAST LAST ROW", "the pattern's first variable", 2),
    ("C AS C.price", "DEFINE 'X': PATTERN has no such variable", 9),
    ("PATTERN (A B+ C)", "appears twice", 8),
    ("PATTERN (A B+ C)", "optional right after the greedy 'B'", 8),
])
def test_what_flink_refuses_is_refused_where_it_is_written(change, message, line):
    replacement = {
        "alternation (|)": "PATTERN (A (B | C))",
        "a quantifier on a group": "PATTERN (A (B C)+)",
        "a greedy quantifier on the last variable": "PATTERN (A B C+)",
        "a reluctant optional": "PATTERN (A B?? C)",
        "ALL ROWS PER MATCH": "ALL ROWS PER MATCH",
        "ORDER BY takes the time attribute 'ts'": "ORDER BY price",
        "PREV's offset is a whole number": "PREV(price, 1 + 1)",
        "the pattern's first variable": "AFTER MATCH SKIP TO FIRST A",
        "DEFINE 'X': PATTERN has no such variable": "X AS C.price",
        "appears twice": "PATTERN (A B+ A)",
        "optional right after the greedy 'B'": "PATTERN (A B+ C? D)",
    }[message]
    with pytest.raises((QueryError, QueryErrors)) as refused:
        load_query_text(V_SHAPE.replace(change, replacement), path="q.cep")
    assert message in str(refused.value)
    assert f"q.cep:{line}:" in str(refused.value)


@pytest.mark.parametrize("change, replacement, flinks_words, at", [
    ("AS avg_b", "AS avg_b, CLASSIFIER() AS cls", "Unsupported call: CLASSIFIER()", "CLASS"),
    ("C AS C.price > PREV(price)", "C AS CLASSIFIER() = 'C'", "Unsupported call: CLASSIFIER()",
     "CLASS"),
    ("AS avg_b", "AS avg_b, MATCH_NUMBER() AS n",
     "No match found for function signature MATCH_NUMBER()", "MATCH_N"),
    ("C.price > PREV(price)", "C.price > NEXT(price)",
     "Flink does not support physical offsets within partition", "NEXT"),
    ("AS avg_b", "AS avg_b, PREV(price) AS p", "Cannot use PREV/NEXT in MEASURE", "PREV(price) AS"),
    ("AS avg_b", "AS avg_b, NEXT(B.price) AS p", "Cannot use PREV/NEXT in MEASURE", "NEXT"),
    ("AVG(B.price)", "COUNT(DISTINCT B.price)", "DISTINCT/ALL not allowed", "DISTINCT"),
    ("C.price > PREV(price)", "C.price > LAST(PREV(price))",
     "Cannot nest PREV/NEXT under LAST/FIRST", "LAST(PREV"),
    ("C.price > PREV(price)", "C.price > PREV(LAST(B.price, 1))",
     "Flink does not support physical offsets within partition", "LAST(B.price, 1)"),
    ("C.price > PREV(price)", "C.price > PREV(price, -1)", "IndexOutOfBoundsException", "-1"),
    ("ORDER BY ts", "ORDER BY ts DESC, price",
     "Primary sort order of a streaming table must be ascending on time", "DESC"),
    ("AS bottom", "AS seq", "Flink takes this name", "seq"),
    ("AS start_price", "AS key", "Flink takes this name", "key"),
])
def test_flinks_other_refusals_are_ours_with_its_words(change, replacement, flinks_words, at):
    """Each as Flink 2.3 answered it (docs/semantics.md's table of constructs), refused at
    `at`; the measure names are refused by us, not by Flink."""
    text = V_SHAPE.replace(change, replacement, 1)
    with pytest.raises((QueryError, QueryErrors)) as refused:
        load_query_text(text, path="q.cep")
    assert flinks_words in str(refused.value)
    where = text.index(at)
    line, column = text[:where].count("\n") + 1, where - text.rfind("\n", 0, where)
    assert f"q.cep:{line}:{column}:" in str(refused.value)


def test_prev_with_an_offset_reads_that_many_rows_back_within_the_match():
    # C's row 9: PREV(price, 2) is B's first row (8), PREV(price, 3) A's (10), and
    # PREV(price, 4) is before the match: NULL, so that DEFINE never holds
    text = V_SHAPE.replace("C AS C.price > PREV(price)", "C AS C.price > PREV(price, 2)")
    assert [c["seq"] for c in run(text, [10, 8, 7, 9, 11])] == [3]
    assert run(text.replace("PREV(price, 2)", "PREV(price, 3)"), [10, 8, 7, 9, 11]) == []
    assert run(text.replace("PREV(price, 2)", "PREV(price, 4) - 100"), [10, 8, 7, 9]) == []
    # PREV(price, 0) is the current row
    assert run(text.replace("PREV(price, 2)", "PREV(price, 0)"), [10, 8, 7, 9, 11]) == []


def test_match_rowtime_in_define_is_the_current_rows_time():
    text = V_SHAPE.replace("C AS C.price > PREV(price)",
                           "C AS C.price > PREV(price) AND MATCH_ROWTIME() = ts")
    assert [c["seq"] for c in run(text, [10, 8, 7, 9, 11])] == [3]
    assert run(text.replace("= ts", "< ts"), [10, 8, 7, 9, 11]) == []


def test_match_proctime_is_the_machines_clock_and_one_row_per_match_may_be_left_out():
    import time

    text = V_SHAPE.replace("AS avg_b", "AS avg_b, MATCH_PROCTIME() AS at")
    before = time.time_ns() // 1_000_000
    [found] = run(text.replace("ONE ROW PER MATCH", ""), [10, 8, 7, 9, 11])
    assert before <= found.pop("at") <= time.time_ns() // 1_000_000
    assert found == run(V_SHAPE, [10, 8, 7, 9, 11])[0]


def test_count_of_a_column_counts_the_rows_where_it_is_not_null():
    text = V_SHAPE.replace("AS avg_b", "AS avg_b, COUNT(B.volume) AS b_volumes, "
                                       "COUNT(volume) AS volumes, COUNT(*) AS n")
    rows = events([10, 8, 7, 9, 11])
    rows[2].attrs["volume"] = None  # B's second row
    [found] = reference.run(load_query_text(text), rows)
    assert (found["b_volumes"], found["volumes"], found["n"]) == (1, 3, 4)


def test_rows_of_one_time_go_in_in_the_order_of_the_secondary_order_by():
    # seq 1 and 2 share a time: as they came (10 20 5 1), A=20 B=5 and A=5 B=1 match; by
    # price (10 5 20 1), A=10 B=5 and A=20 B=1; by price DESC, as they came
    text = """SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts
      MEASURES A.seqNum AS a, B.seqNum AS b AFTER MATCH SKIP TO NEXT ROW PATTERN (A B)
      DEFINE B AS B.price < PREV(price)) AS T"""
    rows = [Event(i, ts, {"symbol": "S", "price": p, "volume": 1, "ts": ts, "seqNum": i})
            for i, (ts, p) in enumerate([(1000, 10), (2000, 20), (2000, 5), (3000, 1)])]
    answers = {order: [(c["a"], c["b"]) for c in reference.run(load_query_text(
        text.replace("ORDER BY ts", order)), rows)]
        for order in ("ORDER BY ts", "ORDER BY ts, price", "ORDER BY ts, price DESC")}
    assert answers == {"ORDER BY ts": [(1, 2), (2, 3)], "ORDER BY ts, price": [(0, 2), (1, 3)],
                       "ORDER BY ts, price DESC": [(1, 2), (2, 3)]}


def test_the_jit_engine_runs_it_as_the_reference_does():
    from cep_core import stream_engines

    [checked] = load_query_text(V_SHAPE)
    assert stream_engines.run([checked], events([10, 8, 7, 9, 11, 6, 5, 8])) == \
        run(V_SHAPE, [10, 8, 7, 9, 11, 6, 5, 8])


def _fixture_cases():
    cases = []
    for fixture in FIXTURES:
        spec = json.loads(fixture.read_text())
        known = spec.get("known_differences", {})
        cases += [pytest.param(spec["statements"][name], spec["rows"], spec["flink"][name],
                               id=f"{fixture.stem}-{name}", marks=[pytest.mark.xfail(
                                   reason=known[name], strict=True)] if name in known else [])
                  for name in sorted(spec["statements"])]
    return cases


@pytest.mark.parametrize("statement, rows, flink", _fixture_cases())
def test_flinks_committed_answers(statement, rows, flink):
    mine = differential.ours(statement, rows)
    if isinstance(flink, dict):  # Flink refused it: so must we
        assert isinstance(mine, dict), f"Flink refuses: {flink['error']}"
    else:
        assert sorted(map(json.dumps, mine)) == sorted(map(json.dumps, flink))


def test_the_examples_fixture_is_what_examples_recognize_cep_says():
    # regenerate it (its made_by) after editing examples/recognize.cep or its sample data
    spec = json.loads((Path(__file__).parent / "fixtures" /
                       "recognize_flink_examples.json").read_text())
    names = {q.name for q in load_queries(differential.EXAMPLE)}
    assert set(spec["statements"]) == names == {"price_dips", "double_tops"}
    assert spec["statements"] == differential.example_statements()
    assert spec["rows"] == differential.example_rows()
    assert all(len(spec["flink"][name]) > 20 for name in names)  # Flink finds them


def test_flinks_documented_price_down_pattern_with_logical_offsets():
    # Flink's documentation writes PREV of a variable as LAST(var.col, 1), with IS NULL for
    # the variable's first row.
    text = """SELECT * FROM quotes MATCH_RECOGNIZE (
      PARTITION BY symbol ORDER BY ts
      MEASURES START_ROW.price AS start_price, LAST(PRICE_DOWN.price) AS bottom,
               LAST(PRICE_DOWN.price, 1) AS before_bottom, FIRST(PRICE_DOWN.price, 5) AS fifth
      ONE ROW PER MATCH AFTER MATCH SKIP TO LAST PRICE_UP
      PATTERN (START_ROW PRICE_DOWN+ PRICE_UP)
      DEFINE
        PRICE_DOWN AS (LAST(PRICE_DOWN.price, 1) IS NULL AND PRICE_DOWN.price < START_ROW.price)
            OR PRICE_DOWN.price < LAST(PRICE_DOWN.price, 1),
        PRICE_UP AS PRICE_UP.price > COALESCE(LAST(PRICE_DOWN.price, 1), 0)
    ) AS T"""
    found = run(text, [12, 11, 10, 13, 12, 14])
    assert [(c["start_seq"], c["seq"], c["start_price"], c["bottom"], c["before_bottom"],
             c["fifth"]) for c in found] == [(0, 3, 12, 10, 11, None), (3, 5, 13, 12, None, None)]


@pytest.mark.parametrize("pattern", ["A B{1000000000} C", "A B{2,300} C", "A B{300,}? C"])
def test_a_pattern_too_large_for_its_automaton_is_refused_before_it_is_built(pattern):
    with pytest.raises(QueryErrors, match="automaton states") as refused:
        load_query_text(V_SHAPE.replace("A B+ C", pattern), path="q.cep")
    assert len(refused.value.errors) == 1 and refused.value.errors[0].pos.line == 8


@settings(max_examples=300 if os.environ.get("CEP_TEST_FULL") == "1" else 60, deadline=None)
@given(st.data())
def test_a_damaged_statement_is_refused_with_a_located_error_or_checks(data):
    """Cut, doubled or replaced pieces of a statement: a located QueryError, or a query that
    checks and runs; never another exception."""
    text = V_SHAPE
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(text)))
        size = data.draw(st.integers(0, 12))
        piece = data.draw(st.sampled_from(["", "(", ")", "+", "?", "{2,}", ",", " AS ", "|",
                                           "PREV(", "LAST(B.price, 1)", "'", "*", " NULL ",
                                           " DISTINCT ", " DESC", ", price", "PREV(price, 2)",
                                           "CLASSIFIER()", "COUNT(B.price)", "NEXT("]))
        text = text[:at] + piece + text[at + size:]
    try:
        queries = load_query_text(text, path="q.cep")
    except (QueryError, QueryErrors) as e:
        for error in getattr(e, "errors", [e]):
            assert error.pos.file == "q.cep" and error.pos.line >= 1
        return
    reference.run(queries, events([10, 8, 7, 9, 11, 3, 5]))


def test_the_service_takes_it_at_run_time():
    from cep_core.control_message import check_query

    text = V_SHAPE.replace("QUERY vshape INTO alerts", "QUERY vshape")
    checked = check_query("vshape", text)  # tests/test_recognize_service.py runs it
    assert (checked.name, checked.query.kind) == ("vshape", "recognize")


def test_the_python_api_runs_it_on_jit_and_on_the_reference():
    import cep_core as cep

    queries = cep.compile(V_SHAPE)
    rows = [event.attrs for event in events([10, 8, 7, 9, 11])]
    assert [c["bottom"] for c in queries.run(rows, engine="reference").to_dicts()] == [7]
    assert queries.run(rows).to_dicts() == queries.run(rows, engine="reference").to_dicts()


def test_prev_of_a_variables_column_is_refused_as_flink_refuses_it():
    with pytest.raises(QueryErrors, match=r"write PREV\(price\) for the previous row, or "
                                          r"LAST\(B.price, 1\)") as refused:
        load_query_text(V_SHAPE.replace("B.price < PREV(price)", "B.price < PREV(B.price)"),
                        path="q.cep")
    assert refused.value.errors[0].pos.line == 9


def test_explain_draws_flinks_automaton_with_the_greedy_not():
    from cep_core.explain import explain

    [checked] = load_query_text(V_SHAPE)
    drawn = explain(checked)
    assert drawn.kind == "match_recognize"
    assert "s2 --take B: B.price < PREV(price)--> s2" in drawn.lines
    assert "s3 --take C: C.price > PREV(price) AND NOT B--> end" in drawn.lines
    assert "horizon: unbounded" in drawn.lines


def test_explain_keeps_a_logical_offset():
    from cep_core.explain import explain

    # LAST(x, 1) is the row before LAST(x): the drawing must not show them alike
    dips, tops = load_queries(differential.EXAMPLE)
    down = next(line for line in explain(dips).lines if "take PRICE_DOWN" in line)
    assert ("IS_NULL(last(PRICE_DOWN.price, 1)) AND PRICE_DOWN.price < START_ROW.price OR "
            "PRICE_DOWN.price < last(PRICE_DOWN.price, 1)") in down
    d1 = next(line for line in explain(tops).lines if "s3 --take D1" in line)
    assert "COALESCE(last(D1.price, 1), last(R1.price))" in d1


def test_a_pattern_of_optional_variables_only_is_refused_as_flink_refuses_it():
    with pytest.raises(QueryErrors, match="every variable of PATTERN is optional"):
        load_query_text(V_SHAPE.replace("A B+ C", "A? B* C{0,2}?"))


def test_the_backfill_splits_it_by_its_partition_by():
    from cep_service.backfill.plan import split_keys

    # tests/test_recognize_backfill.py runs it in Spark
    assert split_keys(load_query_text(V_SHAPE)[0]) == ("symbol",)


def test_a_file_holds_it_beside_queries_of_our_own_language():
    text = ("QUERY dips FROM quotes PARTITION BY symbol PATTERN (. down) "
            "DEFINE down AS price < Last(price) EMIT low = price;\n"
            + V_SHAPE.split("\n", 1)[1])
    dips, flink = load_query_text(text)
    assert (dips.query.kind, flink.query.kind, flink.name) == ("match", "recognize", "T")
    found = reference.run([dips, flink], events([10, 8, 7, 9]))
    assert [(c["query"], c["seq"]) for c in found] == [("dips", 1), ("T", 3)]
