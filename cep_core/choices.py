"""A name given as text (an option, an argument) made the member of its enum, or a
ValueError that names the choices."""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

E = TypeVar("E", bound=StrEnum)


def one_of(choices: type[E], name: str, what: str) -> E:
    """`choices(name)`; ValueError `<what> must be one of a, b, got 'name'` otherwise."""
    try:
        return choices(name)
    except ValueError:
        raise ValueError(f"{what} must be one of {', '.join(choices)}, got {name!r}") from None
