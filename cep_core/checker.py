"""Static checks: a parsed query file -> checked queries, or QueryErrors at file:line:col.

OWNED BY THE CHECKER WORK. The public API below (CheckedQuery, check, load_queries) is what
every engine uses; keep it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cep_core import ast
from cep_core.errors import QueryError, QueryErrors
from cep_core.parser import parse
from cep_core.schema import SchemaRegistry, StreamSchema


@dataclass(eq=False)
class CheckedQuery:
    """A query that passed every check, with the schema of its input stream.

    `index` is the query's position in its file (it orders output between queries).
    Expression nodes have their `type` filled in.
    """

    query: ast.Query
    schema: StreamSchema
    index: int

    @property
    def name(self) -> str:
        return self.query.name

    def time_units(self, duration: ast.Duration) -> int:
        """A duration in the stream's time unit."""
        return duration.in_time_units(self.schema.time_unit)


def check(query_file: ast.QueryFile, registry: SchemaRegistry,
          source: str | None = None) -> list[CheckedQuery]:
    errors: list[QueryError] = []
    checked: list[CheckedQuery] = []
    for index, query in enumerate(query_file.queries):
        schema = registry.get(query.stream)
        if schema is None:
            errors.append(QueryError(f"unknown stream '{query.stream}'", query.pos, source))
            continue
        checked.append(CheckedQuery(query, schema, index))
    if errors:
        raise QueryErrors(errors)
    return checked


def load_queries(path: str | Path, registry: SchemaRegistry | None = None) -> list[CheckedQuery]:
    """Parse and check a query file; raises QueryError (syntax) or QueryErrors (checks)."""
    text = Path(path).read_text()
    return check(parse(text, str(path)), registry or SchemaRegistry(), text)


def load_query_text(text: str, registry: SchemaRegistry | None = None,
                    path: str = "<query>") -> list[CheckedQuery]:
    return check(parse(text, path), registry or SchemaRegistry(), text)
