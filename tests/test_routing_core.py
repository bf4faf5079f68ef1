"""The splitter's routing core without Kafka (services/stream/routing.py): messages in, keyed
frames per partition out, with seqs, dead letters, reordering, lateness, the logged
consumption order and control switches."""

from __future__ import annotations

from pathlib import Path

import orjson

from cep_service.stream import frames
from cep_service.stream.control import ControlMessage, split_query_file
from cep_service.stream.kafka import Topics
from cep_service.stream.routing import message, Router, partition_ids, records
from cep_service.stream.splitter_order import ORDER_HEADER

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TRADES = [line for line in (EXAMPLES / "data" / "trades.jsonl").read_bytes().splitlines()
          if line.strip()]


def router(partitions: int = 4, lateness_ms: int = 0, only=None) -> Router:
    core = Router(Topics("trades", source="src"), partitions, allowed_lateness_ms=lateness_ms)
    for name, text in split_query_file((EXAMPLES / "finance.cep").read_text()):
        if only is None or name in only:
            core.apply_control(message(0, 0, ControlMessage("add", name, text).to_json(),
                                      None, ControlMessage("add", name, text).key),
                               announce=False)
    core.setup_schema()
    core.source_partitions = frozenset({0})
    return core


def keyed(core: Router) -> list[tuple[int, frames.Frame]]:
    return [(p, frames.frame_of(message(p, 0, value, headers)))
            for topic, value, _, p, headers in core.out.take() if topic == core.topics.keyed]


def json_of(core: Router, topic: str) -> list[dict]:
    return [orjson.loads(v) for t, v, *_ in core.out.records if t == topic]


def test_one_step_stamps_positions_and_routes_by_key():
    core = router(only={"mshape"})  # PARTITION BY symbol
    core.take(records(TRADES[:500]))
    sent = keyed(core)
    events = [(p, f) for p, f in sent if f.kind == frames.EVENTS]
    rows = {p: frames.decode_table(f.payload) for p, f in events}
    assert sorted(s for t in rows.values() for s in t.column("seq").to_pylist()) == \
        list(range(500))
    for p, table in rows.items():  # each partition holds exactly its keys
        assert set(partition_ids(table, ["symbol"], 4).tolist()) == {p}
    # every partition learns the step's `upto` once, on its last frame of the step
    for p in range(4):
        mine = [f for q, f in sent if q == p]
        assert mine[-1].get("upto") == 499
        assert all(f.get("upto") is None for f in mine[:-1])
    assert core.position == 500 and core.last_seq == 499


def test_every_frame_of_a_step_logs_its_runs():
    core = router()
    core.take(records(TRADES[:10], 0, 0) + records(TRADES[10:20], 1, 40))
    orders = {dict(f.kafka_headers()).get(ORDER_HEADER) for _, f in keyed(core)}
    assert orders == {orjson.dumps({"step": 1, "runs": [[0, 0, 9], [1, 40, 49]]})}
    core.take(records(TRADES[20:21], 0, 10))
    assert {orjson.loads(dict(f.kafka_headers())[ORDER_HEADER])["step"]
            for _, f in keyed(core)} == {2}


def test_bad_records_and_seqs_that_do_not_increase_are_dead_letters():
    core = router()
    good = orjson.loads(TRADES[0])
    values = [orjson.dumps({**good, "seq": 5}), b"{not json", orjson.dumps({**good, "seq": 3}),
              orjson.dumps({**good, "seq": 9})]
    core.take(records(values, 0, 100))
    letters = json_of(core, core.topics.dead_letters)
    assert [(d["offset"], d["reason"][:20]) for d in letters] == [
        (101, "not valid JSON: unex"), (102, "seq 3 does not incre")]
    seqs = [s for _, f in keyed(core) if f.kind == frames.EVENTS and f.get("route") == ""
            for s in frames.decode_table(f.payload).column("seq").to_pylist()]
    assert seqs == [5, 9] and core.position == 4


def test_reordering_releases_in_time_order_and_sends_late_events_away():
    core = router(lateness_ms=3000)
    trades = [orjson.loads(line) for line in TRADES[:6]]
    ts = trades[0]["ts"]
    times = [ts, ts + 5000, ts + 2500, ts + 9000, ts + 1000, ts + 9500]  # +1000: late
    values = [orjson.dumps({**t, "ts": at}) for t, at in zip(trades, times)]
    core.take(records(values))
    late = json_of(core, core.topics.late)
    assert [d["offset"] for d in late] == [4] and core.late_events == 1
    core.take([message(0, 6, b"", [("kind", b"end")])])
    released = [row for _, f in keyed(core) if f.kind == frames.EVENTS and f.get("route") == ""
                for row in frames.decode_table(f.payload).to_pylist()]
    assert [r["ts"] - ts for r in released] == [0, 2500, 5000, 9000, 9500]
    assert [r["seq"] for r in released] == list(range(5))


def test_a_control_change_holds_from_the_next_seq():
    core = router(only={"mshape"})
    core.take(records(TRADES[:50]))
    keyed(core)
    name = "mshape"
    change = ControlMessage("remove", name)
    core.apply_control(message(0, 1, change.to_json(), None, change.key), announce=True)
    status = json_of(core, core.topics.status)
    assert status[-1]["outcome"] == "applied" and status[-1]["name"] == name
    sent = keyed(core)
    assert len(sent) == 4 and {f.kind for _, f in sent} == {frames.CONTROL}
    assert {f.get("at") for _, f in sent} == {50}
    core.take(records(TRADES[50:60], 0, 50))
    assert {f.kind for _, f in keyed(core)} == {frames.PULSE}  # no query reads the events


def test_end_of_input_waits_for_every_source_partition():
    core = router()
    core.source_partitions = frozenset({0, 1})
    core.take(records(TRADES[:5], 0) + [message(0, 5, b"", [("kind", b"end")])])
    assert frames.END not in {f.kind for _, f in keyed(core)}
    core.take([message(1, 0, b"", [("kind", b"end")])])
    ends = [(p, f) for p, f in keyed(core) if f.kind == frames.END]
    assert sorted(p for p, _ in ends) == [0, 1, 2, 3]
    assert {f.get("upto") for _, f in ends} == {4}


def test_plain_steps_log_the_runs_runs_of_gives():
    import random

    from cep_service.stream.routing import PlainMessages
    from cep_service.stream.splitter_order import runs_of

    rng = random.Random(7)
    nexts = [0, 100, 200]
    messages = []
    for _ in range(60):
        p = rng.randrange(3)
        for _ in range(rng.randint(1, 3)):
            messages.append(message(p, nexts[p], b"{}"))
            nexts[p] += 1
    assert PlainMessages.of(messages).runs() == runs_of(messages)
    assert PlainMessages.of(messages + [message(0, 999, b"", [("kind", b"end")])]) is None
