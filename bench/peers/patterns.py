"""OpenCEP's own test patterns, written once as data and translated for both engines.

Each pattern comes from OpenCEP's test suite (test/BasicTests.py, NegationTests.py,
KC_tests.py; the test's name is kept) and runs on the NASDAQ event file that test uses
(NASDAQ_LONG.txt is not in OpenCEP's repository any more, so its patterns run on
NASDAQ_AAPL_AMZN_GOOG.txt or NASDAQ_MEDIUM.txt, which hold their tickers).

A step is `"T x"`, `"NOT T x"` or `"KLEENE T x"`; a condition is `L op R` where L and R are
`x.attr`, a number, or `x.attr * number`. This module imports nothing outside the standard
library: OpenCEP's runner (bench/peers/opencep_runner.py) imports it under OpenCEP's own
interpreter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# OpenCEP's MetastockDataFormatter keys -> attributes of schemas/stocks.json
ATTRIBUTES = {"open": "Opening Price", "peak": "Peak Price", "low": "Lowest Price",
              "close": "Close Price", "volume": "Volume"}
OPERATORS = ("<=", ">=", "!=", "<", ">", "=")


@dataclass(frozen=True)
class PeerPattern:
    name: str
    events: str  # a file of OpenCEP's test/EventFiles
    operator: str  # "SEQ" or "AND"
    steps: tuple[str, ...]
    where: tuple[str, ...]
    minutes: int
    origin: str = ""
    notes: str = field(default="", compare=False)


PATTERNS: tuple[PeerPattern, ...] = (
    PeerPattern("googleAscend", "NASDAQ_AAPL_AMZN_GOOG.txt", "SEQ",
                ("GOOG a", "GOOG b", "GOOG c"), ("a.peak < b.peak", "b.peak < c.peak"), 3,
                "BasicTests.googleAscendPatternSearchTest"),
    PeerPattern("amazonInstable", "NASDAQ_AAPL_AMZN_GOOG.txt", "SEQ",
                ("AMZN x1", "AMZN x2", "AMZN x3"),
                ("x1.low <= 75", "x2.peak >= 78", "x3.low <= x1.low"), 24 * 60,
                "BasicTests.amazonInstablePatternSearchTest"),
    PeerPattern("msftDrivRace", "NASDAQ_MEDIUM.txt", "SEQ",
                ("MSFT a", "DRIV b", "MSFT c", "DRIV d", "MSFT e"),
                ("a.peak < b.peak", "b.peak < c.peak", "c.peak < d.peak", "d.peak < e.peak"),
                10, "BasicTests.msftDrivRacePatternSearchTest"),
    PeerPattern("googleIncrease", "NASDAQ_AAPL_AMZN_GOOG.txt", "SEQ", ("GOOG a", "GOOG b"),
                ("b.peak >= a.peak * 1.01",), 30, "BasicTests.googleIncreasePatternSearchTest"),
    PeerPattern("googleAmazonLow", "NASDAQ_AAPL_AMZN_GOOG.txt", "AND", ("AMZN a", "GOOG g"),
                ("a.peak <= 73", "g.peak <= 525"), 1,
                "BasicTests.googleAmazonLowPatternSearchTest"),
    PeerPattern("hierarchy", "NASDAQ_AAPL_AMZN_GOOG.txt", "AND",
                ("AMZN a", "AAPL b", "GOOG c"), ("a.peak < b.peak", "b.peak < c.peak"), 1,
                "BasicTests.hierarchyPatternSearchTest"),
    PeerPattern("duplicateEventType", "NASDAQ_TINY.txt", "SEQ",
                ("AMZN a", "AMZN b", "AMZN c"), (), 10, "BasicTests.duplicateEventTypeTest"),
    PeerPattern("simpleNot", "NASDAQ_AAPL_AMZN_GOOG.txt", "SEQ",
                ("AAPL a", "NOT AMZN b", "GOOG c"), ("a.open > b.open", "b.open < c.open"), 5,
                "NegationTests.simpleNotTest (on NASDAQ_AAPL_AMZN_GOOG, not custom2)"),
    PeerPattern("OneNotBegin", "NASDAQ_SHORT.txt", "SEQ",
                ("NOT TYP1 x", "AAPL a", "AMZN b", "GOOG c"),
                ("a.open > b.open", "b.open < c.open"), 5,
                "NegationTests.oneNotAtTheBeginningTest"),
    PeerPattern("MultipleNotBegin", "NASDAQ_SHORT.txt", "SEQ",
                ("NOT TYP1 x", "NOT TYP2 y", "NOT TYP3 z", "AAPL a", "AMZN b", "GOOG c"),
                ("a.open > b.open", "b.open < c.open"), 5,
                "NegationTests.multipleNotAtTheBeginningTest"),
    PeerPattern("MultipleNotMiddle", "NASDAQ_SHORT.txt", "SEQ",
                ("AAPL a", "NOT LI d", "AMZN b", "NOT FB e", "GOOG c"),
                ("a.open > b.open", "b.open < c.open", "e.open > a.open", "d.open < c.open"),
                4, "NegationTests.multipleNotInTheMiddleTest"),
    PeerPattern("OneNotEnd", "NASDAQ_HALF_SHORT.txt", "SEQ",
                ("AAPL a", "AMZN b", "GOOG c", "NOT TYP1 x"),
                ("a.open > b.open", "b.open < c.open"), 5, "NegationTests.oneNotAtTheEndTest"),
    PeerPattern("MultipleNotEnd", "NASDAQ_HALF_SHORT.txt", "SEQ",
                ("AAPL a", "AMZN b", "GOOG c", "NOT TYP1 x", "NOT TYP2 y", "NOT TYP3 z"),
                ("a.open > b.open", "b.open < c.open"), 5,
                "NegationTests.multipleNotAtTheEndTest"),
    PeerPattern("KleeneClosureSeq", "NASDAQ_KC.txt", "SEQ",
                ("AMZN a", "KLEENE GOOG b", "AAPL c"), (), 5,
                "KC_tests.testKleeneClosureSeq"),
    PeerPattern("KC_AllValues", "NASDAQ_KC.txt", "SEQ", ("KLEENE GOOG a",),
                ("a.open > 0", "a.peak > 530.5"), 5, "KC_tests.KC_AllValues"),
)

BY_NAME = {p.name: p for p in PATTERNS}


@dataclass(frozen=True)
class Step:
    kind: str  # "event", "not", "kleene"
    type: str
    var: str


def parse_step(text: str) -> Step:
    words = text.split()
    if words[0] in ("NOT", "KLEENE"):
        return Step(words[0].lower(), words[1], words[2])
    return Step("event", words[0], words[1])


_TERM = re.compile(r"^(?:(?P<var>[A-Za-z_]\w*)\.(?P<attr>\w+)(?:\s*\*\s*(?P<coef>[\d.]+))?"
                   r"|(?P<num>-?[\d.]+))$")


@dataclass(frozen=True)
class Term:
    var: str | None
    attr: str | None
    coef: float | None  # x.attr * coef
    value: float | None  # a number

    def text(self) -> str:
        if self.var is None:
            return _number(self.value)
        base = f"{self.var}.{self.attr}"
        return base if self.coef is None else f"{base} * {_number(self.coef)}"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def parse_term(text: str) -> Term:
    m = _TERM.match(text.strip())
    if not m:
        raise ValueError(f"not a term: {text!r}")
    if m["num"] is not None:
        return Term(None, None, None, float(m["num"]))
    if m["attr"] not in ATTRIBUTES:
        raise ValueError(f"unknown attribute {m['attr']!r} in {text!r}")
    return Term(m["var"], m["attr"], float(m["coef"]) if m["coef"] else None, None)


def parse_condition(text: str) -> tuple[Term, str, Term]:
    for op in OPERATORS:
        left, sep, right = text.partition(f" {op} ")
        if sep:
            return parse_term(left), op, parse_term(right)
    raise ValueError(f"not a comparison: {text!r}")


def cep_query(p: PeerPattern) -> str:
    """The product's query for an OpenCEP pattern: event time order, like OpenCEP's."""
    steps = []
    for s in map(parse_step, p.steps):
        steps.append({"event": f"{s.type} {s.var}", "not": f"NOT({s.type} {s.var})",
                      "kleene": f"KLEENE({s.type} {s.var})"}[s.kind])
    body = ", ".join(steps)
    if p.operator == "AND":
        body = f"AND({body})"
    lines = [f"QUERY {p.name} FROM stocks", f"PATTERN SEQ({body})"]
    if p.where:
        conds = []
        for c in p.where:
            left, op, right = parse_condition(c)
            conds.append(f"{left.text()} {op} {right.text()}")
        lines.append("WHERE " + " AND ".join(conds))
    lines.append(f"WITHIN {p.minutes} minutes")
    lines.append("ORDER BY ts;")
    return "\n".join(lines) + "\n"
