"""Glushkov analysis of a MATCH pattern, from the AST alone.

A *position* is one occurrence of a predicate (`RSym`) or of `.` (`RAny`) in the pattern;
positions are the AST nodes themselves, in source order. The Glushkov automaton has one
state per position plus a start state:

- `first(r)`: the positions that can begin a word of r (transitions out of the start state);
- `last(r)`: the positions that can end a word of r (accepting states);
- `follow(r)`: for each position, the positions that can come right after it;
- `nullable(r)`: whether r accepts the empty sequence (then the start state accepts too).

The parser produces `*` (0, None), `+` (1, None) and `?` (0, 1) repeats; `follow` handles
exactly those bounds (a counted repeat would need its item copied per count).
"""

from __future__ import annotations

from cep_core import ast

Position = ast.RSym | ast.RAny


# Deliberately like _AcceptsNonempty below: two visitors over the same regex nodes, each with its
# own answer per node
class _Nullable(ast.Visitor):
    def visit_RSym(self, r: Position) -> bool:
        return False

    visit_RAny = visit_RSym

    def visit_REmpty(self, r: ast.REmpty) -> bool:
        return True

    def visit_RCat(self, r: ast.RCat) -> bool:
        return all(self.visit(item) for item in r.items)

    def visit_RAlt(self, r: ast.RAlt) -> bool:
        return any(self.visit(option) for option in r.options)

    def visit_RRepeat(self, r: ast.RRepeat) -> bool:
        return r.min == 0 or r.max == 0 or self.visit(r.item)


# Deliberately like _Nullable above: two visitors over the same regex nodes, each with its own
# answer per node
class _AcceptsNonempty(ast.Visitor):
    def visit_RSym(self, r: Position) -> bool:
        return True

    visit_RAny = visit_RSym

    def visit_REmpty(self, r: ast.REmpty) -> bool:
        return False

    def visit_RCat(self, r: ast.RCat) -> bool:
        return any(self.visit(item) for item in r.items)

    def visit_RAlt(self, r: ast.RAlt) -> bool:
        return any(self.visit(option) for option in r.options)

    def visit_RRepeat(self, r: ast.RRepeat) -> bool:
        return r.max != 0 and self.visit(r.item)


class _First(ast.Visitor):
    """The positions that can begin a word; `_Last` (reversed) those that can end one."""

    def visit_RSym(self, r: Position) -> list[Position]:
        return [r]

    visit_RAny = visit_RSym

    def visit_REmpty(self, r: ast.REmpty) -> list[Position]:
        return []

    def visit_RCat(self, r: ast.RCat) -> list[Position]:
        found: list[Position] = []
        for item in r.items:
            found.extend(self.visit(item))
            if not nullable(item):
                break
        return found

    def visit_RAlt(self, r: ast.RAlt) -> list[Position]:
        return [p for option in r.options for p in self.visit(option)]

    def visit_RRepeat(self, r: ast.RRepeat) -> list[Position]:
        return [] if r.max == 0 else self.visit(r.item)


class _Last(_First):
    def visit_RCat(self, r: ast.RCat) -> list[Position]:
        found: list[Position] = []
        for item in reversed(r.items):
            found[:0] = self.visit(item)
            if not nullable(item):
                break
        return found


_NULLABLE, _ACCEPTS_NONEMPTY, _FIRST, _LAST = _Nullable(), _AcceptsNonempty(), _First(), _Last()


def nullable(r: ast.Regex) -> bool:
    """Whether the regex accepts the empty sequence."""
    found: bool = _NULLABLE.visit(r)
    return found


def accepts_nonempty(r: ast.Regex) -> bool:
    """Whether the regex accepts some sequence of at least one event."""
    found: bool = _ACCEPTS_NONEMPTY.visit(r)
    return found


def matches_only_empty(r: ast.Regex) -> bool:
    """Whether the only sequence the regex accepts is the empty one."""
    return not accepts_nonempty(r)


def positions(r: ast.Regex) -> list[Position]:
    """Every predicate and `.` occurrence, in source order."""
    return list(r.find_all(ast.RSym, ast.RAny))


def first(r: ast.Regex) -> list[Position]:
    """Positions that can begin a match: the transitions out of the start state."""
    found: list[Position] = _FIRST.visit(r)
    return found


def last(r: ast.Regex) -> list[Position]:
    """Positions that can end a match: the accepting states (besides a nullable start)."""
    found: list[Position] = _LAST.visit(r)
    return found


def first_symbols(r: ast.Regex) -> set[str]:
    """Names of the predicates that can begin a match (`.` is not a name)."""
    return {p.name for p in first(r) if isinstance(p, ast.RSym)}


def follow(r: ast.Regex) -> dict[int, list[Position]]:
    """For each position (keyed by `id(node)`), the positions that may follow it."""
    table: dict[int, list[Position]] = {id(p): [] for p in positions(r)}
    _FollowFiller(table).visit(r)
    return table


class _FollowFiller(ast.Visitor):
    """Fills `table` (position id -> following positions) from a regex."""

    def __init__(self, table: dict[int, list[Position]]):
        self.table = table

    def generic_visit(self, node: ast.Node, *args: object) -> None:
        """A position or the empty regex: nothing follows inside it."""

    def visit_RCat(self, r: ast.RCat) -> None:
        items = r.items
        for i, item in enumerate(items):
            self.visit(item)
            for later in items[i + 1:]:
                _link(last(item), first(later), self.table)
                if not nullable(later):
                    break

    def visit_RAlt(self, r: ast.RAlt) -> None:
        for option in r.options:
            self.visit(option)

    def visit_RRepeat(self, r: ast.RRepeat) -> None:
        if (r.min, r.max) not in ((0, None), (1, None), (0, 1)):
            raise ValueError(f"follow() handles *, + and ?, not {{{r.min},{r.max}}}")
        self.visit(r.item)
        if r.max is None:
            _link(last(r.item), first(r.item), self.table)


def _link(sources: list[Position], targets: list[Position],
          table: dict[int, list[Position]]) -> None:
    for source in sources:
        for target in targets:
            if all(t is not target for t in table[id(source)]):
                table[id(source)].append(target)
