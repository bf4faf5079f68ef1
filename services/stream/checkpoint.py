"""Reading checkpoints back: the newest record per key of a state topic, the newest good
checkpoint of a service among the last two, offsets checked against the broker's, and
what a coordinator wrote to an output topic after its last checkpoint, the splitter's
logged consumption order (services/stream/splitter_order.py).

The reads are bounded by the fetch high-watermark (ListOffsets "latest" is wrong on tansu,
docs/broker.md) and keep only what they need in memory: tansu does not compact, so a
state topic holds every snapshot ever written.

The last two checkpoints (docs/snapshots.md, "Damaged checkpoints"): a service numbers
its checkpoints (`generation`, in the envelope) and writes the even ones under its key
(`0`, `splitter`, `coordinator`) and the odd ones under the key with `.alt` after it. A
compacted state topic keeps the newest record of each key, so the two newest checkpoints
always survive compaction, at no extra bytes. A restart tries them newest first
(`restore_newest`): one whose checksum, identity or offsets are refused is logged and
the previous one is restored instead; replaying from its offsets gives the same output
(the same as a crash just after it was written).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cep_core import snapshot_format
from cep_core.snapshot_format import SnapshotError
from cep_service.stream.kafka import KafkaSettings
from cep_service.stream.serve import log
from cep_service.stream.splitter_order import ORDER_HEADER

T = TypeVar("T")
ALT = b".alt"  # the key suffix of the odd generations

PIPELINE_HEADER = "cep.pipeline"  # on output records: the coordinator group that wrote them


def read_partitions(settings: KafkaSettings, partitions: list[TopicPartition],
                    visit: Callable[[Any], None],
                    timeout_s: float = 30.0, idle_s: float = 2.0) -> None:
    """Call `visit(message)` for every message from the given offsets up to the fetch
    high-watermark of each partition."""
    consumer = settings.consumer()
    try:
        consumer.assign(partitions)
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            messages = consumer.consume(10000, 0.05)
            for message in messages:
                if not message.error():
                    visit(message)
            if messages:
                quiet_since = time.monotonic()
            if _caught_up(consumer, partitions) or time.monotonic() - quiet_since > idle_s:
                return
        raise TimeoutError(f"reading {partitions[0].topic} took over {timeout_s} s")
    finally:
        consumer.close()


def _caught_up(consumer: Any, partitions: list[TopicPartition]) -> bool:
    for start, at in zip(partitions, consumer.position(partitions)):
        _, high = consumer.get_watermark_offsets(at, cached=True)
        if high < 0:
            return False  # no fetch answered yet
        offset = at.offset if at.offset >= 0 else start.offset  # nothing read yet: the start
        if high > 0 and (offset < 0 or offset < high):
            return False
    return True


def read_latest(settings: KafkaSettings, topic: str,
                located: dict | None = None) -> dict[bytes, bytes]:
    """The newest value of each key of a (compacted) topic; {} when the topic is absent.
    `located`, when given, gets key -> (partition, offset) of each value returned."""
    probe = settings.consumer()
    try:
        metadata = probe.list_topics(topic, timeout=10).topics.get(topic)
    finally:
        probe.close()
    if metadata is None or metadata.error is not None:
        return {}
    latest: dict[bytes, bytes] = {}

    def keep(message: Any) -> None:
        if message.key() is not None:
            latest[message.key()] = message.value()
            if located is not None:
                located[message.key()] = (message.partition(), message.offset())

    read_partitions(settings, [TopicPartition(topic, p, OFFSET_BEGINNING)
                               for p in metadata.partitions], keep)
    return latest


# ------------------------------------------------------------------ the last two

def slot_key(key: bytes, generation: int) -> bytes:
    """The state-topic key of checkpoint `generation` of the service whose key is `key`."""
    return key if generation % 2 == 0 else key + ALT


@dataclass
class Saved:
    """A checkpoint as read from the state topic, and where it was."""

    key: bytes
    value: bytes
    topic: str
    partition: int | None = None
    offset: int | None = None

    def where(self) -> str:
        at = "" if self.partition is None else \
            f" partition {self.partition} offset {self.offset}"
        return f"the record of key {self.key.decode(errors='replace')!r} on {self.topic}{at}"


def saved_checkpoints(latest: dict[bytes, bytes], key: bytes, topic: str,
                      located: dict | None = None) -> list[Saved]:
    """The checkpoints of `key` among the newest records of a state topic (`read_latest`):
    both generations' keys, those present."""
    located = located or {}
    return [Saved(k, latest[k], topic, *located.get(k, (None, None)))
            for k in (key, key + ALT) if latest.get(k) is not None]


def restore_newest(kind: str, saved: list[Saved], restore: Callable[[Saved], T],
                   log: Callable[..., None], **expect: Any) -> tuple[T, Saved] | None:
    """Restore the newest of `saved` that can be: checkpoints whose checksum or identity
    (`expect`) is refused are skipped, the others tried in the order of their generation,
    newest first; one whose `restore(saved)` raises SnapshotError (implausible offsets) is
    skipped too. Every refusal is logged (`checkpoint_refused`) and so is a fall-back to an
    older one (`checkpoint_fallback`). None when there is nothing saved; SnapshotError,
    with every refusal and what to do, when none could be restored."""
    refused: list[str] = []
    good = []
    for one in saved:
        try:
            envelope = snapshot_format.check(kind, one.value, one.where(), **expect)
            good.append((envelope.generation or 0, -(one.offset or 0), one))
        except SnapshotError as e:
            refused.append(str(e))
            log("checkpoint_refused", level="error", kind=kind, key=one.key.decode(
                errors="replace"), partition=one.partition, offset=one.offset, reason=str(e))
    good.sort(key=lambda g: (-g[0], g[1]))
    for generation, _, one in good:
        try:
            restored = restore(one)
        except SnapshotError as e:
            refused.append(str(e))
            log("checkpoint_refused", level="error", kind=kind, key=one.key.decode(
                errors="replace"), partition=one.partition, offset=one.offset, reason=str(e))
            continue
        if refused:
            log("checkpoint_fallback", level="warning", kind=kind, generation=generation,
                key=one.key.decode(errors="replace"), partition=one.partition,
                offset=one.offset, refused=len(refused))
        return restored, one
    if not refused:
        return None
    raise SnapshotError(
        f"no {kind} checkpoint on {saved[0].topic} can be restored ("
        f"{', '.join(repr(s.key.decode(errors='replace')) for s in saved)}): "
        + "; ".join(refused) + ". The service cannot go on from where it was without one: "
        "if an earlier release or a copy of the topic has a good one, write it back under "
        f"the key; {snapshot_format.KINDS[kind].discard}")


# ------------------------------------------------------------------ plausible offsets

@dataclass(frozen=True)
class Offset:
    """An offset to read next that a checkpoint holds, to check against the broker's
    watermarks: low <= offset <= high."""

    topic: str
    partition: int
    offset: int
    name: str = "offset"  # what the checkpoint calls it (for the message)


# (low, high) watermarks per (topic, partition) on the broker; None: no such partition
Watermarks = dict[tuple[str, int], tuple[int, int] | None]
# a function as `broker_watermarks` with its settings
AskWatermarks = Callable[[list[tuple[str, int]]], Watermarks]


def broker_watermarks(settings: KafkaSettings, wanted: Iterable[tuple[str, int]],
                      timeout_s: float = 30.0) -> Watermarks:
    """(low, high) watermarks of the (topic, partition)s `wanted` on the broker: low from
    ListOffsets "earliest", high from a fetch's high-watermark (ListOffsets "latest" is
    wrong on tansu, docs/broker.md); None for a partition that does not exist."""
    wanted = list(dict.fromkeys(wanted))
    # small fetches, and no backing off a partition whose first records are queued: the
    # answer is the fetch's high-watermark, not the records
    small: dict[str, Any] = {"enable.auto.commit": False, "max.partition.fetch.bytes": 1024,
                             "queued.min.messages": 1, "fetch.queue.backoff.ms": 0}
    consumer = settings.consumer(**small)
    try:
        topics = consumer.list_topics(timeout=10).topics
        out: dict = {tp: None for tp in wanted}
        present = [tp for tp in wanted if tp[0] in topics and topics[tp[0]].error is None
                   and tp[1] in topics[tp[0]].partitions]
        if not present:
            return out
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in present])
        # Deliberately like services/spark_stream/kafka_source.py's _read_runs: the same
        # assign-and-poll-until-deadline loop, but this one only waits for each partition's high
        # watermark and that one keeps the records of a range.
        pending = set(present)
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no fetch of {sorted(pending)} answered within "
                                   f"{timeout_s} s: their watermarks are unknown")
            consumer.consume(100, 0.05)
            for tp in list(pending):
                _, high = consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
                if high >= 0:
                    low, _ = consumer.get_watermark_offsets(TopicPartition(*tp), timeout=10,
                                                            cached=False)
                    out[tp] = (max(low, 0), high)
                    pending.discard(tp)
        return out
    finally:
        consumer.close()


class AskOnce:
    """Watermarks (a function as `broker_watermarks` with its settings) asked once per
    partition, all of `first` with the first question."""

    def __init__(self, watermarks: AskWatermarks,
                 first: Iterable[tuple[str, int]] = ()) -> None:
        self.watermarks, self.first = watermarks, list(first)
        self.known: dict = {}

    def __call__(self, wanted: Iterable[tuple[str, int]]) -> dict:
        need = [tp for tp in dict.fromkeys([*wanted, *self.first]) if tp not in self.known]
        self.first = []
        if need:
            self.known.update(self.watermarks(need))
        return {tp: self.known[tp] for tp in wanted}


def check_offsets(watermarks: AskWatermarks | None, offsets: list[Offset], where: str) -> None:
    """Refuse (SnapshotError, with the numbers) a checkpoint holding an offset the broker
    cannot have given: an offset to read next past the partition's high watermark, below
    its low one (records deleted unread), of a partition that does not exist.
    `watermarks(list of (topic, partition))` answers as `broker_watermarks` does; None: no
    broker to ask (the cores' tests), nothing is checked."""
    if watermarks is None or not offsets:
        return
    marks = watermarks([(o.topic, o.partition) for o in offsets])
    wrong = []
    for o in offsets:
        mark = marks.get((o.topic, o.partition))
        said = f"{o.name} {o.offset} of {o.topic} partition {o.partition}"
        if mark is None:
            wrong.append(f"{said}: the broker has no such partition")
            continue
        low, high = mark
        holds = f"the broker holds offsets {low} to {high - 1}" if high > low else \
            f"the partition is empty, its next offset {high}"
        if o.offset > high:
            wrong.append(f"{said} is past the high watermark {high} ({holds})")
        elif o.offset < low:
            wrong.append(f"{said} is below the low watermark {low} ({holds}: offsets "
                         f"{o.offset} to {low - 1} were deleted before they were read)")
    if wrong:
        raise SnapshotError(f"{where}: implausible offsets, refused: " + "; ".join(wrong)
                            + " (a topic deleted and made again, another cluster, an edited "
                            "checkpoint?)")


def written_since(settings: KafkaSettings, topic: str, after: int, pipeline: str) -> list:
    """The records of partition 0 of `topic` after offset `after` (-1: all) that carry
    `pipeline` in their PIPELINE_HEADER, in offset order."""
    out = []
    tag = pipeline.encode()

    def keep(message: Any) -> None:
        if (PIPELINE_HEADER, tag) in (message.headers() or ()):
            out.append(message)

    start = after + 1 if after >= 0 else OFFSET_BEGINNING
    read_partitions(settings, [TopicPartition(topic, 0, start)], keep)
    return out


def logged_steps(settings: KafkaSettings, keyed: str, partitions: int,
                 keyed_next: dict[int, int], after: int) -> list[list[list[int]]]:
    """The runs of steps `after + 1, after + 2, ...` found in the `order` headers of the
    keyed topic's frames from `keyed_next` on (the beginning where it has no offset)."""
    found: dict[int, list] = {}
    name = ORDER_HEADER

    def visit(message: Any) -> None:
        for key, value in message.headers() or ():
            if key == name:
                order = orjson.loads(value)
                if order["step"] > after:
                    found.setdefault(order["step"], order["runs"])

    read_partitions(settings, [TopicPartition(keyed, p, keyed_next.get(p, OFFSET_BEGINNING))
                               for p in range(partitions)], visit)
    steps = []
    for number in range(after + 1, max(found, default=after) + 1):
        if number not in found:  # cannot happen while each partition keeps produce order
            log("splitter_order_gap", level="error", step=number, found=len(found))
            break
        steps.append(found[number])
    return steps
