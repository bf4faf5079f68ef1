"""The circuit as synthesizable Verilog, generated from an `FpgaPlan` (never from query text).

`circuit_verilog(plan, config)` gives four modules and a testbench:

- `predicate_decoder`: one comparator per atom (`field op constant` on the tuple's bits),
  the DEFINE symbols as gates over atoms, and the enabled position vector;
- `nfa_update` (`hdl_nfa`): the NFA's wiring, one flip-flop per position in each element;
- `stream_partitioner` (`hdl_partitioner`): the pipelined partitioner with its elements;
- `cep_circuit`: decoder -> partitioner (-> NFA) -> match reports;
- `testbench`: reads packed tuples from a hex file (`$readmemh`, one tuple per line, the
  tuple's bytes as a little-endian number), feeds one per clock and writes one line per
  match report (`match QUERY PARTITION SEQ START`) and the counters at the end
  (`counts TUPLES DISCARDED EXPIRED`).

Identifiers in the Verilog are made up here; numbers come from the plan; attribute names
appear only in comments, and only when they are plain identifiers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from cep_accel.fpga.hdl_nfa import nfa_verilog
from cep_accel.fpga.hdl_partitioner import PartitionerShape, partitioner_verilog
from cep_accel.fpga.plan import (
    AtomRef,
    CircuitConfig,
    Const,
    FpgaPlan,
    Formula,
)
from cep_accel.fpga.plan import And as FAnd
from cep_accel.fpga.plan import Not as FNot
from cep_accel.fpga.plan import Or as FOr

VERILOG_OPS = {"=": "==", "<": "<", "<=": "<="}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
FILES = ("cep_circuit.v", "testbench.v")


@dataclass(frozen=True)
class CircuitFiles:
    """What `write_hdl` wrote: the synthesizable circuit and the testbench."""

    circuit: Path
    testbench: Path


def _comment_name(name: str) -> str:
    return name if _IDENTIFIER.match(name) else "(field)"


def formula_verilog(formula: Formula) -> str:
    match formula:
        case Const(value=value):
            return "1'b1" if value else "1'b0"
        case AtomRef(index=index):
            return f"atom[{index}]"
        case FNot(item=item):
            return f"!({formula_verilog(item)})"
        case FAnd(items=items):
            return "(" + " && ".join(formula_verilog(i) for i in items) + ")"
        case FOr(items=items):
            return "(" + " || ".join(formula_verilog(i) for i in items) + ")"
    raise TypeError(f"not a formula: {formula!r}")


def _constant(value: int, width: int, signed: bool) -> str:
    low, high = (-(1 << (width - 1)), 1 << (width - 1)) if signed else (0, 1 << width)
    if not low <= value < high:
        raise ValueError(f"constant {value} does not fit a {width}-bit field")
    digits = format(value & ((1 << width) - 1), "x")
    return f"$signed({width}'h{digits})" if signed else f"{width}'h{digits}"


def decoder_verilog(plan: FpgaPlan, module: str = "predicate_decoder") -> str:
    layout = plan.layout
    n = plan.positions
    natoms = max(1, len(plan.atoms))
    lines = [f"// Predicate decoder: {len(plan.atoms)} comparators, {len(plan.symbols)} "
             f"predicates, {n} NFA positions.",
             f"module {module} (",
             f"  input wire [{layout.tuple_bits - 1}:0] tuple_bits,",
             f"  output wire [{n - 1}:0] enabled",
             ");",
             f"  wire [{natoms - 1}:0] atom;"]
    if not plan.atoms:
        lines.append("  assign atom = 1'b0;")
    for atom in plan.atoms:
        f = layout.field(atom.field)
        value = f"tuple_bits[{f.offset} +: {f.width}]"
        if f.signed:
            value = f"$signed({value})"
        constant = _constant(atom.constant, f.width, f.signed)
        lines.append(f"  // atom {atom.index}: {_comment_name(atom.field)} {atom.op} "
                     f"{atom.constant}")
        lines.append(f"  assign atom[{atom.index}] = {value} {VERILOG_OPS[atom.op]} "
                     f"{constant};")
    for label, symbol in enumerate(plan.symbols):
        lines.append(f"  wire symbol{label} = {formula_verilog(symbol.formula)};  "
                     f"// {_comment_name(symbol.name)}")
    for p, label in enumerate(plan.automaton.labels):
        source = "1'b1" if label < 0 else f"symbol{label}"
        lines.append(f"  assign enabled[{p}] = {source};")
    lines += ["endmodule", ""]
    return "\n".join(lines)


def top_verilog(plan: FpgaPlan, shape: PartitionerShape) -> str:
    layout = plan.layout
    seq, pid = layout.field("seq"), layout.field("partition")
    n, w = plan.positions, layout.tuple_bits
    return f"""\
// The circuit of query {plan.query_id}: decoder -> stream partitioner -> NFA -> reports.
module cep_circuit (
  input wire clk,
  input wire rst,
  input wire in_valid,
  input wire [{w - 1}:0] in_tuple,
  output wire report_valid,
  output wire [15:0] report_query,
  output wire [{shape.pid_bits - 1}:0] report_pid,
  output wire [{shape.seq_bits - 1}:0] report_seq,
  output wire [{shape.seq_bits - 1}:0] report_start,
  output wire [31:0] tuples,
  output wire [31:0] discarded,
  output wire [31:0] expired
);
  wire [{n - 1}:0] enabled;
  predicate_decoder decoder (.tuple_bits(in_tuple), .enabled(enabled));
  stream_partitioner partitioner (
    .clk(clk), .rst(rst), .in_valid(in_valid),
    .in_pid(in_tuple[{pid.offset} +: {pid.width}]),
    .in_seq(in_tuple[{seq.offset} +: {seq.width}]),
    .in_enabled(enabled),
    .report_valid(report_valid), .report_pid(report_pid), .report_seq(report_seq),
    .report_start(report_start), .tuples(tuples), .discarded(discarded),
    .expired(expired));
  assign report_query = 16'd{plan.query_id};
endmodule
"""


def testbench_verilog(plan: FpgaPlan, shape: PartitionerShape) -> str:
    w = plan.layout.tuple_bits
    drain = shape.elements + 8
    return f"""\
// Testbench: +tuples=FILE (hex, one tuple a line), +reports=FILE; N_TUPLES (parameter)
// tuples are fed one per clock.
`timescale 1ns/1ps
module testbench;
  parameter N_TUPLES = 1;
  reg clk = 1'b0;
  reg rst = 1'b1;
  reg in_valid = 1'b0;
  reg [{w - 1}:0] in_tuple = {w}'d0;
  reg [{w - 1}:0] memory [0:N_TUPLES-1];
  reg [8*1024-1:0] tuples_file;
  reg [8*1024-1:0] reports_file;
  integer out;
  integer i;
  wire report_valid;
  wire [15:0] report_query;
  wire [{shape.pid_bits - 1}:0] report_pid;
  wire [{shape.seq_bits - 1}:0] report_seq;
  wire [{shape.seq_bits - 1}:0] report_start;
  wire [31:0] tuples;
  wire [31:0] discarded;
  wire [31:0] expired;

  cep_circuit dut (
    .clk(clk), .rst(rst), .in_valid(in_valid), .in_tuple(in_tuple),
    .report_valid(report_valid), .report_query(report_query), .report_pid(report_pid),
    .report_seq(report_seq), .report_start(report_start), .tuples(tuples),
    .discarded(discarded), .expired(expired));

  always #5 clk = ~clk;

  always @(negedge clk)
    if (!rst && report_valid)
      $fdisplay(out, "match %0d %0d %0d %0d", report_query, report_pid, report_seq,
                report_start);

  initial begin
    if (!$value$plusargs("tuples=%s", tuples_file)) begin
      $display("testbench: +tuples=FILE is missing");
      $finish;
    end
    if (!$value$plusargs("reports=%s", reports_file)) begin
      $display("testbench: +reports=FILE is missing");
      $finish;
    end
    $readmemh(tuples_file, memory);
    out = $fopen(reports_file, "w");
    repeat (2) @(negedge clk);
    rst = 1'b0;
    for (i = 0; i < N_TUPLES; i = i + 1) begin
      in_valid = 1'b1;
      in_tuple = memory[i];
      @(negedge clk);
    end
    in_valid = 1'b0;
    repeat ({drain}) @(negedge clk);
    $fdisplay(out, "counts %0d %0d %0d", tuples, discarded, expired);
    $fclose(out);
    $finish;
  end
endmodule
"""


def partitioner_shape(plan: FpgaPlan, config: CircuitConfig) -> PartitionerShape:
    layout = plan.layout
    return PartitionerShape(
        elements=config.elements, positions=plan.positions,
        pid_bits=layout.field("partition").width, seq_bits=layout.field("seq").width,
        timer_bits=config.timer_bits, tick_tuples=config.tick_tuples)


def circuit_verilog(plan: FpgaPlan, config: CircuitConfig | None = None) -> tuple[str, str]:
    """(synthesizable circuit, testbench) as Verilog text."""
    config = config or CircuitConfig()
    shape = partitioner_shape(plan, config)
    circuit = "\n".join([
        "// Generated by `cep fpga hdl` from the compiled FPGA plan (accel/fpga/hdl.py).",
        decoder_verilog(plan),
        nfa_verilog(plan.automaton, "nfa_update", shape.seq_bits),
        partitioner_verilog(shape, "stream_partitioner", "nfa_update"),
        top_verilog(plan, shape)])
    return circuit, testbench_verilog(plan, shape)


def write_hdl(plan: FpgaPlan, out_dir: str | Path,
              config: CircuitConfig | None = None) -> CircuitFiles:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    circuit, testbench = circuit_verilog(plan, config)
    files = CircuitFiles(out / FILES[0], out / FILES[1])
    files.circuit.write_text(circuit)
    files.testbench.write_text(testbench)
    return files


def tuples_hex(rows: ArrayLike) -> str:
    """Packed tuples (uint8 rows) as `$readmemh` lines: each row a little-endian number."""
    rows = np.asarray(rows, dtype=np.uint8)
    if not len(rows):
        return ""
    digits = np.ascontiguousarray(rows[:, ::-1]).tobytes().hex()
    width = 2 * rows.shape[1]
    return "".join(digits[i:i + width] + "\n" for i in range(0, len(digits), width))
