"""Column-based delayed processing (CDP, Cugola & Margara) for SEQ queries: one numba kernel
module per query, generated from its `SeqPlan` (the checked AST only, never query text).

State, per partition and per channel (an event type a step, a negation or a window
aggregate reads, or ANY): the events of that type in seq order, as two row-major tables,
int64 (`seq`, `ts`, then every int/timestamp/string/bool attribute; strings as dictionary
codes) and float64 (every float attribute). Each table is an element of a numba typed List
indexed by partition id; `cnt[p, c]` rows are valid. A table that fills up first evicts the
rows older than the query's horizon (`evicted[p, c]` counts them, so absolute row numbers
stay meaningful), then doubles.

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

from dataclasses import dataclass

from cep_core import ast
from cep_core.compiler.expressions import (
    STRING_TABLE_PARAMS,
    Code,
    ExpressionCompiler,
    StringConstants,
)
from cep_core.compiler.modules import load_module
from cep_core.compiler.seq_codegen import ChannelCodeGenerator
from cep_core.compiler.seq_plan import ANY, Conjunct, SeqPlan
from cep_core.compiler.seq_runtime import RUNTIME_VERSION

A = ast.AggFunc
INT64_MIN = -(2 ** 63)
INT64_MAX = 2 ** 63 - 1

# ctr slots (an int64 array the kernels update in place)
PN, PKN, PALIVE, PEL, OVF, ERR = range(6)
CTR_SIZE = 8
# pending record columns before the per-variable slots
P_PART, P_DEC, P_FIRST, P_NEXT, P_CNT = range(5)
P_FIXED = 5


@dataclass(frozen=True)
class Layout:
    """Where each attribute lives in a channel row: ("i", col) or ("f", col)."""

    slots: dict
    n_int: int
    n_float: int  # at least 1 (numba wants a non-empty second axis)
    float_names: tuple
    int_names: tuple  # attributes in int columns 2.. (0: seq, 1: ts)

    @classmethod
    def of(cls, schema) -> Layout:
        slots, ints, floats = {}, [], []
        for name, kind in schema.attributes.items():
            if kind == "float":
                slots[name] = ("f", len(floats))
                floats.append(name)
            else:
                slots[name] = ("i", 2 + len(ints))
                ints.append(name)
        return cls(slots, 2 + len(ints), max(len(floats), 1), tuple(floats), tuple(ints))


def _indent(lines: list[str], n: int = 1) -> list[str]:
    return ["    " * n + line for line in lines]


def _zero(kind: str | None) -> str:
    return "np.float64(0.0)" if kind == "float" else ("False" if kind == "bool"
                                                         else "np.int64(0)")


class _Leaves:
    """Expression leaves over channel rows: `rows` maps a variable to (channel, row code)
    (single variables, negated ones, a Kleene element); `subject` is the row bare
    attributes read (step filters, window aggregate filters)."""

    def __init__(self, gen: CdpGenerator, rows: dict, subject: tuple | None = None):
        self.gen = gen
        self.rows = rows
        self.subject = subject
        self.pre: list[str] = []

    def attr(self, node: ast.Attr) -> Code:
        if node.var is None:
            if self.subject is None:
                raise ValueError(f"bare attribute '{node.name}' outside a step filter")
            channel, row = self.subject
        else:
            channel, row = self.rows[node.var]
        return Code(self.gen.column(channel, row, node.name))

    def aggregate(self, node: ast.Aggregate) -> Code:
        var = self.gen.plan.variables[node.arg.var]
        v, c = var.index, var.channel
        if node.arg.name == "":  # count(dup)
            return Code(f"n{v}")
        if node.func is A.COUNT:
            return Code(f"n{v}")
        t = self.gen.fresh("g")
        j = self.gen.fresh("j")
        kind = self.gen.kind(node.arg.name)
        value = self.gen.column(c, f"k{v}[{j}]", node.arg.name)
        lines = self._fold(node.func, t, j, f"range(n{v})", value, kind)
        self.pre.extend(lines)
        return self._result(node.func, t, kind)

    def _fold(self, func, t: str, j: str, loop: str, value: str, kind: str | None,
              guard: str | None = None) -> list[str]:
        """Lines computing `t` (and `t_n`, the count) over `loop` values."""
        zero = _zero(kind)
        lines = [f"{t} = {zero if func not in (A.SUM, A.AVG) else _zero(kind)}",
                 f"{t}_n = 0"]
        body = [f"{t}_w = {value}"]
        if func in (A.SUM, A.AVG):
            body.append(f"{t} += {t}_w")
        elif func in (A.MIN, A.MAX):
            op = "<" if func is A.MIN else ">"
            if kind == "string":
                test = f"s_rank[{t}_w] {op} s_rank[{t}]"
            else:
                test = f"{t}_w {op} {t}"
            body.append(f"if {t}_n == 0 or {test}:")
            body.append(f"    {t} = {t}_w")
        elif func is A.FIRST:
            body.append(f"if {t}_n == 0:")
            body.append(f"    {t} = {t}_w")
        elif func is A.LAST:
            body.append(f"{t} = {t}_w")
        body.append(f"{t}_n += 1")
        if func is A.COUNT:
            body = [f"{t}_n += 1"]
        if guard is not None:
            body = [f"if {guard}:"] + _indent(body)
        return lines + [f"for {j} in {loop}:"] + _indent(body)

    @staticmethod
    def _result(func, t: str, kind: str | None) -> Code:
        if func is A.COUNT:
            return Code(f"{t}_n")
        if func is A.SUM:
            return Code(t)
        if func is A.AVG:
            return Code(f"({t} / {t}_n if {t}_n > 0 else np.float64(0.0))", f"({t}_n == 0)")
        return Code(t, f"({t}_n == 0)")

    def window_aggregate(self, node: ast.WindowAggregate) -> Code:
        gen = self.gen
        use = gen.plan.window_aggregates[id(node)]
        anchor = gen.plan.variables[node.anchor]
        ca, ra = anchor.channel, self.rows[node.anchor][1]
        cw = use.channel
        t = gen.fresh("g")
        rw = gen.fresh("w")
        lo = f"_lb_ts(I{cw}, I{ca}[{ra}, 1] - {use.within})"
        if gen.plan.by_ts:
            hi = f"_lb_ts(I{cw}, I{ca}[{ra}, 1])"
        else:
            hi = f"_lb_seq(I{cw}, I{ca}[{ra}, 0])"
        guard = None
        if node.filter is not None:
            inner = _Leaves(gen, self.rows, subject=(cw, rw))
            guard = ExpressionCompiler(inner, gen.constants).condition(node.filter)
            self.pre.extend(inner.pre)
        kind = gen.kind(node.attr) if node.attr else None
        value = gen.column(cw, rw, node.attr) if node.attr else "0"
        self.pre.extend(self._fold(node.func, t, rw, f"range({lo}, {hi})", value, kind,
                                   guard))
        return self._result(node.func, t, kind)


class CdpGenerator(ChannelCodeGenerator):
    """Source text of the CDP kernel module of one SEQ query."""

    def __init__(self, plan: SeqPlan):
        if plan.uses_runs:
            raise ValueError(f"CDP evaluates skip-till-any-match queries, not "
                             f"{plan.strategy.value}")
        self.plan = plan
        self.schema = plan.schema
        self.layout = Layout.of(plan.schema)
        self.constants = StringConstants()
        self.type_consts = {}
        if plan.schema.type_attribute is not None:
            for name in plan.channels:
                if name != ANY:
                    self.type_consts[name] = self.constants.index(name)
        self._counter = 0
        self.scratch: list[str] = []  # per-level candidate buffers of the main kernel
        self.W = plan.window
        self.by_ts = plan.by_ts
        self.n_items = len(plan.items)
        self.positive = plan.positive
        # pending record layout
        self.slots = {}
        width = P_FIXED
        for var in self.positive:
            self.slots[var.name] = width
            width += 2 if var.kind == "kleene" else 1
        self.record_width = width
        self.n_emit = max(len(plan.body.emit), 1)
        self.channels = list(range(len(plan.channels)))
        self.pending_possible = any(
            n.where == "end" or plan.by_ts for n in plan.negations)

    # ------------------------------------------------------------ small helpers

    def single_rows(self, bound) -> dict:
        return {v.name: (v.channel, f"r{v.index}") for v in self.positive
                if v.kind == "single" and v.name in bound}

    def all_single_rows(self) -> dict:
        return {v.name: (v.channel, f"r{v.index}") for v in self.positive
                if v.kind == "single"}

    def conjunct_lines(self, c: Conjunct, rows: dict, flag: str) -> list[str]:
        """Lines that set `flag` False unless conjunct c holds; Kleene variables read
        element by element (and not given a row in `rows`) hold for every element."""
        kvars = sorted(self.plan.variables[v].index for v in c.elementwise if v not in rows)
        full = dict(rows)
        for v in c.elementwise:
            if v not in rows:
                var = self.plan.variables[v]
                full[v] = (var.channel, f"k{var.index}[j{var.index}]")
        leaves = _Leaves(self, full)
        cond = ExpressionCompiler(leaves, self.constants).condition(c.expr)
        fail = [f"if not {cond}:", f"    {flag} = False"]
        if not kvars:
            return leaves.pre + fail

        def loops(d: int) -> list[str]:
            v = kvars[d]
            inner = loops(d + 1) if d + 1 < len(kvars) else fail + ["    break"]
            out = [f"for j{v} in range(n{v}):"] + _indent(inner)
            if d + 1 < len(kvars):
                out += _indent([f"if not {flag}:", "    break"])
            return out

        return leaves.pre + loops(0)

    def checks(self, conjuncts: list[Conjunct], rows: dict, flag: str) -> list[str]:
        lines = [f"{flag} = True"]
        for c in conjuncts:
            block = self.conjunct_lines(c, rows, flag)
            lines += [f"if {flag}:"] + _indent(block)
        return lines

    def filter_code(self, step: ast.Step, channel: int, row: str) -> str | None:
        if step.filter is None:
            return None
        leaves = _Leaves(self, {}, subject=(channel, row))
        return ExpressionCompiler(leaves, self.constants).condition(step.filter)

    def binding_params(self) -> str:
        names = []
        for var in self.positive:
            if var.kind == "kleene":
                names += [f"k{var.index}", f"n{var.index}"]
            else:
                names.append(f"r{var.index}")
        return ", ".join(names)

    def element_count(self) -> str:
        parts = [f"n{v.index}" for v in self.positive if v.kind == "kleene"]
        singles = sum(1 for v in self.positive if v.kind == "single")
        return " + ".join([str(singles)] + parts)

    # ------------------------------------------------------------ the module

    def source(self) -> str:
        out = [HELPERS]
        out += self.gen_cancel()
        out += self.gen_emit()
        out += self.gen_release()
        out += self.gen_process()
        out += self.gen_release_all()
        return "\n".join(out) + "\n"

    # ------------------------------------------------------------ negations

    def item_summary_lines(self, i: int) -> list[str]:
        """lo/hi seq and ts of item i's events: s_lo{i}, s_hi{i}, t_lo{i}, t_hi{i}."""
        item = self.plan.items[i]
        lines = []
        if item.kind == "kleene":
            var = self.plan.variables[item.step.var]
            c, v = var.channel, var.index
            lines += [f"s_lo{i} = I{c}[k{v}[0], 0]", f"s_hi{i} = I{c}[k{v}[n{v} - 1], 0]",
                      f"t_lo{i} = I{c}[k{v}[0], 1]", f"t_hi{i} = I{c}[k{v}[n{v} - 1], 1]"]
            return lines
        first = True
        for step in item.steps:
            var = self.plan.variables[step.var]
            c, v = var.channel, var.index
            s, t = f"I{c}[r{v}, 0]", f"I{c}[r{v}, 1]"
            if first:
                lines += [f"s_lo{i} = {s}", f"s_hi{i} = {s}", f"t_lo{i} = {t}", f"t_hi{i} = {t}"]
                first = False
            else:
                lines += [f"s_lo{i} = min(s_lo{i}, {s})", f"s_hi{i} = max(s_hi{i}, {s})",
                          f"t_lo{i} = min(t_lo{i}, {t})", f"t_hi{i} = max(t_hi{i}, {t})"]
        return lines

    def bound_seq_test(self, seq: str, bound_vars, flag: str) -> list[str]:
        """Lines setting `flag` True if `seq` is the seq of a bound positive event."""
        lines = [f"{flag} = False"]
        for name in bound_vars:
            var = self.plan.variables[name]
            c, v = var.channel, var.index
            if var.kind == "kleene":
                j = self.fresh("j")
                lines += [f"for {j} in range(n{v}):",
                          f"    if I{c}[k{v}[{j}], 0] == {seq}:",
                          f"        {flag} = True",
                          "        break"]
            else:
                lines += [f"if I{c}[r{v}, 0] == {seq}:", f"    {flag} = True"]
        return lines

    def gen_cancel(self) -> list[str]:
        plan, W = self.plan, self.W
        L = ["@njit(cache=True)",
             f"def _cancel({self.channel_params()}, {self.binding_params()}, sc, "
             f"{STRING_TABLE_PARAMS}):"]
        body = []
        if not plan.negations:
            body.append("return False")
            return L + _indent(body) + [""]
        for i in range(self.n_items):
            body += self.item_summary_lines(i)
        n = self.n_items
        body += ["first_seq = s_lo0", f"last_seq = s_hi{n - 1}",
                 "first_ts = t_lo0", f"last_ts = t_hi{n - 1}"]
        for i in range(1, n):
            body += [f"first_ts = min(first_ts, t_lo{i})", f"last_ts = max(last_ts, t_hi{i})",
                     f"first_seq = min(first_seq, s_lo{i})",
                     f"last_seq = max(last_seq, s_hi{i})"]
        rows = self.all_single_rows()
        positive_names = [v.name for v in self.positive]
        for neg in plan.negations:
            var = plan.variables[neg.step.var]
            c, x = var.channel, f"x{var.index}"
            if self.by_ts:
                if neg.where == "start":
                    lo, hi = f"_lb_ts(I{c}, last_ts - {W})", f"_ub_ts(I{c}, first_ts)"
                elif neg.where == "end":
                    lo, hi = f"_lb_ts(I{c}, last_ts)", f"_ub_ts(I{c}, first_ts + {W})"
                else:
                    lo = f"_lb_ts(I{c}, t_hi{neg.before})"
                    hi = f"_ub_ts(I{c}, t_lo{neg.after})"
            else:
                if neg.where == "start":
                    lo, hi = f"_lb_ts(I{c}, last_ts - {W})", f"_lb_seq(I{c}, first_seq)"
                elif neg.where == "end":
                    lo, hi = f"_ub_seq(I{c}, last_seq)", f"_ub_ts(I{c}, first_ts + {W})"
                else:
                    lo = f"_ub_seq(I{c}, s_hi{neg.before})"
                    hi = f"_lb_seq(I{c}, s_lo{neg.after})"
            loop = []
            if self.by_ts:
                loop += self.bound_seq_test(f"I{c}[{x}, 0]", positive_names, "isb")
                loop += ["if isb:", "    continue"]
            flt = self.filter_code(neg.step, c, x)
            if flt is not None:
                loop += [f"if not {flt}:", "    continue"]
            nrows = dict(rows)
            nrows[neg.step.var] = (c, x)
            loop += self.checks(neg.conjuncts, nrows, "cok")
            loop += ["if cok:", "    return True"]
            body += [f"for {x} in range({lo}, {hi}):"] + _indent(loop)
        body.append("return False")
        return L + _indent(body) + [""]

    # ------------------------------------------------------------ output

    def gen_emit(self) -> list[str]:
        L = ["@njit(cache=True)",
             f"def _emit(p, {self.channel_params()}, {self.binding_params()}, om, oe_i, oe_f, "
             f"ovi, ovf, ovn, n_out, n_el, sc, {STRING_TABLE_PARAMS}):"]
        body = ["om[n_out, 0] = p", "om[n_out, 1] = n_el"]
        nI, nF = self.layout.n_int, self.layout.n_float
        for var in self.positive:
            c, v = var.channel, var.index
            if var.kind == "kleene":
                body += [f"for j in range(n{v}):",
                         f"    oe_i[n_el, 0] = {v}",
                         f"    for q in range({nI}):",
                         f"        oe_i[n_el, q + 1] = I{c}[k{v}[j], q]",
                         f"    for q in range({nF}):",
                         f"        oe_f[n_el, q] = F{c}[k{v}[j], q]",
                         "    n_el += 1"]
            else:
                body += [f"oe_i[n_el, 0] = {v}",
                         f"for q in range({nI}):",
                         f"    oe_i[n_el, q + 1] = I{c}[r{v}, q]",
                         f"for q in range({nF}):",
                         f"    oe_f[n_el, q] = F{c}[r{v}, q]",
                         "n_el += 1"]
        body.append("om[n_out, 2] = n_el - om[n_out, 1]")
        rows = self.all_single_rows()
        for j, item in enumerate(self.plan.body.emit):
            leaves = _Leaves(self, rows)
            code = ExpressionCompiler(leaves, self.constants).compile(item.expr)
            body += leaves.pre
            target = "ovf" if item.expr.type == "float" else "ovi"
            value = code.value
            if item.expr.type == "bool":
                value = f"(1 if {value} else 0)"
            elif item.expr.type == "float":
                value = f"np.float64({value})"
            store = [f"ovn[n_out, {j}] = 0", f"{target}[n_out, {j}] = {value}"]
            if code.nullable:
                body += [f"if {code.null}:", f"    ovn[n_out, {j}] = 1", "else:"] + \
                    _indent(store)
            else:
                body += store
        body.append("return n_out + 1, n_el")
        return L + _indent(body) + [""]

    # ------------------------------------------------------------ pending matches

    def gen_release(self) -> list[str]:
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
            c, v, s = var.channel, var.index, self.slots[var.name]
            if var.kind == "kleene":
                rebuild += [f"n{v} = pd[rec, {s + 1}]",
                            f"k{v} = np.empty(n{v}, np.int64)",
                            f"for j in range(n{v}):",
                            f"    k{v}[j] = pk[pd[rec, {s}] + j] - evp[{c}]"]
            else:
                rebuild.append(f"r{v} = pd[rec, {s}] - evp[{c}]")
        rebuild += [f"if not _cancel({self.channel_params()}, {self.binding_params()}, sc, "
                    f"{STRING_TABLE_PARAMS}):",
                    f"    n_out, n_el = _emit(p, {self.channel_params()}, "
                    f"{self.binding_params()}, om, oe_i, oe_f, ovi, ovf, ovn, n_out, n_el, sc, "
                    f"{STRING_TABLE_PARAMS})"]
        body += _indent(rebuild, 2)
        body += ["    else:",
                 f"        newdec = min(newdec, pd[rec, {P_DEC}])",
                 f"        newfirst = min(newfirst, pd[rec, {P_FIRST}])",
                 "        prev = rec",
                 "    rec = nxt",
                 "pdec[p] = newdec",
                 "pfirst[p] = newfirst",
                 "return n_out, n_el"]
        return L + _indent(body) + [""]

    def gen_release_all(self) -> list[str]:
        """Punctuation (force=False: event time reached `punct`) and flush (force=True)."""
        L = ["@njit(cache=True)",
             f"def release_all(punct, force, {self.arena_params()}, base, cnt, evicted, last_ts, "
             f"pd, pk, phead, ptail, pdec, pfirst, ctr, sc, {STRING_TABLE_PARAMS}):",
             "    n_out = np.int64(0)",
             "    n_el = np.int64(0)",
             "    om = np.empty((16, 3), np.int64)",
             f"    oe_i = np.empty((16, {self.layout.n_int + 1}), np.int64)",
             f"    oe_f = np.empty((16, {self.layout.n_float}), np.float64)",
             f"    ovi = np.empty((16, {self.n_emit}), np.int64)",
             f"    ovf = np.empty((16, {self.n_emit}), np.float64)",
             f"    ovn = np.empty((16, {self.n_emit}), np.int64)",
             "    for p in range(phead.shape[0]):",
             "        if phead[p] < 0:",
             "            continue",
             "        now = max(last_ts[p], punct)",
             "        if not force and not now > pdec[p]:",
             "            continue"]
        L += _indent(self.ensure_release_capacity(), 2)
        L += _indent(self.fetch_lines(), 2)
        L += [f"        n_out, n_el = _release(p, now, force, {self.channel_params()}, "
              f"evicted[p], pd, pk, phead, ptail, pdec, pfirst, ctr, om, oe_i, oe_f, ovi, ovf, "
              f"ovn, n_out, n_el, sc, {STRING_TABLE_PARAMS})",
              "    return n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn",
              ""]
        return L

    def ensure_release_capacity(self) -> list[str]:
        return [f"if n_out + ctr[{PALIVE}] > om.shape[0]:",
                f"    om, ovi, ovf, ovn = _grow_out(om, ovi, ovf, ovn, n_out + ctr[{PALIVE}])",
                f"if n_el + ctr[{PEL}] > oe_i.shape[0]:",
                f"    oe_i, oe_f = _grow_el(oe_i, oe_f, n_el + ctr[{PEL}])"]

    # ------------------------------------------------------------ the main kernel

    def gen_process(self) -> list[str]:
        plan = self.plan
        L = ["@njit(cache=True)",
             f"def process(n, pid, EI, EF, {self.arena_params()}, base, size, cnt, evicted, top, "
             f"last_ts, pd, pk, "
             f"phead, ptail, pdec, pfirst, ctr, punct, sc, {STRING_TABLE_PARAMS}, cap_m, cap_s, "
             "stop_on_overflow):"]
        body = ["n_out = np.int64(0)", "n_el = np.int64(0)",
                "om = np.empty((64, 3), np.int64)",
                f"oe_i = np.empty((64, {self.layout.n_int + 1}), np.int64)",
                f"oe_f = np.empty((64, {self.layout.n_float}), np.float64)",
                f"ovi = np.empty((64, {self.n_emit}), np.int64)",
                f"ovf = np.empty((64, {self.n_emit}), np.float64)",
                f"ovn = np.empty((64, {self.n_emit}), np.int64)",
                "dead = np.empty(n, np.int64)",
                "n_dead = 0",
                "const_ok = True"]
        for c in plan.constant_conjuncts:
            body += ["if const_ok:"] + _indent(self.conjunct_lines(c, {}, "const_ok"))
        loop = ["p = pid[t]", "eseq = EI[t, 0]", "ets = EI[t, 1]",
                "if ets < last_ts[p]:",
                "    dead[n_dead] = t",
                "    n_dead += 1",
                "    continue",
                "last_ts[p] = ets",
                "now = max(ets, punct)"]
        if self.pending_possible:
            loop += ["if phead[p] >= 0 and now > pdec[p]:"]
            inner = self.ensure_release_capacity() + self.fetch_lines()
            inner += [f"n_out, n_el = _release(p, now, False, {self.channel_params()}, "
                      f"evicted[p], pd, pk, phead, ptail, pdec, pfirst, ctr, om, oe_i, oe_f, "
                      f"ovi, ovf, ovn, n_out, n_el, sc, {STRING_TABLE_PARAMS})"]
            loop += _indent(inner)
        loop += self.append_lines()
        gate = self.terminator_gate()
        enum = self.fetch_lines() + ["stop = False", "work = 0", "nm = 0"]
        enum += self.gen_item(self.n_items - 1, self.initial_state())
        body += [f"{name} = np.empty(256, np.int64)" for name in self.scratch]
        enum += ["if stop:", f"    ctr[{OVF}] += 1", "    if stop_on_overflow:",
                 f"        ctr[{ERR}] = t", "        break"]
        loop += [f"if const_ok and ({gate}):"] + _indent(enum)
        body += ["for t in range(n):"] + _indent(loop)
        body.append("return n_out, n_el, om, oe_i, oe_f, ovi, ovf, ovn, n_dead, dead, pd, pk, "
                    f"({self.arena_params()},)")
        return L + _indent(body) + [""]

    def append_lines(self) -> list[str]:
        plan = self.plan
        lines = []
        type_attr = self.schema.type_attribute
        if type_attr is not None and self.type_consts:
            lines.append(f"tc = EI[t, {self.layout.slots[type_attr][1]}]")
        if plan.horizon is not None:
            lines += [f"thr = min(ets, pfirst[p]) - {plan.horizon}"]
            evict, horizon = "np.int64(1)", f"np.int64({plan.horizon})"
        else:
            lines += ["thr = ets"]
            evict, horizon = "np.int64(0)", "np.int64(0)"
        for c, name in enumerate(plan.channels):
            if name == ANY:
                lines.append(f"ein{c} = True")
            else:
                lines.append(f"ein{c} = tc == sc[{self.type_consts[name]}]")
            lines += [f"if ein{c}:",
                      f"    AI{c}, AF{c} = append_row(AI{c}, AF{c}, base, size, cnt, evicted, "
                      f"top, p, np.int64({c}), EI, EF, t, thr, {evict}, last_ts, pfirst, "
                      f"{horizon})"]
        return lines

    def terminator_gate(self) -> str:
        if self.by_ts:
            chans = sorted({v.channel for v in self.positive})
        else:
            last = self.plan.items[-1]
            chans = sorted({self.plan.variables[s.var].channel for s in last.steps})
        return " or ".join(f"ein{c}" for c in chans)

    def initial_state(self) -> dict:
        return {"mt": None, "Mt": None, "ms": None, "eb": None, "bound": []}

    # ------------------------------------------------------------ building back

    def lower_ts(self, st: dict, step: ast.Step, narrow: bool,
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
        if within is not None:
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

    def upper_index(self, i: int, c: int, st: dict) -> str:
        """End (exclusive) of the candidate range: before the next item in the query's
        order; the last item: every row (all were seen up to the terminator)."""
        if i == self.n_items - 1:
            return f"I{c}.shape[0]"
        if self.by_ts:
            return f"_ub_ts(I{c}, it{i + 1})"
        return f"_lb_seq(I{c}, is{i + 1})"

    def summary(self, st: dict, lo_ts: str, hi_ts: str, lo_seq: str, seq_hit: str | None,
                suffix: str) -> tuple[list[str], dict]:
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
        new = dict(st, mt=mt, Mt=Mt, ms=ms, eb=eb)
        return lines, new

    def still_possible(self, st: dict) -> str | None:
        """Under ORDER BY ts: can the terminator still be the match's largest-seq event?"""
        if not self.by_ts or st["eb"] == "True":
            return None
        if st["eb"] is None:
            return f"{st['mt']} == ets"
        return f"({st['eb']} or {st['mt']} == ets)"

    def gen_item(self, i: int, st: dict) -> list[str]:
        if i < 0:
            return self.gen_final(st)
        kind = self.plan.items[i].kind
        if kind == "single":
            return self.gen_single(i, st)
        if kind == "kleene":
            return self.gen_kleene(i, st)
        return self.gen_and(i, 0, st, st)

    def exclusion_lines(self, seq: str, st: dict, extra: list[str], flag: str) -> list[str]:
        names = list(st["bound"]) if self.by_ts else []
        names += [n for n in extra if n not in names]
        if not names:
            return []
        return self.bound_seq_test(seq, names, flag) + [f"if {flag}:", "    continue"]

    def window_upper(self, st: dict, ts: str) -> list[str]:
        if self.W is None or st["mt"] is None:
            return []
        return [f"if {ts} > {st['mt']} + {self.W}:", "    continue"]

    def gen_single(self, i: int, st: dict) -> list[str]:
        plan = self.plan
        item = plan.items[i]
        step = item.step
        var = plan.variables[step.var]
        c, v = var.channel, var.index
        last = i == self.n_items - 1
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
            body += [f"if {cond}:"] + _indent(nested)
        else:
            body += nested
        if policy in (ast.Policy.LAST, ast.Policy.FIRST):
            # choose in a tight loop, then build on the one chosen (if any)
            select = [f"sel{i} = -1", loop] + _indent(checks + [f"sel{i} = {r}", "break"])
            select += [f"if sel{i} >= 0:"] + _indent(
                [f"{r} = sel{i}", f"q{v} = I{c}[{r}, 0]", f"t{v} = I{c}[{r}, 1]"] + body)
            lines += _indent(select, ind)
            return lines
        if not (not self.by_ts and last):
            # EACH: collect the candidates in a tight loop, then build on each
            collect = [f"if hi{i} - lo{i} > cb{i}.shape[0]:",
                       f"    cb{i} = np.empty(2 * (hi{i} - lo{i}), np.int64)",
                       f"nc{i} = 0", loop] + _indent(
                checks + [f"cb{i}[nc{i}] = {r}", f"nc{i} += 1"])
            self.scratch.append(f"cb{i}")
            each = ["if stop:", "    break", f"{r} = cb{i}[jc{i}]", f"q{v} = I{c}[{r}, 0]",
                    f"t{v} = I{c}[{r}, 1]"] + body
            lines += _indent(collect + [f"for jc{i} in range(nc{i}):"] + _indent(each), ind)
            return lines
        body = ["if stop:", "    break"] + checks + body
        lines += _indent([loop] + _indent(body), ind)
        return lines

    def gen_kleene(self, i: int, st: dict) -> list[str]:
        plan = self.plan
        item = plan.items[i]
        step = item.step
        var = plan.variables[step.var]
        c, v = var.channel, var.index
        last = i == self.n_items - 1
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
                out += [f"if {flag}:"] + _indent(self.conjunct_lines(conj, rows, flag))
            return out

        ind = 0
        if required:
            lines += [f"if ein{c}:"]
            inner = [f"re{i} = I{c}.shape[0] - 1"] + element_ok(f"re{i}", f"eok{i}")
            lines += _indent(inner)
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
        block += [f"for rc{i} in range(lo{i}, hi{i}):"] + _indent(cand)
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
            sub += [f"if okk{i}:"] + _indent(self.checks(conj, rows, f"okc{i}"))
            sub += [f"    okk{i} = okc{i}"]
        cond = self.still_possible(new)
        if cond is not None:
            sub += [f"if okk{i} and not {cond}:", f"    okk{i} = False"]
        sub += [f"is{i} = fs{i}", f"it{i} = ft{i}"]
        sub += [f"if okk{i}:"] + _indent(self.gen_item(i - 1, new))
        inner += [f"if {n} > 0:"] + _indent(sub)
        inner += [f"jb{i} = sz{i} - 1",
                  f"while jb{i} >= 0 and ki{i}[jb{i}] == m{i} - sz{i} + jb{i}:",
                  f"    jb{i} -= 1",
                  f"if jb{i} < 0:",
                  "    break",
                  f"ki{i}[jb{i}] += 1",
                  f"for ja{i} in range(jb{i} + 1, sz{i}):",
                  f"    ki{i}[ja{i}] = ki{i}[ja{i} - 1] + 1"]
        comb += _indent(inner)
        block += _indent(comb)
        lines += _indent(block, ind)
        return lines

    def gen_and(self, i: int, j: int, st: dict, st_item: dict) -> list[str]:
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
        lines += [f"for {r} in range(lo{tag}, hi{tag}):"] + _indent(body)
        return lines

    def gen_and_end(self, i: int, st: dict, st_item: dict) -> list[str]:
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
        new = dict(st, mt=f"mt{i}", Mt=f"Mt{i}", ms=f"ms{i}")
        conds = []
        if not self.by_ts and last:
            conds.append(st["eb"])
            new["eb"] = "True"
        cond = self.still_possible(new)
        if cond is not None:
            conds.append(cond)
        nested = self.gen_item(i - 1, new)
        if conds:
            return lines + [f"if {' and '.join(conds)}:"] + _indent(nested)
        return lines + nested

    def gen_final(self, st: dict) -> list[str]:
        plan = self.plan
        lines = []
        body = ["nm += 1",
                "if nm > cap_m:",
                "    stop = True",
                "    break"]
        emit = self.ensure_emit_capacity() + [
            f"n_out, n_el = _emit(p, {self.channel_params()}, {self.binding_params()}, om, "
            f"oe_i, oe_f, ovi, ovf, ovn, n_out, n_el, sc, {STRING_TABLE_PARAMS})"]
        if plan.negations:
            decided = [f"if not _cancel({self.channel_params()}, {self.binding_params()}, sc, "
                       f"{STRING_TABLE_PARAMS}):"] + _indent(emit)
        else:
            decided = emit
        times = []
        for neg in plan.negations:
            if neg.where == "end":
                times.append(f"{st['mt']} + {self.W}")
            elif self.by_ts and neg.where == "start":
                times.append(st["mt"])
            elif self.by_ts:
                times.append(f"it{neg.after}")
        if times:
            decide = times[0] if len(times) == 1 else f"max({', '.join(times)})"
            body += [f"decide = {decide}", "if not now > decide:"]
            body += _indent(self.pending_lines(st))
            body += ["else:"] + _indent(decided)
        else:
            body += decided
        cond = None
        if self.by_ts and st["eb"] != "True":
            cond = st["eb"]
        # `break` above must leave the innermost loop: every level is inside a loop.
        if cond is not None:
            return lines + [f"if {cond}:"] + _indent(body)
        return lines + body

    def ensure_emit_capacity(self) -> list[str]:
        return ["if n_out >= om.shape[0]:",
                "    om, ovi, ovf, ovn = _grow_out(om, ovi, ovf, ovn, n_out + 1)",
                f"if n_el + {self.element_count()} > oe_i.shape[0]:",
                f"    oe_i, oe_f = _grow_el(oe_i, oe_f, n_el + {self.element_count()})"]

    def pending_lines(self, st: dict) -> list[str]:
        lines = [f"rec = ctr[{PN}]",
                 "if rec >= pd.shape[0]:",
                 "    pd = _grow_rows(pd, rec + 1)"]
        kleene = [v for v in self.positive if v.kind == "kleene"]
        if kleene:
            total = " + ".join(f"n{v.index}" for v in kleene)
            lines += [f"if ctr[{PKN}] + {total} > pk.shape[0]:",
                      f"    pk = _grow_1d(pk, ctr[{PKN}] + {total})"]
        lines += [f"pd[rec, {P_PART}] = p", f"pd[rec, {P_DEC}] = decide",
                  f"pd[rec, {P_FIRST}] = {st['mt']}", f"pd[rec, {P_NEXT}] = -1",
                  f"pd[rec, {P_CNT}] = {self.element_count()}"]
        for var in self.positive:
            c, v, s = var.channel, var.index, self.slots[var.name]
            if var.kind == "kleene":
                lines += [f"pd[rec, {s}] = ctr[{PKN}]", f"pd[rec, {s + 1}] = n{v}",
                          f"for j in range(n{v}):",
                          f"    pk[ctr[{PKN}] + j] = k{v}[j] + evicted[p, {c}]",
                          f"ctr[{PKN}] += n{v}"]
            else:
                lines.append(f"pd[rec, {s}] = r{v} + evicted[p, {c}]")
        lines += ["if ptail[p] >= 0:",
                  f"    pd[ptail[p], {P_NEXT}] = rec",
                  "else:",
                  "    phead[p] = rec",
                  "ptail[p] = rec",
                  "pdec[p] = min(pdec[p], decide)",
                  f"pfirst[p] = min(pfirst[p], {st['mt']})",
                  f"ctr[{PN}] += 1", f"ctr[{PALIVE}] += 1",
                  f"ctr[{PEL}] += {self.element_count()}"]
        return lines


HELPERS = f"""
# runtime version {RUNTIME_VERSION}
from cep_core.compiler.seq_runtime import (
    append_row,
    grow_1d as _grow_1d,
    grow_el as _grow_el,
    grow_out as _grow_out,
    grow_rows as _grow_rows,
    lb_seq as _lb_seq,
    lb_ts as _lb_ts,
    ub_seq as _ub_seq,
    ub_ts as _ub_ts,
)

"""


class CdpKernel:
    """The loaded kernel module of one query and what decoding its output needs."""

    def __init__(self, plan: SeqPlan):
        self.plan = plan
        self.generator = CdpGenerator(plan)
        self.source = self.generator.source()
        self.module = load_module(self.source)
        self.layout = self.generator.layout
        self.constants = self.generator.constants
        self.record_width = self.generator.record_width
        self.n_emit = self.generator.n_emit
        self.kleene_slots = [self.generator.slots[v.name] for v in plan.positive
                             if v.kind == "kleene"]
