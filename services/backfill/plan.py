"""How each query may be split across Spark tasks, decided from its checked AST.

A query can run on a subset of the stream only where its semantics look at nothing but
that subset (docs/semantics.md):

- MATCH, SEQ and MATCH_RECOGNIZE with PARTITION BY: partitions are isolated (matching,
  the "event time goes backwards" check and the event time that releases trailing-NOT
  matches or ends a MATCH_RECOGNIZE's WITHIN are all per partition), so the job
  hash-partitions by the PARTITION BY attributes.
- MATCH, SEQ and MATCH_RECOGNIZE without PARTITION BY: the whole stream is one partition.
- WINDOW: one partition, always. ROWS windows number the rows of the whole stream (before
  WHERE and across groups); time windows with GROUP BY look at the stream's event time
  (the maximum over *every* event) to call an event late, so a group cannot be evaluated
  without the other groups' events.

Queries with the same split run in one Spark job, sharing one engine set per task.
"""

from __future__ import annotations

from dataclasses import dataclass

from cep_core.ast import QueryKind
from cep_core.checked import CheckedQuery


@dataclass(frozen=True)
class QueryGroup:
    """Queries that run together: hash-partitioned by `keys`, or in one task if empty."""

    keys: tuple[str, ...]
    queries: tuple[CheckedQuery, ...]

    @property
    def names(self) -> list[str]:
        return [q.name for q in self.queries]


def split_keys(checked: CheckedQuery) -> tuple[str, ...]:
    """The attributes a query's events may be partitioned by; () = one ordered partition."""
    if checked.query.kind in (QueryKind.MATCH, QueryKind.SEQ, QueryKind.RECOGNIZE):
        return tuple(a.name for a in checked.query.partition_by)
    return ()


def plan(queries: list[CheckedQuery]) -> list[QueryGroup]:
    groups: dict[tuple[str, ...], list[CheckedQuery]] = {}
    for q in queries:
        groups.setdefault(split_keys(q), []).append(q)
    return [QueryGroup(keys, tuple(qs)) for keys, qs in groups.items()]


def describe(groups: list[QueryGroup]) -> list[str]:
    return [f"{', '.join(g.names)}: " + (f"partitioned by {', '.join(g.keys)}" if g.keys
                                         else "one ordered partition") for g in groups]
