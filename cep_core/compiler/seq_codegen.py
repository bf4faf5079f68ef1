"""What the SEQ code generators (CDP in `seq_cdp`, AIP in `seq_aip`) share about events
(the counter and pending-record slots their kernels agree on are in
`cep_core.kernels.seq_layout`): where an attribute lives in a channel row (`Layout`), names
of generated locals, how the per-channel event columns are read, and how an arriving event
is admitted and stored. What they do with a completed match is in `seq_codegen_matches`;
expression leaves over channel rows in `seq_codegen_leaves`.

Channels. Per partition and per channel (an event type that a step, a negation or a window
aggregate reads, or ANY) the kernels keep the events of that type in seq order, as two
row-major tables, int64 (`seq`, `ts`, then every int/timestamp/string/bool attribute;
strings as dictionary codes) and float64 (every float attribute). Each table is an element
of a numba typed List indexed by partition id; `cnt[p, c]` rows are valid. A table that
fills up first evicts the rows older than the query's horizon (`evicted[p, c]` counts them,
so absolute row numbers stay meaningful), then doubles.
"""

from __future__ import annotations

from dataclasses import dataclass

from cep_core.ast import ANY_TYPE
from cep_core.compiler.expressions import Code, ExpressionCompiler, Leaves, StringConstants
from cep_core.compiler.seq_plan import SeqPlan, VarKind
from cep_core.kernels.seq_layout import Row
from cep_core.schema import AttrType, StreamSchema


# seq_runtime functions every SEQ kernel module imports as `_name`
SEQ_RUNTIME_HELPERS = ("grow_1d", "grow_el", "grow_out", "grow_rows", "lb_seq", "lb_ts",
                       "ub_seq", "ub_ts")


def indent(lines: list[str], n: int = 1) -> list[str]:
    return ["    " * n + line for line in lines]


def emit_store_lines(j: int, kind: str | None, code: Code, row: str) -> list[str]:
    """Kernel lines storing EMIT item j (compiled `code` of type `kind`) of match `row`
    into the output arrays: `ovi` (ints, string codes, bools as 0/1) or `ovf`, and its
    NULL flag in `ovn`."""
    target = "ovf" if kind == AttrType.FLOAT else "ovi"
    value = code.value
    if kind == AttrType.BOOL:
        value = f"(1 if {value} else 0)"
    elif kind == AttrType.FLOAT:
        value = f"np.float64({value})"
    store = [f"ovn[{row}, {j}] = 0", f"{target}[{row}, {j}] = {value}"]
    if code.nullable:
        return [f"if {code.null}:", f"    ovn[{row}, {j}] = 1", "else:"] + indent(store)
    return store


def import_block(module: str, names: dict[str, str]) -> str:
    """`from module import (...)` of generated source, one name a line, each under its
    local name (`names`: name -> local name)."""
    lines = [f"from {module} import ("]
    lines += [f"    {name}," if local == name else f"    {name} as {local},"
              for name, local in names.items()]
    return "\n".join(lines + [")"]) + "\n"


def seq_runtime_import(append_row: str) -> str:
    """The kernel module's import of seq_runtime (`append_row` under the given name)."""
    names = {"append_row": append_row}
    names.update({name: f"_{name}" for name in SEQ_RUNTIME_HELPERS})
    return import_block("cep_core.kernels.seq_runtime", names)


@dataclass(frozen=True)
class Layout:
    """Where each attribute lives in a channel row: (Row.INT, col) or (Row.FLOAT, col)."""

    slots: dict[str, tuple[Row, int]]
    n_int: int
    n_float: int  # at least 1 (numba wants a non-empty second axis)
    float_names: tuple[str, ...]
    int_names: tuple[str, ...]  # attributes in int columns 2.. (0: seq, 1: ts)

    @classmethod
    def of(cls, schema: StreamSchema) -> Layout:
        slots: dict[str, tuple[Row, int]] = {}
        ints: list[str] = []
        floats: list[str] = []
        for name, kind in schema.attributes.items():
            if kind == AttrType.FLOAT:
                slots[name] = (Row.FLOAT, len(floats))
                floats.append(name)
            else:
                slots[name] = (Row.INT, 2 + len(ints))
                ints.append(name)
        return cls(slots, 2 + len(ints), max(len(floats), 1), tuple(floats), tuple(ints))


class ChannelCodeGenerator:
    """The plan's channels, variables and string constants as a generator reads them.
    `append_row`: the name the generated module imports seq_runtime.append_row under."""

    append_row = "append_row"

    def __init__(self, plan: SeqPlan):
        self.plan = plan
        self.schema = plan.schema
        self.layout = Layout.of(plan.schema)
        self.constants = StringConstants()
        self.type_consts: dict[str, int] = {}
        if plan.schema.type_attribute is not None:
            for name in plan.channels:
                if name != ANY_TYPE:
                    self.type_consts[name] = self.constants.index(name)
        self._counter = 0
        self.W = plan.window
        self.by_ts = plan.by_ts
        self.n_items = len(plan.items)
        self.positive = plan.positive
        self.singles = [v for v in self.positive if v.kind == VarKind.SINGLE]
        self.kleene = [v for v in self.positive if v.kind == VarKind.KLEENE]
        self.channels = list(range(len(plan.channels)))

    def expressions(self, leaves: Leaves) -> ExpressionCompiler:
        """An expression compiler over `leaves` with this query's string constants and types."""
        return ExpressionCompiler(leaves, self.constants, self.plan.checked.types)

    def fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def kind(self, name: str) -> str:
        kind = self.schema.attributes[name]
        return AttrType.INT if kind == AttrType.TIMESTAMP else kind

    def column(self, channel: int, row: str, name: str) -> str:
        where, col = self.layout.slots[name]
        if where == Row.FLOAT:
            return f"F{channel}[{row}, {col}]"
        if self.schema.attributes[name] == AttrType.BOOL:
            return f"(I{channel}[{row}, {col}] != 0)"
        return f"I{channel}[{row}, {col}]"

    def channel_params(self) -> str:
        return ", ".join(f"I{c}, F{c}" for c in self.channels)

    def arena_params(self) -> str:
        return ", ".join(f"AI{c}, AF{c}" for c in self.channels)

    def fetch_lines(self) -> list[str]:
        return [line for c in self.channels for line in (
            f"I{c} = AI{c}[base[p, {c}]:base[p, {c}] + cnt[p, {c}]]",
            f"F{c} = AF{c}[base[p, {c}]:base[p, {c}] + cnt[p, {c}]]")]

    def arrival_lines(self, *after_partition: str) -> list[str]:
        """Event t of the batch: its partition (then `after_partition`), seq and time; a
        time going backwards in its partition makes it a dead letter."""
        return ["p = pid[t]", *after_partition, "eseq = EI[t, 0]", "ets = EI[t, 1]",
                "if ets < last_ts[p]:",
                "    dead[n_dead] = t",
                "    n_dead += 1",
                "    continue",
                "last_ts[p] = ets",
                "now = max(ets, punct)"]

    def append_lines(self) -> list[str]:
        """Store event t in every channel it belongs to (`ein{c}`), evicting rows older
        than the query's horizon."""
        plan = self.plan
        lines: list[str] = []
        type_attr = self.schema.type_attribute
        if type_attr is not None and self.type_consts:
            lines.append(f"tc = EI[t, {self.layout.slots[type_attr][1]}]")
        if plan.horizon is not None:
            lines.append(f"thr = min(ets, pfirst[p]) - {plan.horizon}")
            evict, horizon = "np.int64(1)", f"np.int64({plan.horizon})"
        else:
            lines.append("thr = ets")
            evict, horizon = "np.int64(0)", "np.int64(0)"
        for c, name in enumerate(plan.channels):
            if name == ANY_TYPE:
                lines.append(f"ein{c} = True")
            else:
                lines.append(f"ein{c} = tc == sc[{self.type_consts[name]}]")
            lines += [f"if ein{c}:",
                      f"    AI{c}, AF{c} = {self.append_row}(AI{c}, AF{c}, base, size, cnt, "
                      f"evicted, top, p, np.int64({c}), EI, EF, t, thr, {evict}, last_ts, "
                      f"pfirst, {horizon})"]
        return lines
