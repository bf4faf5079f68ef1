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


def nullable(r: ast.Regex) -> bool:
    """Whether the regex accepts the empty sequence."""
    match r:
        case ast.RSym() | ast.RAny():
            return False
        case ast.REmpty():
            return True
        case ast.RCat(items=items):
            return all(nullable(item) for item in items)
        case ast.RAlt(options=options):
            return any(nullable(option) for option in options)
        case ast.RRepeat(item=item, min=low, max=high):
            return low == 0 or high == 0 or nullable(item)
    raise TypeError(f"not a regex node: {type(r).__name__}")


def accepts_nonempty(r: ast.Regex) -> bool:
    """Whether the regex accepts some sequence of at least one event."""
    match r:
        case ast.RSym() | ast.RAny():
            return True
        case ast.REmpty():
            return False
        case ast.RCat(items=items):
            return any(accepts_nonempty(item) for item in items)
        case ast.RAlt(options=options):
            return any(accepts_nonempty(option) for option in options)
        case ast.RRepeat(item=item, max=high):
            return high != 0 and accepts_nonempty(item)
    raise TypeError(f"not a regex node: {type(r).__name__}")


def matches_only_empty(r: ast.Regex) -> bool:
    """Whether the only sequence the regex accepts is the empty one."""
    return not accepts_nonempty(r)


def positions(r: ast.Regex) -> list[Position]:
    """Every predicate and `.` occurrence, in source order."""
    match r:
        case ast.RSym() | ast.RAny():
            return [r]
        case ast.REmpty():
            return []
        case ast.RCat(items=parts) | ast.RAlt(options=parts):
            return [p for part in parts for p in positions(part)]
        case ast.RRepeat(item=item):
            return positions(item)
    raise TypeError(f"not a regex node: {type(r).__name__}")


def first(r: ast.Regex) -> list[Position]:
    """Positions that can begin a match: the transitions out of the start state."""
    match r:
        case ast.RSym() | ast.RAny():
            return [r]
        case ast.REmpty():
            return []
        case ast.RCat(items=items):
            found: list[Position] = []
            for item in items:
                found.extend(first(item))
                if not nullable(item):
                    break
            return found
        case ast.RAlt(options=options):
            return [p for option in options for p in first(option)]
        case ast.RRepeat(item=item, max=high):
            return [] if high == 0 else first(item)
    raise TypeError(f"not a regex node: {type(r).__name__}")


def last(r: ast.Regex) -> list[Position]:
    """Positions that can end a match: the accepting states (besides a nullable start)."""
    match r:
        case ast.RSym() | ast.RAny():
            return [r]
        case ast.REmpty():
            return []
        case ast.RCat(items=items):
            found: list[Position] = []
            for item in reversed(items):
                found[:0] = last(item)
                if not nullable(item):
                    break
            return found
        case ast.RAlt(options=options):
            return [p for option in options for p in last(option)]
        case ast.RRepeat(item=item, max=high):
            return [] if high == 0 else last(item)
    raise TypeError(f"not a regex node: {type(r).__name__}")


def first_symbols(r: ast.Regex) -> set[str]:
    """Names of the predicates that can begin a match (`.` is not a name)."""
    return {p.name for p in first(r) if isinstance(p, ast.RSym)}


def follow(r: ast.Regex) -> dict[int, list[Position]]:
    """For each position (keyed by `id(node)`), the positions that may follow it."""
    table: dict[int, list[Position]] = {id(p): [] for p in positions(r)}
    _fill_follow(r, table)
    return table


def _fill_follow(r: ast.Regex, table: dict[int, list[Position]]) -> None:
    match r:
        case ast.RCat(items=items):
            for i, item in enumerate(items):
                _fill_follow(item, table)
                for later in items[i + 1:]:
                    _link(last(item), first(later), table)
                    if not nullable(later):
                        break
        case ast.RAlt(options=options):
            for option in options:
                _fill_follow(option, table)
        case ast.RRepeat(item=item, min=low, max=high):
            if (low, high) not in ((0, None), (1, None), (0, 1)):
                raise ValueError(f"follow() handles *, + and ?, not {{{low},{high}}}")
            _fill_follow(item, table)
            if high is None:
                _link(last(item), first(item), table)


def _link(sources: list[Position], targets: list[Position],
          table: dict[int, list[Position]]) -> None:
    for source in sources:
        for target in targets:
            if all(t is not target for t in table[id(source)]):
                table[id(source)].append(target)
