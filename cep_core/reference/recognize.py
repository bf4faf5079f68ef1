"""Reference interpreter for MATCH_RECOGNIZE queries, answering as Flink 2.3 does
(docs/semantics.md, MATCH_RECOGNIZE).

Flink runs a MATCH_RECOGNIZE on its CEP library's NFA, and its answers follow from that
automaton's shape, not from SQL:2016's backtracking preferment. So this module builds the
same automaton (`compile_nfa`, after Flink's `NFACompiler` for strictly contiguous patterns)
and runs it the way Flink's `NFA` does, per partition, row by row:

- a state has TAKE edges (consume the row if the variable's DEFINE holds) and PROCEED edges
  (move on without consuming, tried with the same row); a computation is a partial match
  in one state; every row may start a new one (the start state stays);
- a greedy quantifier adds `AND NOT <its DEFINE>` to every edge of the state after it:
  after a greedy `B+` the next variable never takes a row that also satisfies B;
- a partial match reaches the final state on the row whose TAKE lands in a state with a
  PROCEED path to it; completed matches wait until no partial match that started earlier
  is alive, then leave in order of their first row (the match that started first wins),
  each pruning partial and completed matches by the AFTER MATCH SKIP strategy;
- WITHIN: before each row at time t, partial matches with t - start >= the interval end
  (which may free completed matches); at the end of the stream every partial match ends
  the same way when WITHIN is given, and without WITHIN the completed matches still
  waiting are never emitted (Flink's watermark at the end frees nothing then).

Expressions follow SQL: NULL (None) in a comparison is unknown, AND/OR/NOT are three-valued
and a DEFINE holds only when true; `AVG` of ints is an int and int `/` int truncates (Java).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import orjson

from cep_core import ast
from cep_core.checked import CheckedQuery
from cep_core.composite import partition_key
from cep_core.events import Event
from cep_core.recognize_pattern import RecognizeElement, recognize_elements
from cep_core.reference.expr import _COMPARE, Env, Evaluator, _arith

TAKE, PROCEED = "take", "proceed"

# ---------------------------------------------------------------- the automaton (immutable)


@dataclass(frozen=True)
class Condition:
    """An edge's condition: the DEFINE of `var` holds on the row (None: true), and the
    DEFINE of none of `unless` does (the greedy quantifiers before the state)."""

    var: str | None = None
    unless: tuple[str, ...] = ()


@dataclass(eq=False)
class Transition:
    action: str  # TAKE or PROCEED
    target: State
    condition: Condition


@dataclass(eq=False)
class State:
    var: str  # the pattern variable whose row a TAKE from here records ("" for final)
    transitions: list[Transition] = field(default_factory=list)
    final: bool = False


@dataclass(frozen=True)
class Nfa:
    """The compiled pattern: the start state (the first variable's first state)."""

    start: State
    elements: tuple[RecognizeElement, ...]


def compile_nfa(elements: list[RecognizeElement]) -> Nfa:
    """Flink's NFACompiler for a strictly contiguous pattern, built from the last variable
    back: each variable's states lead to the `sink` of the variables after it."""
    sink = State("", final=True)
    for element in reversed(elements):
        sink = _variable_states(element, sink)
    return Nfa(sink, tuple(elements))


def _variable_states(e: RecognizeElement, sink: State) -> State:
    optional, low = e.min == 0, max(e.min, 1)
    if e.max is None:  # B*, B+, B{n,}: a looping state after the first `low` rows
        looping = State(e.var)
        looping.transitions.append(Transition(PROCEED, sink, Condition()))
        if e.greedy:
            _unless(sink, e.var)
        looping.transitions.append(Transition(TAKE, looping, Condition(e.var)))
        return _times(e, looping, sink, low, low, optional)
    return _times(e, sink, sink, low, e.max, optional)


def _times(e: RecognizeElement, sink: State, proceed: State, low: int, high: int,
           optional: bool) -> State:
    if e.greedy and low != high:
        _unless(sink, e.var)
    last = sink
    for _ in range(low, high):  # the optional rows beyond `low`, each may proceed
        last = _single(e, last, proceed)
    for _ in range(low - 1):  # the mandatory rows after the first
        last = _single(e, last, None)
    return _single(e, last, proceed if optional else None)


def _single(e: RecognizeElement, sink: State, proceed: State | None) -> State:
    state = State(e.var, [Transition(TAKE, sink, Condition(e.var))])
    if proceed is not None:
        state.transitions.append(Transition(PROCEED, proceed, Condition()))
    return state


def _unless(state: State, var: str) -> None:
    """Flink's updateWithGreedyCondition: every edge of `state` also needs NOT var."""
    state.transitions[:] = [
        Transition(t.action, t.target, Condition(t.condition.var, (*t.condition.unless, var)))
        for t in state.transitions]


def program(checked: CheckedQuery) -> Nfa:
    """The automaton of a checked MATCH_RECOGNIZE query."""
    return compile_nfa(recognize_elements(checked.query.body.pattern))


# ---------------------------------------------------------------- expressions (SQL's rules)


class RecognizeEvaluator(Evaluator):
    """SQL's three-valued logic and Java's integer arithmetic over an `_Rows` env."""

    def visit_Unary(self, node: ast.Unary, env):
        value = self.visit(node.operand, env)
        if value is None:
            return None
        return (not value) if node.op == "NOT" else -value

    def visit_Binary(self, node: ast.Binary, env):
        a, b = self.visit(node.left, env), self.visit(node.right, env)
        if node.op == "AND":
            return False if a is False or b is False else None if None in (a, b) else True
        if node.op == "OR":
            return True if a is True or b is True else None if None in (a, b) else False
        if a is None or b is None:
            return None
        if node.op == "/" and isinstance(a, int) and isinstance(b, int):
            return None if b == 0 else _truncate(a, b)
        if node.op == "%" and isinstance(a, int) and isinstance(b, int):
            return None if b == 0 else a - b * _truncate(a, b)
        if node.op in _COMPARE:
            return _COMPARE[node.op](a, b)
        return _arith(node.op, a, b)

    def visit_InList(self, node: ast.InList, env):
        value = self.visit(node.operand, env)
        if value is None:
            return None
        return any(value == self.visit(option, env) for option in node.options) != node.negated

    def visit_Call(self, node: ast.Call, env):
        name = node.name.upper()
        if name == "PREV":
            return env.prev(node.args[0], self)
        if name == "MATCH_ROWTIME":
            return env.rows[-1][1].ts
        return super().visit_Call(node, env)


def _truncate(a: int, b: int) -> int:
    return int(math.copysign(abs(a) // abs(b), a * b))


class _Rows(Env):
    """What an expression sees: the match's rows so far as (variable, event) pairs, the
    last one being the current row (DEFINE) or the match's last row (MEASURES)."""

    def __init__(self, rows: list[tuple[str, Event]], pinned: Event | None = None):
        self.rows = rows
        self.pinned = pinned  # inside PREV: every attribute reads this row

    def attr(self, node: ast.Attr):
        if self.pinned is not None:
            return self.pinned.attrs.get(node.name)
        if node.var is None:
            return self.rows[-1][1].attrs.get(node.name)
        mine = [event for var, event in self.rows if var == node.var]
        return mine[-1].attrs.get(node.name) if mine else None

    def aggregate(self, node: ast.Aggregate):
        var = node.arg.var if node.arg is not None else None
        events = [event for v, event in self.rows if var is None or v == var]
        if node.func is ast.AggFunc.COUNT:
            return len(events)
        values = [event.attrs.get(node.arg.name) for event in events]
        values = [v for v in values if v is not None]
        if not values:
            return None
        func = node.func
        if func is ast.AggFunc.FIRST:
            return values[0]
        if func is ast.AggFunc.LAST:
            return values[-1]
        if func is ast.AggFunc.MIN:
            return min(values)
        if func is ast.AggFunc.MAX:
            return max(values)
        total = sum(values)
        if func is ast.AggFunc.SUM:
            return total
        if all(isinstance(v, int) for v in values):  # AVG of an INT column is an INT
            return _truncate(total, len(values))
        return total / len(values)

    def prev(self, expr: ast.Expr, evaluator: RecognizeEvaluator):
        """PREV(expr): expr on the row before the one expr points at (its variable's last
        row, else the current row), within the match; NULL before the match's first row."""
        var = next((a.var for a in expr.find_all(ast.Attr) if a.var is not None), None)
        anchors = [i for i, (v, _) in enumerate(self.rows) if var is None or v == var]
        if not anchors or anchors[-1] == 0:
            return None
        return evaluator.visit(expr, _Rows(self.rows, self.rows[anchors[-1] - 1][1]))


EVALUATE = RecognizeEvaluator().visit


# ---------------------------------------------------------------- running it


@dataclass(eq=False)
class Computation:
    """A partial (or, in the final state, completed) match: its state, its rows as
    (variable, event) and the partition-local index of each row."""

    state: State
    rows: list[tuple[str, Event]]
    indexes: list[int]

    @property
    def start(self) -> int:
        return self.indexes[0]


@dataclass
class _Partition:
    partial: list[Computation] = field(default_factory=list)  # in order of start
    completed: list[Computation] = field(default_factory=list)  # waiting, in order of start
    count: int = 0  # rows seen: the next row's index
    last_ts: int | None = None


class RecognizeInterpreter:
    def __init__(self, checked: CheckedQuery):
        body = checked.query.body
        if not isinstance(body, ast.RecognizeQuery):
            raise TypeError(f"query {checked.name} is not a MATCH_RECOGNIZE query")
        self.checked, self.query, self.body = checked, checked.query, body
        self.nfa = program(checked)
        self.defines = {d.name: d.condition for d in body.defines}
        self.within = checked.time_units(body.within) if body.within is not None else None
        self.partitions: dict[object, _Partition] = {}
        self.dead_letters: list[tuple[Event, str]] = []

    def process(self, event: Event) -> list[dict]:
        key = partition_key(self.query.partition_by, event)
        part = self.partitions.setdefault(_hashable(key), _Partition())
        if part.last_ts is not None and event.ts < part.last_ts:
            reason = "event time goes backwards in partition " + orjson.dumps(key).decode()
            self.dead_letters.append((event, reason))
            return []
        part.last_ts = event.ts
        out = self._advance_time(part, key, event.ts)
        index, part.count = part.count, part.count + 1
        start = Computation(self.nfa.start, [], [])
        partial, completed = [], []
        for computation in [*part.partial, start]:
            for found in self._next(computation, event, index):
                (completed if found.state.final else partial).append(found)
        part.partial = sorted(partial, key=lambda c: c.start)
        part.completed = sorted(part.completed + completed, key=lambda c: c.start)
        return out + self._release(part, key)

    def punctuate(self, ts: int) -> list[dict]:
        return [c for key, part in self._keyed() for c in self._advance_time(part, key, ts)]

    def flush(self) -> list[dict]:
        if self.within is None:
            return []  # no interval ends a partial match: the waiting ones never leave
        return [c for key, part in self._keyed()
                for c in self._advance_time(part, key, None)]

    # ------------------------------------------------------------ Flink's NFA steps

    def _advance_time(self, part: _Partition, key, ts: int | None) -> list[dict]:
        """Partial matches whose interval has ended at `ts` (None: the end of the stream)
        end; completed ones they held back may leave."""
        if self.within is None:
            return []
        part.partial = [c for c in part.partial
                        if ts is not None and ts - c.rows[0][1].ts < self.within]
        return self._release(part, key)

    def _next(self, computation: Computation, event: Event, index: int) -> list[Computation]:
        """Flink's computeNextStates: the TAKE edges open to this row, each leading to a
        new computation, plus a completed one where the target proceeds to the end."""
        found = []
        for transition in self._open_takes(computation, event):
            rows = [*computation.rows, (transition.source_var, event)]
            indexes = [*computation.indexes, index]
            found.append(Computation(transition.target, rows, indexes))
            if self._proceeds_to_final(transition.target, computation, event):
                found.append(Computation(_FINAL, rows, indexes))
        return found

    def _open_takes(self, computation: Computation, event: Event) -> list[_Take]:
        """Flink's createDecisionGraph: from the computation's state through every open
        PROCEED edge (depth first, as Flink's stack), the TAKE edges whose condition holds."""
        takes, stack = [], [computation.state]
        while stack:
            state = stack.pop()
            for t in state.transitions:
                if not self._holds(t.condition, computation.rows, event):
                    continue
                if t.action == PROCEED:
                    stack.append(t.target)
                else:
                    takes.append(_Take(state.var, t.target))
        return takes

    def _proceeds_to_final(self, state: State, computation: Computation,
                           event: Event) -> bool:
        stack = [state]
        while stack:
            for t in stack.pop().transitions:
                if t.action == PROCEED and self._holds(t.condition, computation.rows, event):
                    if t.target.final:
                        return True
                    stack.append(t.target)
        return False

    def _holds(self, condition: Condition, rows: list, event: Event) -> bool:
        if condition.var is not None and not self._defined(condition.var, rows, event):
            return False
        return not any(self._defined(var, rows, event) for var in condition.unless)

    def _defined(self, var: str, rows: list, event: Event) -> bool:
        """Whether `event`, as a row of `var` after `rows`, satisfies var's DEFINE (a
        variable without one takes any row)."""
        define = self.defines.get(var)
        return define is None or EVALUATE(define, _Rows([*rows, (var, event)])) is True

    def _release(self, part: _Partition, key) -> list[dict]:
        """Completed matches leave once no partial match started before them, the earliest
        first; each prunes what its skip strategy skips."""
        out = []
        while part.completed and (not part.partial or
                                  part.completed[0].start < part.partial[0].start):
            match = part.completed.pop(0)
            bound = self._skip_bound(match)
            if bound is not None:
                limit, inclusive = bound
                part.partial = [c for c in part.partial if not _skipped(c, limit, inclusive)]
                part.completed = [c for c in part.completed if not _skipped(c, limit, inclusive)]
            out.append(self._composite(key, match))
        return out

    def _skip_bound(self, match: Computation) -> tuple[int, bool] | None:
        """(row index, inclusive): matches starting before it (or at it) are skipped."""
        skip = self.body.skip
        if skip is ast.SkipTo.PAST_LAST_ROW:
            return match.indexes[-1], True
        if skip is ast.SkipTo.NEXT_ROW:
            return match.indexes[0], True
        mine = [i for (var, _), i in zip(match.rows, match.indexes) if var == self.body.skip_var]
        if not mine:
            return None
        return (mine[0] if skip is ast.SkipTo.FIRST else mine[-1]), False

    def _composite(self, key, match: Computation) -> dict:
        env = _Rows(match.rows)
        events = [event for _, event in match.rows]
        out = {"query": self.checked.name, "key": key,
               "seq": events[-1].seq, "start_seq": events[0].seq}
        for attr in self.query.partition_by:
            out[attr.name] = events[0].attrs.get(attr.name)
        for item in self.body.measures:
            out[item.name] = EVALUATE(item.expr, env)
        if self.body.select is not None:
            wanted = {attr.name for attr in self.body.select}
            out = {k: v for k, v in out.items() if k in wanted or k in _COMPOSITE_FIELDS}
        return out

    def _keyed(self):
        for part in self.partitions.values():
            if part.partial or part.completed:
                last = (part.partial or part.completed)[0].rows[0][1]
                yield partition_key(self.query.partition_by, last), part


@dataclass(frozen=True)
class _Take:
    source_var: str
    target: State


_FINAL = State("", final=True)
_COMPOSITE_FIELDS = ("query", "key", "seq", "start_seq")


def _skipped(computation: Computation, limit: int, inclusive: bool) -> bool:
    return computation.start <= limit if inclusive else computation.start < limit


def _hashable(key):
    return tuple(key) if isinstance(key, list) else key
