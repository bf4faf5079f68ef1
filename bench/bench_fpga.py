"""FPGA adapter and emulator throughput (docs/fpga.md), against the paper's 1 GbE line rate
(7.81M tuples of 128 bits per second) and the reference interpreter in the same process.

    .venv/bin/python bench/bench_fpga.py [--tuples N]

- adapter send: `FpgaAdapter.send` (host time check, partition ids, packing, datagrams,
  one `send` per datagram) to a loopback socket that nobody reads, 1 and 90 tuples per
  datagram;
- emulator from a buffer: the circuit kernel over prebuilt datagrams;
- emulator over UDP: `cep fpga emulate` in a subprocess, the adapter sending with flow
  control (a barrier every 64 datagrams, nothing lost) and at line rate (the receiver's
  socket drops what it cannot take: `lost` counts it).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time

import numpy as np

from accel.fpga import wire
from accel.fpga.adapter import FpgaAdapter
from accel.fpga.emulator import Circuit
from accel.fpga.plan import CircuitConfig, compile_fpga, pack_tuples
from cep_core import reference
from cep_core.batch import Batch, StringDictionary
from cep_core.checker import load_queries
from cep_core.events import Event

LINE_RATE = 7.81e6
QUERY_FILE = "examples/marathon.cep"
CHECKPOINTS = ["Staten Island", "Brooklyn", "Queens", "Bronx", "Manhattan", "Harlem"]


def make_batch(strings: StringDictionary, n: int, runners: int = 10_000) -> Batch:
    rng = np.random.default_rng(7)
    codes = np.array([strings.code(c) for c in CHECKPOINTS], np.int64)
    ts = np.arange(n, dtype=np.int64) * 10
    return Batch(np.arange(n, dtype=np.int64), ts,
                 {"runner": rng.integers(0, runners, n), "checkpoint": codes[
                     rng.integers(0, len(codes), n)], "ts": ts})


def free_address() -> tuple[str, int]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    address = s.getsockname()
    s.close()
    return address


def bench_send(checked, n: int, per: int) -> float:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    adapter = FpgaAdapter(checked, sink.getsockname(), per_datagram=per,
                          retain_tuples=1 << 16)
    batch = make_batch(adapter.strings, n)
    adapter.send(batch.slice(0, min(n, 1000)))  # warm the jitted time check
    started = time.perf_counter()
    adapter.send(batch)
    elapsed = time.perf_counter() - started
    adapter.close()
    sink.close()
    return n / elapsed


def bench_buffer(checked, n: int, elements: int) -> float:
    strings = StringDictionary()
    plan = compile_fpga(checked, strings)
    rows = pack_tuples(plan, make_batch(strings, n))
    buf, ends = wire.tuple_datagrams(rows, plan.query_id, 0, 90)
    offsets = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    circuit = Circuit(plan, CircuitConfig(elements=elements))
    circuit.run(rows[:1000])  # compile / load the kernel
    circuit.reset()
    started = time.perf_counter()
    circuit.run_datagrams(buf, offsets, ends - offsets, 0, n)
    return n / (time.perf_counter() - started)


def bench_udp(checked, n: int, per: int, sync_every: int | None) -> tuple[float, dict]:
    adapter_address = free_address()
    device = free_address()
    server = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "fpga", "emulate", QUERY_FILE,
         "--listen", f"{device[0]}:{device[1]}",
         "--peer", f"{adapter_address[0]}:{adapter_address[1]}", "--elements", "16384",
         "--duration", "120"], stderr=subprocess.PIPE)
    try:
        server.stderr.readline()  # "emulating ...": listening
        adapter = FpgaAdapter(checked, device, bind=adapter_address, per_datagram=per,
                              sync_every=sync_every, timeout=30, retain_tuples=1 << 16)
        adapter.send(make_batch(adapter.strings, 1000))
        adapter.sync()
        before = adapter.status["tuples"]
        batch = make_batch(adapter.strings, n)
        batch = Batch(batch.seq, batch.ts + 10_000, batch.columns)
        started = time.perf_counter()
        adapter.send(batch)
        adapter.sync()
        elapsed = time.perf_counter() - started
        adapter.close()
        counts = adapter.status
        return (counts["tuples"] - before) / elapsed, counts
    finally:
        server.terminate()
        server.wait(10)


def bench_reference(checked, n: int) -> float:
    rng = np.random.default_rng(3)
    events = [Event(i, 10 * i, {"runner": int(r), "checkpoint": CHECKPOINTS[c], "ts": 10 * i})
              for i, (r, c) in enumerate(zip(rng.integers(0, 10_000, n), rng.integers(0, 6, n)))]
    started = time.perf_counter()
    reference.run([checked], events)
    return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tuples", type=int, default=2_000_000)
    args = parser.parse_args()
    n = args.tuples
    [checked] = load_queries(QUERY_FILE)
    base = bench_reference(checked, min(n, 100_000))
    print(f"reference interpreter: {base:,.0f} events/s (baseline)")

    def line(name: str, rate: float, extra: str = "") -> None:
        print(f"{name}: {rate:,.0f} tuples/s = {rate / LINE_RATE:.2f}x line rate (7.81M) = "
              f"{rate / base:,.0f}x reference{extra}")

    for per in (1, 90):
        line(f"adapter send, {per} tuple(s)/datagram", bench_send(checked, n if per == 90
                                                                   else n // 4, per))
    for elements in (64, 16384):
        line(f"emulator from a buffer, {elements} elements", bench_buffer(checked, n, elements))
    for per, sync in ((90, 64), (90, None), (1, 64)):
        rate, counts = bench_udp(checked, n if per == 90 else n // 8, per, sync)
        mode = "flow control" if sync else "line rate"
        line(f"emulator over UDP, {per}/datagram, {mode}", rate,
             f" (lost {counts['lost_tuples']:,} tuples, {counts['discarded']:,} discarded)")


if __name__ == "__main__":
    main()
