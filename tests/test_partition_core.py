"""A worker's partition core without Kafka (services/stream/partition.py): keyed frames in,
composite frames and pulses out, with dedupe of frames a restarted splitter sends again,
control switches at their seq, and snapshots a restarted worker goes on from."""

from __future__ import annotations

from pathlib import Path

import orjson

from cep_service.stream import frames
from cep_service.stream.control import ControlMessage, split_query_file
from cep_service.stream.kafka import Topics
from cep_service.stream.partition import PartitionState
from cep_service.stream.routing import message, Router, records

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TRADES = [line for line in (EXAMPLES / "data" / "trades.jsonl").read_bytes().splitlines()
          if line.strip()]
TOPICS = Topics("trades", source="src")


def keyed_frames(steps: list[list[bytes]], partitions: int = 2) -> list[list[frames.Frame]]:
    """The frames a router sends each keyed partition for these steps (and an end)."""
    core = Router(TOPICS, partitions)
    for name, text in split_query_file((EXAMPLES / "finance.cep").read_text()):
        change = ControlMessage("add", name, text)
        core.apply_control(message(0, 0, change.to_json(), None, change.key), False)
    core.setup_schema()
    core.source_partitions = frozenset({0})
    core.announce()
    offset = 0
    for step in steps:
        core.take(records(step, 0, offset))
        offset += len(step)
    core.take([message(0, offset, b"", [("kind", b"end")])])
    out: list[list[frames.Frame]] = [[] for _ in range(partitions)]
    for topic, value, _, p, headers in core.out.take():
        if topic == TOPICS.keyed:
            out[p].append(frames.frame_of(message(p, 0, value, headers)))
    return out


def fresh(partition: int = 0) -> PartitionState:
    return PartitionState(partition, "trades", None, topics=TOPICS)


def feed(state: PartitionState, sent: list[frames.Frame], first_offset: int = 0) -> list:
    """(kind, upto, composites) of each match-topic frame the partition sends."""
    out = []
    for i, frame in enumerate(sent):
        state.handle(frame, first_offset + i)
        for topic, value, _, p, headers in state.sent.take():
            if topic == TOPICS.matches:
                f = frames.frame_of(message(p, 0, value, headers))
                out.append((f.kind, f.get("upto"),
                            orjson.loads(f.payload) if f.payload and f.kind != frames.CONTROL
                            else []))
    return out


def composites(out: list) -> list:
    return [c for _, _, found in out for c in found]


STEPS = [TRADES[at:at + 150] for at in range(0, len(TRADES), 150)]


def test_every_upto_is_answered_and_composites_are_found():
    sent = keyed_frames(STEPS)[0]
    out = feed(fresh(), sent)
    uptos = [f.get("upto") for f in sent if f.get("upto") is not None]
    answered = [upto for kind, upto, _ in out if kind != frames.CONTROL]
    assert answered == uptos  # pulses and events frames alike: one answer per upto
    assert out[-1][0] == frames.END
    assert composites(out)


def test_frames_sent_again_are_dropped():
    sent = keyed_frames(STEPS)[0]
    once = composites(feed(fresh(), sent))
    half = len(sent) // 2
    twice = feed(fresh(), sent[:half] + sent[1:half] + sent[half:] + sent[-3:])
    assert composites(twice) == once


def test_a_snapshot_goes_on_where_it_was_taken():
    sent = keyed_frames(STEPS)[1]
    whole = composites(feed(fresh(1), sent))
    first = fresh(1)
    half = len(sent) // 2
    before = composites(feed(first, sent[:half]))
    restored = fresh(1)
    restored.restore(first.snapshot())
    assert restored.offset == half and restored.upto == first.upto
    # the restarted worker resumes at the snapshot's offset
    after = composites(feed(restored, sent[half:], first_offset=half))
    assert before + after == whole


def test_a_removed_query_stops_at_its_seq():
    sent = keyed_frames(STEPS)[0]
    state = fresh()
    upto_half = next(f.get("upto") for f in sent[len(sent) // 2:] if f.get("upto"))
    cut = next(i for i, f in enumerate(sent) if f.get("upto") == upto_half) + 1
    out = feed(state, sent[:cut])
    remove = frames.json_frame(frames.CONTROL, {"op": "remove", "name": "mshape"},
                               at=upto_half + 1, upto=upto_half)
    out += feed(state, [remove] + sent[cut:], first_offset=cut)
    assert "mshape" not in state.queries.live
    kept = [c for c in composites(out) if c["query"] == "mshape"]
    every = [c for c in composites(feed(fresh(), sent)) if c["query"] == "mshape"]
    assert 0 < len(kept) < len(every)
    assert kept == [c for c in every if c["seq"] <= upto_half]
