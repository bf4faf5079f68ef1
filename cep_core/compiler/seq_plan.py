"""Analysis of a checked SEQ query, shared by the sequence kernels (CDP, AIP).

`SeqPlan(checked)` normalises a `SeqQuery` (PATTERN SEQ or a TESLA rule, whose steps the
parser already put in time order) into what a kernel generator needs, following
docs/semantics.md (SEQ) and the reference interpreter (`cep_core.reference.seq`):

- `items`: the positive positions in step order (a plain step, a Kleene step or an AND
  group) and `negations` with their neighbouring positive items (None at an end);
- `variables`: every variable with a dense index (positive ones in step order first, which
  is also the order of the composite event's `events`);
- `conjuncts`: the top-level AND operands of WHERE with the variables they read, split into
  conditions over positive variables, per-negation cancel conditions and constant ones;
- the binding schedule used when matches are built back from the terminator (items
  last to first, AND members in written order): which conjunct is checked at which item or
  member (`conjuncts_at`), which ones filter single Kleene elements (`element_conjuncts`);
- `channels`: the event types whose events a kernel keeps (positive and negated steps,
  window aggregates; "ANY" for all events);
- windows in the stream's time unit: `window` (WITHIN), per-step `WITHIN w FROM y`, window
  aggregates, and `horizon`, how far back from the oldest time still in use events can
  matter (None: no bound; everything is kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from cep_core import ast
from cep_core.checked import CheckedQuery


class VarKind(StrEnum):
    SINGLE = "single"
    KLEENE = "kleene"
    NEGATED = "negated"


class ItemKind(StrEnum):
    SINGLE = "single"  # one step
    KLEENE = "kleene"  # a Kleene step
    AND = "and"  # an AND group of steps


@dataclass(eq=False)
class Var:
    name: str
    index: int  # dense: positive variables in step order first, then negated ones
    step: ast.Step
    kind: VarKind
    item: int | None  # the positive item it belongs to (None for a negated variable)
    channel: int  # index into SeqPlan.channels


@dataclass(eq=False)
class Item:
    """A positive position: one step, a Kleene step or an AND group."""

    index: int
    kind: ItemKind
    steps: list[ast.Step]

    @property
    def step(self) -> ast.Step:
        return self.steps[0]

    @property
    def vars(self) -> list[str]:
        return [s.var for s in self.steps]


# Deliberately like cep_core/reference/seq.py's _Kind and _At (ItemKind too): the reference
# interpreter keeps its own vocabulary, as it keeps its own analysis
class NegationAt(StrEnum):
    """Where a negation stands among the positive items."""

    START = "start"
    BETWEEN = "between"
    END = "end"


@dataclass(eq=False)
class Negation:
    index: int
    step: ast.Step
    before: int | None  # the positive item before it (None: at the start)
    after: int | None  # the positive item after it (None: at the end)
    conjuncts: list[Conjunct] = field(default_factory=list)  # cancel conditions

    @property
    def where(self) -> NegationAt:
        if self.before is None:
            return NegationAt.START
        if self.after is None:
            return NegationAt.END
        return NegationAt.BETWEEN


@dataclass(eq=False)
class Conjunct:
    """One top-level AND operand of WHERE."""

    index: int
    expr: ast.Expr
    vars: frozenset[str]  # every variable it mentions (window aggregate anchors included)
    elementwise: frozenset[str]  # Kleene variables read outside an aggregate (per element)
    aggregated: frozenset[str]  # variables read inside an aggregate


@dataclass(eq=False)
class WindowAggregateUse:
    node: ast.WindowAggregate
    within: int  # in time units
    channel: int


def split_and(expr: ast.Expr) -> list[ast.Expr]:
    if isinstance(expr, ast.Binary) and expr.op is ast.BinaryOp.AND:
        return split_and(expr.left) + split_and(expr.right)
    return [expr]


# Deliberately like cep_core/reference/seq.py's _Mentions (and _Item, _Negation, _Conjunct,
# _split_and, _analyse): the oracle shares no analysis with the engines it checks
class Mentions(ast.Visitor):
    """The variables an expression mentions: all of them, the Kleene ones it reads per
    element, and those it reads inside an aggregate (`count(dup)`). The reference
    interpreter keeps its own copy (`cep_core.reference.seq._Mentions`) on purpose: the
    oracle shares no analysis with the engines it checks."""

    def __init__(self, kleene_vars: set[str]):
        self.kleene_vars = kleene_vars
        self.mentioned: set[str] = set()
        self.elementwise: set[str] = set()
        self.aggregated: set[str] = set()

    def generic_visit(self, node: ast.Node) -> None:
        for child in node.children():
            self.visit(child)

    def visit_Attr(self, node: ast.Attr) -> None:
        if node.var is not None:
            self.mentioned.add(node.var)
            if node.var in self.kleene_vars:
                self.elementwise.add(node.var)

    def visit_Aggregate(self, node: ast.Aggregate) -> None:
        if node.arg is not None and node.arg.var is not None:
            self.mentioned.add(node.arg.var)
            self.aggregated.add(node.arg.var)

    def visit_WindowAggregate(self, node: ast.WindowAggregate) -> None:
        self.mentioned.add(node.anchor)
        # bare attributes in its filter are the aggregated event's; `s.area` is bound
        self.generic_visit(node)


def analyse(expr: ast.Expr, index: int, kleene_vars: set[str]) -> Conjunct:
    found = Mentions(kleene_vars)
    found.visit(expr)
    return Conjunct(index, expr, frozenset(found.mentioned), frozenset(found.elementwise),
                    frozenset(found.aggregated))


class SeqPlan:
    def __init__(self, checked: CheckedQuery):
        self.checked = checked
        self.query = checked.query
        body = checked.query.body
        assert isinstance(body, ast.SeqQuery)  # a plan is made for SEQ queries only
        self.body = body
        self.schema = checked.schema
        self.by_ts = self.body.order_by_ts
        self.strategy = self.body.strategy
        self.window = checked.time_units(self.body.within) if self.body.within else None

        # ---- items and negations, in step order
        self.items: list[Item] = []
        self.negations: list[Negation] = []
        for entry in self.body.steps:
            if isinstance(entry, ast.AndGroup):
                self.items.append(Item(len(self.items), ItemKind.AND, list(entry.steps)))
            elif entry.kind is ast.StepKind.NEGATED:
                before = len(self.items) - 1 if self.items else None
                self.negations.append(Negation(len(self.negations), entry, before,
                                               len(self.items)))
            elif entry.kind is ast.StepKind.KLEENE:
                self.items.append(Item(len(self.items), ItemKind.KLEENE, [entry]))
            else:
                self.items.append(Item(len(self.items), ItemKind.SINGLE, [entry]))
        if not self.items:
            raise ValueError("a SEQ pattern needs a positive step")
        for neg in self.negations:
            if neg.after == len(self.items):
                neg.after = None
            if neg.where is not NegationAt.BETWEEN and self.window is None:
                raise ValueError(f"{neg.step.pos}: a leading or trailing NOT needs WITHIN")

        # ---- channels: the event types whose events are kept
        self.channels: list[str] = []
        self.variables: dict[str, Var] = {}
        for item in self.items:
            for step in item.steps:
                kind = VarKind.KLEENE if item.kind == ItemKind.KLEENE else VarKind.SINGLE
                self.variables[step.var] = Var(step.var, len(self.variables), step, kind,
                                               item.index, self.channel(step.event_type))
        self.positive = [v for v in self.variables.values()]
        for neg in self.negations:
            self.variables[neg.step.var] = Var(neg.step.var, len(self.variables), neg.step,
                                               VarKind.NEGATED, None,
                                               self.channel(neg.step.event_type))
        self.kleene_vars = {v.name for v in self.positive if v.kind == VarKind.KLEENE}
        self.negated = {neg.step.var: neg for neg in self.negations}

        # ---- WHERE
        self.conjuncts: list[Conjunct] = []  # over positive variables, with variables
        self.constant_conjuncts: list[Conjunct] = []  # mention no variable
        where = split_and(self.body.where) if self.body.where is not None else []
        for number, expr in enumerate(where):
            c = analyse(expr, number, self.kleene_vars)
            negs = [v for v in c.vars if v in self.negated]
            if len(negs) > 1:
                raise ValueError("a WHERE condition may mention one negated variable only")
            if negs:
                self.negated[negs[0]].conjuncts.append(c)
            elif not c.vars:
                self.constant_conjuncts.append(c)
            else:
                self.conjuncts.append(c)

        # ---- window aggregates (WHERE, EMIT, filters): their types need channels
        self.window_aggregates: dict[int, WindowAggregateUse] = {}
        exprs = [self.body.where, *(e.expr for e in self.body.emit),
                 *(s.filter for s in self.all_steps())]
        for root in exprs:
            if root is None:
                continue
            for node in root.find_all(ast.WindowAggregate):
                self.window_aggregates[id(node)] = WindowAggregateUse(
                    node, checked.time_units(node.within), self.channel(node.event_type))

        for step in self.all_steps():
            if step.anchor is not None:
                anchor = self.variables.get(step.anchor)
                step_item = self.variables[step.var].item  # None for a negated step
                if anchor is None or anchor.kind != VarKind.SINGLE or anchor.item is None \
                        or step_item is None or anchor.item <= step_item:
                    raise ValueError(f"{step.pos}: WITHIN ... FROM {step.anchor}: the anchor "
                                     "must be a later positive step")
        self.uses_runs = self.strategy is not ast.Strategy.SKIP_TILL_ANY_MATCH
        self.horizon = self._horizon()

    # ------------------------------------------------------------ helpers

    def channel(self, event_type: str) -> int:
        name = ast.ANY_TYPE if ast.is_any_type(event_type) else event_type
        if name not in self.channels:
            self.channels.append(name)
        return self.channels.index(name)

    def all_steps(self) -> list[ast.Step]:
        return [s for item in self.items for s in item.steps] + \
            [n.step for n in self.negations]

    def step_within(self, step: ast.Step) -> int | None:
        return None if step.within is None else self.checked.time_units(step.within)

    def bound_after(self, i: int) -> frozenset[str]:
        """Variables of positive items i..last (bound once item i is, building back)."""
        return frozenset(v for item in self.items[i:] for v in item.vars)

    def newly_bound(self, before: frozenset[str], after: frozenset[str]) -> list[Conjunct]:
        """Conjuncts checked when the variables in `after - before` get bound."""
        return [c for c in self.conjuncts if c.vars <= after and not c.vars <= before]

    def conjuncts_at(self, i: int, member: int = 0) -> list[Conjunct]:
        """Conjuncts checked when item i (member `member` of an AND group) is bound."""
        item = self.items[i]
        before = self.bound_after(i + 1) | frozenset(item.vars[:member])
        after = before | {item.vars[member]}
        return self.newly_bound(before, after)

    def element_conjuncts(self, i: int) -> list[Conjunct]:
        """Conjuncts that filter each element of Kleene item i on its own (with the later
        items bound): x read element by element and not aggregated."""
        x = self.items[i].step.var
        before = self.bound_after(i + 1)
        return [c for c in self.conjuncts
                if x in c.elementwise and x not in c.aggregated and c.vars - {x} <= before]

    def subset_conjuncts(self, i: int) -> list[Conjunct]:
        """Conjuncts checked on a whole Kleene subset (those not already per element)."""
        per_element = set(map(id, self.element_conjuncts(i)))
        return [c for c in self.conjuncts_at(i) if id(c) not in per_element]

    # ------------------------------------------------------------ memory

    def _horizon(self) -> int | None:
        """As the reference's: the largest span of a match (WITHIN, or the chain of TESLA
        windows back from the terminator) plus the longest window aggregate."""
        span = self.window
        chain = self._chain_span()
        if chain is not None:
            span = chain if span is None else min(span, chain)
        if span is None:
            return None
        extra = max((w.within for w in self.window_aggregates.values()), default=0)
        return span + extra

    def _chain_span(self) -> int | None:
        distances = self.chain_distances()
        return None if distances is None else max(distances.values())

    def chain_distances(self) -> dict[str, int] | None:
        """TESLA: each positive variable's largest possible distance (in time) to the
        terminator, when every step is chained to it by `WITHIN w FROM y`; else None."""
        last = self.items[-1]
        if last.kind != ItemKind.SINGLE:
            return None
        steps = {s.var: s for item in self.items for s in item.steps}
        dist = {last.step.var: 0}

        def distance(var: str, depth: int = 0) -> int | None:
            if var in dist:
                return dist[var]
            step = steps[var]
            if step.anchor is None or step.within is None or depth > len(steps):
                return None
            base = distance(step.anchor, depth + 1)
            if base is None:
                return None
            dist[var] = base + self.checked.time_units(step.within)
            return dist[var]

        found = {v: distance(v) for v in steps}
        known = {v: d for v, d in found.items() if d is not None}
        return known if len(known) == len(found) else None
