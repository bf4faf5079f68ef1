"""What the checker gives: `CheckedQuery` (a query that passed every check, with its
stream's schema and the type of each expression node, `Types`), and `select_name`, the
output field of a SELECT item. Kept apart from the checker itself (`cep_core.checker`) so
that the compilers, which take checked queries, do not depend on the checking."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from enum import StrEnum

from cep_core import ast
from cep_core.schema import AttrType, StreamSchema


class ExprType(StrEnum):
    """The checker's type of an expression. Its value is how messages name it; it equals
    the AttrType of the same name, and a schema's timestamp is an INT."""

    INT = "int"
    FLOAT = "float"
    STRING = "string"
    BOOL = "bool"
    LIST = "list"

    @classmethod
    def of(cls, kind: AttrType) -> ExprType:
        """The type of an attribute of schema type `kind`."""
        return cls.INT if kind is AttrType.TIMESTAMP else cls(kind.value)


NUMERIC = (ExprType.INT, ExprType.FLOAT)


class Types(dict[ast.Expression, ExprType | None]):
    """The checker's type of each expression node of one query (an ExprType), or None
    where an error made it unknown. Keyed by the node itself
    (nodes hash by identity), so it holds for exactly the tree that was checked.

    A subtree moved from another checked query (a shared WHERE) keeps the types its own
    check gave it: a node missing here is looked up in the Types that typed it."""

    def __setitem__(self, node: ast.Expression, kind: ExprType | None) -> None:
        super().__setitem__(node, kind)
        _TYPED_BY[id(node)] = self  # while this Types lives, so does the node: ids are unique

    def __missing__(self, node: ast.Expression) -> ExprType | None:
        origin = _TYPED_BY.get(id(node))
        if origin is None or origin is self or node not in origin:
            raise KeyError(node)
        return origin[node]


_TYPED_BY: weakref.WeakValueDictionary[int, Types] = weakref.WeakValueDictionary()


@dataclass(eq=False)
class CheckedQuery:
    """A query that passed every check, with the schema of its input stream.

    `index` is the query's position in its file (it orders output between queries);
    `types` is the type of every expression node of `query`.
    """

    query: ast.Query
    schema: StreamSchema
    index: int
    types: Types = field(default_factory=Types)

    @property
    def name(self) -> str:
        return self.query.name

    def time_units(self, duration: ast.Duration) -> int:
        """A duration in the stream's time unit."""
        return duration.in_time_units(self.schema.time_unit)


def select_name(item: ast.SelectItem) -> str:
    """The output field of a SELECT item: its alias, else `count` for count(*), `func_attr`
    for another aggregate (`max_price`, `count_price`), or the attribute's name."""
    if item.alias is not None:
        return item.alias
    expr = item.expr
    if isinstance(expr, ast.Aggregate):
        if expr.arg is None:
            return "count"
        # count(price) has the parser's Kleene shape: Attr(name="", var="price").
        return f"{expr.func.value}_{expr.arg.name or expr.arg.var}"
    if isinstance(expr, ast.Attr):
        return expr.name
    return "expr"
