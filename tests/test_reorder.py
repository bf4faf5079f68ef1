"""The reorder buffer against an event-at-a-time model (sort + filter), on any batching."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cep_core.batch import Batch
from cep_core.reorder import ReorderBuffer


def make_batch(rows):
    """rows: (key, ts) in arrival order; seq = arrival position, column v = 10 * seq."""
    seq = np.array([s for s, _ in rows], dtype=np.int64)
    ts = np.array([t for _, (_, t) in rows], dtype=np.int64)
    keys = np.array([k for _, (k, _) in rows], dtype=np.int64)
    return Batch(seq, ts, {"v": seq * 10}), keys


def model(events, lateness):
    """Per key: late when below the largest earlier time minus the lateness; the rest sorted
    by (ts, seq). Returns ({key: released [(ts, seq)]}, {key: late seqs})."""
    top, released, late = {}, {}, {}
    for seq, (key, ts) in enumerate(events):
        if key in top and ts < top[key] - lateness:
            late.setdefault(key, []).append(seq)
        else:
            released.setdefault(key, []).append((ts, seq))
        top[key] = max(top.get(key, ts), ts)
    return {k: sorted(v) for k, v in released.items()}, late


def run_buffer(events, cuts, lateness, capacity):
    buffer = ReorderBuffer(lateness, capacity)
    numbered = list(enumerate(events))
    bounds = sorted({0, len(events), *[c % (len(events) + 1) for c in cuts]})
    outputs = []
    for a, b in zip(bounds, bounds[1:]):
        out = buffer.push(*make_batch(numbered[a:b]))
        assert len(buffer) <= capacity
        outputs.append((out.released, out.released_keys, out.late, out.late_keys))
    released, keys = buffer.flush()
    outputs.append((released, keys, None, None))
    return buffer, outputs


def per_key(outputs):
    released, late = {}, {}
    for batch, keys, late_batch, late_keys in outputs:
        assert list(zip(batch.ts, batch.seq)) == sorted(zip(batch.ts, batch.seq))
        if len(batch):  # columns travel with their rows
            assert (batch.columns["v"] == batch.seq * 10).all()
        for k, t, s in zip(keys.tolist(), batch.ts.tolist(), batch.seq.tolist()):
            released.setdefault(k, []).append((t, s))
        if late_batch is not None:
            for k, s in zip(late_keys.tolist(), late_batch.seq.tolist()):
                late.setdefault(k, []).append(s)
    return released, late


events = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30)), max_size=60)
cuts = st.lists(st.integers(0, 60), max_size=6)


@settings(max_examples=200, deadline=None)
@given(events, cuts, st.integers(0, 8))
def test_matches_the_model_whatever_the_batching(events, cuts, lateness):
    buffer, outputs = run_buffer(events, cuts, lateness, capacity=len(events))
    assert per_key(outputs) == model(events, lateness)
    assert buffer.forced == 0 and len(buffer) == 0


@settings(max_examples=200, deadline=None)
@given(events, cuts, st.integers(0, 8), st.integers(0, 5))
def test_full_buffer_releases_oldest_and_stays_ordered(events, cuts, lateness, capacity):
    buffer, outputs = run_buffer(events, cuts, lateness, capacity)
    released, late = per_key(outputs)
    for rows in released.values():
        assert rows == sorted(rows)  # never mixed in out of order
    seen = sorted(s for rows in released.values() for _, s in rows)
    seen += [s for seqs in late.values() for s in seqs]
    assert sorted(seen) == list(range(len(events)))  # every event exactly once
    assert buffer.late_count == sum(map(len, late.values()))
    # Replays give identical output.
    again = run_buffer(events, cuts, lateness, capacity)[1]
    assert per_key(again) == (released, late)


def test_watermark_release_and_late_events():
    buffer = ReorderBuffer(allowed_lateness=5, max_buffered=100)
    out = buffer.push(*make_batch([(0, (0, 10)), (1, (0, 8)), (2, (1, 3)), (3, (0, 16))]))
    assert out.released.seq.tolist() == [1, 0]  # times 8, 10 <= 16 - 5, in time order
    assert out.released.columns["v"].tolist() == [10, 0]
    out = buffer.push(*make_batch([(4, (0, 9)), (5, (0, 12)), (6, (1, 1))]))
    assert out.late.seq.tolist() == [4] and out.late_keys.tolist() == [0]  # 9 < 16 - 5
    assert out.released.seq.tolist() == []  # 12 waits for the watermark (11) to reach it
    released, keys = buffer.flush()
    assert released.seq.tolist() == [6, 2, 5, 3] and keys.tolist() == [1, 1, 0, 0]
    assert buffer.late_count == 1


def test_full_buffer_counts_forced_releases():
    buffer = ReorderBuffer(allowed_lateness=100, max_buffered=2)
    out = buffer.push(*make_batch([(0, (0, 5)), (1, (0, 3)), (2, (0, 4)), (3, (0, 9))]))
    assert out.released.seq.tolist() == [1, 2] and buffer.forced == 2 and len(buffer) == 2
    out = buffer.push(*make_batch([(4, (0, 3)), (5, (0, 4))]))
    assert out.late.seq.tolist() == [4]  # below a time already released
    assert out.released.seq.tolist() == [5] and buffer.forced == 3  # time 4 is not below 4


def test_bad_arguments():
    with pytest.raises(ValueError, match="must not be negative"):
        ReorderBuffer(-1, 10)
    buffer = ReorderBuffer(0, 10)
    batch, _ = make_batch([(0, (0, 1))])
    with pytest.raises(ValueError, match="one key id per row"):
        buffer.push(batch, np.zeros(2, dtype=np.int64))


@settings(max_examples=200, deadline=None)
@given(events, cuts, st.integers(0, 8), st.integers(0, 5), st.integers(0, 60),
       st.randoms(use_true_random=False))
def test_restore_and_refill_continue_as_if_never_stopped(events, cuts, lateness, capacity,
                                                         stop, rng):
    """A checkpoint at a batch boundary (state + the waiting rows), a new buffer restored
    from it and refilled in any order gives the uninterrupted run's output (same batches:
    forced releases of a full buffer depend on them)."""
    stop = stop % (len(events) + 1)
    whole = per_key(run_buffer(events, cuts + [stop], lateness, capacity)[1])
    numbered = list(enumerate(events))
    bounds = sorted({0, len(events), stop, *[c % (len(events) + 1) for c in cuts]})
    buffer, outputs = ReorderBuffer(lateness, capacity), []
    for a, b in zip(bounds, bounds[1:]):
        if a == stop:  # the restart
            state = buffer.state()
            waiting, keys = buffer.waiting()
            buffer = ReorderBuffer(lateness, capacity)
            buffer.restore(state)
            if waiting is not None and len(keys):
                order = list(range(len(keys)))
                rng.shuffle(order)
                order = np.array(order, dtype=np.int64)
                buffer.refill(Batch(waiting.seq[order], waiting.ts[order],
                                    {k: v[order] for k, v in waiting.columns.items()}),
                              keys[order])
        out = buffer.push(*make_batch(numbered[a:b]))
        outputs.append((out.released, out.released_keys, out.late, out.late_keys))
    outputs.append((*buffer.flush(), None, None))
    assert per_key(outputs) == whole
