"""MATCH_RECOGNIZE in the streaming service (issue 32, item 3) on a real broker: added at
run time on the control topic beside a MATCH query, its INTO topic holds exactly the
reference interpreter's composite events from the seq the change holds from until the seq
it is removed at; in both pipeline modes; and a chained pipeline stopped mid-stream and
started again from its cut gives the same output, nothing repeated.

The M-shape as Flink writes it, with AFTER MATCH SKIP TO NEXT ROW: on examples' trades a
third of its matches wait behind an earlier partial match of their symbol and leave with
a later row (MATCH_ROWTIME after their last row's time), so the merge's release of what a
partition holds back (services/stream/merge.py, `held`) is what these tests check."""

from __future__ import annotations

import uuid

import orjson
import pytest

from cep_core import reference
from cep_core.checker import load_queries, load_query_text
from cep_core.event_io import read_events
from cep_core.workloads import MSHAPE_RECOGNIZE_DEFINE
from cep_service.stream.checkpoint import read_latest
from cep_service.stream.control import ControlMessage, publish, split_query_file
from cep_service.stream.kafka import KafkaSettings, Topics, read_all
from cep_service.stream.merge import Merger
from cep_service.stream.metrics import withheld
from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_progressing
from tests.stream_harness import file_records, produce_lines
from tests.test_service_e2e import EXAMPLES

MR = """QUERY mr_mshape INTO {output}
SELECT * FROM trades MATCH_RECOGNIZE (
  PARTITION BY symbol
  ORDER BY ts
  MEASURES FIRST(S.seqNum) AS start_num, LAST(E.seqNum) AS end_num, COUNT(*) AS n,
           MATCH_ROWTIME() AS at
  ONE ROW PER MATCH
  AFTER MATCH SKIP TO NEXT ROW
  """ + MSHAPE_RECOGNIZE_DEFINE + """
) AS T;
"""
TRADES = EXAMPLES / "data" / "trades.jsonl"


@pytest.fixture
def broker(kafka_bootstrap):
    return KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)


def _topics(run: str, mode: str = "c") -> Topics:
    return Topics("trades", source=f"src.trades.{run}", prefix=f"{mode}{run}")


def _outputs(settings, outputs, before: dict[str, int]) -> dict[str, list]:
    return {o: [orjson.loads(m.value()) for m in read_all(settings, o)[before.get(o, 0):]]
            for o in outputs}


def _wait(pipeline: LocalPipeline, condition, what: str) -> None:
    wait_progressing(condition, pipeline.progress, what, stall_s=120)


def _events():
    return read_events(TRADES, load_queries(EXAMPLES / "finance.cep")[0].schema)[0]


def _waited(composites: list[dict], events) -> list[int]:
    """The seqs of the matches that left with a later row than their last (held back)."""
    ts = {e.seq: e.ts for e in events}
    return [c["seq"] for c in composites if c["at"] != ts[c["seq"]]]


def _produce_in_pieces(broker, pipeline, source: str, lines, start: int, stop: int,
                       cuts) -> None:
    """lines[start:stop], each piece up to a cut merged before the next is written: a
    frame then ends right after the last row of a match that waits, and the merge has to
    hold it back while later composites (other symbols') may leave."""
    bounds = sorted({c for c in cuts if start < c < stop} | {stop})
    for end in bounds:
        produce_lines(broker, source, lines[start:end], end=False)
        _wait(pipeline, lambda end=end: min(pipeline.coordinator.merger.upto) >= end - 1,
              f"events up to {end} merged")
        start = end


@pytest.mark.parametrize("chained", [True, False], ids=["chained", "distributed"])
def test_added_beside_a_match_query_then_removed(broker, chained):
    run = uuid.uuid4().hex[:8]
    output = f"mr_tops_{run}"
    text = MR.format(output=output)
    [mr] = load_query_text(text)
    mshape = [q for q in load_queries(EXAMPLES / "finance.cep") if q.name == "mshape"]
    [(name, mshape_text)] = [(n, t) for n, t in split_query_file(
        (EXAMPLES / "finance.cep").read_text()) if n == "mshape"]
    topics = _topics(run, "c" if chained else "d")
    create_topics(broker, topics, 4, ["double_tops", output])
    before = {o: len(read_all(broker, o)) for o in ("double_tops", output)}
    publish(broker, topics.control, ControlMessage("add", name, mshape_text))
    lines = file_records(TRADES)
    events = _events()
    first, second = 300, 1000
    want_m = reference.run(mshape, events)
    want_r = reference.run([mr], events[first:second])
    waits = _waited(want_r, events)
    assert want_m and len(want_r) > 20 and len(waits) > 5
    with LocalPipeline(broker, topics, workers=2, chained=chained) as pipeline:
        coordinator = pipeline.coordinator
        produce_lines(broker, topics.source, lines[:first], end=False)
        _wait(pipeline, lambda: min(coordinator.merger.upto) >= first - 1, "first part")
        publish(broker, topics.control, ControlMessage("add", "mr_mshape", text))
        _wait(pipeline, lambda: any(e["name"] == "mr_mshape" for e in coordinator.lived),
              "mr_mshape live")
        _produce_in_pieces(broker, pipeline, topics.source, lines, first, second,
                           [seq + 1 for seq in waits])
        # Deliberately like tests/test_chained.py's live add and remove: each test spells out
        # its own timeline of changes
        publish(broker, topics.control, ControlMessage("remove", "mr_mshape"))
        _wait(pipeline, lambda: any(e["name"] == "mr_mshape" and e["op"] == "remove"
                                    for e in coordinator.lived), "mr_mshape removed")
        produce_lines(broker, topics.source, lines[second:])
        _wait(pipeline, lambda: coordinator.merger.ended, "end of input released")
    added = [e for e in coordinator.lived if e["name"] == "mr_mshape"][0]
    assert added["at"] == first
    got = _outputs(broker, ["double_tops", output], before)
    assert got == {"double_tops": want_m, output: want_r}


@pytest.mark.parametrize("order", ["ts", "ts, price DESC"])
def test_a_chained_pipeline_started_again_from_its_cut(broker, order):
    """Stopped half way (the cut: every core and the source offsets) with matches of the
    MATCH_RECOGNIZE query partial and waiting, started again: the INTO topics hold exactly
    the reference's composite events, none twice. With `ORDER BY ts, price DESC` each
    partition's rows of its latest time wait in the engine too (held, and in the cut)."""
    run = uuid.uuid4().hex[:8]
    output = f"mr_tops_{run}"
    text = MR.format(output=output).replace("ORDER BY ts", f"ORDER BY {order}")
    queries = load_queries(EXAMPLES / "finance.cep") + load_query_text(text)
    for index, query in enumerate(queries):
        query.index = index
    topics = _topics(run)
    outputs = [q.query.output for q in queries]
    create_topics(broker, topics, 4, outputs)
    before = {o: len(read_all(broker, o)) for o in outputs}
    for name, query_text in split_query_file((EXAMPLES / "finance.cep").read_text()):
        publish(broker, topics.control, ControlMessage("add", name, query_text))
    publish(broker, topics.control, ControlMessage("add", "mr_mshape", text))
    lines = file_records(TRADES)
    events = _events()
    found = reference.run(queries, events)
    expected = {q.query.output: [c for c in found if c["query"] == q.name] for q in queries}
    # cut right after the last row of a match that waits, near the middle
    half = 1 + min(_waited(expected[output], events), key=lambda s: abs(s - len(lines) // 2))
    with LocalPipeline(broker, topics, chained=True) as pipeline:
        produce_lines(broker, topics.source, lines[:half], end=False)
        _wait(pipeline, lambda: pipeline.splitter.position >= half, "first half taken")
        _wait(pipeline, lambda: min(pipeline.coordinator.merger.upto) >= half - 1,
              "first half merged")
        held = list(pipeline.coordinator.merger.held)
    assert read_latest(broker, topics.state)
    assert any(h is not None and h < half for h in held)  # the cut holds a waiting match
    with LocalPipeline(broker, topics, chained=True) as pipeline:
        _wait(pipeline, lambda: pipeline.splitter.started, "started again")
        assert pipeline.splitter.position == half  # restored, not replayed from 0
        assert pipeline.coordinator.merger.held == held
        produce_lines(broker, topics.source, lines[half:])
        _wait(pipeline, lambda: pipeline.coordinator.merger.ended, "end of input released")
    assert len(expected[output]) > 20
    got = _outputs(broker, outputs, before)
    assert got == expected
    mine = [(c["start_seq"], c["seq"]) for c in got[output]]
    assert len(mine) == len(set(mine))


def _frame(part: int, upto: int, composites=(), held=None):
    from cep_service.stream import frames

    headers = {"part": part, "upto": upto, "ts": upto, "held": held}
    return frames.Frame(frames.MATCHES, headers,
                        orjson.dumps(list(composites)) if composites else b"")


def test_the_merge_releases_below_what_a_partition_holds_back():
    """The release rule alone: a MATCH_RECOGNIZE composite with seq s leaves once every
    partition is past s and none holds one back at or below s; a MATCH query on the same
    INTO topic waits with it (one order per topic), one on another topic does not."""
    merger = Merger(2, "trades")
    text = MR.format(output="tops")
    match = ("QUERY ups FROM trades INTO {o} PARTITION BY symbol PATTERN ( . up ) "
             "DEFINE up AS price > Last(price) EMIT n = Count();")
    merger._add_query({"name": "mr_mshape", "index": 0, "text": text})
    merger._add_query({"name": "ups", "index": 1, "text": match.format(o="tops")})
    merger._add_query({"name": "other", "index": 2, "text": match.format(o="elsewhere")
                       .replace("QUERY ups", "QUERY other")})

    def composite(query, seq):
        return {"query": query, "key": "A", "seq": seq, "start_seq": seq - 1}

    merger.feed(_frame(0, 10, [composite("mr_mshape", 4), composite("ups", 9),
                               composite("other", 9)], held=6))
    merger.feed(_frame(1, 12, held=None))
    assert merger.release() == [("tops", composite("mr_mshape", 4)),
                                ("elsewhere", composite("other", 9))]
    assert withheld(merger) == [("tops", 1, 9, "an earlier partial match in partition 0")]
    merger.feed(_frame(0, 14, [composite("mr_mshape", 6)], held=None))
    assert merger.release() == [("tops", composite("mr_mshape", 6)),
                                ("tops", composite("ups", 9))]
    state = orjson.loads(orjson.dumps(merger.state()))
    again = Merger(2, "trades")
    again.load_state(state)
    assert again.held == [None, None] and state["held"] == [None, None]
    del state["held"]  # a checkpoint from before held was kept
    again.load_state(state)
    assert again.held == [None, None]
