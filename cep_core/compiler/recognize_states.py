"""The states layout of MATCH_RECOGNIZE's runs: where a run never stands for more than one
partial match, its counts per automaton state (`recognize_runs`) are one state, and a row
steps it by a table, as MATCH's kernel steps a candidate (`state_table`).

A run stands for one partial match at most when the start computation makes one at most
and, from every state a run can be in, at most one TAKE edge into a state that is not the
final one fires on any row, and at most one completes the match. The edges' conditions are
DEFINEs and their negations (Flink's greedy `unless`), so whether two fire together is a
question of which DEFINEs can hold together. Every combination of the DEFINEs' values is
tried, but those that cannot hold at once: a combination where two DEFINEs hold whose
generated conditions have, among their top-level conjuncts, comparisons of the same two
operands that no order of them satisfies both (`a > b` and `a <= b`, `a < b` and `a > b`,
`a == b` and `a != b`; NaN satisfies `!=` alone, NULLs are conjuncts of their own).

Flink's greedy quantifiers make most patterns so: after `B+` the next variable takes a row
only where B's DEFINE does not hold. A pattern that branches (`A B* C` where B and C may
hold together) keeps the runs layout.

The table is then indexed by the DEFINEs' conjuncts rather than the DEFINEs (`by_conjuncts`),
where that makes it no larger than `MAX_CONJUNCT_TABLE`: the conjuncts that read no run (the
row against the row before: the M-shape's `price < LAST(price)`) are evaluated once per row
and give the table's row, and a run's step evaluates the others alone, once each (the
M-shape's four DEFINEs, eight comparisons, are two comparisons of the price with the first
row's on a run). 1.03-1.05x on the M-shape, 1.08x over trades sorted by key
(docs/benchmarks.md).
"""

from __future__ import annotations

import ast as py
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from cep_core.compiler.recognize_codegen import Generator

Literal = tuple[int, bool]  # a variable's number and whether its DEFINE holds
EdgeLiterals = list[tuple[list[Literal], int, list[Literal] | None]]

MAX_TABLE = 1 << 14  # the most table entries a query may have: (states + 1) << calls
MAX_CONJUNCT_TABLE = 1 << 10  # (8 KiB, in the L1 cache) the most by conjuncts


@dataclass(frozen=True)
class StateTable:
    """A run's step: entry `number * 2**len(calls) + bits` (`bits`: bit j the value of
    `calls[j]` on the run) is the number of the state the run goes on in (0: it ends) plus
    `1 << shift` where it also completes a match."""

    states: tuple[int, ...]  # the automaton states a run can be in, numbered from 1
    calls: tuple[str, ...]  # the DEFINE functions the table's bits are the values of
    table: tuple[int, ...]
    shift: int
    # by conjuncts: the last `row_calls` calls read no run (evaluated once per row), and
    # the functions (name, condition) of the calls, which are conjuncts, not DEFINEs
    row_calls: int = 0
    functions: tuple[tuple[str, str], ...] = ()

    def number(self, state: int) -> int:
        return self.states.index(state) + 1


def state_table(tables: dict[str, npt.NDArray[np.int64]], gen: Generator, states: list[int],
                start: int, defs: dict[str, str],
                edge_literals: Callable[[int], EdgeLiterals]) -> StateTable | None:
    """The table of a query whose runs are in `states` (sorted), or None where a run may
    stand for more than one partial match (or the table would be too large). `defs`: the
    DEFINE functions' conditions by name; `edge_literals(s)`: the TAKE edges a
    computation in state s follows on a row (`recognize_runs.edge_literals`)."""
    calls: list[str] = []
    for s in states:
        for name in sorted(_calls_of(gen, s, edge_literals(s))):  # (the same every process)
            if name not in calls:
                calls.append(name)
    if (len(states) + 1) << len(calls) > MAX_TABLE:
        return None
    firsts = sorted(_calls_of(gen, start, edge_literals(start)))
    if any(len(goes) > 1 or done > 1 for _, goes, done in
           _outcomes(tables, gen, start, firsts, exclusive_pairs(firsts, defs),
                     edge_literals(start))):
        return None  # the start computation may make two partial matches
    shift = max(1, len(states).bit_length())
    table = [0] * ((len(states) + 1) << len(calls))
    never = exclusive_pairs(calls, defs)
    for number, s in enumerate(states, 1):
        for bits, goes, done in _outcomes(tables, gen, s, calls, never, edge_literals(s)):
            if len(goes) > 1 or done > 1:
                return None
            table[(number << len(calls)) + bits] = \
                (states.index(goes[0]) + 1 if goes else 0) | done << shift
    return StateTable(tuple(states), tuple(calls), tuple(table), shift)


def by_conjuncts(table: StateTable, defs: dict[str, str], ints: set[str]) -> StateTable:
    """The same table indexed by the distinct top-level conjuncts of its DEFINEs (those that
    read no run last), where that is no larger than MAX_CONJUNCT_TABLE and a run's step
    evaluates no more of them than of DEFINEs; else `table` itself. A combination of
    conjuncts makes each DEFINE the conjunction of its own; one that makes two DEFINEs hold
    that never hold together cannot happen (`exclusive_pairs` reads the same conjuncts).
    A comparison of two ints whose negation is a conjunct already is not one more: it
    holds where that does not (`ints`: the row's values that are ints, as named in code;
    a float may be NaN, where `a < b` and `a >= b` both fail)."""
    parts = {name: _conjuncts(defs[name]) for name in table.calls}
    found = list(dict.fromkeys(c for name in table.calls for c in parts[name]))
    negated = _negations(found, ints)  # conjunct -> the one it is the negation of
    kept = [c for c in found if c not in negated]
    reads_run = [c for c in kept if _reads_run(c)]
    conjuncts = reads_run + [c for c in kept if c not in reads_run]
    if len(reads_run) > len(table.calls) or \
            (len(table.states) + 1) << len(conjuncts) > MAX_CONJUNCT_TABLE:
        return table
    bit = {c: j for j, c in enumerate(conjuncts)}
    ncalls, entries = len(table.calls), []
    for number in range(len(table.states) + 1):
        for bits in range(1 << len(conjuncts)):
            holds = {c: bool(bits >> j & 1) for c, j in bit.items()}
            holds.update({c: not holds[of] for c, of in negated.items()})
            calls = sum(1 << j for j, name in enumerate(table.calls)
                        if all(holds[c] for c in parts[name]))
            entries.append(table.table[(number << ncalls) + calls])
    names = tuple(f"c{j}" for j in range(len(conjuncts)))
    return replace(table, calls=names, table=tuple(entries),
                   row_calls=len(conjuncts) - len(reads_run),
                   functions=tuple(zip(names, conjuncts)))


def _conjuncts(code: str) -> list[str]:
    """The top-level conjuncts (`&`) of generated boolean code, as their text."""
    found, todo = [], [py.parse(code, mode="eval").body]
    while todo:
        node = todo.pop()
        if isinstance(node, py.BinOp) and isinstance(node.op, py.BitAnd):
            todo += [node.right, node.left]
        else:
            text = py.get_source_segment(code, node)
            assert text is not None  # (a node of the parsed code)
            found.append(text)
    return found


_NEGATED = {py.Lt: py.GtE, py.GtE: py.Lt, py.Gt: py.LtE, py.LtE: py.Gt, py.Eq: py.NotEq,
            py.NotEq: py.Eq}
_SWAPPED = {py.Lt: py.Gt, py.Gt: py.Lt, py.LtE: py.GtE, py.GtE: py.LtE, py.Eq: py.Eq,
            py.NotEq: py.NotEq}
_INT_ARRAYS = {"rec_i", "sc", "s_rank", "s_lower", "s_upper", "s_length"}


def _negations(conjuncts: list[str], ints: set[str]) -> dict[str, str]:
    """The conjuncts that are comparisons of two ints negating an earlier conjunct, each
    with that one."""
    seen: dict[tuple[str, str, type], str] = {}
    negated = {}
    for code in conjuncts:
        node = py.parse(code, mode="eval").body
        if not (isinstance(node, py.Compare) and len(node.ops) == 1 and
                type(node.ops[0]) in _NEGATED and _is_int(node.left, ints) and
                _is_int(node.comparators[0], ints)):
            continue
        left, right, op = py.dump(node.left), py.dump(node.comparators[0]), type(node.ops[0])
        if left > right:
            left, right, op = right, left, _SWAPPED[op]
        of = seen.get((left, right, _NEGATED[op]))
        if of is not None and of not in negated:
            negated[code] = of
        else:
            seen.setdefault((left, right, op), code)
    return negated


def _is_int(node: py.expr, ints: set[str]) -> bool:
    """Whether generated code is an int for sure (never NaN): an int literal, one of
    `ints`, or a cell of an int array."""
    if isinstance(node, py.Constant):
        return isinstance(node.value, int)
    if isinstance(node, py.Name):
        return node.id in ints
    return isinstance(node, py.Subscript) and isinstance(node.value, py.Name) and \
        node.value.id in _INT_ARRAYS


def _reads_run(code: str) -> bool:
    """Whether a condition reads its run (record `r`), not only the row and its key's row."""
    return any(isinstance(node, py.Name) and node.id == "r"
               for node in py.walk(py.parse(code, mode="eval")))


def _calls_of(gen: Generator, s: int, edges: EdgeLiterals) -> set[str]:
    """The DEFINE functions the edges of state s read."""
    return {name for literals, _, completes in edges for v, _ in literals + (completes or [])
            if (name := _call(gen, v, s)) is not None}


def _outcomes(tables: dict[str, npt.NDArray[np.int64]], gen: Generator, s: int,
              calls: list[str], never: list[tuple[int, int]], edges: EdgeLiterals
              ) -> Iterator[tuple[int, list[int], int]]:
    """For each combination of the calls' values that can hold (`bits`; `never`: the
    pairs of calls that do not hold together), the states a partial match in state s goes
    on in and how many matches it completes."""
    st_final = tables["st_final"].tolist()
    bit = {name: j for j, name in enumerate(calls)}
    for bits in range(1 << len(calls)):
        if any(bits >> a & 1 and bits >> b & 1 for a, b in never):
            continue

        def holds(literals: list[Literal], bits: int = bits) -> bool:
            for v, want in literals:
                name = _call(gen, v, s)
                if name is not None and bool(bits >> bit[name] & 1) != want:
                    return False
            return True

        goes, done = [], 0
        for literals, target, completes in edges:
            if not holds(literals):
                continue
            if st_final[target] == 1:
                done += 1
            else:
                goes.append(target)
                done += completes is not None and holds(completes)
        yield bits, goes, done


def _call(gen: Generator, v: int, s: int) -> str | None:
    """The DEFINE function of variable v in state s (None: v has no DEFINE, it holds)."""
    return gen.define_names[(v, s)] if v in gen.defined else None


# the orders of two operands a comparison holds in: a < b, a == b, a > b
_ORDERS = {py.Lt: {"<"}, py.LtE: {"<", "="}, py.Gt: {">"}, py.GtE: {">", "="},
           py.Eq: {"="}, py.NotEq: {"<", ">"}}
_FLIP = {"<": ">", ">": "<", "=": "="}


def exclusive_pairs(calls: list[str], defs: dict[str, str]) -> list[tuple[int, int]]:
    """The pairs of calls (by index) that never hold together (the module docstring)."""
    facts = [_comparisons(defs[name]) for name in calls]
    pairs = []
    for a in range(len(calls)):
        for b in range(a + 1, len(calls)):
            if any(operands == other and not orders & others
                   for operands, orders in facts[a] for other, others in facts[b]):
                pairs.append((a, b))
    return pairs


def _comparisons(code: str) -> list[tuple[tuple[str, str], set[str]]]:
    """The comparisons among the top-level conjuncts (`&`, `and`) of generated boolean
    code, each as its operands (in a canonical order, as code) and the orders it holds
    in."""
    found = []
    todo = [py.parse(code, mode="eval").body]
    while todo:
        node = todo.pop()
        if isinstance(node, py.BinOp) and isinstance(node.op, py.BitAnd):
            todo += [node.left, node.right]
        elif isinstance(node, py.BoolOp) and isinstance(node.op, py.And):
            todo += node.values
        elif isinstance(node, py.Compare) and len(node.ops) == 1 and \
                type(node.ops[0]) in _ORDERS:
            left, right = py.dump(node.left), py.dump(node.comparators[0])
            orders = _ORDERS[type(node.ops[0])]
            if left > right:
                left, right, orders = right, left, {_FLIP[o] for o in orders}
            found.append(((left, right), set(orders)))
    return found
