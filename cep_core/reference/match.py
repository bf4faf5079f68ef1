"""Reference interpreter for MATCH queries (docs/semantics.md, MATCH).

The oracle the fast engines are tested against, so it is written for clarity, not speed.
It does NOT build an automaton. Instead, per partition, every event starts a *candidate*
(a partial match beginning at that event), and each candidate keeps the rest of the pattern
it still has to match as a regular expression: the Brzozowski derivative of the pattern by
the events it has taken so far.

The derivative of a regex by one event replaces each predicate symbol the regex can start
with by "the empty word" when the predicate holds on the event and by "nothing" when it
does not (`.` always holds). Predicates are evaluated on the event with aggregates over the
candidate's events *before* it; every path through the regex of one candidate shares those
events, so one residual regex per candidate is exact even though predicates read
aggregates and may overlap.

Then, event by event, in a partition (docs/semantics.md):

- unanchored: the event starts a new candidate (with the whole pattern as its residual);
- partition-contiguous: every candidate takes the event or dies (its residual becomes the
  empty language);
- non-greedy: a candidate accepts as soon as its residual accepts the empty word (it has at
  least one event by then);
- longest / non-overlapping: if several candidates accept on the same event, the one with
  the earliest start is reported, and every candidate of the partition is discarded;
- event time must not go backwards within a partition: such an event is rejected into
  `dead_letters` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import IntEnum
from typing import Any, TypeAlias

import orjson

from cep_core import ast
from cep_core.checked import CheckedQuery
from cep_core.composite import partition_key
from cep_core.events import Event
from cep_core.reference.expr import Env, evaluate, fold, holds

# ---------------------------------------------------------------- residual regexes
#
# Residuals are small immutable tuples (hashable, compared by structure) tagged by an _R,
# built only through the smart constructors below so that they stay small and the empty
# language is always spelled NOTHING:
#
#   NOTHING                 the empty language (no word at all): the candidate is dead
#   EMPTY                   the language holding only the empty word
#   (SYM, name)             one event satisfying DEFINE `name`
#   (ANY,)                  one event, whatever it is (`.`)
#   (CAT, left, right)      left then right
#   (ALT, frozenset)        any one of the options (a set: order and duplicates are moot)
#   (REP, item, lo, hi)     item repeated lo to hi times (hi None: no upper bound)
#
# The constructors remove every NOTHING below the top, so a residual other than NOTHING
# always denotes a non-empty language: "dead" is exactly "residual is NOTHING".

class _R(IntEnum):
    """A residual's tag (its first item). An IntEnum: residuals are dict keys on the
    interpreter's hot path, and an int hashes in C (an Enum's hash is Python code)."""

    NOTHING = 0
    EMPTY = 1
    ANY = 2
    SYM = 3
    CAT = 4
    ALT = 5
    REP = 6


# The tags as module globals: `kind is _CAT` reads a global, `kind is _R.CAT` also looks the
# member up on the class, which made the interpreter 40% slower on MATCH workloads.
_NOTHING, _EMPTY, _ANY, _SYM, _CAT, _ALT, _REP = _R

# A residual's fields depend on its tag, which mypy cannot narrow on without code on the
# hot path (a tag check per field read): typed as a tuple of anything.
Residual: TypeAlias = tuple[Any, ...]

NOTHING: Residual = (_NOTHING,)
EMPTY: Residual = (_EMPTY,)
ANY: Residual = (_ANY,)


def sym(name: str) -> Residual:
    return (_SYM, name)


def cat(left: Residual, right: Residual) -> Residual:
    if left == NOTHING or right == NOTHING:
        return NOTHING
    if left == EMPTY:
        return right
    if right == EMPTY:
        return left
    if left[0] is _CAT:  # keep concatenations right-nested: (a b) c -> a (b c)
        return cat(left[1], cat(left[2], right))
    return (_CAT, left, right)


def alt(options: Iterable[Residual]) -> Residual:
    flat: set[Residual] = set()
    for option in options:
        if option[0] is _ALT:
            flat.update(option[1])
        elif option != NOTHING:
            flat.add(option)
    if not flat:
        return NOTHING
    if len(flat) == 1:
        return next(iter(flat))
    return (_ALT, frozenset(flat))


def rep(item: Residual, lo: int, hi: int | None) -> Residual:
    if hi == 0 or item == EMPTY:
        return EMPTY
    if item == NOTHING:
        return EMPTY if lo == 0 else NOTHING
    if lo == 1 and hi == 1:
        return item
    return (_REP, item, lo, hi)


class _Residual(ast.Visitor):
    """A pattern's AST as a residual."""

    def visit_RSym(self, regex: ast.RSym) -> Residual:
        return sym(regex.name)

    def visit_RAny(self, regex: ast.RAny) -> Residual:
        return ANY

    def visit_REmpty(self, regex: ast.REmpty) -> Residual:
        return EMPTY

    def visit_RCat(self, regex: ast.RCat) -> Residual:
        result = EMPTY
        for item in reversed(regex.items):
            result = cat(self.visit(item), result)
        return result

    def visit_RAlt(self, regex: ast.RAlt) -> Residual:
        return alt(self.visit(option) for option in regex.options)

    def visit_RRepeat(self, regex: ast.RRepeat) -> Residual:
        return rep(self.visit(regex.item), regex.min, regex.max)


def from_ast(regex: ast.Regex) -> Residual:
    """The pattern of a query as a residual."""
    residual: Residual = _Residual().visit(regex)
    return residual


def nullable(r: Residual) -> bool:
    """Whether the residual accepts the empty word (the candidate's events so far match)."""
    kind = r[0]
    if kind is _EMPTY:
        return True
    if kind in (_NOTHING, _SYM, _ANY):
        return False
    if kind is _CAT:
        return nullable(r[1]) and nullable(r[2])
    if kind is _ALT:
        return any(nullable(option) for option in r[1])
    if kind is _REP:
        return r[2] == 0 or nullable(r[1])
    raise TypeError(f"not a residual: {r!r}")


def derive(r: Residual, satisfies: Callable[[str], bool]) -> Residual:
    """The residual after one more event. `satisfies(name)` says whether that event
    satisfies the predicate `name` (in the candidate's context)."""
    kind = r[0]
    if kind in (_NOTHING, _EMPTY):
        return NOTHING
    if kind is _ANY:
        return EMPTY
    if kind is _SYM:
        return EMPTY if satisfies(r[1]) else NOTHING
    if kind is _CAT:
        left, right = r[1], r[2]
        taken_by_left = cat(derive(left, satisfies), right)
        if nullable(left):
            return alt([taken_by_left, derive(right, satisfies)])
        return taken_by_left
    if kind is _ALT:
        return alt(derive(option, satisfies) for option in r[1])
    if kind is _REP:
        # item{lo,hi}: the event goes to a first item, then item{max(lo-1,0), hi-1} remain.
        # (Right even when item accepts the empty word: skipped items add nothing.)
        item, lo, hi = r[1], r[2], r[3]
        rest = rep(item, max(lo - 1, 0), None if hi is None else hi - 1)
        return cat(derive(item, satisfies), rest)
    raise TypeError(f"not a residual: {r!r}")


# ---------------------------------------------------------------- expressions


class MatchEnv(Env):
    """Bare attributes are `current`'s; aggregates range over `events`.

    In a predicate, `events` is the partial match before the current event and `current` is
    the event being tested. In EMIT, `events` is the whole match and `current` its last event.
    `Delta(a)` is `current.a - first.a` in both cases (None over no events).
    """

    def __init__(self, events: list[Event], current: Event, time_attr: str):
        self.events = events
        self.current = current
        self.time_attr = time_attr

    def value(self, event: Event, name: str) -> Any:
        return event.ts if name == self.time_attr else event.attrs[name]

    def attr(self, node: ast.Attr) -> Any:
        if node.var is not None:
            raise TypeError(f"MATCH has no variables: {node.var}.{node.name}")
        return self.value(self.current, node.name)

    def aggregate(self, node: ast.Aggregate) -> Any:
        if node.func is ast.AggFunc.COUNT:
            return len(self.events)
        if node.arg is None or node.arg.var is not None:
            raise TypeError(f"MATCH aggregate {node.func.value} needs an attribute")
        name = node.arg.name
        if node.func is ast.AggFunc.DELTA:
            if not self.events:
                return None
            now, first = self.value(self.current, name), self.value(self.events[0], name)
            return None if now is None or first is None else now - first
        return fold(node.func, [self.value(e, name) for e in self.events])


# ---------------------------------------------------------------- the interpreter


class Candidate:
    """A partial match: the events it has taken (from its start on) and what remains."""

    def __init__(self, residual: Residual):
        self.residual = residual
        self.events: list[Event] = []


class MatchInterpreter:
    def __init__(self, checked: CheckedQuery):
        self.checked = checked
        self.query = checked.query
        body = checked.query.body
        if not isinstance(body, ast.MatchQuery):
            raise TypeError(f"query {checked.name} is not a MATCH query")
        self.pattern = from_ast(body.pattern)
        self.defines = {d.name: d.condition for d in body.defines}
        self.emit = body.emit
        self.time_attr = checked.schema.time
        # Per partition (by hashable key): live candidates in order of their start event,
        # and the event time of the partition's last accepted event.
        self.candidates: dict[object, list[Candidate]] = {}
        self.last_ts: dict[object, int] = {}
        self.dead_letters: list[tuple[Event, str]] = []

    def process(self, event: Event) -> list[dict[str, Any]]:
        key = partition_key(self.query.partition_by, event)
        slot = _hashable(key)

        if slot in self.last_ts and event.ts < self.last_ts[slot]:
            reason = "event time goes backwards in partition " + orjson.dumps(key).decode()
            self.dead_letters.append((event, reason))
            return []
        self.last_ts[slot] = event.ts

        # Unanchored: this event may start a match (the newest candidate, so the list stays
        # in order of start).
        candidates = self.candidates.setdefault(slot, [])
        candidates.append(Candidate(self.pattern))

        # Partition-contiguous: every candidate takes this event or dies.
        survivors: list[Candidate] = []
        for candidate in candidates:
            satisfies = self._satisfies(candidate.events, event)
            residual = derive(candidate.residual, satisfies)
            if residual == NOTHING:
                continue
            candidate.residual = residual
            candidate.events.append(event)
            survivors.append(candidate)
        self.candidates[slot] = survivors

        # Non-greedy: report on the first accepting event; the earliest start (the longest
        # match) wins and every partial match of the partition is discarded.
        accepting = [c for c in survivors if nullable(c.residual)]
        if not accepting:
            return []
        winner = accepting[0]
        self.candidates[slot] = []
        return [self._composite(key, winner.events)]

    def punctuate(self, ts: int) -> list[dict[str, Any]]:
        return []  # a match is reported on its last event: nothing waits for time

    def flush(self) -> list[dict[str, Any]]:
        return []  # partial matches that have not accepted at the end are not matches

    # ------------------------------------------------------------ helpers

    def _satisfies(self, before: list[Event], event: Event) -> Callable[[str], bool]:
        """`name -> bool`: whether `event` satisfies DEFINE `name` with aggregates over
        `before`. Evaluated lazily (only predicates the residual can start with) and once."""
        env = MatchEnv(before, event, self.time_attr)
        memo: dict[str, bool] = {}

        def satisfies(name: str) -> bool:
            if name not in memo:
                if name not in self.defines:
                    raise KeyError(f"query {self.checked.name}: pattern names '{name}', "
                                   "which DEFINE does not define")
                memo[name] = holds(self.defines[name], env)
            return memo[name]

        return satisfies

    def _composite(self, key: object, events: list[Event]) -> dict[str, Any]:
        env = MatchEnv(events, events[-1], self.time_attr)
        out: dict[str, Any] = {"query": self.checked.name, "key": key,
               "seq": events[-1].seq, "start_seq": events[0].seq}
        for item in self.emit:
            out[item.name] = evaluate(item.expr, env)
        return out


def _hashable(key: object) -> object:
    """A partition key usable as a dict key (PARTITION BY several attributes gives a list)."""
    return tuple(key) if isinstance(key, list) else key
