"""The CUDA kernel of batched MATCH: one thread per partition key advances that key's
automaton state over the key's events of a batch.

The automaton and the state layout are the CPU compiler's (`cep_core.compiler.match`): the
Glushkov automaton (`glushkov`: states are bits of an int64, `ftab` follows a set of them),
the candidate `Table` (one row per partial match: state mask, start seq, incremental
aggregates, deduplicated by (state, start)), the per-key `Table` (time of the last accepted
event, candidate count, the values `Last()` reads) and the `EmitSpec`s. Predicates and EMIT
items are compiled from the checked AST by the same generator (`_Generator`, `_Leaves`,
`ExpressionCompiler`), so the per-event step below is the CPU kernel's, less its slot
allocator: a key's candidates live at rows `key * (cap + 1) + j` of the device arrays, and
row `cap` is the key's scratch row (a match of one event).

The host groups a batch's rows by key (`boff`: the rows of group g are `boff[g] ..
boff[g+1]`, in seq order) and launches `advance` with one thread per group. A thread stops
before an event when its key would need more than `cap` candidates (possible only when
predicates read aggregates), records where (`resume[g]`) and raises `ctr[2]`; the host
widens `cap` and launches again. Matches and rejected events take an atomically incremented
index (`ctr[0]`, `ctr[1]`) in arrays as long as the batch (an event ends at most one
match), and the host puts them back in stream order.

Not supported here (the query stays on the CPU engine, see `unsupported_reason`):
`Collect()` in EMIT (a per-key log of values) and patterns of more than 63 positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cep_core import ast
from cep_core.checked import CheckedQuery, ExprType
from cep_core.compiler import match as cpu
from cep_core.compiler.expressions import STRING_TABLE_PARAMS, StringConstants
from cep_core.compiler.modules import load_module
from cep_core.kernels.match_runtime import dtype_of

A = ast.AggFunc
# ctr: matches written, events rejected, "some key needs more candidate rows".
OUT_N, DEAD_N, NEED_ROWS = range(3)


def unsupported_reason(checked: CheckedQuery) -> str | None:
    """Why the GPU MATCH kernel cannot run this query (None: it can)."""
    body = checked.query.body
    if not isinstance(body, ast.MatchQuery):
        return f"query {checked.name} is not a MATCH query"
    for item in body.emit:
        if isinstance(item.expr, ast.Aggregate) and item.expr.func is A.COLLECT:
            return "Collect() in EMIT (a per-key log of values) is evaluated on the CPU"
    try:
        cpu.glushkov(body.pattern)
    except cpu.MatchCompileError as e:
        return str(e)
    return None


@dataclass
class MatchKernelPlan:
    """What the engine needs to launch the kernel and decode its output."""

    kernel: Any  # a numba CUDA kernel: `kernel[blocks, threads](*args)`
    automaton: cpu.Automaton
    ftab: np.ndarray
    constants: StringConstants
    uses_tables: bool
    aggregate_mode: bool
    columns: list[tuple[str, str]]  # (attribute, dtype) of col0, col1, ...
    records: cpu.Table
    keys: cpu.Table
    emit: list[cpu.EmitSpec]
    array_args: list[str]
    collect: bool = False  # never: Collect() stays on the CPU
    source: str = field(repr=False, default="")


def _indent(lines: list[str], depth: int = 1) -> list[str]:
    return ["    " * depth + line for line in lines]


def generate(checked: CheckedQuery) -> tuple[str, dict]:
    """The kernel module's source and the plan objects it was generated from."""
    reason = unsupported_reason(checked)
    if reason is not None:
        raise cpu.MatchCompileError(reason)
    body = checked.query.body
    assert isinstance(body, ast.MatchQuery)  # unsupported_reason refused the rest
    auto = cpu.glushkov(body.pattern)
    gen = cpu._Generator(checked)
    defines = {d.name: d.condition for d in body.defines}
    static: list[tuple[int, str]] = []  # aggregate-free predicates: once per event
    dynamic: list[tuple[int, str]] = []  # predicates reading aggregates: per candidate
    for label, name in enumerate(auto.names):
        condition = defines[name]
        reads = condition.find(ast.Aggregate) is not None
        code = gen.compiler(cpu._Leaves(gen, "ci", emit=False)).condition(condition)
        (dynamic if reads else static).append((auto.mask_of(label), code))
    emit_specs: list[cpu.EmitSpec] = []
    emit_lines: list[str] = []
    for j, item in enumerate(body.emit):
        value = gen.compiler(cpu._Leaves(gen, "wi", emit=True)).compile(item.expr)
        emit_specs.append(cpu.EmitSpec(item.name, checked.types[item.expr] or ExprType.INT,
                                       nullable=value.nullable))
        emit_lines.append(f"e{j}[U(no)] = {value.value}")
        if value.nullable:
            emit_lines.append(f"e{j}n[U(no)] = {value.null}")
    args = _array_args(gen, emit_specs)
    source = _kernel_source(gen, auto, static, dynamic, emit_lines, args)
    return source, {"automaton": auto, "generator": gen, "emit": emit_specs,
                    "aggregate_mode": bool(dynamic), "array_args": args}


def compile_kernel(checked: CheckedQuery) -> MatchKernelPlan:
    source, parts = generate(checked)
    module = load_module(source)
    gen = parts["generator"]
    auto = parts["automaton"]
    uses_tables = any(f"{t}[" in source for t in STRING_TABLE_PARAMS.split(", "))
    return MatchKernelPlan(
        kernel=module.advance, automaton=auto, ftab=auto.follow_table().reshape(-1),
        constants=gen.constants, uses_tables=uses_tables,
        aggregate_mode=parts["aggregate_mode"],
        columns=[(a, dtype_of(gen.kind(a))) for a in gen.columns], records=gen.records,
        keys=gen.keys, emit=parts["emit"], array_args=parts["array_args"], source=source)


def _array_args(gen: cpu._Generator, emit: list[cpu.EmitSpec]) -> list[str]:
    args = ["bkey", "boff", "resume", "seq", "ts"]
    args += [f"col{i}" for i in range(len(gen.columns))]
    args += ["sc", *STRING_TABLE_PARAMS.split(", "), "ftab", "ctr"]
    args += [name for name, _, _ in gen.keys.arrays()]
    args += [name for name, _, _ in gen.records.arrays()]
    args += ["dead", "out_key", "out_start", "out_end", "out_row"]
    for j, spec in enumerate(emit):
        args.append(f"e{j}")
        if spec.nullable:
            args.append(f"e{j}n")
    return args


def _kernel_source(gen: cpu._Generator, auto: cpu.Automaton, static: list[tuple[int, str]],
                   dynamic: list[tuple[int, str]], emit_lines: list[str],
                   args: list[str]) -> str:
    """The CUDA kernel: one thread a partition. Its candidate loop mirrors the CPU kernel's
    (`cep_core.compiler.match._kernel_source`) on purpose, in CUDA's terms (atomics, the
    dead-letter counter, one thread's rows): a change to one wants the same in the other."""
    keys, records = gen.keys, gen.records
    n_ref, last_ts = keys.ref(("n",), "k"), keys.ref(("last_ts",), "k")
    step: list[str] = []
    add = step.append
    add("t = ts[U(i)]")
    add(f"if t < {last_ts}:")
    add(f"    d = cuda.atomic.add(ctr, {DEAD_N}, 1)")
    add("    dead[U(d)] = i")
    add("    i += 1")
    add("    continue")
    add(f"nc = {n_ref}")
    add("if nc >= cap:")
    add(f"    ctr[{NEED_ROWS}] = 1")
    add("    break")
    add(f"{last_ts} = t")
    for idx in range(len(gen.columns)):
        add(f"a{idx} = col{idx}[U(i)]")
    add(f"S = {cpu._mask_expr(str(auto.mask_of(-1)), static, None)}")
    add("win = -1")
    add("w = 0")
    if not dynamic:
        add("covered = 0")
    for number, attr in enumerate(gen.last_attrs):
        add(f"l{number} = {keys.read(('last', attr), 'k')}")
    # Deliberately like cep_core/compiler/match.py's kernel loop: the GPU kernel's generator
    # follows the CPU one line by line, and the core never imports accel
    add("for j in range(nc):")
    loop = ["ci = base + j", "cw = base + w", f"m = {records.ref(('mask',), 'ci')}",
            f"f = {cpu._follow_code(auto, 'm')}"]
    if dynamic:
        guard = "f" if len(dynamic) > 3 else None
        loop.append(f"m2 = f & ({cpu._mask_expr('S', dynamic, guard)})")
    else:
        loop += ["m2 = f & S & ~covered", "covered |= m2"]
    loop += gen.move_record("ci", "cw", "m2")
    loop += [f"if m2 & {auto.last}:", "    win = cw", "    break", "w += m2 != 0"]
    step += _indent(loop)
    add("if win < 0:")
    new = [f"m0 = {auto.first} & S" + ("" if dynamic else " & ~covered"), "if m0 != 0:"]
    place = [f"if m0 & {auto.last}:", "    ci = scratch", "    win = ci", "else:",
             "    ci = base + w", "    w += 1"]
    place += gen.init_record("ci", "m0")
    step += _indent(new + _indent(place))
    add("if win >= 0:")
    out = ["wi = win", f"no = cuda.atomic.add(ctr, {OUT_N}, 1)", "out_key[U(no)] = k",
           f"out_start[U(no)] = {records.ref(('start',), 'wi')}",
           "out_end[U(no)] = seq[U(i)]", "out_row[U(no)] = i"]
    step += _indent(out + emit_lines + ["w = 0"])
    add(f"{n_ref} = w")
    for attr in gen.last_attrs:
        add(f"{keys.ref(('last', attr), 'k')} = {gen.value(attr)}")
    add("i += 1")

    head = ["g = cuda.grid(1)", "if g >= G:", "    return"]
    head += records.widths() + keys.widths()
    head += [f"sc{index} = sc[{index}]" for index in range(len(gen.constants.values))]
    head += ["k = bkey[U(g)]", "base = k * (cap + 1)", "scratch = base + cap",
             "i = resume[U(g)]", "end = boff[U(g + 1)]", "while i < end:"]
    # `U(...)` wraps the state tables' indexes (`Table.ref`): the identity here.
    lines = ["from numba import cuda", "", "", "@cuda.jit(device=True)", "def U(index):",
             "    return index", "", "",
             "@cuda.jit", f"def advance(G, cap, {', '.join(args)}):"]
    lines += _indent(head + _indent(step) + ["resume[U(g)] = i"])
    return "\n".join(lines) + "\n"
