"""WINDOW queries -> kernel inputs: shared WHERE predicates (generated numba) and plans.

A WINDOW query's WHERE is split into its top-level conjuncts. Each distinct conjunct
(identical AST structure and constants: `canonical`) is one *predicate*, evaluated once per
event for every query that has it (CQPH's shared selection): its kernel writes one bit per
event into a row of the batch's predicate matrix, and a query's selection is the AND of
its rows.

Predicate kernels are generated from the AST by `ExpressionCompiler` with number literals
turned into parameters (`ki[0]`, `kf[1]`; strings are `sc[i]` already), so conjuncts that
differ only in constants (`volume > 100` / `volume > 500`) share one compiled kernel:
queries added at run time usually compile nothing. A predicate over a single string
attribute is also evaluated once per dictionary code into a table (`dense`), and per event
it is a table look-up.

Everything else about a query (window kind and size, aggregates, output items) is data for
the one pane kernel in `cep_core/engine/window_kernels.py`: `WindowPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt

from cep_core import ast
from cep_core.checked import CheckedQuery, Types, select_name
from cep_core.compiler.expressions import (
    STRING_TABLE_PARAMS,
    Code,
    ExpressionCompiler,
    StringConstants,
)
from cep_core.compiler.modules import load_module
from cep_core.compiler.programs import once_per_query
from cep_core.kernels import window_kernels as wk
from cep_core.schema import AttrType, StreamSchema

_T = TypeVar("_T")

# a conjunct's structure and constants (`canonical`): nested tuples of plain values
Key: TypeAlias = tuple[object, ...]

# ---------------------------------------------------------------- predicates


def conjuncts(where: ast.Expr | None) -> list[ast.Expr]:
    """The top-level conjuncts of a WHERE (none for no WHERE), duplicates removed."""
    if where is None:
        return []
    found: list[ast.Expr] = []
    keys: set[Key] = set()

    def split(expr: ast.Expr) -> None:
        if isinstance(expr, ast.Binary) and expr.op is ast.BinaryOp.AND:
            split(expr.left)
            split(expr.right)
        elif canonical(expr) not in keys:
            keys.add(canonical(expr))
            found.append(expr)

    split(where)
    return found


class _Canonical(ast.Visitor):
    """The structure of an expression with its constants: equal for identical conjuncts."""

    def visit_Literal(self, node: ast.Literal) -> Key:
        return ("lit", type(node.value).__name__, node.value)

    def visit_Attr(self, node: ast.Attr) -> Key:
        return ("attr", node.var, node.name)

    def visit_Unary(self, node: ast.Unary) -> Key:
        return ("unary", node.op, self.visit(node.operand))

    def visit_Binary(self, node: ast.Binary) -> Key:
        return ("binary", node.op, self.visit(node.left), self.visit(node.right))

    def visit_InList(self, node: ast.InList) -> Key:
        return ("in", node.negated, self.visit(node.operand),
                tuple(self.visit(o) for o in node.options))

    def visit_Call(self, node: ast.Call) -> Key:
        return ("call", node.name.lower(), tuple(self.visit(a) for a in node.args))

    def generic_visit(self, node: ast.Node) -> Key:
        raise TypeError(f"{type(node).__name__} cannot appear in a WINDOW WHERE")


canonical = _Canonical().visit


class _Leaves:
    """WHERE leaves: attributes of the current event, read from column parameters `c<k>`
    (k: the attribute's position in the schema)."""

    def __init__(self, attributes: list[str]):
        self.position = {name: k for k, name in enumerate(attributes)}
        self.used: dict[str, int] = {}

    def attr(self, node: ast.Attr) -> Code:
        k = self.position[node.name]
        self.used[node.name] = k
        return Code(f"c{k}[i]")

    def aggregate(self, node: ast.Aggregate) -> Code:
        raise TypeError("aggregates cannot appear in a WINDOW WHERE")

    def window_aggregate(self, node: ast.WindowAggregate) -> Code:
        raise TypeError("window aggregates cannot appear in a WINDOW WHERE")


class _TemplateCompiler(ExpressionCompiler):
    """Number literals become parameters, so the code depends on structure only; AND, OR
    and IN are evaluated without branches (`&`, `|`: every operand is a bool and compiled
    expressions never fail, so short-circuiting is not needed), which lets the per-event
    loop run without mispredicted jumps."""

    def __init__(self, leaves: _Leaves, constants: StringConstants, types: Types):
        super().__init__(leaves, constants, types)
        self.ints: list[int] = []
        self.floats: list[float] = []

    def visit_Literal(self, node: ast.Literal) -> Code:
        value = node.value
        if isinstance(value, bool) or isinstance(value, str):
            return super().visit_Literal(node)
        if isinstance(value, int):
            self.ints.append(value)
            return Code(f"ki[{len(self.ints) - 1}]")
        self.floats.append(float(value))
        return Code(f"kf[{len(self.floats) - 1}]")

    # Deliberately like cep_core/compiler/expressions.py's and cep_core/compiler/recognize.py's
    # condition: this one is over whole columns (numpy's &), expressions.py's over scalars
    # (and); recognize.py's keeps its own (three-valued logic, its own parentheses)
    def condition(self, expr: ast.Expr | None) -> str:
        if expr is None:
            return "True"
        code = self.compile(expr)
        return code.value if not code.nullable else f"((not {code.null}) & {code.value})"

    def visit_Binary(self, node: ast.Binary) -> Code:
        if node.op in (ast.BinaryOp.AND, ast.BinaryOp.OR):
            left, right = self.condition(node.left), self.condition(node.right)
            return Code(f"({left} {'&' if node.op is ast.BinaryOp.AND else '|'} {right})")
        return super().visit_Binary(node)

    def visit_InList(self, node: ast.InList) -> Code:
        operand = self.compile(node.operand)
        options = [self.compile(option) for option in node.options]
        tests = " | ".join(f"({operand.value} == {o.value})" for o in options)
        found = f"({tests})" if not node.negated else f"(not ({tests}))"
        if not operand.nullable:
            return Code(found)
        return Code(f"((not {operand.null}) & {found})")


_PREDICATE = '''
@njit(cache=True)
def predicate(out, n, {columns}ki, kf, sc, {tables}):
    """Bit i of out[i >> 6]: whether event i satisfies the conjunct."""
    nw = (n + 63) >> 6
    for w in range(nw):
        first = w << 6
        m = np.uint64(0)
        for b in range(min(64, n - first)):
            i = first + b
            m |= np.uint64({condition}) << np.uint64(b)
        out[w] = m
'''


@dataclass
class CompiledPredicate:
    """One WHERE conjunct: its kernel, the columns it reads (in parameter order) and its
    constants. `dense`: the string attribute it alone reads (evaluated per code)."""

    key: Key
    source: str
    columns: list[str]
    ints: npt.NDArray[np.int64]
    floats: npt.NDArray[np.float64]
    constants: StringConstants
    dense: str | None
    uses_tables: bool
    kernel: Any = field(repr=False, default=None)  # a numba dispatcher


def compile_predicate(expr: ast.Expr, schema: StreamSchema, types: Types) -> CompiledPredicate:
    """`types`: the checked query's (`CheckedQuery.types`)."""
    attributes = list(schema.attributes)
    leaves = _Leaves(attributes)
    constants = StringConstants()
    compiler = _TemplateCompiler(leaves, constants, types)
    condition = compiler.condition(expr)
    used = sorted(leaves.used.items(), key=lambda item: item[1])
    source = _PREDICATE.format(columns="".join(f"c{k}, " for _, k in used),
                               tables=STRING_TABLE_PARAMS, condition=condition)
    columns = [name for name, _ in used]
    dense = (columns[0] if len(columns) == 1 and schema.attributes[columns[0]] == AttrType.STRING
             else None)
    return CompiledPredicate(
        key=canonical(expr), source=source, columns=columns,
        ints=np.array(compiler.ints or [0], dtype=np.int64),
        floats=np.array(compiler.floats or [0.0], dtype=np.float64),
        constants=constants, dense=dense,
        uses_tables=any(f"s_{t}[" in condition for t in ("rank", "lower", "upper", "length")),
        kernel=load_module(source).predicate)


# ---------------------------------------------------------------- plans


def aggregate_attr(node: ast.Aggregate) -> str | None:
    """The attribute an aggregate reads (None: count(*)); count(price) is parsed as
    Attr(name="", var="price")."""
    if node.arg is None:
        return None
    if node.arg.name == "" and node.arg.var is not None:
        return node.arg.var
    return node.arg.name


# how to read an output item from a result row (see WindowPlan)
OutputHow: TypeAlias = (tuple[wk.Output] | tuple[wk.Output, int]
                         | tuple[wk.Output, int, AttrType])


@dataclass
class WindowPlan:
    """What the pane kernel needs to know about one WINDOW query.

    `int_accs`/`float_accs`: (kind, column) of the int64 / float64 pane accumulators
    (kinds in window_kernels: I_*, F_*); `exact_sums`: float columns summed exactly.
    `items`: (output name, how to read it from a result row: window_kernels.Output and its
    fields): (COUNT,), (INT, a, decode kind), (FLOAT, a), (XSUM, a), (AVG_INT, a),
    (AVG_X, a), (KEY, position in GROUP BY), (END,)."""

    name: str
    rows: bool
    slide: int
    range: int
    panes: int
    window_attr: str | None  # time windows: the attribute giving window time
    group_by: list[str]
    where: list[ast.Expr]
    int_accs: list[tuple[int, str]]
    float_accs: list[tuple[int, str]]
    exact_sums: list[str]
    items: list[tuple[str, OutputHow]]

    def config(self, nconj: int) -> npt.NDArray[np.int64]:
        cfg = np.zeros(wk.CF_SIZE, dtype=np.int64)
        cfg[wk.CF_MODE] = wk.MODE_ROWS if self.rows else wk.MODE_TIME
        cfg[wk.CF_SLIDE] = self.slide
        cfg[wk.CF_PANES] = self.panes
        cfg[wk.CF_RANGE] = self.range
        cfg[wk.CF_NCONJ] = nconj
        return cfg


def plan(checked: CheckedQuery) -> WindowPlan:
    body = checked.query.body
    if not isinstance(body, ast.WindowQuery):
        raise TypeError(f"query {checked.name} is not a WINDOW query")
    schema = checked.schema
    window = body.window
    if isinstance(window, ast.RowWindow):
        rows, slide, size, window_attr = True, window.slide, window.rows, None
    else:
        rows = False
        slide, size = checked.time_units(window.slide), checked.time_units(window.range)
        window_attr = window.attr or schema.time
    group_by = [a.name for a in body.group_by]
    int_accs: list[tuple[int, str]] = []
    float_accs: list[tuple[int, str]] = []
    exact_sums: list[str] = []

    def slot(table: list[_T], entry: _T) -> int:
        if entry not in table:
            table.append(entry)
        return table.index(entry)

    items: list[tuple[str, OutputHow]] = []
    for item in body.items:
        name, expr = select_name(item), item.expr
        if isinstance(expr, ast.Attr):
            if expr.name in group_by:
                items.append((name, (wk.Output.KEY, group_by.index(expr.name))))
            else:  # the window attribute: its value is the window end
                items.append((name, (wk.Output.END,)))
            continue
        assert isinstance(expr, ast.Aggregate)  # the checker admits attributes and aggregates
        func, attr = expr.func, aggregate_attr(expr)
        kind = None if attr is None else schema.attributes[attr]
        A = ast.AggFunc
        if func is A.COUNT:  # batches hold no nulls: count(attr) = count(*)
            items.append((name, (wk.Output.COUNT,)))
            continue
        assert attr is not None  # the parser takes `*` in count only
        if func in (A.SUM, A.AVG):
            if kind == AttrType.FLOAT:
                a = slot(exact_sums, attr)
                items.append((name, (wk.Output.XSUM if func is A.SUM else wk.Output.AVG_X, a)))
            else:
                a = slot(int_accs, (wk.I_SUM, attr))
                items.append((name, (wk.Output.INT, a, AttrType.INT) if func is A.SUM
                              else (wk.Output.AVG_INT, a)))
        elif func in (A.MIN, A.MAX):
            if kind == AttrType.FLOAT:
                a = slot(float_accs, (wk.F_MIN if func is A.MIN else wk.F_MAX, attr))
                items.append((name, (wk.Output.FLOAT, a)))
            elif kind == AttrType.STRING:
                a = slot(int_accs, (wk.I_SMIN if func is A.MIN else wk.I_SMAX, attr))
                items.append((name, (wk.Output.INT, a, AttrType.STRING)))
            else:
                a = slot(int_accs, (wk.I_MIN if func is A.MIN else wk.I_MAX, attr))
                items.append((name, (wk.Output.INT, a, AttrType.INT)))
        else:
            raise TypeError(f"{func.value} is not a WINDOW aggregate")
    return WindowPlan(name=checked.name, rows=rows, slide=slide, range=size,
                      panes=size // slide, window_attr=window_attr, group_by=group_by,
                      where=conjuncts(body.where), int_accs=int_accs, float_accs=float_accs,
                      exact_sums=exact_sums, items=items)


@dataclass(frozen=True, eq=False)
class WindowProgram:
    """A compiled WINDOW query: its plan and a compiled predicate per WHERE conjunct (in
    `plan.where` order), built once per checked query and shared by the engines that run
    it (`cep_core.engine.window`)."""

    checked: CheckedQuery
    plan: WindowPlan
    predicates: tuple[CompiledPredicate, ...]


@once_per_query
def compile_window(checked: CheckedQuery) -> WindowProgram:
    plan_ = plan(checked)
    predicates = tuple(compile_predicate(expr, checked.schema, checked.types)
                       for expr in plan_.where)
    return WindowProgram(checked, plan_, predicates)
