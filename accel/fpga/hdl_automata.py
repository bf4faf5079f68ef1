"""Recognizer circuits for the resource experiment (the paper's Figure 4).

The language is `(0|1)*1(0|1)^i` over one input bit per clock: "the bit i clocks ago was 1".
Three circuits recognize it, all with the same ports (`clk`, `rst`, `x`, `match`):

- the NFA by the paper's wiring algorithm: one flip-flop per Glushkov state, the state's
  input is its predicate ANDed with the OR of its predecessors (`nfa_verilog`);
- the equivalent DFA by the powerset construction, one-hot (one flip-flop per DFA state)
  or binary encoded (ceil(log2 states) flip-flops and a transition table)
  (`dfa_verilog`).

The automata are built from the regex AST (`cep_core.regex_analysis`), with `.` standing for
`(0|1)` and a predicate `one` for the input bit being 1 (`zero` for 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from cep_core import ast
from cep_core.compiler.match import Automaton, glushkov

BIT_PREDICATES = {"zero": "~x", "one": "x"}


def binary_pattern(i: int) -> ast.Regex:
    """`(0|1)* 1 (0|1)^i`."""
    if i < 0:
        raise ValueError("i must be at least 0")
    items: list[ast.Regex] = [ast.RRepeat(ast.RAny(), 0, None), ast.RSym("one")]
    return ast.RCat(items + [ast.RAny() for _ in range(i)])


def binary_automaton(i: int) -> Automaton:
    return glushkov(binary_pattern(i))


def _any(terms: list[str]) -> str:
    return " | ".join(terms) if terms else "1'b0"


def _holds(automaton: Automaton, position: int, bit: int) -> bool:
    label = automaton.labels[position]
    if label < 0:
        return True
    return {"zero": bit == 0, "one": bit == 1}[automaton.names[label]]


def _literal(automaton: Automaton, position: int) -> str:
    label = automaton.labels[position]
    return "1'b1" if label < 0 else BIT_PREDICATES[automaton.names[label]]


def nfa_verilog(automaton: Automaton, module: str) -> str:
    """One flip-flop per position plus a start flip-flop (set only by reset)."""
    n = automaton.size
    lines = [f"module {module} (input wire clk, input wire rst, input wire x,",
             "    output wire match);",
             "  reg start;",
             f"  reg [{n - 1}:0] s;",
             "  always @(posedge clk) begin",
             "    if (rst) begin",
             "      start <= 1'b1;",
             f"      s <= {n}'d0;",
             "    end else begin",
             "      start <= 1'b0;"]
    for p in range(n):
        sources = [f"s[{q}]" for q in range(n) if automaton.follow[q] >> p & 1]
        if automaton.first >> p & 1:
            sources.append("start")
        enabled = _any(sources)
        lines.append(f"      s[{p}] <= ({_literal(automaton, p)}) & ({enabled});")
    accepting = [f"s[{p}]" for p in range(n) if automaton.last >> p & 1]
    lines += ["    end", "  end",
              f"  assign match = {_any(accepting)};",
              "endmodule", ""]
    return "\n".join(lines)


@dataclass
class Dfa:
    """States are sets of NFA positions (bit masks); `start` is state 0; `delta[d][bit]`."""

    subsets: list[int]
    delta: list[tuple[int, int]]
    accepting: list[bool]


def powerset(automaton: Automaton) -> Dfa:
    """The DFA of the reachable subsets; state 0 is the start state (no position yet)."""
    start = -1  # stands for {start state}; never a real subset of positions
    index = {start: 0}
    subsets = [start]
    delta: list[tuple[int, int]] = []
    todo = 0
    while todo < len(subsets):
        current = subsets[todo]
        todo += 1
        moves = []
        for bit in (0, 1):
            if current == start:
                reach = automaton.first
            else:
                reach = 0
                for q in range(automaton.size):
                    if current >> q & 1:
                        reach |= automaton.follow[q]
            target = sum(1 << p for p in range(automaton.size)
                         if reach >> p & 1 and _holds(automaton, p, bit))
            if target not in index:
                index[target] = len(subsets)
                subsets.append(target)
            moves.append(index[target])
        delta.append((moves[0], moves[1]))
    accepting = [s != start and s & automaton.last != 0 for s in subsets]
    return Dfa(subsets, delta, accepting)


class DfaEncoding(StrEnum):
    """How `dfa_verilog` encodes the DFA's state: a flip-flop per state, or a state number."""

    ONEHOT = "onehot"
    BINARY = "binary"


def dfa_verilog(dfa: Dfa, module: str, encoding: str) -> str:
    try:
        chosen = DfaEncoding(encoding)
    except ValueError:
        raise ValueError(f"unknown DFA encoding {encoding!r} (onehot or binary)") from None
    if chosen is DfaEncoding.ONEHOT:
        return _dfa_onehot(dfa, module)
    return _dfa_binary(dfa, module)


def _dfa_onehot(dfa: Dfa, module: str) -> str:
    n = len(dfa.subsets)
    lines = [f"module {module} (input wire clk, input wire rst, input wire x,",
             "    output wire match);",
             f"  reg [{n - 1}:0] s;",
             "  always @(posedge clk) begin",
             "    if (rst) begin",
             f"      s <= {n}'d1;",
             "    end else begin"]
    for d in range(n):
        terms = []
        for src, (on0, on1) in enumerate(dfa.delta):
            if on0 == d and on1 == d:
                terms.append(f"s[{src}]")
            elif on0 == d:
                terms.append(f"(s[{src}] & ~x)")
            elif on1 == d:
                terms.append(f"(s[{src}] & x)")
        lines.append(f"      s[{d}] <= {_any(terms)};")
    accepting = [f"s[{d}]" for d in range(n) if dfa.accepting[d]]
    lines += ["    end", "  end",
              f"  assign match = {_any(accepting)};",
              "endmodule", ""]
    return "\n".join(lines)


def _dfa_binary(dfa: Dfa, module: str) -> str:
    n = len(dfa.subsets)
    width = max(1, (n - 1).bit_length())
    lines = [f"module {module} (input wire clk, input wire rst, input wire x,",
             "    output reg match);",
             f"  reg [{width - 1}:0] s;",
             f"  reg [{width - 1}:0] next;",
             "  always @(*) begin",
             "    case (s)"]
    for d, (on0, on1) in enumerate(dfa.delta):
        lines.append(f"      {width}'d{d}: next = x ? {width}'d{on1} : {width}'d{on0};")
    lines += [f"      default: next = {width}'d0;", "    endcase",
              "    case (s)"]
    accepting = [f"{width}'d{d}" for d in range(n) if dfa.accepting[d]]
    if accepting:
        lines.append(f"      {', '.join(accepting)}: match = 1'b1;")
    lines += ["      default: match = 1'b0;", "    endcase", "  end",
              "  always @(posedge clk) begin",
              f"    if (rst) s <= {width}'d0;",
              "    else s <= next;",
              "  end",
              "endmodule", ""]
    return "\n".join(lines)
