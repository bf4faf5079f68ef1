"""Event-time disorder on a real broker with `allowed_lateness_ms`: events whose time goes
backwards by at most the lateness are put back in time order before the engines see them;
later ones go to the late-events topic (cep.<stream>.late) with their bytes, offset and
reason, never into the engines. Seqs are given in release order, so the composite events
are exactly the reference interpreter's over the released events in (ts, arrival) order."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import orjson
import pytest

from cep_core import reference
from cep_core.event_io import decode_record
from cep_service.stream.kafka import KafkaSettings, read_all
from cep_service.stream.pipeline import LocalPipeline
from stream_harness import file_records, produce_to_end, topics_with_queries

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ROOT / "examples" / "rfid.cep"
EVENTS = ROOT / "examples" / "data" / "rfid.jsonl"
LATENESS_MS = 60_000


@pytest.fixture
def broker(kafka_bootstrap):
    return KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)


def _disordered(lines: list[bytes]) -> list[dict]:
    """Times jittered back by up to 1.5x the lateness, and every 40th far behind."""
    rng = random.Random(3)
    out = []
    for i, line in enumerate(lines):
        record = orjson.loads(line)
        back = 100 * LATENESS_MS if i % 40 == 39 else rng.randrange(0, LATENESS_MS * 3 // 2)
        out.append({**record, "ts": record["ts"] - back})
    return out


@pytest.mark.parametrize("chained", [False, True], ids=["distributed", "chained"])
def test_disorder_within_lateness_is_reordered_and_later_events_go_to_late_topic(broker,
                                                                                 chained):
    run = uuid.uuid4().hex[:8]
    queries, topics, before = topics_with_queries(broker, QUERIES, f"src.late.{run}", f"t{run}")
    schema = queries[0].schema
    records = _disordered(file_records(EVENTS))

    late, kept, newest = [], [], None
    for position, record in enumerate(records):  # the event-at-a-time model
        if newest is not None and record["ts"] < newest - LATENESS_MS:
            late.append(position)
        else:
            kept.append((record["ts"], position))
        newest = max(newest or record["ts"], record["ts"])
    assert 0 < len(late) < len(records) // 5
    released = [decode_record(records[p], schema, seq) for seq, (_, p) in enumerate(sorted(kept))]

    with LocalPipeline(broker, topics, workers=2, chained=chained,
                       splitter_options={"allowed_lateness_ms": LATENESS_MS}) as pipeline:
        produce_to_end(broker, pipeline, topics.source, map(orjson.dumps, records))
        assert pipeline.metrics[0].late_events._value.get() == len(late)

    for q in queries:
        got = [orjson.loads(m.value()) for m in read_all(broker, q.query.output)]
        want = [c for c in reference.run(queries, released) if c["query"] == q.name]
        assert got[before[q.query.output]:] == want, q.name
    assert any(reference.run(queries, released))
    letters = [orjson.loads(m.value()) for m in read_all(broker, topics.late)]
    assert sorted(d["position"] for d in letters) == late
    for letter in letters:
        assert letter["offset"] == letter["position"] and letter["partition"] == 0
        assert orjson.loads(letter["raw"]) == records[letter["position"]]
        assert letter["reason"].startswith("late: event time")
    engine_letters = [orjson.loads(m.value()) for m in read_all(broker, topics.dead_letters)]
    assert not [d for d in engine_letters if "backwards" in d["reason"]]


@pytest.mark.parametrize("mode", ["distributed", "chained"])
def test_splitter_killed_with_events_waiting_in_the_reorder_buffer(kafka_bootstrap, tmp_path,
                                                                   mode):
    """The reorder buffer is in the splitter's checkpoint (the chain's cut): a splitter
    (the chained process) SIGKILLed (twice) while events wait in it resumes where the
    oldest waiting event was read, puts the waiting ones back and drops the rest of what
    it reads again, so the INTO topics equal a run without the kills exactly. The
    producer stops after 400 and 800 events; each kill comes once composite events are
    out and a checkpoint holds every event written so far, some of them waiting (the
    newest always are), and the producer goes on while the splitter is down."""
    from tests.fault.harness import (Pipeline, after_released, assert_exact, restart,
                                     waiting_in_checkpoint)

    lateness = 30_000
    pipe = Pipeline(kafka_bootstrap, tmp_path, workers=1, checkpoint_ms=1000, mode=mode,
                    CEP_ALLOWED_LATENESS_MS=str(lateness))
    splitter, started = ("chained", "chained_started") if mode == "chained" else \
        ("splitter", "splitter_started")
    rng = random.Random(5)
    records = [orjson.loads(line) for line in pipe.lines]
    for record in records:  # jittered back by up to the lateness: nothing is late
        record["ts"] -= rng.randrange(0, lateness)
    pipe.lines = [orjson.dumps(r) for r in records]
    order = sorted(range(len(records)), key=lambda p: (records[p]["ts"], p))
    schema = pipe.queries[0].schema
    found = reference.run(pipe.queries, [decode_record(records[p], schema, seq)
                                         for seq, p in enumerate(order)])
    pipe.expected = {q.query.output: [c for c in found if c["query"] == q.name]
                     for q in pipe.queries}

    def stamped_by(written: int) -> int:
        """How many events are released (stamped) once the first `written` are in: those
        at or below the watermark, the first so many of the release order (none is late)."""
        newest = max(records[p]["ts"] for p in range(written))
        return sum(1 for p in range(written) if records[p]["ts"] <= newest - lateness)

    def checkpointed(written: int) -> bool:
        checkpoint = pipe.splitter_checkpoint()
        return (checkpoint is not None and checkpoint["position"] == written
                and waiting_in_checkpoint(checkpoint) > 0)

    try:
        pipe.start_all()
        pipe.wait_up()
        producing = pipe.produce_slowly(chunk=30, pause_s=0.3, holds=[400, 800])
        for _ in range(2):
            held = producing.wait_held()
            surely = pipe.released_by(stamped_by(held))
            after_released(pipe, rng.randint(min(5, surely), surely))
            pipe.wait_until(lambda h=held: checkpointed(h), "a checkpoint with events waiting")
            restart(pipe, splitter, started, while_down=producing.release)
        assert_exact(pipe)
        restored = pipe.log_events(splitter, "reorder_buffer_restored")
        assert restored and any(r["waiting"] > 0 for r in restored)
    finally:
        pipe.stop_all()
