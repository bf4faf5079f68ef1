"""Bad queries: every check of the parser and the checker, each at its file:line:col.

Each row is a query file, a substring of the expected message and the (line, column) the
error must point at. The row's first error (in source order) is the one checked; the caret
line under the source line must sit under that column.
"""

from __future__ import annotations

import pytest

from cep_core.checker import load_query_text
from cep_core.errors import QueryError, QueryErrors
from cep_core.schema import SchemaRegistry, StreamSchema

PATH = "q.cep"


def _registry() -> SchemaRegistry:
    registry = SchemaRegistry()  # schemas/ plus a stream timed in seconds
    registry.add(StreamSchema("secs", {"v": "int", "ts": "timestamp"}, "ts", "s"))
    return registry


def errors_of(text: str) -> list[QueryError]:
    try:
        load_query_text(text, _registry(), path=PATH)
    except QueryErrors as e:
        return e.errors
    except QueryError as e:  # syntax: the parser stops at the first error
        return [e]
    return []


BAD = [
    # ---- syntax (parser)
    ('QUERY q FROM trades PATTERN (A) DEFINE A price > 1',
     "unexpected 'price'", 1, 42),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS price > 1 EMIT x = price @ 2',
     "unexpected character '@'", 1, 70),
    ('QUERY q FROM trades\nPATTERN (A)\nDEFINE A AS price > > 1',
     "unexpected '>'", 3, 21),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS price >',
     'unexpected end of file', 1, 52),
    ('QUERY q FROM trades FROM trades PATTERN (A) DEFINE A AS price > 1',
     'FROM given twice', 1, 21),
    ('QUERY q FROM rfid PATTERN SEQ(O o, R r) WITHIN 5 fortnights',
     "unknown time unit 'fortnights'", 1, 50),
    ('QUERY q PATTERN (A) DEFINE A AS price > 1',
     'names no input stream', 1, 7),
    # ---- names
    ('QUERY q FROM trade PATTERN (A) DEFINE A AS price > 1',
     "unknown stream 'trade'; did you mean 'trades'?", 1, 1),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS prize > 1',
     "stream 'trades' has no attribute 'prize'; did you mean 'price'?", 1, 45),
    ('QUERY q FROM rfid PATTERN SEQ(O o, D d) WHERE o.itm = d.item',
     "stream 'rfid' has no attribute 'itm'", 1, 47),
    ('QUERY q FROM rfid PATTERN SEQ(O o, D d) WHERE o.item = z.item',
     "unknown variable 'z' (the pattern binds: o, d)", 1, 56),
    ('QUERY q FROM rfid PATTERN SEQ(O o, D d) WHERE item = d.item',
     "bare attribute 'item' in a SEQ pattern: name the event it belongs to, as in 'o.item'", 1, 47),
    (('QUERY q FROM stocks PATTERN SEQ(AAPL a, AMZN b)\nWHERE a.open > b.open\nEMIT p = '
      'close'),
     "as in 'a.close'", 3, 10),
    ('QUERY q FROM trades PATTERN (A B) DEFINE A AS price > 1',
     "unknown predicate 'B' in PATTERN", 1, 32),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS price > 1,\n  A AS price < 5',
     "predicate 'A' is defined twice (first at line 1)", 2, 3),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS price > 1, B AS price < 5',
     "predicate 'B' is defined but not used in PATTERN", 1, 56),
    ('QUERY q FROM rfid PATTERN SEQ(O o, R o) WITHIN 1 hour',
     "variable 'o' is bound twice (first at line 1, column 31)", 1, 36),
    (('QUERY q FROM trades PATTERN (A) DEFINE A AS price > 1 EMIT n = Count(), n = '
      'Max(price)'),
     "duplicate output name 'n' in EMIT", 1, 73),
    ('QUERY w SELECT count(*), max(price), max(price) FROM ticks [ROWS 4 SLIDE 2]',
     "duplicate output name 'max_price' in SELECT", 1, 38),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS price > 1 EMIT seq = Count()',
     "output name 'seq' is a field every composite event has", 1, 60),
    ('QUERY q FROM trades PARTITION BY sym PATTERN (A) DEFINE A AS price > 1',
     "stream 'trades' has no attribute 'sym'; did you mean 'symbol'?", 1, 34),
    ('QUERY w SELECT count(*) FROM ticks [ROWS 4 SLIDE 2] GROUP BY sym',
     "stream 'ticks' has no attribute 'sym'", 1, 62),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS x.price > 1',
     "'x.price': a MATCH query has no variables; write 'price'", 1, 45),
    (('QUERY q FROM trades PATTERN (A) DEFINE A AS price > 1;\nQUERY q FROM trades PATTERN '
      '(B) DEFINE B AS price < 1'),
     "query name 'q' is used twice in this file", 2, 1),
    # ---- types
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS symbol > 10',
     'cannot compare string with int', 1, 52),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS price + symbol > 10',
     "arithmetic on string: '+' takes numbers", 1, 53),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS price * TRUE > 10',
     "arithmetic on bool: '*' takes numbers", 1, 53),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS price > 1 AND volume',
     'AND takes conditions (bool), not int', 1, 59),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS price > 1 OR NOT symbol',
     'NOT takes conditions (bool), not string', 1, 62),
    ('QUERY q FROM rfid PATTERN SEQ(O o, D d) WHERE o.item + d.item',
     'WHERE must be a condition (bool), not int', 1, 47),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS price / 2',
     "predicate 'A' must be a condition (bool), not float", 1, 45),
    ('QUERY q FROM abc DETECT C c, EACH B b(v * 2) WITHIN 8 min FROM c',
     'a step filter must be a condition (bool), not int', 1, 39),
    ("QUERY q FROM trades PATTERN (A) DEFINE A AS symbol IN ('IBM', 42)",
     'IN list item is int but the value tested is string', 1, 63),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS length(price) > 3',
     'argument 1 of length() must be a string, not int', 1, 52),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS abs(price, 2) > 3',
     'function abs() takes 1 argument, got 2', 1, 45),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS frobnicate(price) > 3',
     "unknown function 'frobnicate'", 1, 45),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS ts > now()',
     'function now() is not pure: queries may only call pure functions', 1, 50),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS random() < 0.5',
     'function random() is not pure', 1, 45),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS (price > 1) < (price > 2)',
     "cannot order bool values with '<'", 1, 57),
    ("QUERY q FROM trades PATTERN (A) DEFINE A AS -symbol = 'x'",
     "unary '-' takes a number, not string", 1, 46),
    # ---- MATCH
    (('QUERY q FROM trades PATTERN (rise+ drop) DEFINE rise AS price > Last(price), drop AS '
      'price < 3'),
     ("predicate 'rise' reads aggregates but can start a match (transition out of the start "
      'state); nothing has been matched yet'), 1, 30),
    (('QUERY q FROM trades PATTERN (A* (B | C)) DEFINE A AS price > 1, B AS price > 2,\n  C '
      'AS Count() > 2'),
     "predicate 'C' reads aggregates but can start a match", 1, 38),
    ('QUERY q FROM trades PATTERN (()*) DEFINE A AS price > 1',
     'PATTERN matches only the empty sequence', 1, 21),
    ('QUERY q FROM trades PATTERN (. A) DEFINE A AS price > First(x.price)',
     'aggregates in MATCH are over the match, which has no variables: write first(price)', 1, 61),
    ('QUERY q FROM trades PATTERN (. A) DEFINE A AS price > Count(x)',
     'Count() in MATCH counts the events of the match and takes no argument', 1, 61),
    ('QUERY q FROM trades PATTERN (. A) DEFINE A AS 5 < avg(Temp.value WITHIN 5 min FROM s)',
     'a window aggregate (... WITHIN w FROM x) is not allowed in a MATCH predicate', 1, 51),
    ('QUERY q FROM trades PATTERN (. A) DEFINE A AS Delta(price) > 1000',
     "Delta takes the time attribute 'ts', not 'price'", 1, 53),
    ('QUERY q FROM trades PATTERN (. A) DEFINE A AS Collect(price) = 1',
     'Collect() builds a list for EMIT; it is not allowed in a MATCH predicate', 1, 47),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS price > 1 EMIT s = Sum(symbol)',
     'sum takes numbers, not string', 1, 68),
    ('QUERY q FROM trades PATTERN (A) DEFINE A AS price > 1 EMIT s = Collect(price) = 3',
     "cannot compare lists with '='", 1, 79),
    # ---- SEQ
    ('QUERY q FROM rfid PATTERN SEQ(O o, X x) WITHIN 1 hour',
     "unknown event type 'X': the type of stream 'rfid' is one of O, R, D, C", 1, 36),
    ('QUERY q FROM trades PATTERN SEQ(IBM a, ANY b) WITHIN 1 hour',
     "stream 'trades' has no type attribute, so its events have no type 'IBM': use ANY", 1, 33),
    ('QUERY q FROM rfid PATTERN SEQ(O o, KLEENE(R r){0,3}, D d) WITHIN 1 hour',
     "Kleene step 'r' needs a lower bound of at least 1, not 0", 1, 36),
    ('QUERY q FROM rfid PATTERN SEQ(O o, KLEENE(R r){3,2}, D d) WITHIN 1 hour',
     "Kleene step 'r': upper bound 2 is below lower bound 3", 1, 36),
    ('QUERY q FROM rfid PATTERN SEQ(NOT(C c), O o, D d) WHERE c.item = o.item',
     'a pattern that starts with NOT needs WITHIN', 1, 31),
    ('QUERY q FROM rfid PATTERN SEQ(O o, D d, NOT(C c)) WHERE c.item = o.item',
     'a pattern that ends with NOT needs WITHIN', 1, 41),
    (('QUERY q FROM abc DETECT C c, EACH B b WITHIN 8 min FROM a, LAST A a WITHIN 3 min FROM '
      'c'),
     "'b' is measured FROM 'a', which is not a later step", 1, 30),
    ('QUERY q FROM abc DETECT C c, EACH B b WITHIN 8 min FROM x',
     "unknown variable 'x' after FROM", 1, 30),
    (('QUERY q FROM abc DETECT C c, LAST B b WITHIN 8 min FROM c, EACH A a WITHIN 3 min FROM '
      'b\nWHERE c.p = b.p AND b.v > a.v'),
     "condition on LAST step 'b' mentions 'a'", 2, 27),
    (('QUERY q FROM abc DETECT C c, FIRST B b WITHIN 8 min FROM c, EACH A a WITHIN 3 min '
      'FROM b\nWHERE b.p = a.p'),
     "condition on FIRST step 'b' mentions 'a', which is not a later step", 2, 13),
    ('QUERY q FROM sensors DETECT Smoke s WHERE 45 < avg(Temp.value WITHIN 5 min FROM t)',
     "unknown variable 't' (the pattern binds: s)", 1, 48),
    ('QUERY q FROM sensors DETECT Smoke s WHERE 45 < avg(Tmp.value WITHIN 5 min FROM s)',
     "unknown event type 'Tmp'", 1, 48),
    (('QUERY q FROM sensors PATTERN SEQ(KLEENE(Temp t), Smoke s) WHERE 45 < avg(Temp.value '
      'WITHIN 5 min FROM t)'),
     "a window aggregate is measured FROM 't', which must be bound to one event", 1, 70),
    ('QUERY q FROM rfid PATTERN SEQ(O o, D d) WHERE avg(o.item) > 3',
     "'o' is not a Kleene variable", 1, 51),
    ('QUERY q FROM rfid PATTERN SEQ(O o, O+ d) WHERE avg(item) > 3',
     'an aggregate in a SEQ pattern is over a Kleene variable, as in avg(d.item)', 1, 48),
    ('QUERY q FROM rfid PATTERN SEQ(O o, O+ d) EMIT n = collect(d.item)',
     'collect is a MATCH aggregate', 1, 51),
    ('QUERY q FROM rfid PATTERN SEQ(O o, D d(o.item = item))',
     "'o.item': a step filter is a condition on its own event; write 'item'", 1, 40),
    ('QUERY q FROM rfid PATTERN SEQ(O o, O+ d(item > count(d)))',
     'aggregates are not allowed in a step filter', 1, 48),
    ('QUERY q FROM rfid PATTERN SEQ(O o, D d) ORDER BY item',
     "ORDER BY takes the time attribute 'ts' (or seq), not 'item'", 1, 50),
    ('QUERY q FROM rfid PATTERN SEQ(O o, AND(R r, NOT(C c))) WITHIN 1 hour',
     'NOT and KLEENE steps cannot be inside AND(...)', 1, 45),
    ('QUERY q FROM rfid PATTERN SEQ(O o, AND(KLEENE(R r), D d)) WITHIN 1 hour',
     'NOT and KLEENE steps cannot be inside AND(...)', 1, 40),
    ('QUERY q FROM rfid PATTERN SEQ(NOT(O o), NOT(C c)) WITHIN 1 hour',
     'a SEQ needs at least one positive step', 1, 19),
    ('QUERY q FROM rfid PATTERN SEQ(NOT(C c)) WITHIN 1 hour',
     'NOT cannot be the only step', 1, 31),
    ('QUERY q FROM rfid PATTERN SEQ(O o, NOT(C c), D d) EMIT x = c.item',
     "'c' is a negated variable: it binds no event, so EMIT cannot read it", 1, 60),
    ('QUERY q FROM rfid PATTERN SEQ(O o, KLEENE(R r), D d) EMIT x = r.item',
     ("'r' is a Kleene variable bound to several events: EMIT needs an aggregate over it, as "
      'in avg(r.item)'), 1, 63),
    ('QUERY q FROM rfid PATTERN SEQ(O o, NOT(C c), NOT(R r), D d)\nWHERE c.item = r.item',
     'a condition may mention at most one negated variable', 2, 7),
    ('QUERY q FROM rfid PATTERN SEQ(O o, LAST R+ r, D d)',
     'LAST selects one event, but a Kleene step binds several', 1, 36),
    ('QUERY q FROM abc PATTERN SEQ(A a, AND(LAST B b, C c), C c2)',
     'LAST cannot be inside AND(...)', 1, 39),
    ('QUERY q FROM abc PATTERN SEQ(FIRST A a, B b, C c) USING skip-till-next-match',
     'FIRST is a selection policy of its own; it cannot be combined with USING', 1, 30),
    ('QUERY q FROM abc PATTERN SEQ(A a, B b) USING strict-contiguity\nON TIMEOUT EMIT PARTIAL',
     'ON TIMEOUT EMIT PARTIAL needs WITHIN', 2, 1),
    ('QUERY q FROM abc PATTERN SEQ(A a, B b) WITHIN 5 ON TIMEOUT EMIT PARTIAL',
     'ON TIMEOUT EMIT PARTIAL needs USING skip-till-next-match or strict-contiguity', 1, 49),
    ('QUERY q FROM abc PATTERN SEQ(A a, B b) WITHIN 5 USING strict-contiguity\n'
     'ON TIMEOUT EMIT PARTIAL ON TIMEOUT EMIT PARTIAL',
     'ON TIMEOUT EMIT PARTIAL given twice', 2, 25),
    ('QUERY q FROM abc PATTERN SEQ(A a, B b) WITHIN 5 ON TIMEOUT EMIT',
     'unexpected end of file', 1, 64),
    # ---- WINDOW
    ('QUERY w SELECT symbol FROM ticks [ROWS 4 SLIDE 2] GROUP BY symbol',
     'a WINDOW query needs an aggregate in SELECT', 1, 9),
    (('QUERY w SELECT symbol, max(price), volume FROM ticks [RANGE 10 seconds SLIDE 5 '
      'seconds]\nGROUP BY symbol'),
     "'volume' in SELECT is not a GROUP BY attribute nor the window attribute 'time'", 1, 36),
    ('QUERY w SELECT max(price) FROM ticks [RANGE 10 seconds SLIDE 5 seconds WATTR tme]',
     "WATTR 'tme': stream 'ticks' has no such attribute; did you mean 'time'?", 1, 38),
    ('QUERY w SELECT max(price) FROM ticks [RANGE 10 seconds SLIDE 5 seconds WATTR price]',
     "WATTR 'price' must be an int or timestamp attribute, not float", 1, 38),
    ('QUERY w SELECT max(price) FROM ticks [RANGE 10 seconds SLIDE 3 seconds]',
     'RANGE (10 s) must be a multiple of SLIDE (3 s)', 1, 45),
    ('QUERY w SELECT max(price) FROM ticks [RANGE 10 seconds SLIDE 0 seconds]',
     'a duration must be positive, not 0 s', 1, 62),
    ('QUERY w SELECT max(price) FROM ticks [ROWS 10 SLIDE 4]',
     'ROWS 10 must be a multiple of SLIDE 4', 1, 38),
    ('QUERY w SELECT max(price) FROM ticks [ROWS 0 SLIDE 1]',
     'ROWS must be at least 1, not 0', 1, 38),
    ('QUERY w SELECT sum(symbol) FROM ticks [ROWS 4 SLIDE 2]',
     'sum takes numbers, not string', 1, 20),
    ('QUERY w SELECT count(*) FROM ticks [ROWS 4 SLIDE 2] WHERE price > avg(price)',
     'aggregates are not allowed in WHERE of a WINDOW query', 1, 67),
    ('QUERY w SELECT first(price) FROM ticks [ROWS 4 SLIDE 2]',
     'first is not a WINDOW aggregate', 1, 16),
    ('QUERY w SELECT count(*), max(price) - min(price) FROM ticks [ROWS 4 SLIDE 2]',
     ('a SELECT item is an aggregate (count, sum, min, max, avg), a GROUP BY attribute or '
      'the window attribute'), 1, 26),
    (('QUERY w SELECT count(*) FROM ticks [ROWS 4 SLIDE 2] WHERE 1 < count(ANY WITHIN 5 min '
      'FROM s)'),
     'a window aggregate (... WITHIN w FROM x) is not allowed in WHERE of a WINDOW query', 1, 63),
    ('QUERY w SELECT count(*) FROM ticks [ROWS 4 SLIDE 2] WHERE t.price > 3',
     "'t.price': a WINDOW query has no variables", 1, 59),
    # ---- durations
    ('QUERY q FROM rfid PATTERN SEQ(O o, D d) WITHIN 400 days',
     '400 d is longer than the maximum of 366 days', 1, 48),
    ('QUERY q FROM rules PATTERN SEQ(A a, B b) WITHIN 5 minutes',
     'a stream timed in ticks takes durations in ticks', 1, 49),
    ('QUERY q FROM secs PATTERN SEQ(ANY a, ANY b) WITHIN 1500 ms',
     "duration finer than the stream's time unit (s)", 1, 52),
    ('QUERY q FROM rfid PATTERN SEQ(O o, D d) WITHIN 0 minutes',
     'a duration must be positive', 1, 48),
    # ---- durations in expressions: compared with Delta only, in the stream's time unit
    ('QUERY q FROM trades PATTERN (. A) DEFINE A AS price > 5 minutes',
     "a duration (5 min) can only be compared with Delta(ts); elsewhere write the number in "
     "the stream's time unit (ms): 300000", 1, 55),
    ('QUERY q FROM trades PATTERN (. A) DEFINE A AS Delta(ts) <= 5 minutes + 1',
     'a duration (5 min) can only be compared with Delta(ts)', 1, 60),
    ('QUERY q FROM rfid PATTERN SEQ(O o, D d) WHERE d.ts - o.ts < 5 minutes WITHIN 1 hour',
     "elsewhere write the number in the stream's time unit (ms): 300000", 1, 61),
    ('QUERY q FROM trades PATTERN (. A) DEFINE A AS Delta(ts) < 5 weeks',
     "unexpected 'weeks' after 5 (a duration's unit is ms, seconds, minutes, hours, days or "
     "ticks)", 1, 61),
    ('QUERY q FROM secs PATTERN (. A) DEFINE A AS Delta(ts) <= 1500 ms',
     "1500 ms on stream 'secs' (timed in s): duration finer than the stream's time unit (s)",
     1, 58),
    ('QUERY q FROM rules PATTERN (. A) DEFINE A AS Delta(ts) <= 1 minute',
     'a stream timed in ticks takes durations in ticks', 1, 59),
    ('QUERY q FROM trades PATTERN (. A) DEFINE A AS Delta(ts) <= 400 days',
     '400 d is longer than the maximum of 366 days', 1, 60),
]


@pytest.mark.parametrize("text, message, line, column", BAD)
def test_bad_query_is_reported_at_its_node(text, message, line, column):
    errors = errors_of(text)
    assert errors, "expected an error"
    error = errors[0]
    assert message in error.message
    head, source_line, caret = str(error).splitlines()
    assert head.startswith(f"{PATH}:{line}:{column}: error: ")
    assert source_line == "    " + text.splitlines()[line - 1]
    assert caret == "    " + " " * (column - 1) + "^"


def test_table_is_large_and_distinct():
    assert len(BAD) >= 45
    assert len({text for text, *_ in BAD}) == len(BAD)


def test_each_bad_query_but_the_empty_pattern_has_one_error():
    several = [text for text, *_ in BAD if len(errors_of(text)) != 1]
    # `()*` uses no predicate, so its DEFINE is also reported as unused.
    assert several == ["QUERY q FROM trades PATTERN (()*) DEFINE A AS price > 1"]


def test_all_errors_of_a_file_are_reported_in_source_order():
    text = ("QUERY a FROM trades PATTERN (A) DEFINE A AS symbol > 3;\n"
            "QUERY b FROM nowhere PATTERN (A) DEFINE A AS price > 1;\n"
            "QUERY c FROM rfid PATTERN SEQ(O o, D d)\n"
            "  WHERE o.item = z.item EMIT n = item;\n"
            "QUERY d SELECT sum(symbol), count(*) FROM ticks [ROWS 10 SLIDE 3]")
    with pytest.raises(QueryErrors) as raised:
        load_query_text(text, _registry(), path=PATH)
    found = [(e.pos.line, e.pos.column, e.message.split(";")[0].split(":")[0])
             for e in raised.value.errors]
    assert found == [
        (1, 52, "cannot compare string with int"),
        (2, 1, "unknown stream 'nowhere'"),
        (4, 18, "unknown variable 'z' (the pattern binds"),
        (4, 34, "bare attribute 'item' in a SEQ pattern"),
        (5, 20, "sum takes numbers, not string"),
        (5, 49, "ROWS 10 must be a multiple of SLIDE 3"),
    ]
    message = str(raised.value)
    assert message.index("q.cep:1:52") < message.index("q.cep:2:1") < message.index("q.cep:5:49")
    assert all(e.source == text for e in raised.value.errors)


def test_errors_in_one_query_do_not_hide_the_next_query():
    text = ("QUERY a FROM trades PATTERN (A) DEFINE A AS prize > 1;\n"
            "QUERY b FROM trades PATTERN (A) DEFINE A AS price > 1;\n"
            "QUERY c FROM trades PATTERN (A) DEFINE A AS price > now();\n")
    lines = [e.pos.line for e in errors_of(text)]
    assert lines == [1, 3]


def test_a_shared_operand_of_a_chained_comparison_is_reported_once():
    errors = errors_of("QUERY q FROM abc DETECT C c, EACH B b WITHIN 8 min FROM c "
                       "WHERE b.p = c.q = c.p")
    assert [e.message for e in errors] == ["stream 'abc' has no attribute 'q'"]
