"""What a MATCH_RECOGNIZE record keeps (`Record`) and the code of DEFINEs, TAKEs and
MEASURES over it (`Generator`): expressions in SQL's three-valued logic with Java's integer
arithmetic, attributes and aggregates as columns kept incrementally. Code is generated
from the checked AST only (`cep_core.compiler.expressions`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum

from cep_core import ast
from cep_core.checked import CheckedQuery, ExprType
from cep_core.compiler.expressions import FALSE, Code, ExpressionCompiler, StringConstants
from cep_core.compiler.recognize_automaton import (
    MAX_OFFSET,
    Facts,
    RecognizeUnsupported,
    decide,
)
from cep_core.kernels import recognize_runtime as rt
from cep_core.schema import AttrType

A = ast.AggFunc
INT, FLOAT = AttrType.INT, AttrType.FLOAT  # how a record column stores a value
# a cell of a record, run or key row in generated code: `array[row, column]`
CELL = re.compile(r"\b(rec_i|rec_f|ph|pf|key_i)\[([^\[\],]+), (\d+|c_)\]")



class Tag(StrEnum):
    """What a record column keeps (the first item of its key, `Record`); MIN and MAX are
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


@dataclass
class MeasureSpec:
    name: str
    kind: str  # output kind: "int", "float", "string", "bool", "timestamp"
    nullable: bool


RecKey = tuple[str | int | None, ...]  # what a record column keeps (`Record`)


class Record:
    """The columns of a record beyond the fixed ones (`rt.REC_FIXED`), by key:
    (CNT, var), (LAST, var, attr, k), (FIRST, var, attr, k), (SUM|MIN|MAX, var, attr),
    (FIDX|LIDX, var) (`Tag`s); var None means all the match's rows."""

    def __init__(self, kinds: dict[str, str]) -> None:
        self.kinds = kinds  # attribute -> storage kind
        self.ints: dict[RecKey, int] = {(Tag.CNT, None): rt.COUNT}
        self.floats: dict[RecKey, int] = {}
        self.kind_of: dict[RecKey, str] = {(Tag.CNT, None): INT}
        self.aliases: dict[RecKey, RecKey] = {}  # columns kept as one (`Runs.aliases`)
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

    def __init__(self, gen: Generator, var: str | None):
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


class Generator:
    def __init__(self, checked: CheckedQuery, variables: list[str]):
        self.checked = checked
        self.schema = checked.schema
        self.variables = variables
        self.columns: list[str] = []
        self.rec = Record({})
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
        """Code generated meanwhile is a DEFINE's (`Record.key_row`)."""
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
    return [] if test == FALSE else [f"if {test}:", *indent(body)]


def indent(lines: list[str], depth: int = 1) -> list[str]:
    return ["    " * depth + line for line in lines]


def alloc(handle: str) -> list[str]:
    """`handle` := a free record, from the free list or the pool's unused rows (the kernel
    checked before the row that the pool has room)."""
    return ["if free_top > 0:", "    free_top -= 1", f"    {handle} = free[free_top]",
            "else:", f"    {handle} = high", "    high += 1"]
