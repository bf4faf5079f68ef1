"""Complex event processing: `import cep_core as cep`, then `cep.compile(text, schema=...)`
and `QuerySet.run(data)` or `QuerySet.stream()` (docs/python.md).

The names below load on first use (PEP 562), so `import cep_core` imports neither numba
nor pyarrow.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cep_core.api import QuerySet, Result, Stream, compile, read_events
    from cep_core.errors import QueryError
    from cep_core.event_io import DeadLetter
    from cep_core.schema import SchemaError, StreamSchema

_LAZY = {
    "compile": "cep_core.api", "QuerySet": "cep_core.api", "Result": "cep_core.api",
    "Stream": "cep_core.api", "read_events": "cep_core.api",
    "QueryError": "cep_core.errors", "DeadLetter": "cep_core.event_io",
    "StreamSchema": "cep_core.schema", "SchemaError": "cep_core.schema",
}
__all__ = ["DeadLetter", "QueryError", "QuerySet", "Result", "SchemaError", "Stream",
           "StreamSchema", "compile", "read_events"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cep_core' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
