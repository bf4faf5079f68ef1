"""The control topic survives compaction, on a real broker (the session's
`kafka_bootstrap`): a refused stream update and a refused query update leave the live
versions in place (the splitter writes them back under their keys), and a pipeline
restarted on the topic compacted by hand (the last record of each key, at its offset) has
the live set, and the stream versions, the first one had. Progress is awaited on the
services' state and status records, never on wall-clock sleeps."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson

from cep_core.control_message import REFUSED_HEADER
from cep_service.stream.control import control_log
from cep_service.stream.kafka import KafkaSettings, Topics, ensure_topics, produce
from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_for
from tests.test_live_service import UPS, cep, splitter_up, write

ROOT = Path(__file__).resolve().parent.parent
FILLER = b"query/compacted_away"  # takes the offset of each record compaction removed


def live_of(pipeline: LocalPipeline) -> dict:
    live = pipeline.splitter.queries
    return {"queries": {q.name: (q.index, q.text) for q in live.live.values()},
            "streams": live.registry.versions()}


def compacted_copy(broker: KafkaSettings, source: str, target: str) -> list:
    """Write `target` as compaction leaves `source`: the last record of each key at its
    offset (every record compaction removes becomes a tombstone of an unused key)."""
    log = control_log(broker, source)
    last = {record.key: record.offset for record in log}
    ensure_topics(broker, {target: 1}, compacted=(target,))
    producer = broker.producer()
    for record in log:
        kept = last[record.key] == record.offset
        produce(producer, target, record.value if kept else None,
                key=record.key if kept else FILLER,
                headers=list(record.headers.items()) if kept else None)
    producer.flush(30)
    copy = control_log(broker, target)
    assert [r.offset for r in copy] == [r.offset for r in log]
    return [r for r in copy if r.key != FILLER]


def test_refused_changes_keep_the_live_versions_through_compaction(kafka_bootstrap, tmp_path):
    broker = KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)
    run = uuid.uuid4().hex[:8]
    stream, output = f"cp{run}", f"cp_ups_{run}"
    topics = Topics(stream, source=f"src.{stream}", prefix=f"t{run}")
    create_topics(broker, topics, 2, [output])
    schema = orjson.loads((ROOT / "schemas" / "trades.json").read_bytes())
    schema.update(stream=stream)
    wider = {**schema, "attributes": {**schema["attributes"], "venue": "string"}}
    without_price = {**schema, "attributes": {k: v for k, v in schema["attributes"].items()
                                              if k != "price"}}
    first = UPS.format(name="rises", stream=stream, output=output)
    second = first.replace("( . up up )", "( . up up up )")
    bad = first.replace("price > Last(price)", "nosuch > 1")

    with LocalPipeline(broker, topics, workers=1, partitions=2) as pipeline:
        wait_for(lambda: splitter_up(broker, topics), 60, "the splitter, waiting for its stream")
        for args in (("stream", "add", write(tmp_path / "s.json", orjson.dumps(schema).decode())),
                     ("query", "add", write(tmp_path / "q1.cep", first)),
                     ("query", "update", write(tmp_path / "q2.cep", second)),
                     ("stream", "update", write(tmp_path / "w.json",
                                                orjson.dumps(wider).decode()))):
            done = cep(broker, topics, *args)
            assert done.returncode == 0, done.stdout + done.stderr
        before = live_of(pipeline)
        assert before["queries"] == {"rises": (0, second)}

        for args in (("stream", "update", write(tmp_path / "b.json",
                                                orjson.dumps(without_price).decode())),
                     ("query", "update", write(tmp_path / "bad.cep", bad))):
            refused = cep(broker, topics, *args, "--no-check")
            assert refused.returncode == 1, refused.stdout + refused.stderr
            assert "refused by splitter@" in refused.stdout
        wait_for(lambda: sum(r.republished for r in control_log(broker, topics.control)) == 2,
                 60, "the splitter's write-backs on the control topic", interval_s=0.5)
        assert live_of(pipeline) == before  # the live versions stayed in place
        versions = pipeline.coordinator.merger.registry.versions()
        assert versions == before["streams"]

    log = control_log(broker, topics.control)
    refusals = {r.key: r for r in log if r.republished}
    assert set(refusals) == {b"query/rises", f"stream/{stream}".encode()}
    assert orjson.loads(refusals[b"query/rises"].value)["text"] == second
    assert int(refusals[b"query/rises"].headers[REFUSED_HEADER]) == \
        refusals[b"query/rises"].offset - 1

    copy = Topics(stream, source=topics.source, prefix=topics.prefix,
                  control=f"{topics.prefix}cep.queries.compacted")
    kept = compacted_copy(broker, topics.control, copy.control)
    assert len(kept) == 2 and all(r.republished for r in kept)  # no `add` is left
    with LocalPipeline(broker, copy, workers=1, partitions=2) as restarted:
        wait_for(lambda: restarted.splitter.started, 60, "the restarted splitter")
        assert live_of(restarted) == before
        wait_for(lambda: restarted.coordinator.merger.registry.versions() == versions, 60,
                 "the restarted coordinator's stream versions")
        wait_for(lambda: "rises" in restarted.coordinator.merger.queries, 60,
                 "the restarted coordinator's query")
        assert restarted.coordinator.merger.queries["rises"].text == second
