"""Admission: the last step of the one check, so that "checked" means "will run".

`checker.check` calls `admit(checked, source)` for every query that passed the language
checks. It refuses, with a located `QueryError`, what the engines would refuse later or
what would exhaust a worker:

- a query text over `QueryLimits.text_bytes` (the parser refuses it before reading it);
- a MATCH pattern with more positions than the compiled automaton holds (63);
- a WINDOW whose panes (RANGE / SLIDE, or ROWS / SLIDE) exceed `QueryLimits.panes`, or
  whose panes for a single group already need more than `QueryLimits.state_bytes`;
- anything the query's compiler raises while building its program
  (`engine_factory.compile_program`: code generation, SEQ planning, what a SEQ kernel does
  not evaluate). Building a program generates and imports its kernel module but compiles
  no machine code (numba does that at a kernel's first call); the program is kept for the
  engines (once per checked query).

Bounds that depend on the data (groups of a WINDOW query, a SEQ key's partial matches)
are enforced at run time by the engines: `state_bytes` by the WINDOW engine
(`query_limits.QueryStateLimit`), SEQ's `max_instances` by the SEQ engines. A query that
goes past one then fails alone (`cep_core.stream_engines.StreamEngines.failed`).

The limits are `cep_core.query_limits`'s (the environment's or their defaults).
"""

from __future__ import annotations

# Deferred imports: the compilers (numba's import, kernel modules) load when a query is
# admitted, not when the checker is imported.

from typing import TYPE_CHECKING, Protocol

from cep_core import ast
from cep_core import regex_analysis as ra
from cep_core.errors import QueryError
from cep_core.query_limits import QueryLimits, limits, pane_bytes

if TYPE_CHECKING:
    from cep_core.checked import CheckedQuery
    from cep_core.compiler.window import WindowPlan


class _Located(Protocol):
    @property
    def pos(self) -> ast.Pos: ...


def admit(checked: CheckedQuery, source: str | None = None,
          limit: QueryLimits | None = None) -> list[QueryError]:
    """The refusals of a checked query (`CheckedQuery`) beyond the language's checks."""
    from cep_core.compiler.match import MAX_POSITIONS
    from cep_core.engine_factory import compile_program

    limit = limit or limits()
    query = checked.query
    body = query.body
    if isinstance(body, ast.MatchQuery):  # the compiler's own limit, located here
        found = len(ra.positions(body.pattern))
        if found > MAX_POSITIONS:
            return [QueryError(
                f"the pattern has {found} positions (predicate or '.' occurrences); the "
                f"compiled engine handles at most {MAX_POSITIONS}",
                _at(body.pattern, body, query), source)]
    try:
        program = compile_program(checked)
    except Exception as e:  # noqa: BLE001 - whatever the compiler refuses is a refusal
        return [QueryError(f"the compiler refuses this query: {e}", query.pos, source)]
    if isinstance(body, ast.WindowQuery):
        from cep_core.compiler.window import WindowProgram

        assert isinstance(program, WindowProgram)  # a WINDOW query's
        return _window_bounds(program.plan, _at(body.window, body, query), source, limit)
    return []


def _at(*nodes: _Located) -> ast.Pos:
    for node in nodes:
        pos: ast.Pos | None = getattr(node, "pos", None)
        if pos is not None and pos.line > 0:
            return pos
    return nodes[-1].pos


def _window_bounds(plan_: WindowPlan, where: ast.Pos, source: str | None,
                   limit: QueryLimits) -> list[QueryError]:
    from cep_core.kernels import window_kernels as wk

    if plan_.panes > limit.panes:
        unit = "rows" if plan_.rows else "time"
        return [QueryError(
            f"the window has {plan_.panes:,} panes (its {unit} range over its slide), over "
            f"the limit of {limit.panes:,} (CEP_MAX_WINDOW_PANES): use a longer SLIDE",
            where, source)]
    per_group = plan_.panes * pane_bytes(plan_, wk)
    if per_group > limit.state_bytes:
        return [QueryError(
            f"one group of this window holds {per_group:,} bytes of panes, over the limit of "
            f"{limit.state_bytes:,} (CEP_MAX_QUERY_STATE_BYTES)", where, source)]
    return []
