"""End of input over a source topic with several partitions, without Kafka: the splitter
is fed consumed messages directly (`Splitter.take`) and its frames are collected.

Each source partition gets its own end-of-input marker (`cep_service.stream.kafka.produce_end`
writes one to every partition), and the input has ended only once every partition has
given its marker. Records of one partition may be consumed after another partition's
marker: the consumer returns partitions in any order, and a restarted splitter reads its
backlog a partition at a time. Ending the input at the first marker lost exactly the
events a fault test lost (seqNums 1190, 1192, 1195 of examples/data/trades.jsonl, still in
the reorder buffer after its end-of-input flush) or, without a lateness, stamped events
after the end."""

from __future__ import annotations

import zlib
from pathlib import Path

import orjson
import pytest
from confluent_kafka import TopicPartition

import cep_service.stream.splitter as splitter_module
from cep_service.stream import frames
from cep_service.stream.control import ControlMessage, split_query_file
from cep_service.stream.kafka import KafkaSettings, Topics
from cep_service.stream.routing import message
from cep_service.stream.splitter import SPLITTER_KEY, Splitter

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SOURCE_PARTITIONS = 3
KEYED_PARTITIONS = 4


Message = message  # a consumed message without a consumer (the router's own)


class Producer:
    """Keeps what is produced: (topic, value, key, partition, headers)."""

    def __init__(self):
        self.sent: list[tuple] = []

    def produce(self, topic, value, key=None, partition=None, headers=None):
        self.sent.append((topic, value, key, partition, dict(headers or ())))

    def poll(self, timeout=0):
        return 0

    def flush(self, timeout=0):
        return 0


class Source:
    """The consumer as far as a checkpoint asks it: positions, commits."""

    def __init__(self, next_offsets: dict[int, int]):
        self.next_offsets = next_offsets

    def assignment(self):
        return [TopicPartition("src", p) for p in self.next_offsets]

    def position(self, tps):
        return [TopicPartition("src", tp.partition, self.next_offsets[tp.partition])
                for tp in tps]

    def commit(self, offsets, asynchronous=False):
        pass


def source_messages() -> dict[int, list[Message]]:
    """The trades spread over the source partitions by symbol, as the fault tests write
    them, and every partition's end-of-input marker after its records."""
    lines = [x for x in (EXAMPLES / "data" / "trades.jsonl").read_bytes().splitlines()
             if x.strip()]
    out: dict[int, list[Message]] = {p: [] for p in range(SOURCE_PARTITIONS)}
    for line in lines:
        p = zlib.crc32(orjson.loads(line)["symbol"].encode()) % SOURCE_PARTITIONS
        out[p].append(Message(p, len(out[p]), line))
    for p, messages in out.items():
        messages.append(Message(p, len(messages), b"", [("kind", b"end")]))
    return out


def new_splitter(lateness_ms: int) -> Splitter:
    splitter = Splitter(KafkaSettings("127.0.0.1:1"), Topics("trades", source="src"),
                        KEYED_PARTITIONS, allowed_lateness_ms=lateness_ms)
    for name, text in split_query_file((EXAMPLES / "finance.cep").read_text()):
        splitter.queries.apply(ControlMessage("add", name, text))
    splitter.setup_schema()
    splitter.producer = Producer()
    splitter.source_partitions = frozenset(range(SOURCE_PARTITIONS))
    return splitter


def steps_of(messages: list, size: int) -> list[list]:
    return [messages[at:at + size] for at in range(0, len(messages), size)]


def keyed(splitter: Splitter) -> list[tuple[int, frames.Frame]]:
    """(keyed partition, frame) of everything sent to the keyed topic, in order."""
    out = []
    for topic, value, _, partition, headers in splitter.producer.sent:
        if topic == splitter.topics.keyed:
            out.append((partition, frames.frame_of(Message(partition, 0, value,
                                                           list(headers.items())))))
    return out


def stamped(*lives: Splitter) -> dict[int, dict]:
    """seq -> row of the unkeyed route's events frames (every event once per route), over
    the splitter's lives; an event sent again must be the same."""
    by_seq: dict[int, dict] = {}
    for life in lives:
        for _, frame in keyed(life):
            if frame.kind == frames.EVENTS and frame.get("route") == "":
                for row in frames.decode_table(frame.payload).to_pylist():
                    seq = row.pop("seq")
                    assert by_seq.setdefault(seq, row) == row, f"seq {seq} stamped twice"
    return by_seq


def assert_complete(by_seq: dict[int, dict], total: int) -> None:
    missing = sorted(set(range(total)) - {row["seqNum"] for row in by_seq.values()})
    assert not missing, f"never stamped: seqNums {missing}"
    assert sorted(row["seqNum"] for row in by_seq.values()) == list(range(total))
    assert sorted(by_seq) == list(range(total))


def assert_ends_last(splitter: Splitter, total: int) -> None:
    """Every keyed partition gets one end of input, at the last seq, after its events."""
    sent = keyed(splitter)
    for p in range(KEYED_PARTITIONS):
        mine = [frame for q, frame in sent if q == p]
        ends = [i for i, frame in enumerate(mine) if frame.kind == frames.END]
        assert len(ends) == 1, f"keyed partition {p}: {len(ends)} ends of input"
        assert mine[ends[0]].get("upto") == total - 1
        assert not [f for f in mine[ends[0]:] if f.kind == frames.EVENTS], \
            f"keyed partition {p}: events after the end of input"


@pytest.mark.parametrize("lateness_ms", [0, 5000])
@pytest.mark.parametrize("size", [7, 500, 10_000])
def test_one_partitions_end_marker_before_the_others_records(lateness_ms, size):
    """Partition 0 is consumed to its end marker before partitions 1 and 2 (a backlog
    read after a restart): the input ends after the last partition's marker, and every
    record is stamped before it."""
    source = source_messages()
    total = sum(len(m) - 1 for m in source.values())
    splitter = new_splitter(lateness_ms)
    for step in steps_of(source[0] + source[1] + source[2], size):
        splitter.take(step)
    assert_complete(stamped(splitter), total)
    assert_ends_last(splitter, total)
    assert splitter._status()["ended_source_partitions"] == []  # the next input: afresh


def test_without_every_partitions_marker_the_input_has_not_ended():
    source = source_messages()
    splitter = new_splitter(5000)
    splitter.take(source[0] + source[1] + source[2][:-1])
    assert not [f for _, f in keyed(splitter) if f.kind == frames.END]
    assert splitter.ended == {0, 1}
    splitter.take(source[2][-1:])
    assert_ends_last(splitter, sum(len(m) - 1 for m in source.values()))


@pytest.mark.parametrize("zero_first", [True, False])
@pytest.mark.parametrize("lateness_ms", [0, 5000])
def test_restart_between_the_partitions_end_markers(lateness_ms, zero_first, monkeypatch):
    """A checkpoint after partition 0's marker and half of partition 1: the restarted
    splitter knows partition 0 has ended (it resumes past that marker, or, with events
    waiting in the reorder buffer, reads it again only to refill the buffer), whether
    partition 0 is read again before or after the other partitions' records."""
    source = source_messages()
    total = sum(len(m) - 1 for m in source.values())
    half = len(source[1]) // 2
    first = new_splitter(lateness_ms)
    for step in steps_of(source[0] + source[1][:half], 100):
        first.take(step)
    first.source = Source({0: len(source[0]), 1: half, 2: 0})
    first.commit()
    states = [value for topic, value, key, _, _ in first.producer.sent
              if topic == first.topics.state and key == SPLITTER_KEY]
    assert orjson.loads(states[-1])["ended"] == [0]
    assert not [f for _, f in keyed(first) if f.kind == frames.END]

    # the restart: the checkpoint is on the state topic, no step was taken after it
    monkeypatch.setattr(splitter_module, "read_latest", lambda *a: {SPLITTER_KEY: states[-1]})
    monkeypatch.setattr(splitter_module, "logged_steps", lambda *a: [])
    second = new_splitter(lateness_ms)
    resume = second._resume_at([TopicPartition("src", p) for p in source])
    second.producer = Producer()
    if lateness_ms:
        assert resume[0].offset < len(source[0]) - 1  # partition 0's marker is read again
    for tp in sorted(resume, key=lambda tp: (tp.partition == 0) != zero_first):
        for step in steps_of(source[tp.partition][max(tp.offset, 0):], 7):
            second.take(step)
    assert_complete(stamped(first, second), total)
    assert_ends_last(second, total)
