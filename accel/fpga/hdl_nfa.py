"""Verilog of the NFA update: the paper's wiring algorithm with earliest starts.

One flip-flop per Glushkov position holds the state bit (the flip-flops live in the
partitioner's elements, one state vector per partition); this combinational module is the
wiring between them. Position j becomes active when its predicate holds (`enabled[j]`) and
it is a first position or one of its predecessors (positions q with j in follow(q)) is
active. Beside each state bit a seq register holds the earliest start of the partial match
in that state: the new start of j is the earliest start among its active predecessors, or
this tuple's seq for a first position with none. Starts are compared as *ages*
(`seq - start`, modulo 2**seq_bits), as the emulator does, so seq wraparound is harmless.

A match is reported when an accepting position becomes active, with the earliest start
among them (the longest match); then every state bit is cleared (non-overlapping matches).
This is the software engine's MATCH semantics for predicates without aggregates
(docs/semantics.md, MATCH; `cep_core.engine.match`).
"""

from __future__ import annotations

from cep_core.compiler.match import Automaton

NONE = "1'b0"


def nfa_verilog(automaton: Automaton, module: str, seq_bits: int = 32) -> str:
    n, w = automaton.size, seq_bits
    if n < 1:
        raise ValueError("the NFA needs at least one position")
    lines = [
        f"// NFA update: {n} positions (Glushkov), earliest start per position.",
        f"module {module} (",
        f"  input wire [{w - 1}:0] seq,",
        f"  input wire [{n - 1}:0] enabled,",
        f"  input wire [{n - 1}:0] state,",
        f"  input wire [{n * w - 1}:0] start,",
        f"  output wire [{n - 1}:0] next_state,",
        f"  output wire [{n * w - 1}:0] next_start,",
        "  output wire accept,",
        f"  output wire [{w - 1}:0] match_start",
        ");",
    ]
    for q in range(n):
        lines.append(f"  wire [{w - 1}:0] age{q} = seq - start[{q * w} +: {w}];")
    for j in range(n):
        preds = [q for q in range(n) if automaton.follow[q] >> j & 1]
        sources = [f"state[{q}]" for q in preds]
        if automaton.first >> j & 1:
            sources.append("1'b1")
        reach = " | ".join(sources) if sources else NONE
        lines.append(f"  wire reach{j} = enabled[{j}] & ({reach});")
        # Oldest age among the active predecessors (0: a match starting at this tuple).
        previous = f"{w}'d0"
        for number, q in enumerate(preds):
            lines.append(f"  wire [{w - 1}:0] best{j}_{number} = state[{q}] && age{q} > "
                         f"{previous} ? age{q} : {previous};")
            previous = f"best{j}_{number}"
        lines.append(f"  wire [{w - 1}:0] best{j} = {previous};")
    accepting = [j for j in range(n) if automaton.last >> j & 1]
    hits = [f"reach{j}" for j in accepting]
    lines.append(f"  assign accept = {' | '.join(hits) if hits else NONE};")
    previous = f"{w}'d0"
    for j in accepting:
        lines.append(f"  wire [{w - 1}:0] win{j} = reach{j} && best{j} > {previous} ? "
                     f"best{j} : {previous};")
        previous = f"win{j}"
    lines.append(f"  assign match_start = seq - {previous};")
    bits = ", ".join(f"reach{j}" for j in reversed(range(n)))
    lines.append(f"  assign next_state = accept ? {n}'d0 : {{{bits}}};")
    starts = ", ".join(f"seq - best{j}" for j in reversed(range(n)))
    lines.append(f"  assign next_start = {{{starts}}};")
    lines += ["endmodule", ""]
    return "\n".join(lines)
