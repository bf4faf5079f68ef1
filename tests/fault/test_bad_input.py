"""Bad input on a real broker: a stream with 5% bad records of every class goes through
splitter, workers and coordinator (distributed, and chained). Every good record is
processed (the composite events are exactly the reference interpreter's over the good
records at their positions) and every bad one is in the dead-letter topic with its reason,
its original bytes, its source offset and partition; the splitter's dead-letter counter
counts them."""

from __future__ import annotations

import base64
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
MAX_BYTES = 4096

# (class, make bad bytes from a good record, expected reason prefix)
BAD = [
    ("not json", lambda r: b'{"type": "O", "item": ', "not valid JSON"),
    ("not utf-8", lambda r: b"\xff\xfe\x00garbage", "not valid JSON"),
    ("not an object", lambda r: b"[1, 2, 3]", "not a JSON object"),
    ("missing attribute", lambda r: orjson.dumps({k: v for k, v in r.items() if k != "item"}),
     "missing attribute 'item'"),
    ("string for a number", lambda r: orjson.dumps({**r, "item": str(r["item"])}),
     "attribute 'item': expected int"),
    ("unknown event type", lambda r: orjson.dumps({**r, "type": "Z"}), "unknown event type"),
    ("NaN", lambda r: orjson.dumps(r).replace(b'"item":', b'"item":NaN,"x":'),
     "not valid JSON"),
    ("infinity", lambda r: orjson.dumps(r)[:-1] + b',"w":Infinity}', "not valid JSON"),
    ("oversized", lambda r: orjson.dumps({**r, "pad": "x" * (MAX_BYTES + 10)}),
     "message of"),
]


@pytest.fixture
def broker(kafka_bootstrap):
    return KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)


@pytest.mark.parametrize("chained", [False, True], ids=["distributed", "chained"])
def test_five_percent_bad_input_every_class(broker, chained):
    run = uuid.uuid4().hex[:8]
    queries, topics, before = topics_with_queries(broker, QUERIES, f"src.bad.{run}", f"t{run}")
    schema = queries[0].schema

    rng = random.Random(7)
    good_lines = file_records(EVENTS)
    records, bad = [], {}  # bad: position -> (bytes, reason prefix)
    for line in good_lines:
        if rng.random() < 0.05 or len(bad) < len(BAD):
            _, make, reason = BAD[len(bad) % len(BAD)]
            bad[len(records)] = (make(orjson.loads(line)), reason)
            records.append(bad[len(records)][0])
        records.append(line)
    assert 0.04 < len(bad) / len(records) < 0.1
    good = [decode_record(orjson.loads(raw), schema, position)
            for position, raw in enumerate(records) if position not in bad]

    with LocalPipeline(broker, topics, workers=2, chained=chained) as pipeline:
        pipeline.splitter.max_message_bytes = MAX_BYTES
        produce_to_end(broker, pipeline, topics.source, records)
        assert pipeline.metrics[0].dead_letters._value.get() == len(bad)

    for q in queries:
        got = [orjson.loads(m.value()) for m in read_all(broker, q.query.output)]
        want = [c for c in reference.run(queries, good) if c["query"] == q.name]
        assert want, q.name
        assert got[before[q.query.output]:] == want, q.name
    letters = [orjson.loads(m.value()) for m in read_all(broker, topics.dead_letters)]
    letters = {d["position"]: d for d in letters if d["source"] == topics.source}
    assert set(letters) == set(bad)
    for position, (raw, reason) in bad.items():
        letter = letters[position]
        assert letter["reason"].startswith(reason), (letter, reason)
        assert letter["offset"] == position and letter["partition"] == 0
        original = base64.b64decode(letter["raw_base64"]) if "raw_base64" in letter \
            else letter["raw"].encode()
        assert original == raw[:MAX_BYTES]
