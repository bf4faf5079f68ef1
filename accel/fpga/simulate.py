"""Runs the generated circuit in Icarus Verilog (iverilog + vvp) on packed tuples.

`simulate(plan, rows, config)` writes the circuit and testbench (`cep_accel.fpga.hdl`) and the
tuples as a hex file into a temporary directory, compiles and runs them, and parses the
testbench's report file into the records the emulator returns (`Circuit.run`): an (n, 3)
int64 array of (partition, seq, start seq), plus the circuit's counters.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cep_accel.fpga.hdl import tuples_hex, write_hdl
from cep_accel.fpga.plan import CircuitConfig, FpgaPlan
from cep_accel.fpga.verify import DeviceInput, DeviceRun, register_device_leg

SIMULATORS = ("iverilog", "vvp")


class SimulatorMissing(RuntimeError):
    """Icarus Verilog is not installed."""


class SimulationFailed(RuntimeError):
    """iverilog or vvp failed, or the testbench wrote something unexpected."""


@dataclass
class SimulationResult:
    records: np.ndarray  # (n, 3) int64: partition, seq, start seq
    query_ids: np.ndarray  # (n,) the query id of each report
    counts: dict  # tuples, discarded, expired


def require_simulator() -> None:
    missing = [tool for tool in SIMULATORS if shutil.which(tool) is None]
    if missing:
        raise SimulatorMissing(
            f"{' and '.join(missing)} not found: install Icarus Verilog "
            "(`apt-get install iverilog`, or `make sysdeps`)")


def simulate(plan: FpgaPlan, rows: np.ndarray, config: CircuitConfig | None = None,
             timeout: float = 600.0) -> SimulationResult:
    """The circuit's match reports and counters for packed tuples (uint8 rows)."""
    require_simulator()
    rows = np.asarray(rows, dtype=np.uint8)
    if not len(rows):
        return SimulationResult(np.zeros((0, 3), np.int64), np.zeros(0, np.int64),
                                {"tuples": 0, "discarded": 0, "expired": 0})
    with tempfile.TemporaryDirectory(prefix="cep-hdl-") as tmp:
        work = Path(tmp)
        files = write_hdl(plan, work, config)
        (work / "tuples.hex").write_text(tuples_hex(rows))
        _run(["iverilog", "-g2005", "-o", str(work / "sim"),
              f"-Ptestbench.N_TUPLES={len(rows)}", str(files.circuit),
              str(files.testbench)], timeout)
        _run(["vvp", "-n", str(work / "sim"), f"+tuples={work / 'tuples.hex'}",
              f"+reports={work / 'reports.txt'}"], timeout)
        report_file = work / "reports.txt"
        if not report_file.exists():
            raise SimulationFailed("the testbench wrote no report file")
        return parse_reports(report_file.read_text())


def _run(command: list[str], timeout: float) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SimulationFailed(f"{command[0]} failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}")


def parse_reports(text: str) -> SimulationResult:
    """The testbench's lines: `match QUERY PARTITION SEQ START` and one `counts ...`."""
    matches: list[tuple[int, int, int, int]] = []
    counts = None
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if len(parts) == 5 and parts[0] == "match":
            query, partition, seq, start = map(int, parts[1:])
            matches.append((query, partition, seq, start))
        elif len(parts) == 4 and parts[0] == "counts":
            counts = dict(zip(("tuples", "discarded", "expired"), map(int, parts[1:])))
        else:
            raise SimulationFailed(f"report line {number} is not understood: {line!r}")
    if counts is None:
        raise SimulationFailed("the testbench did not finish (no counts line)")
    table = np.array(matches, dtype=np.int64).reshape(-1, 4)
    return SimulationResult(table[:, 1:].copy(), table[:, 0].copy(), counts)


def _hdl_leg(data: DeviceInput) -> DeviceRun:
    """The device leg of `cep fpga verify` (`cep_accel.fpga.verify`): the HDL simulation."""
    result = simulate(data.plan, data.rows, data.config)
    return DeviceRun(result.records, result.counts["discarded"])


register_device_leg("hdl simulation (iverilog)", _hdl_leg)
