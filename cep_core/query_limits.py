"""Per-query resource limits, with defaults and environment overrides.

`QueryLimits` holds them; `limits()` is this process's (read from `CEP_MAX_QUERY_TEXT_BYTES`,
`CEP_MAX_WINDOW_PANES` and `CEP_MAX_QUERY_STATE_BYTES` once). The check refuses what a
query's text already shows to be over them (`cep_core.admission`, and the parser for the
text's size); the engines enforce what depends on the data (`QueryStateLimit`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from cep_core import ast
from cep_core.errors import QueryError

if TYPE_CHECKING:
    from cep_core.compiler.window import WindowPlan


class QueryStateLimit(MemoryError):
    """A query's state would grow past `QueryLimits.state_bytes` (its data made it so)."""


@dataclass(frozen=True)
class QueryLimits:
    text_bytes: int = 256 * 1024
    panes: int = 100_000
    state_bytes: int = 1 << 30  # per query and engine (one keyed partition of a worker)

    ENV = {"text_bytes": "CEP_MAX_QUERY_TEXT_BYTES", "panes": "CEP_MAX_WINDOW_PANES",
           "state_bytes": "CEP_MAX_QUERY_STATE_BYTES"}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> QueryLimits:
        environ = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for field, name in cls.ENV.items():
            text = environ.get(name)
            if text is None or text == "":
                continue
            try:
                value = int(text)
            except ValueError:
                raise ValueError(f"{name}={text!r} is not a whole number") from None
            if value < 1:
                raise ValueError(f"{name}={text!r} must be at least 1")
            values[field] = value
        return cls(**values)


@functools.cache
def limits() -> QueryLimits:
    """This process's limits (the environment's, read once)."""
    return QueryLimits.from_env()


def check_text_size(text: str, path: str, limit: QueryLimits | None = None) -> None:
    """Refuse a query text longer than the limit before anything parses it."""
    limit = limit or limits()
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit.text_bytes:
        raise QueryError(f"the query text is {size:,} bytes, over the limit of "
                         f"{limit.text_bytes:,} (CEP_MAX_QUERY_TEXT_BYTES)",
                         ast.Pos(path, 1, 1))


def pane_bytes(plan_: WindowPlan, wk: ModuleType) -> int:
    """Bytes one pane of one group takes in the WINDOW engine's state arrays (`wk`: the
    module cep_core.kernels.window_kernels)."""
    size: int = 8 * (wk.B_SIZE + len(plan_.int_accs) + len(plan_.float_accs)
                     + len(plan_.exact_sums) * wk.XSIZE)
    return size
