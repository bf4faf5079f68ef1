"""UDP round trips on loopback (127.0.0.1, OS-chosen ports): adapter <-> emulator, the peer
filter, `cep fpga verify` and `cep fpga send`; the batched system calls (sendmmsg /
recvmmsg, UDP GSO) against one call per datagram."""

import json
import random
import select
import socket
import sys
import time

import numpy as np
from typer.testing import CliRunner

from cep_accel.fpga import udp, wire
from cep_accel.fpga.adapter import FpgaAdapter
from cep_accel.fpga.emulator import Circuit, EmulatorServer
from cep_accel.fpga.plan import CircuitConfig, compile_fpga, pack_tuples
from cep_accel.fpga.verify import run_udp, verify
from cep_core import reference
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_queries
from cep_core.events import Event
from cep_service.cli.main import app

MARATHON = load_queries("examples/marathon.cep")[0]
CHECKPOINTS = ["Staten Island", "Brooklyn", "Queens", "Bronx", "Manhattan", "Harlem"]


def marathon_events(n: int, runners: int, seed: int = 1):
    rnd = random.Random(seed)
    events, clock = [], {}
    for i in range(n):
        runner = rnd.randrange(runners)
        # Mostly forward in time per runner; now and then backwards (rejected on the host).
        clock[runner] = clock.get(runner, 0) + rnd.choice([60_000, 90_000, 120_000, -1])
        events.append(Event(i, clock[runner], {"runner": runner, "ts": clock[runner],
                                               "checkpoint": rnd.choice(CHECKPOINTS)}))
    return events


def free_address():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    address = s.getsockname()
    s.close()
    return address


def test_round_trip_gives_the_reference_composite_events():
    events = marathon_events(3000, 25)
    rejected: list = []
    expect = reference.run([MARATHON], events, rejected=rejected)
    found, status, rows, adapter = run_udp(MARATHON, events, CircuitConfig(elements=32),
                                           batch_size=500, sync_every=16)
    assert sorted(found, key=lambda c: c["seq"]) == expect and len(expect) > 50
    assert status["discarded"] == status["lost_tuples"] == 0
    assert status["tuples"] == len(rows) == len(events) - len(rejected)
    assert sorted(seq for seq, _ in adapter.dead_letters) == sorted(e.seq for _, e, _ in rejected)


def test_emulator_takes_datagrams_only_from_its_peer():
    plan = compile_fpga(MARATHON, StringDictionary())
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stranger.bind(("127.0.0.1", 0))
    circuit = Circuit(plan)
    server = EmulatorServer(circuit, ("127.0.0.1", 0), peer.getsockname())
    thread = server.start_thread()
    try:
        strings = StringDictionary()
        plan = compile_fpga(MARATHON, strings)
        batch = BatchEncoder(MARATHON.schema, strings).from_events(
            [Event(0, 0, {"runner": 1, "checkpoint": "Staten Island", "ts": 0}),
             Event(1, 1, {"runner": 1, "checkpoint": "Manhattan", "ts": 1})])
        buffer, _ = wire.tuple_datagrams(pack_tuples(plan, batch), plan.query_id, 0, 90)
        stranger.sendto(buffer.tobytes(), server.address)
        stranger.sendto(wire.barrier(0, 7, plan.fingerprint()), server.address)
        peer.sendto(wire.barrier(0, 8, plan.fingerprint()), server.address)
        peer.settimeout(5)
        _, token, counts = wire.parse_status(peer.recv(2048))
        assert token == 8 and counts["tuples"] == 0  # the stranger's tuples never arrived
        peer.sendto(buffer.tobytes(), server.address)
        records = wire.parse_reports(peer.recv(2048))
        assert records[["partition", "seq", "start_seq"]].tolist() == [(1, 1, 0)]
    finally:
        server.stop()
        thread.join(5)
        server.close()
        peer.close()
        stranger.close()


def test_adapter_takes_match_reports_only_from_its_device():
    """A forged REPORTS datagram from another address never becomes a composite event;
    the same datagram from the device address does."""
    device = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    device.bind(("127.0.0.1", 0))
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stranger.bind(("127.0.0.1", 0))
    adapter = FpgaAdapter(MARATHON, device.getsockname())
    try:
        events = [Event(0, 0, {"runner": 1, "checkpoint": "Staten Island", "ts": 0}),
                  Event(1, 1, {"runner": 1, "checkpoint": "Manhattan", "ts": 1})]
        assert adapter.send_events(events) == []
        device.settimeout(5)
        device.recv(2048)  # the tuples reached the device
        record = np.zeros(1, wire.REPORT_DTYPE)
        record[0] = (adapter.plan.query_id, 0, 0, 1, 0)  # partition 0 = runner 1
        buffer, _ = wire.report_datagrams(record, 0)
        forged = buffer.tobytes()
        stranger.sendto(forged, adapter.address)
        time.sleep(0.2)
        assert adapter.receive() == []
        device.sendto(forged, adapter.address)
        found = []
        deadline = time.monotonic() + 5
        while not found and time.monotonic() < deadline:
            select.select([adapter.sock], [], [], 0.5)
            found = adapter.receive()
        assert [(c["key"], c["seq"], c["start_seq"]) for c in found] == [(1, 1, 0)]
    finally:
        adapter.close()
        device.close()
        stranger.close()


def test_verify_agrees_and_fails_when_the_partitioner_is_too_small():
    events = marathon_events(1500, 12, seed=2)
    verdict = verify(MARATHON, events, CircuitConfig(elements=16))
    assert verdict.agrees, verdict.outcomes
    small = verify(MARATHON, events, CircuitConfig(elements=2))
    assert not small.agrees
    assert "discarded" in small.outcomes[0].detail
    assert all(o.agrees for o in small.outcomes[1:])  # device legs still agree


def write_events(path, events):
    path.write_text("".join(json.dumps(e.attrs) + "\n" for e in events))


def test_cli_verify_exit_codes(tmp_path):
    events = tmp_path / "events.jsonl"
    write_events(events, marathon_events(800, 10, seed=3))
    runner = CliRunner()
    ok = runner.invoke(app, ["fpga", "verify", "examples/marathon.cep", "--events", str(events)])
    assert ok.exit_code == 0, ok.output
    assert "all agree" in ok.output
    bad = runner.invoke(app, ["fpga", "verify", "examples/marathon.cep", "--events",
                              str(events), "--elements", "1"])
    assert bad.exit_code == 1 and "disagree" in bad.output
    refused = runner.invoke(app, ["fpga", "verify", "examples/finance.cep", "--events",
                                  str(events)])
    assert refused.exit_code == 1 and "aggregate First() in DEFINE" in refused.output


def test_cli_send_to_an_emulator(tmp_path):
    events = marathon_events(600, 8, seed=4)
    path = tmp_path / "events.jsonl"
    write_events(path, events)
    adapter_address = free_address()
    server = EmulatorServer(Circuit(compile_fpga(MARATHON, StringDictionary())),
                            ("127.0.0.1", 0), adapter_address)
    thread = server.start_thread()
    try:
        host, port = server.address
        result = CliRunner().invoke(app, [
            "fpga", "send", "examples/marathon.cep", "--events", str(path),
            "--device", f"{host}:{port}", "--bind", f"{adapter_address[0]}:{adapter_address[1]}",
            "--per-datagram", "7", "--sync-every", "8"])
    finally:
        server.stop()
        thread.join(5)
        server.close()
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    expect = reference.run([MARATHON], [Event(e.seq, e.ts, e.attrs) for e in events])
    assert [c["seq"] for c in lines] == [c["seq"] for c in expect] and len(lines) > 5
    assert np.all([c == e for c, e in zip(lines, expect)])


# ---------------------------------------------------------------- batched system calls


def connected_pair():
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.size_buffers(receiver)
    receiver.bind(("127.0.0.1", 0))
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.bind(("127.0.0.1", 0))
    sender.connect(receiver.getsockname())
    receiver.connect(sender.getsockname())
    return sender, receiver


def receive_all(receiver: udp.DatagramReceiver, expected: int) -> list[bytes]:
    """Datagrams until `expected` arrived or 5 s passed."""
    got: list[bytes] = []
    deadline = time.monotonic() + 5
    while len(got) < expected and time.monotonic() < deadline:
        if not receiver.receive():
            select.select([receiver.sock], [], [], 0.05)
        got += [bytes(receiver.datagram(i)) for i in range(receiver.count)]
    return got


def datagram_layouts():
    """(name, buffer, starts, ends): wire-built TUPLES datagrams (contiguous, one size but
    the last: the GSO path) and irregular slices (gaps, sizes varying: plain sendmmsg)."""
    rng = np.random.default_rng(5)
    rows = rng.integers(0, 256, (1000, 16), dtype=np.uint8)
    for per in (1, 7, 90):
        count = 150 if per < 90 else 100
        buffer, ends = wire.tuple_datagrams(rows[:per * count - per // 2], 0, 11, per)
        yield f"{per}/datagram", buffer, wire.starts_of(ends), ends
    sizes = rng.integers(1, 1400, 150)
    starts = np.cumsum(np.append(0, sizes[:-1] + rng.integers(0, 9, 149)))
    buffer = rng.integers(0, 256, int(starts[-1] + sizes[-1]), dtype=np.uint8)
    yield "irregular", buffer, starts, starts + sizes


SENDERS = {"send": {"use_mmsg": False}, "sendmmsg": {"use_gso": False}, "sendmmsg+gso": {}}
RECEIVERS = {"recv_into": {"use_mmsg": False}, "recvmmsg": {"use_gro": False},
             "recvmmsg+gro": {}}


def test_mmsg_path_delivers_exactly_the_plain_paths_datagrams():
    assert udp.HAVE_MMSG == sys.platform.startswith("linux")
    out, into = connected_pair()
    try:
        for name, buffer, starts, ends in datagram_layouts():
            expected = [buffer[a:b].tobytes() for a, b in zip(starts.tolist(), ends.tolist())]
            for send_kind, send_options in SENDERS.items():
                for receive_kind, receive_options in RECEIVERS.items():
                    # batch=16: the arrays are refilled across calls
                    sender = udp.DatagramSender(out, batch=16, **send_options)
                    receiver = udp.DatagramReceiver(into, 64, wire.RECEIVE_STRIDE,
                                                    **receive_options)
                    sender.send(buffer, starts, ends)
                    got = receive_all(receiver, len(expected))
                    assert got == expected, (name, send_kind, receive_kind)
                    assert (sender.calls < len(expected)) == (send_kind != "send")
                    assert (receiver.calls < len(expected)) == (receive_kind != "recv_into")
                    # GSO and GRO are on where the kernel has them (Linux 4.18 / 5.0)
                    assert sender.gso == (send_kind == "sendmmsg+gso")
                    assert receiver.gro == (receive_kind == "recvmmsg+gro")
    finally:
        out.close()
        into.close()


def run_pair(events, mmsg: bool, sync_every: int | None):
    """Adapter and emulator, both on the mmsg path or both on the plain one: (composite
    events, records received, STATUS counts, tuples sent)."""
    adapter_address = free_address()
    circuit = Circuit(compile_fpga(MARATHON, StringDictionary()), CircuitConfig(elements=64))
    circuit.run(np.zeros((1, circuit.plan.layout.tuple_bytes), np.uint8))  # compile first
    circuit.reset()
    server = EmulatorServer(circuit, ("127.0.0.1", 0), adapter_address, group=32,
                            use_mmsg=mmsg)
    thread = server.start_thread()
    adapter = FpgaAdapter(MARATHON, server.address, bind=adapter_address, per_datagram=5,
                          sync_every=sync_every, keep_rows=True, use_mmsg=mmsg, timeout=20)
    try:
        found = []
        for start in range(0, len(events), 700):
            found += adapter.send_events(events[start:start + 700])
        found += adapter.sync()
    finally:
        server.stop()
        thread.join(5)
        server.close()
        adapter.close()
    return found, np.concatenate(adapter.received), adapter.status, adapter.wire_seq


def test_adapter_and_emulator_give_the_same_results_on_both_paths():
    events = marathon_events(2500, 20, seed=6)
    expect = reference.run([MARATHON], events)
    plain = run_pair(events, False, 8)
    batched = run_pair(events, True, 8)
    assert sorted(plain[0], key=lambda c: c["seq"]) == expect and len(expect) > 40
    assert batched[0] == plain[0]
    assert batched[1].tolist() == plain[1].tolist()
    assert batched[2] == plain[2] and batched[3] == plain[3]
    assert plain[2]["tuples"] == plain[3] and plain[2]["lost_tuples"] == 0
