"""MATCH_RECOGNIZE wherever a query runs (issue 32, item 3), engine side: the jit default of
`cep run` and of the Python API give the reference interpreter's composite events, which
are Flink's on the committed fixtures (whichever engine `recognize_engine` picks); the
interpreter engine (`cep_core.engine.recognize_interpreter`, the one every query falls back
to), made by hand or forced into `StreamEngines` (the service's workers, the backfill) by
the `interpreter` fixture, gives them too, its state survives a snapshot anywhere
mid-stream, and damaged or foreign state is refused. The service runs it in
tests/test_recognize_service.py, the backfill in tests/test_recognize_backfill.py."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

import cep_core as cep
import cep_core.reference as reference
from cep_core import snapshot_format
from cep_core import stream_engines as jit
from cep_core.api import QueryFailedError
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_query_text
from cep_core.engine.recognize_interpreter import RecognizeInterpreterEngine, RecognizeStateError
from cep_core.ast import QueryKind
from cep_core.engine_factory import create_engine
from cep_core.events import Event
from tests.recognize_flink import differential

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / "tests" / "fixtures").glob("recognize_flink_*.json"))

V_SHAPE = """QUERY vshape INTO alerts
SELECT * FROM quotes MATCH_RECOGNIZE (
  PARTITION BY symbol
  ORDER BY ts
  MEASURES FIRST(A.price) AS start_price, LAST(B.price) AS bottom, AVG(B.price) AS avg_b,
           MATCH_ROWTIME() AS at
  ONE ROW PER MATCH
  AFTER MATCH SKIP TO NEXT ROW
  PATTERN (A B+ C)
  WITHIN INTERVAL '6' SECOND
  DEFINE B AS B.price >= A.price, C AS C.price < A.price
) AS T;
"""


def _cases():
    """(id, statement, rows, Flink's answer) of every fixture case Flink and we agree on."""
    out = []
    for fixture in FIXTURES:
        spec = json.loads(fixture.read_text())
        for name in sorted(spec["statements"]):
            if name in spec.get("known_differences", {}):
                continue
            out.append(pytest.param(differential.our_text(spec["statements"][name]),
                                    spec["rows"], spec["flink"][name],
                                    id=f"{fixture.stem}-{name}"))
    return out


CASES = _cases()


def _engine(checked) -> RecognizeInterpreterEngine:
    return RecognizeInterpreterEngine(checked, StringDictionary())


@pytest.fixture
def interpreter(monkeypatch):
    """StreamEngines make the interpreter engine for MATCH_RECOGNIZE queries (not a jitted
    one where its compiler would take the query)."""
    made = create_engine

    def only_interpreter(checked, strings, placement="cpu", **options):
        if checked.query.kind is QueryKind.RECOGNIZE:
            return RecognizeInterpreterEngine(checked, strings, **options)
        return made(checked, strings, placement, **options)

    monkeypatch.setattr(jit, "create_engine", only_interpreter)


def _columns(checked, found: list[dict]) -> list[list]:
    """Composite events as Flink's rows (its SELECT list, or PARTITION BY and measures)."""
    names = differential.flink_columns(checked)
    return sorted(json.dumps([c[n] for n in names]) for c in found)


def _events(rows: list[dict]) -> list[Event]:
    return [Event(i, row["ts"], dict(row)) for i, row in enumerate(rows)]


@pytest.mark.parametrize("statement, rows, flink", CASES)
def test_the_python_apis_jit_default_gives_flinks_rows(statement, rows, flink):
    try:
        queries = cep.compile(statement)
    except cep.QueryError:
        assert isinstance(flink, dict), "Flink answers a statement we refuse"
        return
    if isinstance(flink, dict):  # Flink refused it or stopped: so do we, at run time
        with pytest.raises(QueryFailedError, match="RecognizeRuntimeError"):
            queries.run(rows)
        return
    found = queries.run(rows).to_dicts()  # engine="jit", the default
    assert found == reference.run(queries.queries, _events(rows))
    assert _columns(queries.queries[0], found) == sorted(map(json.dumps, flink))
    assert bool(found) == bool(flink)


def test_the_cases_hold_matches_and_refusals():
    """The parametrized cases above are not vacuous."""
    answered = [c for c in CASES if isinstance(c.values[2], list) and c.values[2]]
    refused = [c for c in CASES if isinstance(c.values[2], dict)]
    assert len(answered) >= 20 and refused


def _stream_run(checked: list, events: list[Event], batch: int, cut: int | None = None):
    """StreamEngines over `events` in batches of `batch`; with `cut`, a snapshot after the
    first `cut` events restored into fresh engines over a fresh dictionary."""
    strings = StringDictionary()
    engines = jit.StreamEngines(checked, strings)
    encoder = BatchEncoder(checked[0].schema, strings)
    found = []
    head = events if cut is None else events[:cut]
    for start in range(0, len(head), batch):
        found += engines.process(encoder.from_events(head[start:start + batch]))
    if cut is not None:
        snapshot = engines.snapshot()
        strings = StringDictionary()
        engines = jit.StreamEngines(checked, strings)
        engines.restore(snapshot)
        encoder = BatchEncoder(checked[0].schema, strings)
        for start in range(cut, len(events), batch):
            found += engines.process(encoder.from_events(events[start:start + batch]))
    found += engines.flush()
    assert not engines.failed, engines.failed
    return engines.order(found)


@pytest.mark.parametrize("statement, rows, flink",
                         [c for c in CASES if isinstance(c.values[2], list)][::3])
def test_a_snapshot_anywhere_mid_stream_changes_nothing(interpreter, statement, rows, flink):
    checked = load_query_text(statement)
    events = _events(rows)
    want = reference.run(checked, events)
    for cut in (1, len(events) // 3, len(events) // 2 + 1, len(events) - 1):
        assert _stream_run(checked, events, 5, cut) == want, cut
    assert _stream_run(checked, events, 1) == want


def _v_events(n: int = 60) -> list[Event]:
    draw = random.Random(0)
    return [Event(i, 1000 * (i + 1), {"symbol": "AB"[i % 5 == 4], "price": draw.randint(40, 60),
                                      "volume": 1, "ts": 1000 * (i + 1), "seqNum": i})
            for i in range(n)]


def test_punctuation_ends_partial_matches_and_frees_waiting_ones(interpreter):
    [checked] = load_query_text(V_SHAPE)
    assert create_engine(checked, StringDictionary()).placement.target == "cpu"
    events = _v_events()
    # the stream with punctuations between events: the WITHIN interval ends partial
    # matches at stream time, which lets completed ones leave early
    stream = []
    for e in events:
        stream.append(e)
        if e.seq % 5 == 4:
            stream.append(reference.Punctuation(e.ts + 700))
    want = reference.run([checked], stream)
    assert want and any(c["at"] > 1000 * (c["seq"] + 1) for c in want)
    assert jit.run([checked], stream, batch_size=3) == want


def test_dead_letters_are_the_references(interpreter):
    [checked] = load_query_text(V_SHAPE)
    events = _v_events(10)
    late = Event(10, events[3].ts, dict(events[3].attrs, seqNum=10))
    rejected: list = []
    jit.run([checked], [*events, late], rejected=rejected)
    [(query, seq, reason)] = rejected
    assert (query.name, seq) == ("vshape", 10) and "event time goes backwards" in reason


def _snapshot_meta(engine) -> dict:
    meta, arrays = snapshot_format.unpack_arrays("engine", engine.snapshot())
    assert arrays == {}
    return meta


def _restored(checked, meta: dict, arrays: dict | None = None):
    engine = _engine(checked)
    engine.restore(snapshot_format.pack_arrays("engine", meta, arrays or {}))
    return engine


def _busy_engine():
    [checked] = load_query_text(V_SHAPE.replace("SKIP TO NEXT ROW", "SKIP PAST LAST ROW")
                                .replace("WITHIN INTERVAL '6' SECOND", ""))
    engine = _engine(checked)
    engine.process(BatchEncoder(checked.schema, engine.strings).from_events(_v_events(41)))
    return checked, engine


def test_the_state_is_json_and_holds_both_queues_in_array_order():
    checked, engine = _busy_engine()
    meta = _snapshot_meta(engine)
    orjson.dumps(meta)  # JSON through and through
    parts = meta["recognize"]["partitions"]
    assert {p["key"] for p in parts} == {"A", "B"}
    assert sum(len(p["partial"]) for p in parts) > 2  # partial matches beyond the start ones
    again = _restored(checked, meta)
    assert _snapshot_meta(again) == meta
    for slot, part in engine.interpreter.partitions.items():
        mine = again.interpreter.partitions[slot]
        assert [c.indexes for c in mine.partial.items] == \
            [c.indexes for c in part.partial.items]


def _damaged(meta: dict):
    """(what, damaged copy) for each kind of damage a saved state may carry."""
    def copy():
        return json.loads(json.dumps(meta))

    def part(m):
        return next(p for p in m["recognize"]["partitions"] if len(p["partial"]) > 1)

    cases = []

    def case(what, change):
        m = copy()
        change(m)
        cases.append((what, m))

    case("no recognize state", lambda m: m.pop("recognize"))
    case("another version", lambda m: m["recognize"].update(version=99))
    case("another automaton", lambda m: m["recognize"]["automaton"].pop())
    case("state out of range", lambda m: part(m)["partial"][0].__setitem__(0, 999))
    case("a row index not saved", lambda m: part(m)["partial"][0][1][0].__setitem__(1, 10**6))
    case("an unknown variable", lambda m: part(m)["partial"][0][1][0].__setitem__(0, "Z"))
    case("rows out of order", lambda m: part(m)["partial"][0][1].reverse()
         if len(part(m)["partial"][0][1]) > 1 else part(m)["partial"][0][1].append(
             part(m)["partial"][0][1][0]))
    case("heap order broken", lambda m: part(m)["partial"].reverse())
    case("no start computation", lambda m: part(m).__setitem__(
        "partial", [c for c in part(m)["partial"] if c[1]]))
    case("a string for an int", lambda m: part(m)["rows"][0][3].__setitem__(1, "cheap"))
    case("a negative count", lambda m: part(m).__setitem__("count", -1))
    case("a key twice", lambda m: m["recognize"]["partitions"].append(part(m)))
    case("a field missing", lambda m: part(m).pop("last_ts"))
    case("not a list", lambda m: part(m).__setitem__("completed", {"a": 1}))
    case("a completed match not final", lambda m: part(m).__setitem__(
        "completed", [part(m)["partial"][0]]))
    return cases


WHY = {"no recognize state": "not the state of a MATCH_RECOGNIZE engine",
       "another version": "state version 99", "another automaton": "another pattern's",
       "state out of range": "a partial match in state 999",
       "a row index not saved": "a partial match's row ['A', 1000000]",
       "an unknown variable": "a partial match's row ['Z'",
       "rows out of order": "rows are out of order",
       "heap order broken": "not in heap order",
       "no start computation": "the start computation is missing",
       "a string for an int": "price = 'cheap' is not a int",
       "a negative count": "row count -1", "a key twice": "appears twice",
       "a field missing": "not a partition's fields",
       "not a list": "completed matches are not a list",
       "a completed match not final": "a completed match in state"}


def test_damaged_or_foreign_state_is_refused_clearly():
    checked, engine = _busy_engine()
    meta = _snapshot_meta(engine)
    damages = _damaged(meta)
    assert len(damages) == len(WHY)
    for what, bad in damages:
        with pytest.raises(RecognizeStateError, match="query 'vshape': MATCH_RECOGNIZE state "
                                                      "refused") as refused:
            _restored(checked, bad)
        assert WHY[what] in str(refused.value), what
    with pytest.raises(RecognizeStateError):
        _restored(checked, meta, {"x": np.zeros(2)})  # arrays it never writes
    # another pattern of the same name
    [other] = load_query_text(V_SHAPE.replace("A B+ C", "A B{2,} C"))
    with pytest.raises(RecognizeStateError, match="another pattern's automaton"):
        _restored(other, meta)
    # a refused restore leaves the engine as it was
    fresh = _engine(checked)
    with pytest.raises(RecognizeStateError):
        fresh.restore(snapshot_format.pack_arrays("engine", damages[3][1], {}))
    assert fresh.interpreter.partitions == {}


def test_a_damaged_state_fails_only_its_query_in_stream_engines(interpreter):
    [checked] = load_query_text(V_SHAPE)
    [other] = load_query_text(V_SHAPE.replace("QUERY vshape INTO alerts\n", "").replace(
        ") AS T;", ") AS U;"))
    strings = StringDictionary()
    engines = jit.StreamEngines([checked, other], strings)
    engines.process(BatchEncoder(checked.schema, strings).from_events(_v_events(20)))
    meta, arrays = snapshot_format.unpack_arrays("engines", engines.snapshot())
    index = meta["engines"].index("vshape")
    inner, inner_arrays = snapshot_format.unpack_arrays("engine", arrays[f"e{index}"].tobytes())
    inner["recognize"]["partitions"][0]["count"] = "many"
    arrays[f"e{index}"] = np.frombuffer(snapshot_format.pack_arrays("engine", inner,
                                                                    inner_arrays), np.uint8)
    again = jit.StreamEngines([checked, other], StringDictionary())
    again.restore(snapshot_format.pack_arrays("engines", meta, arrays))
    assert list(again.failed) == ["vshape"]
    assert "row count 'many'" in again.failed["vshape"].reason
    assert [e.checked.name for e in again.engines] == ["U"]


def test_cep_run_jit_default_gives_the_references_lines(tmp_path):
    [case] = [c for c in CASES if c.id.endswith("seed1-case0")]
    statement, rows, flink = case.values
    query = tmp_path / "q.cep"
    query.write_text(statement + ";\n")
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    done = subprocess.run([sys.executable, "-m", "cep_service.cli.main", "run", str(query),
                           "--events", str(events)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    found = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert found and found == reference.run(load_query_text(statement), _events(rows))
    assert _columns(load_query_text(statement)[0], found) == sorted(map(json.dumps, flink))


# What the interpreter holds besides its state, which the engine's state need not save;
# `partitions`, `keys`, `pending` (and `dead_letters`, handed out after each batch) are
# saved. A new attribute is either configuration (add it here) or state (save it).
CONFIGURATION = {"checked", "query", "body", "nfa", "defines", "within"}
SAVED = {"partitions", "keys", "pending", "dead_letters"}


def test_the_state_saves_everything_the_interpreter_keeps():
    [checked] = load_query_text(V_SHAPE)
    engine = _engine(checked)
    unknown = set(vars(engine.interpreter)) - CONFIGURATION - SAVED
    assert not unknown, f"RecognizeInterpreter keeps {unknown}: save it in the engine's state"


def test_rows_of_one_time_waiting_to_be_sorted_survive_a_snapshot_and_are_held(interpreter):
    text = V_SHAPE.replace("ORDER BY ts", "ORDER BY ts, price DESC")
    [checked] = load_query_text(text)
    events = [Event(e.seq, 1000 * (e.seq // 3), dict(e.attrs, ts=1000 * (e.seq // 3)))
              for e in _v_events()]  # three rows per time
    want = reference.run([checked], events)
    assert want
    for cut in (4, 20, 31):
        assert _stream_run([checked], events, 4, cut) == want, cut
    engine = _engine(checked)
    engine.process(BatchEncoder(checked.schema, engine.strings).from_events(events[:8]))
    assert engine.held_seq() is not None and engine.held_seq() <= 6  # 6 and 7 wait
    meta = _snapshot_meta(engine)
    assert meta["recognize"]["pending"]
    assert _snapshot_meta(_restored(checked, meta)) == meta
    bad = json.loads(json.dumps(meta))
    bad["recognize"]["pending"][0][0][1] += 1  # a row of another time among them
    with pytest.raises(RecognizeStateError, match="pending rows 0"):
        _restored(checked, bad)
