"""Typed AST of the query language.

Every node carries a `Pos` (file, line, column) so checks can point at the spot.
The parser (`cep_core.parser`) builds these nodes; the checker
(`cep_core.checker`) validates them against stream schemas and fills in types;
interpreters and compilers work from the checked tree only, never from text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from cep_core.schema import NANOS_PER_UNIT


@dataclass(frozen=True)
class Pos:
    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


NOPOS = Pos("<none>", 0, 0)


# ---------------------------------------------------------------- expressions


@dataclass(eq=False)
class Literal:
    """A constant. A duration written in an expression (`Delta(ts) <= 5 minutes`) keeps
    `duration`; the checker sets `value` to it in the stream's time unit (an int), so engines
    see a plain number."""

    value: int | float | str | bool
    pos: Pos = NOPOS
    type: str | None = None  # filled in by the checker
    duration: Duration | None = None


@dataclass(eq=False)
class Attr:
    """`name` (an attribute of the current event) or `var.name` (of a bound variable)."""

    name: str
    var: str | None = None
    pos: Pos = NOPOS
    type: str | None = None  # filled in by the checker


@dataclass(eq=False)
class Unary:
    op: str  # "-" or "NOT"
    operand: Expr
    pos: Pos = NOPOS
    type: str | None = None  # filled in by the checker


@dataclass(eq=False)
class Binary:
    """Arithmetic (+ - * / %), comparison (= != < <= > >=) or logic (AND, OR)."""

    op: str
    left: Expr
    right: Expr
    pos: Pos = NOPOS
    type: str | None = None  # filled in by the checker


@dataclass(eq=False)
class InList:
    operand: Expr
    options: list[Expr]
    negated: bool = False
    pos: Pos = NOPOS
    type: str | None = None  # filled in by the checker


@dataclass(eq=False)
class Call:
    """A call to a registered function (see `cep_core.functions`)."""

    name: str
    args: list[Expr]
    pos: Pos = NOPOS
    type: str | None = None  # filled in by the checker


class AggFunc(StrEnum):
    COUNT = "count"
    FIRST = "first"
    LAST = "last"
    MAX = "max"
    MIN = "min"
    SUM = "sum"
    AVG = "avg"
    DELTA = "delta"
    COLLECT = "collect"


@dataclass(eq=False)
class Aggregate:
    """An aggregate.

    MATCH: over the partial match (`Count()`, `First(price)`): `arg` is an Attr without var,
    or None for `Count()`.
    SEQ: over a Kleene variable (`avg(dup.price)`, `count(dup)`): `arg` is Attr(var=...),
    or for `count(dup)` an Attr with name "" and var "dup".
    WINDOW: over the window's group (`max(price)`, `count(*)`: arg None).
    """

    func: AggFunc
    arg: Attr | None
    pos: Pos = NOPOS
    type: str | None = None  # filled in by the checker


@dataclass(eq=False)
class WindowAggregate:
    """TESLA's `avg(Temp(area = s.area).value WITHIN 5 minutes FROM s)`.

    Aggregates `attr` over events of `event_type` that satisfy `filter` (bare attributes
    in it are the aggregated event's), lie within `within` before the event bound to
    `anchor` (`anchor.ts - within <= e.ts`) and precede it in the query's order.
    """

    func: AggFunc
    event_type: str
    filter: Expr | None
    attr: str | None  # None for count
    within: Duration
    anchor: str
    pos: Pos = NOPOS
    type: str | None = None  # filled in by the checker


Expr = Literal | Attr | Unary | Binary | InList | Call | Aggregate | WindowAggregate


@dataclass(frozen=True)
class Duration:
    """A duration as written (`5 minutes`) and its value in milliseconds (None for raw ticks)."""

    amount: int
    unit: str  # "ms", "s", "min", "h", "d" or "ticks"
    pos: Pos = NOPOS

    UNIT_MS: ClassVar[dict[str, int]] = {
        "ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}

    def in_time_units(self, time_unit: str) -> int:
        """The duration in a stream's time unit ("ms", "s", "us", "ns" or "ticks")."""
        if self.unit == "ticks" or time_unit == "ticks":
            if self.unit != "ticks":
                raise ValueError("a stream timed in ticks takes durations in ticks")
            return self.amount
        nanos = self.amount * self.UNIT_MS[self.unit] * NANOS_PER_UNIT["ms"]
        if nanos % NANOS_PER_UNIT[time_unit]:
            raise ValueError(f"duration finer than the stream's time unit ({time_unit})")
        return nanos // NANOS_PER_UNIT[time_unit]


# ---------------------------------------------------------------- MATCH: regex


@dataclass(eq=False)
class RSym:
    """A predicate name from DEFINE."""

    name: str
    pos: Pos = NOPOS


@dataclass(eq=False)
class RAny:
    """`.`: any event."""

    pos: Pos = NOPOS


@dataclass(eq=False)
class REmpty:
    """The empty regex `()`."""

    pos: Pos = NOPOS


@dataclass(eq=False)
class RCat:
    items: list[Regex]
    pos: Pos = NOPOS


@dataclass(eq=False)
class RAlt:
    options: list[Regex]
    pos: Pos = NOPOS


@dataclass(eq=False)
class RRepeat:
    """`r*` (min 0, max None), `r+` (1, None), `r?` (0, 1)."""

    item: Regex
    min: int
    max: int | None
    pos: Pos = NOPOS


Regex = RSym | RAny | REmpty | RCat | RAlt | RRepeat


@dataclass(eq=False)
class Define:
    name: str
    condition: Expr
    pos: Pos = NOPOS


@dataclass(eq=False)
class EmitItem:
    name: str
    expr: Expr
    pos: Pos = NOPOS


@dataclass(eq=False)
class MatchQuery:
    pattern: Regex
    defines: list[Define]
    emit: list[EmitItem]
    pos: Pos = NOPOS


# ---------------------------------------------------------------- SEQ


class Strategy(StrEnum):
    SKIP_TILL_ANY_MATCH = "skip-till-any-match"
    SKIP_TILL_NEXT_MATCH = "skip-till-next-match"
    STRICT_CONTIGUITY = "strict-contiguity"


class Policy(StrEnum):
    EACH = "each"
    LAST = "last"
    FIRST = "first"


class StepKind(StrEnum):
    EVENT = "event"  # `T x`
    NEGATED = "negated"  # `NOT(T x)`
    KLEENE = "kleene"  # `KLEENE(T x)`, `T+ x`, with optional bounds


@dataclass(eq=False)
class Step:
    kind: StepKind
    event_type: str  # a value of the stream's type attribute, or "ANY" for any type
    var: str
    filter: Expr | None = None  # TESLA's `B b(v > 10)`: a condition on this event alone
    policy: Policy | None = None  # TESLA per-step selection; None = the query's strategy
    within: Duration | None = None  # TESLA `WITHIN w FROM anchor`
    anchor: str | None = None
    min: int = 1  # Kleene bounds
    max: int | None = None
    pos: Pos = NOPOS


@dataclass(eq=False)
class AndGroup:
    """`AND(T1 a, T2 b, ...)`: all of these, in any order, at this position."""

    steps: list[Step]
    pos: Pos = NOPOS


SeqItem = Step | AndGroup


@dataclass(eq=False)
class SeqQuery:
    """SEQ(...) patterns and TESLA rules, both normalised to steps in sequence order.

    A TESLA rule `C c, EACH B b WITHIN 8 min FROM c, LAST A a WITHIN 3 min FROM b` becomes
    steps [A a (LAST, 3 min from b), B b (EACH, 8 min from c), C c].
    """

    steps: list[SeqItem]
    where: Expr | None
    within: Duration | None
    strategy: Strategy
    order_by: Attr | None  # None: stream order (seq); else the time attribute (ORDER BY ts)
    emit: list[EmitItem]
    tesla: bool = False
    pos: Pos = NOPOS
    # ON TIMEOUT EMIT PARTIAL: a partial match whose window expires is reported too
    emit_timeouts: bool = False
    timeouts_pos: Pos = NOPOS

    @property
    def order_by_ts(self) -> bool:
        return self.order_by is not None


# ---------------------------------------------------------------- WINDOW


@dataclass(eq=False)
class SelectItem:
    expr: Expr  # an Aggregate, or an Attr (a GROUP BY attribute or the window attribute)
    alias: str | None
    pos: Pos = NOPOS


@dataclass(eq=False)
class TimeWindow:
    range: Duration
    slide: Duration
    attr: str | None  # WATTR; None = the stream's time attribute
    pos: Pos = NOPOS


@dataclass(eq=False)
class RowWindow:
    rows: int
    slide: int
    pos: Pos = NOPOS


@dataclass(eq=False)
class WindowQuery:
    items: list[SelectItem]
    stream: str
    window: TimeWindow | RowWindow
    where: Expr | None
    group_by: list[Attr]
    pos: Pos = NOPOS


# ---------------------------------------------------------------- queries and files


@dataclass(eq=False)
class Query:
    name: str
    stream: str
    output: str  # output topic
    partition_by: list[Attr]
    body: MatchQuery | SeqQuery | WindowQuery
    pos: Pos = NOPOS

    @property
    def kind(self) -> str:
        return {MatchQuery: "match", SeqQuery: "seq", WindowQuery: "window"}[type(self.body)]


@dataclass(eq=False)
class QueryFile:
    path: str
    queries: list[Query] = field(default_factory=list)


def children(node) -> list:
    """The direct child nodes of an AST node (expressions, regexes, steps, items)."""
    out = []
    for value in vars(node).values():
        if isinstance(value, list):
            out.extend(v for v in value if hasattr(v, "pos"))
        elif hasattr(value, "pos") and not isinstance(value, (Pos, Duration)):
            out.append(value)
    return out


def walk(node):
    """Every node under `node`, `node` first, in source order."""
    yield node
    for child in children(node):
        yield from walk(child)
