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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from enum import StrEnum

import orjson

from cep_core import ast
from cep_core.checked import CheckedQuery
from cep_core.composite import partition_key
from cep_core.events import Event
from cep_core.recognize_pattern import RecognizeElement, recognize_elements
from cep_core.reference.priority_queue import JavaPriorityQueue
from cep_core.reference.expr import _COMPARE, Env, Evaluator, Value, _arith

F = ast.Builtin


class Action(StrEnum):
    """What an edge does (its value is how a snapshot's automaton signature writes it)."""

    TAKE = "take"  # consume the row, if the edge's condition holds
    PROCEED = "proceed"  # move on without consuming it


TAKE, PROCEED = Action.TAKE, Action.PROCEED
Composite = dict[str, Any]  # a composite event (schemas/composite_event.json)

# ---------------------------------------------------------------- the automaton (immutable)


@dataclass(frozen=True)
class Condition:
    """An edge's condition: the DEFINE of `var` holds on the row (None: true), and the
    DEFINE of none of `unless` does (the greedy quantifiers before the state)."""

    var: str | None = None
    unless: tuple[str, ...] = ()


@dataclass(eq=False)
class Transition:
    action: Action
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


def number_states(start: State) -> tuple[dict[int, int], list[State]]:
    """A stable numbering of the automaton's states, by `id`: depth first from the start
    state, the edges in their order (the same query always numbers its states alike)."""
    numbering: dict[int, int] = {}
    states: list[State] = []
    stack = [start]
    while stack:
        state = stack.pop()
        if id(state) in numbering:
            continue
        numbering[id(state)] = len(states)
        states.append(state)
        stack.extend(t.target for t in reversed(state.transitions))
    return numbering, states


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
    body = checked.query.body
    if not isinstance(body, ast.RecognizeQuery):
        raise TypeError(f"query {checked.name} is not a MATCH_RECOGNIZE query")
    return compile_nfa(recognize_elements(body.pattern))


# ---------------------------------------------------------------- expressions (SQL's rules)


class RecognizeEvaluator(Evaluator):
    """SQL's three-valued logic and Java's integer arithmetic over an `_Rows` env."""

    def visit_Unary(self, node: ast.Unary, env: Env) -> Value:
        value = self.visit(node.operand, env)
        if value is None:
            return None
        return (not value) if node.op == ast.UnaryOp.NOT else -value

    def visit_Binary(self, node: ast.Binary, env: Env) -> Value:
        a, b = self.visit(node.left, env), self.visit(node.right, env)
        if node.op == ast.BinaryOp.AND:
            return False if a is False or b is False else None if None in (a, b) else True
        if node.op == ast.BinaryOp.OR:
            return True if a is True or b is True else None if None in (a, b) else False
        if a is None or b is None:
            return None
        if node.op == ast.BinaryOp.DIV and isinstance(a, int) and isinstance(b, int):
            return None if b == 0 else _truncate(a, b)
        if node.op == ast.BinaryOp.MOD and isinstance(a, int) and isinstance(b, int):
            return None if b == 0 else a - b * _truncate(a, b)
        if node.op in _COMPARE:
            return _COMPARE[node.op](a, b)
        return _arith(node.op, a, b)

    def visit_InList(self, node: ast.InList, env: Env) -> Value:
        value = self.visit(node.operand, env)
        if value is None:
            return None
        return any(value == self.visit(option, env) for option in node.options) != node.negated

    def visit_Call(self, node: ast.Call, env: Env) -> Value:
        func = node.func
        if func is F.PREV:
            offset = node.args[1] if len(node.args) > 1 else None
            assert offset is None or isinstance(offset, ast.Literal)  # the checker's rule
            return _rows(env).prev(node.args[0], self,
                                   1 if offset is None else int(offset.value))
        if func is F.MATCH_ROWTIME:  # in DEFINE: the current row's time (Flink's)
            rows = _rows(env)
            return rows.rowtime if rows.rowtime is not None else rows.rows[-1][1].ts
        if func is F.MATCH_PROCTIME:  # the machine's clock, as Flink's
            return time.time_ns() // 1_000_000
        if func is F.IS_NULL:
            return self.visit(node.args[0], env) is None
        if func is F.COALESCE:
            values = (self.visit(arg, env) for arg in node.args)
            return next((v for v in values if v is not None), None)
        return super().visit_Call(node, env)


def _rows(env: Env) -> _Rows:
    if not isinstance(env, _Rows):
        raise TypeError("MATCH_RECOGNIZE's navigation reads the rows of a match")
    return env


def _truncate(a: int, b: int) -> int:
    return int(math.copysign(abs(a) // abs(b), a * b))


class _Rows(Env):
    """What an expression sees: the match's rows so far as (variable, event) pairs, the
    last one being the current row (DEFINE) or the match's last row (MEASURES)."""

    def __init__(self, rows: list[tuple[str, Event]], pinned: Event | None = None,
                 rowtime: int | None = None):
        self.rows = rows
        self.pinned = pinned  # inside PREV: every attribute reads this row
        self.rowtime = rowtime  # MATCH_ROWTIME (MEASURES only)

    def attr(self, node: ast.Attr) -> Value:
        if self.pinned is not None:
            return self.pinned.attrs.get(node.name)
        if node.var is None:
            return self.rows[-1][1].attrs.get(node.name)
        mine = [event for var, event in self.rows if var == node.var]
        return mine[-1].attrs.get(node.name) if mine else None

    def aggregate(self, node: ast.Aggregate) -> Value:
        if node.func is ast.AggFunc.COUNT and node.arg is not None and node.arg.name == "":
            # COUNT(price) (parsed as var "price"): the match's rows whose price is not NULL
            column = node.arg.var or ""  # (always given here)
            return sum(event.attrs.get(column) is not None for _, event in self.rows)
        var = node.arg.var if node.arg is not None else None
        events = [event for v, event in self.rows if var is None or v == var]
        if node.func is ast.AggFunc.COUNT:  # COUNT(*), or COUNT(B.price): its non-NULLs
            return len(events) if node.arg is None else \
                sum(event.attrs.get(node.arg.name) is not None for event in events)
        assert node.arg is not None  # only COUNT(*) has no argument
        values = [event.attrs.get(node.arg.name) for event in events]
        func = node.func
        if func in (ast.AggFunc.FIRST, ast.AggFunc.LAST):  # with Flink's logical offset
            row = node.offset if func is ast.AggFunc.FIRST else len(values) - 1 - node.offset
            return values[row] if 0 <= row < len(values) else None
        present = [v for v in values if v is not None]  # SQL's aggregates skip NULLs
        if not present:
            return None
        if func is ast.AggFunc.MIN:
            return min(present)
        if func is ast.AggFunc.MAX:
            return max(present)
        total = sum(present)
        if func is ast.AggFunc.SUM:
            return total
        if all(isinstance(v, int) for v in present):  # AVG of an INT column is an INT
            return _truncate(total, len(present))
        return total / len(present)

    def prev(self, expr: ast.Expr, evaluator: RecognizeEvaluator, offset: int = 1) -> Value:
        """PREV(expr, offset): expr on the row `offset` rows (1 unless given) before the one
        expr points at (its variable's last row, else the current row), within the match;
        NULL before the match's first row."""
        var = next((a.var for a in expr.find_all(ast.Attr) if a.var is not None), None)
        anchors = [i for i, (v, _) in enumerate(self.rows) if var is None or v == var]
        if not anchors or anchors[-1] < offset:
            return None
        return evaluator.visit(expr, _Rows(self.rows, self.rows[anchors[-1] - offset][1]))


EVALUATE = RecognizeEvaluator().visit


# ---------------------------------------------------------------- running it


@dataclass(eq=False)
class Computation:
    """A partial (or, in the final state, completed) match: its state, its rows as
    (variable, event) and the partition-local index of each row. The start computation
    (no rows) stays in the queue of partial matches, behind every other."""

    state: State
    rows: list[tuple[str, Event]]
    indexes: list[int]

    @property
    def start(self) -> int:
        """Flink's order of computations: by the row they started on."""
        return self.indexes[0] if self.indexes else _NEVER


_NEVER = 1 << 62  # the start computation's place: after every partial match


class _Partition:
    def __init__(self, start: State):
        self.partial = _queue([Computation(start, [], [])])
        self.completed = _queue([])
        self.count = 0  # rows seen: the next row's index
        self.last_ts: int | None = None


def _queue(items: list[Computation]) -> JavaPriorityQueue[Computation]:
    queue: JavaPriorityQueue[Computation] = JavaPriorityQueue(key=lambda c: c.start)
    queue.add_all(items)
    return queue


class RecognizeRuntimeError(RuntimeError):
    """What stops a MATCH_RECOGNIZE query at run time, as it stops Flink's (AFTER MATCH
    SKIP TO a variable a match does not have, or to the match's first row)."""


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
        self.keys: dict[object, object] = {}
        self.dead_letters: list[tuple[Event, str]] = []
        # ORDER BY ts, col...: per partition, the rows of its latest time not yet taken
        self.pending: dict[object, list[Event]] = {}

    def process(self, event: Event) -> list[Composite]:
        if self.body.then_by:
            return self._process_sorted(event)
        return self._process(event)

    def _process_sorted(self, event: Event) -> list[Composite]:
        """`ORDER BY ts, col...`: the rows of one time wait in their partition's `pending`
        until a later row comes (or the end), then go in in the order of those columns, as
        Flink's operator sorts the rows of a time before its automaton takes them."""
        slot = _hashable(partition_key(self.query.partition_by, event))
        pending = self.pending.setdefault(slot, [])
        if pending and event.ts < pending[0].ts:
            reason = "event time goes backwards in partition " + orjson.dumps(
                partition_key(self.query.partition_by, event)).decode()
            self.dead_letters.append((event, reason))
            return []
        out = self._drain(slot) if pending and event.ts > pending[0].ts else []
        self.pending[slot].append(event)
        return out

    def _drain(self, slot: object, before: int | None = None) -> list[Composite]:
        """The rows waiting in a partition (those before time `before`), sorted, go in."""
        pending = self.pending.get(slot, [])
        if not pending or (before is not None and pending[0].ts >= before):
            return []
        self.pending[slot] = []
        return [c for event in sorted(pending, key=self._sort_key) for c in self._process(event)]

    def _sort_key(self, event: Event) -> tuple[_Sortable, ...]:
        return tuple(_Sortable(event.attrs.get(attr.name), desc)
                     for attr, desc in zip(self.body.then_by, self.body.then_desc))

    def _process(self, event: Event) -> list[Composite]:
        key = partition_key(self.query.partition_by, event)
        slot = _hashable(key)
        part = self.partitions.get(slot)
        if part is None:
            part = self.partitions[slot] = _Partition(self.nfa.start)
            self.keys[slot] = key
        if part.last_ts is not None and event.ts < part.last_ts:
            reason = "event time goes backwards in partition " + orjson.dumps(key).decode()
            self.dead_letters.append((event, reason))
            return []
        part.last_ts = event.ts
        out = self._advance_time(part, key, event.ts)
        index, part.count = part.count, part.count + 1
        # Flink's NFA.doProcess: every computation (the queue's array order) moves on.
        partial, completed = _queue([]), _queue([])
        for computation in part.partial:
            found = self._next(computation, event, index)
            for done in (c for c in found if c.state.final):
                completed.add(done)
            partial.add_all(c for c in found if not c.state.final)
        part.completed.add_all(completed)
        part.partial = partial
        return out + self._release(part, key, event.ts)

    def punctuate(self, ts: int) -> list[Composite]:
        waiting = [c for slot in list(self.pending) for c in self._drain(slot, before=ts)]
        return waiting + [c for slot, part in self.partitions.items()
                          for c in self._advance_time(part, self.keys[slot], ts)]

    def flush(self) -> list[Composite]:
        waiting = [c for slot in list(self.pending) for c in self._drain(slot)]
        if self.within is None:
            return waiting  # no interval ends a partial match: the waiting ones never leave
        return waiting + [c for slot, part in self.partitions.items()
                          for c in self._advance_time(part, self.keys[slot], None)]

    # ------------------------------------------------------------ Flink's NFA steps

    def _advance_time(self, part: _Partition, key: object, ts: int | None) -> list[Composite]:
        """Partial matches whose interval has ended by `ts` (None: the end of the stream)
        end, in order of their end (start + interval: Flink's timer for them fires then);
        completed ones they held back may leave at that time."""
        if self.within is None:
            return []
        out: list[Composite] = []
        while True:
            ends = [c.rows[0][1].ts + self.within for c in part.partial if c.rows]
            if not ends or (ts is not None and min(ends) > ts):
                return out
            end = min(ends)
            part.partial.remove_if(_ended_by(end, self.within))
            out += self._release(part, key, end)

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
        if not computation.rows:  # the start computation stays, after what it started
            found.append(computation)
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
                if t.action is PROCEED:
                    stack.append(t.target)
                else:
                    takes.append(_Take(state.var, t.target))
        return takes

    def _proceeds_to_final(self, state: State, computation: Computation,
                           event: Event) -> bool:
        stack = [state]
        while stack:
            for t in stack.pop().transitions:
                if t.action is PROCEED and self._holds(t.condition, computation.rows, event):
                    if t.target.final:
                        return True
                    stack.append(t.target)
        return False

    def _holds(self, condition: Condition, rows: list[tuple[str, Event]], event: Event) -> bool:
        if condition.var is not None and not self._defined(condition.var, rows, event):
            return False
        return not any(self._defined(var, rows, event) for var in condition.unless)

    def _defined(self, var: str, rows: list[tuple[str, Event]], event: Event) -> bool:
        """Whether `event`, as a row of `var` after `rows`, satisfies var's DEFINE (a
        variable without one takes any row)."""
        define = self.defines.get(var)
        return define is None or EVALUATE(define, _Rows([*rows, (var, event)])) is True

    def _release(self, part: _Partition, key: object, now: int) -> list[Composite]:
        """Completed matches leave once no partial match started before them (one that
        started on the same row does not hold them back), the queue's head first; each
        prunes the partial and completed matches its skip strategy skips."""
        out = []
        while part.completed and part.completed.element().start <= part.partial.element().start:
            match = part.completed.poll()
            limit, inclusive = self._skip_bound(match)
            for queue in (part.partial, part.completed):
                queue.remove_if(_skipped(limit, inclusive))
            out.append(self._composite(key, match, now))
        return out

    def _skip_bound(self, match: Computation) -> tuple[int, bool]:
        """(row index, inclusive): matches starting before it (or at it) are skipped."""
        skip = self.body.skip
        if skip is ast.SkipTo.PAST_LAST_ROW:
            return match.indexes[-1], True
        if skip is ast.SkipTo.NEXT_ROW:
            return match.indexes[0], True
        mine = [i for (var, _), i in zip(match.rows, match.indexes) if var == self.body.skip_var]
        if not mine:
            raise RecognizeRuntimeError(
                f"query {self.checked.name!r}: AFTER MATCH SKIP {skip.value.upper()} "
                f"{self.body.skip_var}: a match without {self.body.skip_var} (rows "
                f"{match.rows[0][1].seq}-{match.rows[-1][1].seq}); Flink stops the query here")
        row = mine[0] if skip is ast.SkipTo.FIRST else mine[-1]
        if row == match.indexes[0]:
            raise RecognizeRuntimeError(
                f"query {self.checked.name!r}: AFTER MATCH SKIP {skip.value.upper()} "
                f"{self.body.skip_var} lands on the match's first row (seq "
                f"{match.rows[0][1].seq}), which would find the same match again; Flink "
                "stops the query here")
        return row, False

    def _composite(self, key: object, match: Computation, now: int) -> Composite:
        """The match's composite event, leaving at event time `now` (MATCH_ROWTIME: Flink
        stamps a match with the time it leaves, which is its last row's unless it waited)."""
        env = _Rows(match.rows, rowtime=now)
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


@dataclass(frozen=True)
class _Take:
    source_var: str
    target: State


_FINAL = State("", final=True)


def _ended_by(end: int, within: int) -> Callable[[Computation], bool]:
    return lambda c: bool(c.rows) and c.rows[0][1].ts + within <= end


def _skipped(limit: int, inclusive: bool) -> Callable[[Computation], bool]:
    """Flink's shouldPrune: matches (not the start computation) starting before `limit`,
    or at it when `inclusive`."""
    return lambda c: bool(c.rows) and (c.start <= limit if inclusive else c.start < limit)
_COMPOSITE_FIELDS = ("query", "key", "seq", "start_seq")


@dataclass(frozen=True)
class _Sortable:
    """One ORDER BY column's value for sorting: NULL lowest (first ascending, last
    descending: Flink's default null collation), DESC reversed."""

    value: Value  # a column's (None: NULL)
    desc: bool

    def __lt__(self, other: _Sortable) -> bool:
        a, b = (other.value, self.value) if self.desc else (self.value, other.value)
        if a is None or b is None:
            return a is None and b is not None
        less: bool = a < b
        return less


def _hashable(key: object) -> object:
    return tuple(key) if isinstance(key, list) else key
