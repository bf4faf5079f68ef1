"""Typed AST of the query language.

Every node carries a `Pos` (file, line, column) so checks can point at the spot.
The parser (`cep_core.parser`) builds these nodes; the checker
(`cep_core.checker`) validates them against stream schemas and records their types in its
result (`CheckedQuery.types`), never in the tree; interpreters and compilers work from the
checked query only, never from text.

Every node class says which of its fields hold child nodes (`child_fields`, as sqlglot's
`arg_types` does); `children()`, `walk()` and `find_all()` follow that declaration, and each
node gets its `parent` when the node holding it is built.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

from cep_core.schema import NANOS_PER_UNIT, TimeUnit


@dataclass(frozen=True)
class Pos:
    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


NOPOS = Pos("<none>", 0, 0)

N = TypeVar("N", bound="Node")


class Node:
    """The base of every AST node.

    `child_fields` names the fields that hold child nodes (a node, a list of nodes, or None);
    every other field is a value. `parent` is the node whose child field holds this one
    (None for a root): set when that node is built, and by `set` when a child is replaced.
    A node is in one tree only: place a `copy()` where the same subtree is needed twice.
    """

    child_fields: ClassVar[tuple[str, ...]] = ()
    parent: Node | None = None

    def __post_init__(self) -> None:
        for child in self.children():
            child.parent = self

    def children(self) -> list[Node]:
        """The direct child nodes, in the order of `child_fields` (source order)."""
        out = []
        for name in self.child_fields:
            value = getattr(self, name)
            if isinstance(value, list):
                out.extend(value)
            elif value is not None:
                out.append(value)
        return out

    def walk(self) -> Iterator[Node]:
        """Every node of this subtree, this one first, in source order (depth first)."""
        stack: list[Node] = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children()))

    def find_all(self, *types: type[N]) -> Iterator[N]:
        """The nodes of this subtree that are instances of `types`, in walk order."""
        return (node for node in self.walk() if isinstance(node, types))

    def find(self, *types: type[N]) -> N | None:
        return next(self.find_all(*types), None)

    def set(self, name: str, value: Node | Sequence[Node] | None) -> None:
        """Replace child field `name` (a node, a list of nodes or None), keeping parent links."""
        if name not in self.child_fields:
            raise AttributeError(f"{type(self).__name__}.{name} is not a child field")
        setattr(self, name, value)
        for child in [value] if value is None or isinstance(value, Node) else value:
            if child is not None:
                child.parent = self

    def copy(self: N) -> N:
        """A deep copy of this subtree, without a parent (it gets one where it is placed)."""
        clone = copy.deepcopy(self, {id(self.parent): None})
        clone.parent = None
        return clone

    def root(self) -> Node:
        node = self
        while node.parent is not None:
            node = node.parent
        return node


def node_classes(base: type[Node] | None = None) -> list[type[Node]]:
    """Every concrete node class below `base` (default: all), found by introspection."""
    found, stack = [], [base or Node]
    while stack:
        cls = stack.pop()
        subclasses = cls.__subclasses__()
        if not subclasses and cls not in (Node, Expression, RegexNode):
            found.append(cls)
        stack.extend(subclasses)
    return sorted(found, key=lambda c: (c.__module__, c.__name__))


class Visitor:
    """The base of every AST walker: `visit(node, *args)` calls `visit_<NodeClass>(node,
    *args)` and returns its result.

    Handlers are plain methods, so a walker that refines another (the MATCH compiler's
    literals, the WINDOW compiler's AND/OR) overrides just those; `handles()` says which node
    classes a walker has handlers for (the test that every walker covers every node class
    reads it); a `visit_` method that names no node class fails when its class is defined.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        known = {node.__name__ for node in node_classes()}
        for name in vars(cls):
            if name.startswith("visit_") and name[len("visit_"):] not in known:
                raise TypeError(f"{cls.__name__}.{name}: no node class "
                                f"{name[len('visit_'):]}")

    def visit(self, node: Node, *args: Any) -> Any:  # what the walker's handler gives
        handler = getattr(self, "visit_" + type(node).__name__, None)
        if handler is None:
            return self.generic_visit(node, *args)
        return handler(node, *args)

    def generic_visit(self, node: Node, *args: Any) -> Any:
        """What a node without a handler gets: an error, unless a walker that only cares about
        some classes overrides it (to visit the children, say)."""
        raise TypeError(f"{type(self).__name__} has no handler for {type(node).__name__}")

    @classmethod
    def handles(cls) -> set[type[Node]]:
        return {node for node in node_classes() if hasattr(cls, "visit_" + node.__name__)}


class Expression(Node):
    """The base of expression nodes (every walker of expressions handles each subclass)."""

    pos: Pos  # (each subclass's field)


class RegexNode(Node):
    """The base of MATCH pattern nodes."""


# ---------------------------------------------------------------- expressions


@dataclass(eq=False)
class Literal(Expression):
    """A constant. A duration written in an expression (`Delta(ts) <= 5 minutes`) keeps
    `duration`; the checker sets `value` to it in the stream's time unit (an int), so engines
    see a plain number."""

    value: int | float | str | bool
    pos: Pos = NOPOS
    duration: Duration | None = None


@dataclass(eq=False)
class Attr(Expression):
    """`name` (an attribute of the current event) or `var.name` (of a bound variable)."""

    name: str
    var: str | None = None
    pos: Pos = NOPOS


# Deliberately like services/stream/status.py's enums in shape only: member declarations
class UnaryOp(StrEnum):
    NEG = "-"
    NOT = "NOT"


class BinaryOp(StrEnum):
    """An operator as the query writes it (`<>` is read as `!=`)."""

    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    MOD = "%"
    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    AND = "AND"
    OR = "OR"

    @property
    def is_comparison(self) -> bool:
        return self in _COMPARISONS

    @property
    def is_logical(self) -> bool:
        return self in (BinaryOp.AND, BinaryOp.OR)

    @property
    def is_arithmetic(self) -> bool:
        return not (self.is_comparison or self.is_logical)


_COMPARISONS = frozenset({BinaryOp.EQ, BinaryOp.NE, BinaryOp.LT, BinaryOp.LE, BinaryOp.GT,
                          BinaryOp.GE})


# Deliberately like Binary below (and the other node declarations): dataclass fields, each
# node its own
@dataclass(eq=False)
class Unary(Expression):
    child_fields = ("operand",)

    op: UnaryOp  # given as text ("-", "NOT"), kept as the enum
    operand: Expr
    pos: Pos = NOPOS

    def __post_init__(self) -> None:
        self.op = UnaryOp(self.op)
        super().__post_init__()


# Deliberately like Unary above: dataclass fields, each node its own
@dataclass(eq=False)
class Binary(Expression):
    """Arithmetic (+ - * / %), comparison (= != < <= > >=) or logic (AND, OR)."""

    child_fields = ("left", "right")

    op: BinaryOp  # given as text ("+", "AND"), kept as the enum
    left: Expr
    right: Expr
    pos: Pos = NOPOS

    def __post_init__(self) -> None:
        self.op = BinaryOp(self.op)
        super().__post_init__()


@dataclass(eq=False)
class InList(Expression):
    child_fields = ("operand", "options")

    operand: Expr
    options: list[Expr]
    negated: bool = False
    pos: Pos = NOPOS


class Builtin(StrEnum):
    """A function the language knows, named in upper case (a call names it in any case):
    the registered ones (`cep_core.functions`) and MATCH_RECOGNIZE's own."""

    ABS = "ABS"
    SQRT = "SQRT"
    FLOOR = "FLOOR"
    CEIL = "CEIL"
    LEAST = "LEAST"
    GREATEST = "GREATEST"
    LOWER = "LOWER"
    UPPER = "UPPER"
    LENGTH = "LENGTH"
    NOW = "NOW"
    RANDOM = "RANDOM"
    # MATCH_RECOGNIZE's (`x IS NULL` is read as IS_NULL(x))
    PREV = "PREV"
    NEXT = "NEXT"
    MATCH_ROWTIME = "MATCH_ROWTIME"
    MATCH_PROCTIME = "MATCH_PROCTIME"
    COALESCE = "COALESCE"
    IS_NULL = "IS_NULL"
    CLASSIFIER = "CLASSIFIER"
    MATCH_NUMBER = "MATCH_NUMBER"

    @classmethod
    def named(cls, name: str) -> Builtin | None:
        """The function a call names, whatever its case (None: no such function)."""
        try:
            return cls(name.upper())
        except ValueError:
            return None


@dataclass(eq=False)
class Call(Expression):
    """A call of a function: `name` as written (messages quote it), `func` the function it
    names (None: an unknown name, which the checker refuses)."""

    child_fields = ("args",)

    name: str
    args: list[Expr]
    pos: Pos = NOPOS
    func: Builtin | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.func = Builtin.named(self.name)
        super().__post_init__()


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
class Aggregate(Expression):
    """An aggregate.

    MATCH: over the partial match (`Count()`, `First(price)`): `arg` is an Attr without var,
    or None for `Count()`.
    SEQ: over a Kleene variable (`avg(dup.price)`, `count(dup)`): `arg` is Attr(var=...),
    or for `count(dup)` an Attr with name "" and var "dup".
    WINDOW: over the window's group (`max(price)`, `count(*)`: arg None).
    """

    child_fields = ("arg",)

    func: AggFunc
    arg: Attr | None
    pos: Pos = NOPOS
    offset: int = 0  # MATCH_RECOGNIZE's LAST(B.price, 1): the row that many before the last


@dataclass(eq=False)
class WindowAggregate(Expression):
    """TESLA's `avg(Temp(area = s.area).value WITHIN 5 minutes FROM s)`.

    Aggregates `attr` over events of `event_type` that satisfy `filter` (bare attributes
    in it are the aggregated event's), lie within `within` before the event bound to
    `anchor` (`anchor.ts - within <= e.ts`) and precede it in the query's order.
    """

    child_fields = ("filter",)

    func: AggFunc
    event_type: str
    filter: Expr | None
    attr: str | None  # None for count
    within: Duration
    anchor: str
    pos: Pos = NOPOS


Expr = Literal | Attr | Unary | Binary | InList | Call | Aggregate | WindowAggregate


class DurationUnit(StrEnum):
    """The unit of a duration in a query, by its canonical word (the parser reads the
    others: `minutes` is MIN)."""

    MS = "ms"
    S = "s"
    MIN = "min"
    H = "h"
    D = "d"
    TICKS = "ticks"


@dataclass(frozen=True)
class Duration:
    """A duration as written (`5 minutes`): its amount and unit (given as text or the enum,
    kept as the enum)."""

    amount: int
    unit: DurationUnit
    pos: Pos = NOPOS

    UNIT_MS: ClassVar[dict[DurationUnit, int]] = {
        DurationUnit.MS: 1, DurationUnit.S: 1000, DurationUnit.MIN: 60_000,
        DurationUnit.H: 3_600_000, DurationUnit.D: 86_400_000}

    def __post_init__(self) -> None:
        object.__setattr__(self, "unit", DurationUnit(self.unit))

    def in_time_units(self, time_unit: TimeUnit) -> int:
        """The duration in a stream's time unit."""
        if self.unit is DurationUnit.TICKS or time_unit == TimeUnit.TICKS:
            if self.unit is not DurationUnit.TICKS:
                raise ValueError("a stream timed in ticks takes durations in ticks")
            return self.amount
        nanos = self.amount * self.UNIT_MS[self.unit] * NANOS_PER_UNIT[TimeUnit.MS]
        if nanos % NANOS_PER_UNIT[time_unit]:
            raise ValueError(f"duration finer than the stream's time unit ({time_unit})")
        return nanos // NANOS_PER_UNIT[time_unit]


# ---------------------------------------------------------------- MATCH: regex


@dataclass(eq=False)
class RSym(RegexNode):
    """A predicate name from DEFINE."""

    name: str
    pos: Pos = NOPOS


@dataclass(eq=False)
class RAny(RegexNode):
    """`.`: any event."""

    pos: Pos = NOPOS


@dataclass(eq=False)
class REmpty(RegexNode):
    """The empty regex `()`."""

    pos: Pos = NOPOS


@dataclass(eq=False)
class RCat(RegexNode):
    child_fields = ("items",)

    items: list[Regex]
    pos: Pos = NOPOS


@dataclass(eq=False)
class RAlt(RegexNode):
    child_fields = ("options",)

    options: list[Regex]
    pos: Pos = NOPOS


@dataclass(eq=False)
class RRepeat(RegexNode):
    """`r*` (min 0, max None), `r+` (1, None), `r?` (0, 1); MATCH_RECOGNIZE also writes
    `r{n}`, `r{n,}`, `r{n,m}` and their reluctant forms (`r+?`: `reluctant`)."""

    child_fields = ("item",)

    item: Regex
    min: int
    max: int | None
    pos: Pos = NOPOS
    reluctant: bool = False


Regex = RSym | RAny | REmpty | RCat | RAlt | RRepeat


@dataclass(eq=False)
class Define(Node):
    child_fields = ("condition",)

    name: str
    condition: Expr
    pos: Pos = NOPOS


@dataclass(eq=False)
class EmitItem(Node):
    child_fields = ("expr",)

    name: str
    expr: Expr
    pos: Pos = NOPOS


@dataclass(eq=False)
class MatchQuery(Node):
    child_fields = ("pattern", "defines", "emit")

    pattern: Regex
    defines: list[Define]
    emit: list[EmitItem]
    pos: Pos = NOPOS


# ---------------------------------------------------------------- SEQ


# Deliberately like cep_core/control_ops.py's and cep_core/reference/seq.py's enums in shape
# only: member declarations
class Strategy(StrEnum):
    SKIP_TILL_ANY_MATCH = "skip-till-any-match"
    SKIP_TILL_NEXT_MATCH = "skip-till-next-match"
    STRICT_CONTIGUITY = "strict-contiguity"


class Policy(StrEnum):
    EACH = "each"
    LAST = "last"
    FIRST = "first"


ANY_TYPE = "ANY"  # the event type of `ANY x`: every event, whatever its type


def is_any_type(event_type: str) -> bool:
    """Whether a step's event type is `ANY`, written in any case."""
    return event_type.upper() == ANY_TYPE


class StepKind(StrEnum):
    EVENT = "event"  # `T x`
    NEGATED = "negated"  # `NOT(T x)`
    KLEENE = "kleene"  # `KLEENE(T x)`, `T+ x`, with optional bounds


@dataclass(eq=False)
class Step(Node):
    child_fields = ("filter",)

    kind: StepKind
    event_type: str  # a value of the stream's type attribute, or ANY_TYPE (is_any_type)
    var: str
    filter: Expr | None = None  # TESLA's `B b(v > 10)`: a condition on this event alone
    policy: Policy | None = None  # TESLA per-step selection; None = the query's strategy
    within: Duration | None = None  # TESLA `WITHIN w FROM anchor`
    anchor: str | None = None
    min: int = 1  # Kleene bounds
    max: int | None = None
    pos: Pos = NOPOS


@dataclass(eq=False)
class AndGroup(Node):
    """`AND(T1 a, T2 b, ...)`: all of these, in any order, at this position."""

    child_fields = ("steps",)

    steps: list[Step]
    pos: Pos = NOPOS


SeqItem = Step | AndGroup


@dataclass(eq=False)
class SeqQuery(Node):
    """SEQ(...) patterns and TESLA rules, both normalised to steps in sequence order.

    A TESLA rule `C c, EACH B b WITHIN 8 min FROM c, LAST A a WITHIN 3 min FROM b` becomes
    steps [A a (LAST, 3 min from b), B b (EACH, 8 min from c), C c].
    """

    child_fields = ("steps", "where", "order_by", "emit")

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
class SelectItem(Node):
    child_fields = ("expr",)

    expr: Expr  # an Aggregate, or an Attr (a GROUP BY attribute or the window attribute)
    alias: str | None
    pos: Pos = NOPOS


@dataclass(eq=False)
class TimeWindow(Node):
    range: Duration
    slide: Duration
    attr: str | None  # WATTR; None = the stream's time attribute
    pos: Pos = NOPOS


@dataclass(eq=False)
class RowWindow(Node):
    rows: int
    slide: int
    pos: Pos = NOPOS


@dataclass(eq=False)
class WindowQuery(Node):
    child_fields = ("items", "window", "where", "group_by")

    items: list[SelectItem]
    stream: str
    window: TimeWindow | RowWindow
    where: Expr | None
    group_by: list[Attr]
    pos: Pos = NOPOS


# ---------------------------------------------------------------- MATCH_RECOGNIZE (SQL)


class SkipTo(StrEnum):
    """AFTER MATCH SKIP ..."""

    PAST_LAST_ROW = "past last row"
    NEXT_ROW = "to next row"
    FIRST = "to first"  # TO FIRST var
    LAST = "to last"  # TO LAST var


@dataclass(eq=False)
class RecognizeQuery(Node):
    """`SELECT ... FROM stream MATCH_RECOGNIZE (...)`, answered as Flink does
    (docs/semantics.md, MATCH_RECOGNIZE). Its PARTITION BY is the query's `partition_by`.

    `select` is None for `SELECT *`; `pattern` is RSym, RRepeat(RSym) and RCat of those
    (the checker refuses what Flink refuses); a MEASURES item is an `EmitItem`.
    `ORDER BY ts, price DESC`: `order_by` is ts, `then_by` [price] and `then_desc` [True]
    (rows of one time in that order, as Flink sorts them).
    """

    child_fields = ("select", "order_by", "then_by", "measures", "pattern", "defines")

    select: list[Attr] | None
    order_by: Attr
    measures: list[EmitItem]
    skip: SkipTo
    skip_var: str | None
    pattern: Regex
    within: Duration | None
    defines: list[Define]
    alias: str | None = None
    pos: Pos = NOPOS
    all_rows_pos: Pos | None = None  # where ALL ROWS PER MATCH was written (refused)
    then_by: list[Attr] = field(default_factory=list)  # ORDER BY's columns after the time
    then_desc: list[bool] = field(default_factory=list)  # each of then_by: DESC
    order_desc_pos: Pos | None = None  # where `ORDER BY ts DESC` was written (refused)


# ---------------------------------------------------------------- queries and files


class QueryKind(StrEnum):
    MATCH = "match"
    SEQ = "seq"
    WINDOW = "window"
    RECOGNIZE = "recognize"  # SQL's MATCH_RECOGNIZE


_KINDS = {MatchQuery: QueryKind.MATCH, SeqQuery: QueryKind.SEQ, WindowQuery: QueryKind.WINDOW,
          RecognizeQuery: QueryKind.RECOGNIZE}


@dataclass(eq=False)
class Query(Node):
    child_fields = ("partition_by", "body")

    name: str
    stream: str
    output: str  # output topic
    partition_by: list[Attr]
    body: MatchQuery | SeqQuery | WindowQuery | RecognizeQuery
    pos: Pos = NOPOS

    @property
    def kind(self) -> QueryKind:
        return _KINDS[type(self.body)]


@dataclass(eq=False)
class QueryFile(Node):
    child_fields = ("queries",)

    path: str
    queries: list[Query] = field(default_factory=list)
