"""State that cannot lie (issue 27): every snapshot and checkpoint carries a CRC-32 of all
its bytes and what it is of (cep_core/snapshot_format.py), so a changed byte or a snapshot
restored as something else is refused with what was found and what to do; offsets a
checkpoint holds are checked against the broker's watermarks; and a service whose newest
checkpoint is refused restores the one before it (services/stream/checkpoint.py: the last
two survive compaction under two keys) and replays from its offsets to the same output.

No broker here: the services' shells are given the state topic's newest records and the
watermarks (tests/fault/test_damaged_checkpoints.py does the same on a real broker)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from confluent_kafka import TopicPartition

FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIXTURES))

import make_snapshots as made  # noqa: E402
import test_splitter_end as splitter_test  # noqa: E402

import cep_service.stream.coordinator as coordinator_module  # noqa: E402
import cep_service.stream.splitter as splitter_module  # noqa: E402
import cep_service.stream.worker as worker_module  # noqa: E402
from cep_core import snapshot_format as fmt  # noqa: E402
from cep_core.batch import StringDictionary  # noqa: E402
from cep_core.engine_factory import create_engine  # noqa: E402
from cep_core.snapshot_format import SnapshotError, UncheckedSnapshot  # noqa: E402
from cep_service.stream.control import ControlMessage, split_query_file  # noqa: E402
from cep_service.stream.checkpoint import (  # noqa: E402
                                           PIPELINE_HEADER,
                                           Offset,
                                           check_offsets,
                                           slot_key,
                                           )
from cep_service.stream.coordinator import Coordinator  # noqa: E402
from cep_service.stream.merge import Merger  # noqa: E402
from cep_service.stream.kafka import KafkaSettings, Topics  # noqa: E402
from cep_service.stream.memory_pipeline import MemoryPipeline  # noqa: E402
from cep_service.stream.metrics import Metrics  # noqa: E402
from cep_service.stream.partition import PartitionState  # noqa: E402
from cep_service.stream.splitter import SPLITTER_KEY  # noqa: E402
from cep_service.stream.worker import Worker  # noqa: E402

V1 = FIXTURES / "snapshots" / "v1"
V2 = FIXTURES / "snapshots" / "v2"
NOWHERE = KafkaSettings("127.0.0.1:1")  # never asked: the shells get the records given
TOPICS = Topics("trades")
STATE = TOPICS.state


def kind_of(name: str) -> str:
    return name.split("-")[0].split(".")[0]


# 6 engines, 2 streams, 2 partitions, the splitter's and the coordinator's checkpoints,
# and a stream's engines (the snapshot inside stream-<file>.bin, after its two counters)
SNAPSHOTS = sorted(p.name for p in V2.iterdir() if kind_of(p.name) in fmt.KINDS) + \
    ["engines-finance", "engines-rfid"]


def fixture(name: str) -> bytes:
    if kind_of(name) == "engines":
        stream = (V2 / f"stream-{name.split('-')[1]}.bin").read_bytes()
        return bytes(fmt.unpack("stream", stream)[16:])
    return (V2 / name).read_bytes()


def test_the_fixtures_cover_every_kind_at_the_current_version():
    assert {kind_of(name) for name in SNAPSHOTS} == set(fmt.KINDS)
    for name in SNAPSHOTS:
        k = fmt.KINDS[kind_of(name)]
        assert fmt.describe(fixture(name)) == (k.name, k.version)


# ------------------------------------------------------------------ restoring a fixture

_pipeline: list = []


def registry():
    """A registry that knows the stream of the fixtures' pipeline (trades)."""
    if not _pipeline:
        _pipeline.append(made.pipeline_half())
    return _pipeline[0].registry


class Restorer:
    """Restores one fixture through the code a service or user restores it with, and
    gives the state restored in a comparable form."""

    def __init__(self, name: str):
        self.name, self.kind = name, kind_of(name)
        self.metrics = Metrics("worker", 0)
        self.target = self.fresh()

    def fresh(self):
        stem = self.name.rsplit(".", 1)[0]
        if self.kind == "engine":
            query = stem.split("-", 1)[1]
            queries = made.query_set("finance" if query in ("mshape", "activity") else "rfid")
            (checked,) = [q for q in queries.queries if q.name == query]
            return create_engine(checked, StringDictionary())
        if self.kind == "stream":
            return made.query_set(stem.split("-", 1)[1]).stream()
        if self.kind == "engines":
            return made.query_set(stem.split("-", 1)[1]).stream()._engines
        if self.kind == "partition":
            return PartitionState(int(stem.split("-")[1]), "trades", registry(), 3_600_000,
                                  TOPICS, self.metrics)
        return None

    def __call__(self, data: bytes):
        """The state `data` restores (SnapshotError when refused)."""
        target = self.target
        if self.kind == "splitter":
            return fmt.unpack_json("splitter", data, stream="trades")
        if self.kind == "coordinator":
            state = fmt.unpack_json("coordinator", data, stream="trades", shard=0)
            merger = Merger(2, "trades", registry())
            merger.load_state(state.pop("merger"))
            return state, orjson.loads(orjson.dumps(merger.state()))
        target.restore(data)  # refused before anything changes, else restored:
        self.target = self.fresh()  # the next one goes into a fresh one
        if self.kind == "partition":
            return target.snapshot(target.generation)
        return target.snapshot()


def changes(data: bytes, kind: str):
    """(position, new value) of the single-byte changes tried: at every position one bit
    (the bit changes with the position); in the envelope (the header line of a binary
    snapshot, the first 128 bytes of a JSON checkpoint) and all through the splitter's
    checkpoint every other value of the byte."""
    every = len(data) if kind == "splitter" else \
        min(len(data), 128) if fmt.KINDS[kind].json else data.index(b"\n") + 1
    for i in range(len(data)):
        if i < every:
            yield from ((i, v) for v in range(256) if v != data[i])
        else:
            yield i, data[i] ^ (1 << (i % 8))


@pytest.mark.filterwarnings("error::cep_core.snapshot_format.UncheckedSnapshot")  # none may
@pytest.mark.parametrize("name", SNAPSHOTS)  # pass as a snapshot from before checksums
def test_every_single_byte_change_is_refused_or_restores_the_same_state(name):
    data = fixture(name)
    restore = Restorer(name)
    expected = restore(data)
    assert restore(data) == expected  # the comparison is of the state, not of the bytes
    refused = same = 0
    damaged = bytearray(data)
    for i, value in changes(data, restore.kind):
        damaged[i] = value
        try:
            got = restore(bytes(damaged))
        except SnapshotError:
            refused += 1
        else:
            assert got == expected, f"byte {i} set to {value:#04x}: a different state"
            same += 1
        damaged[i] = data[i]
    print(f"{name}: {len(data)} bytes, {refused + same} changes, {refused} refused, "
          f"{same} restored the same state")
    assert refused + same > len(data)


def test_a_change_is_refused_with_what_was_found_and_what_to_do():
    data = (V2 / "partition-0.bin").read_bytes()
    head = data[:data.index(b"\n")]
    assert b'"stream":"trades","partition":0,"generation":0' in head
    edited = data.replace(b'"offset":13,', b'"offset":93,', 1)  # the tester's edits
    with pytest.raises(SnapshotError) as error:
        PartitionState(0, "trades", registry(), topics=TOPICS).restore(edited, "partition-0.bin")
    assert str(error.value).startswith(
        "partition-0.bin: this partition snapshot is damaged: its bytes do not match its "
        "checksum (crc32 ")
    assert "it was changed after it was written" in str(error.value)
    assert "delete the topics and consumer groups cep.<stream>.*" in str(error.value)
    with pytest.raises(SnapshotError, match="do not match its checksum"):
        PartitionState(0, "trades", registry(), topics=TOPICS).restore(
            data.replace(b'"upto":299,', b'"upto":999,', 1))
    splitter = (V2 / "splitter.json").read_bytes()
    assert b'"position":300,' in splitter
    with pytest.raises(SnapshotError, match="splitter checkpoint is damaged"):
        fmt.unpack_json("splitter", splitter.replace(b'"position":300,', b'"position":900,'))
    coordinator = (V2 / "coordinator.json").read_bytes()
    with pytest.raises(SnapshotError, match="coordinator checkpoint is damaged"):
        fmt.unpack_json("coordinator", coordinator.replace(b'"offsets":[7,9]',
                                                           b'"offsets":[7,8]'))
    with pytest.raises(SnapshotError, match="checkpoint is truncated or damaged"):
        fmt.unpack_json("coordinator", coordinator[:len(coordinator) // 2])
    with pytest.raises(SnapshotError, match=r"snapshot is truncated: its header says \d+ bytes "
                       r"follow it, \d+ do"):
        fmt.unpack("stream", (V2 / "stream-rfid.bin").read_bytes()[:-100])


def test_a_snapshot_restored_as_another_is_refused():
    with pytest.raises(SnapshotError) as error:
        PartitionState(1, "trades", registry(), topics=TOPICS).restore(
            (V2 / "partition-0.bin").read_bytes())
    assert str(error.value).startswith(
        "this partition snapshot is of stream 'trades', partition 0, not of partition 1: it "
        "was written for another partition")
    rfid = made.query_set("rfid").stream()
    with pytest.raises(SnapshotError, match="snapshot is of stream 'trades', not of stream "
                       f"{rfid.schema.stream!r}"):
        rfid.restore((V2 / "stream-finance.bin").read_bytes())
    with pytest.raises(SnapshotError, match="is of stream 'trades', shard 0, not of shard 1"):
        fmt.unpack_json("coordinator", (V2 / "coordinator.json").read_bytes(), shard=1)


def test_older_snapshots_restore_unchecked_and_say_so():
    stream = made.query_set("finance").stream()
    with pytest.warns(UncheckedSnapshot, match="this stream snapshot has format version 1, "
                      "from before checksums: restored without a check of its bytes"):
        stream.restore((V1 / "stream-finance.bin").read_bytes())
    envelope, _ = fmt.read_json("splitter", (V1 / "splitter.json").read_bytes())
    assert (envelope.version, envelope.checked, envelope.generation) == (1, False, None)


# ------------------------------------------------------------------ plausible offsets

def watermarks(marks: dict):
    asked = []

    def answer(wanted):
        asked.append(list(wanted))
        return {tp: marks.get(tp) for tp in wanted}
    answer.asked = asked
    return answer


def test_offsets_the_broker_cannot_have_given_are_refused_with_the_numbers():
    marks = watermarks({("keyed", 0): (0, 13), ("keyed", 1): (20, 50)})
    check_offsets(marks, [Offset("keyed", 0, 13), Offset("keyed", 1, 20)], "here")
    check_offsets(None, [Offset("keyed", 0, 10**9)], "no broker: not checked")
    with pytest.raises(SnapshotError) as error:
        check_offsets(marks, [Offset("keyed", 0, 93, "keyed offset"),
                              Offset("keyed", 1, 7, "keyed offset"),
                              Offset("keyed", 2, 0, "keyed offset")], "the record")
    assert str(error.value) == (
        "the record: implausible offsets, refused: keyed offset 93 of keyed partition 0 is "
        "past the high watermark 13 (the broker holds offsets 0 to 12); keyed offset 7 of "
        "keyed partition 1 is below the low watermark 20 (the broker holds offsets 20 to 49: "
        "offsets 7 to 19 were deleted before they were read); keyed offset 0 of keyed "
        "partition 2: the broker has no such partition (a topic deleted and made again, "
        "another cluster, an edited checkpoint?)")


def state_topic(records: dict[bytes, bytes]):
    """A `read_latest` of the state topic holding `records` (key -> value) at offsets
    0, 1, ... of partition 0."""
    def read_latest(settings, topic, located=None):
        assert topic == STATE
        if located is not None:
            located.update({k: (0, i) for i, k in enumerate(records)})
        return dict(records)
    return read_latest


def logged(monkeypatch, module) -> list[dict]:
    events: list[dict] = []
    monkeypatch.setattr(module, "log", lambda event, level="info", **fields:
                        events.append({"event": event, "level": level, **fields}))
    return events


def new_worker(marks=None) -> Worker:
    worker = Worker(NOWHERE, TOPICS, registry())
    worker.watermarks = marks
    return worker


def test_a_worker_refuses_an_implausible_offset_and_restores_the_snapshot_before(
        monkeypatch):
    good = (V2 / "partition-0.bin").read_bytes()  # generation 0, keyed offset 13
    state = PartitionState(0, "trades", registry(), topics=TOPICS)
    state.restore(good)
    state.offset = 93  # a writer that lies: the checksum holds
    lying = state.snapshot(1)
    marks = watermarks({(TOPICS.keyed, 0): (0, 50)})
    monkeypatch.setattr(worker_module, "read_latest",
                        state_topic({b"0": good, b"0.alt": lying}))
    events = logged(monkeypatch, worker_module)
    restored = new_worker(marks).restore([0])[0]
    assert (restored.offset, restored.generation) == (13, 0)
    assert marks.asked == [[(TOPICS.keyed, 0)]]
    refused, fallback = [e for e in events if e["event"].startswith("checkpoint_")]
    assert refused["event"] == "checkpoint_refused" and refused["key"] == "0.alt"
    assert refused["reason"] == (
        f"the record of key '0.alt' on {STATE} partition 0 offset 1: implausible offsets, "
        f"refused: keyed offset 93 of {TOPICS.keyed} partition 0 is past the high watermark "
        "50 (the broker holds offsets 0 to 49) (a topic deleted and made again, another "
        "cluster, an edited checkpoint?)")
    assert fallback == {"event": "checkpoint_fallback", "level": "warning",
                        "kind": "partition", "generation": 0, "key": "0", "partition": 0,
                        "offset": 0, "refused": 1}

    monkeypatch.setattr(worker_module, "read_latest", state_topic({b"0.alt": lying}))
    with pytest.raises(SnapshotError) as error:
        new_worker(marks).restore([0])
    assert str(error.value).startswith(f"no partition checkpoint on {STATE} can be restored "
                                       "('0.alt'): the record of key '0.alt'")
    assert "keyed offset 93" in str(error.value) and \
        str(error.value).endswith("replays the source topic from its beginning "
                                  "(docs/snapshots.md)")
    below = watermarks({(TOPICS.keyed, 0): (20, 50)})  # offsets 0-19 deleted: 13 is gone
    monkeypatch.setattr(worker_module, "read_latest", state_topic({b"0": good}))
    with pytest.raises(SnapshotError, match="keyed offset 13 of .* is below the low watermark "
                       "20"):
        new_worker(below).restore([0])


def test_the_splitter_and_coordinator_check_their_offsets(monkeypatch):
    splitter = splitter_test.new_splitter(5000)
    splitter.watermarks = watermarks({("src", 0): (0, 100), ("src", 1): (0, 72),
                                      ("src", 2): (0, 75)} |
                                     {(splitter.topics.keyed, p): (0, 10**6) for p in range(4)})
    monkeypatch.setattr(splitter_module, "read_latest", state_topic(
        {SPLITTER_KEY: (V2 / "splitter.json").read_bytes()}))
    monkeypatch.setattr(splitter_module, "logged_steps", lambda *a: [])
    with pytest.raises(SnapshotError, match="source offset 147 of src partition 0 is past the "
                       "high watermark 100"):
        splitter._resume_at([TopicPartition("src", p) for p in range(3)])

    coordinator = Coordinator(NOWHERE, TOPICS, partitions=2, registry=registry())
    coordinator.watermarks = watermarks({(TOPICS.matches, 0): (0, 7),
                                         (TOPICS.matches, 1): (0, 5)})
    monkeypatch.setattr(coordinator_module, "read_latest", state_topic(
        {b"coordinator": (V2 / "coordinator.json").read_bytes()}))
    with pytest.raises(SnapshotError, match="match-topic offset 9 of cep.trades.matches "
                       "partition 1 is past the high watermark 5"):
        coordinator.restore()


# ------------------------------------------------------------------ falling back

def damaged(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1:]


def as_json(value):
    return orjson.loads(orjson.dumps(value))


class Recorded:
    """A MemoryPipeline over finance.cep, two keyed partitions, whose keyed and match
    frames are kept per partition in order (a topic's records: index = offset)."""

    def __init__(self):
        self.lines = made.input_lines("trades.jsonl")
        pipe = self.pipe = MemoryPipeline("trades", partitions=2)
        for name, text in split_query_file((made.INPUT / "finance.cep").read_text()):
            pipe.control(ControlMessage("add", name, text))
        self.keyed = {0: [], 1: []}
        self.matches = {0: [], 1: []}
        keyed, matches = pipe._keyed, pipe._matches
        self.to_partition, self.to_merger = keyed, matches

        def keep_keyed(_, value, partition, headers):
            self.keyed[partition].append((value, headers))
            keyed(_, value, partition, headers)

        def keep_matches(merger, value, partition, headers):
            self.matches[partition].append((value, headers))
            matches(merger, value, partition, headers)
        pipe._keyed, pipe._matches = keep_keyed, keep_matches
        self.sent = 0

    def send_until(self, end: int) -> None:
        for at in range(self.sent, end, made.BATCH):
            self.pipe.send(self.lines[at:min(at + made.BATCH, end)])
        self.sent = end

    def finish(self) -> dict:
        self.send_until(len(self.lines))
        self.pipe.end()
        return as_json(self.pipe.outputs)


def uninterrupted() -> dict:
    return Recorded().finish()


def test_a_worker_restores_the_snapshot_before_a_damaged_one_and_replays_to_the_same_output(
        monkeypatch):
    expected = uninterrupted()
    run = Recorded()
    third, half = len(run.lines) // 3, len(run.lines) // 2
    run.send_until(third)
    older = {p: part.snapshot(0) for p, part in enumerate(run.pipe.parts)}
    at_older = [part.offset for part in run.pipe.parts]
    run.send_until(half)
    newer = {p: part.snapshot(1) for p, part in enumerate(run.pipe.parts)}
    assert at_older[0] < run.pipe.parts[0].offset  # partition 0 has frames to replay
    monkeypatch.setattr(worker_module, "read_latest", state_topic(
        {b"0": older[0], b"0.alt": damaged(newer[0]), b"1": older[1], b"1.alt": newer[1]}))
    events = logged(monkeypatch, worker_module)
    marks = watermarks({(TOPICS.keyed, p): (0, len(run.keyed[p])) for p in (0, 1)})
    restored = new_worker(marks).restore([0, 1])  # the worker killed at half, restarted

    assert (restored[0].generation, restored[0].offset) == (0, at_older[0])
    assert (restored[1].generation, restored[1].offset) == (1, len(run.keyed[1]))
    assert [e["event"] for e in events] == ["checkpoint_refused", "checkpoint_fallback"]
    assert "partition snapshot is damaged" in events[0]["reason"]
    for p, state in restored.items():  # consumption resumes at the snapshots' offsets
        state.topics = run.pipe.topics
        run.pipe.parts[p] = state
        run.pipe.keyed_offset[p] = state.offset
        for value, headers in run.keyed[p][state.offset:]:
            run.to_partition(None, value, p, headers)
    assert run.finish() == expected  # the replayed composites were dropped as repeats


def coordinator_checkpoint(run: Recorded, generation: int) -> bytes:
    """What the coordinator writes at this point of the run (Coordinator.checkpoint)."""
    sent = []
    producer = SimpleNamespace(produce=lambda topic, value, key=None, partition=None,
                               headers=None: sent.append((key, value)),
                               flush=lambda timeout=0: 0, poll=lambda timeout=0: 0)
    coordinator = SimpleNamespace(
        offsets=[len(run.matches[p]) for p in (0, 1)], saved=None, merger=run.pipe.merger,
        generation=generation - 1, shard=0, state_key=b"coordinator", topics=TOPICS,
        delivered={o: len(found) - 1 for o, found in run.pipe.outputs.items()},
        reported_ends=0, deliveries=SimpleNamespace(failed=None),
        metrics=SimpleNamespace(checkpointed=lambda generation, took_s=None: None))
    Coordinator.checkpoint(coordinator, producer)
    ((key, value),) = sent
    assert key == slot_key(b"coordinator", generation)
    return value


class Record:
    """A record of an INTO topic as `written_since` gives it."""

    def __init__(self, offset: int, composite: dict, index: int):
        self._offset, self._composite, self._index = offset, composite, index

    def offset(self):
        return self._offset

    def value(self):
        return orjson.dumps(self._composite)

    def headers(self):
        return [(PIPELINE_HEADER, b"cep.trades.coordinator"),
                ("cep.index", str(self._index).encode())]


def test_a_coordinator_restores_the_checkpoint_before_a_truncated_one_and_replays_to_the_same_output(  # noqa: E501
        monkeypatch):
    expected = uninterrupted()
    run = Recorded()
    third, half = len(run.lines) // 3, len(run.lines) // 2
    run.send_until(third)
    older = coordinator_checkpoint(run, 0)
    at_older = [len(run.matches[p]) for p in (0, 1)]
    run.send_until(half)
    newer = coordinator_checkpoint(run, 1)
    truncated = newer[:len(newer) - 40]  # the tester's case: every restart died on it

    monkeypatch.setattr(coordinator_module, "read_latest", state_topic(
        {b"coordinator": older, b"coordinator.alt": truncated}))
    index = {q.name: q.index for q in run.pipe.merger.queries.values()}
    monkeypatch.setattr(coordinator_module, "written_since", lambda settings, output, after,
                        pipeline: [Record(i, c, index[c["query"]]) for i, c in
                                   enumerate(run.pipe.outputs.get(output, [])) if i > after])
    monkeypatch.setattr(coordinator_module, "ensure_topics",
                        lambda settings, topics, **kw: {t: 1 for t in topics})
    events = logged(monkeypatch, coordinator_module)
    coordinator = Coordinator(NOWHERE, TOPICS, partitions=2, registry=run.pipe.registry)
    coordinator.watermarks = watermarks({(TOPICS.matches, p): (0, len(run.matches[p]))
                                         for p in (0, 1)})
    coordinator.restore()

    assert coordinator.offsets == at_older and coordinator.generation == 0
    assert [e["event"] for e in events] == ["checkpoint_refused", "checkpoint_fallback",
                                            "coordinator_restored"]
    assert events[0]["key"] == "coordinator.alt"
    assert "coordinator checkpoint is truncated or damaged" in events[0]["reason"]
    run.pipe.merger = run.pipe.mergers[0] = coordinator.merger
    before = as_json(run.pipe.outputs)
    for p in (0, 1):  # the match topic again from the checkpoint's offsets
        for value, headers in run.matches[p][coordinator.offsets[p]:]:
            run.to_merger(coordinator.merger, value, p, headers)
    assert as_json(run.pipe.outputs) == before  # nothing released twice
    assert coordinator.merger.repeats > 0
    assert run.finish() == expected


def test_a_splitter_restores_the_checkpoint_before_a_damaged_one_and_stamps_the_same_seqs(
        monkeypatch):
    source = splitter_test.source_messages()
    total = sum(len(m) - 1 for m in source.values())
    order = []  # the consumption order: 20 of each partition in turn, then the markers
    for at in range(0, max(map(len, source.values())), 20):
        for p in sorted(source):
            order.extend(m for m in source[p][at:at + 20] if m.value())
    order.extend(messages[-1] for messages in source.values())
    steps = splitter_test.steps_of(order, 25)
    whole = splitter_test.new_splitter(0)
    for step in steps:
        whole.take(step)
    expected = splitter_test.stamped(whole)

    first = splitter_test.new_splitter(0)
    checkpoints, done = [], 0
    for upto in (len(steps) // 3, len(steps) // 2):
        for step in steps[done:upto]:
            first.take(step)
        done = upto
        taken = [m for step in steps[:upto] for m in step]
        first.source = splitter_test.Source(
            {p: max([m.offset() + 1 for m in taken if m.partition() == p], default=0)
             for p in source})
        first.commit()
        checkpoints.append([(key, value) for topic, value, key, _, _ in first.producer.sent
                            if topic == first.topics.state][-1])
    (older_key, older), (newer_key, newer) = checkpoints
    assert (older_key, newer_key) == (SPLITTER_KEY, SPLITTER_KEY + b".alt")

    monkeypatch.setattr(splitter_module, "read_latest", state_topic(
        {older_key: older, newer_key: damaged(newer)}))
    monkeypatch.setattr(splitter_module, "logged_steps", lambda *a: [])
    events = logged(monkeypatch, splitter_module)
    second = splitter_test.new_splitter(0)
    second.watermarks = watermarks({**{("src", p): (0, len(source[p])) for p in source},
                                    **{(second.topics.keyed, p): (0, 10**6)
                                       for p in range(4)}})
    resume = second._resume_at([TopicPartition("src", p) for p in sorted(source)])
    assert second.generation == 0 and second.position == orjson.loads(older)["position"]
    assert [e["event"] for e in events] == ["checkpoint_refused", "checkpoint_fallback"]
    at = {tp.partition: tp.offset for tp in resume}
    for step in steps[len(steps) // 3:]:  # taken again in the same order from its offsets
        second.take([m for m in step if m.offset() >= at[m.partition()]])
    after = splitter_test.stamped(second)
    assert after and all(after[seq] == expected[seq] for seq in after)
    splitter_test.assert_complete(splitter_test.stamped(first, second), total)
    splitter_test.assert_ends_last(second, total)
