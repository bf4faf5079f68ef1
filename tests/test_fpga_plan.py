"""The FPGA plan: layout, packing, predicate decoder, and the constructs it refuses."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep_accel.fpga.plan import FpgaUnsupported, compile_fpga, float_key, float_keys, pack_tuples
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_queries, load_query_text
from cep_core.events import Event
from cep_core.reference.expr import holds
from cep_core.reference.match import MatchEnv
from cep_core.schema import SchemaRegistry, StreamSchema

SCHEMA = StreamSchema("ev", {"k": "int", "x": "int", "f": "float", "s": "string", "b": "bool",
                             "ts": "timestamp"}, "ts")


def checked(text: str):
    registry = SchemaRegistry()
    registry.add(SCHEMA)
    return load_query_text(text, registry, path="q.cep")[0]


def plan_of(text: str):
    strings = StringDictionary()
    return compile_fpga(checked(text), strings), strings


def test_marathon_layout_is_128_bits_with_seq_partition_and_checkpoint():
    [q] = load_queries("examples/marathon.cep")
    plan = compile_fpga(q, StringDictionary())
    layout = plan.layout
    assert layout.tuple_bits == 128 and layout.tuples_per_datagram == 90
    assert [(f.name, f.offset, f.width) for f in layout.fields] == [
        ("seq", 0, 32), ("partition", 32, 32), ("checkpoint", 64, 32)]
    # != shares the comparator of =: five atoms for seven predicates.
    assert len(plan.atoms) == 5 and {a.op for a in plan.atoms} == {"="}
    assert plan.automaton.size == 9


def test_pack_tuples_writes_little_endian_fields_at_their_offsets():
    plan, strings = plan_of("QUERY q FROM ev PARTITION BY k PATTERN (A B) "
                            "DEFINE A AS x > 3, B AS s = 'go';")
    batch = BatchEncoder(SCHEMA, strings).from_events(
        [Event(0x01020304, 0, {"k": 7, "x": -2, "f": 0.0, "s": "go", "b": True, "ts": 0})])
    rows = pack_tuples(plan, batch)
    assert rows.shape == (1, 16) and rows.dtype == np.uint8
    assert rows[0, :4].tolist() == [4, 3, 2, 1]  # seq
    assert rows[0, 4:8].tolist() == [7, 0, 0, 0]  # partition
    x, s = plan.layout.field("x"), plan.layout.field("s")
    assert rows[0, x.byte_offset:x.byte_offset + 4].tolist() == [0xFE, 0xFF, 0xFF, 0xFF]
    assert rows[0, s.byte_offset:s.byte_offset + 4].tolist() == [strings.code("go"), 0, 0, 0]


def test_wide_constants_widen_the_field_and_the_tuple():
    plan, _ = plan_of("QUERY q FROM ev PARTITION BY k PATTERN (A B C) "
                      "DEFINE A AS x > 5000000000, B AS f < 1.5, C AS ts >= 0;")
    widths = {f.name: f.width for f in plan.layout.fields}
    assert widths == {"seq": 32, "partition": 32, "x": 64, "f": 64, "ts": 32}
    assert plan.layout.tuple_bits == 256
    assert all(f.offset % f.width == 0 for f in plan.layout.fields)


@pytest.mark.parametrize("text, construct, marker", [
    ("QUERY q FROM ev PARTITION BY k PATTERN (A B) DEFINE A AS x > 1, B AS x > First(x);",
     "aggregate First()", "First"),
    ("QUERY q FROM ev PARTITION BY k PATTERN (A) DEFINE A AS x > k;",
     "comparison between two attributes", "> k"),
    ("QUERY q FROM ev PARTITION BY k PATTERN (A) DEFINE A AS x + 1 > 3;",
     "arithmetic (+)", "+ 1"),
    ("QUERY q FROM ev PARTITION BY k PATTERN (A) DEFINE A AS lower(s) = 'a';",
     "function call lower()", "lower"),
    ("QUERY q FROM ev PARTITION BY k PATTERN (A) DEFINE A AS s < 'm';",
     "ordering comparison on the string attribute s", "< 'm'"),
    ("QUERY q FROM ev PARTITION BY k, x PATTERN (A) DEFINE A AS x > 1;",
     "one PARTITION BY attribute", "x PATTERN"),
])
def test_unsupported_constructs_are_named_at_their_position(text, construct, marker):
    with pytest.raises(FpgaUnsupported) as info:
        plan_of(text)
    assert construct in info.value.message
    assert (info.value.pos.file, info.value.pos.line) == ("q.cep", 1)
    assert info.value.pos.column == text.index(marker) + 1, str(info.value)


def test_a_window_query_is_refused():
    [q] = load_queries("examples/ticks.cep")[:1]
    with pytest.raises(FpgaUnsupported, match="MATCH queries only"):
        compile_fpga(q, StringDictionary())


def test_ints_against_fractions_and_constant_folding():
    plan, _ = plan_of("QUERY q FROM ev PARTITION BY k PATTERN (A B C) "
                      "DEFINE A AS x = 2.5, B AS x < 2.5 AND x >= 2 * 3 - 7, "
                      "C AS x IN (1, 2) AND NOT b;")
    a, b, c = plan.symbols
    assert a.formula.value is False  # an int never equals 2.5
    assert [(atom.field, atom.op, atom.constant) for atom in plan.atoms] == [
        ("x", "<=", 2), ("x", "<", -1), ("x", "=", 1), ("x", "=", 2), ("b", "=", 1)]


@given(st.lists(st.floats(allow_nan=False, width=64), min_size=2, max_size=20))
def test_float_keys_order_like_floats(values):
    keys = float_keys(np.array(values))
    assert [float_key(v) for v in values] == keys.tolist()
    for a, ka in zip(values, keys.tolist()):
        for b, kb in zip(values, keys.tolist()):
            assert (a < b) == (ka < kb) and (a == b) == (ka == kb)


QUERY_ALL_KINDS = ("QUERY q FROM ev PARTITION BY k PATTERN (A | B | C | D) "
                   "DEFINE A AS x > 3 AND NOT (s = 'a' OR b), B AS f <= -0.5 OR x IN (7, 9), "
                   "C AS s != 'b' AND x < 2147483647, D AS 1 < x AND f > 2;")
events_strategy = st.lists(st.fixed_dictionaries({
    "x": st.one_of(st.integers(-10, 10), st.integers(-(1 << 40), 1 << 40)),
    "f": st.sampled_from([-1.0, -0.5, -0.0, 0.0, 2.0, 2.5, 1e300]),
    "s": st.sampled_from(["a", "b", "c"]), "b": st.booleans()}), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(events_strategy)
def test_decoder_and_symbol_table_agree_with_the_reference_predicates(records):
    q = checked(QUERY_ALL_KINDS)
    strings = StringDictionary()
    plan = compile_fpga(q, strings)
    events = [Event(i, i, {"k": 0, "ts": i, **r}) for i, r in enumerate(records)]
    rows = pack_tuples(plan, BatchEncoder(SCHEMA, strings).from_events(events))
    enabled = plan.enabled_table()[plan.atom_vectors(rows)]
    defines = {d.name: d.condition for d in q.query.body.defines}
    for event, mask in zip(events, enabled.tolist()):
        env = MatchEnv([], event, "ts")
        for symbol in plan.symbols:
            assert holds(defines[symbol.name], env) == bool(mask & symbol.mask), \
                (symbol.name, event)
