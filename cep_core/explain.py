"""What a checked query compiled to, for people: `explain(checked)` -> `Explanation`.

- MATCH: the Glushkov automaton the kernel runs (`cep_core.compiler.match.glushkov`): a
  start state and one state per position (a DEFINE name or `.`), the transitions with the
  predicate each reads, the accepting states, and the emit items.
- SEQ: the plan (`cep_core.compiler.seq_plan.SeqPlan`) and the algorithm the planner picks
  (AIP, incremental automata, for runs; CDP, column-based delayed processing, for
  skip-till-any-match): the items in sequence order (single, Kleene, AND group), the
  negations and where they sit, the WHERE conjuncts and the variables each reads, the
  window.
- WINDOW: the panes (range / slide), the aggregates kept per pane, the GROUP BY and WHERE.

Every kind: the partition key, the horizon (how far back in stream time a match can
reach, `control_message.horizon`) and an estimate of the state one key holds.

`Explanation.text()` is for a terminal, `.dot()` is Graphviz's language and `.svg()`
renders it with Graphviz's `dot` (Debian's graphviz package; `make sysdeps` installs it).
Expressions are shown as the query language writes them (`unparse`).
"""

from __future__ import annotations

# Deferred imports: the compilers (numba) load when a query is explained, not when this
# module is imported by the CLI.

import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from cep_core import ast
from cep_core.checked import CheckedQuery, select_name
from cep_core.placement import Algorithm


# ---------------------------------------------------------------- expressions as text

_PRECEDENCE = {"OR": 1, "AND": 2, "=": 4, "!=": 4, "<": 4, "<=": 4, ">": 4, ">=": 4,
               "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}


def unparse(node: ast.Expr | ast.Regex, parent: int = 0) -> str:
    """An expression (or regex) as the query language writes it."""
    if isinstance(node, ast.Literal):
        if node.duration is not None:
            return f"{node.duration.amount} {node.duration.unit}"
        if isinstance(node.value, bool):
            return "true" if node.value else "false"
        if isinstance(node.value, str):
            return "'" + node.value.replace("'", "''") + "'"
        return repr(node.value)
    if isinstance(node, ast.Attr):
        return f"{node.var}.{node.name}" if node.var and node.name else node.var or node.name
    if isinstance(node, ast.Unary):
        inner = unparse(node.operand, 7)
        return f"NOT {inner}" if node.op is ast.UnaryOp.NOT else f"-{inner}"
    if isinstance(node, ast.Binary):
        mine = _PRECEDENCE.get(node.op, 3)
        text = f"{unparse(node.left, mine)} {node.op} {unparse(node.right, mine + 1)}"
        return f"({text})" if mine < parent else text
    if isinstance(node, ast.InList):
        options = ", ".join(unparse(o) for o in node.options)
        return f"{unparse(node.operand, 4)} {'NOT IN' if node.negated else 'IN'} ({options})"
    if isinstance(node, ast.Call):
        return f"{node.name}({', '.join(unparse(a) for a in node.args)})"
    if isinstance(node, ast.Aggregate):
        offset = f", {node.offset}" if node.offset else ""  # MATCH_RECOGNIZE's LAST(B.x, 1)
        return f"{node.func.value}({'*' if node.arg is None else unparse(node.arg)}{offset})"
    if isinstance(node, ast.WindowAggregate):
        what = f"{node.event_type}({unparse(node.filter)})" if node.filter else node.event_type
        attr = f".{node.attr}" if node.attr else ""
        return (f"{node.func.value}({what}{attr} WITHIN {node.within.amount} "
                f"{node.within.unit} FROM {node.anchor})")
    return _regex(node)


def _regex(node: ast.Regex) -> str:
    if isinstance(node, ast.RSym):
        return node.name
    if isinstance(node, ast.RAny):
        return "."
    if isinstance(node, ast.REmpty):
        return "()"
    if isinstance(node, ast.RCat):
        return " ".join(_regex(i) for i in node.items)
    if isinstance(node, ast.RAlt):
        return "(" + " | ".join(_regex(o) for o in node.options) + ")"
    if isinstance(node, ast.RRepeat):
        inner = _regex(node.item)
        if isinstance(node.item, ast.RCat):
            inner = f"({inner})"
        suffix = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((node.min, node.max))
        return inner + (suffix or f"{{{node.min},{'' if node.max is None else node.max}}}")
    raise TypeError(f"cannot show {type(node).__name__}")


# ---------------------------------------------------------------- the explanation


@dataclass
class Edge:
    source: str
    target: str
    label: str
    style: str = "solid"


@dataclass
class Explanation:
    """One query: `lines` for a terminal; a graph (`nodes`: id -> (label, shape), `edges`)
    for a drawing."""

    name: str
    kind: str
    headline: str
    lines: list[str] = field(default_factory=list)
    nodes: dict[str, tuple[str, str]] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join([f"query {self.name} ({self.kind}): {self.headline}",
                          *(f"  {line}" for line in self.lines)])

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "headline": self.headline,
                "lines": self.lines,
                "nodes": [{"id": k, "label": v[0], "shape": v[1]}
                          for k, v in self.nodes.items()],
                "edges": [e.__dict__ for e in self.edges]}

    def dot(self) -> str:
        out = [f"digraph {quote(self.name)} {{", "  rankdir=LR;",
               '  node [fontname="Helvetica", fontsize=11];',
               '  edge [fontname="Helvetica", fontsize=10];',
               f"  label={quote(self.name + ': ' + self.headline)}; labelloc=t;"]
        for key, (label, shape) in self.nodes.items():
            out.append(f"  {quote(key)} [label={quote(label)}, shape={shape}];")
        for edge in self.edges:
            out.append(f"  {quote(edge.source)} -> {quote(edge.target)} "
                       f"[label={quote(edge.label)}, style={edge.style}];")
        out.append("}")
        return "\n".join(out) + "\n"

    def svg(self) -> str:
        """The drawing, rendered by Graphviz's `dot` (RuntimeError when it is missing)."""
        return svg(self.dot())


def svg(dot_text: str) -> str:
    """A graph in Graphviz's language drawn as SVG by `dot` (RuntimeError when it is
    missing or fails)."""
    dot = shutil.which("dot")
    if dot is None:
        raise RuntimeError("Graphviz's dot is not installed: apt-get install graphviz "
                           "(or `make sysdeps`); --format dot prints its input")
    done = subprocess.run([dot, "-Tsvg"], input=dot_text, capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"dot failed: {done.stderr.strip()}")
    return done.stdout


def quote(text: str) -> str:
    """A string in Graphviz's language."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def explain(checked: CheckedQuery) -> Explanation:
    body = checked.query.body
    if isinstance(body, ast.MatchQuery):
        out = _match(checked, body)
    elif isinstance(body, ast.SeqQuery):
        out = _seq(checked, body)
    elif isinstance(body, ast.RecognizeQuery):
        out = _recognize(checked, body)
    else:
        out = _window(checked, body)
    out.lines.extend(_common(checked))
    return out


def _common(checked: CheckedQuery) -> list[str]:
    from cep_core.control_message import horizon

    query = checked.query
    keys = ", ".join(unparse(a) for a in query.partition_by) or "none (one partition)"
    reach = horizon(checked)
    unit = checked.schema.time_unit
    return [f"partition by: {keys}", f"into: {query.output}",
            "horizon: " + ("unbounded" if reach is None else f"{reach} {unit} of stream time")]


def _match(checked: CheckedQuery, body: ast.MatchQuery) -> Explanation:
    from cep_core.compiler.match import glushkov

    auto = glushkov(body.pattern)
    defines = {d.name: unparse(d.condition) for d in body.defines}
    out = Explanation(checked.name, "MATCH", f"PATTERN ( {unparse(body.pattern)} ): "
                      f"{auto.size + 1} states, non-greedy, reported at the first accepting "
                      "state, then skip past the last event")

    def name(p: int) -> str:
        label = auto.labels[p]
        return "." if label < 0 else auto.names[label]

    accepting = {p for p in range(auto.size) if auto.last >> p & 1}
    out.nodes["start"] = ("start", "circle")
    for p in range(auto.size):
        out.nodes[f"p{p}"] = (f"{p + 1}: {name(p)}",
                              "doublecircle" if p in accepting else "circle")

    def arrow(p: int) -> str:
        label = name(p)
        return "any event" if label == "." else f"{label}: {defines[label]}"

    transitions = []

    def transition(source: int | None, q: int) -> None:  # None: from the start state
        out.edges.append(Edge("start" if source is None else f"p{source}", f"p{q}", arrow(q)))
        transitions.append(f"  {'start' if source is None else source + 1} -> {q + 1} on "
                           f"{arrow(q)}")

    for p in range(auto.size):
        if auto.first >> p & 1:
            transition(None, p)
        for q in range(auto.size):
            if auto.follow[p] >> q & 1:
                transition(p, q)
    states = ", ".join(f"{p + 1} ({name(p)})" for p in range(auto.size))
    out.lines.append(f"states: start, {states}")
    out.lines.append("accepting: " + ", ".join(str(p + 1) for p in sorted(accepting)))
    out.lines += transitions
    out.lines.append("emit: " + (", ".join(f"{e.name} = {unparse(e.expr)}"
                                           for e in body.emit) or "(key and seqs only)"))
    out.lines.append(f"state per key: a bit set of {auto.size} positions and the running "
                     "aggregates of each live partial match (at most one per position)")
    return out


def _seq(checked: CheckedQuery, body: ast.SeqQuery) -> Explanation:
    from cep_core.compiler.seq_plan import ItemKind, NegationAt, SeqPlan
    from cep_core.engine_factory import _seq_uses_aip

    plan = SeqPlan(checked)
    aip = _seq_uses_aip(checked, Algorithm.AUTO)
    algorithm = ("AIP (incremental automata: one instance per partial match)" if aip else
                 "CDP (column-based delayed processing: events kept per channel, matches "
                 "built when the last step arrives)")
    window = "no WITHIN" if body.within is None else \
        f"WITHIN {body.within.amount} {body.within.unit}"
    items = f"{len(plan.items)} item{'s' if len(plan.items) != 1 else ''}"
    out = Explanation(checked.name, "SEQ", f"{items}, {body.strategy.value}, "
                      f"{window}; {algorithm.split(' (')[0]}")
    out.lines.append(f"algorithm: {algorithm}")
    out.nodes["start"] = ("start", "circle")
    previous = "start"
    for item in plan.items:
        steps = ", ".join(_step(s) for s in item.steps)
        kind = {ItemKind.SINGLE: "", ItemKind.KLEENE: "KLEENE ", ItemKind.AND: "AND "}[item.kind]
        key = f"i{item.index}"
        out.nodes[key] = (f"{item.index + 1}: {kind}{steps}",
                          "doublecircle" if item.index == len(plan.items) - 1 else "box")
        out.edges.append(Edge(previous, key, "then" if item.index else "first"))
        out.lines.append(f"item {item.index + 1}: {kind}{steps}")
        previous = key
    for neg in plan.negations:
        key = f"n{neg.index}"
        out.nodes[key] = (f"NOT {_step(neg.step)}", "octagon")
        if neg.where is NegationAt.START:
            assert neg.after is not None  # a plan has a positive item after a leading NOT
            where, anchor = f"before item {neg.after + 1}", f"i{neg.after}"
        elif neg.where is NegationAt.END:
            assert neg.before is not None  # NegationAt.START when neg.before is None
            where, anchor = f"after item {neg.before + 1} (within the window)", \
                f"i{neg.before}"
        else:
            assert neg.before is not None and neg.after is not None  # NegationAt.BETWEEN
            where, anchor = f"between items {neg.before + 1} and {neg.after + 1}", \
                f"i{neg.before}"
        out.edges.append(Edge(anchor, key, "none " + where.split(" (")[0], "dashed"))
        cancel = " AND ".join(unparse(c.expr) for c in neg.conjuncts)
        out.lines.append(f"negation: no {_step(neg.step)} {where}"
                         + (f" where {cancel}" if cancel else ""))
    for c in plan.conjuncts + plan.constant_conjuncts:
        reads = ", ".join(sorted(c.vars)) or "no variable"
        out.lines.append(f"where: {unparse(c.expr)}  (reads {reads})")
    if body.emit:
        out.lines.append("emit: " + ", ".join(f"{e.name} = {unparse(e.expr)}"
                                              for e in body.emit))
    out.lines.append("state per key: " + (
        "the live automaton instances (at most max_instances)" if aip else
        "the events of each step's type still inside the window"))
    return out


def _step(step: ast.Step) -> str:
    text = f"{step.event_type} {step.var}"
    if step.filter is not None:
        text += f"({unparse(step.filter)})"
    if step.policy is not None:
        text = f"{step.policy.value} {text}"
    if step.within is not None:
        text += f" WITHIN {step.within.amount} {step.within.unit} FROM {step.anchor}"
    return text


def _recognize(checked: CheckedQuery, body: ast.RecognizeQuery) -> Explanation:
    """Flink's automaton (cep_core/reference/recognize.py): a state per counted row of each
    variable, TAKE and PROCEED edges, and the NOT a greedy quantifier puts on the edges after
    it."""
    from cep_core.reference.recognize import PROCEED, program

    nfa = program(checked)
    ids: dict[int, str] = {}
    order, stack = [], [nfa.start]
    while stack:  # number the states from the start, depth first
        state = stack.pop()
        if id(state) in ids:
            continue
        ids[id(state)] = "end" if state.final else f"s{len(ids)}"
        order.append(state)
        stack.extend(reversed([t.target for t in state.transitions]))
    defines = {d.name: unparse(d.condition) for d in body.defines}
    skip = body.skip.value.upper() + (f" {body.skip_var}" if body.skip_var else "")
    within = f", WITHIN {body.within.amount} {body.within.unit}" if body.within else ""
    out = Explanation(checked.name, "match_recognize",
                      f"Flink's NFA, {len(order)} states, AFTER MATCH SKIP {skip}{within}")
    for state in order:
        key = ids[id(state)]
        out.nodes[key] = ("end" if state.final else f"{key}: {state.var}",
                          "doublecircle" if state.final else "circle")
        for t in state.transitions:
            take = t.action != PROCEED
            what = (f"take {state.var}: {defines.get(state.var, 'TRUE')}" if take
                    else "proceed")
            unless = "".join(f" AND NOT {v}" for v in t.condition.unless)
            out.edges.append(Edge(key, ids[id(t.target)], what + unless,
                                  "solid" if take else "dashed"))
            out.lines.append(f"{key} --{what}{unless}--> {ids[id(t.target)]}")
    return out


def _window(checked: CheckedQuery, body: ast.WindowQuery) -> Explanation:
    from cep_core.compiler.window import plan as window_plan
    from cep_core.kernels import window_kernels
    from cep_core.query_limits import pane_bytes

    plan = window_plan(checked)
    unit = "rows" if plan.rows else checked.schema.time_unit
    out = Explanation(checked.name, "WINDOW", f"{plan.panes} panes of {plan.slide} {unit} "
                      f"(RANGE {plan.range} / SLIDE {plan.slide})")
    out.nodes["events"] = (checked.schema.stream, "box")
    where = " AND ".join(unparse(c, _PRECEDENCE["AND"]) for c in plan.where) or "every event"
    out.nodes["where"] = (f"WHERE {where}", "box")
    group = ", ".join(plan.group_by) or "one group"
    out.nodes["panes"] = (f"{plan.panes} panes per group ({group})", "box3d")
    items = ", ".join(f"{select_name(i)} = {unparse(i.expr)}" for i in body.items)
    out.nodes["out"] = (items, "note")
    out.edges += [Edge("events", "where", "each event"), Edge("where", "panes", "fold"),
                  Edge("panes", "out", f"every {plan.slide} {unit}: merge {plan.panes} panes")]
    out.lines += [f"window: RANGE {plan.range} SLIDE {plan.slide} {unit}: {plan.panes} panes",
                  f"where: {where}", f"group by: {group}", f"select: {items}",
                  f"state per group: {plan.panes} panes x "
                  f"{pane_bytes(plan, window_kernels)} bytes = "
                  f"{plan.panes * pane_bytes(plan, window_kernels):,} bytes"]
    return out
