"""Verilog of the pipelined stream partitioner (docs/fpga.md, "HDL and resources").

K elements each hold one partition's NFA state: valid bit, partition id, the one-hot state
vector, an earliest-start seq per state and an idle timer. A tuple walks a K-stage pipeline
beside the elements; stage i compares the tuple's partition id with element i only (one
comparator per stage: the clock does not slow down as K grows) and the tuple carries what it
found (hit, element index). Behind the last stage the *write-back stage* does, for one tuple
per clock and in tuple order, what the emulator (`cep_accel.fpga.emulator`) does per tuple:

1. timer tick: every `tick` tuples each valid element's timer counts down; at 0 it is freed;
2. the carried hit is checked against the element (it may have been freed since); without a
   hit the tuple takes the lowest free element, and with none free it is discarded and
   counted (no NFA step, no report);
3. the NFA update (`nfa_module`, combinational) on the element's state;
4. the new state is written back with the timer full, or the element freed when no state is
   left (after a match every partial match is dropped).

Hazards: a tuple that passed element j before a tuple of the same partition ahead of it was
given element j would miss it; so every allocation is broadcast to the tuples in flight
(one more comparator per stage), which take it as their hit. Frees need no broadcast: the
write-back stage re-checks every hit. Together every tuple sees its partition's state as
left by the tuple of that partition before it, with a new tuple accepted every clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PartitionerShape:
    elements: int
    positions: int
    pid_bits: int = 32
    seq_bits: int = 32
    timer_bits: int = 4
    tick_tuples: int = 4096

    def __post_init__(self) -> None:
        if self.elements < 1 or self.positions < 1:
            raise ValueError("the partitioner needs at least one element and one position")
        if self.timer_bits < 1 or self.tick_tuples < 1:
            raise ValueError("timer_bits and tick_tuples must be positive")

    @property
    def index_bits(self) -> int:
        return max(1, (self.elements - 1).bit_length())


def partitioner_verilog(shape: PartitionerShape, module: str, nfa_module: str) -> str:
    k, n, pid, seq = shape.elements, shape.positions, shape.pid_bits, shape.seq_bits
    idx, tb = shape.index_bits, shape.timer_bits
    tick_bits = max(1, (shape.tick_tuples - 1).bit_length())
    st = n * seq
    return f"""\
// Stream partitioner: {k} elements, {n} NFA positions, {pid}-bit partition ids.
module {module} (
  input wire clk,
  input wire rst,
  input wire in_valid,
  input wire [{pid - 1}:0] in_pid,
  input wire [{seq - 1}:0] in_seq,
  input wire [{n - 1}:0] in_enabled,
  output reg report_valid,
  output reg [{pid - 1}:0] report_pid,
  output reg [{seq - 1}:0] report_seq,
  output reg [{seq - 1}:0] report_start,
  output reg [31:0] tuples,
  output reg [31:0] discarded,
  output reg [31:0] expired
);
  localparam K = {k};
  localparam TIMER_FULL = {(1 << tb) - 1};

  // The elements' registers live in `element[g]`; element g puts its live bit, partition
  // id, state and starts on `element[g].word` when the write-back stage's tuple carries index g
  // (zero otherwise), and the read port ORs the words (a one-hot multiplexer).
  localparam W = {1 + pid + n + st};

  // ---- write-back stage (combinational), on the tuple in `stage[K]`
  wire wb_valid = stage[K].valid;
  wire [{pid - 1}:0] wb_pid = stage[K].pid;
  wire [{seq - 1}:0] wb_seq = stage[K].seq;
  wire [{n - 1}:0] wb_enabled = stage[K].enabled;
  wire [{idx - 1}:0] wb_index = stage[K].index;

  reg [{tick_bits - 1}:0] tick_phase;
  wire tick = wb_valid && tick_phase == {tick_bits}'d{shape.tick_tuples - 1};

{_or_tree(k, "W", "read")}
  wire read_live = read[W-1];
  wire [{pid - 1}:0] read_pid = read[{n + st} +: {pid}];
  wire hit = stage[K].hit && read_live && read_pid == wb_pid;
  // The lowest free element.
{_free_tree(k, idx)}
  // Elements expiring at this tick.
{_count_tree(k, "expire_count")}
  wire [{idx - 1}:0] target = hit ? wb_index : free_index;
  wire fire = wb_valid && (hit || any_free);
  wire discard = wb_valid && !hit && !any_free;

  wire [{n - 1}:0] cur_state = hit ? read[{st} +: {n}] : {n}'d0;
  wire [{st - 1}:0] cur_start = hit ? read[0 +: {st}] : {st}'d0;
  wire [{n - 1}:0] next_state;
  wire [{st - 1}:0] next_start;
  wire accept;
  wire [{seq - 1}:0] match_start;
  {nfa_module} nfa (
    .seq(wb_seq), .enabled(wb_enabled), .state(cur_state), .start(cur_start),
    .next_state(next_state), .next_start(next_start), .accept(accept),
    .match_start(match_start));

  wire keep = fire && next_state != {n}'d0;
  wire allocate = keep && !hit;
  wire release_target = fire && hit && next_state == {n}'d0;

  always @(posedge clk) begin
    if (rst) begin
      tick_phase <= 0;
      tuples <= 0;
      discarded <= 0;
      expired <= 0;
      report_valid <= 1'b0;
    end else begin
      if (wb_valid) begin
        tick_phase <= tick ? {tick_bits}'d0 : tick_phase + 1'b1;
        tuples <= tuples + 1;
      end
      discarded <= discarded + discard;
      expired <= expired + expire_count;
      report_valid <= fire && accept;
      report_pid <= wb_pid;
      report_seq <= wb_seq;
      report_start <= match_start;
    end
  end

  genvar g;
  generate
    for (g = 0; g < K; g = g + 1) begin : element
      reg valid;
      reg [{pid - 1}:0] pid;
      reg [{n - 1}:0] state;
      reg [{st - 1}:0] start;
      reg [{tb - 1}:0] timer;
      wire expire = tick && valid && timer <= {tb}'d1;
      wire live = valid && !expire;
      wire [W-1:0] word = wb_index == g ? {{live, pid, state, start}} : {{W{{1'b0}}}};
      wire write = keep && target == g;
      always @(posedge clk) begin
        if (rst) begin
          valid <= 1'b0;
        end else if (write) begin
          valid <= 1'b1;
          pid <= wb_pid;
          state <= next_state;
          start <= next_start;
          timer <= TIMER_FULL;
        end else if (expire || (release_target && target == g)) begin
          valid <= 1'b0;
        end else if (tick && valid) begin
          timer <= timer - 1'b1;
        end
      end
    end

    for (g = 0; g <= K; g = g + 1) begin : stage
      // The tuple about to be compared with element g (stage K: the write-back stage).
      reg valid;
      reg hit;
      reg [{pid - 1}:0] pid;
      reg [{seq - 1}:0] seq;
      reg [{n - 1}:0] enabled;
      reg [{idx - 1}:0] index;
      // What enters: the input (g = 0), or stage g - 1 after its comparison with element
      // g - 1; an allocation for the tuple's partition in this clock overrides both.
      wire v, h;
      wire [{pid - 1}:0] id;
      wire [{seq - 1}:0] s;
      wire [{n - 1}:0] en;
      wire [{idx - 1}:0] ix;
      if (g == 0) begin : source
        assign v = in_valid;
        assign id = in_pid;
        assign s = in_seq;
        assign en = in_enabled;
        assign h = 1'b0;
        assign ix = {idx}'d0;
      end else begin : source
        wire seen = element[g-1].valid && element[g-1].pid == stage[g-1].pid;
        assign v = stage[g-1].valid;
        assign id = stage[g-1].pid;
        assign s = stage[g-1].seq;
        assign en = stage[g-1].enabled;
        assign h = seen || stage[g-1].hit;
        assign ix = seen ? g - 1 : stage[g-1].index;
      end
      wire snoop = allocate && id == wb_pid;
      always @(posedge clk) begin
        if (rst) begin
          valid <= 1'b0;
          hit <= 1'b0;
        end else begin
          valid <= v;
          pid <= id;
          seq <= s;
          enabled <= en;
          hit <= h || snoop;
          index <= snoop ? free_index : ix;
        end
      end
    end
  endgenerate
endmodule
"""


def _free_tree(k: int, idx: int) -> str:
    """Wires `any_free` and `free_index`: the lowest element not live, as a binary tree of
    (any, index) nodes (log depth, and quick to simulate)."""
    lines = []
    level = [(f"!element[{e}].live", f"{idx}'d{e}") for e in range(k)]
    depth = 0
    while len(level) > 1:
        nxt = []
        for pair in range(0, len(level), 2):
            if pair + 1 == len(level):
                nxt.append(level[pair])
                continue
            (a_any, a_ix), (b_any, b_ix) = level[pair], level[pair + 1]
            name = f"free{depth}_{pair // 2}"
            lines.append(f"  wire {name}_any = {a_any} || {b_any};")
            lines.append(f"  wire [{idx - 1}:0] {name}_ix = {a_any} ? {a_ix} : {b_ix};")
            nxt.append((f"{name}_any", f"{name}_ix"))
        level = nxt
        depth += 1
    any_free, free_index = level[0]
    lines.append(f"  wire any_free = {any_free};")
    lines.append(f"  wire [{idx - 1}:0] free_index = {free_index};")
    return "\n".join(lines)


def _or_tree(k: int, width: str, out: str) -> str:
    """`out`: the OR of the elements' words (`width` bits), as a binary tree."""
    lines = []
    level = [f"element[{e}].word" for e in range(k)]
    depth = 0
    while len(level) > 1:
        nxt = []
        for pair in range(0, len(level) - 1, 2):
            name = f"{out}{depth}_{pair // 2}"
            # Deliberately like the adder tree below: an OR tree of equal widths, the other a sum
            # whose widths grow
            lines.append(f"  wire [{width}-1:0] {name} = {level[pair]} | {level[pair + 1]};")
            nxt.append(name)
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
        depth += 1
    lines.append(f"  wire [{width}-1:0] {out} = {level[0]};")
    return "\n".join(lines)


def _count_tree(k: int, out: str) -> str:
    """`out` (32 bits): how many elements expire, as an adder tree whose widths grow by one
    bit a level."""
    lines = []
    level = [(f"element[{e}].expire", 1) for e in range(k)]
    depth = 0
    while len(level) > 1:
        nxt = []
        for pair in range(0, len(level) - 1, 2):
            (a, wa), (b, wb) = level[pair], level[pair + 1]
            width = max(wa, wb) + 1
            name = f"{out}{depth}_{pair // 2}"
            # Deliberately like the OR tree above: a sum whose widths grow, the other of equal
            # widths
            lines.append(f"  wire [{width - 1}:0] {name} = {a} + {b};")
            nxt.append((name, width))
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
        depth += 1
    lines.append(f"  wire [31:0] {out} = {level[0][0]};")
    return "\n".join(lines)
