"""`cep fpga resources`: LUT and flip-flop counts from Yosys, the paper's Figures 4 and 9.

- Figure 4: the NFA (one flip-flop per state, `hdl_automata.nfa_verilog`) against the
  equivalent DFA from the powerset construction, one-hot and binary encoded, for
  `(0|1)*1(0|1)^i`, i = 1..10. The NFA grows linearly in i, the DFA's states as 2**(i+1).
- Figure 9: the stream partitioner (`hdl_partitioner`) for depths (elements) 100..800,
  with the NFA update of `A B` (two positions, 32-bit partition ids and start seqs).

Synthesis: `yosys` with `synth -flatten -lut 6` (generic 6-input LUTs, the LUT size of the
paper's Virtex-5) and `-nofsm` (keeps each DFA's encoding as written). LUTs are `$lut`
cells, flip-flops every `DFF` cell.
"""

from __future__ import annotations

# Deferred imports: matplotlib (the `fpga` extra, may be missing) loads only when a chart is drawn.

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cep_accel.fpga.hdl_automata import (
    DfaEncoding,
    binary_automaton,
    dfa_verilog,
    nfa_verilog,
    powerset,
)
from cep_accel.fpga.hdl_nfa import nfa_verilog as nfa_update_verilog
from cep_accel.fpga.hdl_partitioner import PartitionerShape, partitioner_verilog
from cep_core import ast
from cep_core.compiler.match import glushkov

DEFAULT_I = tuple(range(1, 11))
DEFAULT_DEPTHS = tuple(range(100, 801, 100))
_CELL = re.compile(r"^\s+(\S+)\s+(\d+)\s*$")


class YosysMissing(RuntimeError):
    """Yosys is not installed."""


class SynthesisFailed(RuntimeError):
    """Yosys failed or printed no statistics."""


# Deliberately like accel/fpga/plan.py Symbol and cep_core/reference/seq.py _Pending in shape
# only: dataclass fields
@dataclass(frozen=True)
class Resources:
    luts: int
    flip_flops: int
    seconds: float


@dataclass(frozen=True)
class Row:
    """One synthesized circuit: `experiment` ("automaton" or "partitioner"), `circuit`
    ("nfa", "dfa-onehot", "dfa-binary", "partitioner"), `size` (i or depth), `states`
    (automaton states; 0 for partitioners) and what Yosys counted."""

    experiment: str
    circuit: str
    size: int
    states: int
    resources: Resources


def require_yosys() -> None:
    if shutil.which("yosys") is None:
        raise YosysMissing("yosys not found: install it (`apt-get install yosys`, or "
                           "`make sysdeps`)")


def synthesize(verilog: str, top: str, timeout: float = 3600.0) -> Resources:
    """LUTs and flip-flops of module `top` of the Verilog text."""
    require_yosys()
    with tempfile.TemporaryDirectory(prefix="cep-yosys-") as tmp:
        source = Path(tmp) / "design.v"
        stats = Path(tmp) / "stat.txt"
        source.write_text(verilog)
        script = (f"read_verilog {source}; synth -flatten -nofsm -lut 6 -top {top}; "
                  f"tee -q -o {stats} stat")
        began = time.perf_counter()
        done = subprocess.run(["yosys", "-q", "-p", script], capture_output=True, text=True,
                              timeout=timeout)
        seconds = time.perf_counter() - began
        if done.returncode != 0 or not stats.exists():
            raise SynthesisFailed(f"yosys failed on {top} ({done.returncode}):\n"
                                  f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return parse_stat(stats.read_text(), seconds)


def parse_stat(text: str, seconds: float = 0.0) -> Resources:
    """Counts from Yosys' `stat`: `$lut` cells and every flip-flop cell type."""
    luts = flip_flops = 0
    found = False
    for line in text.splitlines():
        if "Number of cells" in line:
            found = True
        match = _CELL.match(line)
        if not match:
            continue
        cell, count = match.group(1), int(match.group(2))
        if cell == "$lut":
            luts += count
        elif "DFF" in cell.upper():
            flip_flops += count
    if not found:
        raise SynthesisFailed("yosys printed no cell statistics")
    return Resources(luts, flip_flops, seconds)


def automaton_rows(values: Iterable[int] = DEFAULT_I,
                   progress: Callable[[Row], object] | None = None) -> list[Row]:
    """Figure 4: NFA vs powerset DFA (one-hot, binary) of (0|1)*1(0|1)^i."""
    rows = []
    for i in values:
        automaton = binary_automaton(i)
        dfa = powerset(automaton)
        designs = [("nfa", automaton.size + 1, nfa_verilog(automaton, "nfa")),
                   ("dfa-onehot", len(dfa.subsets), dfa_verilog(dfa, "dfa", DfaEncoding.ONEHOT)),
                   ("dfa-binary", len(dfa.subsets), dfa_verilog(dfa, "dfa", DfaEncoding.BINARY))]
        for circuit, states, text in designs:
            row = Row("automaton", circuit, i, states,
                      synthesize(text, "nfa" if circuit == "nfa" else "dfa"))
            rows.append(row)
            if progress:
                progress(row)
    return rows


def partitioner_design(depth: int) -> str:
    """The partitioner of `depth` elements with the NFA update of `A B`."""
    automaton = glushkov(ast.RCat([ast.RSym("a"), ast.RSym("b")]))
    shape = PartitionerShape(elements=depth, positions=automaton.size)
    return (nfa_update_verilog(automaton, "nfa_update", shape.seq_bits) +
            partitioner_verilog(shape, "stream_partitioner", "nfa_update"))


def partitioner_rows(depths: Iterable[int] = DEFAULT_DEPTHS,
                     progress: Callable[[Row], object] | None = None) -> list[Row]:
    """Figure 9: the stream partitioner's resources against its depth."""
    rows = []
    for depth in depths:
        row = Row("partitioner", "partitioner", depth, 0,
                  synthesize(partitioner_design(depth), "stream_partitioner"))
        rows.append(row)
        if progress:
            progress(row)
    return rows


def format_table(rows: list[Row]) -> str:
    lines = []
    automata = [r for r in rows if r.experiment == "automaton"]
    if automata:
        lines += ["(0|1)*1(0|1)^i: NFA vs powerset DFA (6-input LUTs, flip-flops)",
                  f"{'i':>3} {'NFA states':>10} {'NFA LUT':>8} {'NFA FF':>7} "
                  f"{'DFA states':>10} {'1hot LUT':>9} {'1hot FF':>8} {'bin LUT':>8} "
                  f"{'bin FF':>7}"]
        by = {(r.circuit, r.size): r for r in automata}
        for i in sorted({r.size for r in automata}):
            nfa, hot, binary = (by.get((c, i)) for c in ("nfa", "dfa-onehot", "dfa-binary"))
            lines.append(
                f"{i:>3} {_n(nfa, 'states'):>10} {_n(nfa, 'luts'):>8} {_n(nfa, 'ffs'):>7} "
                f"{_n(hot, 'states'):>10} {_n(hot, 'luts'):>9} {_n(hot, 'ffs'):>8} "
                f"{_n(binary, 'luts'):>8} {_n(binary, 'ffs'):>7}")
    parts = [r for r in rows if r.experiment == "partitioner"]
    if parts:
        if lines:
            lines.append("")
        lines += ["stream partitioner (A B, 32-bit ids and seqs): resources vs depth",
                  f"{'depth':>6} {'LUTs':>8} {'FFs':>8} {'LUT/elem':>9} {'FF/elem':>8} "
                  f"{'yosys s':>8}"]
        for r in sorted(parts, key=lambda r: r.size):
            res = r.resources
            lines.append(f"{r.size:>6} {res.luts:>8} {res.flip_flops:>8} "
                         f"{res.luts / r.size:>9.1f} {res.flip_flops / r.size:>8.1f} "
                         f"{res.seconds:>8.1f}")
    return "\n".join(lines)


def _n(row: Row | None, what: str) -> str:
    if row is None:
        return "-"
    return str({"states": row.states, "luts": row.resources.luts,
                "ffs": row.resources.flip_flops}[what])


def plot(rows: list[Row], path: str | Path) -> Path:
    """Both figures side by side as a PNG (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for circuit, color in (("nfa", "C0"), ("dfa-onehot", "C1"), ("dfa-binary", "C2")):
        points = sorted((r.size, r.resources) for r in rows if r.circuit == circuit)
        if points:
            sizes = [p[0] for p in points]
            left.plot(sizes, [max(1, p[1].luts) for p in points], "o-", color=color,
                      label=f"{circuit} LUTs")
            left.plot(sizes, [max(1, p[1].flip_flops) for p in points], "s--", color=color,
                      label=f"{circuit} FFs")
    left.set_yscale("log")
    left.set_xlabel("i in (0|1)*1(0|1)^i")
    left.set_ylabel("count")
    left.set_title("NFA vs powerset DFA (Figure 4)")
    left.legend(fontsize=7)
    points = sorted((r.size, r.resources) for r in rows if r.experiment == "partitioner")
    if points:
        right.plot([p[0] for p in points], [p[1].luts for p in points], "o-", label="LUTs")
        right.plot([p[0] for p in points], [p[1].flip_flops for p in points], "s--",
                   label="flip-flops")
    right.set_xlabel("partitioner depth (elements)")
    right.set_title("stream partitioner (Figure 9)")
    right.legend(fontsize=7)
    figure.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out
