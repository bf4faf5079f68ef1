"""Compiled programs are built once per checked query and shared: `@once_per_query` on a
function `checked -> program` (a program holds its checked query as `.checked`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol, TypeVar
from weakref import WeakValueDictionary

from cep_core.checked import CheckedQuery


class _Program(Protocol):
    @property
    def checked(self) -> CheckedQuery: ...


P = TypeVar("P", bound=_Program)


def once_per_query(build: Callable[[CheckedQuery], P]) -> Callable[[CheckedQuery], P]:
    """`build(checked)` called once per checked query: later calls give the same program
    for as long as anything (an engine) holds it. Keyed by the checked query's identity,
    which the program keeps alive, so an id is not reused while its entry is there."""
    programs: WeakValueDictionary[int, P] = WeakValueDictionary()

    @functools.wraps(build)
    def program(checked: CheckedQuery) -> P:
        found = programs.get(id(checked))
        if found is None or found.checked is not checked:
            found = programs[id(checked)] = build(checked)
        return found

    return program
