"""Incremental automata (AIP, Cugola & Margara) for SEQ queries: one numba kernel module per
query, generated from its `SeqPlan` (the checked AST only, never query text).

Events are kept as in CDP: per partition and per channel in seq order (see `seq_codegen`);
bound events are referred to by their absolute row in their channel. What differs
is how matches are found: partial matches are *automaton instances* that every arriving
event advances, instead of being built back from a terminator.

An instance is one int64 row: its deadline (the latest event time at which it can still
grow: first.ts + WITHIN, and each bound step's ts plus its TESLA distance to the
terminator), the smallest ts bound, the mask of *final* variables (a single variable once
bound, a Kleene variable once it can take no more elements), its position (the item being
filled), a hole count (see LAST/FIRST) and per variable its row (single) or its Kleene
list (head node in the pool, element count, first row); under ORDER BY ts also each item's
smallest ts.

skip-till-any-match. An event e is offered to every instance of its key (the partition;
under an equality class, see below, the partition and the class value) and to an empty one;
every way e can extend an instance makes a *new* instance (the old one stays: that is what
"any" means). In stream order an instance fills the items left to right: e may fill the
current item (a single step, a not yet bound AND member, one more Kleene element) or, once
a Kleene item has its minimum, close it and fill the next item. Under ORDER BY ts events
with equal times may fill positions in either order: e may fill any position whose later
positions hold only events of e's time; an instance that can no longer be completed (a gap
below a position whose time has passed) dies. A WHERE conjunct is checked as soon as all
its variables are final (a condition read element by element on one Kleene variable also
on each element as it is added), so an instance that would fail it is never created.
An instance that fills its last item *completes*: the completed matches of one event are
then finalized as the reference does (negations, pending for a trailing NOT, output).

EACH / LAST / FIRST (TESLA). The reference resolves a LAST/FIRST step backwards from the
terminator, among every event satisfying the step's conditions given the later steps,
whether or not earlier steps can be bound to it. So every event that can fill a LAST/FIRST
step j also starts a *witness* instance with items 0..j-1 left as holes (hole count j);
witnesses advance like instances but never produce output. When an event completes
instances, they are resolved backwards: for j from the last LAST/FIRST step down, the
completed instances with hole count <= j that agree on every item after j keep only the
one(s) whose step j has the largest (LAST) or smallest (FIRST) seq; survivors without holes
are the matches. (Not under ORDER BY ts, where a later event with an equal time could still
change the choice: refused.)

Negation. `NOT` between two items, in stream order, when its cancel conditions read only
variables bound before it: an instance waiting for the item after the NOT (nothing of it
bound yet) is *killed* by a cancelling event (after e had its chance to fill the item).
Every other negation (start, end, ORDER BY ts, conditions on later variables) is checked
when an instance completes, against the negated type's channel, like the reference; a match
a future event could still cancel waits in a pending table until event time passes.

skip-till-next-match and strict-contiguity. Runs, as the reference: every event that can
fill the first item starts a run; a run takes the first event that can fill its current
item (or, at a Kleene item with its minimum, the next item wins), ignores (next-match) or
dies on (strict) the others, and dies when the window is exceeded. A run is an instance
that is moved, not copied.

Equality classes. When WHERE equates one attribute across all positive variables
(`a.att = b.att AND b.att = c.att`, any spanning set of such conjuncts), only events with
the same value can ever be in one match: under skip-till-any-match instances are then kept
per (partition, value), so an event visits only the instances it could extend. Events are
still stored per partition (negations and window aggregates see them all).

Memory. Instances past their deadline are dropped when their key is visited, and every
key's at a sweep between batches; Kleene pool nodes are reclaimed between batches. The
number of live instances per key is capped (`max_instances`); see the engine.

Generated names: `I{c}`/`F{c}` the partition's channel tables, `er{c}`/`ea{c}` the
arriving event's relative/absolute row in channel c, `a{v}`/`r{v}` a single variable's
absolute/relative row, `h{v}`/`n{v}`/`f{v}` a Kleene variable's list head, count and first
row, `kk{v}`/`kn{v}` its elements materialized as relative rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cep_core import ast
from cep_core.compiler.expressions import STRING_TABLE_PARAMS
from cep_core.compiler.modules import load_module
from cep_core.compiler.seq_aip_timeouts import timeout_source
from cep_core.compiler.seq_codegen import (
    import_block,
    indent,
    seq_runtime_import,
)
from cep_core.compiler.seq_codegen_leaves import ChannelLeaves, KleeneRows, VarRows
from cep_core.compiler.seq_codegen_matches import MatchCodeGenerator
from cep_core.compiler.seq_plan import (
    Conjunct,
    Item,
    ItemKind,
    Negation,
    NegationAt,
    SeqPlan,
    Var,
    VarKind,
)
from cep_core.kernels.seq_aip_runtime import (
    AIP_RUNTIME_VERSION,
    R_DL,
    R_FIRST,
    R_FIXED,
    R_HOLE,
    R_MASK,
    R_POS,
)
from cep_core.kernels.seq_layout import ERR, INT64_MAX, INT64_MIN, OVF, PALIVE, POOL
from cep_core.kernels.seq_runtime import RUNTIME_VERSION

# the engine (engine.seq_aip) imports the kernel's constants from here
__all__ = ["ERR", "OVF", "PALIVE", "POOL", "AipGenerator", "AipKernel", "AipUnsupported"]

class AipUnsupported(ValueError):
    """The query uses a construct the AIP kernel does not evaluate."""


# ---------------------------------------------------------------- analysis


@dataclass(frozen=True)
class EqualityClass:
    """`attr` is equated across every positive variable by top-level WHERE conjuncts."""

    attr: str


def equality_class(plan: SeqPlan) -> EqualityClass | None:
    """The attribute (if any) that top-level `u.x = v.x` conjuncts equate across all
    positive variables (a spanning set of them: the equality graph is connected)."""
    names = [v.name for v in plan.positive]
    if len(names) < 2:
        return None
    edges: dict[str, list[tuple[str, str]]] = {}
    for c in plan.conjuncts:
        e = c.expr
        if not (isinstance(e, ast.Binary) and e.op is ast.BinaryOp.EQ
                and isinstance(e.left, ast.Attr) and isinstance(e.right, ast.Attr)):
            continue
        u, v = e.left.var, e.right.var
        if u is None or v is None or u == v or e.left.name != e.right.name:
            continue
        if u not in plan.variables or v not in plan.variables:
            continue
        if plan.variables[u].kind == VarKind.NEGATED or plan.variables[v].kind == VarKind.NEGATED:
            continue
        edges.setdefault(e.left.name, []).append((u, v))
    for attr, pairs in edges.items():
        group = {n: {n} for n in names}  # each variable's component
        for u, v in pairs:
            if group[u] is not group[v]:
                merged = group[u] | group[v]
                for x in merged:
                    group[x] = merged
        if len(group[names[0]]) == len(names):
            return EqualityClass(attr)
    return None


# ---------------------------------------------------------------- the generator


class AipGenerator(MatchCodeGenerator):
    """Source text of the AIP kernel module of one SEQ query."""

    Unsupported = AipUnsupported
    append_row = "_append_row"

    def __init__(self, plan: SeqPlan):
        super().__init__(plan)
        self.runs = plan.uses_runs
        self.timeouts = plan.body.emit_timeouts and self.runs  # ON TIMEOUT EMIT PARTIAL
        self.strict = plan.strategy is ast.Strategy.STRICT_CONTIGUITY
        self.items = plan.items
        self.var = {v.name: v for v in self.positive}
        self.bit = {v.name: 1 << v.index for v in self.positive}
        self.all_mask = (1 << len(self.positive)) - 1
        self.item_mask = [sum(self.bit[s.var] for s in item.steps) for item in self.items]

        # policies: LAST / FIRST steps that need resolution (not the terminator's item)
        self.policy_items = [item.index for item in self.items
                             if item.kind == ItemKind.SINGLE and item.index < self.n_items - 1
                             and item.step.policy in (ast.Policy.LAST, ast.Policy.FIRST)]
        if self.runs and self.policy_items:
            raise AipUnsupported("EACH/LAST/FIRST with a run strategy")
        if self.by_ts and self.policy_items and not self.runs:
            raise AipUnsupported(
                "LAST/FIRST under ORDER BY ts: a later event with an equal time can still "
                "change the selected event after the match completes")
        self.holes = [0] + [j for j in self.policy_items if j > 0]

        # instance row layout
        width = R_FIXED
        self.slot = {}
        for v in self.positive:
            self.slot[v.name] = width
            width += 3 if v.kind == VarKind.KLEENE else 1
        self.mt_slot = {}
        if self.by_ts and not self.runs:
            for item in self.items:
                self.mt_slot[item.index] = width
                width += 1
        self.width = width
        self.kslots = [self.slot[v.name] for v in self.kleene]

        # instance lists per key and stage (position): an event visits only the stages it
        # can advance; under ORDER BY ts (skip-till-any-match) any position can be filled
        self.S = 1 if (self.by_ts and not self.runs) else self.n_items
        self.dist = plan.chain_distances()
        self.eq = equality_class(plan) if not self.runs else None
        self.killable = self._killable()

    # ------------------------------------------------------------ analysis helpers

    def _killable(self) -> set[int]:
        """Negations an arriving event kills waiting instances for (see the module doc)."""
        if self.runs or self.by_ts or self.policy_items:
            return set()
        out = set()
        for neg in self.plan.negations:
            before = neg.before  # (None only at the start)
            if neg.where is not NegationAt.BETWEEN or before is None or \
                    self.items[before].kind == ItemKind.KLEENE:
                continue
            earlier = {s.var for item in self.items[:before + 1] for s in item.steps}
            if not all(c.vars - {neg.step.var} <= earlier for c in neg.conjuncts):
                continue
            if self.eq is not None and not self._linked(neg, self.eq.attr):
                continue
            out.add(neg.index)
        return out

    def _linked(self, neg: Negation, attr: str) -> bool:
        """A cancel conjunct equates the negated variable's class attribute `attr` with a positive
        variable's (so a cancelling event has the instance's class value)."""
        x = neg.step.var
        for c in neg.conjuncts:
            e = c.expr
            if isinstance(e, ast.Binary) and e.op is ast.BinaryOp.EQ \
                    and isinstance(e.left, ast.Attr) and isinstance(e.right, ast.Attr) \
                    and e.left.name == attr and e.right.name == attr and \
                    {e.left.var, e.right.var} - {x} and x in (e.left.var, e.right.var) and \
                    all(v == x or v in self.var for v in (e.left.var, e.right.var)):
                return True
        return False

    def cmask(self, c: Conjunct) -> int:
        return sum(self.bit[v] for v in c.vars if v in self.bit)

    def kleene_needed(self, c: Conjunct, override: VarRows) -> list[Var]:
        return [self.var[v] for v in sorted(c.vars) if v in self.var and
                self.var[v].kind == VarKind.KLEENE and v not in override]

    def binding_args(self) -> str:
        """The process kernel's materialized bindings, in binding_params order."""
        names = []
        for v in self.positive:
            names += [f"kk{v.index}", f"kn{v.index}"] if v.kind == VarKind.KLEENE \
                else [f"r{v.index}"]
        return ", ".join(names)

    # ------------------------------------------------------------ conjunct code

    def conjunct_lines(self, c: Conjunct, rows: VarRows, kleene: KleeneRows, flag: str,
                       lists: dict[str, tuple[int, str]] | None = None) -> list[str]:
        """Lines that set `flag` False unless c holds; Kleene variables read element by
        element (not given a row in `rows`) must hold for every element: over their
        materialized rows (`kleene`) or, for those in `lists` (variable -> (channel, head
        node)), straight along their pool list."""
        lists = lists or {}
        kvars = sorted(v for v in c.elementwise if v not in rows)
        full = dict(rows)
        for v in kvars:
            x = self.var[v].index
            if v in lists:
                channel = lists[v][0]
                full[v] = (channel, f"(NR[nd{x}] - evicted[p, {channel}])")
            else:
                channel, arr, _ = kleene[v]
                full[v] = (channel, f"{arr}[j{x}]")
        leaves = ChannelLeaves(self, full, kleene)
        # Deliberately like cep_core/compiler/seq_cdp.py's condition loops: AIP's leaves come from
        # a node's rows (NR, evicted), CDP's from its channels' arrays
        cond = self.expressions(leaves).condition(c.expr)
        fail = [f"if not {cond}:", f"    {flag} = False"]
        if not kvars:
            return leaves.pre + fail

        def loops(d: int) -> list[str]:
            v = kvars[d]
            x = self.var[v].index
            inner = loops(d + 1) if d + 1 < len(kvars) else leaves.pre + fail + ["    break"]
            if d + 1 < len(kvars):
                inner += [f"if not {flag}:", "    break"]
            if v in lists:
                return [f"nd{x} = {lists[v][1]}", f"while nd{x} >= 0:"] + \
                    indent(inner + [f"nd{x} = NP[nd{x}]"])
            _, _, count = kleene[v]
            return [f"for j{x} in range({count}):"] + indent(inner)

        return loops(0)

    def param_conjunct_lines(self, c: Conjunct, rows: VarRows, flag: str) -> list[str]:
        return self.conjunct_lines(c, rows, self.param_kleene(), flag)

    def instance_rows(self, override: VarRows | None = None) -> VarRows:
        rows = {v.name: (v.channel, f"r{v.index}") for v in self.singles}
        rows.update(override or {})
        return rows

    def kleene_map(self) -> KleeneRows:
        return {v.name: (v.channel, f"kk{v.index}", f"kn{v.index}") for v in self.kleene}

    def materialize(self, var: Var, adding: str | None) -> list[str]:
        """kk{v}/kn{v} from the instance's list (plus the arriving event if it is the
        variable being extended)."""
        v, c = var.index, var.channel
        extra = f"er{c}" if adding == var.name else "np.int64(-1)"
        return [f"kk{v}, kn{v} = _kmat(NR, NP, h{v}, n{v}, evicted[p, {c}], kb{v}, {extra})",
                f"kb{v} = kk{v}"]

    def checks(self, conjs: list[Conjunct], mask: str, flag: str, override: VarRows,
               adding: str | None, minus: int = 0) -> list[str]:
        """Check each conjunct whose variables (less `minus`) are all in `mask`."""
        lines = []
        for c in conjs:
            cm = self.cmask(c) & ~minus
            body = []
            lists = {}
            for var in self.kleene_needed(c, override):
                if var.name in c.aggregated or var.name == adding:
                    body += self.materialize(var, adding)
                else:  # read element by element only: walk its list
                    lists[var.name] = (var.channel, f"h{var.index}")
            body += self.conjunct_lines(c, self.instance_rows(override), self.kleene_map(),
                                        flag, lists)
            test = f"({mask} & {cm}) == {cm}" if cm else "True"
            lines += [f"if {flag} and {test}:"] + indent(body)
        return lines

    def touching(self, names: set[str]) -> list[Conjunct]:
        """Conjuncts that mention one of `names` (those that may become checkable when
        they become final)."""
        return [c for c in self.plan.conjuncts if c.vars & names]

    def element_conjuncts(self, x: str) -> list[Conjunct]:
        return [c for c in self.plan.conjuncts
                if x in c.elementwise and x not in c.aggregated]

    # ------------------------------------------------------------ module

    def source(self) -> str:
        out = [HELPERS]
        out += self.gen_cancel(self.cancel_negations(), "last_ts_")
        out += self.gen_emit("z")
        out += self.gen_release()
        out += self.gen_release_all()
        out += self.gen_process()
        if self.timeouts:
            out += timeout_source(self)
        return "\n".join(out) + "\n"

    # ------------------------------------------------------------ negations

    def cancel_negations(self) -> list[Negation]:
        """Negations checked against the stored events (those not killed early)."""
        return [n for n in self.plan.negations if n.index not in self.killable]

    def decide_lines(self) -> list[str]:
        """`decide`: the event time after which no future event can cancel the match
        (bindings as _cancel's parameters, with kk/kn names); INT64_MIN: decide now."""
        times = []
        lines = []
        for neg in self.plan.negations:
            if neg.where is NegationAt.END:
                times.append(f"dft + {self.W}")
            elif self.by_ts and neg.where is NegationAt.START:
                times.append("dft")
            elif self.by_ts:
                i = neg.after
                assert i is not None  # between two items
                item = self.items[i]
                name = f"dnt{neg.index}"
                if item.kind == ItemKind.KLEENE:
                    var = self.var[item.step.var]
                    lines.append(f"{name} = I{var.channel}[kk{var.index}[0], 1]")
                else:
                    parts = [f"I{self.var[s.var].channel}[r{self.var[s.var].index}, 1]"
                             for s in item.steps]
                    lines.append(f"{name} = " + (parts[0] if len(parts) == 1 else
                                                 f"min({', '.join(parts)})"))
                times.append(name)
        if not times:
            return ["decide = np.int64(INT64_MIN)"]
        return lines + ["decide = " + (times[0] if len(times) == 1 else
                                       f"max({', '.join(times)})")]

    # ------------------------------------------------------------ output

    def timeout_output_init(self) -> list[str]:
        return ["t_out = np.int64(0)", "t_el = np.int64(0)",
                "tom = np.empty((16, 3), np.int64)",
                f"toe_i = np.empty((16, {self.layout.n_int + 1}), np.int64)",
                f"toe_f = np.empty((16, {self.layout.n_float}), np.float64)"]

    # ------------------------------------------------------------ the main kernel

    def gen_process(self) -> list[str]:
        plan = self.plan
        L = ["@njit(cache=True)",
             f"def process(n, pid, qid, EI, EF, {self.arena_params()}, base, size, cnt, evicted, "
             "top, last_ts, IT, ibase, isize, icnt, itop, TPL, NR, NP, pd, pk, phead, ptail, "
             f"pdec, pfirst, ctr, punct, sc, {STRING_TABLE_PARAMS}, cap_i, "
             "stop_on_overflow):"]
        body = self.output_init(64)
        body += ["dead = np.empty(n, np.int64)", "n_dead = 0",
                 f"NEW = np.empty((16, {self.width}), np.int64)",
                 f"CMP = np.empty((16, {self.width}), np.int64)",
                 f"RUN = np.empty({self.width}, np.int64)",
                 f"VIS = np.empty({self.S}, np.bool_)",
                 "const_ok = True"]
        body += [f"kb{v.index} = np.empty(16, np.int64)" for v in self.kleene]
        for c in plan.constant_conjuncts:
            body += ["if const_ok:"] + indent(self.conjunct_lines(c, {}, {}, "const_ok"))
        loop = self.arrival_lines("q = qid[t]")
        if self.timeouts:  # expired runs leave before e is stored or offered to them
            loop += self.fetch_lines()
            loop += ["tom, toe_i, toe_f, t_out, t_el = _time_out("
                     f"p, now, False, {self.channel_params()}, evicted[p], IT, ibase, icnt, "
                     "NR, NP, tom, toe_i, toe_f, t_out, t_el)"]
        loop += self.release_due_lines()
        loop += self.append_lines()
        loop += self.fetch_lines()
        loop += self.event_lines()
        if self.runs:
            loop += self.runs_lines()
        else:
            loop += self.any_lines()
        loop += ["if ncmp > 0:"] + indent(self.finalize_lines())
        body += ["for t in range(n):"] + indent(loop)
        ret = ("return n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn, n_dead, dead, pd, pk, "
               f"IT, NR, NP, ({self.arena_params()},)")
        if self.timeouts:
            body[:0] = self.timeout_output_init()
            ret += ", t_out, t_el, tom, toe_i, toe_f"
        body.append(ret)
        return L + indent(body) + [""]

    def event_lines(self) -> list[str]:
        """The arriving event's rows, which steps / negations it fits and which stages
        (instance lists by position) it must visit."""
        lines = []
        for c in self.channels:
            lines += [f"er{c} = I{c}.shape[0] - 1", f"ea{c} = evicted[p, {c}] + er{c}"]
        fits = []
        for var in self.positive:
            c, v = var.channel, var.index
            flt = self.filter_code(var.step, c, f"er{c}")
            lines.append(f"fit{v} = ein{c}" + (f" and {flt}" if flt else ""))
            fits.append(f"fit{v}")
        kills: dict[int | None, list[str]] = {}  # item after -> kill flags
        for neg in self.plan.negations:
            if neg.index in self.killable:
                var = self.plan.variables[neg.step.var]
                c = var.channel
                flt = self.filter_code(neg.step, c, f"er{c}")
                lines.append(f"kx{neg.index} = ein{c}" + (f" and {flt}" if flt else ""))
                fits.append(f"kx{neg.index}")
                kills.setdefault(neg.after, []).append(f"kx{neg.index}")
        lines += ["nn = 0", "ncmp = 0"]
        if self.runs and self.strict:
            # an event that no run takes kills every run of the partition
            lines += [f"if not ({' or '.join(fits)}):",
                      f"    for st in range({self.S}):",
                      f"        icnt[q * {self.S} + st] = 0",
                      "    continue"]
        else:
            lines += [f"if not ({' or '.join(fits)}):", "    continue"]
        if self.S == 1:
            lines.append("VIS[0] = True")
            return lines
        for item in self.items:
            i = item.index
            conds = [f"fit{self.var[s.var].index}" for s in item.steps]
            if item.kind == ItemKind.KLEENE and i + 1 < self.n_items:
                conds += [f"fit{self.var[s.var].index}" for s in self.items[i + 1].steps]
            conds += kills.get(i, [])
            lines.append(f"VIS[{i}] = " + " or ".join(conds))
        return lines

    # ------------------------------------------------------------ instances

    def load_lines(self) -> list[str]:
        lines = [f"ft = src[ri, {R_FIRST}]", f"M = src[ri, {R_MASK}]", f"pos = src[ri, {R_POS}]"]
        for var in self.singles:
            v, c, s = var.index, var.channel, self.slot[var.name]
            lines += [f"a{v} = src[ri, {s}]", f"r{v} = a{v} - evicted[p, {c}]"]
        for var in self.kleene:
            v, s = var.index, self.slot[var.name]
            lines += [f"h{v} = src[ri, {s}]", f"n{v} = src[ri, {s + 1}]",
                      f"f{v} = src[ri, {s + 2}]"]
        for i, s in self.mt_slot.items():
            lines.append(f"mt{i} = src[ri, {s}]")
        return lines

    def row_lines(self, dst: str, idx: str, fields: dict[int, str]) -> list[str]:
        """Append a copy of the current instance, with `fields` (column -> code) changed,
        to table `dst` at row `idx` (grown as needed; idx incremented)."""
        lines = [f"if {idx} >= {dst}.shape[0]:",
                 f"    {dst} = _grow_rows({dst}, {idx} + 1)",
                 f"for z in range({self.width}):",
                 f"    {dst}[{idx}, z] = src[ri, z]"]
        lines += [f"{dst}[{idx}, {col}] = {code}" for col, code in fields.items()]
        lines.append(f"{idx} += 1")
        return lines

    def node_lines(self, var: Var) -> list[str]:
        v, c = var.index, var.channel
        return [f"if ctr[{POOL}] >= NR.shape[0]:",
                f"    NR, NP = _grow_pool(NR, NP, ctr[{POOL}] + 1)",
                f"nd = ctr[{POOL}]", f"NR[nd] = ea{c}", f"NP[nd] = h{v}",
                f"ctr[{POOL}] = nd + 1"]

    def anchor_lines(self, var: Var, flag: str) -> list[str]:
        """TESLA `WITHIN w FROM y` between the variable being bound and bound ones."""
        lines = []
        plan = self.plan
        for u in self.positive:
            if u.step.anchor != var.name:
                continue
            w = plan.step_within(u.step)
            cu = u.channel
            if u.kind == VarKind.KLEENE:
                lines += [f"if {flag} and n{u.index} > 0 and "
                          f"I{cu}[f{u.index} - evicted[p, {cu}], 1] < ets - {w}:",
                          f"    {flag} = False"]
            else:
                lines += [f"if {flag} and (M & {self.bit[u.name]}) != 0 and "
                          f"I{cu}[r{u.index}, 1] < ets - {w}:", f"    {flag} = False"]
        if var.step.anchor is not None:
            y = self.var[var.step.anchor]
            w = plan.step_within(var.step)
            lines += [f"if {flag} and (M & {self.bit[y.name]}) != 0 and "
                      f"ets < I{y.channel}[r{y.index}, 1] - {w}:", f"    {flag} = False"]
        return lines

    def deadline_code(self, var: Var) -> str:
        parts = ["dl"]
        if self.W is not None:
            parts.append(f"nft + {self.W}")
        if self.dist is not None:
            parts.append(f"ets + {self.dist[var.name]}")
        return parts[0] if len(parts) == 1 else f"min({', '.join(parts)})"

    def complete_code(self, mask: str, counts: dict[str, str]) -> str:
        """Every item has what it needs (mask: final variables; counts: Kleene counts)."""
        parts = []
        for item in self.items:
            if item.kind == ItemKind.KLEENE:
                var = self.var[item.step.var]
                parts.append(f"{counts.get(var.name, f'n{var.index}')} >= {item.step.min}")
            else:
                m = self.item_mask[item.index]
                parts.append(f"({mask} & {m}) == {m}")
        return " and ".join(parts)

    def any_lines(self) -> list[str]:
        """skip-till-any-match: offer e to the instances of key q in the stages it can
        advance, then to the empty ones (templates)."""
        nvirt = len(self.holes)
        S = self.S
        lines = [f"for st in range({S + 1}):"]
        head = [f"if st < {S}:",
                "    if not VIS[st]:",
                "        continue",
                f"    seg = q * {S} + st",
                "    b = ibase[seg]",
                "    nv = icnt[seg]",
                "else:",
                "    seg = -1",
                "    b = 0",
                f"    nv = {nvirt}",
                "r = 0",
                "while r < nv:"]
        visit = ["alive = True",
                 f"if st < {S}:",
                 "    src = IT",
                 "    ri = b + r",
                 f"    dl = src[ri, {R_DL}]",
                 "    if ets > dl:",
                 "        alive = False",
                 "else:",
                 "    src = TPL",
                 "    ri = r",
                 f"    dl = src[ri, {R_DL}]",
                 "if alive:"]
        live = self.load_lines()
        if self.by_ts:
            live += [f"if st < {S}:"] + indent(self.viability_lines() +
                                                ["alive = viable"])
        live.append("if alive:")
        body = []
        if self.W is not None:
            body.append(f"if ft == {INT64_MAX} or ets - ft <= {self.W}:")
        else:
            body.append("if True:")
        trials = []
        for var in self.positive:
            trials += self.trial_lines(var)
        body += indent(trials)
        kills = self.kill_lines()
        if kills:
            body += [f"if st < {S}:"] + indent(kills)
        live += indent(body)
        visit += indent(live)
        visit += self.unlink_dead_lines()
        head += indent(visit)
        head += [f"if st < {S}:", "    icnt[seg] = nv"]
        lines += indent(head)
        lines += self.append_new_lines()
        if self.policy_items:
            lines += ["if ncmp > 1:"] + indent(self.resolution_lines())
        return lines

    def unlink_dead_lines(self) -> list[str]:
        """After visiting instance (or run) r of a stage's list: one that died (or moved on)
        is replaced by the list's last (the lists are unordered); else go to r + 1."""
        return [f"if st < {self.S} and not alive:",
                "    nv -= 1",
                "    if r != nv:",
                f"        for z in range({self.width}):",
                "            IT[b + r, z] = IT[b + nv, z]",
                "    continue",
                "r += 1"]

    def append_new_lines(self) -> list[str]:
        """The new instances (and moved runs) of this event into their stages' lists,
        at most `cap_i` live per key."""
        S = self.S
        return ["if nn > 0:",
                "    tot = 0",
                f"    for st in range({S}):",
                f"        tot += icnt[q * {S} + st]",
                "    if tot + nn > cap_i:",
                f"        ctr[{OVF}] += tot + nn - cap_i",
                "        nn = max(cap_i - tot, 0)",
                "        if stop_on_overflow:",
                f"            ctr[{ERR}] = t",
                "            break",
                f"    for st in range({S}):",
                "        k = 0",
                "        for y in range(nn):",
                f"            if {S} == 1 or NEW[y, {R_POS}] == st:",
                "                k += 1",
                "        if k == 0:",
                "            continue",
                f"        seg = q * {S} + st",
                "        w = icnt[seg]",
                "        IT = _seg_reserve(IT, ibase, isize, icnt, itop, seg, w + k)",
                "        b = ibase[seg]",
                "        for y in range(nn):",
                f"            if {S} == 1 or NEW[y, {R_POS}] == st:",
                f"                for z in range({self.width}):",
                "                    IT[b + w, z] = NEW[y, z]",
                "                w += 1",
                "        icnt[seg] = w"]

    def viability_lines(self) -> list[str]:
        """ORDER BY ts: can the instance still complete, and can it still change?"""
        lines = ["viable = True", "grow = False", f"sm = np.int64({INT64_MAX})"]
        for item in reversed(self.items):
            i = item.index
            if item.kind == ItemKind.KLEENE:
                var = self.var[item.step.var]
                incomplete = f"n{var.index} < {item.step.min}"
                avail = "True" if item.step.max is None else f"n{var.index} < {item.step.max}"
            else:
                m = self.item_mask[i]
                incomplete = f"(M & {m}) != {m}"
                avail = incomplete
            lines += ["if sm >= ets:",
                      f"    if {avail}:",
                      "        grow = True",
                      f"elif {incomplete}:",
                      "    viable = False",
                      f"sm = min(sm, mt{i})"]
        lines.append("viable = viable and grow")
        return lines

    def trial_lines(self, var: Var) -> list[str]:
        """Every way e can be added to `var` of the instance."""
        i = self.plan.variables[var.name].item
        assert i is not None  # a positive variable's
        item = self.items[i]
        v = var.index
        modes: list[tuple[str, Var | None]] = []  # (gate, Kleene variable it closes)
        if self.by_ts:
            avail = f"(M & {self.bit[var.name]}) == 0" if var.kind == VarKind.SINGLE else \
                ("True" if item.step.max is None else f"n{v} < {item.step.max}")
            later = [f"mt{k} >= ets" for k in range(i + 1, self.n_items)]
            modes.append((" and ".join([avail] + later), None))
        else:
            if var.kind == VarKind.KLEENE:
                direct = f"pos == {i}" + ("" if item.step.max is None
                                          else f" and n{v} < {item.step.max}")
            elif item.kind == ItemKind.AND:
                direct = f"pos == {i} and (M & {self.bit[var.name]}) == 0"
            else:
                direct = f"pos == {i}"
            modes.append((direct, None))
            if i > 0 and self.items[i - 1].kind == ItemKind.KLEENE:
                prev = self.var[self.items[i - 1].step.var]
                modes.append((f"pos == {i - 1} and n{prev.index} >= "
                               f"{self.items[i - 1].step.min}", prev))
        out = []
        for gate, closing in modes:
            out += [f"if fit{v} and {gate}:"] + indent(self.trial_body(var, item, closing))
        return out

    def trial_body(self, var: Var, item: Item, closing: Var | None) -> list[str]:
        v, c, i = var.index, var.channel, item.index
        last = i == self.n_items - 1
        bit = self.bit[var.name]
        closebit = self.bit[closing.name] if closing is not None else 0
        lines = ["tok = True", f"bM = M | {closebit}"]
        if var.kind == VarKind.KLEENE:
            lines.append("nM = bM")
        else:
            lines.append(f"nM = bM | {bit}")
        lines += self.anchor_lines(var, "tok")
        override = {}
        if var.kind == VarKind.KLEENE:
            # the element's own conditions (other variables final)
            override = {var.name: (c, f"er{c}")}
            lines += self.checks(self.element_conjuncts(var.name), "bM", "tok", override,
                                 None, minus=bit)
        newly = set()
        if closing is not None:
            newly.add(closing.name)
        if var.kind != VarKind.KLEENE:
            newly.add(var.name)
        if newly:
            ov = {} if var.kind == VarKind.KLEENE else {var.name: (c, f"er{c}")}
            lines += self.checks(self.touching(newly), "nM", "tok", ov, None)
        body = ["nft = min(ft, ets)", f"ndl = {self.deadline_code(var)}"]
        fields = {R_DL: "ndl", R_FIRST: "nft", R_MASK: "nM"}
        if self.by_ts:
            fields[self.mt_slot[i]] = f"min(mt{i}, ets)"
        if var.kind == VarKind.KLEENE:
            body += self.node_lines(var)
            s = self.slot[var.name]
            fields.update({R_POS: str(i), s: "nd", s + 1: f"n{v} + 1"})
            fields[s + 2] = f"ea{c} if n{v} == 0 else f{v}"
        else:
            fields[self.slot[var.name]] = f"ea{c}"
            if item.kind == ItemKind.AND:
                fields[R_POS] = f"{i + 1} if (nM & {self.item_mask[i]}) == " \
                                f"{self.item_mask[i]} else {i}"
            else:
                fields[R_POS] = str(i + 1)
        if self.by_ts:
            body += self.by_ts_result(var, item, fields)
        elif var.kind == VarKind.KLEENE:
            keep = not last or item.step.max is None or item.step.max > 1
            if keep:
                grow = [] if (not last or item.step.max is None) else \
                    [f"if n{v} + 1 < {item.step.max}:"]
                rows = self.row_lines("NEW", "nn", fields)
                body += grow + (indent(rows) if grow else rows)
            if last:
                done = ["cok = True", f"cM = nM | {bit}"]
                done += self.checks(self.touching({var.name}), "cM", "cok", {}, var.name)
                cf = dict(fields)
                cf.update({R_MASK: "cM", R_POS: str(i + 1)})
                done += ["if cok:"] + indent(self.row_lines("CMP", "ncmp", cf))
                body += [f"if n{v} + 1 >= {item.step.min}:"] + indent(done)
        elif last and item.kind == ItemKind.SINGLE:
            body += self.row_lines("CMP", "ncmp", fields)
        elif last:
            m = self.item_mask[i]
            body += [f"if (nM & {m}) == {m}:"] + indent(self.row_lines("CMP", "ncmp", fields))
            body += ["else:"] + indent(self.row_lines("NEW", "nn", fields))
        else:
            body += self.row_lines("NEW", "nn", fields)
        lines += ["if tok:"] + indent(body)
        return lines

    def by_ts_result(self, var: Var, item: Item, fields: dict[int, str]) -> list[str]:
        """ORDER BY ts: the new instance (while it can change) and, when every item is
        filled, a completion (the conditions on Kleene variables checked on it)."""
        v = var.index
        counts = {var.name: f"n{v} + 1"} if var.kind == VarKind.KLEENE else {}
        lines = [f"full = {self.complete_code('nM', counts)}"]
        growable = []
        for k in self.kleene:
            assert k.item is not None  # a positive variable's
            mx = self.items[k.item].step.max
            cnt = counts.get(k.name, f"n{k.index}")
            growable.append("True" if mx is None else f"{cnt} < {mx}")
        can_change = " or ".join(growable) if growable else "False"
        lines += [f"if not full or {can_change}:"] + indent(
            self.row_lines("NEW", "nn", fields))
        done = ["cok = True", f"cM = nM | {self.all_mask}"]
        if self.kleene:
            names = {k.name for k in self.kleene}
            ov = {} if var.kind == VarKind.KLEENE else {var.name: (var.channel, f"er{var.channel}")}
            done += self.checks(self.touching(names), "cM", "cok", ov,
                                var.name if var.kind == VarKind.KLEENE else None)
        cf = dict(fields)
        cf[R_MASK] = "cM"
        done += ["if cok:"] + indent(self.row_lines("CMP", "ncmp", cf))
        lines += ["if full:"] + indent(done)
        return lines

    def kill_lines(self) -> list[str]:
        """Negations between items: a cancelling event kills a waiting instance."""
        lines = []
        for neg in self.plan.negations:
            if neg.index not in self.killable:
                continue
            i = neg.after
            assert i is not None  # a killable negation is between two items
            item = self.items[i]
            if item.kind == ItemKind.KLEENE:
                empty = f"n{self.var[item.step.var].index} == 0"
            else:
                empty = f"(M & {self.item_mask[i]}) == 0"
            nvar = self.plan.variables[neg.step.var]
            override = {neg.step.var: (nvar.channel, f"er{nvar.channel}")}
            body = ["kok = True"]
            body += self.checks(neg.conjuncts, "M", "kok", override, None,
                                minus=0)
            body += ["if kok:", "    alive = False"]
            lines += [f"if alive and kx{neg.index} and pos == {i} and {empty}:"] + \
                indent(body)
        return lines

    def resolution_lines(self) -> list[str]:
        """LAST / FIRST: among completed instances agreeing on the items after step j,
        keep those whose step j is the latest / earliest (see the module doc)."""
        lines = ["sel = np.empty(ncmp, np.int64)"]
        for j in sorted(self.policy_items, reverse=True):
            u = self.var[self.items[j].step.var]
            s = self.slot[u.name]
            better = ">" if self.items[j].step.policy is ast.Policy.LAST else "<"
            same = self.same_suffix_code(j)
            lines += ["for z in range(ncmp):",
                      f"    sel[z] = CMP[z, {s}]",
                      f"    if CMP[z, {R_MASK}] < 0 or CMP[z, {R_HOLE}] > {j}:",
                      "        continue",
                      "    for y in range(ncmp):",
                      f"        if y == z or CMP[y, {R_MASK}] < 0 or CMP[y, {R_HOLE}] > {j}:",
                      "            continue",
                      f"        if CMP[y, {s}] {better} sel[z] and {same}:",
                      f"            sel[z] = CMP[y, {s}]",
                      "for z in range(ncmp):",
                      f"    if CMP[z, {R_MASK}] >= 0 and CMP[z, {R_HOLE}] <= {j} and "
                      f"CMP[z, {s}] != sel[z]:",
                      f"        CMP[z, {R_MASK}] = -1"]
        return lines

    def same_suffix_code(self, j: int) -> str:
        parts = []
        for item in self.items[j + 1:]:
            for step in item.steps:
                var = self.var[step.var]
                s = self.slot[var.name]
                if var.kind == VarKind.KLEENE:
                    parts.append(f"CMP[y, {s + 1}] == CMP[z, {s + 1}]")
                    parts.append(f"_same_list(NR, NP, CMP[y, {s}], CMP[z, {s}], "
                                 f"CMP[z, {s + 1}])")
                else:
                    parts.append(f"CMP[y, {s}] == CMP[z, {s}]")
        return "(" + " and ".join(parts) + ")" if parts else "True"

    # ------------------------------------------------------------ runs

    def runs_lines(self) -> list[str]:
        """skip-till-next-match / strict-contiguity: offer e to the runs of the partition
        in the stages it can advance (a run dies past its window; under strict also when
        it does not take e, and every run of a stage e cannot advance dies), then let e
        start a run."""
        S = self.S
        lines = [f"for st in range({S + 1}):"]
        head = [f"if st < {S}:",
                "    seg = q * " + str(S) + " + st",
                "    if not VIS[st]:"]
        head += ["        icnt[seg] = 0"] if self.strict else []
        head += ["        continue",
                 "    b = ibase[seg]",
                 "    nv = icnt[seg]",
                 "else:",
                 "    seg = -1",
                 "    b = 0",
                 "    nv = 1",
                 "r = 0",
                 "while r < nv:"]
        visit = [f"if st < {S}:",
                 "    src = IT",
                 "    ri = b + r",
                 "else:",
                 "    src = TPL",
                 "    ri = 0",
                 "alive = True"]
        visit += self.load_lines()
        visit += [f"if st == {S}:", "    ft = ets"]
        if self.W is not None:
            visit += [f"elif ets - ft > {self.W}:", "    alive = False"]
        live = ["for z in range(RUN.shape[0]):", "    RUN[z] = src[ri, z]",
                f"RUN[{R_FIRST}] = ft",
                "taken = False", "cmpl = False"]
        if self.W is not None:
            live += [f"if st == {S}:", f"    RUN[{R_DL}] = ets + {self.W}"]
        take = []
        for item in self.items:
            take += [f"if pos == {item.index}:"] + indent(self.take_lines(item))
        live += [f"if st < {S}:"] + indent(take)
        live += ["else:"] + indent(self.enter_lines(self.items[0], "M"))
        live += ["if taken and cmpl:"] + indent(self.run_to_cmp() + ["alive = False"])
        live += ["elif taken:",
                 "    if nn >= NEW.shape[0]:",
                 "        NEW = _grow_rows(NEW, nn + 1)",
                 f"    for z in range({self.width}):",
                 "        NEW[nn, z] = RUN[z]",
                 "    nn += 1",
                 "    alive = False"]
        if self.strict:
            live += ["else:", "    alive = False"]
        visit += ["if alive:"] + indent(live)
        visit += self.unlink_dead_lines()
        head += indent(visit)
        head += [f"if st < {S}:", "    icnt[seg] = nv"]
        lines += indent(head)
        lines += self.append_new_lines()
        return lines

    def run_to_cmp(self) -> list[str]:
        return ["if ncmp >= CMP.shape[0]:",
                "    CMP = _grow_rows(CMP, ncmp + 1)",
                f"for z in range({self.width}):",
                "    CMP[ncmp, z] = RUN[z]",
                "ncmp += 1"]

    def take_lines(self, item: Item) -> list[str]:
        if item.kind != ItemKind.KLEENE:
            return self.enter_lines(item, "M")
        var = self.var[item.step.var]
        v = var.index
        lines = []
        if item.index + 1 < self.n_items:
            close = ["cM = M | " + str(self.bit[var.name]), "cok = True"]
            close += self.checks(self.touching({var.name}), "cM", "cok", {}, None)
            close += ["if cok:"] + indent(self.enter_lines(self.items[item.index + 1], "cM"))
            lines += [f"if n{v} >= {item.step.min}:"] + indent(close)
        grow = self.enter_lines(item, "M")
        cond = "not taken" + ("" if item.step.max is None else f" and n{v} < {item.step.max}")
        lines += [f"if {cond}:"] + indent(grow)
        return lines

    def enter_lines(self, item: Item, closed: str) -> list[str]:
        """e fills (part of) item j of the run (as the reference's _enter): sets `taken`,
        `cmpl` and the run's new fields in RUN."""
        j = item.index
        last = j == self.n_items - 1
        if item.kind == ItemKind.KLEENE:
            var = self.var[item.step.var]
            v, c = var.index, var.channel
            bit = self.bit[var.name]
            lines = [f"if fit{v}:"]
            body = ["eok = True"]
            body += self.checks(self.element_conjuncts(var.name), closed, "eok",
                                {var.name: (c, f"er{c}")}, None, minus=bit)
            grown = self.node_lines(var) + [
                "taken = True",
                f"RUN[{R_MASK}] = {closed}", f"RUN[{R_POS}] = {j}",
                f"RUN[{self.slot[var.name]}] = nd",
                f"RUN[{self.slot[var.name] + 1}] = n{v} + 1",
                f"if n{v} == 0:", f"    RUN[{self.slot[var.name] + 2}] = ea{c}"]
            if last:
                done = ["dM = " + closed + f" | {bit}", "dok = True"]
                done += self.checks(self.touching({var.name}), "dM", "dok", {}, var.name)
                done += ["if dok:", "    cmpl = True", f"    RUN[{R_MASK}] = dM",
                         f"    RUN[{R_POS}] = {j + 1}"]
                grown += [f"if n{v} + 1 >= {item.step.min}:"] + indent(done)
            body += ["if eok:"] + indent(grown)
            return lines + indent(body)
        lines = []
        for step in item.steps:
            var = self.var[step.var]
            v, c = var.index, var.channel
            bit = self.bit[var.name]
            gate = f"not taken and fit{v}"
            if item.kind == ItemKind.AND:
                gate += f" and ({closed} & {bit}) == 0"
            body = [f"aM = {closed} | {bit}", "aok = True"]
            body += self.checks(self.touching({var.name}), "aM", "aok",
                                {var.name: (c, f"er{c}")}, None)
            done = ["taken = True", f"RUN[{R_MASK}] = aM", f"RUN[{self.slot[var.name]}] = ea{c}"]
            if item.kind == ItemKind.AND:
                m = self.item_mask[j]
                done += [f"if (aM & {m}) == {m}:", f"    RUN[{R_POS}] = {j + 1}"]
                if last:
                    done.append("    cmpl = True")
                done += ["else:", f"    RUN[{R_POS}] = {j}"]
            else:
                done.append(f"RUN[{R_POS}] = {j + 1}")
                if last:
                    done.append("cmpl = True")
            body += ["if aok:"] + indent(done)
            lines += [f"if {gate}:"] + indent(body)
        return lines

    # ------------------------------------------------------------ completed matches

    def finalize_lines(self) -> list[str]:
        """Every completed instance without holes: negations, pending or output."""
        lines = ["for z in range(ncmp):"]
        body = [f"if CMP[z, {R_MASK}] < 0 or CMP[z, {R_HOLE}] != 0:", "    continue",
                "if not const_ok:", "    continue"]
        for var in self.singles:
            v, c, s = var.index, var.channel, self.slot[var.name]
            body.append(f"r{v} = CMP[z, {s}] - evicted[p, {c}]")
        for var in self.kleene:
            v, c, s = var.index, var.channel, self.slot[var.name]
            body += [f"kk{v}, kn{v} = _kmat(NR, NP, CMP[z, {s}], CMP[z, {s + 1}], "
                     f"evicted[p, {c}], kb{v}, np.int64(-1))", f"kb{v} = kk{v}"]
        body.append(f"dft = CMP[z, {R_FIRST}]")
        decided = self.output_lines(self.binding_args(), self.element_count("kn"),
                                    bool(self.cancel_negations()))
        if self.pending_possible:
            body += self.decide_lines()
            body += ["if not now > decide:"] + indent(self.pending_lines("dft", "kk", "kn"))
            body += ["else:"] + indent(decided)
        else:
            body += decided
        return lines + indent(body)


AIP_RUNTIME_HELPERS = ("grow_pool", "kmat", "same_list", "seg_reserve")
HELPERS = (f"\n# runtime versions {RUNTIME_VERSION} / {AIP_RUNTIME_VERSION}\n"
           + import_block("cep_core.kernels.seq_aip_runtime",
                          {name: f"_{name}" for name in AIP_RUNTIME_HELPERS})
           + seq_runtime_import(AipGenerator.append_row)
           + f"\nINT64_MIN = np.int64({INT64_MIN})\nINT64_MAX = np.int64({INT64_MAX})\n\n")


class AipKernel:
    """The loaded kernel module of one query and what running and decoding it needs."""

    def __init__(self, plan: SeqPlan):
        self.plan = plan
        self.generator = gen = AipGenerator(plan)
        self.source = gen.source()
        self.module = load_module(self.source)
        self.layout = gen.layout
        self.constants = gen.constants
        self.width = gen.width
        self.record_width = gen.record_width
        self.n_emit = gen.n_emit
        self.holes = gen.holes
        self.kslots = gen.kslots
        self.pkslots = [gen.pending_slot[v.name] for v in plan.positive if v.kind == VarKind.KLEENE]
        # (pending record column, channel, Kleene?) of each variable a pending match binds
        self.pending_vars = [(gen.pending_slot[v.name], v.channel, v.kind == VarKind.KLEENE)
                             for v in plan.positive]
        self.equality = gen.eq

    def templates(self) -> npt.NDArray[np.int64]:
        """The empty instances every event is offered to (hole 0, then witnesses)."""
        gen = self.generator
        tpl = np.zeros((len(self.holes), self.width), np.int64)
        for k, hole in enumerate(self.holes):
            tpl[k, R_DL] = INT64_MAX
            tpl[k, R_FIRST] = INT64_MAX
            tpl[k, R_POS] = hole
            tpl[k, R_HOLE] = hole
            for v in gen.positive:
                s = gen.slot[v.name]
                if v.kind == VarKind.KLEENE:
                    tpl[k, s] = -1
                    tpl[k, s + 1] = 0
                    tpl[k, s + 2] = -1
                else:
                    tpl[k, s] = -1
            for s in gen.mt_slot.values():
                tpl[k, s] = INT64_MAX
        return tpl
