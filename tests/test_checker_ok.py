"""Good queries: the papers' examples behind docs/semantics.md (in this product's syntax)
check cleanly, and the checker fills in the type of every expression node."""

from __future__ import annotations

import pytest

from cep_core import ast
from cep_core import regex_analysis as ra
from cep_core.checker import check, load_query_text, select_name
from cep_core.parser import parse
from cep_core.schema import SchemaRegistry, StreamSchema

# The papers' examples, section by section (MATCH, SEQ, WINDOW of docs/semantics.md), as the
# docs print them (cep_core/workloads.py builds its marathon and finance1 workloads on the same
# queries).
# Deliberately like cep_core/workloads.py _marathon_query and finance1: the docs' example queries,
# written out where each is read
SEMANTICS_EXAMPLES = {
    "marathon": """
        QUERY cheat FROM checkpoints INTO cheaters
        PARTITION BY runner
        PATTERN ( A NOTB* C | A NOTC* D | A NOTD* E )
        DEFINE A AS checkpoint = 'Staten Island', NOTB AS checkpoint != 'Brooklyn',
               C AS checkpoint = 'Queens', NOTC AS checkpoint != 'Queens',
               D AS checkpoint = 'Bronx',  NOTD AS checkpoint != 'Bronx',
               E AS checkpoint = 'Manhattan'
    """,
    "mshape": """
        QUERY mshape FROM trades
        PARTITION BY symbol
        PATTERN ( . rise+ drop+ rise+ drop* deep )
        DEFINE rise AS price > First(price) AND price >= Last(price),
               drop AS price >= First(price) AND price < Last(price),
               deep AS price < First(price) AND price < Last(price)
        EMIT symbol = symbol, seqNum = First(seqNum), count = Count(), maxPrice = Max(price)
    """,
    "hypersonic": """
        QUERY abc FROM stocks
        PATTERN SEQ(AAPL a, AMZN b, AVID c)
        WHERE a.open > b.open AND b.open > c.open
        WITHIN 5 minutes
    """,
    "ord": """
        QUERY ord FROM rfid
        PATTERN SEQ(O o, R r, D d) WHERE o.item = r.item AND r.item = d.item WITHIN 1 hour
    """,
    "not_cancelled": """
        QUERY not_cancelled FROM rfid
        PATTERN SEQ(O o, NOT(C c), D d) WHERE o.item = c.item AND o.item = d.item WITHIN 1 hour
    """,
    "duplicate_orders": """
        QUERY dup FROM rfid PATTERN SEQ(O o, KLEENE(O dup), R r, D d) WITHIN 1 hour
    """,
    "fire_each": """
        QUERY fire_each FROM sensors
        DETECT Smoke s, EACH Temp t WITHIN 5 min FROM s
        WHERE t.area = s.area AND t.value > 45
        EMIT area = s.area, measuredTemp = t.value
    """,
    "fire_last": """
        QUERY fire_last FROM sensors
        DETECT Smoke s, LAST Temp t WITHIN 5 min FROM s
        WHERE t.area = s.area AND t.value > 45
        EMIT area = s.area, measuredTemp = t.value
    """,
    "fire_avg": """
        QUERY fire_avg FROM sensors
        DETECT Smoke s
        WHERE 45 < Avg(Temp(area = s.area).value WITHIN 5 min FROM s)
        EMIT area = s.area, measuredTemp = Avg(Temp(area = s.area).value WITHIN 5 min FROM s)
    """,
    "tesla_r4": """
        QUERY r4 FROM abc
        DETECT C c, EACH B b(v > 10) WITHIN 8 min FROM c, LAST A a WITHIN 3 min FROM b
        WHERE a.p = b.p = c.p
    """,
    "max_bid": """
        QUERY maxbid INTO top
        SELECT max(bid_price), timestamp FROM bids [RANGE 4 minutes SLIDE 1 minute WATTR timestamp]
    """,
    "ticks": """
        QUERY hi
        SELECT symbol, max(price) AS hi, count(*) AS n
        FROM ticks [RANGE 300 seconds SLIDE 5 seconds WATTR time]
        WHERE symbol IN ('GOOG', 'AAPL', 'YHOO') AND (volume > 100 OR price < 10)
        GROUP BY symbol
    """,
}

# Other constructs docs/semantics.md describes.
MORE_EXAMPLES = {
    "kleene_aggregates": """
        QUERY k FROM rfid PARTITION BY item
        PATTERN SEQ(O o, KLEENE(O dup){2,5}, R r, D d)
        WHERE count(dup) >= 2 AND avg(dup.item) = o.item AND dup.item = o.item
              AND d.ts - o.ts <= 1800000
        WITHIN 1 hour USING skip-till-next-match ORDER BY ts
        EMIT n = count(dup), first_dup = first(dup.ts), span = d.ts - o.ts
    """,
    "plus_and_group": """
        QUERY g FROM rfid PATTERN SEQ(O o, KLEENE(O more){1,}, AND(R r, C c), D d(item > 0))
        WITHIN 2 hours USING strict-contiguity;
        QUERY h FROM rfid PATTERN SEQ(LAST O o, EACH O+ more, R r) WHERE avg(more.item) > o.item
    """,
    "leading_and_trailing_not": """
        QUERY lead FROM rfid PATTERN SEQ(NOT(C c), O o) WHERE c.item = o.item WITHIN 10 min;
        QUERY trail FROM rfid PATTERN SEQ(O o, NOT(C c)) WHERE c.item = o.item WITHIN 10 min
    """,
    "untyped_any": """
        QUERY up FROM trades PARTITION BY symbol
        PATTERN SEQ(ANY a, ANY b) WHERE b.price > a.price * 2 AND abs(b.volume - a.volume) < 10
        WITHIN 100
    """,
    "ticks_stream": """
        QUERY t FROM rules PATTERN SEQ(A a, B b) WHERE a.att < b.att WITHIN 50 ticks
    """,
    "match_emit_collect_delta": """
        QUERY m FROM trades PARTITION BY symbol
        PATTERN ( up+ )
        DEFINE up AS price > 0 AND lower(symbol) != 'x' AND ts + 1 > 0
        EMIT prices = Collect(price), took = Delta(ts), mean = Average(price), lo = Min(price),
             total = Sum(volume), ratio = Sum(volume) / Count(), last = Last(price)
    """,
    "match_aggregates_after_start": """
        QUERY m FROM trades PATTERN ( start (grow | flat)+ )
        DEFINE start AS volume > 0,
               grow AS price > Last(price) AND Delta(ts) < 60000 AND Count() < 10,
               flat AS price = Last(price)
    """,
    "row_window": """
        QUERY rows SELECT count(*), sum(volume) AS v, avg(price), min(symbol),
               count(price) AS n_price
        FROM ticks [ROWS 10 SLIDE 2] WHERE NOT (price < 1) AND symbol NOT IN ('X', 'Y')
        GROUP BY symbol
    """,
    "tesla_first": """
        QUERY r FROM abc DETECT C c(p > 0), FIRST B b WITHIN 8 min FROM c
        WHERE b.p = c.p AND count(A(p = c.p) WITHIN 10 min FROM c) > 2
        EMIT p = c.p, n = count(A WITHIN 10 min FROM c), hi = max(A.v WITHIN 10 min FROM b)
    """,
}

ALL = {**SEMANTICS_EXAMPLES, **MORE_EXAMPLES}


def expressions(query: ast.Query):
    """Every expression node of a query."""
    kinds = (ast.Literal, ast.Attr, ast.Unary, ast.Binary, ast.InList, ast.Call,
             ast.Aggregate, ast.WindowAggregate)
    return list(query.find_all(*kinds))


def checked(text: str):
    return load_query_text(text, path="ok.cep")


@pytest.mark.parametrize("name", sorted(ALL))
def test_example_checks_and_every_expression_is_typed(name):
    queries = checked(ALL[name])
    assert queries
    for index, query in enumerate(queries):
        assert query.index == index
        untyped = [node for node in expressions(query.query) if query.types[node] is None]
        assert untyped == []
        for node in expressions(query.query):
            assert query.types[node] in ("int", "float", "string", "bool", "list")


def test_all_semantics_examples_in_one_file():
    queries = checked(";\n".join(SEMANTICS_EXAMPLES.values()))
    assert [q.index for q in queries] == list(range(len(SEMANTICS_EXAMPLES)))
    assert [q.query.kind for q in queries] == ["match"] * 2 + ["seq"] * 8 + ["window"] * 2


def type_of(query, predicate) -> list[str]:
    return [query.types[node] for node in expressions(query.query) if predicate(node)]


def test_types_of_match_expressions():
    [query] = checked(MORE_EXAMPLES["match_emit_collect_delta"])
    emit = {item.name: query.types[item.expr] for item in query.query.body.emit}
    assert emit == {"prices": "list", "took": "int", "mean": "float", "lo": "int",
                    "total": "int", "ratio": "float", "last": "int"}
    define = query.query.body.defines[0].condition
    assert query.types[define] == "bool"
    assert type_of(query, lambda n: isinstance(n, ast.Call)) == ["string"]
    # ts is a timestamp: an int, so `ts + 1` is int arithmetic
    assert type_of(query, lambda n: isinstance(n, ast.Binary) and n.op == "+") == ["int"]


def test_a_duration_compared_with_delta_is_a_number_in_the_streams_time_unit():
    registry = SchemaRegistry()
    registry.add(StreamSchema("secs", {"v": "int", "ts": "timestamp"}, "ts", "s"))
    for stream, written, units in (("trades", "5 minutes", 300_000), ("secs", "5 min", 300),
                                   ("rules", "7 ticks", 7), ("trades", "0 ms", 0)):
        text = f"QUERY q FROM {stream} PATTERN (. A) DEFINE A AS {written} >= Delta(ts)"
        query_file = parse(text)
        for _ in range(2):  # checking again converts from the duration as written again
            [query] = check(query_file, registry, text)
            literal = query.query.body.defines[0].condition.left
            assert (literal.value, query.types[literal]) == (units, "int"), (stream, written)


def test_types_of_seq_expressions():
    [query] = checked(MORE_EXAMPLES["kleene_aggregates"])
    emit = {item.name: query.types[item.expr] for item in query.query.body.emit}
    assert emit == {"n": "int", "first_dup": "int", "span": "int"}
    avg = [n for n in expressions(query.query) if isinstance(n, ast.Aggregate)
           and n.func is ast.AggFunc.AVG]
    assert [query.types[a] for a in avg] == ["float"]
    [fire] = checked(SEMANTICS_EXAMPLES["fire_avg"])
    window_aggregates = [n for n in expressions(fire.query)
                         if isinstance(n, ast.WindowAggregate)]
    assert [fire.types[w] for w in window_aggregates] == ["float", "float"]
    [r4] = checked(SEMANTICS_EXAMPLES["tesla_r4"])
    assert r4.types[r4.query.body.steps[1].filter] == "bool"


def test_types_of_window_expressions():
    [query] = checked(SEMANTICS_EXAMPLES["ticks"])
    items = query.query.body.items
    assert [(select_name(i), query.types[i.expr]) for i in items] == [
        ("symbol", "string"), ("hi", "float"), ("n", "int")]
    [bids] = checked(SEMANTICS_EXAMPLES["max_bid"])
    assert [select_name(i) for i in bids.query.body.items] == ["max_bid_price", "timestamp"]
    [rows] = checked(MORE_EXAMPLES["row_window"])
    assert [(select_name(i), rows.types[i.expr]) for i in rows.query.body.items] == [
        ("count", "int"), ("v", "int"), ("avg_price", "float"), ("min_symbol", "string"),
        ("n_price", "int")]


def test_checked_query_converts_durations_to_the_stream_unit():
    [query] = checked(SEMANTICS_EXAMPLES["hypersonic"])
    assert query.time_units(query.query.body.within) == 300_000
    assert query.schema.stream == "stocks"


# ---------------------------------------------------------------- regex analysis


def pattern_of(text: str) -> ast.Regex:
    return parse(f"QUERY q FROM trades PATTERN ({text}) DEFINE A AS price > 1").queries[0] \
        .body.pattern


@pytest.mark.parametrize("text, nullable, first, last", [
    ("A", False, "A", "A"),
    (".", False, ".", "."),
    ("A*", True, "A", "A"),
    ("A? B", False, "A B", "B"),
    ("A B*", False, "A", "A B"),
    ("A | B C", False, "A B", "A C"),
    ("(A | ()) B?", True, "A B", "A B"),
    ("()", True, "", ""),
    (". rise+ drop+ rise+ drop* deep", False, ".", "deep"),
])
def test_nullable_first_last(text, nullable, first, last):
    regex = pattern_of(text)

    def names(found):
        return " ".join(getattr(p, "name", ".") for p in found)

    assert ra.nullable(regex) is nullable
    assert names(ra.first(regex)) == first
    assert names(ra.last(regex)) == last


def test_follow_builds_the_glushkov_automaton():
    regex = pattern_of("A B* C | A D")
    a1, b, c, a2, d = ra.positions(regex)
    follow = ra.follow(regex)
    assert follow[id(a1)] == [b, c]
    assert follow[id(b)] == [b, c]
    assert follow[id(c)] == []
    assert follow[id(a2)] == [d]
    assert ra.first_symbols(regex) == {"A"}


def test_only_empty_patterns():
    assert ra.matches_only_empty(pattern_of("()"))
    assert ra.matches_only_empty(pattern_of("()* ()?"))
    assert not ra.matches_only_empty(pattern_of("A*"))


@pytest.mark.parametrize("written", ["ANY", "any", "Any"])
def test_any_is_any_type_in_any_case_as_the_engines_read_it(written):
    """The checker takes `any x` as the engines do (ast.is_any_type): on a stream without a
    type attribute, and on one whose types are declared."""
    for stream in ("trades", "rfid"):
        [query] = checked(f"QUERY q FROM {stream} PATTERN SEQ({written} a, {written} b) "
                          "WITHIN 1 hour")
        assert [ast.is_any_type(s.event_type) for s in query.query.body.steps] == [True, True]
