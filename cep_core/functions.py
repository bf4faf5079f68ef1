"""Functions a query may call. Only functions registered here as pure may appear in a query.

Each function has a fixed signature over the value types of the language (ExprType: a
timestamp counts as an int); a NUMBER parameter accepts an int or a float.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cep_core.checked import NUMERIC, ExprType


class Param(StrEnum):
    """What a function's parameter takes; its value names it in messages."""

    NUMBER = "number"  # an int or a float
    STRING = "string"

    def accepts(self, kind: ExprType) -> bool:
        return kind in NUMERIC if self is Param.NUMBER else kind is ExprType.STRING


@dataclass(frozen=True)
class Function:
    name: str
    params: tuple[Param, ...]
    result: ExprType | None  # None: the arguments' numeric type (a float if any is one)
    impl: Callable[..., Any]
    pure: bool = True

    def result_type(self, arg_types: list[ExprType | None]) -> ExprType:
        if self.result is None:
            return ExprType.FLOAT if ExprType.FLOAT in arg_types else ExprType.INT
        return self.result


def _nullsafe(f: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        if any(a is None for a in args):
            return None
        return f(*args)
    return call


def _widen(result: float, *args: object) -> float:
    """A float when any argument is one, as the checker types the result."""
    return float(result) if any(isinstance(a, float) for a in args) else result


_N, _S, _T = Param.NUMBER, Param.STRING, ExprType
FUNCTIONS: dict[str, Function] = {f.name: f for f in [
    Function("abs", (_N,), None, _nullsafe(abs)),
    Function("sqrt", (_N,), _T.FLOAT, _nullsafe(lambda x: math.sqrt(x) if x >= 0 else None)),
    Function("floor", (_N,), _T.INT, _nullsafe(math.floor)),
    Function("ceil", (_N,), _T.INT, _nullsafe(math.ceil)),
    Function("least", (_N, _N), None,
             _nullsafe(lambda a, b: _widen(min(a, b), a, b))),
    Function("greatest", (_N, _N), None,
             _nullsafe(lambda a, b: _widen(max(a, b), a, b))),
    Function("lower", (_S,), _T.STRING, _nullsafe(str.lower)),
    Function("upper", (_S,), _T.STRING, _nullsafe(str.upper)),
    Function("length", (_S,), _T.INT, _nullsafe(len)),
    # Registered so that the checker can name them as impure: a query may not call them.
    Function("now", (), _T.INT, lambda: time.time_ns() // 1_000_000, pure=False),
    Function("random", (), _T.FLOAT, random.random, pure=False),
]}


def lookup(name: str) -> Function | None:
    return FUNCTIONS.get(name.lower())
