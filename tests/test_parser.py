"""Parser: the AST built for each construct, and no input crashes it."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep_core import ast
from cep_core.errors import QueryError
from cep_core.parser import parse


def one(text: str) -> ast.Query:
    [query] = parse(text, "q.cep").queries
    return query


def test_match_header_and_regex_precedence():
    q = one("QUERY m FROM trades INTO out PARTITION BY symbol "
            "PATTERN ( a b* | c ) DEFINE a AS price > 1, b AS TRUE, c AS FALSE")
    assert (q.name, q.stream, q.output, [a.name for a in q.partition_by]) == \
        ("m", "trades", "out", ["symbol"])
    alt = q.body.pattern
    assert isinstance(alt, ast.RAlt) and len(alt.options) == 2
    cat = alt.options[0]
    assert isinstance(cat, ast.RCat)
    assert isinstance(cat.items[1], ast.RRepeat) and cat.items[1].min == 0
    assert cat.items[1].max is None


def test_empty_pattern_and_any():
    q = one("QUERY m FROM trades PATTERN ( . () ) DEFINE x AS TRUE")
    assert isinstance(q.body.pattern.items[0], ast.RAny)
    assert isinstance(q.body.pattern.items[1], ast.REmpty)


def test_output_defaults_to_query_name():
    assert one("QUERY m FROM trades PATTERN (a) DEFINE a AS TRUE").output == "m"


def test_topic_names():
    assert one("QUERY m FROM trades INTO alerts.big PATTERN (a) DEFINE a AS TRUE").output \
        == "alerts.big"
    assert one("QUERY m FROM trades INTO 'alerts-big_2' PATTERN (a) DEFINE a AS TRUE").output \
        == "alerts-big_2"
    try:
        one("QUERY m FROM trades INTO 'a b' PATTERN (a) DEFINE a AS TRUE")
    except QueryError as e:
        assert "not a Kafka topic name" in e.message and e.pos.column == 26
    else:
        raise AssertionError("no error")


def test_chained_comparison_becomes_conjunction():
    q = one("QUERY s FROM abc PATTERN SEQ(A a, B b, C c) WHERE a.p = b.p = c.p")
    where = q.body.where
    assert where.op == "AND"
    assert (where.left.left.var, where.left.right.var) == ("a", "b")
    assert (where.right.left.var, where.right.right.var) == ("b", "c")


def test_tesla_rule_steps_in_time_order():
    q = one("QUERY r FROM abc DETECT C c, EACH B b(v > 10) WITHIN 8 min FROM c, "
            "LAST A a WITHIN 3 min FROM b")
    steps = q.body.steps
    assert [s.var for s in steps] == ["a", "b", "c"]
    assert steps[0].policy is ast.Policy.LAST and steps[0].anchor == "b"
    assert steps[1].within == ast.Duration(8, "min", steps[1].within.pos)
    assert steps[1].filter.op == ">"
    assert q.body.tesla


def test_window_aggregate_shapes():
    q = one("QUERY f FROM sensors DETECT Smoke s "
            "WHERE 45 < avg(Temp(area = s.area).value WITHIN 5 min FROM s) "
            "AND count(Temp WITHIN 1 min FROM s) > 2")
    avg = q.body.where.left.right
    count = q.body.where.right.left
    assert isinstance(avg, ast.WindowAggregate)
    assert (avg.func, avg.event_type, avg.attr, avg.anchor) == \
        (ast.AggFunc.AVG, "Temp", "value", "s")
    assert avg.filter.op == "="
    assert (count.func, count.event_type, count.attr) == (ast.AggFunc.COUNT, "Temp", None)


def test_seq_steps_and_clauses():
    q = one("QUERY s FROM rfid PATTERN SEQ(O o, NOT(C c), KLEENE(O dup){2,3}, R+ r, "
            "AND(D d, C c2)) WITHIN 1 hour USING skip_till_next_match ORDER BY ts "
            "EMIT n = count(dup)")
    _o, c, dup, r, group = q.body.steps
    assert c.kind is ast.StepKind.NEGATED
    assert (dup.kind, dup.min, dup.max) == (ast.StepKind.KLEENE, 2, 3)
    assert (r.kind, r.min, r.max) == (ast.StepKind.KLEENE, 1, None)
    assert isinstance(group, ast.AndGroup) and len(group.steps) == 2
    assert q.body.strategy is ast.Strategy.SKIP_TILL_NEXT_MATCH
    assert q.body.order_by_ts and q.body.within.unit == "h"
    agg = q.body.emit[0].expr
    assert agg.func is ast.AggFunc.COUNT and agg.arg.var == "dup"
    assert not q.body.emit_timeouts


def test_on_timeout_emit_partial():
    q = one("QUERY s FROM rfid PATTERN SEQ(O o, R r) WITHIN 1 hour\n"
            "on timeout emit partial USING strict-contiguity")
    assert q.body.emit_timeouts and (q.body.timeouts_pos.line, q.body.timeouts_pos.column) == (2, 1)


def test_window_query():
    q = one("QUERY w INTO t SELECT symbol, max(price) AS hi, count(*) FROM ticks "
            "[RANGE 300 seconds SLIDE 5 seconds WATTR time] WHERE symbol NOT IN ('X') "
            "GROUP BY symbol")
    assert q.stream == "ticks" and q.output == "t"
    assert [i.alias for i in q.body.items] == [None, "hi", None]
    assert q.body.window.range.amount == 300 and q.body.window.attr == "time"
    assert q.body.where.negated
    rows = one("QUERY w SELECT count(*) FROM ticks [ROWS 10 SLIDE 2]").body.window
    assert (rows.rows, rows.slide) == (10, 2)


def test_literals_and_keywords_case_insensitive():
    q = one("query m from trades pattern (a) define a as symbol = 'it''s' "
            "and price >= -3 and x = 2.5e1 and flag = true")
    where = q.body.defines[0].condition
    assert where.right.right.value is True
    assert where.left.right.right.value == 25.0
    assert where.left.left.right.right.value == -3
    assert where.left.left.left.right.value == "it's"


def test_duration_literal_in_an_expression():
    """`5 minutes` in an expression: a Literal that keeps the duration as written (the
    checker gives it its value in the stream's time unit); a bare number has none."""
    define = one("QUERY m FROM trades PATTERN (. a) DEFINE a AS Delta(ts) <= 5 minutes "
                 "AND 2 < Delta(ts)").body.defines[0].condition
    five, two = define.left.right, define.right.left
    assert (five.value, five.duration.amount, five.duration.unit) == (5, 5, "min")
    assert (five.pos.line, five.pos.column) == (1, 60)
    assert (two.value, two.duration) == (2, None)
    minus = one("QUERY m FROM trades PATTERN (. a) DEFINE a AS Delta(ts) > -1 s")
    assert isinstance(minus.body.defines[0].condition.right, ast.Unary)  # not folded
    try:
        parse("QUERY m FROM trades PATTERN (. a) DEFINE a AS Delta(ts) < 5 weeks", "x.cep")
    except QueryError as e:
        assert (e.pos.column, e.message) == (
            61, "unexpected 'weeks' after 5 (a duration's unit is ms, seconds, minutes, "
                "hours, days or ticks)")
    else:
        raise AssertionError("no error")


def test_syntax_error_is_located():
    try:
        parse("QUERY m FROM trades\nPATTERN (a b)\nDEFINE a AS price >", "x.cep")
    except QueryError as e:
        assert (e.pos.line, e.pos.column) == (3, 20)
        assert e.message.startswith("unexpected end of file")
        assert str(e).startswith("x.cep:3:20: error:")
    else:
        raise AssertionError("no error")


@pytest.mark.parametrize(("text", "line", "column", "message"), [
    # the words of the next line would read as more pattern symbols: lark stops at '>'
    ("QUERY m FROM trades\nPATTERN (a b\nDEFINE a AS price > 1, b AS price < 2", 2, 13,
     "expected ')' before 'DEFINE' to close the '(' of PATTERN at line 2, column 9"),
    ("QUERY m FROM trades\nPATTERN (a b  -- a comment\n\nDEFINE a AS price >", 2, 13,
     "expected ')' before 'DEFINE' to close the '(' of PATTERN at line 2, column 9"),
    ("QUERY m FROM trades\nPATTERN (a (b c)*\nDEFINE a AS price > 1, b AS price < 2, c AS "
     "TRUE", 2, 18, "expected ')' before 'DEFINE' to close the '(' of PATTERN at line 2, "
     "column 9"),
    ("QUERY s FROM rfid\nPATTERN SEQ(O o, R r\nWITHIN 5 minutes", 2, 21,
     "expected ')' before 'WITHIN' to close the '(' of PATTERN SEQ at line 2, column 12"),
    ("QUERY m FROM trades PATTERN (a) DEFINE a AS (price > 1\nEMIT p = price", 1, 55,
     "expected ')' before 'EMIT' to close the '(' at line 1, column 45"),
    ("QUERY m FROM trades PATTERN (a) DEFINE a AS (price > 1", 1, 55,
     "expected ')' before the end of the file to close the '(' at line 1, column 45"),
])
def test_a_missing_paren_is_reported_where_it_is_missing(text, line, column, message):
    """At the end of the token after which the ')' is missing, not where lark stopped (the
    next line, or further on)."""
    with pytest.raises(QueryError) as raised:
        parse(text, "x.cep")
    assert (raised.value.pos.line, raised.value.pos.column, raised.value.message) == \
        (line, column, message)


def test_other_syntax_errors_inside_parens_keep_lark_s_message():
    for text, where in [("QUERY m FROM trades\nPATTERN (a b;", (2, 13)),
                        ("QUERY m FROM trades\nPATTERN (a b", (2, 13)),
                        ("QUERY m FROM trades PATTERN (a) DEFINE a AS (price > > 1)", (1, 54))]:
        with pytest.raises(QueryError) as raised:
            parse(text, "x.cep")
        assert raised.value.message.startswith("unexpected "), raised.value.message
        assert (raised.value.pos.line, raised.value.pos.column) == where


TOKENS = ["QUERY", "q", "FROM", "trades", "PATTERN", "SEQ", "(", ")", "DEFINE", "a", "AS",
          "price", ">", "1", ",", "WHERE", "WITHIN", "5", "minutes", "SELECT", "[", "]",
          "RANGE", "SLIDE", "NOT", "KLEENE", "AND", "OR", "'s'", ".", "*", "+", "?", "|",
          "EACH", "LAST", "DETECT", "EMIT", "=", "{", "}", ";", "count", "avg", "FROM s"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=80),
                 st.lists(st.sampled_from(TOKENS), max_size=30).map(" ".join)))
def test_parser_never_crashes(text):
    try:
        parse(text, "fuzz.cep")
    except QueryError as e:
        assert e.pos.line >= 1 and str(e).startswith("fuzz.cep:")


CACHED_QUERY = """\
QUERY up FROM trades PARTITION BY symbol
PATTERN ( a b ) DEFINE a AS TRUE, b AS price > Last(price)
EMIT symbol = symbol, gain = Last(price) - First(price);
"""


def test_parser_is_loaded_from_its_cache(tmp_path, monkeypatch):
    from cep_core import parser

    monkeypatch.setenv("CEP_HOME", str(tmp_path))
    parser._lark.cache_clear()
    try:
        built = repr(parser.parse(CACHED_QUERY, "q.cep"))  # expression nodes compare by identity
        assert "line=2, column=29" in built  # positions are kept
        [cached] = (tmp_path / "cache" / "parser").glob("lark-*.pickle")
        parser._lark.cache_clear()
        with monkeypatch.context() as m:  # building is not possible now: it must load
            def no_building(*args, **kwargs):
                raise AssertionError("the parser was built, not loaded from the cache")

            m.setattr(parser.lark.Lark, "__init__", no_building)
            loaded = parser._lark()
            assert loaded.options.propagate_positions and loaded.options.maybe_placeholders
            assert repr(parser.parse(CACHED_QUERY, "q.cep")) == built
        cached.write_bytes(b"garbage")  # a corrupt cache is rebuilt, not an error
        parser._lark.cache_clear()
        assert repr(parser.parse(CACHED_QUERY, "q.cep")) == built
        assert cached.read_bytes() != b"garbage"
    finally:
        parser._lark.cache_clear()
