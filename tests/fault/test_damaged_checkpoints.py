"""Damaged checkpoints on a real broker (issue 27, "State that cannot lie"): every service
of a `cep serve` pipeline is SIGKILLed mid-stream, the newest checkpoint of each on the
state topic is damaged (a changed byte in the splitter's and in every worker partition's,
the coordinator's cut in half: the case where every restart used to die), and the
services are started again. Each refuses its damaged checkpoint, restores the one before
it (the last two stay on the compacted topic under two keys, services/stream/checkpoint.py)
and replays from its offsets; the INTO topics equal the reference run exactly and no
service dies. Waits are on the pipeline's progress (released composites, checkpoints on
the state topic, log events), with timeouts only as upper bounds."""

from __future__ import annotations

import random

from cep_core import snapshot_format as fmt
from cep_service.stream.checkpoint import ALT, broker_watermarks, read_latest
from cep_service.stream.kafka import KafkaSettings, ensure_topics, produce
from cep_service.stream.pipeline import wait_for
from tests.fault.harness import Pipeline, after_released, assert_exact

PARTITIONS = 4


def kind_of(base: bytes) -> str:
    return "splitter" if base == b"splitter" else \
        "coordinator" if base.startswith(b"coordinator") else "partition"


def checkpoints(pipe: Pipeline) -> dict[bytes, list[tuple[int, bytes, bytes]]]:
    """Per service key (splitter, coordinator, each keyed partition): its checkpoints on
    the state topic, (generation, key, value), newest first."""
    out: dict[bytes, list] = {}
    for key, value in read_latest(pipe.settings, pipe.topics.state).items():
        base = key.removesuffix(ALT)
        envelope = fmt.check(kind_of(base), value)
        out.setdefault(base, []).append((envelope.generation, key, value))
    return {base: sorted(found, reverse=True) for base, found in out.items()}


def two_of_each(pipe: Pipeline) -> bool:
    """Every service has written two checkpoints at least (both keys hold one)."""
    found = checkpoints(pipe)
    wanted = [b"splitter", b"coordinator"] + [str(p).encode() for p in range(PARTITIONS)]
    return all(len(found.get(base, ())) == 2 for base in wanted)


def damage(value: bytes, base: bytes) -> bytes:
    if kind_of(base) == "coordinator":
        return value[:len(value) // 2]  # truncated
    middle = len(value) // 2
    return value[:middle] + bytes([value[middle] ^ 0x04]) + value[middle + 1:]


def test_each_service_restores_the_checkpoint_before_a_damaged_one(kafka_bootstrap,
                                                                    tmp_path):
    pipe = Pipeline(kafka_bootstrap, tmp_path, workers=1, partitions=PARTITIONS,
                    checkpoint_ms=500)
    try:
        pipe.start_all()
        wait_for(lambda: pipe.log_events("worker0", "partitions_assigned"), 90, "worker0 up")
        producing = pipe.produce_slowly(chunk=30, pause_s=0.3, holds=[600])
        held = producing.wait_held()
        after_released(pipe, random.Random(27).randint(1, pipe.released_by(held)))
        wait_for(lambda: two_of_each(pipe), 90, "two checkpoints of every service",
                 interval_s=0.5)
        for role in pipe.roles:
            pipe.kill(role)
        newest = {base: found[0] for base, found in checkpoints(pipe).items()}
        producer = pipe.settings.producer()
        for base, (_, key, value) in newest.items():
            produce(producer, pipe.topics.state, damage(value, base), key=key)
        assert producer.flush(30) == 0  # the damaged ones are now their keys' newest

        pipe.start_all()
        producing.release()
        assert_exact(pipe)  # every service still running (none died), output exact

        fallbacks = {role: pipe.log_events(role, "checkpoint_fallback")
                     for role in pipe.roles}
        refused = {role: pipe.log_events(role, "checkpoint_refused") for role in pipe.roles}
        assert [e["key"] for e in fallbacks["splitter"]] == ["splitter" if newest[
            b"splitter"][1].endswith(ALT) else "splitter.alt"]
        assert len(fallbacks["coordinator"]) == 1
        assert "coordinator checkpoint is truncated or damaged" in \
            refused["coordinator"][0]["reason"]
        fell_back = {e["key"].removesuffix(ALT.decode()) for e in fallbacks["worker0"]}
        assert fell_back == {str(p) for p in range(PARTITIONS)}
        assert all("snapshot is damaged: its bytes do not match its checksum" in e["reason"]
                   for e in refused["worker0"])
        restored = pipe.log_events("coordinator", "coordinator_restored")[-1]
        assert restored["generation"] == newest[b"coordinator"][0] - 1
        print("restore after a damaged checkpoint: " + ", ".join(
            f"{e['role']} {e.get('restore_ms')} ms" for e in
            pipe.log_events("worker0", "partitions_assigned")[-1:]
            + pipe.log_events("coordinator", "coordinator_restored")[-1:]))
    finally:
        pipe.stop_all()


def test_watermarks_come_from_the_broker(kafka_bootstrap):
    settings = KafkaSettings(kafka_bootstrap)
    topic = f"marks.{random.Random().randrange(10**9)}"
    ensure_topics(settings, {topic: 2})
    producer = settings.producer()
    for i in range(5):
        produce(producer, topic, b"x%d" % i, partition=0)
    assert producer.flush(30) == 0
    assert broker_watermarks(settings, [(topic, 0), (topic, 1), (topic, 2), ("nope", 0)]) == {
        (topic, 0): (0, 5), (topic, 1): (0, 0), (topic, 2): None, ("nope", 0): None}


def test_chained_restores_the_cut_before_a_damaged_one(kafka_bootstrap, tmp_path):
    """The chained pipeline's checkpoint is one cut of every core: one damaged piece (a
    changed byte in a partition's snapshot of the newest cut) refuses the whole cut, and
    the restart restores the cut before it, whole, and replays from its offsets: the INTO
    topics equal the reference exactly."""
    from cep_service.stream.chained import CHAINED_KEY, part_key
    from cep_service.stream.checkpoint import slot_key

    pipe = Pipeline(kafka_bootstrap, tmp_path, mode="chained", partitions=PARTITIONS,
                    checkpoint_ms=500)
    try:
        pipe.start_all()
        pipe.wait_up()
        producing = pipe.produce_slowly(chunk=30, pause_s=0.3, holds=[600])
        held = producing.wait_held()
        after_released(pipe, random.Random(33).randint(1, pipe.released_by(held)))
        wait_for(lambda: {CHAINED_KEY, CHAINED_KEY + ALT} <=
                 set(read_latest(pipe.settings, pipe.topics.state)), 90, "two cuts",
                 interval_s=0.5)
        pipe.kill("chained")
        newest = pipe.splitter_checkpoint()["generation"]
        key = slot_key(part_key(1), newest)
        value = read_latest(pipe.settings, pipe.topics.state)[key]
        producer = pipe.settings.producer()
        produce(producer, pipe.topics.state, damage(value, key), key=key)
        assert producer.flush(30) == 0

        pipe.start_all()
        producing.release()
        assert_exact(pipe)

        refused = pipe.log_events("chained", "checkpoint_refused")
        assert len(refused) == 1 and key.decode() in refused[0]["reason"]
        assert "its bytes do not match its checksum" in refused[0]["reason"]
        fallbacks = pipe.log_events("chained", "checkpoint_fallback")
        assert [e["generation"] for e in fallbacks] == [newest - 1]
    finally:
        pipe.stop_all()
