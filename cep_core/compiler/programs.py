"""Compiled programs are built once per checked query and shared: `@once_per_query` on a
function `checked -> program` (a program holds its checked query as `.checked`)."""

from __future__ import annotations

import functools
from weakref import WeakValueDictionary


def once_per_query(build):
    """`build(checked)` called once per checked query: later calls give the same program
    for as long as anything (an engine) holds it. Keyed by the checked query's identity,
    which the program keeps alive, so an id is not reused while its entry is there."""
    programs: WeakValueDictionary = WeakValueDictionary()

    @functools.wraps(build)
    def program(checked):
        found = programs.get(id(checked))
        if found is None or found.checked is not checked:
            found = programs[id(checked)] = build(checked)
        return found

    return program
