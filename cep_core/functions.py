"""Functions a query may call. Only functions registered here as pure may appear in a query.

Each function has a fixed signature over the value types of the language: "int", "float",
"string", "bool" ("timestamp" counts as "int"); "number" accepts int or float.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Function:
    name: str
    params: tuple[str, ...]
    result: str  # a type, or "same" for the (first) argument's numeric type
    impl: Callable
    pure: bool = True

    def result_type(self, arg_types: list[str]) -> str:
        if self.result == "same":
            return "float" if "float" in arg_types else "int"
        return self.result


def _nullsafe(f: Callable) -> Callable:
    def call(*args):
        if any(a is None for a in args):
            return None
        return f(*args)
    return call


def _widen(result, *args):
    """A float when any argument is one, as the checker types the result."""
    return float(result) if any(isinstance(a, float) for a in args) else result


FUNCTIONS: dict[str, Function] = {f.name: f for f in [
    Function("abs", ("number",), "same", _nullsafe(abs)),
    Function("sqrt", ("number",), "float", _nullsafe(lambda x: math.sqrt(x) if x >= 0 else None)),
    Function("floor", ("number",), "int", _nullsafe(math.floor)),
    Function("ceil", ("number",), "int", _nullsafe(math.ceil)),
    Function("least", ("number", "number"), "same",
             _nullsafe(lambda a, b: _widen(min(a, b), a, b))),
    Function("greatest", ("number", "number"), "same",
             _nullsafe(lambda a, b: _widen(max(a, b), a, b))),
    Function("lower", ("string",), "string", _nullsafe(str.lower)),
    Function("upper", ("string",), "string", _nullsafe(str.upper)),
    Function("length", ("string",), "int", _nullsafe(len)),
    # Registered so that the checker can name them as impure: a query may not call them.
    Function("now", (), "int", lambda: time.time_ns() // 1_000_000, pure=False),
    Function("random", (), "float", random.random, pure=False),
]}


def lookup(name: str) -> Function | None:
    return FUNCTIONS.get(name.lower())
