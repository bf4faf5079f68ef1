"""What the SEQ code generators (CDP and AIP) do alike with a completed match: the generated
`_cancel` (do stored events of a negated type cancel it?), `_emit` (its output row and
elements), the pending table (a match a future event could still cancel waits there until
event time passes its deciding time), `_release` (one partition's decided pending matches)
and `release_all` (punctuation and flush).

`_cancel`, `_emit` and `_release` take the bindings as parameters (`binding_params`): `r{v}`
the row of a single variable, `k{v}`/`n{v}` the rows and count of a Kleene variable; the
process kernels call them with their own names for the bindings."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from cep_core import ast
from cep_core.compiler.expressions import STRING_TABLE_PARAMS
from cep_core.compiler.seq_codegen import (
    ChannelCodeGenerator,
    emit_store_lines,
    indent,
)
from cep_core.compiler.seq_codegen_leaves import ChannelLeaves, KleeneRows, VarRows
from cep_core.compiler.seq_plan import (
    Conjunct,
    ItemKind,
    Negation,
    NegationAt,
    SeqPlan,
    VarKind,
)
from cep_core.kernels.seq_layout import (
    INT64_MAX,
    P_CNT,
    P_DEC,
    P_FIRST,
    P_FIXED,
    P_NEXT,
    P_PART,
    PALIVE,
    PEL,
    PKN,
    PN,
)


class MatchCodeGenerator(ChannelCodeGenerator, ABC):
    """A subclass provides `param_conjunct_lines` (a conjunct over the bindings as
    parameters) and may set `Unsupported` (the error for what it does not evaluate)."""

    Unsupported = ValueError

    def __init__(self, plan: SeqPlan):
        super().__init__(plan)
        self.n_emit = max(len(plan.body.emit), 1)
        # pending record layout: each variable's slot after the fixed columns
        self.pending_slot: dict[str, int] = {}
        width = P_FIXED
        for var in self.positive:
            self.pending_slot[var.name] = width
            width += 2 if var.kind == VarKind.KLEENE else 1
        self.record_width = width
        self.pending_possible = any(n.where is NegationAt.END or self.by_ts for n in plan.negations)

    @abstractmethod
    def param_conjunct_lines(self, c: Conjunct, rows: VarRows, flag: str) -> list[str]:
        """Lines that set `flag` False unless c holds, Kleene variables read as parameters
        (each algorithm walks Kleene elements its own way)."""

    # ------------------------------------------------------------ bindings

    def binding_params(self) -> str:
        names = []
        for v in self.positive:
            names += [f"k{v.index}", f"n{v.index}"] if v.kind == VarKind.KLEENE else [f"r{v.index}"]
        return ", ".join(names)

    def param_rows(self) -> VarRows:
        """Single variables' rows, as parameters."""
        return {v.name: (v.channel, f"r{v.index}") for v in self.singles}

    def param_kleene(self) -> KleeneRows:
        """Kleene variables' rows and counts, as parameters (see ChannelLeaves)."""
        return {v.name: (v.channel, f"k{v.index}", f"n{v.index}") for v in self.kleene}

    def element_count(self, prefix: str = "n") -> str:
        """The match's element count, Kleene counts named `{prefix}{index}`."""
        parts = [f"{prefix}{v.index}" for v in self.kleene]
        return " + ".join([str(len(self.singles))] + parts)

    def filter_code(self, step: ast.Step, channel: int, row: str) -> str | None:
        if step.filter is None:
            return None
        leaves = ChannelLeaves(self, {}, {}, subject=(channel, row))
        code = self.expressions(leaves).condition(step.filter)
        if leaves.pre:
            raise self.Unsupported("a step filter with an aggregate")
        return code

    # ------------------------------------------------------------ negations

    def item_summary_lines(self, i: int) -> list[str]:
        """lo/hi seq and ts of item i's events: s_lo{i}, s_hi{i}, t_lo{i}, t_hi{i}."""
        item = self.plan.items[i]
        if item.kind == ItemKind.KLEENE:
            var = self.plan.variables[item.step.var]
            c, v = var.channel, var.index
            return [f"s_lo{i} = I{c}[k{v}[0], 0]", f"s_hi{i} = I{c}[k{v}[n{v} - 1], 0]",
                    f"t_lo{i} = I{c}[k{v}[0], 1]", f"t_hi{i} = I{c}[k{v}[n{v} - 1], 1]"]
        lines = []
        for j, step in enumerate(item.steps):
            var = self.plan.variables[step.var]
            s, t = f"I{var.channel}[r{var.index}, 0]", f"I{var.channel}[r{var.index}, 1]"
            if j == 0:
                lines += [f"s_lo{i} = {s}", f"s_hi{i} = {s}", f"t_lo{i} = {t}", f"t_hi{i} = {t}"]
            else:
                lines += [f"s_lo{i} = min(s_lo{i}, {s})", f"s_hi{i} = max(s_hi{i}, {s})",
                          f"t_lo{i} = min(t_lo{i}, {t})", f"t_hi{i} = max(t_hi{i}, {t})"]
        return lines

    def span_lines(self, last_ts: str) -> list[str]:
        """The match's first/last seq and ts (`first_seq`, `last_seq`, `first_ts` and the
        last ts named `last_ts`)."""
        n = self.n_items
        body = []
        for i in range(n):
            body += self.item_summary_lines(i)
        body += ["first_seq = s_lo0", f"last_seq = s_hi{n - 1}",
                 "first_ts = t_lo0", f"{last_ts} = t_hi{n - 1}"]
        for i in range(1, n):
            body += [f"first_ts = min(first_ts, t_lo{i})",
                     f"{last_ts} = max({last_ts}, t_hi{i})",
                     f"first_seq = min(first_seq, s_lo{i})",
                     f"last_seq = max(last_seq, s_hi{i})"]
        return body

    def bound_seq_test(self, seq: str, bound_vars: Iterable[str], flag: str) -> list[str]:
        """Lines setting `flag` True if `seq` is the seq of a bound positive event."""
        lines = [f"{flag} = False"]
        for name in bound_vars:
            var = self.plan.variables[name]
            c, v = var.channel, var.index
            if var.kind == VarKind.KLEENE:
                j = self.fresh("j")
                lines += [f"for {j} in range(n{v}):",
                          f"    if I{c}[k{v}[{j}], 0] == {seq}:",
                          f"        {flag} = True",
                          "        break"]
            else:
                lines += [f"if I{c}[r{v}, 0] == {seq}:", f"    {flag} = True"]
        return lines

    def negation_range(self, neg: Negation, c: int, last_ts: str) -> tuple[str, str]:
        """The rows of channel c where an event of negation `neg` cancels the match."""
        W = self.W
        if self.by_ts:
            if neg.where is NegationAt.START:
                return f"_lb_ts(I{c}, {last_ts} - {W})", f"_ub_ts(I{c}, first_ts)"
            if neg.where is NegationAt.END:
                return f"_lb_ts(I{c}, {last_ts})", f"_ub_ts(I{c}, first_ts + {W})"
            return f"_lb_ts(I{c}, t_hi{neg.before})", f"_ub_ts(I{c}, t_lo{neg.after})"
        if neg.where is NegationAt.START:
            return f"_lb_ts(I{c}, {last_ts} - {W})", f"_lb_seq(I{c}, first_seq)"
        if neg.where is NegationAt.END:
            return f"_ub_seq(I{c}, last_seq)", f"_ub_ts(I{c}, first_ts + {W})"
        return f"_ub_seq(I{c}, s_hi{neg.before})", f"_lb_seq(I{c}, s_lo{neg.after})"

    def gen_cancel(self, negations: list[Negation], last_ts: str) -> list[str]:
        """_cancel: does a stored event of one of `negations` cancel the match?"""
        L = ["@njit(cache=True)",
             f"def _cancel({self.channel_params()}, {self.binding_params()}, sc, "
             f"{STRING_TABLE_PARAMS}):"]
        if not negations:
            return L + ["    return False", ""]
        body = self.span_lines(last_ts)
        rows = self.param_rows()
        positive_names = [v.name for v in self.positive]
        for neg in negations:
            var = self.plan.variables[neg.step.var]
            c, x = var.channel, f"x{var.index}"
            lo, hi = self.negation_range(neg, c, last_ts)
            loop = []
            if self.by_ts:
                loop += self.bound_seq_test(f"I{c}[{x}, 0]", positive_names, "isb")
                loop += ["if isb:", "    continue"]
            flt = self.filter_code(neg.step, c, x)
            if flt is not None:
                loop += [f"if not {flt}:", "    continue"]
            nrows = dict(rows)
            nrows[neg.step.var] = (c, x)
            loop.append("cok = True")
            for conj in neg.conjuncts:
                loop += ["if cok:"] + indent(self.param_conjunct_lines(conj, nrows, "cok"))
            loop += ["if cok:", "    return True"]
            body += [f"for {x} in range({lo}, {hi}):"] + indent(loop)
        body.append("return False")
        return L + indent(body) + [""]

    # ------------------------------------------------------------ output

    def gen_emit(self, z: str) -> list[str]:
        """_emit: the match's output row and elements (`z`: the column loops' variable)."""
        L = ["@njit(cache=True)",
             f"def _emit(p, {self.channel_params()}, {self.binding_params()}, om, oe_i, oe_f, "
             f"ovi, ovf, ovn, n_out, n_el, sc, {STRING_TABLE_PARAMS}):"]
        body = ["om[n_out, 0] = p", "om[n_out, 1] = n_el"]
        nI, nF = self.layout.n_int, self.layout.n_float
        for var in self.positive:
            c, v = var.channel, var.index
            if var.kind == VarKind.KLEENE:
                body += [f"for j in range(n{v}):",
                         f"    oe_i[n_el, 0] = {v}",
                         f"    for {z} in range({nI}):",
                         f"        oe_i[n_el, {z} + 1] = I{c}[k{v}[j], {z}]",
                         f"    for {z} in range({nF}):",
                         f"        oe_f[n_el, {z}] = F{c}[k{v}[j], {z}]",
                         "    n_el += 1"]
            else:
                body += [f"oe_i[n_el, 0] = {v}",
                         f"for {z} in range({nI}):",
                         f"    oe_i[n_el, {z} + 1] = I{c}[r{v}, {z}]",
                         f"for {z} in range({nF}):",
                         f"    oe_f[n_el, {z}] = F{c}[r{v}, {z}]",
                         "n_el += 1"]
        body.append("om[n_out, 2] = n_el - om[n_out, 1]")
        rows, kleene = self.param_rows(), self.param_kleene()
        for j, item in enumerate(self.plan.body.emit):
            leaves = ChannelLeaves(self, rows, kleene)
            code = self.expressions(leaves).compile(item.expr)
            body += leaves.pre
            body += emit_store_lines(j, self.plan.checked.types[item.expr], code, "n_out")
        body.append("return n_out + 1, n_el")
        return L + indent(body) + [""]

    def output_init(self, size: int) -> list[str]:
        """The output arrays, `size` rows to start with."""
        return ["n_out = np.int64(0)", "n_el = np.int64(0)",
                f"om = np.empty(({size}, 3), np.int64)",
                f"oe_i = np.empty(({size}, {self.layout.n_int + 1}), np.int64)",
                f"oe_f = np.empty(({size}, {self.layout.n_float}), np.float64)",
                f"ovi = np.empty(({size}, {self.n_emit}), np.int64)",
                f"ovf = np.empty(({size}, {self.n_emit}), np.float64)",
                f"ovn = np.empty(({size}, {self.n_emit}), np.int64)"]

    def ensure_emit_capacity(self, elements: str) -> list[str]:
        return ["if n_out >= om.shape[0]:",
                "    om, ovi, ovf, ovn = _grow_out(om, ovi, ovf, ovn, n_out + 1)",
                f"if n_el + {elements} > oe_i.shape[0]:",
                f"    oe_i, oe_f = _grow_el(oe_i, oe_f, n_el + {elements})"]

    def emit_call(self, bindings: str) -> str:
        return (f"n_out, n_el = _emit(p, {self.channel_params()}, {bindings}, om, oe_i, oe_f, "
                f"ovi, ovf, ovn, n_out, n_el, sc, {STRING_TABLE_PARAMS})")

    def cancel_test(self, bindings: str) -> str:
        return f"if not _cancel({self.channel_params()}, {bindings}, sc, {STRING_TABLE_PARAMS}):"

    def output_lines(self, bindings: str, elements: str, cancellable: bool) -> list[str]:
        """Emit a decided match (`bindings` as _emit's arguments; `elements` its element
        count), unless `cancellable` and a stored event cancels it."""
        emit = self.ensure_emit_capacity(elements) + [self.emit_call(bindings)]
        return [self.cancel_test(bindings)] + indent(emit) if cancellable else emit

    # ------------------------------------------------------------ pending matches

    def pending_lines(self, first: str, rows: str = "k", count: str = "n") -> list[str]:
        """Append the match to partition p's pending list, to be decided after `decide`
        (`first`: its smallest ts; Kleene rows and counts named `{rows}{v}`/`{count}{v}`)."""
        total = self.element_count(count)
        lines = [f"rec = ctr[{PN}]",
                 "if rec >= pd.shape[0]:",
                 "    pd = _grow_rows(pd, rec + 1)"]
        if self.kleene:
            ks = " + ".join(f"{count}{v.index}" for v in self.kleene)
            lines += [f"if ctr[{PKN}] + {ks} > pk.shape[0]:",
                      f"    pk = _grow_1d(pk, ctr[{PKN}] + {ks})"]
        lines += [f"pd[rec, {P_PART}] = p", f"pd[rec, {P_DEC}] = decide",
                  f"pd[rec, {P_FIRST}] = {first}", f"pd[rec, {P_NEXT}] = -1",
                  f"pd[rec, {P_CNT}] = {total}"]
        for var in self.positive:
            c, v, s = var.channel, var.index, self.pending_slot[var.name]
            if var.kind == VarKind.KLEENE:
                lines += [f"pd[rec, {s}] = ctr[{PKN}]", f"pd[rec, {s + 1}] = {count}{v}",
                          f"for j in range({count}{v}):",
                          f"    pk[ctr[{PKN}] + j] = {rows}{v}[j] + evicted[p, {c}]",
                          f"ctr[{PKN}] += {count}{v}"]
            else:
                lines.append(f"pd[rec, {s}] = r{v} + evicted[p, {c}]")
        lines += ["if ptail[p] >= 0:",
                  f"    pd[ptail[p], {P_NEXT}] = rec",
                  "else:",
                  "    phead[p] = rec",
                  "ptail[p] = rec",
                  "pdec[p] = min(pdec[p], decide)",
                  f"pfirst[p] = min(pfirst[p], {first})",
                  f"ctr[{PN}] += 1", f"ctr[{PALIVE}] += 1",
                  f"ctr[{PEL}] += {total}"]
        return lines

    def gen_release(self) -> list[str]:
        """_release: emit (unless cancelled) and unlink partition p's pending matches
        decided by `now` (all of them when `force`)."""
        L = ["@njit(cache=True)",
             f"def _release(p, now, force, {self.channel_params()}, evp, pd, pk, phead, ptail, "
             f"pdec, pfirst, ctr, om, oe_i, oe_f, ovi, ovf, ovn, n_out, n_el, sc, "
             f"{STRING_TABLE_PARAMS}):"]
        body = ["rec = phead[p]", "prev = -1", f"newdec = np.int64({INT64_MAX})",
                f"newfirst = np.int64({INT64_MAX})",
                "while rec >= 0:",
                f"    nxt = pd[rec, {P_NEXT}]",
                f"    if force or now > pd[rec, {P_DEC}]:",
                "        if prev >= 0:",
                f"            pd[prev, {P_NEXT}] = nxt",
                "        else:",
                "            phead[p] = nxt",
                "        if nxt < 0:",
                "            ptail[p] = prev",
                f"        ctr[{PEL}] -= pd[rec, {P_CNT}]",
                f"        ctr[{PALIVE}] -= 1"]
        rebuild = []
        for var in self.positive:
            c, v, s = var.channel, var.index, self.pending_slot[var.name]
            if var.kind == VarKind.KLEENE:
                rebuild += [f"n{v} = pd[rec, {s + 1}]",
                            f"k{v} = np.empty(n{v}, np.int64)",
                            f"for j in range(n{v}):",
                            f"    k{v}[j] = pk[pd[rec, {s}] + j] - evp[{c}]"]
            else:
                rebuild.append(f"r{v} = pd[rec, {s}] - evp[{c}]")
        bindings = self.binding_params()
        rebuild += [self.cancel_test(bindings)] + indent([self.emit_call(bindings)])
        body += indent(rebuild, 2)
        body += ["    else:",
                 f"        newdec = min(newdec, pd[rec, {P_DEC}])",
                 f"        newfirst = min(newfirst, pd[rec, {P_FIRST}])",
                 "        prev = rec",
                 "    rec = nxt",
                 "pdec[p] = newdec",
                 "pfirst[p] = newfirst",
                 "return n_out, n_el"]
        return L + indent(body) + [""]

    def ensure_release_capacity(self) -> list[str]:
        return [f"if n_out + ctr[{PALIVE}] > om.shape[0]:",
                f"    om, ovi, ovf, ovn = _grow_out(om, ovi, ovf, ovn, n_out + ctr[{PALIVE}])",
                f"if n_el + ctr[{PEL}] > oe_i.shape[0]:",
                f"    oe_i, oe_f = _grow_el(oe_i, oe_f, n_el + ctr[{PEL}])"]

    def release_lines(self, force: str) -> list[str]:
        """Call _release for partition p (output grown first, its channel tables fetched)."""
        return self.ensure_release_capacity() + self.fetch_lines() + [
            f"n_out, n_el = _release(p, now, {force}, {self.channel_params()}, evicted[p], pd, "
            f"pk, phead, ptail, pdec, pfirst, ctr, om, oe_i, oe_f, ovi, ovf, ovn, n_out, n_el, "
            f"sc, {STRING_TABLE_PARAMS})"]

    def release_due_lines(self) -> list[str]:
        """In the process kernel: release p's pending matches decided by `now`."""
        if not self.pending_possible:
            return []
        return ["if phead[p] >= 0 and now > pdec[p]:"] + indent(self.release_lines("False"))

    def gen_release_all(self) -> list[str]:
        """Punctuation (force=False: event time reached `punct`) and flush (force=True)."""
        L = ["@njit(cache=True)",
             f"def release_all(punct, force, {self.arena_params()}, base, cnt, evicted, last_ts, "
             f"pd, pk, phead, ptail, pdec, pfirst, ctr, sc, {STRING_TABLE_PARAMS}):"]
        body = self.output_init(16)
        body += ["for p in range(phead.shape[0]):",
                 "    if phead[p] < 0:",
                 "        continue",
                 "    now = max(last_ts[p], punct)",
                 "    if not force and not now > pdec[p]:",
                 "        continue"]
        body += indent(self.release_lines("force"))
        body.append("return n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn")
        return L + indent(body) + [""]
