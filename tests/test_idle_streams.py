"""Idle streams close (issue 27, item 6; services/stream/routing.py, docs/semantics.md "Idle
streams"): with an `idleness`, once no event came for that long by the wall clock, the
splitter's pulses advance the stream's time by the wall clock, so the windows and the
timed-out sequences that waited for later events are released. Driven by a fake clock
through the pipeline's cores in memory: no sleeps, nothing depends on the machine's speed."""

from __future__ import annotations

import dataclasses

import orjson

from cep_core.schema import SchemaRegistry
from cep_service.stream import frames
from cep_service.stream.control import ControlMessage
from cep_service.stream.merge import Merger
from cep_service.stream.frames import Frame
from cep_service.stream.memory_pipeline import MemoryPipeline

T0 = 1_704_187_800_000  # 09:30:00, on a minute
WINDOW = ("QUERY per_minute INTO per_minute SELECT count(*) AS n, sum(volume) AS volume "
          "FROM trades [RANGE 1 minute SLIDE 1 minute];")
TIMEOUT = ("QUERY unanswered FROM abc INTO unanswered PARTITION BY p "
           "PATTERN SEQ(A a, B b) WITHIN 1 minute USING skip-till-next-match "
           "ON TIMEOUT EMIT PARTIAL;")


class FakeClock:
    """A monotonic clock the test moves by hand (seconds)."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def trade(ts: int, volume: int = 10) -> bytes:
    return orjson.dumps({"symbol": "IBM", "price": 100, "volume": volume, "ts": ts,
                         "seqNum": 0})


def pipeline(query: str, stream: str = "trades", **options) -> MemoryPipeline:
    built = MemoryPipeline(stream, partitions=2, **options)
    name = query.split()[1]
    built.control(ControlMessage("add", name, query))
    return built


def test_a_window_is_released_after_the_idleness_and_not_before():
    clock = FakeClock()
    pipe = pipeline(WINDOW, idleness="2 minutes", clock=clock)
    pipe.send([trade(T0 + 10_000, 1), trade(T0 + 20_000, 2), trade(T0 + 50_000, 3)])
    pipe.pulse()
    assert pipe.outputs == {}  # the window (T0, T0 + 1 min] waits for later events

    clock.now += 119.9  # not yet idle for 2 minutes
    pipe.pulse()
    assert pipe.outputs == {} and pipe.router.idle_advances == 0
    assert pipe.router.max_ts == T0 + 50_000

    clock.now += 0.1  # idle for 2 minutes: time is the last event's plus 2 minutes
    pipe.pulse()
    assert pipe.router.idle_advances == 1 and pipe.router.max_ts == T0 + 170_000
    assert pipe.outputs["per_minute"] == [
        {"query": "per_minute", "key": None, "seq": 2, "start_seq": 0,
         "window_start": T0, "window_end": T0 + 60_000, "n": 3, "volume": 6}]

    # later pulses go on with the wall clock; an event then comes back to the stream
    clock.now += 30
    pipe.pulse()
    assert pipe.router.max_ts == T0 + 200_000
    pipe.send([trade(T0 + 210_000, 4)])
    pipe.end()
    assert [w["window_end"] for w in pipe.outputs["per_minute"]] == [T0 + 60_000,
                                                                      T0 + 240_000]


def test_no_idleness_no_advance_whatever_the_clock():
    """Off by default: the stream's time moves only with events (and the end of input)."""
    clock = FakeClock()
    pipe = pipeline(WINDOW, clock=clock)
    pipe.send([trade(T0 + 10_000)])
    clock.now += 10 * 86_400
    pipe.pulse()
    assert pipe.outputs == {} and pipe.router.idle_advances == 0
    pipe.end()
    assert len(pipe.outputs["per_minute"]) == 1


def test_the_schema_field_sets_the_idleness():
    registry = SchemaRegistry()
    registry.add(dataclasses.replace(registry.get("trades"), idleness="90 seconds"))
    clock = FakeClock()
    pipe = pipeline(WINDOW, registry=registry, clock=clock)
    pipe.send([trade(T0 + 50_000)])
    clock.now += 89
    pipe.pulse()
    assert pipe.outputs == {}
    clock.now += 2  # 91 s: time T0 + 141 s, past the window's end and its horizon
    pipe.pulse()
    assert [w["n"] for w in pipe.outputs["per_minute"]] == [1]
    assert pipe.router.status(True, 100)["idleness"] == 90_000


def test_a_timed_out_sequence_is_released_by_an_idle_stream():
    clock = FakeClock()
    pipe = pipeline(TIMEOUT, stream="abc", idleness="30 seconds", clock=clock)
    pipe.send([orjson.dumps({"type": "A", "p": 1, "v": 5, "ts": T0})])
    clock.now += 45  # idle: time T0 + 45 s, the run can still take a B
    pipe.pulse()
    assert pipe.router.max_ts == T0 + 45_000 and pipe.outputs == {}
    clock.now += 16  # T0 + 61 s: past a.ts + WITHIN, the run times out
    pipe.pulse()
    assert pipe.outputs["unanswered"] == [
        {"query": "unanswered", "key": 1, "seq": 0, "start_seq": 0,
         "events": {"a": {"seq": 0, "type": "A", "p": 1, "v": 5, "ts": T0}},
         "timed_out": True}]


def test_what_an_advance_costs_a_later_event():
    """The price of idleness: an event that arrives after an advance with a time before
    it is late for the windows the advance released (a dead letter), where `cep run` over
    the same events would have counted it."""
    clock = FakeClock()
    pipe = pipeline(WINDOW, idleness="2 minutes", clock=clock)
    pipe.send([trade(T0 + 10_000)])
    clock.now += 120
    pipe.pulse()  # time T0 + 130 s: the first window is out
    pipe.send([trade(T0 + 30_000)])  # delayed on its way: inside that window
    pipe.end()
    assert [w["n"] for w in pipe.outputs["per_minute"]] == [1]
    late = pipe.records_of(pipe.topics.dead_letters)
    assert [(d["source"], d["position"]) for d in late] == [("query per_minute", 1)]


def test_idle_time_lets_a_live_stream_resume_past_max_ahead():
    """The bound on events too far ahead measures from the stream's time, which an idle
    advance moves: after a long silence, events of the wall clock's time are taken."""
    clock = FakeClock()
    pipe = pipeline(WINDOW, idleness="1 minute", max_ahead="5 minutes", clock=clock)
    pipe.send([trade(T0)])
    clock.now += 3600
    pipe.pulse()
    pipe.send([trade(T0 + 3_600_000 + 1000)])
    assert pipe.records_of(pipe.topics.dead_letters) == []

    stuck = pipeline(WINDOW, max_ahead="5 minutes", clock=clock)  # no idleness
    stuck.send([trade(T0)])
    clock.now += 3600
    stuck.pulse()
    stuck.send([trade(T0 + 3_600_000 + 1000)])
    [dead] = stuck.records_of(stuck.topics.dead_letters)
    assert dead["reason"].startswith("too far ahead: event time")


def test_with_reordering_time_stops_short_of_waiting_events():
    """Events still in the reorder buffer are not passed by an idle advance (they would
    be late for the engines when released): time stops at the oldest one's less one."""
    clock = FakeClock()
    pipe = pipeline(WINDOW, idleness="1 minute", clock=clock, allowed_lateness_ms=20_000)
    pipe.send([trade(T0 + 10_000), trade(T0 + 40_000)])  # 40 s waits: watermark 20 s
    assert len(pipe.router.reorder) == 1
    clock.now += 600
    pipe.pulse()
    assert pipe.router.max_ts == T0 + 40_000 - 1
    pipe.end()
    assert [w["n"] for w in pipe.outputs["per_minute"]] == [2]


def test_the_merger_takes_a_later_time_at_the_same_upto():
    """The coordinator learns an idle advance: a pulse with the same `upto` and a later
    `ts` is the stream's time moving on (before, only a larger `upto` was)."""
    merger = Merger(1, "trades", SchemaRegistry())
    merger.feed(Frame(frames.MATCHES, {"part": 0, "upto": 5, "ts": 100}))
    merger.feed(Frame(frames.MATCHES, {"part": 0, "upto": 5, "ts": 90}))
    merger.feed(Frame(frames.MATCHES, {"part": 0, "upto": 5, "ts": 250}))
    assert list(merger.pulses) == [(5, 100), (5, 250)]
