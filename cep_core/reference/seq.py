"""Reference interpreter for SEQ queries: `PATTERN SEQ(...)` and TESLA `DETECT` rules.

The oracle: plain Python that follows the SEQ part of docs/semantics.md line by line.
Clarity comes before speed; the only optimisation is that each partition's event buffer is
pruned by the query's time horizon.

How it works, per partition (PARTITION BY value; the whole stream when there is none):

- Every event of the partition is kept in `events` (pruned by the horizon, see `_horizon`).
- skip-till-any-match and TESLA's EACH / LAST / FIRST (`_matches_ending_at`): on each event
  `e`, every match whose positive event with the largest seq is `e` is enumerated by
  backtracking over the positive items from the last to the first ("resolved backwards from
  the terminator"). A WHERE conjunct is checked as soon as all its variables are bound.
- skip-till-next-match and strict-contiguity (`_advance_runs`): SASE-style runs, one match
  at most per run, exactly as the decisions file describes them.
- ON TIMEOUT EMIT PARTIAL (runs only): a run whose window the partition's event time
  (its events, punctuations, flush) passes leaves as a timed-out partial match
  (`_time_out`).
- Both hand their matches to `_finalize`, which applies the negations: a match is dropped if
  a cancelling event lies in a NOT's region, and waits (`pending`) while a future event could
  still fall into such a region (a trailing NOT; also equal timestamps under ORDER BY ts).

Composite event: {"query", "key", "seq": max positive seq, "start_seq": min positive seq,
"events": {var: event.to_json(), or a list of them for a Kleene variable, in step order,
positive variables only}, **EMIT fields}.

Choices the decisions file leaves open are marked "Decision:" below.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeAlias

from cep_core import ast
from cep_core.checked import CheckedQuery
from cep_core.composite import partition_key
from cep_core.events import Event
from cep_core.reference.expr import Env, evaluate, fold, holds

BACKWARDS_TIME = "event time goes backwards"

# variable -> its event; a Kleene variable -> its elements, in order
Bindings: TypeAlias = dict[str, Event | list[Event]]

# ---------------------------------------------------------------- the compiled pattern


# Deliberately like cep_core/compiler/seq_plan.py's ItemKind and NegationAt (and, in shape,
# every enum): the oracle keeps its own vocabulary, as it keeps its own analysis
class _Kind(StrEnum):
    """A positive item: one step, a Kleene step, or an AND group (the oracle's own)."""

    SINGLE = "single"
    KLEENE = "kleene"
    AND = "and"


class _At(StrEnum):
    """Where a negation stands among the positive items (the oracle's own)."""

    START = "start"
    BETWEEN = "between"
    END = "end"


@dataclass(eq=False)
class _Item:
    """A positive position of the pattern: one step, a Kleene step, or an AND group."""

    kind: _Kind
    steps: list[ast.Step]

    @property
    def step(self) -> ast.Step:
        return self.steps[0]


@dataclass(eq=False)
class _Negation:
    """`NOT(T x)` with the indexes of its neighbouring positive items (None at an end)."""

    step: ast.Step
    before: int | None  # the positive item before it
    after: int | None  # the positive item after it

    @property
    def where(self) -> _At:
        if self.before is None:
            return _At.START
        if self.after is None:
            return _At.END
        return _At.BETWEEN


@dataclass(eq=False)
class _Conjunct:
    """One top-level AND operand of WHERE, with the variables it mentions."""

    expr: ast.Expr
    vars: frozenset[str]  # every variable it mentions
    elementwise: frozenset[str]  # Kleene variables read outside an aggregate (per element)
    aggregated: frozenset[str]  # variables read inside an aggregate (`count(dup)`)


def _split_and(expr: ast.Expr) -> list[ast.Expr]:
    if isinstance(expr, ast.Binary) and expr.op is ast.BinaryOp.AND:
        return _split_and(expr.left) + _split_and(expr.right)
    return [expr]


# Deliberately like cep_core/compiler/seq_plan.py's Mentions (and Item, Negation, Conjunct,
# split_and, analyse): the oracle shares no analysis with the engines it checks
class _Mentions(ast.Visitor):
    """The variables an expression mentions: all of them, the Kleene ones it reads per
    element, and those it reads inside an aggregate (`count(dup)`). The same analysis as the
    compiler's `seq_plan.Mentions`, kept apart on purpose: the oracle shares no analysis with
    the engines it checks."""

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


def _analyse(expr: ast.Expr, kleene_vars: set[str]) -> _Conjunct:
    found = _Mentions(kleene_vars)
    found.visit(expr)
    return _Conjunct(expr, frozenset(found.mentioned), frozenset(found.elementwise),
                     frozenset(found.aggregated))


# ---------------------------------------------------------------- expression environment


class _SeqEnv(Env):
    """Variables resolve to bound events; a Kleene variable outside an aggregate resolves to
    the element given in `elements`; a bare attribute is `subject`'s (the event a step filter
    or a window aggregate's filter is looking at)."""

    def __init__(self, interp: SeqInterpreter, part: _Partition, bindings: Bindings,
                 elements: dict[str, Event] | None = None, subject: Event | None = None):
        self.interp = interp
        self.part = part
        self.bindings = bindings
        self.elements = elements or {}
        self.subject = subject

    def attr(self, node: ast.Attr) -> Any:
        if node.var is None:
            if self.subject is None:
                raise TypeError(f"bare attribute '{node.name}' outside a step filter")
            return self.subject.attrs[node.name]
        if node.var in self.elements:
            return self.elements[node.var].attrs[node.name]
        bound = self.bindings[node.var]
        if isinstance(bound, list):
            raise TypeError(f"Kleene variable '{node.var}' read outside an aggregate")
        return bound.attrs[node.name]

    def aggregate(self, node: ast.Aggregate) -> Any:
        if node.arg is None or node.arg.var is None:
            raise TypeError("a SEQ aggregate is over a variable, as in count(dup)")
        bound = self.bindings[node.arg.var]
        members = bound if isinstance(bound, list) else [bound]
        if node.arg.name == "":  # count(dup)
            return len(members)
        values = [m.attrs[node.arg.name] for m in members]
        if node.func is ast.AggFunc.DELTA:
            # Decision: delta(x.attr) over a Kleene variable is last minus first.
            if not values or values[0] is None or values[-1] is None:
                return None
            return values[-1] - values[0]
        return fold(node.func, values)

    def window_aggregate(self, node: ast.WindowAggregate) -> Any:
        anchor = self.bindings[node.anchor]
        if isinstance(anchor, list):
            raise TypeError(f"window aggregate anchored on Kleene variable '{node.anchor}'")
        low = anchor.ts - self.interp.checked.time_units(node.within)
        chosen = []
        for y in self.part.events:
            if not self.interp.precedes(y, anchor) or y.ts < low:
                continue
            if not self.interp.has_type(y, node.event_type):
                continue
            if node.filter is not None and not holds(
                    node.filter, _SeqEnv(self.interp, self.part, self.bindings,
                                         self.elements, subject=y)):
                continue
            chosen.append(y)
        if node.attr is None:  # count(Temp(...) WITHIN ...)
            return fold(node.func, chosen)
        return fold(node.func, [y.attrs[node.attr] for y in chosen])


# ---------------------------------------------------------------- per-partition state


# Deliberately like accel/fpga/plan.py Symbol and accel/fpga/resources.py Resources in shape only:
# dataclass fields
@dataclass(eq=False)
class _Pending:
    """A match waiting for event time to pass `decide_after` (trailing NOT and the like)."""

    bindings: Bindings
    decide_after: int
    first_ts: int


@dataclass(eq=False)
class _Run:
    """A partial match of skip-till-next-match / strict-contiguity.

    `pos` is the positive item being filled. `closed` holds the variables whose binding is
    final (a Kleene variable is closed when the run moves past it)."""

    bindings: Bindings
    closed: frozenset[str]
    pos: int
    first_ts: int


@dataclass(eq=False)
class _Partition:
    key: object
    events: list[Event] = field(default_factory=list)
    last_ts: int | None = None
    pending: list[_Pending] = field(default_factory=list)
    runs: list[_Run] = field(default_factory=list)


# ---------------------------------------------------------------- the interpreter


class SeqInterpreter:
    def __init__(self, checked: CheckedQuery):
        self.checked = checked
        self.query = checked.query
        body = checked.query.body
        if not isinstance(body, ast.SeqQuery):
            raise TypeError(f"query {checked.name} is not a SEQ query")
        self.body = body
        self.schema = checked.schema
        self.by_ts = self.body.order_by_ts
        self.window = checked.time_units(self.body.within) if self.body.within else None
        self.dead_letters: list[tuple[Event, str]] = []
        self._partitions: dict[object, _Partition] = {}
        self._punctuation: int | None = None

        # Positive items and negations, in step order.
        self.items: list[_Item] = []
        self.negations: list[_Negation] = []
        for item in self.body.steps:
            if isinstance(item, ast.AndGroup):
                for member in item.steps:
                    if member.kind is not ast.StepKind.EVENT:
                        raise ValueError(f"{member.pos}: AND groups hold plain steps only")
                    if member.policy is not None:
                        raise ValueError(f"{member.pos}: no EACH/LAST/FIRST inside AND")
                self.items.append(_Item(_Kind.AND, list(item.steps)))
            elif item.kind is ast.StepKind.NEGATED:
                before = len(self.items) - 1 if self.items else None
                self.negations.append(_Negation(item, before, len(self.items)))
            elif item.kind is ast.StepKind.KLEENE:
                if item.policy not in (None, ast.Policy.EACH):
                    raise ValueError(f"{item.pos}: LAST/FIRST on a Kleene step")
                if item.min < 1 or (item.max is not None and item.max < item.min):
                    raise ValueError(f"{item.pos}: Kleene bounds must be 1 <= m <= n")
                self.items.append(_Item(_Kind.KLEENE, [item]))
            else:
                self.items.append(_Item(_Kind.SINGLE, [item]))
        if not self.items:
            raise ValueError("a SEQ pattern needs a positive step")
        for neg in self.negations:
            if neg.after == len(self.items):
                neg.after = None  # trailing
            if neg.where is not _At.BETWEEN and self.window is None:
                raise ValueError(f"{neg.step.pos}: a leading or trailing NOT needs WITHIN")
        # WITHIN as the regions of leading and trailing NOTs read it (they need one)
        self.not_window: int = self.window if self.window is not None else 0

        self.steps = {s.var: s for item in self.items for s in item.steps}
        self.kleene_vars = {item.step.var for item in self.items if item.kind is _Kind.KLEENE}
        self.negated = {neg.step.var: neg for neg in self.negations}
        self.item_of = {s.var: i for i, item in enumerate(self.items) for s in item.steps}
        for s in self.steps.values():
            if s.anchor is not None and (s.anchor not in self.steps or
                                         self.item_of[s.anchor] <= self.item_of[s.var]):
                raise ValueError(f"{s.pos}: WITHIN ... FROM {s.anchor}: the anchor must be a "
                                 "later positive step")
        if self.schema.type_attribute is None:
            for s in [*self.steps.values(), *(n.step for n in self.negations)]:
                if not ast.is_any_type(s.event_type):
                    raise ValueError(f"{s.pos}: stream {self.schema.stream} has no type "
                                     "attribute; use ANY")

        # WHERE, split on top-level AND.
        self.conjuncts: list[_Conjunct] = []  # over positive variables only
        self.cancel_conjuncts: dict[str, list[_Conjunct]] = {v: [] for v in self.negated}
        for expr in (_split_and(self.body.where) if self.body.where is not None else []):
            c = _analyse(expr, self.kleene_vars)
            negs = [v for v in c.vars if v in self.negated]
            if len(negs) > 1:
                raise ValueError("a WHERE condition may mention one negated variable only")
            if negs:
                self.cancel_conjuncts[negs[0]].append(c)
            else:
                self.conjuncts.append(c)
        known = set(self.steps) | set(self.negated)
        for c in [*self.conjuncts, *itertools.chain(*self.cancel_conjuncts.values())]:
            if not c.vars <= known:
                raise ValueError(f"WHERE mentions unknown variables {sorted(c.vars - known)}")
        for emit in self.body.emit:
            c = _analyse(emit.expr, self.kleene_vars)
            if not c.vars <= known:
                raise ValueError(f"{emit.pos}: EMIT mentions unknown variables "
                                 f"{sorted(c.vars - known)}")
            if c.elementwise or c.vars & set(self.negated):
                raise ValueError(f"{item.pos}: EMIT reads positive variables, Kleene ones "
                                 "inside aggregates only")

        # Which procedure: backward resolution (any-match, EACH/LAST/FIRST) or runs.
        has_policy = any(s.policy is not None for s in self.steps.values())
        strategy = self.body.strategy
        if strategy is ast.Strategy.SKIP_TILL_ANY_MATCH or not has_policy:
            self.uses_runs = strategy is not ast.Strategy.SKIP_TILL_ANY_MATCH
        else:
            # Decision: a policy on every step before the terminator makes the strategy moot
            # (the terminator is the arriving event); mixing is not defined.
            last = len(self.items) - 1
            if any(s.policy is None for s in self.steps.values() if self.item_of[s.var] != last):
                raise ValueError("EACH/LAST/FIRST steps cannot be mixed with steps that "
                                 f"follow {strategy.value}")
            self.uses_runs = False
        self.horizon = self._horizon()

    # ------------------------------------------------------------ the Interpreter shape

    def process(self, event: Event) -> list[dict[str, Any]]:
        key = partition_key(self.query.partition_by, event)
        part = self._partition(key)
        if part.last_ts is not None and event.ts < part.last_ts:
            self.dead_letters.append((event, BACKWARDS_TIME))
            return []
        part.last_ts = event.ts
        out = self._release(part)  # matches whose deciding time this event passes
        out.extend(self._time_out(part))
        part.events.append(event)
        if self.uses_runs:
            found = self._advance_runs(part, event)
        else:
            found = self._matches_ending_at(part, event)
        for bindings in found:
            out.extend(self._finalize(part, bindings))
        self._prune(part)
        return out

    def punctuate(self, ts: int) -> list[dict[str, Any]]:
        if self._punctuation is None or ts > self._punctuation:
            self._punctuation = ts
        out: list[dict[str, Any]] = []
        for part in self._partitions.values():
            out.extend(self._release(part))
            out.extend(self._time_out(part))
        return out

    def flush(self) -> list[dict[str, Any]]:
        """End of input: event time reaches +infinity; every pending match is decided."""
        out: list[dict[str, Any]] = []
        for part in self._partitions.values():
            for p in part.pending:
                if not self._cancelled(part, p.bindings):
                    out.append(self._composite(part, p.bindings))
            part.pending = []
            if self.body.emit_timeouts:  # every run left is past its window now
                out.extend(self._timed_out_composite(part, run.bindings) for run in part.runs)
                part.runs = []
        return out

    # ------------------------------------------------------------ shared helpers

    def _partition(self, key: object) -> _Partition:
        hashable = tuple(key) if isinstance(key, list) else key
        if hashable not in self._partitions:
            self._partitions[hashable] = _Partition(key)
        return self._partitions[hashable]

    def _now(self, part: _Partition) -> int | None:
        """Event time of a partition: its last event's ts, or a later punctuation.
        Decision: events of *other* partitions do not advance it (partition isolation).
        Decision: an event behind a punctuation (but not behind its partition's last event)
        is accepted; matches already released are not revisited."""
        times = [t for t in (part.last_ts, self._punctuation) if t is not None]
        return max(times) if times else None

    def has_type(self, event: Event, event_type: str) -> bool:
        if ast.is_any_type(event_type):
            return True
        # (a step of a type other than ANY needs a type attribute: __init__)
        return event.attrs.get(self.schema.type_attribute) == event_type  # type: ignore[arg-type]

    def precedes(self, y: Event, x: Event) -> bool:
        """`y` comes before `x` in the query's order (window aggregates).
        Decision: under ORDER BY ts, strictly earlier event time (equal times are
        simultaneous, not before)."""
        return y.ts < x.ts if self.by_ts else y.seq < x.seq

    def _fits_step(self, part: _Partition, step: ast.Step, y: Event, bindings: Bindings) -> bool:
        """Type and the step's own filter (bare attributes are y's)."""
        if not self.has_type(y, step.event_type):
            return False
        if step.filter is None:
            return True
        env_bindings = {**bindings, step.var: y} if step.kind is not ast.StepKind.KLEENE \
            else bindings
        return holds(step.filter, _SeqEnv(self, part, env_bindings, {step.var: y}, subject=y))

    def _conjunct_holds(self, part: _Partition, c: _Conjunct, bindings: Bindings) -> bool:
        """A conjunct over bound variables; Kleene variables read outside an aggregate must
        satisfy it element by element (every combination of elements)."""
        kvars = sorted(c.elementwise)
        # (elementwise variables are Kleene ones, bound to lists)
        for combo in itertools.product(*(bindings[v] for v in kvars)):  # type: ignore[arg-type]
            if not holds(c.expr, _SeqEnv(self, part, bindings, dict(zip(kvars, combo)))):
                return False
        return True

    def _newly_bound_hold(self, part: _Partition, bindings: Bindings, before: set[str],
                          after: set[str]) -> bool:
        """The conjuncts whose variables are all bound in `after` but not in `before`."""
        return all(self._conjunct_holds(part, c, bindings) for c in self.conjuncts
                   if c.vars <= after and not c.vars <= before)

    def _element_ok(self, part: _Partition, step: ast.Step, y: Event, bindings: Bindings,
                    bound: set[str]) -> bool:
        """Can y be an element of Kleene variable step.var: type, filter, and the per-element
        conjuncts on it (no aggregate over it) whose other variables are bound."""
        if not self._fits_step(part, step, y, bindings):
            return False
        x = step.var
        trial = {**bindings, x: [y]}
        return all(self._conjunct_holds(part, c, trial) for c in self.conjuncts
                   if x in c.elementwise and x not in c.aggregated and c.vars - {x} <= bound)

    @staticmethod
    def _events_of(bindings: Bindings, vars_: Iterable[str]) -> list[Event]:
        out: list[Event] = []
        for v in vars_:
            if v in bindings:
                b = bindings[v]
                out.extend(b if isinstance(b, list) else [b])
        return out

    def _positive_events(self, bindings: Bindings) -> list[Event]:
        return self._events_of(bindings, self.steps)

    def _item_events(self, bindings: Bindings, i: int | None) -> list[Event]:
        assert i is not None  # a negation's neighbour on the side its place says it has
        return self._events_of(bindings, [s.var for s in self.items[i].steps])

    def _within_window(self, events: list[Event]) -> bool:
        if self.window is None or not events:
            return True
        return max(y.ts for y in events) - min(y.ts for y in events) <= self.window

    # ------------------------------------------------------------ skip-till-any-match

    def _matches_ending_at(self, part: _Partition, e: Event) -> list[Bindings]:
        """Every binding of the positive variables whose largest-seq event is `e`."""
        results: list[Bindings] = []
        self._bind(part, e, len(self.items) - 1, {}, results)
        return results

    def _bind(self, part: _Partition, e: Event, i: int, bindings: Bindings,
              results: list[Bindings]) -> None:
        """Bind positive items i, i-1, ..., 0 (items after i are bound in `bindings`)."""
        if i < 0:
            if any(y.seq == e.seq for y in self._positive_events(bindings)):
                results.append(dict(bindings))
            return
        item = self.items[i]
        choose = {_Kind.SINGLE: self._single_choices, _Kind.KLEENE: self._kleene_choices,
                  _Kind.AND: self._and_choices}[item.kind]
        for chosen in choose(part, e, i, bindings):
            merged = {**bindings, **chosen}
            if self._e_still_possible(e, merged, i):
                self._bind(part, e, i - 1, merged, results)

    def _e_still_possible(self, e: Event, bindings: Bindings, i: int) -> bool:
        """After binding items i..last: can `e` still be the largest-seq event?
        In stream order e must be in the last item; under ORDER BY ts every item after e's
        has e's time, so the earliest bound time must still equal e.ts."""
        bound = self._positive_events(bindings)
        if any(y.seq == e.seq for y in bound):
            return True
        if not self.by_ts:
            return False
        return min(y.ts for y in bound) == e.ts

    def _candidates(self, part: _Partition, e: Event, i: int, step: ast.Step,
                    bindings: Bindings) -> list[Event]:
        """Events (seen so far) that may fill `step` of item i: type, filter, not bound yet,
        order before item i+1, the step's WITHIN ... FROM, and the global window.
        Decision: LAST/FIRST choose among these, so "window" includes WITHIN W over the
        events bound so far."""
        bound = self._positive_events(bindings)
        bound_seqs = {y.seq for y in bound}
        later = self._item_events(bindings, i + 1) if i + 1 < len(self.items) else []
        limit = None
        if step.within is not None:  # (then it names its anchor, a single step)
            anchor: Event = bindings[step.anchor]  # type: ignore[index, assignment]
            limit = anchor.ts - self.checked.time_units(step.within)
        out = []
        for y in part.events:
            if y.seq > e.seq or y.seq in bound_seqs:
                continue
            if later and not self._ordered(y, later):
                continue
            if limit is not None and y.ts < limit:
                continue
            if not self._within_window(bound + [y]):
                continue
            if step.kind is ast.StepKind.KLEENE:
                if not self.has_type(y, step.event_type):
                    continue  # the filter is checked per element in _element_ok
            elif not self._fits_step(part, step, y, bindings):
                continue
            out.append(y)
        return out

    def _ordered(self, y: Event, later: list[Event]) -> bool:
        """y may precede every event of the next item: smaller seq (stream order) or not
        later in time (ORDER BY ts; equal times in either seq order)."""
        if self.by_ts:
            return y.ts <= min(z.ts for z in later)
        return y.seq < min(z.seq for z in later)

    def _bound_vars(self, i: int) -> set[str]:
        """Variables of positive items i..last (bound once item i is)."""
        return {s.var for item in self.items[i:] for s in item.steps}

    def _single_choices(self, part: _Partition, e: Event, i: int,
                        bindings: Bindings) -> Iterator[Bindings]:
        step = self.items[i].step
        before = self._bound_vars(i + 1)
        after = before | {step.var}
        cands = self._candidates(part, e, i, step, bindings)
        if not self.by_ts and i == len(self.items) - 1:
            cands = [y for y in cands if y.seq == e.seq]  # the last item holds the arriving event
        ok = [y for y in cands
              if self._newly_bound_hold(part, {**bindings, step.var: y}, before, after)]
        # Decision: a policy on the last positive step has no effect (it is the terminator).
        policy = step.policy if i < len(self.items) - 1 else None
        if policy is ast.Policy.LAST and ok:
            ok = [max(ok, key=lambda y: y.seq)]
        elif policy is ast.Policy.FIRST and ok:
            ok = [min(ok, key=lambda y: y.seq)]
        for y in ok:
            yield {step.var: y}

    def _kleene_choices(self, part: _Partition, e: Event, i: int,
                        bindings: Bindings) -> Iterator[Bindings]:
        """Every subset of the qualifying events, in order, with m..n elements."""
        step = self.items[i].step
        before = self._bound_vars(i + 1)
        after = before | {step.var}
        cands = [y for y in self._candidates(part, e, i, step, bindings)
                 if self._element_ok(part, step, y, bindings, before)]
        required: list[Event] = []
        if not self.by_ts and i == len(self.items) - 1:
            # the arriving event must be the last element
            if not any(y.seq == e.seq for y in cands):
                return
            cands = [y for y in cands if y.seq < e.seq]
            required = [e]
        low = max(step.min - len(required), 0)
        high = len(cands) if step.max is None else min(step.max - len(required), len(cands))
        bound = self._positive_events(bindings)
        for size in range(low, high + 1):
            for subset in itertools.combinations(cands, size):
                elements = list(subset) + required
                if not elements or not self._within_window(bound + elements):
                    continue
                if self.by_ts and i == len(self.items) - 1 and \
                        max(y.ts for y in elements) < e.ts:
                    continue  # the last item holds the match's latest time, e.ts

                trial = {**bindings, step.var: elements}
                if self._newly_bound_hold(part, trial, before, after):
                    yield {step.var: elements}

    def _and_choices(self, part: _Partition, e: Event, i: int,
                     bindings: Bindings) -> Iterator[Bindings]:
        """Every assignment of distinct events to the members of an AND group."""
        members = self.items[i].steps
        last_item = i == len(self.items) - 1
        if not self.by_ts and last_item and \
                not any(self._fits_step(part, m, e, bindings) for m in members):
            return  # the arriving event must be one of the members

        def assign(k: int, current: Bindings, bound_vars: set[str]) -> Iterator[Bindings]:
            if k == len(members):
                group = self._events_of(current, [m.var for m in members])
                if not self.by_ts and last_item and all(y.seq != e.seq for y in group):
                    return
                yield {m.var: current[m.var] for m in members}
                return
            member = members[k]
            after = bound_vars | {member.var}
            for y in self._candidates(part, e, i, member, current):
                trial = {**current, member.var: y}
                if self._newly_bound_hold(part, trial, bound_vars, after):
                    yield from assign(k + 1, trial, after)

        yield from assign(0, dict(bindings), self._bound_vars(i + 1))

    # ------------------------------------------------------------ skip-till-next-match and
    # ------------------------------------------------------------ strict-contiguity (runs)

    def _advance_runs(self, part: _Partition, e: Event) -> list[Bindings]:
        """Offer `e` to every run of the partition (oldest first), then let it start a run.

        skip-till-next-match: a run takes e if e can fill its current step, else ignores it.
        strict-contiguity: a run that does not take e dies.
        Either way a run dies when e lies beyond its window (e.ts - first.ts > W).
        Decision: runs take events in seq order also under ORDER BY ts (which then affects
        only the NOT regions and window aggregates)."""
        strict = self.body.strategy is ast.Strategy.STRICT_CONTIGUITY
        completed: list[Bindings] = []
        survivors: list[_Run] = []
        for run in part.runs:
            if self.window is not None and e.ts - run.first_ts > self.window:
                continue  # the window is exceeded: the run dies
            moved = self._take(part, run, e)
            if moved is None:
                if not strict:
                    survivors.append(run)  # e ignored
                continue
            if moved.pos == len(self.items):
                completed.append(moved.bindings)
            else:
                survivors.append(moved)
        started = self._enter(part, _Run({}, frozenset(), 0, e.ts), 0, e)
        if started is not None:
            if started.pos == len(self.items):
                completed.append(started.bindings)
            else:
                survivors.append(started)
        part.runs = survivors
        return completed

    def _take(self, part: _Partition, run: _Run, y: Event) -> _Run | None:
        """The run after taking y, or None if it does not take y."""
        item = self.items[run.pos]
        if item.kind is not _Kind.KLEENE:
            return self._enter(part, run, run.pos, y)
        x = item.step.var
        elements: list[Event] = run.bindings.get(x, [])  # type: ignore[assignment]  # Kleene
        # The next step's event ends the Kleene step (the next step wins) ...
        if len(elements) >= item.step.min and run.pos + 1 < len(self.items):
            closed = run.closed | {x}
            if self._newly_bound_hold(part, run.bindings, set(run.closed), set(closed)):
                moved = self._enter(part, _Run(run.bindings, closed, run.pos + 1,
                                               run.first_ts), run.pos + 1, y)
                if moved is not None:
                    return moved
        # ... otherwise the Kleene step takes every qualifying event, up to its maximum.
        # Decision: once at its maximum, it ignores further qualifying events (a
        # strict-contiguity run then dies).
        if item.step.max is None or len(elements) < item.step.max:
            return self._enter(part, run, run.pos, y)
        return None

    def _enter(self, part: _Partition, run: _Run, j: int, y: Event) -> _Run | None:
        """y fills (part of) item j of the run, or None if it cannot."""
        item = self.items[j]
        bindings, closed = run.bindings, set(run.closed)
        if item.kind is _Kind.KLEENE:
            step = item.step
            if not self._element_ok(part, step, y, bindings, closed):
                return None
            grown = {**bindings,  # (a Kleene variable's binding is a list)
                     step.var: bindings.get(step.var, []) + [y]}  # type: ignore[operator]
            moved = _Run(grown, run.closed, j, run.first_ts)
            # Decision: a Kleene step that is the last positive item completes the run as
            # soon as it has its minimum number of elements (and its conditions hold).
            if j == len(self.items) - 1 and \
                    len(grown[step.var]) >= step.min:  # type: ignore[arg-type]
                done = closed | {step.var}
                if self._newly_bound_hold(part, grown, closed, done):
                    return _Run(grown, frozenset(done), j + 1, run.first_ts)
            return moved
        if item.kind is _Kind.SINGLE:
            members = [item.step]
        else:
            # Decision: an AND group under runs is filled in arrival order; an event fills
            # the first still unfilled member (in written order) it qualifies for.
            members = [m for m in item.steps if m.var not in bindings]
        for member in members:
            if not self._fits_step(part, member, y, bindings):
                continue
            trial = {**bindings, member.var: y}
            after = closed | {member.var}
            if not self._newly_bound_hold(part, trial, closed, after):
                continue
            group_done = all(m.var in trial for m in item.steps)
            return _Run(trial, frozenset(after), j + 1 if group_done else j, run.first_ts)
        return None

    # ------------------------------------------------------------ negation and output

    def _finalize(self, part: _Partition, bindings: Bindings) -> list[dict[str, Any]]:
        """A match of the positive steps: drop it if a NOT cancels it, hold it while a
        future event could still cancel it, else release it."""
        # Every WHERE condition over positive variables holds (most were checked while
        # binding; this also covers conditions that mention no variable).
        if not all(self._conjunct_holds(part, c, bindings) for c in self.conjuncts):
            return []
        decide_after = self._decide_after(bindings)
        now = self._now(part)
        if decide_after is not None and not (now is not None and now > decide_after):
            first_ts = min(y.ts for y in self._positive_events(bindings))
            part.pending.append(_Pending(bindings, decide_after, first_ts))
            return []
        if self._cancelled(part, bindings):
            return []
        return [self._composite(part, bindings)]

    def _release(self, part: _Partition) -> list[dict[str, Any]]:
        """Pending matches whose deciding time the partition's event time has passed."""
        now = self._now(part)
        out: list[dict[str, Any]] = []
        waiting: list[_Pending] = []
        for p in part.pending:
            if now is not None and now > p.decide_after:
                if not self._cancelled(part, p.bindings):
                    out.append(self._composite(part, p.bindings))
            else:
                waiting.append(p)
        part.pending = waiting
        return out

    def _time_out(self, part: _Partition) -> list[dict[str, Any]]:
        """ON TIMEOUT EMIT PARTIAL: the runs whose window the partition's event time has
        passed (now > first.ts + W) leave, each reported as a timed-out partial match."""
        now, window = self._now(part), self.window
        if not self.body.emit_timeouts or now is None or window is None:  # (it needs WITHIN)
            return []
        expired = [run for run in part.runs if now > run.first_ts + window]
        part.runs = [run for run in part.runs if not now > run.first_ts + window]
        return [self._timed_out_composite(part, run.bindings) for run in expired]

    def _timed_out_composite(self, part: _Partition, bindings: Bindings) -> dict[str, Any]:
        """The variables bound so far (a Kleene variable: its elements so far), in step
        order, and "timed_out": true; no EMIT fields (they may read unbound variables)."""
        first_seq, last_seq, _, _ = self._span(bindings)
        events = {}
        for item in self.items:
            for s in item.steps:
                bound = bindings.get(s.var)
                if bound is None:
                    continue
                events[s.var] = [y.to_json() for y in bound] if isinstance(bound, list) \
                    else bound.to_json()
        return {"query": self.query.name, "key": part.key, "seq": last_seq,
                "start_seq": first_seq, "events": events, "timed_out": True}

    def _span(self, bindings: Bindings) -> tuple[int, int, int, int]:
        events = self._positive_events(bindings)
        return (min(y.seq for y in events), max(y.seq for y in events),
                min(y.ts for y in events), max(y.ts for y in events))

    def _decide_after(self, bindings: Bindings) -> int | None:
        """The event time after which no future event can fall into a NOT's region.
        Stream order: only a trailing NOT waits (until first.ts + W).
        Decision: under ORDER BY ts a later event may share the bound events' time, so a
        region ending at a bound time waits until time passes it (between: the next item's
        time; start: first.ts)."""
        _, _, first_ts, _ = self._span(bindings)
        times = []
        for neg in self.negations:
            if neg.where is _At.END:
                times.append(first_ts + self.not_window)
            elif self.by_ts and neg.where is _At.START:
                times.append(first_ts)
            elif self.by_ts:
                times.append(min(y.ts for y in self._item_events(bindings, neg.after)))
        return max(times) if times else None

    def _in_region(self, neg: _Negation, x: Event, bindings: Bindings) -> bool:
        first_seq, last_seq, first_ts, last_ts = self._span(bindings)
        if self.by_ts:
            if any(y.seq == x.seq for y in self._positive_events(bindings)):
                return False
            if neg.where is _At.START:
                return last_ts - self.not_window <= x.ts <= first_ts
            if neg.where is _At.END:
                return last_ts <= x.ts <= first_ts + self.not_window
            low = max(y.ts for y in self._item_events(bindings, neg.before))
            high = min(y.ts for y in self._item_events(bindings, neg.after))
            return low <= x.ts <= high
        if neg.where is _At.START:
            return x.seq < first_seq and x.ts >= last_ts - self.not_window
        if neg.where is _At.END:
            return x.seq > last_seq and x.ts <= first_ts + self.not_window
        low = max(y.seq for y in self._item_events(bindings, neg.before))
        high = min(y.seq for y in self._item_events(bindings, neg.after))
        return low < x.seq < high

    def _cancelled(self, part: _Partition, bindings: Bindings) -> bool:
        """Does an event seen so far cancel the match? It must lie in a NOT's region, have
        its type, satisfy its filter and every WHERE condition that mentions it."""
        for neg in self.negations:
            step = neg.step
            for x in part.events:
                if not self._in_region(neg, x, bindings):
                    continue
                if not self._fits_step(part, step, x, bindings):
                    continue
                trial = {**bindings, step.var: x}
                if all(self._conjunct_holds(part, c, trial)
                       for c in self.cancel_conjuncts[step.var]):
                    return True
        return False

    def _composite(self, part: _Partition, bindings: Bindings) -> dict[str, Any]:
        first_seq, last_seq, _, _ = self._span(bindings)
        events = {}
        for item in self.items:
            for s in item.steps:
                bound = bindings[s.var]
                events[s.var] = [y.to_json() for y in bound] if isinstance(bound, list) \
                    else bound.to_json()
        out = {"query": self.query.name, "key": part.key, "seq": last_seq,
               "start_seq": first_seq, "events": events}
        env = _SeqEnv(self, part, bindings)
        for emit in self.body.emit:
            out[emit.name] = evaluate(emit.expr, env)
        return out

    # ------------------------------------------------------------ memory

    def _horizon(self) -> int | None:
        """How far back (in event time) from the oldest event still in use a partition's
        events can matter; None keeps everything (no window bounds the pattern).

        span: the largest possible max(ts) - min(ts) of a match: WITHIN W, or the chain of
        TESLA `WITHIN w FROM y` windows back from the terminator. Window aggregates look a
        further w back from their anchor."""
        span = self.window
        chain = self._chain_span()
        if chain is not None:
            span = chain if span is None else min(span, chain)
        if span is None:
            return None
        extra = 0
        for expr in [self.body.where, *(i.expr for i in self.body.emit),
                     *(s.filter for s in self.steps.values())]:
            if expr is None:
                continue
            for node in expr.find_all(ast.WindowAggregate):
                extra = max(extra, self.checked.time_units(node.within))
        return span + extra

    def _chain_span(self) -> int | None:
        last = self.items[-1]
        if last.kind is not _Kind.SINGLE:
            return None
        dist = {last.step.var: 0}

        def distance(var: str, depth: int = 0) -> int | None:
            if var in dist:
                return dist[var]
            step = self.steps[var]
            if step.anchor is None or step.within is None or depth > len(self.steps):
                return None
            base = distance(step.anchor, depth + 1)
            if base is None:
                return None
            dist[var] = base + self.checked.time_units(step.within)
            return dist[var]

        found = [distance(v) for v in self.steps]
        known = [d for d in found if d is not None]
        return max(known) if len(known) == len(found) else None

    def _prune(self, part: _Partition) -> None:
        if self.horizon is None or not part.events or part.last_ts is None:
            return  # (last_ts is set once there are events)
        oldest = [part.last_ts, *(p.first_ts for p in part.pending),
                  *(r.first_ts for r in part.runs)]
        threshold = min(oldest) - self.horizon
        keep = 0
        while keep < len(part.events) and part.events[keep].ts < threshold:
            keep += 1
        if keep:
            del part.events[:keep]
