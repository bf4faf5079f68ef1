"""A worker partition's state stays bounded when evicted keys come back (the soak's load).

Symbols slide as in bench/soak.py (`ACTIVE` live at a time, the window moving by one every
`STRIDE` events) but wrap around a fixed set of `UNIVERSE` symbols, so each one goes idle,
is evicted and returns. Once every symbol has been seen and the 5-minute window is full, the
partition's snapshot (string dictionaries, key rows, slots and candidates of the MATCH
engine, window rows) must stop growing: evicted slots are reused and returning keys keep
their ids. With symbols that never return, the MATCH engine's key rows and the string
dictionaries grow with every key ever seen (see the Soak section of docs/reliability.md),
but its slots are still given back and reused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from cep_core.schema import SchemaRegistry
from cep_service.stream.control import split_query_file
from cep_service.stream.worker import PartitionState

QUERIES = Path(__file__).resolve().parents[1] / "examples" / "finance.cep"
ACTIVE, STRIDE, UNIVERSE = 100, 4, 500
ROUND = UNIVERSE * STRIDE  # events until the live window is back where it started
TS_STEP_MS = 50  # a full 5-minute window is 6000 events
BATCH = 500


def trades(start: int, n: int, rng: np.random.Generator, universe: int = UNIVERSE
           ) -> pa.Table:
    """Symbols S0.. from a window of ACTIVE that moves by one every STRIDE events (wrapping
    modulo `universe`; 0: never), plus a share of the WINDOW query's three symbols."""
    i = np.arange(start, start + n)
    keys = i // STRIDE + rng.integers(0, ACTIVE, n)
    if universe:
        keys %= universe
    symbols = np.char.add("S", keys.astype(str)).astype(object)
    windowed = rng.random(n) < 0.05
    symbols[windowed] = np.array(("GOOG", "AAPL", "YHOO"), dtype=object)[keys[windowed] % 3]
    ts = 1_704_067_200_000 + i * TS_STEP_MS
    return pa.table({"symbol": pa.array(symbols, pa.string()),
                     "price": 10_000 + rng.integers(-300, 301, n),
                     "volume": rng.integers(1, 500, n), "ts": ts, "seqNum": i, "seq": i})


def finance_partition() -> PartitionState:
    state = PartitionState(0, "trades", SchemaRegistry(), idle_timeout_ms=60_000)
    state.reconcile([{"name": name, "text": text, "index": i}
                     for i, (name, text) in enumerate(split_query_file(QUERIES.read_text()))])
    return state


def feed(state: PartitionState, table: pa.Table) -> int:
    """Process a batch and punctuate at its last event time; how many composites came
    (they are left in `state.out`)."""
    ts = int(table.column("ts")[-1].as_py())
    state.out = []
    for engines, encoder in state.routes.values():
        state.out += engines.process(encoder.from_arrow(table))
        state.out += engines.punctuate(ts)
    return len(state.out)


def test_partition_state_stops_growing_once_every_key_has_been_seen():
    state = finance_partition()
    assert sorted(state.routes) == ["", "symbol"]
    rng = np.random.default_rng(7)
    sizes, strings, composites = [], [], 0
    for round_ in range(10):
        for start in range(round_ * ROUND, (round_ + 1) * ROUND, BATCH):
            composites += feed(state, trades(start, BATCH, rng))
        sizes.append(len(state.snapshot()))
        strings.append(sorted(len(encoder.strings) for _, encoder in state.routes.values()))
    match = state.routes["symbol"][0].engines[0]
    assert match.metrics["evicted_keys"] > 5 * UNIVERSE  # every key evicted again and again
    assert composites > 0
    assert strings[2:] == [[UNIVERSE + 3] * 2] * 8  # the symbols and the window's three
    steady = sizes[4:]  # the window is full after 6000 events (round 3)
    assert max(steady) - min(steady) < 0.02 * min(steady), sizes


def test_evicted_keys_give_back_their_slots_when_keys_never_return():
    """Candidate storage is bounded by the keys live within the idle timeout, not by the
    keys ever seen: the MATCH engine's slots (rows of its snapshot's `slot_i`) are reused."""
    state = finance_partition()
    rng = np.random.default_rng(11)
    for start in range(0, 10 * ROUND, BATCH):
        feed(state, trades(start, BATCH, rng, universe=0))
    match = state.routes["symbol"][0].engines[0]
    meta, arrays = match.state()
    seen = 10 * ROUND // STRIDE + ACTIVE  # symbols S0 .. S(seen - 1)
    assert match.metrics["evicted_keys"] > seen // 2
    # live at a time: ACTIVE symbols plus those idle for less than the timeout (1200 events)
    assert len(arrays["slot_i"]) <= ACTIVE + 2 * 1200 // STRIDE + 1 < seen // 5


def test_checkpoint_compaction_bounds_strings_and_snapshots_when_keys_never_return():
    """Two partitions fed the same never-returning symbols; one compacts at each
    'checkpoint' (every round) as the worker does. Same composites; the compacting one's
    dictionaries and snapshot stop growing while the other's grow with every symbol."""
    compacting, growing = finance_partition(), finance_partition()
    rng = np.random.default_rng(5)
    strings, sizes, dropped = [], [], 0
    rounds = 20
    for round_ in range(rounds):
        for start in range(round_ * ROUND, (round_ + 1) * ROUND, BATCH):
            table = trades(start, BATCH, rng, universe=0)
            assert feed(compacting, table) == feed(growing, table)
            assert compacting.out == growing.out
        dropped += compacting.compact_strings()
        strings += [len(encoder.strings) for _, encoder in compacting.routes.values()]
        sizes.append(len(compacting.snapshot()))
    seen = rounds * ROUND // STRIDE + ACTIVE
    assert dropped > seen  # each symbol dropped from both routes
    assert growing.strings() > 1.8 * seen  # both routes hold (nearly) every symbol
    # a route compacts once it holds 4096 strings, over twice those in use
    assert max(strings) < 4096 + ROUND // STRIDE + ACTIVE < seen / 2
    # the snapshot saw-tooths between compactions without growing from cycle to cycle
    assert max(sizes[10:]) <= 1.05 * max(sizes[:10]), sizes
    assert len(growing.snapshot()) > 1.3 * max(sizes[10:])
