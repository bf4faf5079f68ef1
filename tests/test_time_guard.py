"""Events too far ahead (issue 27, item 5; cep_core/time_guard.py, docs/semantics.md): one
trade with `ts = 1e15` among 6,000 is the one dead letter, the later valid events are not,
and every door gives the same dead letters and composite events: `cep run` (jit and
reference), the Python API (`QuerySet.run`, `Stream.push` batch by batch) and the pipeline's
cores in memory. Then the rule itself: the vectorised check against the one-by-one one, the
bound's settings (schema field, option, validation), the wall-clock bound, and the built-in
streams' data, which the default bound lets through."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cep_core as cep
from cep_core.event_io import read_events
from cep_core.event_reader import read_table
from cep_core.schema import SchemaError, SchemaRegistry, StreamSchema, time_amount
from cep_core.time_guard import TOO_FAR_AHEAD, TimeGuard, seq_not_increasing
from cep_service.stream.control import ControlMessage, split_query_file
from cep_service.stream.memory_pipeline import MemoryPipeline

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FINANCE = EXAMPLES / "finance.cep"  # MATCH by symbol and a 5-minute WINDOW on trades
BAD_AT = 3000
BAD_TS = 10**15


def cep_cli(*args):
    command = [sys.executable, "-m", "cep_service.cli.main"]
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("CEP_DEBUG", None)
    return subprocess.run(command + [str(a) for a in args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def six_thousand_trades(bad: bool = True) -> list[bytes]:
    """The example trades five times over, each copy after the one before, 6,000 trades,
    and in the middle one of valid types with ts = 1e15 (bad) or a record that is no
    trade (not bad: the same positions, so the same seqs, without that trade)."""
    rows = [orjson.loads(line) for line in (EXAMPLES / "data/trades.jsonl").read_bytes()
            .splitlines() if line.strip()]
    span = rows[-1]["ts"] - rows[0]["ts"] + 1000
    out = [{**r, "ts": r["ts"] + k * span, "seqNum": 0} for k in range(5) for r in rows]
    for i, row in enumerate(out):
        row["seqNum"] = i
    out.insert(BAD_AT, {**out[BAD_AT], "ts": BAD_TS} if bad else {"not": "a trade"})
    return [orjson.dumps(r) for r in out]


@pytest.fixture(scope="module")
def trades_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ahead")
    paths = {}
    for name, bad in (("bad", True), ("good", False)):
        paths[name] = folder / f"{name}.jsonl"
        paths[name].write_bytes(b"\n".join(six_thousand_trades(bad)) + b"\n")
    return paths


def letter(d: dict) -> tuple:
    """What every door's dead letter holds alike: position, reason, the record as read."""
    return d["position"], d["reason"], d["raw"]


def run_cli(events: Path, tmp_path: Path, engine: str, *options) -> tuple[list, list]:
    out, dead = tmp_path / f"out_{engine}.jsonl", tmp_path / f"dead_{engine}.jsonl"
    done = cep_cli("run", FINANCE, "--events", events, "--engine", engine, "--out", out,
                   "--dead-letters", dead, *options)
    assert done.returncode == 0, done.stderr
    read = lambda p: [orjson.loads(line) for line in p.read_bytes().splitlines()]  # noqa: E731
    return read(out), read(dead)


def test_one_event_from_the_far_future_is_the_only_dead_letter(trades_files, tmp_path):
    queries = cep.compile(FINANCE.read_text())
    expected = queries.run(trades_files["good"]).to_dicts()  # the same trades, none bad
    assert len(expected) > 500

    # cep run, both engines: the one bad trade is the one dead letter, found where it is
    outputs = {}
    for engine in ("jit", "reference"):
        outputs[engine] = run_cli(trades_files["bad"], tmp_path, engine)
    for engine, (composites, dead) in outputs.items():
        assert composites == expected, engine
        assert [(d["line"], d["position"]) for d in dead] == [(BAD_AT + 1, BAD_AT)]
        reason = dead[0]["reason"]
        assert reason.startswith(f"{TOO_FAR_AHEAD}: event time {BAD_TS} ")
        assert "31622400000 ms (max_ahead)" in reason and "stream's time 17" in reason
    assert outputs["jit"][1] == outputs["reference"][1]
    cli_letters = [letter(d) for d in outputs["jit"][1]]

    # the Python API: a run, and a Stream given the lines in batches
    for engine in ("jit", "reference"):
        result = queries.run(trades_files["bad"], engine=engine)
        assert result.to_dicts() == expected
        assert [letter(d.to_json()) for d in result.dead_letters] == cli_letters
    lines = trades_files["bad"].read_bytes().splitlines()
    stream, got = queries.stream(), []
    for at in range(0, len(lines), 777):
        got.extend(stream.push([orjson.loads(line) for line in lines[at:at + 777]])
                   .to_pylist())
    got.extend(stream.flush().to_pylist())
    assert len(got) == len(expected)
    [only] = stream.dead_letters
    assert (only.position, only.reason) == cli_letters[0][:2]

    # the pipeline's cores in memory: the splitter decides, before any seq
    pipeline = MemoryPipeline("trades", 2)
    for name, text in split_query_file(FINANCE.read_text()):
        pipeline.control(ControlMessage("add", name, text))
    for at in range(0, len(lines), 500):
        pipeline.send(lines[at:at + 500])
    pipeline.end()
    service = pipeline.records_of(pipeline.topics.dead_letters)
    assert [letter(d) for d in service] == cli_letters
    assert (service[0]["offset"], service[0]["partition"]) == (BAD_AT, 0)
    for output in ("double_tops", "trade_stats"):
        assert pipeline.outputs[output] == [c for c in expected if c["query"] ==
                                            ("mshape" if output == "double_tops" else
                                             "activity")], output


def test_without_the_bound_the_bad_trade_stops_the_stream(trades_files, tmp_path):
    """What the tester found: with no bound (`--max-ahead none`) the trade is taken and
    hundreds of later valid events are dead letters, late or going backwards."""
    composites, dead = run_cli(trades_files["bad"], tmp_path, "jit", "--max-ahead", "none")
    assert len(dead) > 500
    assert any("goes backwards" in d["reason"] for d in dead)
    assert all(d["position"] > BAD_AT for d in dead)
    assert not any(d["reason"].startswith(TOO_FAR_AHEAD) for d in dead)


@pytest.mark.parametrize("max_ahead,refused", [
    (None, [BAD_AT]),             # the default: 366 days
    ("1 day", [BAD_AT]),
    ("none", []),
    (BAD_TS, []),                 # an int option in ms: far enough
])
def test_option_replaces_the_schema_bound(trades_files, max_ahead, refused):
    queries = cep.compile(FINANCE.read_text())
    result = queries.run(trades_files["bad"], max_ahead=max_ahead)
    assert [d.position for d in result.dead_letters
            if d.reason.startswith(TOO_FAR_AHEAD)] == refused


def test_schema_field_sets_the_bound(tmp_path):
    """`max_ahead` in the stream's schema file: a duration, read by cep run and the API."""
    schema = {"stream": "meters", "attributes": {"m": "string", "v": "int", "ts": "timestamp"},
              "time": "ts", "time_unit": "s", "max_ahead": "1 hour"}
    (tmp_path / "meters.json").write_text(orjson.dumps(schema).decode())
    events = [{"m": "a", "v": 1, "ts": 1000}, {"m": "a", "v": 2, "ts": 1000 + 3600},
              {"m": "a", "v": 3, "ts": 1000 + 2 * 3600 + 1}, {"m": "a", "v": 4, "ts": 4700}]
    path = tmp_path / "meters.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    query = tmp_path / "q.cep"
    query.write_text("QUERY all FROM meters PATTERN (a) DEFINE a AS TRUE EMIT v = v;\n")
    done = cep_cli("run", query, "--events", path, "--schema", tmp_path / "meters.json",
                   "--dead-letters", tmp_path / "dead.jsonl")
    assert done.returncode == 0, done.stderr
    [dead] = [orjson.loads(line) for line in (tmp_path / "dead.jsonl").read_bytes()
              .splitlines()]
    assert dead["position"] == 2 and dead["reason"] == (
        "too far ahead: event time 8201 is more than 3600 s (max_ahead) after the stream's "
        "time 4600")
    assert [orjson.loads(line)["v"] for line in done.stdout.splitlines()] == [1, 2, 4]
    queries = cep.compile(query.read_text(), tmp_path / "meters.json")
    assert [c["v"] for c in queries.run(events).to_dicts()] == [1, 2, 4]
    loose = queries.run(events, max_ahead="2 hours")  # takes 8201: then 4700 goes back
    assert [c["v"] for c in loose.to_dicts()] == [1, 2, 3]
    assert [(d.position, d.reason) for d in loose.dead_letters] == [
        (3, "event time goes backwards in partition null")]


@pytest.mark.parametrize("value,unit,expected", [
    ("1 day", "ms", 86_400_000), ("30 seconds", "s", 30), ("2 min", "us", 120_000_000),
    (500, "ns", 500), ("500", "ms", 500), ("none", "ms", None), (" NONE ", "s", None),
    ("7 ticks", "ticks", 7),
])
def test_time_amounts(value, unit, expected):
    assert time_amount(value, unit) == expected


@pytest.mark.parametrize("value,message", [
    (0, "at least 1"), (-5, "at least 1"), (True, "positive integer"), (1.5, "positive integer"),
    ("soon", "positive integer"), ("5 weeks", "unknown time unit"),
    ("10 ms", "finer than the stream's time unit"), ("3 ticks", "ticks are the unit"),
])
def test_bad_bounds_are_refused_at_the_schema(value, message):
    with pytest.raises(SchemaError, match=message):
        StreamSchema("x", {"ts": "timestamp"}, "ts", "s", max_ahead=value)


def test_schema_json_round_trip_and_control_message_check():
    from cep_core.control_message import ControlMessageError, check_stream

    plain = StreamSchema("x", {"ts": "timestamp"}, "ts")
    assert "max_ahead" not in plain.to_dict()  # unset fields stay out of the JSON
    assert plain.ahead_bound == 366 * 86_400_000 and plain.ahead_of_clock_bound is None
    assert plain.idleness_units is None
    given_ = StreamSchema("x", {"ts": "timestamp"}, "ts", max_ahead="1 hour",
                          max_ahead_of_clock=60_000, idleness="30 seconds")
    assert StreamSchema.from_dict(given_.to_dict()) == given_
    assert check_stream("x", orjson.dumps(given_.to_dict()).decode()) == given_
    with pytest.raises(ControlMessageError, match="max_ahead"):
        check_stream("x", orjson.dumps({**plain.to_dict(), "max_ahead": 0}).decode())
    with pytest.raises(ControlMessageError, match="unknown time unit"):
        check_stream("x", orjson.dumps({**plain.to_dict(), "max_ahead": "2 fortnights"})
                     .decode())
    with pytest.raises(SchemaError, match="no wall-clock time"):
        StreamSchema("x", {"ts": "int"}, "ts", "ticks", max_ahead_of_clock=5)
    ticks = StreamSchema("x", {"ts": "int"}, "ts", "ticks")
    assert ticks.ahead_bound == 366 * 86_400_000  # as many ticks as 366 days have ms


def test_wall_clock_bound_refuses_the_first_event_too():
    schema = StreamSchema("x", {"ts": "timestamp"}, "ts", "s")
    guard = TimeGuard.of(schema, max_ahead_of_clock="1 hour", now=1_000_000)
    assert guard.check(1_000_000 + 3601) == (
        "too far ahead: event time 1003601 is more than 3600 s (max_ahead_of_clock) after "
        "the wall clock's time 1000000")
    assert guard.time is None
    assert guard.check(1_000_000 + 3600) is None and guard.time == 1_003_600
    keep, reasons, _ = TimeGuard.of(schema, max_ahead_of_clock=10, now=0).accept(
        np.array([5, 11, 10, -3]))
    assert keep.tolist() == [True, False, True, True] and list(reasons) == [1]


def test_the_default_bound_lets_every_built_in_streams_data_through():
    """The default (366 days) holds for the built-in streams: each example data file's
    largest jump ahead of its stream's time is far below it, and nothing is refused."""
    registry = SchemaRegistry()
    checked = 0
    for path in sorted((EXAMPLES / "data").glob("*.jsonl")):
        schema = registry.get(path.stem)
        assert schema is not None, path
        events, dead = read_events(path, schema)
        assert not [d for d in dead if d.reason.startswith(TOO_FAR_AHEAD)], path
        times = np.array([e.ts for e in events], dtype=np.int64)
        jumps = times[1:] - np.maximum.accumulate(times)[:-1]
        assert jumps.max(initial=0) < schema.ahead_bound / 100, path
        checked += 1
    assert checked >= 8


# ------------------------------------------------------------------ the rule itself


def one_by_one(ts, seq, last_seq, ahead, of_clock=None, now=None, time=None):
    """The rule as docs/semantics.md says it, event by event."""
    guard = TimeGuard(ahead, of_clock, "ms", time, now)
    keep, reasons = [], {}
    for i, (t, s) in enumerate(zip(ts, seq)):
        if s <= last_seq:
            keep.append(False)
            reasons[i] = seq_not_increasing(s, last_seq)
            continue
        why = guard.check(t)
        keep.append(why is None)
        if why is None:
            last_seq = s
        else:
            reasons[i] = why
    return keep, reasons, last_seq, guard.time


rows = st.lists(st.tuples(st.integers(-50, 400), st.integers(0, 40)), max_size=80)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows, ahead=st.none() | st.integers(1, 120), of_clock=st.none() | st.integers(1, 300),
       time=st.none() | st.integers(-50, 200), last_seq=st.integers(-1, 10),
       cuts=st.lists(st.integers(0, 80), max_size=4), window=st.sampled_from([1, 2, 3, 4096]))
def test_vectorised_check_is_the_one_by_one_rule(rows, ahead, of_clock, time, last_seq, cuts,
                                                 window):
    """`TimeGuard.accept` over blocks cut anywhere (and any window of its search) gives the
    one-by-one rule's refusals, reasons, time and largest seq."""
    import cep_core.time_guard as time_guard

    with mock.patch.object(time_guard, "_FIRST_WINDOW", window):
        check_blocks(rows, ahead, of_clock, time, last_seq, cuts)


def check_blocks(rows, ahead, of_clock, time, last_seq, cuts):
    ts = [t for t, _ in rows]
    seq = np.cumsum([s for _, s in rows]).tolist()  # rising with repeats (refused)
    now = 100 if of_clock is not None else None
    want_keep, want_reasons, want_last, want_time = one_by_one(ts, seq, last_seq, ahead,
                                                              of_clock, now, time)
    guard = TimeGuard(ahead, of_clock, "ms", time, now)
    keep, reasons, last = [], {}, last_seq
    bounds = [0, *sorted(cuts), len(rows)]
    for a, b in zip(bounds, bounds[1:]):
        if a >= b:
            continue
        part_keep, part_reasons, last = guard.accept(np.array(ts[a:b], dtype=np.int64),
                                                     np.array(seq[a:b], dtype=np.int64), last)
        keep.extend(part_keep.tolist())
        reasons.update({a + i: r for i, r in part_reasons.items()})
    assert keep == want_keep
    assert reasons == want_reasons
    assert (last, guard.time) == (want_last, want_time)


def test_refused_events_change_nothing():
    """A refused event moves neither time nor seqs: the next event is measured against
    the time before it, and a seq below the refused one's is still taken."""
    guard = TimeGuard(10, time=100)
    keep, reasons, last = guard.accept(np.array([105, 500, 111, 112]),
                                       np.array([1, 9, 5, 6]), 0)
    assert keep.tolist() == [True, False, True, True]
    assert reasons == {1: "too far ahead: event time 500 is more than 10 ms (max_ahead) "
                          "after the stream's time 105"}
    assert (last, guard.time) == (6, 112)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(times=st.lists(st.integers(0, 3000), min_size=1, max_size=60),
       block_bytes=st.integers(1, 600), fmt=st.sampled_from(["jsonl", "csv"]))
def test_columnar_reader_and_record_reader_agree(tmp_path, times, block_bytes, fmt):
    """`cep run`'s two readers (jit: event_reader, reference: event_io) refuse the same
    events with the same dead letters, whatever the blocks."""
    schema = StreamSchema("x", {"k": "string", "ts": "timestamp"}, "ts", max_ahead=500)
    path = tmp_path / f"e.{fmt}"
    if fmt == "jsonl":
        path.write_bytes(b"".join(orjson.dumps({"k": "a", "ts": t}) + b"\n" for t in times))
    else:
        path.write_text("k,ts\n" + "".join(f"a,{t}\n" for t in times))
    events, dead = read_events(path, schema)
    table, dead_columns = read_table(path, schema, block_bytes=block_bytes)
    assert table.column("seq").to_pylist() == [e.seq for e in events]
    assert [d.to_json() for d in dead_columns] == [d.to_json() for d in dead]
    _, expected_reasons, _, _ = one_by_one(times, list(range(len(times))), -1, 500)
    assert [d.position for d in dead] == sorted(expected_reasons)


def test_stream_pushes_keep_the_time_and_punctuations_move_it():
    queries = cep.compile("QUERY all FROM meters PATTERN (a) DEFINE a AS TRUE EMIT v = v;",
                          {"stream": "meters", "attributes": {"v": "int", "ts": "timestamp"},
                           "time": "ts", "max_ahead": 100})
    stream = queries.stream()
    stream.push([{"v": 1, "ts": 1000}])
    stream.push([{"v": 2, "ts": 1101}, {"v": 3, "ts": 1100}])  # 1101: 101 after 1000
    assert [d.position for d in stream.dead_letters] == [1]
    stream.advance_time(1500)  # a punctuation moves the stream's time
    stream.push([{"v": 4, "ts": 1600}])
    assert [d.position for d in stream.dead_letters] == [1]
    from cep_core.testing import assert_steps_agree

    steps = [("push", [{"v": 1, "ts": 1000}]), ("push", [{"v": 2, "ts": 1101}]),
             ("advance_time", 1500), ("push", [{"v": 4, "ts": 1600}, {"v": 5, "ts": 1800}]),
             ("end",)]
    got = assert_steps_agree(queries, steps)
    assert [[c["v"] for c in step] for step in got] == [[1], [], [], [4], []]


def test_dataclass_replace_keeps_the_schema_checked():
    schema = StreamSchema("x", {"ts": "timestamp"}, "ts")
    with pytest.raises(SchemaError):
        dataclasses.replace(schema, idleness="forever")


def test_backfill_scan_refuses_the_same_event(spark, trades_files, tmp_path):
    """The Spark backfill's scan exchange reads with `cep run`'s reader: over the input cut
    in two files (the bad trade opening the second, so the stream's time must go on from
    the first file), the same composite events and dead letters as `cep run`."""
    from cep_service.backfill.job import run_backfill
    from cep_service.backfill.output import read_composites, read_dead_letters

    queries = cep.compile(FINANCE.read_text())
    expected = queries.run(trades_files["bad"])
    lines = trades_files["bad"].read_bytes().splitlines(keepends=True)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_bytes(b"".join(lines[:BAD_AT]))
    second.write_bytes(b"".join(lines[BAD_AT:]))
    out = tmp_path / "out"
    result = run_backfill(spark, queries.queries, [str(first), str(second)], str(out),
                          partitions=2, exchange="scan")
    assert result.exchange == "scan"
    assert read_composites(str(out)) == expected.to_dicts()
    [dead] = read_dead_letters(f"{out}_dead_letters")
    assert (dead["source"], dead["line"], dead["position"]) == (str(second), 1, BAD_AT)
    assert dead["reason"] == expected.dead_letters[0].reason
