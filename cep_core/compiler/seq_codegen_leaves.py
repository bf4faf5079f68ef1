"""Expression leaves of the SEQ code generators (CDP and AIP): attributes read from channel
rows, aggregates over a Kleene variable's rows and window aggregates over a channel's range,
as code for `ExpressionCompiler`. Aggregates need loops: their lines collect in `pre`, to be
placed before the expression."""

from __future__ import annotations

from typing import TypeAlias

from cep_core import ast
from cep_core.compiler.expressions import Code
from cep_core.compiler.seq_codegen import ChannelCodeGenerator, indent
from cep_core.schema import AttrType

A = ast.AggFunc

# variable -> (channel, row code)
VarRows: TypeAlias = dict[str, tuple[int, str]]
# Kleene variable -> (channel, rows array, count)
KleeneRows: TypeAlias = dict[str, tuple[int, str, str]]


def zero(kind: str | None) -> str:
    return "np.float64(0.0)" if kind == AttrType.FLOAT else ("False" if kind == AttrType.BOOL
                                                         else "np.int64(0)")


class ChannelLeaves:
    """`rows` maps a variable to (channel, row code) (single variables, negated ones, one
    element of a Kleene variable); `kleene` maps a Kleene variable to (channel, rows array,
    count); `subject` is the row bare attributes read (step filters, window aggregate
    filters). `gen` is a seq_codegen.ChannelCodeGenerator. The GPU kernels keep their own
    (`cep_accel.gpu.seq_kernels._Leaves`) on purpose: a change to one wants the other."""

    def __init__(self, gen: ChannelCodeGenerator, rows: VarRows, kleene: KleeneRows,
                 subject: tuple[int, str] | None = None):
        self.gen = gen
        self.rows = rows
        self.kleene = kleene
        self.subject = subject
        self.pre: list[str] = []

    # Deliberately like accel/gpu/seq_kernels.py's attr: the GPU's leaves read ring buffers, these
    # arenas (the core never imports accel)
    def attr(self, node: ast.Attr) -> Code:
        if node.var is None:
            if self.subject is None:
                raise ValueError(f"bare attribute '{node.name}' outside a step filter")
            channel, row = self.subject
        else:
            channel, row = self.rows[node.var]
        return Code(self.gen.column(channel, row, node.name))

    def aggregate(self, node: ast.Aggregate) -> Code:
        arg = node.arg
        # the checker admits SEQ aggregates over a Kleene variable only
        assert arg is not None and arg.var is not None
        channel, arr, count = self.kleene[arg.var]
        if arg.name == "" or node.func is A.COUNT:
            return Code(count)
        t = self.gen.fresh("g")
        j = self.gen.fresh("j")
        kind = self.gen.kind(arg.name)
        value = self.gen.column(channel, f"{arr}[{j}]", arg.name)
        self.pre.extend(self._fold(node.func, t, j, f"range({count})", value, kind))
        return self._result(node.func, t)

    @staticmethod
    def _fold(func: ast.AggFunc, t: str, j: str, loop: str, value: str, kind: str | None,
              guard: str | None = None) -> list[str]:
        """Lines computing `t` (and `t_n`, the count) over `loop` values."""
        lines = [f"{t} = {zero(kind)}", f"{t}_n = 0"]
        body = [f"{t}_w = {value}"]
        if func in (A.SUM, A.AVG):
            body.append(f"{t} += {t}_w")
        elif func in (A.MIN, A.MAX):
            op = "<" if func is A.MIN else ">"
            test = f"s_rank[{t}_w] {op} s_rank[{t}]" if kind == AttrType.STRING \
                else f"{t}_w {op} {t}"
            body += [f"if {t}_n == 0 or {test}:", f"    {t} = {t}_w"]
        elif func is A.FIRST:
            body += [f"if {t}_n == 0:", f"    {t} = {t}_w"]
        elif func is A.LAST:
            body.append(f"{t} = {t}_w")
        body.append(f"{t}_n += 1")
        if func is A.COUNT:
            body = [f"{t}_n += 1"]
        if guard is not None:
            body = [f"if {guard}:"] + indent(body)
        return lines + [f"for {j} in {loop}:"] + indent(body)

    @staticmethod
    def _result(func: ast.AggFunc, t: str) -> Code:
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
        ca, ra = self.rows[node.anchor]
        cw = use.channel
        t = gen.fresh("g")
        rw = gen.fresh("w")
        lo = f"_lb_ts(I{cw}, I{ca}[{ra}, 1] - {use.within})"
        hi = f"_lb_ts(I{cw}, I{ca}[{ra}, 1])" if gen.by_ts else f"_lb_seq(I{cw}, I{ca}[{ra}, 0])"
        guard = None
        if node.filter is not None:
            inner = ChannelLeaves(gen, self.rows, self.kleene, subject=(cw, rw))
            guard = gen.expressions(inner).condition(node.filter)
            self.pre.extend(inner.pre)
        kind = gen.kind(node.attr) if node.attr else None
        value = gen.column(cw, rw, node.attr) if node.attr else "0"
        self.pre.extend(self._fold(node.func, t, rw, f"range({lo}, {hi})", value, kind, guard))
        return self._result(node.func, t)
