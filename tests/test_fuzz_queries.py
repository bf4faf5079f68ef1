"""Fuzzing the query parser and checker: any text, and mutations of the example queries
(our language and MATCH_RECOGNIZE's: examples/recognize.cep).

`load_query_text` either returns checked queries or raises QueryError / QueryErrors whose
every message starts with `path:line:col: error:`; nothing else escapes, and no input takes
long (hypothesis' deadline)."""

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep_core.checker import load_query_text
from cep_core.errors import QueryError, QueryErrors
from cep_core.schema import SchemaRegistry

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.cep"))
QUERIES = [p.read_text() for p in EXAMPLES]
TOKENS = ["QUERY", "FROM", "PATTERN", "DEFINE", "AS", "EMIT", "SEQ", "NOT", "KLEENE", "WHERE",
          "WITHIN", "SELECT", "GROUP", "BY", "PARTITION", "RANGE", "SLIDE", "ROWS", "(", ")",
          "*", "+", "?", "|", ",", ";", ".", "=", "!=", "<", ">=", "'", "'x'", "0", "1e309",
          "99999999999999999999999", "-", "/", "%", "count(", "avg(", "Last(", "Delta(ts)",
          "minutes", "ms", "EACH", "LAST", "FIRST", "AND", "OR", "IN", "TRUE", "\n", " ", "--",
          "ORDER BY ts", "ON TIMEOUT EMIT PARTIAL", "price", "ts", "a", "b", "\x00", "é",
          # MATCH_RECOGNIZE (examples/recognize.cep)
          "MATCH_RECOGNIZE", "MEASURES", "ONE ROW PER MATCH", "ALL ROWS PER MATCH",
          "AFTER MATCH SKIP", "PAST LAST ROW", "TO NEXT ROW", "TO FIRST", "INTERVAL '10' SECOND",
          "INTERVAL '-1' DAY",
          "PREV(price)", "PREV(price, 9999999999)", "LAST(", "FIRST(", "COALESCE(", "IS NULL",
          "MATCH_ROWTIME()", "CLASSIFIER()", "+?", "*?", "??", "{2,}", "{3,1}", "{,2}?", "DESC",
          "S.price", "E.price"]
LOCATED = re.compile(r"^<fuzz>:\d+:\d+: error: ", re.MULTILINE)
FUZZ = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
REGISTRY = SchemaRegistry()


def load_or_located_error(text: str) -> None:
    try:
        load_query_text(text, REGISTRY, "<fuzz>")
    except QueryErrors as e:
        assert e.errors and all(LOCATED.match(str(err)) for err in e.errors), str(e)
    except QueryError as e:
        assert LOCATED.match(str(e)), str(e)


@st.composite
def mutated_examples(draw):
    """An example query file with a few token-level edits: delete, duplicate, insert a
    grammar token, or swap two spans."""
    text = draw(st.sampled_from(QUERIES))
    pieces = re.findall(r"\s+|\w+|'[^']*'|.", text)
    for _ in range(draw(st.integers(1, 4))):
        if not pieces:
            break
        i = draw(st.integers(0, len(pieces) - 1))
        edit = draw(st.sampled_from(["delete", "duplicate", "insert", "swap", "cut"]))
        if edit == "delete":
            del pieces[i]
        elif edit == "duplicate":
            pieces.insert(i, pieces[i])
        elif edit == "insert":
            pieces.insert(i, draw(st.sampled_from(TOKENS)))
        elif edit == "swap":
            j = draw(st.integers(0, len(pieces) - 1))
            pieces[i], pieces[j] = pieces[j], pieces[i]
        else:
            pieces = pieces[:i]
    return "".join(pieces)


@FUZZ
@given(st.text(max_size=200))
def test_any_text(text):
    load_or_located_error(text)


@FUZZ
@given(st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join))
def test_token_soup(text):
    load_or_located_error(text)


@FUZZ
@given(mutated_examples())
def test_mutated_examples(text):
    load_or_located_error(text)


def test_deep_nesting_is_an_error_not_a_crash():
    for depth in (150, 3000):
        text = ("QUERY q FROM trades PATTERN (a) DEFINE a AS " + "(" * depth + "price > 1"
                + ")" * depth)
        load_or_located_error(text)
        load_or_located_error("QUERY q FROM trades PATTERN " + "(" * depth + "a" + ")" * depth
                              + " DEFINE a AS price > 1")
        load_or_located_error("QUERY q FROM trades PATTERN (a) DEFINE a AS "
                              + " + ".join(["price"] * depth) + " > 1")


def test_unmodified_examples_still_load():
    for text in QUERIES:
        assert load_query_text(text, REGISTRY, "<fuzz>")


def test_nesting_just_under_the_limit_loads():
    from cep_core.parser import MAX_TREE_DEPTH

    for depth in range(MAX_TREE_DEPTH - 30, MAX_TREE_DEPTH + 5, 5):
        load_or_located_error("QUERY q FROM trades PATTERN (a) DEFINE a AS "
                              + " + ".join(["price"] * depth) + " > 1")
        load_or_located_error("QUERY q FROM trades PATTERN (a) DEFINE a AS " + "(" * depth
                              + "price > 1" + ")" * depth)
        load_or_located_error("QUERY q FROM trades PATTERN " + "(" * depth + "a" + ")" * depth
                              + " DEFINE a AS price > 1")
    shallow = ("QUERY q FROM trades PATTERN (a) DEFINE a AS " + "(" * 10 + "price > 1"
               + ")" * 10)
    assert load_query_text(shallow, REGISTRY, "<fuzz>")
