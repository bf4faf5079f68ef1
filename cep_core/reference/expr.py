"""Expression evaluation for the reference interpreters: plain Python over the checked AST.

Values are Python ints, floats, strings and bools; `None` is the value of an aggregate over
nothing (the min of no events) and of a division by zero. Rules every engine follows:

- arithmetic with None gives None; `/` is true division (always float); `%` follows Python
  (the result has the divisor's sign); dividing by zero gives None;
- a comparison with None is False; `x IN (...)` with x None is False (and NOT IN too);
- AND, OR and NOT work on bools (comparisons never give None), short-circuiting left first.

What an attribute or an aggregate means depends on the query kind, so evaluation asks an
`Env` for those; the rest is the same for MATCH, SEQ and WINDOW.
"""

from __future__ import annotations

import operator
from typing import Any

from cep_core import ast
from cep_core.functions import lookup

# A value of the language as the reference computes it: an int, float, str or bool, a list
# (Collect) or None; what each operation gives depends on the values, as in Python.
Value = Any


class Env:
    """Resolves the context-dependent leaves of an expression. The checker guarantees that
    only the leaves a query kind supports reach its Env; the others fail loudly."""

    def attr(self, node: ast.Attr) -> Value:
        raise TypeError(f"{type(self).__name__} cannot resolve attribute {node.name}")

    def aggregate(self, node: ast.Aggregate) -> Value:
        raise TypeError(f"{type(self).__name__} cannot resolve aggregates")

    def window_aggregate(self, node: ast.WindowAggregate) -> Value:
        raise TypeError(f"{type(self).__name__} cannot resolve window aggregates")


def fold(func: ast.AggFunc, values: list[Value]) -> Value:
    """An aggregate over values in stream order (DELTA is the caller's: it needs times).

    Empty input: count 0, sum 0, collect [], the others None. Sums add left to right.
    """
    if func is ast.AggFunc.COUNT:
        return len(values)
    if func is ast.AggFunc.COLLECT:
        return list(values)
    if func is ast.AggFunc.SUM:
        total = 0
        for v in values:
            total = total + v
        return total
    if not values:
        return None
    if func is ast.AggFunc.FIRST:
        return values[0]
    if func is ast.AggFunc.LAST:
        return values[-1]
    if func is ast.AggFunc.MAX:
        return max(values)
    if func is ast.AggFunc.MIN:
        return min(values)
    if func is ast.AggFunc.AVG:
        return fold(ast.AggFunc.SUM, values) / len(values)
    raise ValueError(f"fold does not compute {func.value}")


_COMPARE = {ast.BinaryOp.EQ: operator.eq, ast.BinaryOp.NE: operator.ne,
            ast.BinaryOp.LT: operator.lt, ast.BinaryOp.LE: operator.le,
            ast.BinaryOp.GT: operator.gt, ast.BinaryOp.GE: operator.ge}


_ARITH = {ast.BinaryOp.ADD: operator.add, ast.BinaryOp.SUB: operator.sub,
          ast.BinaryOp.MUL: operator.mul, ast.BinaryOp.DIV: operator.truediv,
          ast.BinaryOp.MOD: operator.mod}


def _arith(op: ast.BinaryOp, a: Value, b: Value) -> Value:
    if a is None or b is None:
        return None
    function = _ARITH.get(op)
    if function is None:
        raise ValueError(f"unknown operator {op}")
    if op in (ast.BinaryOp.DIV, ast.BinaryOp.MOD) and b == 0:
        return None
    return function(a, b)


class Evaluator(ast.Visitor):
    """Evaluates expressions; `visit(expr, env)` is the value of `expr` in `env`."""

    def visit_Literal(self, node: ast.Literal, env: Env) -> Value:
        return node.value

    def visit_Attr(self, node: ast.Attr, env: Env) -> Value:
        return env.attr(node)

    def visit_Aggregate(self, node: ast.Aggregate, env: Env) -> Value:
        return env.aggregate(node)

    def visit_WindowAggregate(self, node: ast.WindowAggregate, env: Env) -> Value:
        return env.window_aggregate(node)

    def visit_Unary(self, node: ast.Unary, env: Env) -> Value:
        value = self.visit(node.operand, env)
        if node.op is ast.UnaryOp.NOT:
            return not value
        return None if value is None else -value

    def visit_Binary(self, node: ast.Binary, env: Env) -> Value:
        op = node.op
        if op is ast.BinaryOp.AND:
            return bool(self.visit(node.left, env)) and bool(self.visit(node.right, env))
        if op is ast.BinaryOp.OR:
            return bool(self.visit(node.left, env)) or bool(self.visit(node.right, env))
        a, b = self.visit(node.left, env), self.visit(node.right, env)
        if op in _COMPARE:
            return a is not None and b is not None and _COMPARE[op](a, b)
        return _arith(op, a, b)

    def visit_InList(self, node: ast.InList, env: Env) -> Value:
        value = self.visit(node.operand, env)
        if value is None:
            return False
        found = any(value == self.visit(option, env) for option in node.options)
        return found != node.negated

    def visit_Call(self, node: ast.Call, env: Env) -> Value:
        function = lookup(node.name)
        if function is None:  # the checker admits only known functions
            raise ValueError(f"unknown function {node.name!r}")
        return function.impl(*(self.visit(arg, env) for arg in node.args))


evaluate = Evaluator().visit  # evaluate(expr, env): the value of `expr` in `env`


def holds(expr: ast.Expr | None, env: Env) -> bool:
    """Whether a condition is true (an absent condition always is)."""
    return expr is None or bool(evaluate(expr, env))
