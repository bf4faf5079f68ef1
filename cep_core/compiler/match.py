"""MATCH queries -> one generated numba kernel per query.

The pattern becomes an epsilon-free Glushkov automaton (`cep_core.regex_analysis`): one state
per position (an occurrence of a predicate or of `.`) plus a start state, one predicate per
transition (the predicate of the target position). States are bits of an int64 (at most 63
positions), so a set of states is one integer and following every state of a set is one
table lookup per byte of the set (`ftab`).

What the kernel keeps per partition key (see `cep_core.engine.match` for the memory side):
a list of *candidates*, ordered by start, each a partial match that began at one event: a
row with its set of automaton states, its start seq and its incremental aggregates (count,
first, max, min, sum of an attribute: whatever the predicates and EMIT read). Candidates
with the same start have taken the same events (matching is partition-contiguous), so one
row per start is exact: the deduplication by (state, start), the states of one start
being a bit set. No event is stored; `Last(a)` is the key's previous event's value.

- Aggregate-free predicates (bit-parallel): every state is kept only by the candidate with
  the earliest start that has it (a later candidate in the same state has the same future
  and can never win), so the masks of a key's candidates are disjoint: their union is the
  key's state bit-vector and the owner of a bit is the earliest start of that state (with
  its aggregates, for EMIT). At most as many candidates as positions.
- Predicates that read aggregates are evaluated per candidate, on its aggregates before
  the current event.

Per event: reject it if its time goes backwards in its key; evaluate the aggregate-free
predicates once; move every candidate (follow, then the predicates; survivors are
compacted in place, in order); the first candidate (earliest start) that reaches an
accepting position wins, else a new candidate starts at this event; a winner is written to
the output arrays (EMIT evaluated in the kernel) and every candidate of the key is dropped.

Speed: state matrices are passed flattened with row widths known to the code, indexes are
unsigned (no negative-index wraparound code), conditions become masks without branches,
and the state of the keys a few events ahead is prefetched (many keys do not fit in cache).

Code is generated from the checked AST only: identifiers are made up here, numbers come
from `repr` of parsed values, strings are codes (`ExpressionCompiler`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from cep_core import ast
from cep_core import regex_analysis as ra
from cep_core.checked import CheckedQuery, ExprType
from cep_core.compiler.expressions import (
    STRING_TABLE_PARAMS,
    Code,
    ExpressionCompiler,
    StringConstants,
)
from cep_core.compiler.modules import load_module
from cep_core.compiler.programs import once_per_query
from cep_core.kernels.match_runtime import (
    COUNT,
    CTR,
    DONE,
    FULL_CANDIDATES,
    FULL_COLLECT,
    FULL_LOG,
    FULL_OUTPUT,
    FULL_SLOTS,
    HEAD,
    PREFETCH,
)
from cep_core.kernels.match_runtime import dtype_of as _dtype
from cep_core.schema import AttrType

MAX_POSITIONS = 63
A = ast.AggFunc
Key = tuple[str, ...]  # what a state column holds: ("cnt",), (AggFunc.FIRST, attr), ...

class MatchCompileError(ValueError):
    """The query cannot be compiled to a kernel (too many positions)."""


# ---------------------------------------------------------------- the automaton


@dataclass
class Automaton:
    """Glushkov automaton: bit i is position i; `labels[i]` is the index of its predicate
    in `names` (-1 for `.`)."""

    names: list[str]
    labels: list[int]
    first: int
    last: int
    follow: list[int]

    @property
    def size(self) -> int:
        return len(self.labels)

    def mask_of(self, label: int) -> int:
        return sum(1 << i for i, lab in enumerate(self.labels) if lab == label)

    def follow_table(self) -> np.ndarray:
        """`ftab[b, v]`: union of the follow sets of the positions 8b..8b+7 set in v."""
        nbytes = max(1, (self.size + 7) // 8)
        table = np.zeros((nbytes, 256), dtype=np.int64)
        for b in range(nbytes):
            for v in range(256):
                union = 0
                for bit in range(8):
                    p = 8 * b + bit
                    if v >> bit & 1 and p < self.size:
                        union |= self.follow[p]
                table[b, v] = union
        return table


def glushkov(pattern: ast.Regex) -> Automaton:
    positions = ra.positions(pattern)
    if len(positions) > MAX_POSITIONS:
        raise MatchCompileError(
            f"the pattern has {len(positions)} positions (predicate or '.' occurrences); "
            f"the compiled engine handles at most {MAX_POSITIONS}")
    index = {id(p): i for i, p in enumerate(positions)}
    names: list[str] = []
    labels = []
    for p in positions:
        if isinstance(p, ast.RSym):
            if p.name not in names:
                names.append(p.name)
            labels.append(names.index(p.name))
        else:
            labels.append(-1)

    def mask(nodes: Iterable[ra.Position]) -> int:
        return sum(1 << index[id(n)] for n in nodes)

    follow_of = ra.follow(pattern)
    return Automaton(names, labels, mask(ra.first(pattern)), mask(ra.last(pattern)),
                     [mask(follow_of[id(p)]) for p in positions])


# ---------------------------------------------------------------- what the kernel keeps


class Table:
    """The columns of a state matrix pair: `<name>_i` (int64: ints, timestamps, string codes
    and bools) and `<name>_f` (float64), one row per record. Keys name what a column holds:
    ("mask",), ("cnt",), ("first", attr), ("last", attr), ..."""

    def __init__(self, name: str, fixed: list[Key]):
        self.name = name
        self.ints: dict[Key, int] = {key: i for i, key in enumerate(fixed)}
        self.floats: dict[Key, int] = {}
        self.kinds: dict[Key, AttrType] = {key: AttrType.INT for key in fixed}
        self.origin = {"i": "", "f": ""}  # code added to every index (rows inside other rows)

    def add(self, key: Key, kind: AttrType) -> None:
        if key in self.kinds:
            return
        self.kinds[key] = kind
        columns = self.floats if kind is AttrType.FLOAT else self.ints
        columns[key] = len(columns)

    def ref(self, key: Key, row: str) -> str:
        """Code reading (or assigning) a column of a row, in storage form. Kernels see the
        matrices flattened, rows `W<name>i` (`W<name>f`) wide (constants set on entry),
        indexed as unsigned (no negative-index wraparound code)."""
        if key in self.floats:
            return (f"{self.name}_f[U({self.origin['f']}({row}) * W{self.name}f + "
                    f"{self.floats[key]})]")
        return f"{self.name}_i[U({self.origin['i']}({row}) * W{self.name}i + {self.ints[key]})]"

    def widths(self) -> list[str]:
        """Kernel lines that set the row widths."""
        return [f"W{self.name}i = {_padded(len(self.ints))}",
                f"W{self.name}f = {_padded(len(self.floats))}"]

    def read(self, key: Key, row: str) -> str:
        """Code reading a column as a value of its kind (bools are stored as 0/1)."""
        code = self.ref(key, row)
        return f"({code} != 0)" if self.kinds[key] is AttrType.BOOL else code

    def arrays(self) -> list[tuple[str, int, str]]:
        """(array, columns, dtype) of the matrices in use (ints always)."""
        out = [(f"{self.name}_i", _padded(len(self.ints)), "int64")]
        if self.floats:
            out.append((f"{self.name}_f", _padded(len(self.floats)), "float64"))
        return out


def _padded(width: int) -> int:
    """Rows of 1, 2, 4 or a multiple of 8 values, so that (in 64-byte aligned arrays) a
    row of up to 8 never straddles two cache lines."""
    if width <= 2:
        return width
    return 4 if width <= 4 else -(-width // 8) * 8


@dataclass
class EmitSpec:
    name: str
    kind: ExprType  # LIST: Collect's
    nullable: bool = False
    element: ExprType | None = None  # Collect: the attribute's type


@dataclass(frozen=True, eq=False)
class Program:
    """A compiled MATCH query: the kernel and the layout of the arrays it works on. Built
    once per checked query (`compile_match`) and shared by every engine that runs it; the
    engines (`cep_core.engine.match.MatchEngine`) hold the state."""

    checked: CheckedQuery
    kernel: object
    automaton: Automaton
    ftab: np.ndarray
    constants: StringConstants
    uses_tables: bool
    aggregate_mode: bool
    columns: list[tuple[str, str]]  # (attribute, dtype) of col0, col1, ...
    records: Table  # candidates: row slot * cap + j (and one scratch row at the end)
    keys: Table  # per key id: slot, last event time, candidate count, Last() values
    slots: Table  # per slot: its key id, its Collect log head
    log_fields: list[tuple[str, str]]  # Collect: (array, dtype) per logged attribute
    emit: list[EmitSpec]
    array_args: list[str]  # the kernel's array parameters, after SCALAR_ARGS
    collect: bool
    per_key: bool = False  # candidates live in their key's row (no slots), see _kernel_source
    source: str = field(repr=False, default="")

    def key_arrays(self, cap: int) -> list[tuple[str, int, str]]:
        """(array, columns, dtype) of the per-key matrices for `cap` candidates a key."""
        if not self.per_key:
            return self.keys.arrays()
        keys, records = self.keys, self.records
        out = [("key_i", _padded(len(keys.ints) + cap * _padded(len(records.ints))), "int64")]
        if keys.floats:
            out.append(("key_f", _padded(len(keys.floats) +
                                         cap * _padded(len(records.floats))), "float64"))
        return out


SCALAR_ARGS = ("i0", "n", "cap", "nslots", "out_cap", "log_cap", "coll_cap")


class _Compiler(ExpressionCompiler):
    """String literals read kernel locals (`sc0`, `sc1`, ...) loaded once per call."""

    def visit_Literal(self, node: ast.Literal) -> Code:
        if isinstance(node.value, str):
            return Code(f"sc{self.constants.index(node.value)}")
        return super().visit_Literal(node)


class _Leaves:
    """Attributes and aggregates of a MATCH expression as kernel code.

    `row` is the variable holding the candidate's row; in a predicate aggregates are over
    the events before the current one, in EMIT over the whole match (the row has been
    updated with the current event by then)."""

    def __init__(self, gen: _Generator, row: str, emit: bool):
        self.gen = gen
        self.row = row
        self.emit = emit

    def attr(self, node: ast.Attr) -> Code:
        return Code(self.gen.value(node.name))

    def aggregate(self, node: ast.Aggregate) -> Code:
        gen, r = self.gen, self.row
        records = gen.records
        func = node.func
        if func is A.COUNT:
            gen.need_count()
            return Code(records.read(COUNT, r))
        assert node.arg is not None  # (only Count() has none)
        name = node.arg.name
        if func is A.DELTA:
            return Code(f"(t - {records.read(gen.field(A.FIRST, name), r)})")
        if func is A.LAST:
            if self.emit:
                return Code(gen.value(name))
            return Code(gen.last_local(name))
        if func is A.AVG:
            gen.need_count()
            total = records.read(gen.field(A.SUM, name), r)
            return Code(f"({total} / {records.read(COUNT, r)})")
        if func is A.COLLECT:
            raise MatchCompileError("Collect() may only be a whole EMIT item")
        return Code(records.read(gen.field(func, name), r))

    def window_aggregate(self, node: ast.WindowAggregate) -> Code:
        raise MatchCompileError("window aggregates do not exist in MATCH")


class _Generator:
    def __init__(self, checked: CheckedQuery):
        self.checked = checked
        self.schema = checked.schema
        self.time = checked.schema.time
        self.columns: list[str] = []  # attribute names read from the batch
        self.records = Table("rec", [("mask",), ("start",)])
        self.keys = Table("key", [("slot",), ("last_ts",), ("n",)])
        self.slots = Table("slot", [("key",)])
        self.last_attrs: list[str] = []  # Last(a) in predicates: locals l0, l1, ...
        self.constants = StringConstants()

    def compiler(self, leaves: _Leaves) -> _Compiler:
        return _Compiler(leaves, self.constants, self.checked.types)

    def kind(self, attr: str) -> AttrType:
        kind = self.schema.attributes[attr]
        return AttrType.INT if kind is AttrType.TIMESTAMP else kind

    def value(self, attr: str) -> str:
        """The current event's value of an attribute (the time attribute is `ts`)."""
        if attr == self.time:
            return "t"
        if attr not in self.columns:
            self.columns.append(attr)
        return f"a{self.columns.index(attr)}"

    def field(self, agg: ast.AggFunc, attr: str) -> Key:
        self.value(attr)
        key = (agg, attr)
        self.records.add(key, self.kind(attr))
        return key

    def last_local(self, attr: str) -> str:
        self.value(attr)
        if attr not in self.last_attrs:
            self.last_attrs.append(attr)
            self.keys.add((A.LAST, attr), self.kind(attr))
        return f"l{self.last_attrs.index(attr)}"

    def need_count(self) -> None:
        self.records.add(COUNT, AttrType.INT)

    # ------------------------------------------------------------ record code

    def record_keys(self) -> list[Key]:
        return [key for key in self.records.kinds if key != ("mask",)]

    def init_record(self, r: str, mask: str) -> list[str]:
        rec = self.records
        lines = [f"{rec.ref(('mask',), r)} = {mask}", f"{rec.ref(('start',), r)} = seq[U(i)]"]
        for key in self.record_keys()[1:]:
            value = "1" if key == COUNT else self.value(key[1])
            lines.append(f"{rec.ref(key, r)} = {value}")
        return lines

    def move_record(self, src: str, dst: str, mask: str) -> list[str]:
        """Row dst := row src with the current event added, mask `mask`: read every
        column into a local first (dst may be src)."""
        rec = self.records
        lines = []
        for number, key in enumerate(self.record_keys()):
            u = f"u{number}"
            old = rec.ref(key, src)
            agg = key[0]  # an AggFunc where `field` added the column
            if key == COUNT:
                lines.append(f"{u} = {old} + 1")
            elif agg is A.MAX or agg is A.MIN:
                v = self.value(key[1])
                if self.kind(key[1]) == AttrType.STRING:
                    op = ">" if agg is A.MAX else "<"
                    lines.append(f"{u} = {old}")
                    lines.append(f"{u} = {v} if s_rank[{v}] {op} s_rank[{u}] else {u}")
                else:
                    pick = "max" if agg is A.MAX else "min"
                    lines.append(f"{u} = {pick}({old}, {v})")
            elif agg is A.SUM:
                lines.append(f"{u} = {old} + {self.value(key[1])}")
            else:  # start, first
                lines.append(f"{u} = {old}")
        lines.append(f"{rec.ref(('mask',), dst)} = {mask}")
        for number, key in enumerate(self.record_keys()):
            lines.append(f"{rec.ref(key, dst)} = u{number}")
        return lines


def _indent(lines: list[str], depth: int) -> list[str]:
    return ["    " * depth + line for line in lines]


@once_per_query
def compile_match(checked: CheckedQuery) -> Program:
    """The program of a checked MATCH query (generated and loaded once, then shared)."""
    body = checked.query.body
    if not isinstance(body, ast.MatchQuery):
        raise TypeError(f"query {checked.name} is not a MATCH query")
    auto = glushkov(body.pattern)
    gen = _Generator(checked)
    defines = {d.name: d.condition for d in body.defines}

    # Predicates: those the same for every candidate once per event, the others per
    # candidate. `Last(a)` is the key's previous event (matching is partition-contiguous),
    # so a predicate that reads no other aggregate is the same for every candidate.
    static: list[tuple[int, str]] = []  # (mask of the positions it labels, condition code)
    dynamic: list[tuple[int, str]] = []
    for label, name in enumerate(auto.names):
        condition = defines[name]
        reads = any(n.func is not A.LAST for n in condition.find_all(ast.Aggregate))
        test = gen.compiler(_Leaves(gen, "ci", emit=False)).condition(condition)
        (dynamic if reads else static).append((auto.mask_of(label), test))

    per_key = not dynamic and not any(
        isinstance(item.expr, ast.Aggregate) and item.expr.func is A.COLLECT
        for item in body.emit)
    if per_key:
        gen.records.origin = {"i": "kb + ", "f": "kbf + "}

    # EMIT items over the winning row `wi`.
    emit_specs: list[EmitSpec] = []
    emit_lines: list[str] = []
    collected: list[str] = []  # attributes logged for Collect
    for j, item in enumerate(body.emit):
        expr = item.expr
        if isinstance(expr, ast.Aggregate) and expr.func is A.COLLECT:
            attr = _collected(expr)
            if attr not in collected:
                collected.append(attr)
            gen.value(attr)
            gen.need_count()
            emit_specs.append(EmitSpec(item.name, ExprType.LIST,
                                        element=ExprType(gen.kind(attr))))
            continue
        code = gen.compiler(_Leaves(gen, "wi", emit=True)).compile(expr)
        kind = ExprType(gen.checked.types[expr] or ExprType.INT)
        emit_specs.append(EmitSpec(item.name, kind, nullable=code.nullable))
        emit_lines.append(f"e{j}[U(no)] = {code.value}")
        if code.nullable:
            emit_lines.append(f"e{j}n[U(no)] = {code.null}")
    if collected:
        gen.slots.add(HEAD, AttrType.INT)

    if per_key and gen.records.floats and not gen.keys.floats:
        gen.keys.add(("spare",), AttrType.FLOAT)  # key_f holds the candidates' floats
    source = _kernel_source(gen, auto, static, dynamic, emit_specs, emit_lines, collected,
                            per_key)
    module = load_module(source)
    uses_tables = any(f"{t}[" in source for t in STRING_TABLE_PARAMS.split(", "))
    return Program(
        checked=checked, kernel=module.kernel, automaton=auto, ftab=auto.follow_table(),
        constants=gen.constants, uses_tables=uses_tables, aggregate_mode=bool(dynamic),
        columns=[(a, _dtype(gen.kind(a))) for a in gen.columns], records=gen.records,
        keys=gen.keys, slots=gen.slots,
        log_fields=[(f"lv{i}", _dtype(gen.kind(a))) for i, a in enumerate(collected)],
        emit=emit_specs, array_args=_array_args(gen, emit_specs, collected),
        collect=bool(collected), per_key=per_key, source=source)


def _collected(expr: ast.Expr) -> str:
    """The attribute a `Collect(attr)` logs."""
    assert isinstance(expr, ast.Aggregate) and expr.arg is not None  # (the checker's rule)
    return expr.arg.name


def _array_args(gen: _Generator, emit: list[EmitSpec], collected: list[str]) -> list[str]:
    args = ["kid", "seq", "ts"] + [f"col{i}" for i in range(len(gen.columns))]
    args += ["sc", *STRING_TABLE_PARAMS.split(", "), "ftab", "ctr", "free"]
    args += [name for name, _, _ in gen.keys.arrays()]
    args += [name for name, _, _ in gen.slots.arrays()]
    args += [name for name, _, _ in gen.records.arrays()]
    args += ["out_key", "out_start", "out_end"]
    for j, spec in enumerate(emit):
        if spec.kind is not ExprType.LIST:
            args.append(f"e{j}")
            if spec.nullable:
                args.append(f"e{j}n")
    args.append("dead")
    if collected:
        args += ["log_prev"] + [f"lv{i}" for i in range(len(collected))]
        args += ["coll_off"] + [f"cv{j}" for j, s in enumerate(emit) if s.kind is ExprType.LIST]
    return args


def _follow_code(auto: Automaton, m: str) -> str:
    """The union of the follow sets of the positions in `m` (`ftab` flattened)."""
    nbytes = max(1, (auto.size + 7) // 8)
    if nbytes == 1:
        return f"ftab[U({m})]"
    return " | ".join(f"ftab[U({256 * b} + (({m} >> {8 * b}) & 255))]" if b
                      else f"ftab[U({m} & 255)]" for b in range(nbytes))


def _mask_expr(base: str, predicates: list[tuple[int, str]], guard: str | None) -> str:
    """`base | (mask if condition else 0) | ...`, optionally evaluating a condition only
    when `guard & mask` (a reachable position needs it)."""
    terms = [base]
    for mask, cond in predicates:
        if guard is not None:
            cond = f"(({guard} & {mask}) != 0 and {cond})"
        terms.append(f"({mask} if {cond} else 0)")
    return " | ".join(terms)


def _kernel_source(gen: _Generator, auto: Automaton, static: list[tuple[int, str]],
                   dynamic: list[tuple[int, str]], emit_specs: list[EmitSpec],
                   emit_lines: list[str], collected: list[str], per_key: bool = False) -> str:
    """The kernel. Slot 0 is reserved and always empty: a key without partial matches
    points to it, so the common paths need no test for "has a slot"; a slot is taken when
    a candidate has to be kept and given back (branch-free) when none is left.

    `per_key`: no slots; a key's `cap` candidates follow its fields in its own row
    (`kb`/`kbf`: where they start), so an event with one candidate touches one cache line.
    Aggregate-free queries only (their candidates are at most the positions); `cap` grows
    only when a new candidate could start. The GPU kernel (`cep_accel.gpu.match_kernels.
    _kernel_source`) mirrors its candidate loop on purpose: change both together."""
    collect = bool(collected)
    keys, slots, records = gen.keys, gen.slots, gen.records
    slot_ref, n_ref = keys.ref(("slot",), "k"), keys.ref(("n",), "k")
    last_ts = keys.ref(("last_ts",), "k")

    body: list[str] = []
    add = body.append
    # Many keys: fetch the state of the key 16 events ahead, and the candidates of the key
    # 8 events ahead (whose slot should be in cache by now).
    add(f"if i + {PREFETCH} < n:")
    add(f"    prefetch(key_i, U(kid[U(i + {PREFETCH})] * Wkeyi))")
    if not per_key:
        add(f"if i + {PREFETCH // 2} < n:")
        add(f"    prefetch(rec_i, U({keys.ref(('slot',), f'kid[U(i + {PREFETCH // 2})]')} * "
            "cap * Wreci))")
    add("k = kid[U(i)]")
    add("t = ts[U(i)]")
    add(f"if t < {last_ts}:")
    add("    dead[U(nd)] = i")
    add("    nd += 1")
    add("    i += 1")
    add("    continue")
    add(f"s = {slot_ref}")
    add(f"nc = {n_ref}")
    for idx in range(len(gen.columns)):
        add(f"a{idx} = col{idx}[U(i)]")
    for number, attr in enumerate(gen.last_attrs):
        add(f"l{number} = {keys.read(('last', attr), 'k')}")
    add(f"S = {_mask_expr(str(auto.mask_of(-1)), static, None)}")
    full = ["no >= out_cap", "nc >= cap", "(free_top == 0 and high >= nslots)"]
    if per_key:
        full = ["no >= out_cap", f"(nc >= cap and {auto.first} & S != 0)"]
    if collect:
        full += ["ln >= log_cap", f"cn + 1 + {records.ref(COUNT, 's * cap')} > coll_cap"]
    add(f"if {' or '.join(full)}:")
    add(f"    status = {FULL_OUTPUT} if no >= out_cap else {FULL_CANDIDATES} if nc >= cap "
        f"else {FULL_SLOTS}" + ("" if not collect else
                                f" if free_top == 0 and high >= nslots else {FULL_LOG} "
                                f"if ln >= log_cap else {FULL_COLLECT}"))
    add("    break")
    add(f"{last_ts} = t")
    add("clock = max(clock, t)")
    add("win = -1")
    add("w = 0")
    if per_key:
        add("base = 0")
        add(f"kb = k * Wkeyi + {len(keys.ints)}")
        if records.floats:
            add(f"kbf = k * Wkeyf + {len(keys.floats)}")
    else:
        add("base = s * cap")
    if not dynamic:
        add("covered = 0")
    # Deliberately like accel/gpu/match_kernels.py's kernel loop: the GPU kernel's generator
    # follows this one line by line (the core never imports accel)
    add("for j in range(nc):")
    loop = ["ci = base + j", "cw = base + w", f"m = {records.ref(('mask',), 'ci')}",
            f"f = {_follow_code(auto, 'm')}"]
    if dynamic:
        guard = "f" if len(dynamic) > 3 else None
        loop.append(f"m2 = f & ({_mask_expr('S', dynamic, guard)})")
    else:
        loop.append("m2 = f & S & ~covered")
        loop.append("covered |= m2")
    loop += gen.move_record("ci", "cw", "m2")
    loop += [f"if m2 & {auto.last}:", "    win = cw", "    break", "w += m2 != 0"]
    body += _indent(loop, 1)
    add("if win < 0:")
    new = [f"m0 = {auto.first} & S" + ("" if dynamic else " & ~covered"), "if m0 != 0:"]
    place = [f"if m0 & {auto.last}:", "    ci = scratch", "    win = ci", "else:",
             "    if s == 0:",
             "        if free_top > 0:",
             "            free_top -= 1",
             "            s = free[U(free_top)]",
             "        else:",
             "            s = high",
             "            high += 1",
             f"        {slots.ref(('key',), 's')} = k"]
    if collect:
        place.append(f"        {slots.ref(HEAD, 's')} = -1")
    place += ["        base = s * cap", "    ci = base + w", "    w += 1"]
    if per_key:  # an immediate winner is written where it would be kept (w < cap)
        place = ["ci = w", f"if m0 & {auto.last}:", "    win = ci", "else:", "    w += 1"]
    place += gen.init_record("ci", "m0")
    new += _indent(place, 1)
    body += _indent(new, 1)
    add("if win >= 0:")
    out = ["wi = win", "out_key[U(no)] = k", f"out_start[U(no)] = {records.ref(('start',), 'wi')}",
           "out_end[U(no)] = seq[U(i)]"]
    out += emit_lines
    if collect:
        out += [f"c = {records.ref(COUNT, 'wi')}", "coll_off[U(no)] = cn"]
        lists = [j for j, spec in enumerate(emit_specs) if spec.kind is ExprType.LIST]
        match = gen.checked.query.body
        assert isinstance(match, ast.MatchQuery)  # (compile_match's)
        attrs = {j: _collected(match.emit[j].expr) for j in lists}
        for j in lists:
            out.append(f"cv{j}[U(cn + c - 1)] = {gen.value(attrs[j])}")
        out += [f"e = {slots.ref(HEAD, 's')}", "q = cn + c - 2", "while q >= cn:"]
        for j in lists:
            out.append(f"    cv{j}[U(q)] = lv{collected.index(attrs[j])}[U(e)]")
        out += ["    e = log_prev[U(e)]", "    q -= 1", "cn += c"]
    out += ["no += 1", "w = 0"]
    body += _indent(out, 1)
    add(f"{n_ref} = w")
    if not per_key:  # keep the slot (w candidates) or give it back (none; never slot 0)
        add("free[U(free_top)] = s")
        add("free_top += (w == 0) & (s != 0)")
        add(f"{slot_ref} = s if w != 0 else 0")
    for attr in gen.last_attrs:
        add(f"{keys.ref(('last', attr), 'k')} = {gen.value(attr)}")
    if collect:
        add("if w != 0:")
        keep = []
        if collect:
            keep.append(f"log_prev[U(ln)] = {slots.ref(HEAD, 's')}")
            for number, attr in enumerate(collected):
                keep.append(f"lv{number}[U(ln)] = {gen.value(attr)}")
            keep += [f"{slots.ref(HEAD, 's')} = ln", "ln += 1"]
        body += _indent(keep, 1)
    add("i += 1")

    params = list(SCALAR_ARGS) + _array_args(gen, emit_specs, collected)
    lines = ["from cep_core.kernels.match_runtime import prefetch", "", "",
             "@njit(cache=True, error_model='numpy')",
             f"def kernel({', '.join(params)}):"]
    widths = records.widths() + keys.widths() + slots.widths()
    if per_key:  # key rows: fields, then `cap` candidates (`Program.key_arrays`)
        widths += [f"Wkeyi = {len(keys.ints)} + cap * Wreci", "rec_i = key_i"]
        if records.floats:
            widths += [f"Wkeyf = {len(keys.floats)} + cap * Wrecf", "rec_f = key_f"]
        widths += [f"{w} = {w} if {w} <= 2 else 4 if {w} <= 4 else ({w} + 7) // 8 * 8"
                   for w in ("Wkeyi", "Wkeyf") if w == "Wkeyi" or records.floats]
    lines += ["    U = np.uint64"] + _indent(widths, 1)
    lines += [f"    sc{index} = sc[{index}]" for index in range(len(gen.constants.values))]
    lines += [f"    {name} = ctr[{index}]" for index, name in enumerate(_CTR_LOCALS)]
    lines += ["    scratch = nslots * cap", f"    status = {DONE}", "    i = i0",
              "    while i < n:"]
    lines += _indent(body, 2)
    lines += [f"    ctr[{index}] = {name}" for index, name in enumerate(_CTR_LOCALS)]
    lines += ["    return status, i", ""]
    return "\n".join(lines)


_CTR_LOCALS = ("free_top", "high", "no", "nd", "clock", "ln", "cn")
assert len(_CTR_LOCALS) == len(CTR)
