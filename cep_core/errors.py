"""Errors that point at a spot in a query file: `file:line:col: message` and a caret."""

from __future__ import annotations

from cep_core.ast import Pos


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


class EventError(ValueError):
    """A simple event that does not fit its stream's schema; it goes to the dead letters."""
