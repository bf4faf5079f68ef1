"""MATCH_RECOGNIZE queries -> one generated numba module per query, answering as Flink 2.3
does (docs/semantics.md, MATCH_RECOGNIZE), exactly as the reference interpreter
(`cep_core.reference.recognize`) does.

The automaton is the reference's `compile_nfa` (Flink's NFACompiler) from the checked
pattern (`cep_core.recognize_pattern`), flattened into tables: per state its variable and
its edges (TAKE or PROCEED, the variable whose DEFINE must hold, the greedy `unless` set
as a bit mask of variables). Each state has at most one PROCEED edge, so a state's decision
graph is a chain and a computation makes at most `max_takes` new ones per row.

A computation (partial or completed match) is a record: its state, where and when it
started, its last row, its row count and what the DEFINEs and MEASURES read of its rows,
kept incrementally per variable (or over all rows): the last and first few values of an
attribute (`v.a`, `LAST(v.a, k)`, `FIRST(v.a, k)`, `PREV(a)`), SUM, MIN, MAX and the row
count, and for AFTER MATCH SKIP TO FIRST/LAST v the first and last row of v. A DEFINE sees
the record plus the current row as its variable's; MEASURES see the record.

Generated per query: `d<v>_<s>(...)` (the DEFINE of variable number v on the current row,
for a record in automaton state s; `d<v>` where that state tells nothing), `take<n>` (a copy
of a record plus the row as one variable, into one state) and `take_here<n>` (a record plus
the row, in place), `emit` (MEASURES of a released match), and the kernels that run Flink's
NFA over a batch (`kernel`, a chunk of rows at a time grouped by key by `group`) or end
partial matches at a time (`tick`), replaying `java.util.PriorityQueue`'s order
(`cep_core.kernels.recognize_runtime`). The kernel's step of a computation is unrolled
per automaton state (`_step_lines`): the tables are constants there, every condition is
evaluated once, and the last TAKE reuses the computation's record instead of copying it.
The automaton bounds the row counts of a record in each state (`count_facts`: after S of
`S R1+ ...` S has one row and R1 none), so the DEFINEs and TAKEs made for that state
(`_specialise`) have most of their NULL and first-row tests as constants.

That is the computations layout: one record per Flink computation state. A match's rows
are consecutive rows of its partition, so the partial matches of one start have the same
rows, only mapped to other variables; where what the DEFINEs and MEASURES read of them is
the same for all of them (`_runs_plan`: the first row, the row before, what is kept over
all rows), the query gets the runs layout instead: one record (a run) per start, with how
many of its partial matches are in each automaton state, stepped without a branch per state
(`_run_step_lines`), as MATCH's kernel steps a candidate. Both give Flink's answers.

Expressions follow SQL's three-valued logic (a NULL comes from a variable without rows,
PREV before the first row, an aggregate of no rows, a division by zero); int `/` and `%`
and AVG of ints are Java's. What this compiler does not evaluate raises
`RecognizeUnsupported`, naming the construct (`engine_factory` then runs the query on the
interpreter engine).

Code is generated from the checked AST only: identifiers are made up here, numbers come
from `repr` of parsed values, strings are codes (`cep_core.compiler.expressions`).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from cep_core import ast
from cep_core.checked import CheckedQuery, ExprType
from cep_core.compiler.expressions import (
    FALSE,
    STRING_TABLE_PARAMS,
    Code,
    ExpressionCompiler,
    StringConstants,
)
from cep_core.compiler.modules import load_module
from cep_core.compiler.programs import once_per_query
from cep_core.kernels import recognize_runtime as rt
from cep_core.kernels.match_runtime import dtype_of
from cep_core.recognize_pattern import recognize_elements
from cep_core.reference.recognize import PROCEED, State, compile_nfa, number_states
from cep_core.schema import AttrType

A = ast.AggFunc
MAX_OFFSET = 3  # FIRST/LAST(v.a, k): the kernel keeps k + 1 values per variable
MAX_VARIABLES = 62  # variables are bits of an int64 (memo of DEFINE results, `unless`)
INT, FLOAT = AttrType.INT, AttrType.FLOAT  # how a record column stores a value


class Tag(StrEnum):
    """What a record column keeps (the first item of its key, `_Record`); MIN and MAX are
    also the generated code's function names."""

    CNT = "cnt"  # rows of the variable (or of the match)
    LAST = "last"  # LAST(v.a, k)
    FIRST = "first"  # FIRST(v.a, k)
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    FIDX = "fidx"  # the variable's first row (AFTER MATCH SKIP TO FIRST v)
    LIDX = "lidx"  # its last row (SKIP TO LAST v)
    MULT = "mult"  # runs layout: the run's partial matches in an automaton state


class RecognizeUnsupported(ValueError):
    """A MATCH_RECOGNIZE construct the jitted engine does not evaluate (`engine_factory`
    runs the query on the interpreter engine instead, or raises `NotSupportedError`)."""


@dataclass
class MeasureSpec:
    name: str
    kind: str  # output kind: "int", "float", "string", "bool", "timestamp"
    nullable: bool


@dataclass(frozen=True, eq=False)
class RecognizeProgram:
    """A compiled MATCH_RECOGNIZE query: its module and the layout of the arrays its
    kernels work on. Built once per checked query, shared by its engines."""

    checked: CheckedQuery
    module: object
    columns: list[tuple[str, str]]  # (attribute, dtype) of col0, col1, ...
    rec_ints: int  # record widths
    rec_floats: int
    string_columns: list[int]  # int columns of a record that hold string codes
    layout: str  # rt.COMPUTATIONS or rt.RUNS: what a partial match's record stands for
    record: str  # what each record column keeps, as text (a snapshot's must be the same)
    tables: dict[str, np.ndarray]  # the automaton: tr_* per edge, st_* per state
    start_state: int
    max_takes: int
    within: int  # -1: no WITHIN
    measures: list[MeasureSpec]
    outputs: list[str]  # the composite's fields after start_seq (PARTITION BY and MEASURES)
    constants: StringConstants
    uses_tables: bool
    source: str = field(repr=False, default="")


# ---------------------------------------------------------------- the automaton as tables


def _tables(start: State, variables: list[str]) -> tuple[dict[str, np.ndarray], int, int]:
    """Per state: its variable (-1: final), final flag (1: final, 2: PROCEED edges may lead
    there), first edge and edge count; per edge:
    action (1: PROCEED), target, variable (-1: none), `unless` mask. Returns the tables, the
    start state's number and the most TAKE edges one computation can follow on a row."""
    index, states = number_states(start)
    final = [i for i, s in enumerate(states) if s.final]
    if not final:
        raise RecognizeUnsupported("a pattern without a final state")  # compile_nfa makes one
    edges: list[tuple[int, int, int, int]] = []
    st_var, st_final, tr_off, tr_n = [], [], [], []
    for s in states:
        st_var.append(variables.index(s.var) if s.var else -1)
        st_final.append(1 if s.final else 0)
        tr_off.append(len(edges))
        tr_n.append(len(s.transitions))
        proceeds = sum(t.action == PROCEED for t in s.transitions)
        if proceeds > 1:
            raise RecognizeUnsupported("a state with two PROCEED edges")  # never from compile_nfa
        for t in s.transitions:
            var = -1 if t.condition.var is None else variables.index(t.condition.var)
            unless = sum(1 << variables.index(u) for u in set(t.condition.unless))
            edges.append((1 if t.action == PROCEED else 0, index[id(t.target)], var, unless))

    def reaches(s: State) -> bool:  # a PROCEED path to the final state (conditions aside)
        return any(t.action == PROCEED and (t.target.final or reaches(t.target))
                   for t in s.transitions)

    for number, s in enumerate(states):
        if not s.final and reaches(s):
            st_final[number] = 2

    def takes(s: State) -> int:
        return sum(takes(t.target) if t.action == PROCEED else 1 for t in s.transitions)

    tables = {
        "st_var": np.array(st_var, np.int64), "st_final": np.array(st_final, np.int64),
        "tr_off": np.array(tr_off, np.int64), "tr_n": np.array(tr_n, np.int64),
        "tr_act": np.array([e[0] for e in edges] or [0], np.int64),
        "tr_tgt": np.array([e[1] for e in edges] or [0], np.int64),
        "tr_var": np.array([e[2] for e in edges] or [0], np.int64),
        "tr_unl": np.array([e[3] for e in edges] or [0], np.int64),
    }
    return tables, index[id(start)], max(1, max(takes(s) for s in states))


Interval = tuple[int, int | None]  # a row count's bounds: lo (COUNT_CAP: at least that), hi
Facts = dict[str | None, Interval]  # per variable (None: the whole match)
COUNT_CAP = MAX_OFFSET + 2  # above every k a count is compared with (`_Leaves`, `take`)


def _chain(tables: dict[str, npt.NDArray[np.int64]], s: int) -> list[int]:
    """The states whose edges a computation in state s follows on a row: s, then along
    its PROCEED edges (`_step_lines`' walk)."""
    chain = [s]
    while True:
        q = chain[-1]
        proceed = [int(tables["tr_tgt"][e]) for e in _edges_of(tables, q)
                   if tables["tr_act"][e] == 1]
        if not proceed or proceed[0] in chain:
            return chain
        chain.append(proceed[0])


def _edges_of(tables: dict[str, npt.NDArray[np.int64]], q: int) -> range:
    off = int(tables["tr_off"][q])
    return range(off, off + int(tables["tr_n"][q]))


def count_facts(tables: dict[str, npt.NDArray[np.int64]], start: int,
                variables: list[str]) -> list[Facts | None]:
    """Per state, the bounds of each variable's row count (and the match's) in every
    record in that state (None: no record is ever in it). The start computation has no
    rows; a record's state and counts change only where its computation TAKEs a row
    (`take`: the variable of the state whose edge it is and the match gain one row), and a
    PROCEED only moves the walk of a row on. Pruning, release, WITHIN and snapshots move
    handles or copy records whole, so they never put a record in a state with other counts.
    Counts saturate at COUNT_CAP (a fixed point of interval unions)."""
    def add(i: Interval) -> Interval:
        lo, hi = i
        return min(lo + 1, COUNT_CAP), None if hi is None or hi >= COUNT_CAP else hi + 1

    facts: list[Facts | None] = [None] * len(tables["st_var"])
    facts[start] = {v: (0, 0) for v in [None, *variables]}
    work = [start]
    while work:
        s = work.pop()
        here = facts[s]
        assert here is not None
        for q in _chain(tables, s):
            var = int(tables["st_var"][q])
            for e in _edges_of(tables, q):
                if tables["tr_act"][e] == 1:
                    continue
                after = dict(here)
                after[None] = add(here[None])
                if var >= 0:
                    after[variables[var]] = add(here[variables[var]])
                tg = int(tables["tr_tgt"][e])
                old = facts[tg]
                joined = after if old is None else {v: _join(old[v], after[v]) for v in old}
                if joined != old:
                    facts[tg] = joined
                    work.append(tg)
    return facts


def _join(a: Interval, b: Interval) -> Interval:
    hi = None if a[1] is None or b[1] is None else max(a[1], b[1])
    return min(a[0], b[0]), hi


def _completed_facts(tables: dict[str, npt.NDArray[np.int64]],
                     facts: list[Facts | None]) -> Facts | None:
    """The bounds of a completed match's counts: it is a record a TAKE put in the final
    state, or a copy of one in a state whose PROCEED edges reach it (`st_final` 2)."""
    joined: Facts | None = None
    for s, known in enumerate(facts):
        if known is not None and tables["st_final"][s] != 0:
            joined = known if joined is None else {v: _join(joined[v], known[v])
                                                   for v in joined}
    return joined


def decide(interval: Interval | None, op: str, k: int) -> bool | None:
    """`count op k` for every count in the interval (True or False), or None: not known."""
    if interval is None:
        return None
    assert 0 <= k < COUNT_CAP
    lo, hi = interval
    if op == "==":
        if lo == hi == k:
            return True
        return False if k < lo or (hi is not None and k > hi) else None
    test = _COMPARE[op]
    at_hi = test(hi, k) if hi is not None else op in (">", ">=")  # unbounded: large
    return at_hi if test(lo, k) == at_hi else None


_COMPARE = {"<=": operator.le, "<": operator.lt, ">": operator.gt, ">=": operator.ge}


# ---------------------------------------------------------------- what a record keeps


RecKey = tuple[str | int | None, ...]  # what a record column keeps (`_Record`)


class _Record:
    """The columns of a record beyond the fixed ones (`rt.REC_FIXED`), by key:
    (CNT, var), (LAST, var, attr, k), (FIRST, var, attr, k), (SUM|MIN|MAX, var, attr),
    (FIDX|LIDX, var) (`Tag`s); var None means all the match's rows."""

    def __init__(self, kinds: dict[str, str]) -> None:
        self.kinds = kinds  # attribute -> storage kind
        self.ints: dict[RecKey, int] = {(Tag.CNT, None): rt.COUNT}
        self.floats: dict[RecKey, int] = {}
        self.kind_of: dict[RecKey, str] = {(Tag.CNT, None): INT}
        self.aliases: dict[RecKey, RecKey] = {}  # columns kept as one (`_Runs.aliases`)
        # runs layout: columns a DEFINE reads of its key's row `kr` (the row before), not
        # of the run's; `defining` while a DEFINE's code is generated
        self.key_row: set[RecKey] = set()
        self.defining = False

    def col(self, key: RecKey, kind: str = INT) -> tuple[str, int]:
        key = self.aliases.get(key, key)
        if key not in self.kind_of:
            self.kind_of[key] = kind
            if kind == FLOAT:
                self.floats[key] = len(self.floats)
            else:
                self.ints[key] = len(rt.REC_FIXED) + len(self.ints) - 1
        return ("rec_f", self.floats[key]) if key in self.floats else ("rec_i", self.ints[key])

    def read(self, key: RecKey, kind: str = INT, row: str = "r") -> str:
        if self.defining and self.aliases.get(key, key) in self.key_row:
            row = "kr"
        array, column = self.col(key, kind)
        code = f"{array}[{row}, {column}]"
        return f"({code} != 0)" if kind == AttrType.BOOL else code

    def count(self, var: str | None, row: str = "r") -> str:
        return self.read((Tag.CNT, var), INT, row)

    # What is known of the record's counts where code is being generated for records in one
    # automaton state (`count_facts`; None: nothing): a count test it decides is a constant.
    facts: Facts | None = None

    def count_test(self, var: str | None, op: str, k: int, row: str = "r") -> str:
        """`count(var) op k` as code: "True" or "False" where the facts decide it."""
        known = decide(self.facts[var] if self.facts is not None else None, op, k)
        return f"({self.count(var, row)} {op} {k})" if known is None else str(known)

    def count_value(self, var: str | None, row: str = "r") -> str:
        """The count as code: a number where the facts know it."""
        lo, hi = self.facts[var] if self.facts is not None else (0, None)
        return str(lo) if lo == hi else self.count(var, row)


# ---------------------------------------------------------------- expressions


class _Compiler(ExpressionCompiler):
    """Three-valued boolean logic and Java's integer arithmetic (the reference's
    `RecognizeEvaluator`); PREV, MATCH_ROWTIME, IS NULL and COALESCE."""

    # Deliberately like cep_core/compiler/window.py's and cep_core/compiler/expressions.py's
    # condition: each compiler's generated code is its own (window.py's over whole columns,
    # expressions.py's over scalars, this one's with the value in parentheses too)
    def condition(self, expr: ast.Expr | None) -> str:
        if expr is None:
            return "True"
        code = self.compile(expr)
        if code.null == TRUE:
            return FALSE
        return code.value if not code.nullable else f"((not {code.null}) & ({code.value}))"

    def visit_Unary(self, node: ast.Unary) -> Code:
        operand = self.compile(node.operand)
        if node.op is ast.UnaryOp.NOT:
            return Code(f"(not {operand.value})", operand.null)
        return Code(f"(-{operand.value})", operand.null)

    def visit_Binary(self, node: ast.Binary) -> Code:
        op = node.op
        if op in (ast.BinaryOp.AND, ast.BinaryOp.OR):
            p, q = self.compile(node.left), self.compile(node.right)
            bit = "&" if op == ast.BinaryOp.AND else "|"  # both sides evaluated: no branch
            if not p.nullable and not q.nullable:
                return Code(f"(({p.value}) {bit} ({q.value}))")
            # AND: false when either is known false; OR: true when either is known true
            want = "not " if op == ast.BinaryOp.AND else ""
            decided = (f"(((not {p.null}) & ({want}({p.value}))) | "
                       f"((not {q.null}) & ({want}({q.value}))))")
            null = f"((not {decided}) & (({p.null}) | ({q.null})))"
            return Code(f"(not {decided})" if want else decided, null)
        if op in (ast.BinaryOp.DIV, ast.BinaryOp.MOD):
            left, right = self.compile(node.left), self.compile(node.right)
            null = _or(left.null, right.null, f"(({right.value}) == 0)")
            ints = all(self.types[x] == ExprType.INT for x in (node.left, node.right))
            x, y = left.value, right.value
            if ints:
                name = "jdiv" if op is ast.BinaryOp.DIV else "jmod"
                return Code(f"{name}({x}, {y})", null)
            if op is ast.BinaryOp.DIV:
                return Code(f"(({x}) / ({y}) if ({y}) != 0 else np.float64(0.0))", null)
            return Code(f"(({x}) % ({y}) if ({y}) != 0 else np.float64(0.0))", null)
        if op in ("=", "!=", "<", "<=", ">", ">="):
            left, right = self.compile(node.left), self.compile(node.right)
            a, b = left.value, right.value
            if self.types[node.left] == ExprType.STRING and op not in ("=", "!="):
                a, b = f"s_rank[{a}]", f"s_rank[{b}]"
            py = {"=": "==", "!=": "!="}.get(op, op)
            return Code(f"({a} {py} {b})", _or(left.null, right.null))
        return super().visit_Binary(node)

    def visit_InList(self, node: ast.InList) -> Code:
        operand = self.compile(node.operand)
        tests = []
        for option in node.options:
            o = self.compile(option)
            test = f"({operand.value} == {o.value})"
            tests.append(test if not o.nullable else f"((not {o.null}) & {test})")
        found = "(" + " | ".join(tests) + ")"
        return Code(found if not node.negated else f"(not {found})", operand.null)

    def visit_Call(self, node: ast.Call) -> Code:
        name = node.name.upper()
        if name == "PREV":
            prev: Code = self.leaves.prev(node, self)
            return prev
        if name == "MATCH_ROWTIME":
            rowtime: Code = self.leaves.rowtime()
            return rowtime
        if name == "MATCH_PROCTIME":  # the machine's clock when the kernel was called
            return Code("pt")
        if name not in _FUNCTIONS:
            raise RecognizeUnsupported(f"function {node.name}()")
        if name == "IS_NULL":
            return Code(self.compile(node.args[0]).null)
        if name == "COALESCE":
            codes = [self.compile(arg) for arg in node.args]
            codes = [c for c in codes[:-1] if c.null != TRUE] + codes[-1:]  # always NULL
            value = codes[-1].value
            for c in reversed(codes[:-1]):
                value = f"({c.value} if not {c.null} else {value})" if c.nullable else c.value
            nulls = []
            for c in codes:
                if not c.nullable:
                    return Code(value)
                nulls.append(c.null)
            return Code(value, "(" + " & ".join(f"({n})" for n in nulls) + ")")
        return super().visit_Call(node)


def _pick(test: str, then: str, otherwise: str) -> str:
    """`then if test else otherwise` as code (one of them where the test is a constant)."""
    return then if test == TRUE else otherwise if test == FALSE else \
        f"({then} if {test} else {otherwise})"


TRUE = "True"  # a NULL flag of what is always NULL (a count test the automaton decides)
_FUNCTIONS = ("IS_NULL", "COALESCE", "ABS", "SQRT", "FLOOR", "CEIL", "LEAST", "GREATEST",
              "LOWER", "UPPER", "LENGTH")


def _or(*flags: str) -> str:
    flags = tuple(dict.fromkeys(f for f in flags if f != FALSE))
    if not flags:
        return FALSE
    if TRUE in flags:
        return TRUE
    return flags[0] if len(flags) == 1 else "(" + " | ".join(f"({f})" for f in flags) + ")"


class _Leaves:
    """Attributes and aggregates as code over record `r` and, in a DEFINE of `var`, the
    current row (`t` for the time attribute, `a0`, `a1`, ... for the others)."""

    def __init__(self, gen: _Generator, var: str | None):
        self.gen, self.var = gen, var  # var None: MEASURES
        self.in_prev: int | None = None  # inside PREV(..., offset): the offset

    def attr(self, node: ast.Attr) -> Code:
        gen = self.gen
        back = self.in_prev
        if back is not None:  # `back` rows before the current one (DEFINE) or the last
            if self.var is None:
                return self._last(None, node.name, back)
            return Code(gen.value(node.name)) if back == 0 else \
                self._last(None, node.name, back - 1)
        if self.var is not None and node.var in (None, self.var):
            return Code(gen.value(node.name))
        return self._last(node.var, node.name, 0)

    def _last(self, var: str | None, attr: str, k: int) -> Code:
        gen = self.gen
        if k > MAX_OFFSET:
            raise RecognizeUnsupported(f"an offset over {MAX_OFFSET} (LAST/FIRST(..., {k}))")
        kind = gen.kind(attr)
        gen.track(var, attr, Tag.LAST, k)
        value = gen.rec.read((Tag.LAST, var, attr, k), kind)
        return Code(value, gen.rec.count_test(var, "<=", k))

    def aggregate(self, node: ast.Aggregate) -> Code:
        gen, func = self.gen, node.func
        if self.in_prev is not None:
            raise RecognizeUnsupported("an aggregate inside PREV")
        var = node.arg.var if node.arg is not None else None
        if func is A.COUNT and node.arg is not None and node.arg.name == "":
            var = None  # COUNT(price), parsed as var "price": the rows (columns are never NULL)
        here = self.var is not None and var in (None, self.var)  # the current row counts
        test = gen.rec.count_test
        cnt = gen.rec.count_value(var)
        gen.rec.col((Tag.CNT, var))
        if func is A.COUNT:
            return Code(f"({cnt} + 1)" if here else cnt)
        assert node.arg is not None  # the checker: only COUNT(*) has none
        attr = node.arg.name
        kind = gen.kind(attr)
        v = gen.value(attr) if here else ""
        k = node.offset
        if k > MAX_OFFSET:
            raise RecognizeUnsupported(f"an offset over {MAX_OFFSET} ({func.value.upper()}"
                                       f"(..., {k}))")
        if func is A.LAST:
            if not here:
                return self._last(var, attr, k)
            if k == 0:
                return Code(v)
            gen.track(var, attr, Tag.LAST, k - 1)
            return Code(gen.rec.read((Tag.LAST, var, attr, k - 1), kind), test(var, "<", k))
        if func is A.FIRST:
            gen.track(var, attr, Tag.FIRST, k)
            first = gen.rec.read((Tag.FIRST, var, attr, k), kind)
            if not here:
                return Code(first, test(var, "<=", k))
            return Code(_pick(test(var, ">", k), first, v), test(var, "<", k))
        if kind not in (INT, FLOAT) and func in (A.SUM, A.AVG):
            raise RecognizeUnsupported(f"{func.value.upper()} of a {kind}")
        if kind in (AttrType.STRING, AttrType.BOOL) and func in (A.MIN, A.MAX):
            raise RecognizeUnsupported(f"{func.value.upper()} of a {kind}")
        tag = Tag.SUM if func is A.AVG else Tag(func.value)
        gen.track(var, attr, tag, 0)
        stored = gen.rec.read((tag, var, attr), kind)
        if func is A.SUM:
            return Code(f"({stored} + {v})") if here else Code(stored, test(var, "==", 0))
        if func in (A.MIN, A.MAX):
            if not here:
                return Code(stored, test(var, "==", 0))
            return Code(_pick(test(var, "==", 0), v, f"{func.value}({stored}, {v})"))
        if func is A.AVG:
            total, n = (f"({stored} + {v})", f"({cnt} + 1)") if here else (stored, cnt)
            null = FALSE if here else test(var, "==", 0)
            if kind == INT:
                return Code(f"jdiv({total}, max({n}, 1))", null)
            return Code(f"({total} / max({n}, 1))", null)
        raise RecognizeUnsupported(f"{func.value.upper()}(...)")

    def window_aggregate(self, node: ast.WindowAggregate) -> Code:
        raise RecognizeUnsupported("a window aggregate")  # the grammar has none here

    def prev(self, node: ast.Call, compiler: _Compiler) -> Code:
        if self.in_prev is not None:
            raise RecognizeUnsupported("PREV inside PREV")
        offset = 1
        if len(node.args) > 1:
            arg = node.args[1]
            if not isinstance(arg, ast.Literal) or not isinstance(arg.value, int) or \
                    isinstance(arg.value, bool) or not 0 <= arg.value <= MAX_OFFSET + 1:
                raise RecognizeUnsupported(f"PREV with an offset other than 0..{MAX_OFFSET + 1}")
            offset = arg.value
        self.in_prev = offset
        try:
            return compiler.compile(node.args[0])
        finally:
            self.in_prev = None

    def rowtime(self) -> Code:
        return Code("now" if self.var is None else "t")  # DEFINE: the current row's time


class _Generator:
    def __init__(self, checked: CheckedQuery, variables: list[str]):
        self.checked = checked
        self.schema = checked.schema
        self.variables = variables
        self.columns: list[str] = []
        self.rec = _Record({})
        # (var, attr) -> {(Tag.LAST, k), (Tag.FIRST, k), ...}
        self.tracked: dict[tuple[str | None, str], set[tuple[Tag, int]]] = {}
        self.constants = StringConstants()
        self.defined: set[int] = set()  # numbers of the variables with a DEFINE
        # per automaton state (`count_facts`), and the generated functions the step of a
        # record in a state calls (`_specialise`): DEFINE (variable, state) -> name,
        # TAKE (state, variable, target) -> names of its copying and in-place forms
        self.facts: list[Facts | None] = []
        self.define_names: dict[tuple[int, int], str] = {}
        # the code of the DEFINEs evaluated on a record in each state
        self.state_defines: dict[int, list[str]] = {}
        self.take_names: dict[tuple[int, int, int], tuple[str, str]] = {}

    def kind(self, attr: str) -> AttrType:
        kind = self.schema.attributes[attr]
        return INT if kind == AttrType.TIMESTAMP else kind

    def value(self, attr: str) -> str:
        if attr == self.schema.time:
            return "t"
        if attr not in self.columns:
            self.columns.append(attr)
        return f"a{self.columns.index(attr)}"

    def track(self, var: str | None, attr: str, what: Tag, k: int) -> None:
        self.value(attr)  # `take` reads it from the row
        self.tracked.setdefault((var, attr), set()).add((what, k))
        self.rec.col((Tag.CNT, var))
        kind = self.kind(attr)
        if what in (Tag.LAST, Tag.FIRST):
            for j in range(k + 1):  # LAST shifts through 0..k; FIRST k needs only k
                if what is Tag.LAST or j == k:
                    self.rec.col((what, var, attr, j), kind)
        else:
            self.rec.col((what, var, attr), FLOAT if kind == FLOAT else INT)

    def compiler(self, var: str | None) -> _Compiler:
        return _Compiler(_Leaves(self, var), self.constants, self.checked.types)

    @contextmanager
    def defining(self) -> Iterator[None]:
        """Code generated meanwhile is a DEFINE's (`_Record.key_row`)."""
        self.rec.defining = True
        try:
            yield
        finally:
            self.rec.defining = False

    @contextmanager
    def knowing(self, facts: Facts | None) -> Iterator[None]:
        """Code generated meanwhile is for records with these counts (`count_facts`)."""
        self.rec.facts = facts
        try:
            yield
        finally:
            self.rec.facts = None

    def take_lines(self, number: int, state: int) -> list[str]:
        """Record `dst` := record `src` plus the current row as variable `number` (-1:
        none), in automaton state `state`: its first row's fields where it had none, updates
        of what is kept over all rows, then of the variable's own."""
        S = rt
        test = self.rec.count_test
        lines = [f"rec_i[dst, {S.STATE}] = {state}",
                 *_when(test(None, "==", 0, "dst"), [f"rec_i[dst, {S.START}] = idx",
                                                     f"rec_i[dst, {S.START_TS}] = t",
                                                     f"rec_i[dst, {S.START_SEQ}] = sq"])]
        for var in [None] if number < 0 else [None, self.variables[number]]:
            for (tvar, attr), wants in self.tracked.items():
                if tvar != var:
                    continue
                v = self.value(attr)
                lasts = sorted(k for what, k in wants if what is Tag.LAST)
                for k in range(max(lasts) if lasts else -1, 0, -1):
                    lines.append(f"{self.rec.read((Tag.LAST, var, attr, k), INT, 'dst')} = "
                                 f"{self.rec.read((Tag.LAST, var, attr, k - 1), INT, 'dst')}")
                if lasts:
                    lines.append(f"{self.rec.read((Tag.LAST, var, attr, 0), INT, 'dst')} = {v}")
                for what, k in sorted(wants):
                    if what is Tag.FIRST:
                        ref = self.rec.read((Tag.FIRST, var, attr, k), INT, "dst")
                        lines += _when(test(var, "==", k, "dst"), [f"{ref} = {v}"])
                    elif what is Tag.SUM:
                        ref = self.rec.read((Tag.SUM, var, attr), INT, "dst")
                        lines.append(f"{ref} += {v}")
                    elif what in (Tag.MIN, Tag.MAX):
                        ref = self.rec.read((what, var, attr), INT, "dst")
                        either = _pick(test(var, "==", 0, "dst"), v, f"{what}({ref}, {v})")
                        lines.append(f"{ref} = {either}")
            for key in ((Tag.FIDX, var), (Tag.LIDX, var)):
                if key in self.rec.kind_of:
                    ref = self.rec.read(key, INT, "dst")
                    if key[0] is Tag.FIDX:
                        lines += _when(test(var, "==", 0, "dst"), [f"{ref} = idx"])
                    else:
                        lines.append(f"{ref} = idx")
            if var is not None and (Tag.CNT, var) in self.rec.kind_of:
                lines.append(f"{self.rec.count(var, 'dst')} += 1")
        return lines + [f"rec_i[dst, {S.LAST_IDX}] = idx",
                        f"rec_i[dst, {S.LAST_SEQ}] = sq",
                        f"rec_i[dst, {S.COUNT}] += 1"]


def _when(test: str, body: list[str]) -> list[str]:
    """`if test:` and the body, or the body alone, or nothing (a constant test)."""
    if test == TRUE:
        return body
    return [] if test == FALSE else [f"if {test}:", *_indent(body)]


def _indent(lines: list[str], depth: int = 1) -> list[str]:
    return ["    " * depth + line for line in lines]


Generated = tuple["_Generator", dict[str, str], dict[str, tuple[bool, list[str]]], list[str],
                  list[MeasureSpec]]


def _generate(checked: CheckedQuery, variables: list[str],
              tables: dict[str, npt.NDArray[np.int64]], start: int,
              runs: _Runs | None = None, completed_facts: bool = True) -> Generated:
    """The code of the query's DEFINEs (per state, `_specialise`), TAKEs and MEASURES; in
    the runs layout, with the record columns `runs` keeps as one, those of the row before
    read by DEFINEs at the key's row."""
    body = checked.query.body
    assert isinstance(body, ast.RecognizeQuery)
    gen = _Generator(checked, variables)
    if runs is not None:
        gen.rec.aliases, gen.rec.key_row = runs.aliases(), set(runs.columns(first=False))
        for key, kind in runs.columns_first():
            gen.rec.col(key, kind)
    defines = {d.name: d.condition for d in body.defines}
    dfn = {}  # variable number -> its DEFINE (the body of d<number>)
    for number, var in enumerate(variables):
        if var in defines:
            with gen.defining():
                dfn[number] = gen.compiler(var).condition(defines[var])
    gen.defined = set(dfn)

    gen.facts = count_facts(tables, start, variables)
    measures: list[MeasureSpec] = []
    emit = []
    # what is known of a completed match's counts: the runs layout's plan needs the MEASURES
    # without the count tests it decides; the computations layout numbers its columns as
    # the releases before (their snapshots restore) without it
    with gen.knowing(_completed_facts(tables, gen.facts) if completed_facts else None):
        for j, item in enumerate(body.measures):
            code = gen.compiler(None).compile(item.expr)
            kind = checked.types[item.expr] or "int"
            measures.append(MeasureSpec(item.name, kind, code.nullable))
            emit.append(f"e{j}[no] = {code.value}")
            if code.nullable:
                emit.append(f"e{j}n[no] = {code.null}")
    if body.skip in (ast.SkipTo.FIRST, ast.SkipTo.LAST):
        gen.rec.col((Tag.CNT, body.skip_var))
        gen.rec.col((Tag.FIDX if body.skip is ast.SkipTo.FIRST else Tag.LIDX, body.skip_var))
    defs, take = _specialise(gen, tables, defines, dfn)
    return gen, defs, take, emit, measures


@once_per_query
def compile_recognize(checked: CheckedQuery) -> RecognizeProgram:
    """The program of a checked MATCH_RECOGNIZE query (generated and loaded once, then
    shared); `RecognizeUnsupported` for what the jitted engine does not evaluate."""
    body = checked.query.body
    if not isinstance(body, ast.RecognizeQuery):
        raise TypeError(f"query {checked.name} is not a MATCH_RECOGNIZE query")
    if getattr(body, "then_by", None):
        raise RecognizeUnsupported("ORDER BY with columns after the time attribute")
    elements = recognize_elements(body.pattern)
    variables = [e.var for e in elements]
    if len(variables) > MAX_VARIABLES:
        raise RecognizeUnsupported(f"more than {MAX_VARIABLES} pattern variables")
    nfa = compile_nfa(elements)
    tables, start, max_takes = _tables(nfa.start, variables)
    gen, defs, take, emit, measures = _generate(checked, variables, tables, start)
    runs = _runs_plan(gen, tables, start, body.skip, emit)
    if runs is not None:  # again, in the runs layout's columns
        gen, defs, take, emit, measures = _generate(checked, variables, tables, start, runs)
        for t in runs.states:
            gen.rec.col((Tag.MULT, t))
    else:
        gen, defs, take, emit, measures = _generate(checked, variables, tables, start,
                                                    completed_facts=False)

    outputs = [a.name for a in checked.query.partition_by] + [m.name for m in measures]
    if body.select is not None:
        wanted = {a.name for a in body.select}
        outputs = [name for name in outputs if name in wanted]
    within = checked.time_units(body.within) if body.within is not None else -1
    rec_ints, rec_floats = len(rt.REC_FIXED) + len(gen.rec.ints) - 1, max(1, len(gen.rec.floats))
    if runs is not None:  # the columns `_Runs.columns_first` numbered first
        used = runs.columns_first()
        rec_ints = len(rt.REC_FIXED) + sum(kind != FLOAT for _, kind in used)
        rec_floats = max(1, sum(kind == FLOAT for _, kind in used))
    source = _module_source(gen, body, tables, start, max_takes, defs, take, emit, measures,
                            runs, (rec_ints, rec_floats))
    if runs is not None:
        _check_columns(source, rec_ints, rec_floats)
    module = load_module(source)
    uses_tables = any(f"{t}[" in source for t in STRING_TABLE_PARAMS.split(", "))
    kept = set(gen.rec.ints.values())  # the runs layout's: a run's and its key row's
    if runs is not None:
        ints, _, key_ints, _ = _run_columns(gen, runs)
        kept = ints | key_ints
    string_columns = [column for key, column in gen.rec.ints.items()
                      if len(key) > 2 and key[0] in (Tag.LAST, Tag.FIRST, Tag.MIN, Tag.MAX)
                      and isinstance(key[2], str) and gen.kind(key[2]) == AttrType.STRING
                      and column in kept]
    return RecognizeProgram(
        checked=checked, module=module,
        columns=[(a, dtype_of(gen.kind(a))) for a in gen.columns],
        rec_ints=rec_ints, rec_floats=rec_floats, string_columns=string_columns,
        layout=rt.COMPUTATIONS if runs is None else rt.RUNS,
        record=" ".join(sorted(f"{'/'.join(map(str, key))}={kind}{column}" for kinds, kind in
                               ((gen.rec.ints, INT), (gen.rec.floats, FLOAT))
                               for key, column in kinds.items())),
        tables=tables, start_state=start, max_takes=max_takes, within=within,
        measures=measures, outputs=outputs, constants=gen.constants,
        uses_tables=uses_tables, source=source)


def _specialise(gen: _Generator, tables: dict[str, npt.NDArray[np.int64]],
                defines: dict[str, ast.Expr], dfn: dict[int, str]
                ) -> tuple[dict[str, str], dict[str, tuple[bool, list[str]]]]:
    """The DEFINEs and TAKEs the kernel's step calls, each generated for the records of
    one automaton state, where what `count_facts` knows of their counts makes count tests
    constants (the same text for several states: one function). Returns the DEFINE bodies
    and the TAKE bodies (with whether it copies `src` first) by function name, and fills
    in gen.define_names and gen.take_names."""
    st_final, st_var = tables["st_final"].tolist(), tables["st_var"].tolist()
    tr_act, tr_tgt = tables["tr_act"].tolist(), tables["tr_tgt"].tolist()
    tr_var, tr_unl = tables["tr_var"].tolist(), tables["tr_unl"].tolist()
    defs: dict[str, str] = {}
    named: dict[str, str] = {}  # DEFINE body -> its function
    takes: dict[str, tuple[bool, list[str]]] = {}
    take_named: dict[str, tuple[str, str]] = {}  # TAKE body -> its functions

    def tested(e: int) -> list[int]:  # the variables whose DEFINEs edge e's condition reads
        return ([tr_var[e]] if tr_var[e] >= 0 else []) + \
            [w for w in range(len(gen.variables)) if (tr_unl[e] >> w) & 1]

    for s, facts in enumerate(gen.facts):
        if facts is None or st_final[s] == 1:
            continue  # never a partial match's state
        wanted: set[int] = set()
        for q in _chain(tables, s):
            for e in _edges_of(tables, q):
                wanted.update(tested(e))
                if tr_act[e] == 1:
                    continue
                tg = tr_tgt[e]
                for r in _chain(tables, tg):  # whether tg PROCEEDs to the final state
                    wanted.update(w for e2 in _edges_of(tables, r) if tr_act[e2] == 1
                                  for w in tested(e2))
                with gen.knowing(facts):
                    body = gen.take_lines(st_var[q], tg)
                text = "\n".join(body)
                if text not in take_named:
                    n = len(take_named)
                    take_named[text] = (f"take{n}", f"take_here{n}")
                    takes[f"take{n}"], takes[f"take_here{n}"] = (True, body), (False, body)
                gen.take_names[(s, st_var[q], tg)] = take_named[text]
        for v in sorted(wanted & set(dfn)):
            var = gen.variables[v]
            with gen.knowing(facts), gen.defining():
                condition = gen.compiler(var).condition(defines[var])
            gen.state_defines.setdefault(s, []).append(condition)
            if condition not in named:
                named[condition] = f"d{v}" if condition == dfn[v] else f"d{v}_{s}"
                defs[named[condition]] = condition
            gen.define_names[(v, s)] = named[condition]
    return defs, takes


@dataclass(frozen=True)
class _Runs:
    """The runs layout of a query's partial matches (`_runs_plan`)."""

    states: list[int]  # the automaton states a run's partial matches can be in
    firsts: list[RecKey]  # LAST(v.a)/FIRST(v.a) columns read as the match's first row's
    lasts: list[RecKey]  # LAST(v.a) columns read as the row before the current one
    kinds: dict[RecKey, str]  # those and what is kept over all rows, by storage kind

    def columns_first(self) -> list[tuple[RecKey, str]]:
        """The columns a run and its key's row use, to be numbered before any other (which
        only the computations layout's code uses): a run's counts, what it keeps of its
        first row and over all rows, then the row before."""
        aliases = self.aliases()
        keys: list[tuple[RecKey, str]] = [((Tag.MULT, t), INT) for t in self.states]
        keys += [(aliases[k], self.kinds[k]) for k in self.firsts]
        keys += [(k, kind) for k, kind in self.kinds.items() if k[1] is None]
        keys += [(aliases[k], self.kinds[k]) for k in self.lasts]
        return list(dict(keys).items())

    def aliases(self) -> dict[RecKey, RecKey]:
        """A run keeps each attribute of the first row and of the row before once: these
        columns of the computations layout are those (var ROW)."""
        return {**{key: (Tag.FIRST, ROW, key[2], 0) for key in self.firsts},
                **{key: (Tag.LAST, ROW, key[2], 0) for key in self.lasts}}

    def columns(self, first: bool) -> list[RecKey]:
        """The columns a run keeps of its first row (`first`), or those of the row before,
        which its key's row keeps for all its runs."""
        keys = self.firsts if first else self.lasts
        return sorted(set(self.aliases()[key] for key in keys), key=str)


ROW = "*"  # the variable of a run's columns of a row (no pattern variable's name)


def _runs_plan(gen: _Generator, tables: dict[str, npt.NDArray[np.int64]], start: int,
               skip: ast.SkipTo, emit: list[str]) -> _Runs | None:
    """Whether the query can keep its partial matches as runs (rt.RUNS): one record per
    start with how many of its partial matches are in each automaton state (a MULT column
    each), since what the DEFINEs and MEASURES read of a record is the same for all the
    partial matches of one start. None: it cannot (rt.COMPUTATIONS).

    A match's rows are consecutive rows of its partition, so two partial matches of one
    start have the same rows, only mapped to other variables. They read alike what is kept
    over all rows (var None), and a variable's FIRST or LAST where that is the match's
    first row (every first TAKE is v's and, for LAST, v has one row in the reading state)
    or, for LAST(v.a), the last row (every TAKE into the reading state is v's). Count tests
    `count_facts` decides read nothing; any other read (a variable's count, LAST(v.a, 1),
    SUM(v.a), the rows of v for AFTER MATCH SKIP TO) keeps the computations layout."""
    if skip in (ast.SkipTo.FIRST, ast.SkipTo.LAST):
        return None
    st_var, st_final = tables["st_var"].tolist(), tables["st_final"].tolist()
    tr_act, tr_tgt = tables["tr_act"].tolist(), tables["tr_tgt"].tolist()
    names = gen.variables
    entering: dict[int, set[str]] = {}  # state -> the variables of the TAKEs into it
    for s, facts in enumerate(gen.facts):
        if facts is None or st_final[s] == 1:
            continue
        for q in _chain(tables, s):
            for e in _edges_of(tables, q):
                if tr_act[e] == 0:
                    entering.setdefault(tr_tgt[e], set()).add(names[st_var[q]])
    first = {names[st_var[q]] for q in _chain(tables, start) for e in _edges_of(tables, q)
             if tr_act[e] == 0}
    completed = _completed_facts(tables, gen.facts)
    readers = [(code, entering[s], gen.facts[s]) for s, code in gen.state_defines.items()
               if s in entering]  # (the start computation's record 0 is all zeros)
    readers.append((emit, set().union(*[v for t, v in entering.items() if st_final[t]]),
                    completed))
    ways: dict[RecKey, set[Tag]] = {}  # how a column reads alike: as FIRST or as LAST
    for code, last, facts in readers:
        assert facts is not None
        for key in _reads(gen, code):
            tag, var = key[0], key[1]
            if var is None and tag in (Tag.CNT, Tag.LAST, Tag.FIRST, Tag.SUM, Tag.MIN,
                                       Tag.MAX):
                continue
            if tag not in (Tag.LAST, Tag.FIRST) or key[3] != 0:
                return None
            assert isinstance(var, str)
            here = set()
            if first == {var} and (tag is Tag.FIRST or facts[var] == (1, 1)):
                here.add(Tag.FIRST)
            if tag is Tag.LAST and last == {var}:
                here.add(Tag.LAST)
            ways[key] = ways.get(key, here) & here
            if not ways[key]:
                return None
    states = sorted(t for t in entering if st_final[t] != 1)
    firsts = sorted((key for key, way in ways.items() if Tag.FIRST in way), key=str)
    lasts = sorted((k for k in ways if k not in firsts), key=str)
    kinds = {key: gen.rec.kind_of[key] for key in firsts + lasts}
    kinds |= {key: kind for key, kind in gen.rec.kind_of.items()
              if key[1] is None and key != (Tag.CNT, None)}  # kept over all rows
    return _Runs(states, firsts, lasts, kinds)


_COLUMN = re.compile(r"\b(rec_i|rec_f|ph|pf)\[[^\[\],]+, (\d+)\]")
_CELL = re.compile(r"\b(rec_i|rec_f|ph|pf|key_i)\[([^\[\],]+), (\d+|c_)\]")


def _flat_cells(lines: list[str], flat: dict[str, tuple[str, int]]) -> list[str]:
    """`lines` with each cell `array[row, column]` of an array in `flat` (its flat view's
    name and its rows' width) as `view[U((row) * width + column)]`: numba then neither
    wraps a negative index nor multiplies by a stride it reads from the array (records,
    key rows and columns are never negative; 1.07-1.09x on the M-shape in either layout)."""
    def cell(m: re.Match[str]) -> str:
        if m[1] not in flat:
            return m[0]
        view, width = flat[m[1]]
        assert m[3] == "c_" or int(m[3]) < width, f"column {m[3]} of {m[1]}: past {width}"
        return f"{view}[U(({m[2]}) * {width} + {m[3]})]"
    return [_CELL.sub(cell, line) for line in lines]


def _check_columns(source: str, ints: int, floats: int) -> None:
    """The runs layout's records are `ints`/`floats` columns wide: its code reads and
    writes none beyond (a column a plan missed is a compiler bug, not a wrong answer)."""
    for array, column in _COLUMN.findall(source):
        width = floats if array in ("rec_f", "pf") else ints
        assert int(column) < width, f"column {column} of {array}: past {width}"


_READ = re.compile(r"rec_([if])\[r, (\d+)\]")


def _reads(gen: _Generator, code: list[str]) -> set[RecKey]:
    """The record columns `code` reads of record `r`, by key (a fixed column but the
    count: ("fixed",), which no `_runs_plan` test allows)."""
    keys = {("i", column): key for key, column in gen.rec.ints.items()}
    keys.update({("f", column): key for key, column in gen.rec.floats.items()})
    return {keys.get(found, ("fixed",)) for text in code for found in
            ((array, int(column)) for array, column in _READ.findall(text))}


def emit_args(measures: list[MeasureSpec]) -> list[str]:
    """The output arrays of MEASURES, after out_key, out_start, out_end."""
    args = []
    for j, m in enumerate(measures):
        args.append(f"e{j}")
        if m.nullable:
            args.append(f"e{j}n")
    return args


def kernel_args(program: RecognizeProgram) -> list[str]:
    """The kernel's array parameters (after its scalars), in order; `tick` takes the
    same minus the batch and its scratch (kid, seq, ts, columns, order, g_*, counts,
    out_row, dead)."""
    ncols = len(program.columns)
    columns = [f"col{j}" for j in range(ncols)]
    grouped = ["g_kid", "g_seq", "g_ts"] + [f"g{j}" for j in range(ncols)]
    return (["kid", "seq", "ts"] + columns + ["order"] + grouped + ["counts"] + STATE_ARGS +
            ["out_key", "out_start", "out_end"] + emit_args(program.measures) +
            ["out_row", "dead"])


STATE_ARGS = rt.STATE_ARGS
# the runs layout's loop over a key's runs on a row (`_run_step_lines`): what it takes
# before the row's values and the string tables
RUNS_STEP = "phf, pff, lp, lq, pb, npart, kr, idx, sq"


def _copy(src: str | None, dst: str, gen: _Generator, src_arrays: str = "rec_i, rec_f",
          dst_arrays: str = "rec_i, rec_f") -> list[str]:
    """Record `dst` := record `src`, column by column (no slices: no array views made), of
    the int and float arrays named (the runs layout's runs are rows of `ph, pf`). `src`
    None: the start computation's record 0 as its TAKE reads it, zeros (its START, NEVER,
    is written by every TAKE from it), as constants: the compiler cannot tell record 0
    from `dst`, so copying it is a load and a store per column."""
    si, sf = src_arrays.split(", ") if src is not None else ("", "")
    di, df = dst_arrays.split(", ")
    ints, floats = ("0", "0.0") if src is None else (f"{si}[{src}, c_]", f"{sf}[{src}, c_]")
    lines = [f"for c_ in range({len(rt.REC_FIXED) + len(gen.rec.ints) - 1}):",
             f"    {di}[{dst}, c_] = {ints}"]
    if gen.rec.floats:
        lines += [f"for c_ in range({len(gen.rec.floats)}):",
                  f"    {df}[{dst}, c_] = {floats}"]
    return lines


Walk = tuple[int, list[str], list[tuple[int, int]]]  # (state, code, its TAKEs: var, target)


def _walks(tables: dict[str, npt.NDArray[np.int64]], gen: _Generator, row: str,
           tab: str) -> list[Walk]:
    """Per state a partial match can be in, the code that evaluates every condition of its
    step on record `c` as it is (each DEFINE once, memoized in `m<v>`: -1 not yet, 0 false,
    1 true): which TAKE edges fire (`f<i>`) and whether each target PROCEEDs to the final
    state (`r<i>`), and the TAKEs in the walk's order. Flink's decision graph: a state has
    one PROCEED edge at most, so its depth-first walk is a chain (the state's edges in
    order, then those of the state its open PROCEED edge leads to) known here, with every
    table read a constant."""
    st_var, st_final = tables["st_var"].tolist(), tables["st_final"].tolist()
    tr_n = tables["tr_n"].tolist()
    tr_act, tr_tgt = tables["tr_act"].tolist(), tables["tr_tgt"].tolist()
    tr_var, tr_unl = tables["tr_var"].tolist(), tables["tr_unl"].tolist()
    nvars = len(gen.variables)
    defined = gen.defined

    source = -1  # the state of the record whose step is being generated

    def holds(v: int) -> list[str]:  # m<v> := the DEFINE of variable v, once
        if v not in defined:
            return [f"m{v} = 1"]
        name = gen.define_names[(v, source)]
        return [f"if m{v} < 0:",
                f"    m{v} = 1 if {name}(rif, rff, c, {row}, {tab}) else 0"]

    def edge_ok(e: int, flag: str, body: list[str]) -> list[str]:
        """`body` where edge e's condition holds (its variable's DEFINE and none of its
        `unless` variables'); `flag` is set False where it does not."""
        v, u = tr_var[e], tr_unl[e]
        tests = [] if v < 0 else [(v, 1)]
        tests += [(w, 0) for w in range(nvars) if (u >> w) & 1]
        lines: list[str] = []
        depth = 0
        for w, want in tests:
            lines += _indent(holds(w), depth)
            lines += _indent([f"if m{w} == {want}:"], depth)
            depth += 1
        lines += _indent(body or ["pass"], depth)
        return lines

    def reaches(tg: int, flag: str) -> list[str]:
        """`flag` := target tg PROCEEDs to the final state (conditions on `c` and the row)."""
        lines: list[str] = []
        depth, q, seen = 0, tg, set()
        while q not in seen:
            seen.add(q)
            proceed = [e for e in _edges_of(tables, q) if tr_act[e] == 1]
            if not proceed:
                break
            [e] = proceed
            nq = tr_tgt[e]
            if st_final[nq] == 1:
                lines += _indent(edge_ok(e, flag, [f"{flag} = True"]), depth)
                break
            inner = edge_ok(e, flag, ["pass"])
            lines += _indent(inner[:-1], depth)  # the chain goes on where the edge holds
            depth += _depth(inner[-1])
            q = nq
        return lines

    takes: list[tuple[int, int]] = []  # (variable of the state taking the row, target)

    def walk(s: int, depth: int, seen: frozenset[int]) -> list[str]:
        assert s not in seen, "a cycle of PROCEED edges"  # never from compile_nfa
        lines: list[str] = []
        follow = None
        for e in _edges_of(tables, s):
            if tr_act[e] == 1:
                follow = e
                continue
            i = len(takes)
            takes.append((st_var[s], tr_tgt[e]))
            body = [f"f{i} = True"]
            if st_final[tr_tgt[e]] == 2:
                body += reaches(tr_tgt[e], f"r{i}")
            lines += edge_ok(e, f"f{i}", body)
        if follow is not None:
            lines += edge_ok(follow, "", walk(tr_tgt[follow], 0, seen | {s}))
        return lines

    branches: list[tuple[int, list[str], list[tuple[int, int]]]] = []
    for s in range(len(st_var)):
        if st_final[s] == 1 or tr_n[s] == 0 or gen.facts[s] is None:
            continue  # no partial match is ever in state s
        takes = []
        source = s
        evaluate = walk(s, 0, frozenset())
        branches.append((s, evaluate, takes))
    return branches


def _step_lines(tables: dict[str, npt.NDArray[np.int64]], gen: _Generator, row: str,
                tab: str, final: int, start: int) -> tuple[list[str], list[str]]:
    """One computation `c` (partial match j of the key's queue) on the current row, its
    code unrolled per state; and the step of the start computation (always the queue's
    last, in the start state: below), which the kernel makes after the loop over the
    others.

    First every condition is evaluated on `c` as it is (`_walks`). Then the TAKEs are made
    in the walk's order, the
    same queue adds as Flink's: each into a new record, except the last, which reuses `c`'s
    (no copy; `c` is dropped after its step anyway) unless `c` is the start computation,
    whose new records are zeroed (`_copy` of None) instead of copied from its record 0.

    A key's queue of partial matches is always sorted by start (its heap then needs no
    sifting): the kernel steps it in order, each computation's new ones start where it did,
    the start computation (start NEVER, always last) adds a match starting on this row
    (after every other) and then itself; pruning keeps the order. So the new queue is
    appended to (`lp`), as Java's PriorityQueue.add would place each one."""
    S = rt
    st_final = tables["st_final"].tolist()
    nvars = len(gen.variables)
    branches = _walks(tables, gen, row, tab)

    def block(s: int, evaluate: list[str], its_takes: list[tuple[int, int]],
              fresh: bool = False) -> list[str]:  # fresh: `c` is the start computation
        n = len(its_takes)
        lines = ["kept = False"]
        lines += [f"f{i} = False" for i in range(n)] + [f"r{i} = False" for i in range(n)]
        lines += evaluate
        for i, (var, tg) in enumerate(its_takes):
            copy, here = gen.take_names[(s, var, tg)]
            later = " or ".join(f"f{j}" for j in range(i + 1, n))
            lines.append(f"if f{i}:")
            act = []
            reuse = f"c != 0 and not ({later})" if later else "c != 0"
            if fresh:
                act += [*_alloc("d"), *_copy(None, "d", gen),
                        f"{here}(rif, rff, d, idx, sq, {row})"]
            else:
                act += [f"if {reuse}:",
                        "    d = c",
                        "    kept = True",
                        f"    {here}(rif, rff, d, idx, sq, {row})",
                        "else:",
                        *_indent(_alloc("d")),
                        f"    {copy}(rif, rff, c, d, idx, sq, {row})"]
            if st_final[tg] == 1:  # a TAKE into the final state: completed now
                act.append("nlc = heap_add(lc, 0, nlc, d, rec_i)")
            else:
                act += ["lp[nlp] = d", "nlp += 1"]
                if st_final[tg] == 2:
                    act += [f"if r{i}:",
                            *_indent(_alloc("m")),
                            *_indent(_copy("d", "m", gen)),
                            f"    rec_i[m, {S.STATE}] = {final}",
                            "    nlc = heap_add(lc, 0, nlc, m, rec_i)"]
            lines += _indent(act)
        return lines

    memo = [f"m{v} = -1" for v in range(nvars)]
    # the partial matches (the queue but its last entry, the start computation)
    step = ["c = ph[pb + j]", f"s = rec_i[c, {S.STATE}]", *memo]
    for number, (s, evaluate, its_takes) in enumerate(branches):
        step.append(f"{'if' if number == 0 else 'elif'} s == {s}:")
        step += _indent(block(s, evaluate, its_takes))
    if not branches:
        step.append("kept = False")
    else:
        step += ["else:", "    kept = False"]
    step += ["if not kept:",
             "    free[free_top] = c",
             "    free_top += 1"]
    # the start computation: its state is the start state, its record 0 (never written)
    first = ["c = 0", *memo]
    for s, evaluate, its_takes in branches:
        if s == start:
            first += block(s, evaluate, its_takes, fresh=True)
    first += ["lp[nlp] = 0", "nlp += 1"]
    return step, first


def _run_step_lines(tables: dict[str, npt.NDArray[np.int64]], gen: _Generator, row: str,
                    tab: str, start: int, runs: _Runs) -> tuple[list[str], list[str]]:
    """`_step_lines` in the runs layout (`_runs_plan`): run `c` (row j of the key's runs in
    `ph`/`pf`) on the current row, and then the start computation, without a branch per
    state: every DEFINE the run's states evaluate is evaluated once (`p<n>`: one per
    generated function, so states whose DEFINEs read alike share it), then each firing TAKE
    edge adds the state's partial matches (`x<s>`) to its target's count (`n<t>`) or to the
    matches completed on this row (`done`), as a sum of products (`_edge_tests`). A run some
    partial match goes on in moves down over the runs that ended (`w`: the key's runs stay
    in order of start, packed) and takes the row there (`run_next`). Every run is written
    at `w`, and `w` steps when it lives, without a branch (a run that ended is written over
    by the next; 1.18x on the M-shape: whether a run lives is a coin toss to the branch
    predictor). Each completed match is a record of the pool, a copy of the run after the
    row (`run_end`; all alike: what MEASURES read is the same for all of them), in the
    completed queue as many times as Flink's has it. Those are made after the runs' loop
    from the runs themselves (where they are: `lq`, how many: `lp`), so a run whose
    partial matches all completed stays until then and leaves after (`gone`: the first
    such run's place). The loop is a function of its own (`step_runs`, `RUNS_STEP`), which
    LLVM inlines into the kernel again: written in the kernel, the same loop ran 1.2x
    slower with one kernel argument fewer (register allocation); written this way it ran at
    its best with `lq` alone (measured, not a guarantee: docs/benchmarks.md)."""
    st_final = tables["st_final"].tolist()
    states = runs.states
    column = {t: gen.rec.col((Tag.MULT, t))[1] for t in states}
    total = " + ".join(f"n{t}" for t in states) or "0"
    ints, floats, _, _ = _run_columns(gen, runs)
    calls: dict[str, str] = {}  # DEFINE function -> its value's local

    def held(v: int, s: int) -> str:
        if v not in gen.defined:
            return "True"
        name = gen.define_names[(v, s)]
        return calls.setdefault(name, f"p{len(calls)}")

    def adds(sources: list[int], weight: dict[int, str]) -> list[str]:
        into: dict[str, list[str]] = {}
        for s in sources:
            def held_here(v: int, s: int = s) -> str:
                return held(v, s)
            for test, tg, completes in _edge_tests(tables, s, held_here):
                target = "done" if st_final[tg] == 1 else f"n{tg}"
                into.setdefault(target, []).append(f"{weight[s]} * ({test})")
                if completes:
                    into.setdefault("done", []).append(f"{weight[s]} * ({test} & {completes})")
        return [f"{target} = " + " + ".join(into.get(target, ["0"]))
                for target in [f"n{t}" for t in states] + ["done"]]

    def copy(src: str, dst: str, arrays: str, int_columns: set[int] = ints) -> list[str]:
        """Run `src`'s columns into `dst` of `arrays` (all of them, or `int_columns`)."""
        di, df = arrays.split(", ")
        return [f"{di}[{dst}, {c}] = ph[{src}, {c}]" for c in sorted(int_columns)] + \
            [f"{df}[{dst}, {c}] = pf[{src}, {c}]" for c in sorted(floats)]

    def complete(src: str, times: str) -> list[str]:
        return [f"for u_ in range({times}):", *_indent(_alloc("m")),
                *_indent(copy(src, "m", "rec_i, rec_f")),
                f"    run_end(rec_i, rec_f, m, idx, sq, {row})",
                "    nlc = heap_add(lc, 0, nlc, m, rec_i)"]

    def after(run: str) -> list[str]:  # `run` took the row: its counts and completed matches
        return [*[f"ph[{run}, {column[t]}] = n{t}" for t in states], "branches += tot"]

    def evaluate(arrays: str, record: str, key_row: str) -> list[str]:
        return [f"{local} = {name}({arrays}, {record}, {key_row}, {row}, {tab})"
                for name, local in calls.items()]

    moved = copy("c", "dw", "ph, pf", ints - set(column.values()))  # (the counts are new)
    body = adds(states, {t: f"x{t}" for t in states})
    take = ["c = pb + 1 + j", *[f"x{t} = ph[c, {column[t]}]" for t in states],
            *evaluate("phf, pff", "c", "kr"), *body, f"tot = {total}"]
    completed = ["if done != 0:", "    lp[ncq] = done", "    lq[ncq] = w", "    ncq += 1",
                 "    if tot == 0 and gone == npart:", "        gone = w"]
    step = ["U = np.uint64", "w = 0", "branches = 0", "ncq = 0", "gone = npart",
            "for j in range(npart):", *_indent(take), "    dw = pb + 1 + w",
            *_indent(moved), *_indent(after("dw")),
            f"    run_next(phf, pff, dw, idx, sq, {row})",
            *_indent(completed), "    w += (tot + done) != 0",
            "return w, branches, ncq, gone"]
    partial_matches = " + ".join(f"ph[c, {column[t]}]" for t in states) or "0"
    leave = ["if gone < npart:  # the runs whose partial matches all completed leave",
             "    live = gone", "    for j in range(gone, w):", "        c = pb + 1 + j",
             f"        if {partial_matches} != 0:", "            dw = pb + 1 + live",
             *_indent(copy("c", "dw", "ph, pf"), 3), "            live += 1", "    w = live"]
    calls.clear()
    body = adds([start], {start: "1"})
    # the start computation: its state is the start state, its record the pool's record 0
    # a new run's columns `run_first` adds to (its row count, SUMs) or reads are zeros
    written = {(a, int(c)) for a, c in _ASSIGN.findall("\n".join(_run_lines(gen, runs, True)))}
    written |= {("i", c) for c in column.values()}
    zero = [f"ph[d, {c}] = 0" for c in sorted(ints) if ("i", c) not in written] + \
        [f"pf[d, {c}] = 0.0" for c in sorted(floats) if ("f", c) not in written]
    first = ["for q_ in range(ncq):", "    c = pb + 1 + lq[q_]",
             *_indent(complete("c", "lp[q_]")), *leave,
             *evaluate("rif, rff", "0", "0"), *body, f"tot = {total}",
             "if tot + done != 0:", "    d = pb + 1 + w", *_indent(zero),
             f"    run_first(phf, pff, d, idx, sq, {row})", *_indent(after("d")),
             *_indent(complete("d", "done")),
             "    if tot != 0:", "        w += 1",
             f"run_key(phf, pff, kr, idx, sq, {row})"]
    return step, first


def _edge_tests(tables: dict[str, npt.NDArray[np.int64]], s: int,
                held: Callable[[int], str]) -> list[tuple[str, int, str | None]]:
    """The TAKE edges a computation in state s follows on a row, in Flink's order (the walk
    of `_walks`), each as (when it fires, its target, when the target PROCEEDs to the final
    state or None where it cannot), the conditions as boolean code of `held(v)`, the value
    of variable v's DEFINE."""
    st_final = tables["st_final"].tolist()
    tr_act, tr_tgt = tables["tr_act"].tolist(), tables["tr_tgt"].tolist()
    tr_var, tr_unl = tables["tr_var"].tolist(), tables["tr_unl"].tolist()

    def ok(e: int) -> list[str]:
        tests = [] if tr_var[e] < 0 else [held(tr_var[e])]
        return tests + [f"(not {held(w)})" for w in range(MAX_VARIABLES)
                        if (tr_unl[e] >> w) & 1]

    def conj(tests: list[str]) -> str:
        return " & ".join(tests) if tests else "True"

    def reaches(tg: int) -> str | None:
        tests: list[str] = []
        q, seen = tg, set()
        while q not in seen:
            seen.add(q)
            proceed = [e for e in _edges_of(tables, q) if tr_act[e] == 1]
            if not proceed:
                return None
            tests += ok(proceed[0])
            q = tr_tgt[proceed[0]]
            if st_final[q] == 1:
                return conj(tests)
        return None

    out: list[tuple[str, int, str | None]] = []

    def walk(q: int, path: list[str], seen: frozenset[int]) -> None:
        for e in _edges_of(tables, q):
            if tr_act[e] == 0:
                tg = tr_tgt[e]
                out.append((conj(path + ok(e)), tg, reaches(tg) if st_final[tg] == 2 else None))
        for e in _edges_of(tables, q):
            if tr_act[e] == 1 and tr_tgt[e] not in seen:
                walk(tr_tgt[e], path + ok(e), seen | {q})

    walk(s, [], frozenset())
    return out


def _run_functions(gen: _Generator, runs: _Runs) -> list[tuple[str, list[str]]]:
    """The runs layout's functions of a record `dst` and the current row (`row`): a run's
    first row, a later one, a completed match's end and the key's row."""
    return [("run_first", _run_lines(gen, runs, True)), ("run_next", _run_lines(gen, runs, False)),
            ("run_end", _run_end_lines(gen, runs)), ("run_key", _row_lines(gen, runs, "dst"))]


def _run_lines(gen: _Generator, runs: _Runs, first: bool) -> list[str]:
    """Run `dst` takes the current row (`first`: its first): what is kept over all the
    match's rows and, on its first, the columns DEFINEs and MEASURES read as the match's
    first row (`_runs_plan`). Not its last row (`run_end` writes it into a completed match)
    nor its row count where nothing reads it before (`run_end` works it out)."""
    everyone: Facts = {v: (0, 0 if first else None) for v in gen.variables}
    everyone[None] = (0, 0) if first else (1, None)
    with gen.knowing(everyone):
        lines = gen.take_lines(-1, 0)[1:]  # not the state: a run's are its MULT counts
    kept = {f"rec_i[dst, {rt.LAST_IDX}] = idx", f"rec_i[dst, {rt.LAST_SEQ}] = sq"}
    if not _run_counts_rows(gen, runs):
        kept.add(f"rec_i[dst, {rt.COUNT}] += 1")
    lines = [line for line in lines if line not in kept]
    for key in runs.columns(first=True) if first else []:
        assert isinstance(key[2], str)
        lines.append(f"{gen.rec.read(key, INT, 'dst')} = {gen.value(key[2])}")
    return lines


def _run_counts_rows(gen: _Generator, runs: _Runs) -> bool:
    """Whether a run keeps its row count (COUNT): a DEFINE reads it, or what a later row
    updates tests it."""
    everyone: Facts = {v: (0, None) for v in gen.variables}
    everyone[None] = (1, None)
    with gen.knowing(everyone):
        lines = gen.take_lines(-1, 0)
    count = f"rec_i[dst, {rt.COUNT}]"
    return any(count in line and line != f"{count} += 1" for line in lines) or \
        any((Tag.CNT, None) in _reads(gen, code) for code in gen.state_defines.values())


def _run_end_lines(gen: _Generator, runs: _Runs) -> list[str]:
    """A completed match `dst` copied from its run (`_run_step_lines`): its last row (the
    current one), its row count where the run does not keep it, and the row's columns the
    MEASURES read (the key's row keeps them for the runs)."""
    S = rt
    lines = [f"rec_i[dst, {S.LAST_IDX}] = idx", f"rec_i[dst, {S.LAST_SEQ}] = sq"]
    if not _run_counts_rows(gen, runs):
        lines.append(f"rec_i[dst, {S.COUNT}] = idx - rec_i[dst, {S.START}] + 1")
    return lines + _row_lines(gen, runs, "dst")


def _row_lines(gen: _Generator, runs: _Runs, dst: str) -> list[str]:
    """Record `dst` := the current row's columns that are read as the row before."""
    lines = []
    for key in runs.columns(first=False):
        assert isinstance(key[2], str)
        lines.append(f"{gen.rec.read(key, INT, dst)} = {gen.value(key[2])}")
    return lines


_ASSIGN = re.compile(r"^rec_([if])\[dst, (\d+)\] = (?!.*\[dst, )", re.M)  # of the row alone
_WRITE = re.compile(r"rec_([if])\[dst, (\d+)\]")


def _run_columns(gen: _Generator, runs: _Runs) -> tuple[set[int], set[int], set[int], set[int]]:
    """The int and float columns of a run (where it started, what `run_first` and
    `run_next` write, its MULT counts), and those of its key's row (`_row_lines`)."""
    S = rt
    ints, floats = {S.START, S.START_TS, S.START_SEQ}, set[int]()
    for array, column in _WRITE.findall("\n".join(_run_lines(gen, runs, True) +
                                                   _run_lines(gen, runs, False))):
        (ints if array == "i" else floats).add(int(column))
    ints |= {gen.rec.col((Tag.MULT, t))[1] for t in runs.states}
    key_ints, key_floats = set[int](), set[int]()
    for array, column in _WRITE.findall("\n".join(_row_lines(gen, runs, "dst"))):
        (key_ints if array == "i" else key_floats).add(int(column))
    return ints, floats, key_ints, key_floats


def _earliest_end(runs: bool) -> list[str]:
    """`advance`'s search for the earliest end of a partial match by WITHIN (`end`), and
    the end of those that end then; it returns where none ends by `ts`."""
    S = rt
    if runs:  # the runs are in order of start, so of start time
        return ["if npart == 0:", f"    return {S.DONE}",
                f"end = ph[pb + 1, {S.START_TS}] + within",
                "if end > ts:", f"    return {S.DONE}",
                f"key_i[k, {S.K_NPART}] = drop_runs(ph, pf, pb + 1, npart, {S.START_TS}, "
                "end - within)"]
    return ["found = False",
            "end = 0",
            "for j in range(npart):",
            "    h = ph[pb + j]",
            "    if h != 0:",
            f"        e = rec_i[h, {S.START_TS}] + within",
            "        if not found or e < end:",
            "            end = e",
            "            found = True",
            "if not found or end > ts:",
            f"    return {S.DONE}",
            f"key_i[k, {S.K_NPART}] = prune(ph, pb, npart, rec_i, {S.START_TS}, "
            "end - within, True, free, ctr)"]


def _alloc(handle: str) -> list[str]:
    """`handle` := a free record, from the free list or the pool's unused rows (the kernel
    checked before the row that the pool has room)."""
    return ["if free_top > 0:", "    free_top -= 1", f"    {handle} = free[free_top]",
            "else:", f"    {handle} = high", "    high += 1"]


def _depth(line: str) -> int:
    """The indentation depth (4 spaces) of a generated line."""
    return (len(line) - len(line.lstrip(" "))) // 4


def _module_source(gen: _Generator, body: ast.RecognizeQuery,
                   tables: dict[str, npt.NDArray[np.int64]], start: int, max_takes: int,
                   dfn: dict[str, str], take: dict[str, tuple[bool, list[str]]],
                   emit: list[str], measures: list[MeasureSpec], runs: _Runs | None,
                   widths: tuple[int, int]) -> str:
    row = ", ".join(["t"] + [f"a{j}" for j in range(len(gen.columns))])

    def flat_body(code: list[str]) -> list[str]:
        """DEFINEs, TAKEs and run functions take their records' arrays as flat views."""
        flat = {"rec_i": ("rec_i", widths[0]), "rec_f": ("rec_f", widths[1])}
        return ["U = np.uint64", *_flat_cells(code, flat)]
    tab = "sc, " + STRING_TABLE_PARAMS + ", pt"  # pt: MATCH_PROCTIME (the call's clock)
    outs = ", ".join(["out_key", "out_start", "out_end"] + emit_args(measures))
    final = int(np.flatnonzero(tables["st_final"] == 1)[0])
    S = rt
    lines = [
        *([] if runs is None else ["from cep_core.kernels.match_runtime import prefetch"]),
        "from cep_core.kernels.recognize_runtime import drop_runs, heap_add, heap_poll, jdiv, "
        "jmod, prune",
        "", "",
        *[line for name, condition in dfn.items() for line in (
            "@njit(cache=True, error_model='numpy')",
            f"def {name}(rec_i, rec_f, r, {'' if runs is None else 'kr, '}{row}, {tab}):",
            *_indent(flat_body([f"return {condition}"])), "", "")],
        *[line for name, (copies, body) in (take.items() if runs is None else [])
          for line in (
            "@njit(cache=True, error_model='numpy')",
            f"def {name}(rec_i, rec_f, {'src, ' if copies else ''}dst, idx, sq, {row}):",
            *_indent(flat_body((_copy("src", "dst", gen) if copies else []) + body)), "", "")],
        *[line for name, code in (_run_functions(gen, runs) if runs is not None else [])
          for line in ("@njit(cache=True, error_model='numpy')",
                       f"def {name}(rec_i, rec_f, dst, idx, sq, {row}):",
                       *_indent((code if name == "run_end" else flat_body(code)) or ["pass"]),
                       "", "")],
        "@njit(cache=True, error_model='numpy')",
        f"def emit(rec_i, rec_f, r, now, no, {outs}, {tab}):",
        *_indent(emit or ["pass"]), "", "",
    ]
    # release: Flink's completed matches leave while none that started earlier is alive
    skip = body.skip
    if skip is ast.SkipTo.PAST_LAST_ROW:
        bound = [f"limit = rec_i[m, {S.LAST_IDX}]", "inclusive = True"]
    elif skip is ast.SkipTo.NEXT_ROW:
        bound = [f"limit = rec_i[m, {S.START}]", "inclusive = True"]
    else:
        which = Tag.FIDX if skip is ast.SkipTo.FIRST else Tag.LIDX
        bound = [f"if {gen.rec.count(body.skip_var, 'm')} == 0:",
                 f"    ctr[{S.ERR_START}] = rec_i[m, {S.START_SEQ}]",
                 f"    ctr[{S.ERR_END}] = rec_i[m, {S.LAST_SEQ}]",
                 f"    return {S.SKIP_MISSING}",
                 f"limit = {gen.rec.read((which, body.skip_var), INT, 'm')}",
                 f"if limit == rec_i[m, {S.START}]:",
                 f"    ctr[{S.ERR_START}] = rec_i[m, {S.START_SEQ}]",
                 f"    ctr[{S.ERR_END}] = rec_i[m, {S.LAST_SEQ}]",
                 f"    return {S.SKIP_FIRST}",
                 "inclusive = False"]
    common = f"key_i, ph, pf, ch, pcap, ccap, rec_i, rec_f, free, ctr, {outs}, {tab}"
    rows = "pcap" if runs is None else "(pcap + 1)"  # a key's rows of `ph`
    if runs is None:  # the queue's first handle: its earliest partial match, or record 0
        earliest = f"rec_i[ph[pb], {S.START}]"
        drop = f"npart = prune(ph, pb, npart, rec_i, {S.START}, limit, inclusive, free, ctr)"
    else:  # the key's first run, the earliest (a key's rows: the key's row, its runs)
        earliest = f"(ph[pb + 1, {S.START}] if npart > 0 else {S.NEVER})"
        drop = f"npart = drop_runs(ph, pf, pb + 1, npart, {S.START}, limit)"  # inclusive
    lines += [
        "@njit(cache=True, error_model='numpy')",
        f"def release(k, now, {common}):",
        f"    pb = k * {rows}",
        "    cb = k * ccap",
        f"    npart = key_i[k, {S.K_NPART}]",
        f"    nc = key_i[k, {S.K_NCOMP}]",
        f"    while nc > 0 and rec_i[ch[cb], {S.START}] <= {earliest}:",
        "        m = ch[cb]",
        "        nc = heap_poll(ch, cb, nc, rec_i)",
        *_indent(bound, 2),
        f"        {drop}",
        f"        nc = prune(ch, cb, nc, rec_i, {S.START}, limit, inclusive, free, ctr)",
        f"        key_i[k, {S.K_NPART}] = npart",
        f"        key_i[k, {S.K_NCOMP}] = nc",
        f"        no = ctr[{S.OUT_N}]",
        "        out_key[no] = k",
        f"        out_start[no] = rec_i[m, {S.START_SEQ}]",
        f"        out_end[no] = rec_i[m, {S.LAST_SEQ}]",
        f"        emit(rec_i, rec_f, m, now, no, {outs}, {tab})",
        f"        ctr[{S.OUT_N}] = no + 1",
        f"        free[ctr[{S.FREE_TOP}]] = m",
        f"        ctr[{S.FREE_TOP}] += 1",
        f"    key_i[k, {S.K_NPART}] = npart",
        f"    key_i[k, {S.K_NCOMP}] = nc",
        f"    return {S.DONE}", "", "",
        # WITHIN: partial matches whose interval ends by `ts` end, in order of their end
        "@njit(cache=True, error_model='numpy')",
        f"def advance(k, ts, within, {common}):",
        f"    pb = k * {rows}",
        "    while True:",
        f"        npart = key_i[k, {S.K_NPART}]",
        *_indent(_earliest_end(runs is not None), 2),
        f"        status = release(k, end, {common})",
        f"        if status != {S.DONE}:",
        "            return status", "", "",
        "@njit(cache=True, error_model='numpy')",
        f"def tick(k0, nkeys, ts, within, pcap, ccap, out_cap, pt, {', '.join(STATE_ARGS)}, "
        f"{outs}):",
        "    for k in range(k0, nkeys):",
        f"        if ctr[{S.OUT_N}] + key_i[k, {S.K_NCOMP}] > out_cap:",
        f"            return {S.FULL_OUTPUT}, k",
        f"        status = advance(k, ts, within, {common})",
        f"        if status != {S.DONE}:",
        "            return status, k",
        f"    return {S.DONE}, nkeys", "", "",
    ]
    cols = ", ".join(f"col{j}" for j in range(len(gen.columns)))

    if runs is None:
        step, first_step = _step_lines(tables, gen, row, tab, final, start)
        queue = ["for j in range(npart - 1):", *_indent(step), *first_step,
                 "for j in range(nlp):", "    ph[pb + j] = lp[j]",
                 f"key_i[k, {S.K_NPART}] = nlp"]
        room = [f"need = npart * {max_takes}",
                "if need + 1 > pcap or ncomp + need > ccap:",
                f"    status = {S.FULL_QUEUE}",
                "    break",
                "if free_top + pool - high < 2 * need:",
                f"    status = {S.FULL_POOL}",
                "    break"]
    else:  # a run's partial matches may each complete on every TAKE edge
        step, first_step = _run_step_lines(tables, gen, row, tab, start, runs)
        runs_flat = {"ph": ("phf", widths[0]), "pf": ("pff", widths[1])}
        lines += ["@njit(cache=True, error_model='numpy')",
                  f"def step_runs({RUNS_STEP}, {row}, {tab}):",
                  *_indent(_flat_cells(step, runs_flat)), "", ""]
        queue = ["kr = pb", f"w, branches, ncq, gone = step_runs({RUNS_STEP}, {row}, {tab})",
                 *first_step, f"key_i[k, {S.K_NPART}] = w",
                 f"key_i[k, {S.K_BRANCHES}] = branches"]
        room = [f"need = (key_i[k, {S.K_BRANCHES}] + 1) * {max_takes}",
                "if npart + 1 > pcap:",
                f"    status = {S.FULL_QUEUE}",
                "    break",
                "if ncomp + need > ccap:",
                f"    status = {S.FULL_COMPLETED}",
                "    break",
                "if free_top + pool - high < need:",
                f"    status = {S.FULL_POOL}",
                "    break"]
    ncols = len(gen.columns)
    grouped = ", ".join(["g_kid", "g_seq", "g_ts"] + [f"g{j}" for j in range(ncols)])
    # a chunk's rows key by key (a key's records stay in the cache), in the computations
    # layout
    by_key = runs is None
    # rows first..last - 1 of a batch, key by key (a stable counting sort; each key's
    # ids are filled in after the rows, in one sequential pass)
    lines += [] if not by_key else [
        "@njit(cache=True, error_model='numpy')",
        f"def group(first, last, nkeys, kid, seq, ts, {cols}{', ' if cols else ''}order, "
        f"{grouped}, start):",
        "    for k in range(nkeys + 1):",
        "        start[k] = 0",
        "    for i in range(first, last):",
        "        start[kid[i] + 1] += 1",
        "    for k in range(nkeys):",
        "        start[k + 1] += start[k]",
        "    for i in range(first, last):",
        "        k = kid[i]",
        "        at = start[k]",
        "        start[k] = at + 1",
        "        order[at] = i",
        "        g_seq[at] = seq[i]",
        "        g_ts[at] = ts[i]",
        *[f"        g{j}[at] = col{j}[i]" for j in range(ncols)],
        "    at = 0",  # start[k]: where key k's rows end
        "    for k in range(nkeys):",
        "        while at < start[k]:",
        "            g_kid[at] = k",
        "            at += 1", "", "",
    ]
    stopping: list[str] = []
    if by_key and skip in (ast.SkipTo.FIRST, ast.SkipTo.LAST):
        # a key whose skip stops the query stops: the other keys go on, so that the batch
        # stops on its first row that stops (the rows are stepped key by key)
        stopping = [f"if status == {S.SKIP_MISSING} or status == {S.SKIP_FIRST}:",
                    f"    if ctr[{S.STOP}] == {S.DONE} or i < ctr[{S.STOP_ROW}]:",
                    f"        ctr[{S.STOP}] = status",
                    f"        ctr[{S.STOP_ROW}] = i",
                    f"        ctr[{S.STOP_START}] = ctr[{S.ERR_START}]",
                    f"        ctr[{S.STOP_END}] = ctr[{S.ERR_END}]",
                    f"    key_i[k, {S.K_LAST_TS}] = {S.NEVER}",
                    f"    status = {S.DONE}",
                    "    p += 1",
                    "    continue"]
    if by_key:
        rows_in = ["if p == 0:",
                   # every key id of the batch is below key_i's length (the engine made them)
                   f"    group(first, last, key_i.shape[0], kid, seq, ts, {cols}"
                   f"{', ' if cols else ''}order, {grouped}, counts)",
                   "while p < last - first:",
                   "    i = order[p]", "    k = g_kid[p]", "    t = g_ts[p]", "    sq = g_seq[p]"]
        loads = [f"a{j} = g{j}[p]" for j in range(ncols)]
    else:  # in their order, as MATCH's kernel (the runs layout: a key's runs are its rows),
        # with the key's row and first run fetched into the cache some rows ahead
        width, fields = widths[0], len(S.KEY_FIELDS)
        rows_in = ["while p < last - first:", "    i = first + p",
                   "    if i + 16 < n:",
                   f"        prefetch(kif, U(kid[U(i + 16)] * {fields}))",
                   "    if i + 8 < n:",
                   f"        prefetch(phf, U((kid[U(i + 8)] * (pcap + 1) + 1) * {width}))",
                   "    k = kid[U(i)]", "    t = ts[U(i)]", "    sq = seq[U(i)]"]
        loads = [f"a{j} = col{j}[U(i)]" for j in range(ncols)]
    kernel = [
        "@njit(cache=True, error_model='numpy')",
        f"def kernel(c0, p0, n, within, pcap, ccap, out_cap, pt, kid, seq, ts, {cols}"
        f"{', ' if cols else ''}order, {grouped}, counts, "
        f"{', '.join(STATE_ARGS)}, {outs}, out_row, dead):",
        "    U = np.uint64",  # flat views of the key rows, the records and a key's runs
        "    kif, rif, rff = key_i.reshape(-1), rec_i.reshape(-1), rec_f.reshape(-1)",
        *([] if by_key else ["    phf, pff = ph.reshape(-1), pf.reshape(-1)"]),
        f"    status = {S.DONE}",
        "    pool = rec_i.shape[0]",
        # the free list's top and the pool's high-water mark in locals (the compiler cannot
        # tell `ctr` from the record arrays), in `ctr` while `advance` or `release` runs
        f"    free_top = ctr[{S.FREE_TOP}]",
        f"    high = ctr[{S.HIGH}]",
        "    first = c0",
        "    p = p0",
        "    while first < n:",
        "        last = min(n, first + len(order))",
        *_indent(rows_in, 2),
        f"            if t < key_i[k, {S.K_LAST_TS}]:",
        f"                dead[ctr[{S.DEAD_N}]] = i",
        f"                ctr[{S.DEAD_N}] += 1",
        "                p += 1",
        "                continue",
        f"            npart = key_i[k, {S.K_NPART}]",
        f"            ncomp = key_i[k, {S.K_NCOMP}]",
        *_indent(room, 3),
        f"            if ctr[{S.OUT_N}] + ncomp + need > out_cap:",
        f"                status = {S.FULL_OUTPUT}",
        "                break",
        *_indent(loads, 3),
        f"            key_i[k, {S.K_LAST_TS}] = t",
        *([f"            o0 = ctr[{S.OUT_N}]"] if by_key else []),
        "            if within >= 0:",
        f"                ctr[{S.FREE_TOP}] = free_top",
        f"                ctr[{S.HIGH}] = high",
        f"                status = advance(k, t, within, {common})",
        f"                free_top = ctr[{S.FREE_TOP}]",
        *_indent(stopping, 4),
        f"                if status != {S.DONE}:",
        "                    break",
        f"            idx = key_i[k, {S.K_ROWS}]",
        f"            npart = key_i[k, {S.K_NPART}]",
        f"            pb = k * {rows}",
        "            nlp = 0",
        "            nlc = 0",
        *_indent(queue, 3),
        "            cb = k * ccap",
        f"            nc = key_i[k, {S.K_NCOMP}]",
        "            for j in range(nlc):",
        "                nc = heap_add(ch, cb, nc, lc[j], rec_i)",
        f"            key_i[k, {S.K_NCOMP}] = nc",
        f"            key_i[k, {S.K_ROWS}] = idx + 1",
        "            if nc > 0:",
        f"                ctr[{S.FREE_TOP}] = free_top",
        f"                ctr[{S.HIGH}] = high",
        f"                status = release(k, t, {common})",
        f"                free_top = ctr[{S.FREE_TOP}]",
        *_indent(stopping, 4),
        f"                if status != {S.DONE}:",
        "                    break",
        *([f"            for q in range(o0, ctr[{S.OUT_N}]):",  # (the rows key by key)
           "                out_row[q] = i"] if by_key else []),
        "            p += 1",
        f"        if status != {S.DONE}:",
        "            break",
        "        first = last",
        "        p = 0",
        f"    ctr[{S.FREE_TOP}] = free_top",
        f"    ctr[{S.HIGH}] = high",
        *([f"    if status == {S.DONE} and ctr[{S.STOP}] != {S.DONE}:",
           f"        ctr[{S.ERR_START}] = ctr[{S.STOP_START}]",
           f"        ctr[{S.ERR_END}] = ctr[{S.STOP_END}]",
           f"        return ctr[{S.STOP}], first, p"] if stopping else []),
        "    return status, first, p", "",
    ]
    flat = {"key_i": ("kif", len(S.KEY_FIELDS))}
    flat.update({"ph": ("phf", widths[0]), "pf": ("pff", widths[1])} if runs is not None else
                {"rec_i": ("rif", widths[0]), "rec_f": ("rff", widths[1])})
    kernel = _flat_cells(kernel, flat)
    # nothing allocates (the engine gives the kernel its scratch): no reference counts kept
    # across calls (numba's atomic increments and decrements of each array argument)
    return "\n".join(lines + kernel).replace(_NJIT, _NJIT[:-1] + ", _nrt=False)")


_NJIT = "@njit(cache=True, error_model='numpy')"
