"""The compiled FPGA plan of a MATCH query: what the circuit (emulator or HDL) is made of.

Built from the checked AST only (`compile_fpga`). The circuit of Woods, Teubner and Alonso
has four stages, and the plan describes each:

1. tuple layout (`TupleLayout`): fixed-width tuples (128 bits unless the fields need more),
   little-endian fields at byte-aligned bit offsets: `seq` (low 32 bits of the sender's
   sequence number), `partition` (a 32-bit partition id the sender assigns) and every
   attribute DEFINE compares, encoded as a signed integer (see `Field`);
2. predicate decoder (`atoms`): each distinct comparison `field op constant` (op one of
   `=`, `<`, `<=`) is one bit of the *atom vector*; `!=`, `>`, `>=` are negated atoms;
3. symbol logic (`symbols`): each DEFINE predicate is a boolean formula over atoms
   (`Const`, `AtomRef`, `Not`, `And`, `Or`);
4. the NFA (`automaton`, `cep_core.compiler.match.Automaton`): one flip-flop per Glushkov
   position; position i is enabled by the symbol `automaton.labels[i]` (-1: `.`, always).

Everything outside this subset (aggregates in DEFINE, comparisons that are not attribute vs
constant, arithmetic, function calls, ordering on strings, more than one PARTITION BY
attribute, a non-MATCH query) is refused with `FpgaUnsupported` at the construct's
file:line:col.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field
from typing import NoReturn

import numpy as np

from cep_core import ast
from cep_core.batch import Batch, StringDictionary
from cep_core.checked import CheckedQuery, Types
from cep_core.compiler.match import Automaton, MatchCompileError, glushkov
from cep_core.errors import QueryError
from cep_core.reference.expr import Env, Value, evaluate
from cep_core.schema import AttrType

DEFAULT_TUPLE_BITS = 128
DATAGRAM_PAYLOAD = 1440  # bytes of tuples per datagram (90 tuples of 128 bits, as the paper)
MAX_ATOMS = 16  # the symbol logic is emulated by a table of 2**atoms entries
SEQ_BITS = 32
PARTITION_BITS = 32
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
ATOM_OPS = ("=", "<", "<=")


class FpgaUnsupported(QueryError):
    """The query uses a construct the FPGA circuit does not support (named in the message)."""


# ---------------------------------------------------------------- tuple layout


@dataclass(frozen=True)
class Field:
    """One field of a tuple.

    `role`: "seq", "partition" or "attribute". `source`: the schema attribute it carries
    (None for seq; the partition attribute for the partition field, whose value on the wire
    is a dense id the sender assigns). `kind`: the attribute's kind ("int", "string", "bool",
    "float", or "uint" for seq/partition). `offset` and `width` are in bits (both multiples
    of 8); the value is stored little-endian. `signed`: compare as two's complement.

    Encodings (all comparisons in the circuit are integer comparisons):
    - int/timestamp: the value, 32 bits when every constant compared with it lies strictly
      inside int32 (values outside are clamped to int32, which keeps every comparison with
      such constants exact), else 64 bits;
    - string: its StringDictionary code, 32 bits (only = and != are supported);
    - bool: 0 or 1, 8 bits;
    - float: 64 bits, `float_key` of the value (an int64 whose signed order is the float
      order; NaN is refused when packing).
    """

    name: str
    role: str
    source: str | None
    kind: str
    offset: int
    width: int
    signed: bool

    @property
    def byte_offset(self) -> int:
        return self.offset // 8

    @property
    def byte_width(self) -> int:
        return self.width // 8


@dataclass(frozen=True)
class TupleLayout:
    """The fields of a tuple and its total width in bits (a multiple of 128)."""

    fields: tuple[Field, ...]
    tuple_bits: int

    @property
    def tuple_bytes(self) -> int:
        return self.tuple_bits // 8

    @property
    def tuples_per_datagram(self) -> int:
        return DATAGRAM_PAYLOAD // self.tuple_bytes

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def numpy_dtype(self) -> np.dtype:
        """A structured dtype with the fields at their byte offsets (itemsize tuple_bytes)."""
        names, formats, offsets = [], [], []
        for f in self.fields:
            names.append(f.name)
            formats.append(("<i" if f.signed else "<u") + str(f.byte_width))
            offsets.append(f.byte_offset)
        return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                         "itemsize": self.tuple_bytes})


# ---------------------------------------------------------------- predicate decoder


@dataclass(frozen=True)
class Atom:
    """One comparator of the predicate decoder: bit `index` of the atom vector is
    `tuple[field] op constant` (signed or unsigned as the field says). `op` is one of
    "=", "<", "<="; `constant` is already encoded like the field. `text` shows the
    comparison as the query wrote it (for docs and generated comments)."""

    index: int
    field: str
    op: str
    constant: int
    text: str


# Deliberately like accel/fpga/plan.py's Atom to Or (each other): the formula's node types,
# dataclass declarations
@dataclass(frozen=True)
class Const:
    """A constant truth value (e.g. `x IN ()`, or an int compared with 2.5 for equality)."""

    value: bool


@dataclass(frozen=True)
class AtomRef:
    """The value of atom `index`."""

    index: int


@dataclass(frozen=True)
class Not:
    """Negation of a formula."""

    item: Formula


@dataclass(frozen=True)
class And:
    """Conjunction of formulas (at least two)."""

    items: tuple[Formula, ...]


@dataclass(frozen=True)
class Or:
    """Disjunction of formulas (at least two)."""

    items: tuple[Formula, ...]


Formula = Const | AtomRef | Not | And | Or


def formula_holds(formula: Formula, atoms: np.ndarray) -> np.ndarray:
    """The formula over atom vectors (an int array, bit i = atom i): a bool array."""
    match formula:
        case Const(value=value):
            return np.full(atoms.shape, value, dtype=bool)
        case AtomRef(index=index):
            return (atoms >> index) & 1 == 1
        case Not(item=item):
            return ~formula_holds(item, atoms)
        case And(items=items):
            return np.logical_and.reduce([formula_holds(i, atoms) for i in items])
        case Or(items=items):
            return np.logical_or.reduce([formula_holds(i, atoms) for i in items])
    raise TypeError(f"not a formula: {formula!r}")


# Deliberately like accel/fpga/resources.py Resources and cep_core/reference/seq.py _Pending in
# shape only: dataclass fields
@dataclass(frozen=True)
class Symbol:
    """A DEFINE predicate as a formula over atoms; `mask`: the NFA positions it enables."""

    name: str
    formula: Formula
    mask: int


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class CircuitConfig:
    """Parameters of the circuit that are not the query's.

    `elements`: pipeline elements of the stream partitioner (one partition's NFA state each).
    `timer_bits`: width of each element's idle timer. `tick_tuples`: the timers count down
    once every that many received tuples (see docs/fpga.md, "Stream partitioner")."""

    elements: int = 64
    timer_bits: int = 4
    tick_tuples: int = 4096

    def __post_init__(self) -> None:
        if self.elements < 1 or self.timer_bits < 1 or self.tick_tuples < 1:
            raise ValueError("elements, timer_bits and tick_tuples must be positive")


@dataclass(frozen=True)
class FpgaPlan:
    """A MATCH query compiled for the circuit (see the module docstring).

    `query_id`: the query's index in its file (the stream id of its datagrams and the query
    id of its match reports). `partition_attr`: the PARTITION BY attribute (None: one
    partition, id 0). `symbols` follow `automaton.names` (label i is symbols[i]).
    `any_mask`: positions of `.` (always enabled). `constants`: the strings coded into the
    dictionary for the atoms, in coding order."""

    query_name: str
    query_id: int
    layout: TupleLayout
    atoms: tuple[Atom, ...]
    symbols: tuple[Symbol, ...]
    automaton: Automaton
    any_mask: int
    partition_attr: str | None
    constants: tuple[str, ...]
    checked: CheckedQuery = field(repr=False, compare=False)

    @property
    def positions(self) -> int:
        return self.automaton.size

    def enabled_table(self) -> np.ndarray:
        """`table[v]`: the NFA positions enabled by atom vector v (int64, 2**atoms rows):
        the symbol logic as one lookup."""
        vectors = np.arange(1 << len(self.atoms), dtype=np.int64)
        table = np.full(len(vectors), self.any_mask, dtype=np.int64)
        for symbol in self.symbols:
            table |= np.where(formula_holds(symbol.formula, vectors), symbol.mask, 0)
        return table

    def atom_vectors(self, tuples: np.ndarray) -> np.ndarray:
        """The atom vector of every packed tuple (uint8 rows): the predicate decoder."""
        records = tuples.reshape(-1).view(self.layout.numpy_dtype())
        out = np.zeros(len(records), dtype=np.int64)
        for atom in self.atoms:
            values = records[atom.field].astype(np.int64)
            hit = {"=": values == atom.constant, "<": values < atom.constant,
                   "<=": values <= atom.constant}[atom.op]
            out |= hit.astype(np.int64) << atom.index
        return out

    def fingerprint(self) -> int:
        """A 64-bit digest of what the circuit computes (layout, atoms, symbols, NFA): sender
        and device check that they agree on it."""
        text = repr((self.layout, self.atoms, [(s.formula, s.mask) for s in self.symbols],
                     self.automaton.labels, self.automaton.first, self.automaton.last,
                     self.automaton.follow))
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


# ---------------------------------------------------------------- compiling


def compile_fpga(checked: CheckedQuery, strings: StringDictionary,
                 tuple_bits: int = DEFAULT_TUPLE_BITS) -> FpgaPlan:
    """The FPGA plan of a checked query, or FpgaUnsupported naming what does not fit.

    String constants are coded into `strings` (in order of appearance in DEFINE), so the
    sender must code its string columns with the same dictionary."""
    query = checked.query
    body = query.body
    if not isinstance(body, ast.MatchQuery):
        raise FpgaUnsupported(
            f"the FPGA path runs MATCH queries only; query {query.name} is a "
            f"{query.kind.upper()} query", query.pos)
    if len(query.partition_by) > 1:
        extra = query.partition_by[1]
        raise FpgaUnsupported(
            f"the FPGA stream partitioner takes one PARTITION BY attribute; query "
            f"{query.name} has {len(query.partition_by)} (second: {extra.name})", extra.pos)
    try:
        automaton = glushkov(body.pattern)
    except MatchCompileError as e:
        raise FpgaUnsupported(str(e), body.pattern.pos) from None
    decoder = _Decoder(checked, strings)
    defines = {d.name: d for d in body.defines}
    raw = [decoder.formula(defines[name].condition) for name in automaton.names]
    layout = decoder.layout(tuple_bits, query.partition_by[0].name if query.partition_by
                            else None)
    atoms = tuple(decoder.atoms)
    if len(atoms) > MAX_ATOMS:
        raise FpgaUnsupported(
            f"DEFINE needs {len(atoms)} distinct comparisons; the FPGA predicate decoder "
            f"handles at most {MAX_ATOMS}", body.defines[0].pos)
    symbols = tuple(Symbol(name, formula, automaton.mask_of(label))
                    for label, (name, formula) in enumerate(zip(automaton.names, raw)))
    return FpgaPlan(
        query_name=query.name, query_id=checked.index, layout=layout, atoms=atoms,
        symbols=symbols, automaton=automaton, any_mask=automaton.mask_of(-1),
        partition_attr=query.partition_by[0].name if query.partition_by else None,
        constants=tuple(decoder.constants), checked=checked)


B = ast.BinaryOp
_FLIP = {B.LT: B.GT, B.LE: B.GE, B.GT: B.LT, B.GE: B.LE, B.EQ: B.EQ, B.NE: B.NE}
_NEGATED = {B.NE: B.EQ, B.GT: B.LE, B.GE: B.LT}


class _NoAttributes(Env):
    """Constant folding: any attribute or aggregate makes the expression non-constant."""

    def attr(self, node: ast.Attr) -> NoReturn:
        raise _NotConstant

    def aggregate(self, node: ast.Aggregate) -> NoReturn:
        raise _NotConstant


class _NotConstant(Exception):
    pass


def _constant(expr: ast.Expression) -> tuple[bool, Value]:
    if expr.find(ast.Attr, ast.Aggregate, ast.WindowAggregate, ast.Call) is not None:
        return False, None
    try:
        return True, evaluate(expr, _NoAttributes())
    except _NotConstant:
        return False, None


class _Decoder(ast.Visitor):
    """Turns DEFINE conditions into formulas over shared atoms, and collects the fields.
    `visit_<Class>` translates what the circuit supports; `generic_visit` refuses the rest."""

    def __init__(self, checked: CheckedQuery, strings: StringDictionary):
        self.checked = checked
        self.schema = checked.schema
        self.strings = strings
        self.atoms: list[Atom] = []
        self.fields: dict[str, str] = {}  # attribute -> kind, in order of first use
        self.constants: list[str] = []
        self.int_constants: dict[str, list[int]] = {}

    def kind(self, attr: str) -> str:
        kind = self.schema.attributes[attr]
        return AttrType.INT if kind == AttrType.TIMESTAMP else kind

    def formula(self, expr: ast.Expression) -> Formula:
        node = expr.find(ast.Aggregate, ast.WindowAggregate)
        if isinstance(node, (ast.Aggregate, ast.WindowAggregate)):
            name = node.func.value.capitalize() + "()"
            raise FpgaUnsupported(
                f"aggregate {name} in DEFINE: the FPGA circuit compares tuple fields "
                "with constants only", node.pos)
        is_constant, value = _constant(expr)
        if is_constant:
            return Const(bool(value))
        return self.visit(expr)

    def visit_Unary(self, expr: ast.Unary) -> Formula:
        if expr.op is not ast.UnaryOp.NOT:
            return self.generic_visit(expr)
        return _not(self.formula(expr.operand))

    def visit_Binary(self, expr: ast.Binary) -> Formula:
        if expr.op.is_logical:
            items = (self.formula(expr.left), self.formula(expr.right))
            return _and(items) if expr.op is ast.BinaryOp.AND else _or(items)
        if expr.op.is_comparison:
            return self.comparison(expr, expr.op, expr.left, expr.right)
        return self.generic_visit(expr)

    def visit_InList(self, expr: ast.InList) -> Formula:
        terms = tuple(self.comparison(expr, B.EQ, expr.operand, option)
                      for option in expr.options)
        inside = _or(terms) if terms else Const(False)
        return _not(inside) if expr.negated else inside

    def visit_Attr(self, expr: ast.Attr) -> Formula:
        if self.checked.types[expr] != AttrType.BOOL:
            return self.generic_visit(expr)
        return self.atom(expr, expr.name, B.EQ, True)

    def generic_visit(self, expr: ast.Node) -> Formula:
        described = _describe(expr, self.checked.types)
        raise FpgaUnsupported(f"{described} in DEFINE: the FPGA circuit supports "
                              "comparisons of a tuple field with a constant, AND, OR, NOT "
                              "and IN lists", _pos(expr))

    def comparison(self, node: ast.Expression, op: ast.BinaryOp, left: ast.Expression,
                   right: ast.Expression) -> Formula:
        left_const, left_value = _constant(left)
        right_const, right_value = _constant(right)
        if isinstance(left, ast.Attr) and right_const:
            attr, value = left, right_value
        elif isinstance(right, ast.Attr) and left_const:
            attr, value, op = right, left_value, _FLIP[op]
        elif isinstance(left, ast.Attr) and isinstance(right, ast.Attr):
            raise FpgaUnsupported(
                f"comparison between two attributes ({left.name} {op} {right.name}): the "
                "FPGA circuit compares a tuple field with a constant", node.pos)
        else:
            side = right if isinstance(left, ast.Attr) or left_const else left
            raise FpgaUnsupported(
                f"{_describe(side, self.checked.types)} in a comparison: the FPGA circuit "
                "compares a tuple field with a constant", _pos(side))
        if value is None:
            return Const(False)  # a comparison with null is false
        return self.atom(node, attr.name, op, value)

    def atom(self, node: ast.Expression, attr: str, op: ast.BinaryOp, value: Value) -> Formula:
        if op in _NEGATED:
            return _not(self.atom(node, attr, _NEGATED[op], value))
        kind = self.kind(attr)
        text = f"{attr} {op} {value!r}"
        if kind == AttrType.STRING:
            if op is not B.EQ:
                raise FpgaUnsupported(
                    f"ordering comparison on the string attribute {attr}: the FPGA circuit "
                    "compares dictionary codes, so only = and != work on strings", node.pos)
            if value not in self.strings.codes:
                self.constants.append(value)
            constant = self.strings.code(value)
        elif kind == AttrType.BOOL:
            if op is not B.EQ:
                raise FpgaUnsupported(f"ordering comparison on the bool attribute {attr}",
                                      node.pos)
            constant = int(bool(value))
        elif kind == AttrType.FLOAT:
            constant = float_key(float(value))
        else:
            if isinstance(value, float) and not value.is_integer():
                # An integer field against a fractional constant: x = 2.5 never holds;
                # x < 2.5 is x <= 2; x <= 2.5 is x <= 2.
                if op is B.EQ:
                    return Const(False)
                op, value = B.LE, math.floor(value)
            constant = int(value)
            self.int_constants.setdefault(attr, []).append(constant)
        self.fields.setdefault(attr, kind)
        for existing in self.atoms:
            if (existing.field, existing.op, existing.constant) == (attr, op.value, constant):
                return AtomRef(existing.index)
        self.atoms.append(Atom(len(self.atoms), attr, op.value, constant, text))
        return AtomRef(len(self.atoms) - 1)

    def layout(self, tuple_bits: int, partition_attr: str | None) -> TupleLayout:
        widths = []
        for attr, kind in self.fields.items():
            if kind == AttrType.INT:
                inside = all(INT32_MIN < c < INT32_MAX for c in self.int_constants.get(attr, []))
                width = 32 if inside else 64
            else:
                width = {"string": 32, "bool": 8, "float": 64}[kind]
            widths.append((attr, kind, width))
        fields = [Field("seq", "seq", None, "uint", 0, SEQ_BITS, False),
                  Field("partition", "partition", partition_attr, "uint", SEQ_BITS,
                        PARTITION_BITS, False)]
        offset = SEQ_BITS + PARTITION_BITS
        # Widest first, so every field sits at a multiple of its own width.
        for attr, kind, width in sorted(widths, key=lambda w: -w[2]):
            fields.append(Field(attr, "attribute", attr, kind, offset, width,
                                kind != AttrType.STRING))
            offset += width
        bits = max(tuple_bits, -(-offset // DEFAULT_TUPLE_BITS) * DEFAULT_TUPLE_BITS)
        if bits % DEFAULT_TUPLE_BITS:
            raise ValueError(f"tuple_bits must be a multiple of {DEFAULT_TUPLE_BITS}")
        return TupleLayout(tuple(fields), bits)


def _not(item: Formula) -> Formula:
    if isinstance(item, Const):
        return Const(not item.value)
    if isinstance(item, Not):
        return item.item
    return Not(item)


def _and(items: tuple[Formula, ...]) -> Formula:
    flat: list[Formula] = []
    for item in items:
        if item == Const(False):
            return Const(False)
        if item != Const(True):
            flat.extend(item.items if isinstance(item, And) else [item])
    return Const(True) if not flat else flat[0] if len(flat) == 1 else And(tuple(flat))


def _or(items: tuple[Formula, ...]) -> Formula:
    flat: list[Formula] = []
    for item in items:
        if item == Const(True):
            return Const(True)
        if item != Const(False):
            flat.extend(item.items if isinstance(item, Or) else [item])
    return Const(False) if not flat else flat[0] if len(flat) == 1 else Or(tuple(flat))


class _Description(ast.Visitor):
    """What an unsupported expression is, for messages."""

    def visit_Binary(self, expr: ast.Binary, types: Types) -> str:
        return f"arithmetic ({expr.op})" if expr.op.is_arithmetic else f"operator {expr.op}"

    def visit_Unary(self, expr: ast.Unary, types: Types) -> str:
        return f"unary {expr.op}"

    def visit_Call(self, expr: ast.Call, types: Types) -> str:
        return f"function call {expr.name}()"

    def visit_Attr(self, expr: ast.Attr, types: Types) -> str:
        return f"the {types[expr] or ''} attribute {expr.name} used as a condition"

    def generic_visit(self, expr: ast.Node, types: Types) -> str:
        return type(expr).__name__


_describe = _Description().visit  # _describe(expr, types)


def _pos(expr: ast.Node) -> ast.Pos:
    return getattr(expr, "pos", ast.NOPOS)


def float_key(value: float) -> int:
    """An int64 whose signed order is the order of floats (-0.0 and 0.0 both give 0)."""
    if value != value:
        raise ValueError("NaN cannot be compared on the FPGA")
    bits = struct.unpack("<q", struct.pack("<d", value + 0.0))[0]
    return bits if bits >= 0 else bits ^ 0x7FFF_FFFF_FFFF_FFFF


def float_keys(values: np.ndarray) -> np.ndarray:
    """`float_key` of every value of a float64 array."""
    values = np.asarray(values, dtype=np.float64)
    if np.isnan(values).any():
        raise ValueError("NaN cannot be compared on the FPGA")
    bits = (values + 0.0).view(np.int64)
    return np.where(bits >= 0, bits, bits ^ np.int64(0x7FFF_FFFF_FFFF_FFFF))


# ---------------------------------------------------------------- packing


def pack_tuples(plan: FpgaPlan, batch: Batch, partition_ids: np.ndarray | None = None,
                seqs: np.ndarray | None = None) -> np.ndarray:
    """The tuples of a batch as uint8 rows of `tuple_bytes` (the layout in docs/fpga.md).

    `seqs` default to the batch's seq, `partition_ids` to the partition column's values
    (string codes, bools or ints, which must fit 32 bits unsigned; senders with arbitrary
    keys pass dense ids). Seqs are sent modulo 2**32. Int values outside a 32-bit field
    are clamped (exact for the field's constants, see `Field`)."""
    layout = plan.layout
    n = len(batch)
    records = np.zeros(n, dtype=layout.numpy_dtype())
    seq = np.asarray(batch.seq if seqs is None else seqs, dtype=np.int64)
    records["seq"] = (seq & 0xFFFF_FFFF).astype(np.uint32)
    if partition_ids is None:
        if plan.partition_attr is None:
            partition_ids = np.zeros(n, dtype=np.int64)
        else:
            partition_ids = np.asarray(batch.columns[plan.partition_attr]).astype(np.int64)
    partition_ids = np.asarray(partition_ids, dtype=np.int64)
    if n and (partition_ids.min() < 0 or partition_ids.max() >= 1 << PARTITION_BITS):
        raise ValueError("partition ids must fit 32 bits unsigned (pass dense ids)")
    records["partition"] = partition_ids.astype(np.uint32)
    for f in layout.fields[2:]:
        assert f.source is not None  # the fields after seq and partition are attributes
        column = batch.columns[f.source]
        if f.kind == AttrType.FLOAT:
            records[f.name] = float_keys(column)
        elif f.kind == AttrType.STRING:
            records[f.name] = np.asarray(column, dtype=np.int64).astype(np.uint32)
        elif f.kind == AttrType.BOOL:
            records[f.name] = np.asarray(column).astype(np.int8)
        elif f.width == 32:
            records[f.name] = np.clip(np.asarray(column, dtype=np.int64), INT32_MIN, INT32_MAX)
        else:
            records[f.name] = np.asarray(column, dtype=np.int64)
    return records.view(np.uint8).reshape(n, layout.tuple_bytes)
