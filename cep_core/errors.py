"""Errors that point at a spot in a query file: `file:line:col: message` and a caret; the
category of a refusal (what the HTTP API maps to a status) and its located problems, as
fields, never to be read back out of a message's text."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from cep_core.ast import Pos


class Category(StrEnum):
    """What kind of refusal an error is (services/api maps each to an HTTP status)."""

    MALFORMED = "malformed"  # a request that cannot be read (not JSON, a bad parameter): 400
    INVALID = "invalid"  # a bad query, stream schema or message: 422
    NOT_FOUND = "not_found"  # nothing of that name is live: 404
    CONFLICT = "conflict"  # live already, or exists already: 409
    ADMISSION = "admission"  # refused by admission: over a limit in flight: 429
    UNAVAILABLE = "unavailable"  # something it needs does not answer (the broker): 503
    INTERNAL = "internal"  # a fault of ours: 500


@dataclass(frozen=True)
class Problem:
    """One problem of a refusal: its message and, where known, the query, line and column
    it is at (1-based) and the text of that line."""

    message: str
    query: str | None = None
    line: int | None = None
    column: int | None = None
    source_line: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Refusal(ValueError):
    """An error with a `category` and its `problems` (by default one: the message,
    located nowhere)."""

    category = Category.INVALID

    def __init__(self, message: str, category: Category | None = None,
                 problems: list[Problem] | None = None):
        super().__init__(message)
        if category is not None:
            self.category = category
        self.problems = problems if problems else [Problem(message)]


class QueryError(Exception):
    """A problem with a query, located at `pos` in its source text."""

    def __init__(self, message: str, pos: Pos, source: str | None = None):
        super().__init__(message)
        self.message = message
        self.pos = pos
        self.source = source
        self.errors: list[QueryError] = [self]  # every error of the text (`cep.compile`)

    @property
    def line(self) -> int:
        """1-based line of the problem in the query text."""
        return self.pos.line

    @property
    def column(self) -> int:
        """1-based column of the problem in its line."""
        return self.pos.column

    @property
    def source_line(self) -> str | None:
        """The line of the query text the problem is on (None when not known)."""
        if not self.source or self.pos.line < 1:
            return None
        lines = self.source.splitlines()
        return lines[self.pos.line - 1] if self.pos.line <= len(lines) else None

    category = Category.INVALID

    def problem(self, query: str | None = None) -> Problem:
        """This error as a Problem (line and column None where not known)."""
        return Problem(self.message, query, self.pos.line or None, self.pos.column or None,
                       self.source_line)

    def with_source(self, source: str) -> QueryError:
        self.source = source
        return self

    def __str__(self) -> str:
        head = f"{self.pos}: error: {self.message}"
        if not self.source or self.pos.line < 1:
            return head
        lines = self.source.splitlines()
        if self.pos.line > len(lines):
            return head
        text = lines[self.pos.line - 1].expandtabs(1)
        caret = " " * max(self.pos.column - 1, 0) + "^"
        return f"{head}\n    {text}\n    {caret}"


class QueryErrors(Exception):
    """Several QueryErrors found in one file, in source order."""

    def __init__(self, errors: list[QueryError]):
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors

    category = Category.INVALID


class EventError(ValueError):
    """A simple event that does not fit its stream's schema; it goes to the dead letters."""
