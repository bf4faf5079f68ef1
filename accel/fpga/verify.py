"""`cep fpga verify`: one stream through every path of the FPGA adapter, compared.

- *reference*: `cep_core.reference.run` (the oracle), composite events;
- *udp*: the adapter streams the events over loopback UDP to an `EmulatorServer` (in a
  thread) and rebuilds composite events from its reports; they must equal the reference's
  whenever the device discarded and expired nothing (else the reference does not apply:
  the device lost partial matches by design, and verify says so and fails);
- *device legs*: functions from the tuples the adapter sent to the device's match records
  and discard count. The emulator run from a buffer is one; the HDL simulation registers
  another (`register_device_leg`, from a module named in `LEG_MODULES`). Every device leg
  must give the same records and counts as the emulator over UDP.
"""

from __future__ import annotations

import importlib
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from cep_accel.fpga import wire
from cep_accel.fpga.adapter import FpgaAdapter
from cep_accel.fpga.emulator import Circuit, EmulatorServer
from cep_accel.fpga.plan import CircuitConfig, FpgaPlan, compile_fpga
from cep_core import reference
from cep_core.batch import StringDictionary
from cep_core.checked import CheckedQuery
from cep_core.events import Event


@dataclass
class DeviceInput:
    """What a device leg runs: the plan, the circuit parameters and the packed tuples the
    adapter sent (uint8 rows, wire seqs from 0, dense partition ids), in order."""

    plan: FpgaPlan
    config: CircuitConfig
    rows: np.ndarray


@dataclass
class DeviceRun:
    """A device leg's result: match records as an (n, 3) int64 array of (partition, seq,
    start seq), in report order, and the number of tuples discarded."""

    records: np.ndarray
    discarded: int


DeviceLeg = Callable[[DeviceInput], DeviceRun]
DEVICE_LEGS: dict[str, DeviceLeg] = {}
# Modules that register device legs when imported (absent ones are reported as not run).
LEG_MODULES = ["cep_accel.fpga.simulate"]


def register_device_leg(name: str, leg: DeviceLeg) -> None:
    DEVICE_LEGS[name] = leg


def _emulator_leg(data: DeviceInput) -> DeviceRun:
    circuit = Circuit(data.plan, data.config)
    records = circuit.run(data.rows)
    return DeviceRun(records, circuit.counts()["discarded"])


register_device_leg("emulator (buffer)", _emulator_leg)


@dataclass
class Outcome:
    """One comparison: `name`, whether it `agrees`, and a line saying why."""

    name: str
    agrees: bool
    detail: str


@dataclass
class Verdict:
    """Every comparison made, and the leg modules that are not installed (not run)."""

    outcomes: list[Outcome] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return bool(self.outcomes) and all(o.agrees for o in self.outcomes)


def run_udp(checked: CheckedQuery, events: list[Event], config: CircuitConfig,
            batch_size: int = 4096, sync_every: int = 32, timeout: float = 10.0
            ) -> tuple[list[dict], dict, np.ndarray, FpgaAdapter]:
    """The events through adapter and emulator over loopback (OS-chosen ports): (composite
    events, device STATUS counts, packed rows sent, the adapter)."""
    placeholder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    placeholder.bind(("127.0.0.1", 0))
    adapter_address = placeholder.getsockname()
    placeholder.close()
    server = EmulatorServer(Circuit(compile_fpga(checked, StringDictionary()), config),
                            ("127.0.0.1", 0), adapter_address)
    thread = server.start_thread()
    adapter = FpgaAdapter(checked, server.address, bind=adapter_address,
                          sync_every=sync_every, timeout=timeout, keep_rows=True)
    try:
        found: list[dict] = []
        for start in range(0, len(events), batch_size):
            found += adapter.send_events(events[start:start + batch_size])
        found += adapter.sync()
    finally:
        server.stop()
        thread.join(timeout=5)
        server.close()
        adapter.close()
    rows = np.concatenate(adapter.sent_rows) if adapter.sent_rows else \
        np.zeros((0, adapter.plan.layout.tuple_bytes), np.uint8)
    return found, adapter.status, rows, adapter


def verify(checked: CheckedQuery, events: list[Event],
           config: CircuitConfig | None = None) -> Verdict:
    config = config or CircuitConfig()
    verdict = Verdict()
    for module in LEG_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            verdict.skipped.append(module)
    expected = reference.run([checked], events)
    got, status, rows, adapter = run_udp(checked, events, config)
    lossless = status["discarded"] == 0 and status["expired"] == 0 and \
        status["lost_tuples"] == 0 and adapter.lost_spans == 0
    if not lossless:
        verdict.outcomes.append(Outcome(
            "udp vs reference", False,
            f"not comparable: the device discarded {status['discarded']} tuples, expired "
            f"{status['expired']} elements, lost {status['lost_tuples']} tuples in transit; "
            f"{adapter.lost_spans} spans were past the retained window (more elements?)"))
    else:
        ordered = sorted(got, key=lambda c: (c["seq"], c["start_seq"]))
        same = ordered == expected
        verdict.outcomes.append(Outcome(
            "udp vs reference", same,
            f"{len(got)} composite events vs {len(expected)}" +
            ("" if same else f"; first difference: {_first_difference(ordered, expected)}")))
    received = np.concatenate(adapter.received) if adapter.received else \
        np.zeros(0, wire.REPORT_DTYPE)
    udp_records = np.stack([received["partition"], received["seq"], received["start_seq"]],
                           axis=1).astype(np.int64)
    data = DeviceInput(adapter.plan, config, rows)
    baseline = None
    for name, leg in DEVICE_LEGS.items():
        run = leg(data)
        if baseline is None:
            baseline = (name, run)
            same = run.discarded == status["discarded"] and \
                np.array_equal(run.records, udp_records)
            verdict.outcomes.append(Outcome(
                f"{name} vs udp", same,
                f"{len(run.records)} records, {run.discarded} discarded vs {status['reports']} "
                f"reports, {status['discarded']} discarded over UDP"))
            continue
        base_name, base = baseline
        same = run.discarded == base.discarded and np.array_equal(run.records, base.records)
        verdict.outcomes.append(Outcome(
            f"{name} vs {base_name}", same,
            f"{len(run.records)} records, {run.discarded} discarded vs {len(base.records)}, "
            f"{base.discarded}"))
    return verdict


def _first_difference(got: list[dict], expected: list[dict]) -> str:
    for a, b in zip(got, expected):
        if a != b:
            return f"got {a}, expected {b}"
    return f"lengths differ ({len(got)} vs {len(expected)})"
