"""The generated Verilog, simulated in Icarus Verilog, against the emulator and the reference.

Small streams and few partitioner elements keep each simulation well under a second; one
tiny Yosys synthesis checks the resource flow (the full experiment is `cep fpga resources`).
"""

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep_accel.fpga import resources
from cep_accel.fpga.emulator import Circuit
from cep_accel.fpga.hdl import circuit_verilog, tuples_hex
from cep_accel.fpga.hdl_automata import binary_automaton, dfa_verilog, nfa_verilog, powerset
from cep_accel.fpga.plan import CircuitConfig, compile_fpga, pack_tuples
from cep_accel.fpga.simulate import parse_reports, simulate
from cep_accel.fpga.verify import verify
from cep_core import reference
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_query_text
from cep_core.events import Event
from cep_core.schema import SchemaRegistry, StreamSchema
from test_fpga_emulator import MARATHON, marathon_events
from test_fpga_emulator import QUERIES as EMULATOR_QUERIES

SCHEMA = StreamSchema("ev", {"k": "int", "x": "int", "s": "string", "f": "float",
                             "ts": "timestamp"}, "ts")
QUERIES = {
    **EMULATOR_QUERIES,
    "negative": "QUERY q FROM ev PARTITION BY k PATTERN (A B) "
                "DEFINE A AS x < -2, B AS x >= -1 AND x != 3;",
    "wide_and_float": "QUERY q FROM ev PARTITION BY k PATTERN (A B+ C) "
                      "DEFINE A AS f < 1.5, B AS x > -5000000000 AND f >= -2.25, "
                      "C AS x < 5000000000 AND f > 0;",
}
FLOATS = [-3.0, -2.25, -0.0, 0.0, 1.5, 2.0]


def checked(name: str):
    registry = SchemaRegistry()
    registry.add(SCHEMA)
    return load_query_text(QUERIES[name], registry)[0]


def ev_events(records):
    return [Event(i, i, {"k": k, "x": x, "s": s, "f": FLOATS[(x + i) % len(FLOATS)], "ts": i})
            for i, (k, x, s) in enumerate(records)]


def run_all(q, events, config):
    """(HDL records, HDL counts, emulator records, emulator counts) for the events."""
    strings = StringDictionary()
    plan = compile_fpga(q, strings)
    rows = pack_tuples(plan, BatchEncoder(q.schema, strings).from_events(events))
    sim = simulate(plan, rows, config)
    circuit = Circuit(plan, config)
    emulated = circuit.run(rows)
    assert (sim.query_ids == plan.query_id).all()
    return sim.records.tolist(), sim.counts, emulated.tolist(), circuit.counts()


def expected(q, events):
    return [[c["key"] if c["key"] is not None else 0, c["seq"], c["start_seq"]]
            for c in reference.run([q], events)]


def same_counts(sim_counts, emulator_counts):
    return all(sim_counts[name] == emulator_counts[name]
               for name in ("tuples", "discarded", "expired"))


ev_records = st.lists(st.tuples(st.integers(0, 4), st.integers(-4, 5), st.sampled_from("abc")),
                      max_size=120)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(sorted(QUERIES)), ev_records)
def test_hdl_equals_emulator_and_reference(name, records):
    q = checked(name)
    events = ev_events(records)
    hdl, counts, emulated, emulator_counts = run_all(q, events, CircuitConfig(elements=6))
    assert counts["discarded"] == 0
    assert hdl == emulated == expected(q, events)
    assert same_counts(counts, emulator_counts)


@settings(max_examples=6, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=200))
def test_hdl_equals_reference_on_the_marathon(records):
    events = marathon_events(records)
    hdl, counts, emulated, _ = run_all(MARATHON, events, CircuitConfig(elements=6))
    assert counts["discarded"] == 0
    assert hdl == emulated == expected(MARATHON, events)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(["alt_star", "overlapping"]),
       st.lists(st.tuples(st.integers(0, 7), st.integers(-1, 5), st.sampled_from("abc")),
                min_size=20, max_size=150),
       st.integers(1, 3), st.integers(1, 3))
def test_more_partitions_than_elements_discard_and_expire_like_the_emulator(
        name, records, elements, tick):
    q = checked(name)
    hdl, counts, emulated, emulator_counts = run_all(
        q, ev_events(records), CircuitConfig(elements=elements, tick_tuples=tick))
    assert hdl == emulated
    assert same_counts(counts, emulator_counts)


def test_wide_tuples_with_float_and_int64_fields():
    """256-bit tuples: 64-bit signed comparators on float keys and wide ints."""
    q = checked("wide_and_float")
    rng = random.Random(3)
    events = ev_events([(rng.randint(0, 3), rng.randint(-4, 5), "a") for _ in range(150)])
    hdl, _, emulated, _ = run_all(q, events, CircuitConfig(elements=4))
    assert hdl == emulated == expected(q, events) and len(hdl) > 5


def test_discards_and_expiries_are_counted():
    # Runners 0-3 take the 4 elements; 4-9 are discarded at Staten Island, then 0-3 cheat.
    events = marathon_events([(k, 0) for k in range(10)] + [(k, 4) for k in range(10)])
    hdl, counts, emulated, _ = run_all(MARATHON, events, CircuitConfig(elements=4))
    assert counts["discarded"] == 6 and hdl == emulated == [[k, 10 + k, k] for k in range(4)]
    # Runner 0's timer (15 ticks of 2 tuples) runs out during 30 tuples of runner 1.
    events = marathon_events([(0, 0)] + [(1, 5)] * 30 + [(0, 4), (2, 0), (2, 4)])
    hdl, counts, emulated, _ = run_all(MARATHON, events,
                                       CircuitConfig(elements=4, tick_tuples=2))
    assert counts["expired"] == 1 and hdl == emulated == [[2, 33, 32]]


def test_back_to_back_tuples_of_one_partition_see_each_others_state():
    """Every tuple follows the one before it by one clock: allocation and write-back
    hazards in the pipeline show up as wrong starts."""
    q = checked("alt_star")
    records = [(3, x, "a") for x in [1, 2, 2, 3, 1, 3, 1, 1, 2, 4, 3]] + \
        [(k, x, "a") for k in (5, 6) for x in (1, 2, 3)]
    events = ev_events(records)
    hdl, _, emulated, _ = run_all(q, events, CircuitConfig(elements=3))
    assert hdl == emulated == expected(q, events) and len(hdl) == 5


def test_generated_verilog_holds_no_query_text():
    circuit, testbench = circuit_verilog(compile_fpga(MARATHON, StringDictionary()))
    assert "Staten" not in circuit and "Manhattan" not in circuit
    assert "module predicate_decoder" in circuit and "module stream_partitioner" in circuit
    assert "$readmemh" in testbench


def test_tuples_hex_is_the_little_endian_number_of_each_row():
    rows = np.array([[1, 2, 3, 4], [0xFF, 0, 0, 0x80]], dtype=np.uint8)
    assert tuples_hex(rows) == "04030201\n800000ff\n"


def test_report_parser_rejects_an_unfinished_run():
    assert parse_reports("match 0 1 2 3\ncounts 4 0 0\n").records.tolist() == [[1, 2, 3]]
    with pytest.raises(RuntimeError, match="did not finish"):
        parse_reports("match 0 1 2 3\n")


def test_verify_runs_the_hdl_leg():
    events = marathon_events([(k % 5, (k * 7) % 6) for k in range(150)])
    verdict = verify(MARATHON, events, CircuitConfig(elements=8))
    names = [o.name for o in verdict.outcomes]
    assert any(name.startswith("hdl simulation") for name in names), names
    assert verdict.agrees, verdict.outcomes


# ---------------------------------------------------------------- resource experiment


@pytest.mark.parametrize("i", [1, 4, 7])
def test_powerset_dfa_of_the_binary_pattern_has_exponentially_many_states(i):
    automaton = binary_automaton(i)
    assert automaton.size == i + 2
    assert len(powerset(automaton).subsets) == 2 ** (i + 1) + 1  # plus the start state


def test_nfa_and_both_dfas_recognize_the_same_bits(tmp_path):
    i = 3
    automaton = binary_automaton(i)
    dfa = powerset(automaton)
    modules = nfa_verilog(automaton, "nfa") + dfa_verilog(dfa, "hot", "onehot") + \
        dfa_verilog(dfa, "bin", "binary")
    bits = [random.Random(7).randint(0, 1) for _ in range(200)]
    bench = ["module tb;", "reg clk = 0; reg rst = 1; reg x = 0;", "wire a, b, c;",
             "nfa n (clk, rst, x, a); hot h (clk, rst, x, b); bin d (clk, rst, x, c);",
             "initial begin", "#1 clk = 1; #1 clk = 0;", "rst = 0;"]
    for bit in bits:
        bench.append(f"x = {bit}; #1 clk = 1; #1 clk = 0; $display(\"%b%b%b\", a, b, c);")
    bench += ["$finish;", "end", "endmodule"]
    (tmp_path / "design.v").write_text(modules + "\n".join(bench) + "\n")
    subprocess.run(["iverilog", "-o", str(tmp_path / "sim"), str(tmp_path / "design.v")],
                   check=True)
    out = subprocess.run(["vvp", "-n", str(tmp_path / "sim")], check=True,
                         capture_output=True, text=True).stdout.split()
    want = [str(int(t >= i and bits[t - i] == 1)) * 3 for t in range(len(bits))]
    assert out == want


def test_yosys_counts_one_flip_flop_per_nfa_state():
    automaton = binary_automaton(2)
    found = resources.synthesize(nfa_verilog(automaton, "nfa"), "nfa")
    assert found.flip_flops == automaton.size + 1  # positions and the start flip-flop
    assert 0 < found.luts <= automaton.size


def test_cli_hdl_writes_a_circuit_that_compiles(tmp_path):
    cep = Path(sys.executable).with_name("cep")
    command = [str(cep)] if cep.exists() else [sys.executable, "-m", "cep_service.cli.main"]
    done = subprocess.run(command + ["fpga", "hdl",
                           "examples/marathon.cep", "--out", str(tmp_path), "--elements", "4"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    subprocess.run(["iverilog", "-g2005", "-o", str(tmp_path / "sim"),
                    str(tmp_path / "cep_circuit.v"), str(tmp_path / "testbench.v")],
                   check=True)
