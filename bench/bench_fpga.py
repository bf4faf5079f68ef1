"""FPGA adapter and emulator throughput (docs/fpga.md), against the paper's 1 GbE line rate
(7.81M tuples of 128 bits per second), the reference interpreter, and the plain UDP path
(one `send` / `recv_into` system call per datagram) run in the same process.

    .venv/bin/python bench/bench_fpga.py [--tuples N] [--runs R]

- adapter send: `FpgaAdapter.send` (host time check, partition ids, packing, datagrams,
  sendmmsg) to a bare loopback socket that nobody reads, 1 and 90 tuples per datagram;
- emulator from a buffer: the circuit kernel over prebuilt datagrams;
- emulator over UDP: an `EmulatorServer` in a subprocess (this file with `--serve`), fed
  prebuilt datagrams by a bare sender with flow control (a barrier every `--window` /
  `--window-1` datagrams, at most two windows in flight, nothing lost) and at line rate
  (no barriers: the emulator's socket drops what it cannot take; lost = sent - received);
  also tuples per emulator CPU-second (Linux /proc);
- adapter + emulator: `FpgaAdapter` with flow control, composite events included.

Each measurement runs `--runs` times; the best and the median are printed. The machine may
be shared: the wall-clock rates fall with other jobs' load, so the load average is printed
too.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

from cep_accel.fpga import wire
from cep_accel.fpga.adapter import FpgaAdapter
from cep_accel.fpga.emulator import Circuit, EmulatorServer
from cep_accel.fpga.plan import CircuitConfig, compile_fpga, pack_tuples
from cep_accel.fpga.udp import HAVE_MMSG, DatagramReceiver, DatagramSender, size_buffers
from cep_core import reference
from cep_core.batch import Batch, StringDictionary
from cep_core.checker import load_queries
from cep_core.events import Event

LINE_RATE = 7.81e6
QUERY_FILE = "examples/marathon.cep"
CHECKPOINTS = ["Staten Island", "Brooklyn", "Queens", "Bronx", "Manhattan", "Harlem"]
UDP_ELEMENTS = 16384  # > the 10,000 runners: nothing discarded


def make_batch(strings: StringDictionary, n: int, runners: int = 10_000,
               t0: int = 0) -> Batch:
    rng = np.random.default_rng(7)
    codes = np.array([strings.code(c) for c in CHECKPOINTS], np.int64)
    ts = t0 + np.arange(n, dtype=np.int64) * 10
    return Batch(np.arange(n, dtype=np.int64), ts,
                 {"runner": rng.integers(0, runners, n), "checkpoint": codes[
                     rng.integers(0, len(codes), n)], "ts": ts})


def free_address() -> tuple[str, int]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    address = s.getsockname()
    s.close()
    return address


def bench_send(checked, n: int, per: int, mmsg: bool) -> float:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    adapter = FpgaAdapter(checked, sink.getsockname(), per_datagram=per,
                          retain_tuples=1 << 16, use_mmsg=mmsg)
    adapter.send(make_batch(adapter.strings, 1000, t0=-10**9))  # warm the jitted time check
    batch = make_batch(adapter.strings, n)
    started = time.perf_counter()
    adapter.send(batch)
    elapsed = time.perf_counter() - started
    assert not adapter.dead_letters and adapter.wire_seq == n + 1000
    adapter.close()
    sink.close()
    return n / elapsed


def bench_buffer(checked, n: int, elements: int) -> float:
    strings = StringDictionary()
    plan = compile_fpga(checked, strings)
    rows = pack_tuples(plan, make_batch(strings, n))
    buf, ends = wire.tuple_datagrams(rows, plan.query_id, 0, 90)
    offsets = wire.starts_of(ends)
    circuit = Circuit(plan, CircuitConfig(elements=elements))
    circuit.run(rows[:1000])  # compile / load the kernel
    circuit.reset()
    started = time.perf_counter()
    circuit.run_datagrams(buf, offsets, ends - offsets, 0, n)
    return n / (time.perf_counter() - started)


def serve(listen: str, peer: str, mmsg: bool) -> None:
    """The emulator for `bench_udp` (`--serve`): prints its address, serves 120 s at most."""
    [checked] = load_queries(QUERY_FILE)
    circuit = Circuit(compile_fpga(checked, StringDictionary()),
                      CircuitConfig(elements=UDP_ELEMENTS))
    circuit.run(np.zeros((1, circuit.plan.layout.tuple_bytes), np.uint8))  # load the kernel
    circuit.reset()
    host, port = listen.rsplit(":", 1)
    peer_host, peer_port = peer.rsplit(":", 1)
    server = EmulatorServer(circuit, (host, int(port)), (peer_host, int(peer_port)),
                            use_mmsg=mmsg)
    print("serving", flush=True)
    server.serve(120)
    server.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_emulator(mmsg: bool) -> tuple[subprocess.Popen, tuple, tuple]:
    """An emulator subprocess: (process, its address, the address it serves)."""
    peer, device = free_address(), free_address()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", f"{device[0]}:{device[1]}",
         f"{peer[0]}:{peer[1]}"] + ([] if mmsg else ["--plain"]), stdout=subprocess.PIPE)
    if server.stdout.readline().strip() != b"serving":
        server.kill()
        raise RuntimeError("the emulator did not start")
    return server, device, peer


def bench_emulator_udp(checked, n: int, per: int, window: int | None,
                       mmsg: bool) -> tuple[float, dict]:
    """Prebuilt TUPLES datagrams from a bare sender (no composite events: the emulator's
    rate), a BARRIER every `window` datagrams (waiting for the one before: at most two
    windows in flight) or none (line rate); (tuples the emulator took per second until
    its last STATUS, its counts, `cpu`: its CPU seconds, `offered`: tuples sent per
    second until the last window was sent)."""
    server, device, peer = start_emulator(mmsg)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        size_buffers(sock)
        sock.bind(peer)
        sock.connect(device)
        strings = StringDictionary()
        plan = compile_fpga(checked, strings)
        batch = make_batch(strings, n)
        rows = pack_tuples(plan, batch, partition_ids=batch.columns["runner"])
        buf, ends = wire.tuple_datagrams(rows, plan.query_id, 0, per)
        starts = wire.starts_of(ends)
        sender = DatagramSender(sock, use_mmsg=mmsg)
        receiver = DatagramReceiver(sock, 1024, wire.RECEIVE_STRIDE, use_mmsg=mmsg)
        answered = [0, {}]

        def barrier(token: int) -> None:
            sock.send(wire.barrier(plan.query_id, token, plan.fingerprint()))

        def await_status(token: int) -> None:
            """Until the STATUS of barrier `token`, sending it again every 20 ms (a full
            receive buffer drops barriers too)."""
            for _ in range(1500):
                resend = time.monotonic() + 0.02
                while answered[0] < token and time.monotonic() < resend:
                    if not receiver.receive():
                        select.select([sock], [], [], 0.01)
                    for i in range(receiver.count):
                        data = receiver.datagram(i)
                        if wire.parse_header(data)["kind"] == wire.STATUS:
                            _, got, counts = wire.parse_status(data)
                            answered[:] = [max(answered[0], got), counts]
                if answered[0] >= token:
                    return
                barrier(token)
            raise RuntimeError("no STATUS from the emulator")

        step = window or len(ends)
        cpu = cpu_seconds(server.pid)
        started = time.perf_counter()
        for token, first in enumerate(range(0, len(ends), step), 1):
            sender.send(buf, starts[first:first + step], ends[first:first + step])
            barrier(token)
            if token > 1:
                await_status(token - 1)
        offered = n / (time.perf_counter() - started)
        await_status(token)
        elapsed = time.perf_counter() - started
        counts = dict(answered[1], cpu=cpu_seconds(server.pid) - cpu, offered=offered)
        return counts["tuples"] / elapsed, counts
    finally:
        sock.close()
        server.terminate()
        server.wait(10)


def bench_udp(checked, n: int, per: int, window: int | None, mmsg: bool) -> tuple[float, dict]:
    """The adapter (composite events included) and the emulator: (tuples/s, counts)."""
    server, device, adapter_address = start_emulator(mmsg)
    try:
        adapter = FpgaAdapter(checked, device, bind=adapter_address, per_datagram=per,
                              sync_every=window, timeout=30, use_mmsg=mmsg)
        adapter.send(make_batch(adapter.strings, 1000, t0=-10**9))
        adapter.sync()
        before = adapter.status["tuples"]
        batch = make_batch(adapter.strings, n)
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


def repeat(runs: int, measure: Callable[..., float], *args) -> tuple[float, float]:
    """(best, median) of `runs` measurements `measure(*args)`."""
    rates = [measure(*args) for _ in range(runs)]
    return max(rates), statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tuples", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--window", type=int, default=1024,
                        help="datagrams per barrier, flow-controlled runs, 90/datagram")
    parser.add_argument("--window-1", type=int, default=2048,
                        help="datagrams per barrier, flow-controlled runs, 1/datagram")
    parser.add_argument("--serve", nargs=2, metavar=("LISTEN", "PEER"), help=argparse.SUPPRESS)
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve, mmsg=not args.plain)
        return
    n, runs = args.tuples, args.runs
    [checked] = load_queries(QUERY_FILE)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"sendmmsg/recvmmsg: {'yes' if HAVE_MMSG else 'no (plain path only)'}; "
          f"best / median of {runs} runs")
    base = bench_reference(checked, min(n, 100_000))
    print(f"reference interpreter: {base:,.0f} events/s (baseline)")

    def line(name: str, rates: tuple[float, float], plain: tuple[float, float] | None = None,
             extra: str = "") -> None:
        best, median = rates
        vs = f", {best / plain[0]:.1f}x the plain path ({plain[0]:,.0f})" if plain else ""
        print(f"{name}: best {best:,.0f} tuples/s = {best / LINE_RATE:.2f}x line rate, "
              f"median {median:,.0f}; {best / base:,.0f}x reference{vs}{extra}", flush=True)

    for per in (1, 90):
        size = n if per == 90 else n // 4
        plain = repeat(runs, bench_send, checked, size, per, False)
        line(f"adapter send, {per} tuple(s)/datagram",
             repeat(runs, bench_send, checked, size, per, True), plain)
    for elements in (64, UDP_ELEMENTS):
        line(f"emulator from a buffer, {elements} elements",
             repeat(runs, bench_buffer, checked, n, elements))
    for per, window in ((90, args.window), (90, None), (1, args.window_1)):
        size = n if per == 90 else n // 8
        mode = f"flow control (window {window})" if window else "line rate"
        for mmsg in (False, True):
            results = [bench_emulator_udp(checked, size, per, window, mmsg)
                       for _ in range(runs)]
            rates = [rate for rate, _ in results]
            # Not only STATUS lost_tuples (gaps): datagrams lost at the end leave no gap.
            lost = max(size - c["tuples"] for _, c in results)
            cpu = max(c["tuples"] / c["cpu"] if c["cpu"] else 0 for _, c in results)
            offered = "" if window else \
                f"; offered up to {max(c['offered'] for _, c in results):,.0f} tuples/s"
            line(f"emulator over UDP, {per}/datagram, {mode}, {'mmsg' if mmsg else 'plain'}",
                 (max(rates), statistics.median(rates)),
                 extra=f" (lost up to {lost:,} of {size:,} tuples{offered}; best {cpu:,.0f} "
                       "tuples per emulator CPU-second)")
    size = min(n, 200_000)
    results = [bench_udp(checked, size, 90, args.window, True) for _ in range(runs)]
    rates = [rate for rate, _ in results]
    line(f"adapter + emulator over UDP, composite events, 90/datagram, window {args.window}",
         (max(rates), statistics.median(rates)),
         extra=f" ({results[0][1]['reports']:,} matches)")

if __name__ == "__main__":
    main()
