"""Query diff: two versions of one query over the same recorded events, and the composite
events only the old version gives, only the new one gives, and both give (`cep query diff`,
docs/live.md).

    diff = diff_query(old_text, new_text, "recorded.jsonl", registry)
    print(diff.summary())          # query ups: 2 only in old, 3 only in new, 40 same ...
    for line in diff.lines():      # -{...} / +{...}, in output order
        print(line)

Each version runs alone on the engines of `cep run` (jit by default) over the events read
once with the stream's schema; its composite events come in `cep run`'s order. Where the
two versions have different names, the old version's composite events are renamed to the
new name (their `query` field) before they are compared. A composite event is the same in
both when its JSON object is equal (key order aside); one that repeats counts as often as
it repeats.
"""

from __future__ import annotations

# Deferred imports: the checker (lark), the reader (pyarrow) and the engines (numba) load when a
# diff runs, not when the CLI imports this module's names.

import heapq
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from cep_core.composite import sort_key
from cep_core.runner import EngineName

if TYPE_CHECKING:
    from cep_core.checked import CheckedQuery
    from cep_core.event_io import DeadLetter
    from cep_core.schema import SchemaRegistry

__all__ = ["QueryDiff", "QueryDiffError", "diff_query", "pick_query"]


class QueryDiffError(ValueError):
    """The versions cannot be compared: no such query, several to choose from, other
    streams."""


@dataclass
class QueryDiff:
    """What `diff_query` found. `only_old`, `only_new` and `same` are composite events as
    dicts, each list in output order (`same` in the new version's)."""

    name: str  # the new version's name; the old one's composites carry it too
    old_name: str
    only_old: list[dict[str, Any]]
    only_new: list[dict[str, Any]]
    same: list[dict[str, Any]]
    events: int  # events read
    dead_letters: list[DeadLetter] = field(default_factory=list)  # records not read
    old_rejected: list[DeadLetter] = field(default_factory=list)  # events an engine
    new_rejected: list[DeadLetter] = field(default_factory=list)  # rejected

    @property
    def identical(self) -> bool:
        return not self.only_old and not self.only_new

    def summary(self) -> str:
        renamed = f" (old name {self.old_name})" if self.old_name != self.name else ""
        return (f"query {self.name}{renamed}: {len(self.only_old)} only in old, "
                f"{len(self.only_new)} only in new, {len(self.same)} same "
                f"({self.events} events)")

    def lines(self) -> list[str]:
        """The differing composite events as JSON lines, `-` (only in old) or `+` (only in
        new) in front, merged in output order (an old one first where they tie)."""
        def keyed(rows: list[dict[str, Any]], sign: int) -> Iterator[
                tuple[tuple[int, int, list[int], int, bytes], int, dict[str, Any]]]:
            return ((sort_key(c, 0), sign, c) for c in rows)

        merged = heapq.merge(keyed(self.only_old, 0), keyed(self.only_new, 1),
                             key=lambda item: item[:2])
        return [("-" if sign == 0 else "+") + orjson.dumps(c).decode()
                for _, sign, c in merged]


def pick_query(queries: list[CheckedQuery], name: str | None, source: str) -> CheckedQuery:
    """The query named `name` of a query file's checked queries, or its only query when
    `name` is None; QueryDiffError otherwise."""
    if name is not None:
        for q in queries:
            if q.name == name:
                return q
        raise QueryDiffError(f"{source}: no query {name!r} (it holds "
                             f"{', '.join(q.name for q in queries) or 'none'})")
    if len(queries) != 1:
        raise QueryDiffError(f"{source}: {len(queries)} queries "
                             f"({', '.join(q.name for q in queries)}); name the one to "
                             "compare")
    return queries[0]


def diff_query(old_text: str, new_text: str, events: Any,
               registry: SchemaRegistry | None = None, *, name: str | None = None,
               fmt: str | None = None, engine: str = EngineName.JIT, old_source: str = "<old>",
               new_source: str = "<new>") -> QueryDiff:
    """Run the old and the new version of a query over `events` (a path, a table, dicts:
    what `QuerySet.run` takes; `fmt` names a file's format where its suffix does not) and
    compare their composite events.

    The new version is the query `name` of `new_text` (its only query when `name` is None);
    the old version the query of the same name of `old_text`, else its only query. Both are
    checked against `registry` (None: the built-in streams and CEP_SCHEMA_PATH) and must
    read the same stream. QueryError/QueryErrors when a text does not check,
    QueryDiffError when the versions cannot be paired, InputError when the file cannot be
    read."""
    from cep_core.api import read_events
    from cep_core.checker import load_query_text
    from cep_core.runner import run_checked

    new = pick_query(load_query_text(new_text, registry, new_source), name, new_source)
    olds = load_query_text(old_text, registry, old_source)
    paired = len(olds) != 1 or new.name in [q.name for q in olds]
    old = pick_query(olds, new.name if paired else None, old_source)
    if old.schema.stream != new.schema.stream:
        raise QueryDiffError(f"the old version reads stream {old.schema.stream!r}, the new "
                             f"one {new.schema.stream!r}: one file of events cannot feed both")
    table, dead = read_events(events, new.schema, fmt)
    old_found, old_rejected = run_checked([old], table, engine)
    new_found, new_rejected = run_checked([new], table, engine)
    old_rows = old_found.to_dicts()
    if old.name != new.name:
        old_rows = [{**c, "query": new.name} for c in old_rows]
    new_rows = new_found.to_dicts()
    only_old, _ = _unmatched(old_rows, new_rows)
    only_new, same = _unmatched(new_rows, old_rows)
    return QueryDiff(new.name, old.name, only_old, only_new, same, table.num_rows, dead,
                     old_rejected, new_rejected)


def _unmatched(rows: list[dict[str, Any]], others: list[dict[str, Any]]
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the rows `others` does not hold, those it does), in order, as multisets: a row that
    comes k times is matched as often as `others` holds it."""
    def canonical(c: dict[str, Any]) -> bytes:
        return orjson.dumps(c, option=orjson.OPT_SORT_KEYS)

    left = Counter(canonical(c) for c in others)
    unmatched, matched = [], []
    for c in rows:
        key = canonical(c)
        if left[key] > 0:
            left[key] -= 1
            matched.append(c)
        else:
            unmatched.append(c)
    return unmatched, matched
