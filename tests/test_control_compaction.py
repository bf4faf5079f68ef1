"""The control topic survives compaction, without a broker: a log of control records goes
through a running splitter's routing core (what it writes back after a refusal goes on
the log, as the broker would take it), then a start replays the whole log and the log
compacted by hand (the last record of each key); both give the live set the running
splitter held, with the same stream versions, and nothing loops."""

from __future__ import annotations

import orjson

from cep_core.control_message import (REFUSED_HEADER, VERSION_HEADER, ControlMessage,
                                      ControlRecord, LiveRegistry, compacted, replayed)
from cep_service.stream import frames
from cep_service.stream.kafka import Topics
from cep_service.stream.routing import Router, message

QUOTES = {"stream": "quotes2", "attributes": {"sym": "string", "bid": "float", "ask": "float",
                                               "t": "timestamp"}, "time": "t"}
WIDER = {**QUOTES, "attributes": {**QUOTES["attributes"], "venue": "string"}}
WITHOUT_ASK = {**QUOTES, "attributes": {k: v for k, v in QUOTES["attributes"].items()
                                        if k != "ask"}}
QUERY = """QUERY {name} FROM quotes2 PARTITION BY sym
PATTERN ( w ) DEFINE w AS ask - bid > {spread}
EMIT sym = sym"""
BAD = "QUERY wide FROM quotes2\nPATTERN ( w ) DEFINE w AS nosuch > 1\nEMIT sym = sym"
ON_TRADES = """QUERY elsewhere FROM trades PARTITION BY symbol
PATTERN ( a ) DEFINE a AS price > 1 EMIT symbol = symbol"""


def query(op: str, name: str, text: str = "") -> tuple[bytes, bytes]:
    return f"query/{name}".encode(), ControlMessage(op, name, text).to_json()


def stream(op: str, schema: dict) -> tuple[bytes, bytes]:
    text = orjson.dumps(schema).decode()
    return b"stream/quotes2", ControlMessage(op, "quotes2", text, kind="stream").to_json()


class Topic:
    """The control topic (one partition) and the running splitter of stream quotes2 that
    follows it; what the splitter writes to the control topic is appended to it."""

    def __init__(self):
        self.log: list[ControlRecord] = []
        self.splitter = Router(Topics("quotes2", source="src.quotes2"), partitions=2)
        self.splitter.setup_schema = lambda: None  # no source is read here

    def write(self, key: bytes, value: bytes | None, headers=None) -> ControlRecord:
        record = ControlRecord(key, value, len(self.log), dict(headers or ()))
        self.log.append(record)
        return record

    def apply(self, record: ControlRecord) -> list[tuple]:
        """The splitter applies one record: what it sent (status, frames, control)."""
        headers = list((record.headers or {}).items()) or None
        self.splitter.apply_control(message(0, record.offset, record.value, headers,
                                            record.key), announce=True)
        return self.splitter.out.take()

    def written_back(self, sent: list[tuple]) -> list[tuple]:
        return [(key, value, headers) for topic, value, key, _, headers in sent
                if topic == self.splitter.topics.control]

    def change(self, key: bytes, value: bytes | None, headers=None) -> list[tuple]:
        """A record (a client's), applied; then what the splitter writes back, until that
        comes back to nothing (each round may write once: more would be a loop)."""
        sent = self.apply(self.write(key, value, headers))
        for _ in range(3):
            back = self.written_back(sent)
            if not back:
                return sent
            assert len(back) == 1
            sent = self.apply(self.write(*back[0]))
        raise AssertionError(f"the control topic loops: {sent}")


def by_hand(log: list[ControlRecord]) -> list[ControlRecord]:
    """What Kafka's compaction leaves: the last record of each key, offsets kept."""
    last = {record.key: record for record in log}
    return sorted(last.values(), key=lambda r: r.offset)


def started(records: list[ControlRecord]) -> Router:
    """A splitter of quotes2 starting on `records` (as Splitter._drain_control does)."""
    core = Router(Topics("quotes2", source="src.quotes2"), partitions=2)
    for record in compacted(records):
        core.apply_control(record, announce=False)
    return core


def live_of(core: Router) -> dict:
    live = core.queries
    return {"queries": {q.name: (q.index, q.text) for q in live.live.values()},
            "streams": {n: (v, t) for n, (_, v, t) in live.registry.streams.items()}}


def test_a_refused_change_is_written_back_and_a_start_gives_the_running_live_set():
    topic = Topic()
    topic.change(*stream("add", QUOTES))
    topic.change(*query("add", "wide", QUERY.format(name="wide", spread=1.5)))
    topic.change(*query("update", "wide", QUERY.format(name="wide", spread=2.5)))
    topic.change(*stream("update", WIDER))
    version = topic.log[-1].offset + 1  # the offset (+1) of the record that made it

    sent = topic.change(*stream("update", WITHOUT_ASK))  # would break wide: refused
    refused, back = topic.log[-2:]
    assert back.key == b"stream/quotes2" and back.headers == {
        REFUSED_HEADER: str(refused.offset).encode(), VERSION_HEADER: str(version).encode()}
    assert orjson.loads(back.value)["text"] == orjson.dumps(WIDER).decode()
    assert sent == []  # it came back: no status record, no frame, nothing written again

    topic.change(*query("update", "wide", BAD))  # does not check: refused, written back
    assert orjson.loads(topic.log[-1].value)["text"] == QUERY.format(name="wide", spread=2.5)
    topic.change(*query("add", "wide", QUERY.format(name="wide", spread=9)))  # live already
    topic.change(*query("add", "narrow", QUERY.format(name="narrow", spread=0.5)))
    topic.change(*query("remove", "narrow"))
    topic.change(*query("update", "ghost", QUERY.format(name="ghost", spread=1)))  # not live
    ghost = topic.log[-1]
    assert ghost.key == b"query/ghost" and ghost.value is None and ghost.republished
    topic.change(*query("add", "elsewhere", ON_TRADES))  # another pipeline's: left alone
    assert topic.log[-1].key == b"query/elsewhere" and not topic.log[-1].republished

    running = live_of(topic.splitter)
    assert set(running["queries"]) == {"wide"}
    assert running["streams"] == {"quotes2": (version, orjson.dumps(WIDER).decode())}
    compact = by_hand(topic.log)
    assert len(compact) < len(topic.log)
    assert not any(orjson.loads(r.value)["op"] == "add" for r in compact
                   if r.key == b"query/wide" and not r.republished)
    for log in (topic.log, compact):
        restarted = started(log)
        assert live_of(restarted) == running
        assert [r for t, r, *_ in restarted.out.records if t == topic.splitter.topics.control] \
            == []  # a start on a topic whose refusals were written back writes nothing
        view = replayed(log, "quotes2")
        assert view.summary() == topic.splitter.queries.summary()
        assert replayed(log).summary()["queries"] == {"wide": 0, "elsewhere": 1}


def test_add_then_update_survives_compaction():
    text = QUERY.format(name="wide", spread=1.5)
    log = [ControlRecord(*stream("add", QUOTES), 0), ControlRecord(*query("add", "wide", text), 1),
           ControlRecord(*stream("update", WIDER), 2),
           ControlRecord(*query("update", "wide", text.replace("1.5", "2")), 3)]
    compact = by_hand(log)
    assert [r.offset for r in compact] == [2, 3]  # only the updates are left
    for records in (log, compact):
        live = replayed(records, "quotes2")
        assert live.live["wide"].text == text.replace("1.5", "2")
        assert live.registry.versions() == {"quotes2": 3}
        core = started(records)
        assert [r["outcome"] for t, v, *_ in core.out.records
                if t == core.topics.status for r in [orjson.loads(v)]] == ["applied"] * 2


def test_a_write_back_overtaken_by_a_change_is_written_again():
    topic = Topic()
    topic.change(*stream("add", QUOTES))
    topic.change(*query("add", "wide", QUERY.format(name="wide", spread=1.5)))
    sent = topic.apply(topic.write(*query("update", "wide", BAD)))  # refused
    (stale,) = topic.written_back(sent)
    newer = QUERY.format(name="wide", spread=3)
    topic.change(*query("update", "wide", newer))  # another client, before it lands
    sent = topic.change(*stale)  # holds the text from before: the live one is written again
    assert orjson.loads(topic.log[-1].value)["text"] == newer and topic.log[-1].republished
    assert sent == [] and topic.splitter.queries.live["wide"].text == newer
    assert started(by_hand(topic.log)).queries.live["wide"].text == newer


def test_versions_a_worker_holds_do_not_change_with_compaction():
    topic = Topic()
    topic.change(*stream("add", QUOTES))
    topic.change(*stream("update", WIDER))
    worker = LiveRegistry()  # what a worker learnt from the running splitter's frames
    for entry in topic.splitter.queries.registry.to_json():
        worker.learn(entry["name"], entry["text"], entry["version"])
    restarted = started(by_hand(topic.log))
    restarted.announce()
    (frame,) = {frames.frame_of(message(p, 0, v, h)).payload for t, v, _, p, h
                in restarted.out.take() if t == restarted.topics.keyed}
    for entry in orjson.loads(frame)["streams"]:
        assert not worker.learn(entry["name"], entry["text"], entry["version"])  # the same
    later = topic.splitter.queries.apply(
        ControlMessage("update", "quotes2", orjson.dumps(QUOTES).decode(), kind="stream"), 7)
    assert worker.learn("quotes2", later.text, later.version)  # a later change is newer


def test_a_record_refused_at_a_start_is_written_over_once():
    log = [ControlRecord(*stream("add", QUOTES), 0),
           ControlRecord(*query("add", "wide", QUERY.format(name="wide", spread=1)), 1),
           ControlRecord(*query("update", "wide", BAD), 2)]  # written with no splitter up
    core = started(log)
    assert core.queries.live == {}  # as compaction leaves it: the update alone
    ((key, value, headers),) = [(k, v, h) for t, v, k, _, h in core.out.records
                                if t == core.topics.control]
    assert (key, value, headers) == (b"query/wide", None, [(REFUSED_HEADER, b"2")])
    log.append(ControlRecord(key, value, 3, dict(headers)))
    again = started(log)
    assert [t for t, *_ in again.out.records if t == again.topics.control] == []
    assert again.queries.summary() == core.queries.summary()
    stray = ControlRecord(*query("add", "wide", QUERY.format(name="wide", spread=1)), 4,
                          {REFUSED_HEADER: b"not a number"})
    assert not stray.republished and started(log + [stray]).queries.live["wide"]


def test_a_start_on_the_whole_log_keeps_the_order_queries_were_added_in():
    """Indexes order composite events of one seq across queries: after `add a`, `add b`,
    `update a`, a start gives a the first place again, as the running splitter had it."""
    topic = Topic()
    topic.change(*stream("add", QUOTES))
    topic.change(*query("add", "a", QUERY.format(name="a", spread=1)))
    topic.change(*query("add", "b", QUERY.format(name="b", spread=2)))
    topic.change(*query("update", "a", QUERY.format(name="a", spread=3)))
    running = live_of(topic.splitter)
    assert running["queries"]["a"][0] < running["queries"]["b"][0]
    assert live_of(started(topic.log)) == running
    assert {n: q.index for n, q in replayed(topic.log, "quotes2").live.items()} == \
        {n: i for n, (i, _) in running["queries"].items()}
