"""CUDA kernels of column-based delayed processing for one SEQ query, generated from its
`SeqPlan` (the checked AST only; expressions go through `ExpressionCompiler`).

Matches are built back from their terminators one positive step at a time, last to first,
as Cugola & Margara's GPU CDP: a *partial sequence* s holds the rows bound so far
(`B[s, v]`, -1: unbound); for step i the host finds, by binary search, the rows of the
step's column that the window admits (`lo[s]`, and `off`, the prefix sums of the range
lengths), and `level_{i}` runs one thread per (partial sequence, column row) pair: the
step's filter and the WHERE conditions decided at that step, then EACH appends the pair at
an atomically incremented output index, LAST / FIRST keep the latest / earliest row per
sequence by atomic max / min.

Whole matches then get their window aggregates from `wagg_{k}` (one block per match, a
parallel reduction in shared memory; float sums and averages are added by one thread in
row order so that they round as the reference's), and `final` checks the conditions that
read window aggregates and computes the EMIT values.

Rows are read through the column rings (`cep_accel.gpu.columns`): row r of partition p in
channel c is `I{c}[RB[p, c] + r % RC[p, c]]`.
"""

from __future__ import annotations

from typing import Any

from cep_core import ast
from cep_core.compiler.expressions import (
    STRING_TABLE_PARAMS,
    Code,
    ExpressionCompiler,
    StringConstants,
)
from cep_core.compiler.modules import load_module
from cep_core.compiler.seq_cdp import Layout
from cep_core.compiler.seq_codegen import emit_store_lines
from cep_core.compiler.seq_plan import SeqPlan
from cep_core.kernels.seq_layout import Row
from cep_core.schema import AttrType
from cep_accel.gpu.seq_support import has_window_aggregate, unsupported_reason

A = ast.AggFunc


def _indent(lines: list[str], n: int = 1) -> list[str]:
    return ["    " * n + line for line in lines]


class _Leaves:
    """Attributes of bound rows (`r{v}`), of a window row (`subject`), and window
    aggregates already reduced (`wv{k}[m]`, `wn{k}[m]`) where `reduced` is set. The CUDA
    counterpart of the CPU kernels' `cep_core.compiler.seq_codegen_leaves.ChannelLeaves`,
    kept apart on purpose (device rows and reductions): a change to one wants the other."""

    def __init__(self, gen: SeqKernelGenerator, subject: tuple | None = None,
                 reduced: bool = False):
        self.gen, self.subject, self.reduced = gen, subject, reduced

    # Deliberately like cep_core/compiler/seq_codegen_leaves.py's attr: the GPU's leaves read ring
    # buffers, the CPU's arenas (the core never imports accel)
    def attr(self, node: ast.Attr) -> Code:
        if node.var is None:
            if self.subject is None:
                raise ValueError(f"bare attribute '{node.name}' outside a filter")
            channel, row = self.subject
        else:
            var = self.gen.plan.variables[node.var]
            channel, row = var.channel, f"r{var.index}"
        return Code(self.gen.column(channel, row, node.name))

    def aggregate(self, node: ast.Aggregate) -> Code:
        raise ValueError("aggregates over Kleene steps are evaluated on the CPU")

    def window_aggregate(self, node: ast.WindowAggregate) -> Code:
        if not self.reduced:
            raise ValueError("a window aggregate outside the final kernel")
        k = self.gen.wagg_index[id(node)]
        v, n = f"wv{k}[m]", f"wn{k}[m]"
        if node.func is A.COUNT:
            return Code(n)
        if node.func is A.SUM:
            return Code(v)
        if node.func is A.AVG:
            return Code(f"({v} / {n} if {n} > 0 else np.float64(0.0))", f"({n} == 0)")
        return Code(v, f"({n} == 0)")


class SeqKernelGenerator:
    def __init__(self, plan: SeqPlan, reduce_threads: int = 64):
        reason = unsupported_reason(plan)
        if reason is not None:
            raise ValueError(reason)
        self.plan = plan
        self.schema = plan.schema
        self.layout = Layout.of(plan.schema)
        self.constants = StringConstants()
        self.type_consts = {name: self.constants.index(name) for name in plan.channels
                            if name != ast.ANY_TYPE and plan.schema.type_attribute is not None}
        self.reduce_threads = reduce_threads
        self.uses = list(plan.window_aggregates.values())
        self.wagg_index = {id(u.node): k for k, u in enumerate(self.uses)}
        self.deferred = [c for c in plan.conjuncts if has_window_aggregate(c.expr)]
        self.n_emit = max(len(plan.body.emit), 1)

    # ------------------------------------------------------------ helpers

    def kind(self, name: str) -> str:
        kind = self.schema.attributes[name]
        return AttrType.INT if kind == AttrType.TIMESTAMP else kind

    def column(self, channel: int, row: str, name: str) -> str:
        where, col = self.layout.slots[name]
        slot = f"RB[p, {channel}] + {row} % RC[p, {channel}]"
        if where == Row.FLOAT:
            return f"F{channel}[{slot}, {col}]"
        if self.schema.attributes[name] == AttrType.BOOL:
            return f"(I{channel}[{slot}, {col}] != 0)"
        return f"I{channel}[{slot}, {col}]"

    def expressions(self, leaves: _Leaves) -> ExpressionCompiler:
        """An expression compiler over `leaves` with this query's string constants and types."""
        return ExpressionCompiler(leaves, self.constants, self.plan.checked.types)

    def condition(self, expr: ast.Expr, subject: tuple[int, str] | None = None,
                  reduced: bool = False) -> str:
        leaves = _Leaves(self, subject, reduced)
        return self.expressions(leaves).condition(expr)

    def arenas(self) -> str:
        return ", ".join(f"I{c}, F{c}" for c in range(len(self.plan.channels)))

    def tail_params(self) -> str:
        return f"{self.arenas()}, RB, RC, sc, {STRING_TABLE_PARAMS}"

    def bind_lines(self, names: list[str], seq: str) -> list[str]:
        return [f"r{self.plan.variables[n].index} = B[{seq}, "
                f"{self.plan.variables[n].index}]" for n in names]

    # ------------------------------------------------------------ the module

    def source(self) -> str:
        out = ["from numba import cuda", ""]
        for i in range(len(self.plan.items)):
            out += self.gen_level(i)
        for k in range(len(self.uses)):
            out += self.gen_wagg(k)
        out += self.gen_final()
        return "\n".join(out) + "\n"

    def gen_level(self, i: int) -> list[str]:
        plan = self.plan
        step = plan.items[i].step
        var = plan.variables[step.var]
        v = var.index
        last = i == len(plan.items) - 1
        policy = None if last else step.policy
        body = ["g = cuda.grid(1)", "if g >= total:", "    return",
                "a = 0", "b = S",
                "while b - a > 1:", "    mid = (a + b) // 2", "    if off[mid] <= g:",
                "        a = mid", "    else:", "        b = mid",
                "s = a", "p = sp[s]", f"r{v} = lo[s] + (g - off[s])"]
        # in variable order: the source (and so the kernel cache) must not depend on
        # set iteration order, which changes from process to process
        body += self.bind_lines(sorted(plan.bound_after(i + 1),
                                       key=lambda n: plan.variables[n].index), "s")
        if step.filter is not None:
            body += [f"if not {self.condition(step.filter, (var.channel, f'r{v}'))}:",
                     "    return"]
        for c in plan.conjuncts_at(i):
            if has_window_aggregate(c.expr):
                continue  # decided in `final` (EACH steps and the terminator only)
            body += [f"if not {self.condition(c.expr)}:", "    return"]
        if policy is ast.Policy.LAST:
            body.append(f"cuda.atomic.max(sel, s, r{v})")
        elif policy is ast.Policy.FIRST:
            body.append(f"cuda.atomic.min(sel, s, r{v})")
        else:
            body += ["k = cuda.atomic.add(count, 0, 1)", "out_par[k] = s", f"out_row[k] = r{v}"]
        return ["@cuda.jit",
                f"def level_{i}(S, total, B, sp, lo, off, out_par, out_row, count, sel, "
                f"{self.tail_params()}):"] + _indent(body) + [""]

    def gen_wagg(self, k: int) -> list[str]:
        use = self.uses[k]
        node, c = use.node, use.channel
        kind = self.kind(node.attr) if node.attr else "int"
        T = self.reduce_threads
        dtype = "float64" if kind == AttrType.FLOAT else "int64"
        value = self.column(c, "j", node.attr) if node.attr else "0"
        guard = "True" if node.filter is None else self.condition(node.filter, (c, "j"))
        func = node.func
        body = ["m = cuda.blockIdx.x", "tid = cuda.threadIdx.x", "p = sp[m]"]
        body += self.bind_lines([v.name for v in self.plan.positive], "m")
        if func in (A.SUM, A.AVG) and kind == AttrType.FLOAT:
            seq = ["acc = 0.0", "n = 0", "for j in range(wlo[m], whi[m]):",
                   f"    if {guard}:", f"        acc += {value}", "        n += 1",
                   "out_v[m] = acc", "out_n[m] = n"]
            return ["@cuda.jit",
                    f"def wagg_{k}(B, sp, wlo, whi, out_v, out_n, {self.tail_params()}):"] + \
                _indent(body + ["if tid == 0:"] + _indent(seq)) + [""]
        less = "<" if func is A.MIN else ">"
        better_x = f"s_rank[x] {less} s_rank[acc]" if kind == AttrType.STRING else f"x {less} acc"
        fold = {A.SUM: ["acc += x"], A.AVG: ["acc += x"], A.COUNT: [],
                A.MIN: [f"if n == 0 or {better_x}:", "    acc = x"],
                A.MAX: [f"if n == 0 or {better_x}:", "    acc = x"],
                A.FIRST: ["if n == 0:", "    acc = j"], A.LAST: ["acc = j"]}[func]
        if func in (A.FIRST, A.LAST):
            dtype = "int64"
        zero = "0.0" if dtype == "float64" else "0"
        body += [f"sv = cuda.shared.array({T}, numba.{dtype})",
                 f"sn = cuda.shared.array({T}, numba.int64)",
                 f"acc = {zero}", "n = 0", "j = wlo[m] + tid",
                 "while j < whi[m]:", f"    if {guard}:", f"        x = {value}"]
        body += _indent(fold, 2) + ["        n += 1", f"    j += {T}",
                                    "sv[tid] = acc", "sn[tid] = n", "cuda.syncthreads()",
                                    f"half = {T // 2}", "while half > 0:",
                                    "    if tid < half:", "        o = tid + half"]
        y = "sv[o]"
        if func in (A.SUM, A.AVG):
            merge = [f"sv[tid] += {y}"]
        elif func is A.COUNT:
            merge = []
        elif func in (A.MIN, A.MAX):
            better = (f"s_rank[{y}] {less} s_rank[sv[tid]]" if kind == AttrType.STRING
                      else f"{y} {less} sv[tid]")
            merge = ["if sn[o] > 0 and (sn[tid] == 0 or " + better + "):", f"    sv[tid] = {y}"]
        elif func is A.FIRST:
            merge = ["if sn[o] > 0 and (sn[tid] == 0 or sv[o] < sv[tid]):", "    sv[tid] = sv[o]"]
        else:
            merge = ["if sn[o] > 0 and (sn[tid] == 0 or sv[o] > sv[tid]):", "    sv[tid] = sv[o]"]
        body += _indent(merge, 2) + ["        sn[tid] += sn[o]", "    cuda.syncthreads()",
                                     "    half //= 2",
                                     "if tid == 0:", "    out_n[m] = sn[0]"]
        if func in (A.FIRST, A.LAST):
            assert node.attr is not None  # first() and last() read an attribute
            read = self.column(c, "sv[0]", node.attr)
            body += ["    if sn[0] > 0:", f"        out_v[m] = {read}"]
        else:
            body += ["    out_v[m] = sv[0]"]
        return ["@cuda.jit",
                f"def wagg_{k}(B, sp, wlo, whi, out_v, out_n, {self.tail_params()}):"] + \
            _indent(body) + [""]

    def gen_final(self) -> list[str]:
        aggs = ", ".join(f"wv{k}, wn{k}" for k in range(len(self.uses)))
        params = f"M, B, sp, keep, ovi, ovf, ovn, {aggs + ', ' if aggs else ''}" \
                 f"{self.tail_params()}"
        body = ["m = cuda.grid(1)", "if m >= M:", "    return", "p = sp[m]"]
        body += self.bind_lines([v.name for v in self.plan.positive], "m")
        body.append("keep[m] = 0")
        for c in self.deferred:
            body += [f"if not {self.condition(c.expr, reduced=True)}:", "    return"]
        body.append("keep[m] = 1")
        for j, item in enumerate(self.plan.body.emit):
            leaves = _Leaves(self, reduced=True)
            code = self.expressions(leaves).compile(item.expr)
            body += emit_store_lines(j, self.plan.checked.types[item.expr], code, "m")
        return ["@cuda.jit", f"def final({params}):"] + _indent(body) + [""]


class SeqKernels:
    """The loaded kernel module of one query and what the engine needs to launch it (the
    GPU's `cep_core.compiler.seq_cdp.CdpKernel`)."""

    def __init__(self, plan: SeqPlan, reduce_threads: int = 64):
        self.generator = SeqKernelGenerator(plan, reduce_threads)
        # Deliberately like cep_core/compiler/seq_cdp.py CdpKernel: each kernel loads its own
        # generator's module
        self.source = self.generator.source()
        self.module = load_module(self.source)
        self.layout = self.generator.layout
        self.constants = self.generator.constants
        self.type_consts = self.generator.type_consts
        self.uses = self.generator.uses
        self.n_emit = self.generator.n_emit
        self.reduce_threads = reduce_threads

    def level(self, i: int) -> Any:  # a numba CUDA kernel
        return getattr(self.module, f"level_{i}")

    def wagg(self, k: int) -> Any:  # a numba CUDA kernel
        return getattr(self.module, f"wagg_{k}")
