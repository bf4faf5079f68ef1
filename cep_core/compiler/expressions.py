"""Checked expression AST -> numba-compatible Python expression text.

Code generation works from the checked AST only: identifiers in the output are made up here
(`c3`, `sc`, ...), numbers are written with `repr` of the parsed int/float, and strings
never appear — a string value is its int64 code in the stream's `StringDictionary`, string
literals are read from the constants array `sc`, and what needs the text of a string
(ordering, lower/upper/length) reads per-code tables (`StringTables`).

Each compiled expression is a `Code`: its value and a flag that is true when the value is
null (see `cep_core/reference/expr.py` for the null rules every engine follows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from cep_core import ast
from cep_core.batch import StringDictionary
from cep_core.checked import ExprType, Types
# the generators take STRING_TABLE_PARAMS from here
from cep_core.kernels.string_tables import STRING_TABLE_PARAMS as STRING_TABLE_PARAMS

FALSE = "False"


@dataclass(frozen=True)
class Code:
    value: str
    null: str = FALSE

    @property
    def nullable(self) -> bool:
        return self.null != FALSE


def _or(*flags: str) -> str:
    flags = tuple(dict.fromkeys(f for f in flags if f != FALSE))
    if not flags:
        return FALSE
    return flags[0] if len(flags) == 1 else "(" + " or ".join(flags) + ")"


def _not_null(code: Code) -> str:
    return FALSE if not code.nullable else f"(not {code.null})"


class StringConstants:
    """The string literals of a query, in order; kernels read their codes from `sc`."""

    def __init__(self) -> None:
        self.values: list[str] = []

    def index(self, value: str) -> int:
        if value not in self.values:
            self.values.append(value)
        return self.values.index(value)

    def codes(self, strings: StringDictionary) -> npt.NDArray[np.int64]:
        return np.array([strings.code(v) for v in self.values] or [0], dtype=np.int64)



B = ast.BinaryOp
F = ast.Builtin
_COMPARE = {B.EQ: "==", B.NE: "!=", B.LT: "<", B.LE: "<=", B.GT: ">", B.GE: ">="}


class Leaves(Protocol):
    """What attributes and aggregates are in the kernel being generated: code over names
    the kernel defines."""

    def attr(self, node: ast.Attr) -> Code: ...

    def aggregate(self, node: ast.Aggregate) -> Code: ...

    def window_aggregate(self, node: ast.WindowAggregate) -> Code: ...


class ExpressionCompiler(ast.Visitor):
    """Compiles expressions; what attributes and aggregates are is up to `leaves`.

    `leaves` has `attr(node) -> Code`, `aggregate(node) -> Code` and
    `window_aggregate(node) -> Code`, each returning code over names the kernel defines.
    `types` is the checked query's (`CheckedQuery.types`).
    """

    def __init__(self, leaves: Leaves, constants: StringConstants, types: Types):
        # Any: a subclass calls more of its own leaves' methods (MATCH_RECOGNIZE's prev)
        self.leaves: Any = leaves
        self.constants = constants
        self.types = types

    def compile(self, expr: ast.Expression) -> Code:
        code: Code = self.visit(expr)
        return code

    # Deliberately like cep_core/compiler/window.py's and cep_core/compiler/recognize.py's
    # condition: those are over whole columns (numpy's &), this one over scalars (and)
    def condition(self, expr: ast.Expr | None) -> str:
        """A boolean expression that is False where the value would be null."""
        if expr is None:
            return "True"
        code = self.compile(expr)
        return code.value if not code.nullable else f"({_not_null(code)} and {code.value})"

    # ------------------------------------------------------------ leaves

    def visit_Literal(self, node: ast.Literal) -> Code:
        value = node.value
        if isinstance(value, bool):
            return Code("True" if value else "False")
        if isinstance(value, str):
            return Code(f"sc[{self.constants.index(value)}]")
        return Code(repr(value))  # an int or float the parser built: never query text

    def visit_Attr(self, node: ast.Attr) -> Code:
        code: Code = self.leaves.attr(node)
        return code

    def visit_Aggregate(self, node: ast.Aggregate) -> Code:
        code: Code = self.leaves.aggregate(node)
        return code

    def visit_WindowAggregate(self, node: ast.WindowAggregate) -> Code:
        code: Code = self.leaves.window_aggregate(node)
        return code

    # ------------------------------------------------------------ operators

    def visit_Unary(self, node: ast.Unary) -> Code:
        operand = self.compile(node.operand)
        if node.op is ast.UnaryOp.NOT:
            return Code(f"(not {operand.value})")
        return Code(f"(-{operand.value})", operand.null)

    def visit_Binary(self, node: ast.Binary) -> Code:
        if node.op.is_logical:
            tests = self.condition(node.left), self.condition(node.right)
            return Code(f"({tests[0]} {node.op.lower()} {tests[1]})")
        left, right = self.compile(node.left), self.compile(node.right)
        if node.op.is_comparison:
            a, b = left.value, right.value
            if self.types[node.left] is ExprType.STRING and node.op not in (B.EQ, B.NE):
                a, b = f"s_rank[{a}]", f"s_rank[{b}]"
            guard = _or(left.null, right.null)
            test = f"({a} {_COMPARE[node.op]} {b})"
            return Code(test if guard == FALSE else f"((not {guard}) and {test})")
        null = _or(left.null, right.null)
        a, b = left.value, right.value
        if node.op in (B.ADD, B.SUB, B.MUL):
            return Code(f"({a} {node.op} {b})", null)
        if node.op is B.DIV:
            return Code(f"(({a}) / ({b}) if ({b}) != 0 else np.float64(0.0))",
                        _or(null, f"(({b}) == 0)"))
        if node.op is B.MOD:
            zero = "np.float64(0.0)" if self.types[node] is ExprType.FLOAT else "np.int64(0)"
            return Code(f"(({a}) % ({b}) if ({b}) != 0 else {zero})", _or(null, f"(({b}) == 0)"))
        raise ValueError(f"unknown operator {node.op}")

    def visit_InList(self, node: ast.InList) -> Code:
        operand = self.compile(node.operand)
        options = [self.compile(option) for option in node.options]
        tests = " or ".join(f"({operand.value} == {o.value})" for o in options)
        found = f"({tests})" if not node.negated else f"(not ({tests}))"
        guard = operand.null
        return Code(found if guard == FALSE else f"((not {guard}) and {found})")

    def visit_Call(self, node: ast.Call) -> Code:
        args = [self.compile(arg) for arg in node.args]
        null = _or(*(a.null for a in args))
        v = [a.value for a in args]
        func = node.func
        if func is F.ABS:
            return Code(f"abs({v[0]})", null)
        if func is F.SQRT:
            return Code(f"(math.sqrt({v[0]}) if {v[0]} >= 0 else np.float64(0.0))",
                        _or(null, f"({v[0]} < 0)"))
        if func is F.FLOOR:
            return Code(f"np.int64(math.floor({v[0]}))", null)
        if func is F.CEIL:
            return Code(f"np.int64(math.ceil({v[0]}))", null)
        if func is F.LEAST:
            return Code(f"min({v[0]}, {v[1]})", null)
        if func is F.GREATEST:
            return Code(f"max({v[0]}, {v[1]})", null)
        if func in _STRING_TABLES:
            return Code(f"{_STRING_TABLES[func]}[{v[0]}]", null)
        raise ValueError(f"function {node.name} has no compiled form")


# The functions of a string that read a per-code table (`StringTables`)
_STRING_TABLES = {F.LOWER: "s_lower", F.UPPER: "s_upper", F.LENGTH: "s_length"}
