"""Column-based delayed processing (CDP, Cugola & Margara) for SEQ queries: one numba kernel
module per query, generated from its `SeqPlan` (the checked AST only, never query text).

State: per partition and per channel, the events of that channel in seq order (see
`seq_codegen`).

When an event arrives it is appended to its channels; then every match whose positive event
with the largest seq is this event is built back from it, as the reference interpreter does
(`cep_core/reference/seq.py`): positive items from the last to the first, each item's
candidates found by binary search on the window bounds (the global WITHIN from the events
bound so far, TESLA's `WITHIN w FROM y`, the order before the next item), then filtered by
the step's filter and the WHERE conjuncts whose variables are then all bound. The nesting is
known at compile time, so each item is one generated loop: EACH takes every candidate, LAST
the latest, FIRST the earliest; a Kleene item enumerates every ordered subset of its
qualifying candidates (sizes ascending, then lexicographically); an AND group assigns its
members in written order. Negations are existence checks: binary search for the region in
the negated type's column, then a scan. Matches a future event could still cancel (trailing
NOT; equal timestamps under ORDER BY ts) wait in a pending table until event time passes
their deciding time, exactly as the reference.

Blow-up: a terminator whose enumeration would exceed `max_matches_per_event` matches or
`max_subsets_per_event` Kleene subsets stops there (the engine decides what that means).

Generated names: `I{c}`/`F{c}` channel tables of the current partition, `r{v}` the row of a
bound single variable, `k{v}`/`n{v}` the rows/count of a Kleene variable, `x{v}` the row of
a negated variable under test.
"""

from __future__ import annotations

from typing import TypedDict

from cep_core import ast
from cep_core.compiler.expressions import STRING_TABLE_PARAMS
from cep_core.compiler.modules import load_module
from cep_core.compiler.seq_codegen import (
    Layout,
    indent,
    seq_runtime_import,
)
from cep_core.compiler.seq_codegen_leaves import ChannelLeaves, VarRows
from cep_core.compiler.seq_codegen_matches import MatchCodeGenerator
from cep_core.compiler.seq_plan import Conjunct, ItemKind, NegationAt, SeqPlan, VarKind
from cep_core.kernels.seq_layout import ERR, INT64_MIN, OVF, P_NEXT, PALIVE, PEL, PKN, PN
from cep_core.kernels.seq_runtime import RUNTIME_VERSION

# the GPU kernels import Layout from here; the kernels' constants are in kernels.seq_layout
__all__ = ["Layout", "CdpGenerator", "CdpKernel"]


class Bound(TypedDict):
    """What the enumeration has bound so far, as generated names: the bound events' lowest
    and highest ts (`mt`, `Mt`) and lowest seq (`ms`), None while nothing is bound; whether
    the terminator is among them (`eb`: None no, "True" yes, else a flag's name); the bound
    variables."""

    mt: str | None
    Mt: str | None
    ms: str | None
    eb: str | None
    bound: list[str]


class CdpGenerator(MatchCodeGenerator):
    """Source text of the CDP kernel module of one SEQ query."""

    def __init__(self, plan: SeqPlan):
        if plan.uses_runs:
            raise ValueError(f"CDP evaluates skip-till-any-match queries, not "
                             f"{plan.strategy.value}")
        super().__init__(plan)
        # per-level candidate buffers of the main kernel: name -> channel (as many rows)
        self.scratch: dict[str, int] = {}
        self.redo_when_full = False  # while generating process's enumeration (gen_process)

    # ------------------------------------------------------------ small helpers

    def single_rows(self, bound: set[str]) -> VarRows:
        return {v.name: (v.channel, f"r{v.index}") for v in self.positive
                if v.kind == VarKind.SINGLE and v.name in bound}

    def conjunct_lines(self, c: Conjunct, rows: VarRows, flag: str) -> list[str]:
        """Lines that set `flag` False unless conjunct c holds; Kleene variables read
        element by element (and not given a row in `rows`) hold for every element."""
        kvars = sorted(self.plan.variables[v].index for v in c.elementwise if v not in rows)
        full = dict(rows)
        for v in c.elementwise:
            if v not in rows:
                var = self.plan.variables[v]
                full[v] = (var.channel, f"k{var.index}[j{var.index}]")
        # Deliberately like cep_core/compiler/seq_aip.py's condition loops: CDP's leaves come from
        # its channels' arrays, AIP's from a node's rows (NR, evicted)
        leaves = ChannelLeaves(self, full, self.param_kleene())
        cond = self.expressions(leaves).condition(c.expr)
        fail = [f"if not {cond}:", f"    {flag} = False"]
        if not kvars:
            return leaves.pre + fail

        def loops(d: int) -> list[str]:
            v = kvars[d]
            inner = loops(d + 1) if d + 1 < len(kvars) else fail + ["    break"]
            out = [f"for j{v} in range(n{v}):"] + indent(inner)
            if d + 1 < len(kvars):
                out += indent([f"if not {flag}:", "    break"])
            return out

        return leaves.pre + loops(0)

    def checks(self, conjuncts: list[Conjunct], rows: VarRows, flag: str) -> list[str]:
        lines = [f"{flag} = True"]
        for c in conjuncts:
            block = self.conjunct_lines(c, rows, flag)
            lines += [f"if {flag}:"] + indent(block)
        return lines

    def param_conjunct_lines(self, c: Conjunct, rows: VarRows, flag: str) -> list[str]:
        return self.conjunct_lines(c, rows, flag)

    FULL = ["    full = True", "    stop = True", "    break"]

    def ensure_emit_capacity(self, elements: str) -> list[str]:
        if not self.redo_when_full:
            return super().ensure_emit_capacity(elements)
        return [f"if n_out >= om.shape[0] or n_el + {elements} > oe_i.shape[0]:", *self.FULL]

    def pending_lines(self, first: str, rows: str = "k", count: str = "n") -> list[str]:
        lines = super().pending_lines(first, rows, count)
        if not self.redo_when_full:
            return lines
        out = []
        for line in lines:
            grows = line.startswith(("    pd = _grow_rows(pd,", "    pk = _grow_1d(pk,"))
            out += self.FULL if grows else [line]
        assert len(out) > len(lines), "pending_lines no longer grows pd as expected"
        return out

    def redo_lines(self, enumeration: list[str]) -> list[str]:
        """A terminator's enumeration, redone with larger output arrays (and pending
        table) when they are full: what it wrote is undone first."""
        saved = [("n_out0", "n_out"), ("n_el0", "n_el")]
        if self.pending_possible:
            saved += [(f"ctr0_{k}", f"ctr[{k}]") for k in (PN, PKN, PALIVE, PEL)]
            saved += [(f"{name}0", f"{name}[p]") for name in ("phead", "ptail", "pdec",
                                                               "pfirst")]
        undo = [f"{now} = {was}" for was, now in saved]
        if self.pending_possible:
            undo += ["if ptail0 >= 0:", f"    pd[ptail0, {P_NEXT}] = -1",
                     "pd = _grow_rows(pd, pd.shape[0] + 1)",
                     "pk = _grow_1d(pk, pk.shape[0] + 1)"]
        undo += ["om, ovi, ovf, ovn = _grow_out(om, ovi, ovf, ovn, om.shape[0] + 1)",
                 "oe_i, oe_f = _grow_el(oe_i, oe_f, oe_i.shape[0] + 1)"]
        redo = ["full = False"] + enumeration + ["if not full:", "    break"] + undo
        return [f"{was} = {now}" for was, now in saved] + ["while True:"] + indent(redo)

    # ------------------------------------------------------------ the module

    def source(self) -> str:
        out = [HELPERS]
        out += self.gen_cancel(self.plan.negations, "last_ts")
        out += self.gen_emit("q")
        out += self.gen_release()
        out += self.gen_process()
        out += self.gen_release_all()
        return "\n".join(out) + "\n"

    # ------------------------------------------------------------ the main kernel

    def gen_process(self) -> list[str]:
        plan = self.plan
        self.redo_when_full = True
        L = ["@njit(cache=True)",
             f"def process(n, pid, EI, EF, {self.arena_params()}, base, size, cnt, evicted, top, "
             f"last_ts, pd, pk, "
             f"phead, ptail, pdec, pfirst, ctr, punct, sc, {STRING_TABLE_PARAMS}, cap_m, cap_s, "
             "stop_on_overflow):"]
        body = self.output_init(64)
        body += ["dead = np.empty(n, np.int64)", "n_dead = 0", "const_ok = True"]
        for c in plan.constant_conjuncts:
            body += ["if const_ok:"] + indent(self.conjunct_lines(c, {}, "const_ok"))
        loop = self.arrival_lines() + self.release_due_lines()
        loop += self.append_lines()
        gate = self.terminator_gate()
        start = ["stop = False", "work = 0", "nm = 0"]
        items = self.gen_item(self.n_items - 1, self.initial_state())
        # Arrays reassigned inside the enumeration's loops made numba's code several times
        # slower: the candidate buffers are sized before it, and a terminator that fills the
        # output arrays or the pending table is redone with larger ones (`redo_lines`).
        fetch = self.fetch_lines()
        for name, channel in self.scratch.items():
            fetch += [f"if I{channel}.shape[0] > {name}.shape[0]:",
                      f"    {name} = np.empty(2 * I{channel}.shape[0], np.int64)"]
        enum = fetch + self.redo_lines(start + items)
        self.redo_when_full = False
        body += [f"{name} = np.empty(256, np.int64)" for name in self.scratch]
        enum += ["if stop:", f"    ctr[{OVF}] += 1", "    if stop_on_overflow:",
                 f"        ctr[{ERR}] = t", "        break"]
        loop += [f"if const_ok and ({gate}):"] + indent(enum)
        body += ["for t in range(n):"] + indent(loop)
        body.append("return n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn, n_dead, dead, pd, pk, "
                    f"({self.arena_params()},)")
        return L + indent(body) + [""]

    def terminator_gate(self) -> str:
        if self.by_ts:
            chans = sorted({v.channel for v in self.positive})
        else:
            last = self.plan.items[-1]
            chans = sorted({self.plan.variables[s.var].channel for s in last.steps})
        return " or ".join(f"ein{c}" for c in chans)

    def initial_state(self) -> Bound:
        return {"mt": None, "Mt": None, "ms": None, "eb": None, "bound": []}

    # ------------------------------------------------------------ building back

    def lower_ts(self, st: Bound, step: ast.Step, narrow: bool,
                 ts_narrow: bool | None = None) -> str | None:
        """Lower bound on a candidate's ts: the window over what is bound (or, when nothing
        is, over the terminator, which every match contains), `WITHIN w FROM y`, and (under
        ORDER BY ts, while the terminator is not bound) the terminator's time."""
        lows = []
        if self.W is not None:
            if st["Mt"] is not None:
                lows.append(f"{st['Mt']} - {self.W}")
            elif narrow:
                lows.append(f"ets - {self.W}")
        within = self.plan.step_within(step)
        if within is not None and step.anchor is not None:  # WITHIN w FROM anchor: both
            anchor = self.plan.variables[step.anchor]
            lows.append(f"I{anchor.channel}[r{anchor.index}, 1] - {within}")
        if ts_narrow is None:
            ts_narrow = narrow
        if ts_narrow and self.by_ts:
            if st["eb"] is None:
                lows.append("ets")
            elif st["eb"] != "True":
                lows.append(f"(ets if not {st['eb']} else np.int64({INT64_MIN}))")
        if not lows:
            return None
        return lows[0] if len(lows) == 1 else f"max({', '.join(lows)})"

    def upper_index(self, i: int, c: int, st: Bound) -> str:
        """End (exclusive) of the candidate range: before the next item in the query's
        order; the last item: every row (all were seen up to the terminator)."""
        if i == self.n_items - 1:
            return f"I{c}.shape[0]"
        if self.by_ts:
            return f"_ub_ts(I{c}, it{i + 1})"
        return f"_lb_seq(I{c}, is{i + 1})"

    def summary(self, st: Bound, lo_ts: str, hi_ts: str, lo_seq: str, seq_hit: str | None,
                suffix: str) -> tuple[list[str], Bound]:
        """Lines updating the bound-events summary with new events (their lowest/highest
        ts, lowest seq, whether the terminator is among them)."""
        lines = []
        mt, Mt, ms = f"mt{suffix}", f"Mt{suffix}", f"ms{suffix}"
        if st["mt"] is None:
            lines += [f"{mt} = {lo_ts}", f"{Mt} = {hi_ts}", f"{ms} = {lo_seq}"]
        else:
            lines += [f"{mt} = min({st['mt']}, {lo_ts})", f"{Mt} = max({st['Mt']}, {hi_ts})",
                      f"{ms} = min({st['ms']}, {lo_seq})"]
        eb = st["eb"]
        if eb != "True":
            if seq_hit is None:
                pass
            else:
                name = f"eb{suffix}"
                lines.append(f"{name} = {seq_hit}" if eb is None else f"{name} = {eb} or "
                                                                      f"{seq_hit}")
                eb = name
        new: Bound = {**st, "mt": mt, "Mt": Mt, "ms": ms, "eb": eb}
        return lines, new

    def still_possible(self, st: Bound) -> str | None:
        """Under ORDER BY ts: can the terminator still be the match's largest-seq event?"""
        if not self.by_ts or st["eb"] == "True":
            return None
        if st["eb"] is None:
            return f"{st['mt']} == ets"
        return f"({st['eb']} or {st['mt']} == ets)"

    def gen_item(self, i: int, st: Bound) -> list[str]:
        if i < 0:
            return self.gen_final(st)
        kind = self.plan.items[i].kind
        if kind is ItemKind.SINGLE:
            return self.gen_single(i, st)
        if kind is ItemKind.KLEENE:
            return self.gen_kleene(i, st)
        return self.gen_and(i, 0, st, st)

    def exclusion_lines(self, seq: str, st: Bound, extra: list[str], flag: str) -> list[str]:
        names = list(st["bound"]) if self.by_ts else []
        names += [n for n in extra if n not in names]
        if not names:
            return []
        return self.bound_seq_test(seq, names, flag) + [f"if {flag}:", "    continue"]

    def window_upper(self, st: Bound, ts: str) -> list[str]:
        if self.W is None or st["mt"] is None:
            return []
        return [f"if {ts} > {st['mt']} + {self.W}:", "    continue"]

    def _step(self, i: int) -> tuple[ast.Step, int, int, bool]:
        """(the step of item i, its variable's channel and index, whether it is the last
        item)."""
        step = self.plan.items[i].step
        var = self.plan.variables[step.var]
        return step, var.channel, var.index, i == self.n_items - 1

    def gen_single(self, i: int, st: Bound) -> list[str]:
        plan = self.plan
        step, c, v, last = self._step(i)
        policy = step.policy if not last else None
        r = f"r{v}"
        lines: list[str] = []
        ind = 0
        if not self.by_ts and last:
            lines.append(f"if ein{c}:")
            ind = 1
            loop = f"for {r} in range(I{c}.shape[0] - 1, I{c}.shape[0]):"
        else:
            narrow = policy in (None, ast.Policy.EACH)
            low = self.lower_ts(st, step, narrow)
            lo = f"_lb_ts(I{c}, {low})" if low is not None else "0"
            hi = self.upper_index(i, c, st)
            lines += [f"lo{i} = {lo}", f"hi{i} = {hi}"]
            if policy is ast.Policy.LAST:
                loop = f"for {r} in range(hi{i} - 1, lo{i} - 1, -1):"
            else:
                loop = f"for {r} in range(lo{i}, hi{i}):"
        checks = [f"q{v} = I{c}[{r}, 0]", f"t{v} = I{c}[{r}, 1]"]
        checks += self.exclusion_lines(f"q{v}", st, [], f"dup{i}")
        checks += self.window_upper(st, f"t{v}")
        flt = self.filter_code(step, c, r)
        if flt is not None:
            checks += [f"if not {flt}:", "    continue"]
        rows = self.single_rows(set(st["bound"]) | {step.var})
        conj = plan.conjuncts_at(i)
        if conj:
            checks += self.checks(conj, rows, f"ok{i}")
            checks += [f"if not ok{i}:", "    continue"]
        hit = f"q{v} == eseq" if self.by_ts else None
        upd, new = self.summary(st, f"t{v}", f"t{v}", f"q{v}", hit, str(i))
        if not self.by_ts and last:
            new["eb"] = "True"
        new["bound"] = st["bound"] + [step.var]
        body = upd + [f"is{i} = q{v}", f"it{i} = t{v}"]
        nested = self.gen_item(i - 1, new)
        cond = self.still_possible(new)
        if cond is not None:
            body += [f"if {cond}:"] + indent(nested)
        else:
            body += nested
        if policy in (ast.Policy.LAST, ast.Policy.FIRST):
            # choose in a tight loop, then build on the one chosen (if any)
            select = [f"sel{i} = -1", loop] + indent(checks + [f"sel{i} = {r}", "break"])
            select += [f"if sel{i} >= 0:"] + indent(
                [f"{r} = sel{i}", f"q{v} = I{c}[{r}, 0]", f"t{v} = I{c}[{r}, 1]"] + body)
            lines += indent(select, ind)
            return lines
        if not (not self.by_ts and last):
            # EACH: collect the candidates in a tight loop, then build on each
            collect = [f"nc{i} = 0", loop] + indent(
                checks + [f"cb{i}[nc{i}] = {r}", f"nc{i} += 1"])
            self.scratch[f"cb{i}"] = c
            each = ["if stop:", "    break", f"{r} = cb{i}[jc{i}]", f"q{v} = I{c}[{r}, 0]",
                    f"t{v} = I{c}[{r}, 1]"] + body
            lines += indent(collect + [f"for jc{i} in range(nc{i}):"] + indent(each), ind)
            return lines
        body = ["if stop:", "    break"] + checks + body
        lines += indent([loop] + indent(body), ind)
        return lines

    def gen_kleene(self, i: int, st: Bound) -> list[str]:
        plan = self.plan
        step, c, v, last = self._step(i)
        required = not self.by_ts and last
        lines: list[str] = []
        element = plan.element_conjuncts(i)
        flt_rows = self.single_rows(set(st["bound"]))

        def element_ok(row: str, flag: str) -> list[str]:
            out = [f"{flag} = True"]
            flt = self.filter_code(step, c, row)
            if flt is not None:
                out += [f"if not {flt}:", f"    {flag} = False"]
            rows = dict(flt_rows)
            rows[step.var] = (c, row)
            for conj in element:
                out += [f"if {flag}:"] + indent(self.conjunct_lines(conj, rows, flag))
            return out

        ind = 0
        if required:
            lines += [f"if ein{c}:"]
            inner = [f"re{i} = I{c}.shape[0] - 1"] + element_ok(f"re{i}", f"eok{i}")
            lines += indent(inner)
            lines += [f"    if eok{i}:"]
            ind = 2
            hi = f"re{i}"
        else:
            hi = self.upper_index(i, c, st)
        # (no narrowing to the terminator's time: the terminator may be an element)
        low = self.lower_ts(st, step, True, ts_narrow=False)
        lo = f"_lb_ts(I{c}, {low})" if low is not None else "0"
        block = [f"lo{i} = {lo}", f"hi{i} = {hi}",
                 f"kc{i} = np.empty(max(hi{i} - lo{i}, 0), np.int64)", f"m{i} = 0"]
        cand = [f"qc{i} = I{c}[rc{i}, 0]", f"tc{i} = I{c}[rc{i}, 1]"]
        cand += self.exclusion_lines(f"qc{i}", st, [], f"dup{i}")
        cand += self.window_upper(st, f"tc{i}")
        cand += element_ok(f"rc{i}", f"cok{i}")
        cand += [f"if cok{i}:", f"    kc{i}[m{i}] = rc{i}", f"    m{i} += 1"]
        block += [f"for rc{i} in range(lo{i}, hi{i}):"] + indent(cand)
        nreq = 1 if required else 0
        low_size = max(step.min - nreq, 0)
        high_size = f"m{i}" if step.max is None else f"min({step.max - nreq}, m{i})"
        k, n = f"k{v}", f"n{v}"
        block += [f"{k} = np.empty(m{i} + {nreq}, np.int64)",
                  f"ki{i} = np.empty(max(m{i}, 1), np.int64)",
                  f"for sz{i} in range({low_size}, {high_size} + 1):"]
        comb = ["if stop:", "    break",
                f"for ja{i} in range(sz{i}):", f"    ki{i}[ja{i}] = ja{i}",
                "while True:"]
        inner = ["if stop:", "    break",
                 f"{n} = sz{i} + {nreq}",
                 f"for ja{i} in range(sz{i}):", f"    {k}[ja{i}] = kc{i}[ki{i}[ja{i}]]"]
        if required:
            inner.append(f"{k}[sz{i}] = re{i}")
        inner += ["work += 1",
                  "if work > cap_s:",
                  "    stop = True",
                  "    break"]
        sub = [f"ft{i} = I{c}[{k}[0], 1]", f"lt{i} = I{c}[{k}[{n} - 1], 1]",
               f"fs{i} = I{c}[{k}[0], 0]"]
        hit = None
        if self.by_ts:
            sub += self.bound_seq_test("eseq", [step.var], f"eh{i}")
            hit = f"eh{i}"
        upd, new = self.summary(st, f"ft{i}", f"lt{i}", f"fs{i}", hit, str(i))
        if not self.by_ts and last:
            new["eb"] = "True"
        new["bound"] = st["bound"] + [step.var]
        sub += upd
        sub.append(f"okk{i} = True")
        if self.W is not None:
            sub += [f"if {new['Mt']} - {new['mt']} > {self.W}:", f"    okk{i} = False"]
        if self.by_ts and last:
            sub += [f"if lt{i} < ets:", f"    okk{i} = False"]
        conj = plan.subset_conjuncts(i)
        if conj:
            rows = self.single_rows(set(new["bound"]))
            sub += [f"if okk{i}:"] + indent(self.checks(conj, rows, f"okc{i}"))
            sub += [f"    okk{i} = okc{i}"]
        cond = self.still_possible(new)
        if cond is not None:
            sub += [f"if okk{i} and not {cond}:", f"    okk{i} = False"]
        sub += [f"is{i} = fs{i}", f"it{i} = ft{i}"]
        sub += [f"if okk{i}:"] + indent(self.gen_item(i - 1, new))
        inner += [f"if {n} > 0:"] + indent(sub)
        inner += [f"jb{i} = sz{i} - 1",
                  f"while jb{i} >= 0 and ki{i}[jb{i}] == m{i} - sz{i} + jb{i}:",
                  f"    jb{i} -= 1",
                  f"if jb{i} < 0:",
                  "    break",
                  f"ki{i}[jb{i}] += 1",
                  f"for ja{i} in range(jb{i} + 1, sz{i}):",
                  f"    ki{i}[ja{i}] = ki{i}[ja{i} - 1] + 1"]
        comb += indent(inner)
        block += indent(comb)
        lines += indent(block, ind)
        return lines

    def gen_and(self, i: int, j: int, st: Bound, st_item: Bound) -> list[str]:
        """Member j of AND group i; `st_item` is the state before the group."""
        plan = self.plan
        item = plan.items[i]
        members = item.steps
        last = i == self.n_items - 1
        stream_last = not self.by_ts and last
        if j == len(members):
            return self.gen_and_end(i, st, st_item)
        step = members[j]
        var = plan.variables[step.var]
        c, v = var.channel, var.index
        r = f"r{v}"
        tag = f"{i}_{j}"
        lines = []
        low = self.lower_ts(st, step, True, ts_narrow=False)
        lo = f"_lb_ts(I{c}, {low})" if low is not None else "0"
        hi = self.upper_index(i, c, st)
        if stream_last and j == len(members) - 1:
            # the terminator must be one of the members: the last one, if no other is
            eb = st["eb"]
            lines += [f"lo{tag} = {lo}", f"hi{tag} = {hi}"]
            guard = f"not {eb}" if eb is not None else "True"
            lines += [f"if {guard}:",
                      f"    if ein{c}:",
                      f"        lo{tag} = max(lo{tag}, I{c}.shape[0] - 1)",
                      "    else:",
                      f"        hi{tag} = lo{tag}"]
        else:
            lines += [f"lo{tag} = {lo}", f"hi{tag} = {hi}"]
        body = ["if stop:", "    break", f"q{v} = I{c}[{r}, 0]", f"t{v} = I{c}[{r}, 1]"]
        earlier = [m.var for m in members[:j]]
        body += self.exclusion_lines(f"q{v}", st, earlier, f"dup{tag}")
        body += self.window_upper(st, f"t{v}")
        flt = self.filter_code(step, c, r)
        if flt is not None:
            body += [f"if not {flt}:", "    continue"]
        conj = plan.conjuncts_at(i, j)
        if conj:
            rows = self.single_rows(set(st["bound"]) | {step.var})
            body += self.checks(conj, rows, f"ok{tag}")
            body += [f"if not ok{tag}:", "    continue"]
        hit = f"q{v} == eseq" if (self.by_ts or stream_last) else None
        upd, new = self.summary(st, f"t{v}", f"t{v}", f"q{v}", hit, tag)
        new["bound"] = st["bound"] + [step.var]
        body += upd
        body += self.gen_and(i, j + 1, new, st_item)
        lines += [f"for {r} in range(lo{tag}, hi{tag}):"] + indent(body)
        return lines

    def gen_and_end(self, i: int, st: Bound, st_item: Bound) -> list[str]:
        item = self.plan.items[i]
        last = i == self.n_items - 1
        lines = []
        s_lo, t_lo = None, None
        for step in item.steps:
            var = self.plan.variables[step.var]
            q, t = f"q{var.index}", f"t{var.index}"
            s_lo = q if s_lo is None else f"min({s_lo}, {q})"
            t_lo = t if t_lo is None else f"min({t_lo}, {t})"
        lines += [f"is{i} = {s_lo}", f"it{i} = {t_lo}", f"mt{i} = {st['mt']}",
                  f"Mt{i} = {st['Mt']}", f"ms{i} = {st['ms']}"]
        new: Bound = {**st, "mt": f"mt{i}", "Mt": f"Mt{i}", "ms": f"ms{i}"}
        conds = []
        if not self.by_ts and last:
            eb = st["eb"]
            assert eb is not None  # each member may be the terminator: gen_and's `hit`
            conds.append(eb)
            new["eb"] = "True"
        cond = self.still_possible(new)
        if cond is not None:
            conds.append(cond)
        nested = self.gen_item(i - 1, new)
        if conds:
            return lines + [f"if {' and '.join(conds)}:"] + indent(nested)
        return lines + nested

    def gen_final(self, st: Bound) -> list[str]:
        plan = self.plan
        lines: list[str] = []
        body = ["nm += 1",
                "if nm > cap_m:",
                "    stop = True",
                "    break"]
        decided = self.output_lines(self.binding_params(), self.element_count(),
                                    bool(plan.negations))
        mt = st["mt"]
        assert mt is not None  # every positive item is bound
        times = []
        for neg in plan.negations:
            if neg.where is NegationAt.END:
                times.append(f"{mt} + {self.W}")
            elif self.by_ts and neg.where is NegationAt.START:
                times.append(mt)
            elif self.by_ts:
                times.append(f"it{neg.after}")
        if times:
            decide = times[0] if len(times) == 1 else f"max({', '.join(times)})"
            body += [f"decide = {decide}", "if not now > decide:"]
            body += indent(self.pending_lines(mt))
            body += ["else:"] + indent(decided)
        else:
            body += decided
        cond = None
        if self.by_ts and st["eb"] != "True":
            cond = st["eb"]
        # `break` above must leave the innermost loop: every level is inside a loop.
        if cond is not None:
            return lines + [f"if {cond}:"] + indent(body)
        return lines + body


HELPERS = f"""
# runtime version {RUNTIME_VERSION}
{seq_runtime_import(CdpGenerator.append_row)}
"""


class CdpKernel:
    """The loaded kernel module of one query and what decoding its output needs (the GPU
    engine's counterpart: `cep_accel.gpu.seq_kernels.SeqKernels`)."""

    def __init__(self, plan: SeqPlan):
        self.plan = plan
        self.generator = CdpGenerator(plan)
        # Deliberately like accel/gpu/seq_kernels.py SeqKernels: each kernel loads its own
        # generator's module
        self.source = self.generator.source()
        self.module = load_module(self.source)
        self.layout = self.generator.layout
        self.constants = self.generator.constants
        self.record_width = self.generator.record_width
        self.n_emit = self.generator.n_emit
        self.kleene_slots = [self.generator.pending_slot[v.name] for v in plan.positive
                             if v.kind == VarKind.KLEENE]
        # (pending record column, channel, Kleene?) of each variable a pending match binds
        self.pending_vars = [(self.generator.pending_slot[v.name], v.channel,
                              v.kind == VarKind.KLEENE) for v in plan.positive]
