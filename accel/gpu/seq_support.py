"""Which SEQ queries the GPU engine evaluates (a documented subset, tested differentially
against the reference interpreter); `unsupported_reason` names why one is left to the CPU.

Supported: skip-till-any-match in stream order, single steps (TESLA's EACH / LAST / FIRST,
`WITHIN w` and `WITHIN w FROM y`), PARTITION BY, step filters, WHERE conditions over the
steps' attributes (parameters), window aggregates (`avg(T(filter).a WITHIN w FROM y)`) in
EMIT and in WHERE conditions decided at an EACH step or at the terminator.
"""

from __future__ import annotations

from cep_core import ast
from cep_core.compiler.seq_plan import Conjunct, ItemKind, SeqPlan


def has_window_aggregate(expr: ast.Expr | None) -> bool:
    return expr is not None and expr.find(ast.WindowAggregate) is not None


def deciding_item(plan: SeqPlan, conjunct: Conjunct) -> int:
    """The positive item at which building back binds the conjunct's last variable."""
    for i in range(len(plan.items) - 1, -1, -1):
        if conjunct.vars <= plan.bound_after(i):
            return i
    raise ValueError("a conjunct over no positive variable")


def unsupported_reason(plan: SeqPlan) -> str | None:
    if plan.uses_runs:
        return f"USING {plan.strategy.value} is evaluated by incremental automata (AIP)"
    if plan.by_ts:
        return "ORDER BY ts (simultaneous events) is evaluated on the CPU"
    if any(item.kind is not ItemKind.SINGLE for item in plan.items):
        return "Kleene and AND steps are evaluated on the CPU"
    if plan.negations:
        return "NOT steps are evaluated on the CPU"
    if plan.constant_conjuncts:
        return "WHERE conditions over no variable are evaluated on the CPU"
    for step in plan.all_steps():
        if has_window_aggregate(step.filter):
            return "window aggregates inside step filters are evaluated on the CPU"
    last = len(plan.items) - 1
    for c in plan.conjuncts:
        if not has_window_aggregate(c.expr):
            continue
        i = deciding_item(plan, c)
        policy = plan.items[i].step.policy
        if i != last and policy not in (None, ast.Policy.EACH):
            return (f"a window aggregate decided at a {policy.value} step is evaluated on "
                    "the CPU")
    for use in plan.window_aggregates.values():
        if has_window_aggregate(use.node.filter):
            return "nested window aggregates are evaluated on the CPU"
    return None
