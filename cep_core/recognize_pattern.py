"""The pattern of a MATCH_RECOGNIZE query as Flink takes it: a list of variables, each with
one quantifier (`RecognizeElement`). The checker reports what Flink refuses through it; the
reference interpreter (and later the compiler) builds Flink's automaton from the list."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cep_core import ast


MAX_STATES = 256  # a bounded quantifier builds one state per row it counts: B{1000000}


@dataclass(frozen=True)
class RecognizeElement:
    """One variable of a MATCH_RECOGNIZE pattern with its quantifier."""

    var: str
    min: int
    max: int | None  # None: no upper bound
    greedy: bool
    pos: ast.Pos


def recognize_elements(pattern: ast.Regex, error: Callable[[ast.Pos, str], object] | None = None
                       ) -> list[RecognizeElement]:
    """The variables of a MATCH_RECOGNIZE pattern in order, as Flink takes them: a
    concatenation of variables, each with at most one quantifier. What Flink refuses is
    reported through `error(pos, message)` (and left out of the list)."""
    def refuse(pos: ast.Pos, message: str) -> None:
        if error is not None:
            error(pos, message)

    items = pattern.items if isinstance(pattern, ast.RCat) else [pattern]
    flat: list[ast.Regex] = []
    while items:  # `(A B) C` is `A B C`: parentheses without a quantifier group nothing
        item, *items = items
        if isinstance(item, ast.RCat):
            items = [*item.items, *items]
        else:
            flat.append(item)
    elements = []
    for item in flat:
        if isinstance(item, ast.RAlt):
            refuse(item.pos, "alternation (|) in PATTERN: Flink 2.3's MATCH_RECOGNIZE does not "
                             "take it")
        elif isinstance(item, ast.RSym):
            elements.append(RecognizeElement(item.name, 1, 1, True, item.pos))
        elif isinstance(item, ast.RRepeat):
            if not isinstance(item.item, ast.RSym):
                refuse(item.pos, "a quantifier on a group: Flink 2.3's MATCH_RECOGNIZE "
                                 "quantifies single variables only (A B+, not (A B)+)")
            elif item.max is not None and (item.max < item.min or item.max == 0):
                refuse(item.pos, f"quantifier {{{item.min},{item.max}}}: the upper bound must "
                                 "be at least 1 and at least the lower bound")
            elif item.reluctant and item.min == 0 and item.max == 1:
                refuse(item.pos, "a reluctant optional (B??): Flink 2.3 does not take it")
            else:
                elements.append(RecognizeElement(item.item.name, item.min, item.max,
                                                 not item.reluctant, item.pos))
    states = sum(automaton_states(e) for e in elements)
    if states > MAX_STATES:
        refuse(pattern.pos, f"the pattern needs {states:,} automaton states (one per row a "
                            f"bounded quantifier counts); at most {MAX_STATES} are taken")
        return []
    if elements and len(flat) == len(elements) and all(e.min == 0 for e in elements):
        refuse(pattern.pos, "every variable of PATTERN is optional, so it could match no "
                            "row: Flink refuses that (at least one variable must be "
                            "required)")
    for before, after in zip(elements, elements[1:]):
        if before.greedy and before.min != before.max and before.max != 1 and after.min == 0:
            refuse(after.pos, f"'{after.var}' is optional right after the greedy '{before.var}': "
                              "Flink refuses it (optional pattern cannot be preceded by greedy "
                              f"pattern); make '{before.var}' reluctant (add '?')")
    last = elements[-1] if elements else None
    if last is not None and last.greedy and last.min != last.max and last.max != 1 and \
            len(flat) == len(elements):
        refuse(last.pos, f"a greedy quantifier on the last variable ('{last.var}'): Flink "
                         "refuses it; make it reluctant (add '?') or end the pattern with a "
                         "single variable")
    return elements


def automaton_states(e: RecognizeElement) -> int:
    """The states Flink's compiler builds for one variable: one per counted row, plus the
    looping state of an unbounded quantifier."""
    low = max(e.min, 1)
    return low + 1 if e.max is None else max(e.max, low)
