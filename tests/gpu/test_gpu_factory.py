"""`cep_core.engine_factory.create_engine` with placement "gpu" and "auto" on the CUDA
simulator (see conftest.py): the GPU engines come from the one factory, each engine says
where it went, and a placed run gives the reference interpreter's composite events."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conftest import REAL, SCALE  # noqa: E402

from cep_accel.gpu import device, placement  # noqa: E402
from cep_accel.gpu.match_engine import GpuMatchEngine  # noqa: E402
from cep_accel.gpu.seq_engine import GpuSeqEngine  # noqa: E402
from cep_core import reference  # noqa: E402
from cep_core.batch import StringDictionary  # noqa: E402
from cep_core.checker import load_queries  # noqa: E402
from cep_core.engine.match import MatchEngine  # noqa: E402
from cep_core.engine_factory import create_engine  # noqa: E402
from cep_core.event_io import read_events  # noqa: E402
from cep_core.runner import run_checked  # noqa: E402
from cep_core.stream_engines import StreamEngines  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
FINANCE = load_queries(ROOT / "examples" / "finance.cep")  # MATCH mshape, WINDOW activity
RFID = load_queries(ROOT / "examples" / "rfid.cep")  # fulfilled: SEQ the GPU runs


def test_gpu_placement_gives_the_gpu_engines():
    mshape, fulfilled = FINANCE[0], RFID[0]
    match = create_engine(mshape, StringDictionary(), placement="gpu")
    assert isinstance(match, GpuMatchEngine)
    assert match.placement == placement.place(mshape, "gpu")
    assert match.placement.target == "gpu"
    seq = create_engine(fulfilled, StringDictionary(), placement="gpu", gpu_cost_threshold=1)
    assert isinstance(seq, GpuSeqEngine) and seq.placement.target == "gpu"


def test_auto_keeps_the_simulator_off_and_unsupported_queries_on_the_cpu():
    if REAL:
        return  # on a real GPU "auto" may choose it
    auto = create_engine(FINANCE[0], StringDictionary(), placement="auto",
                         expected_keys=10**6)
    assert isinstance(auto, MatchEngine) and not isinstance(auto, GpuMatchEngine)
    assert "no real GPU" in auto.placement.reason
    not_cancelled = create_engine(RFID[1], StringDictionary(), placement="gpu")
    assert not isinstance(not_cancelled, GpuSeqEngine)
    assert not_cancelled.placement.line() == placement.place(RFID[1], "gpu").line()


def test_match_recognize_stays_on_the_cpu_with_its_reason_and_the_references_answers():
    from cep_core.checker import load_query_text
    from cep_core.engine.recognize import RecognizeEngine
    from cep_core.events import Event

    [checked] = load_query_text(
        "SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
        "MEASURES LAST(B.price) AS bottom ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW "
        "PATTERN (A B+ C) DEFINE B AS B.price < PREV(price), C AS C.price > PREV(price)) AS T")
    events = [Event(i, 1000 * i, {"symbol": "S", "price": p, "volume": 1, "ts": 1000 * i,
                                  "seqNum": i}) for i, p in enumerate([10, 8, 7, 9, 11, 6, 8])]
    for where in ("gpu", "auto"):
        engine = create_engine(checked, StringDictionary(), placement=where)
        assert isinstance(engine, RecognizeEngine)  # the jitted CPU engine takes it
        assert engine.placement.target == "cpu"
        assert "MATCH_RECOGNIZE queries run on the CPU" in engine.placement.reason
        report: list = []
        composites, _ = run_checked([checked], events, "jit", where, report=report)
        assert composites.to_dicts() == reference.run([checked], events) != []
        assert [p.target for p in report] == ["cpu"]


def test_stream_engines_report_as_cep_run_prints_it():
    report: list = []
    StreamEngines(FINANCE, StringDictionary(), placement="gpu", report=report)
    assert [p.line() for p in report] == [
        f"mshape: gpu: placement gpu, MATCH per-key kernel ({device.name()})",
        "activity: cpu: WINDOW queries run on the CPU (shared panes)"]


def test_placed_run_equals_the_reference():
    queries = RFID[:1] + RFID[2:]  # fulfilled on the GPU, the rest on the CPU with reasons
    events, _ = read_events(ROOT / "examples" / "data" / "rfid.jsonl", queries[0].schema)
    events = events[:150 * SCALE]
    report: list = []
    composites, dead = run_checked(queries, events, "jit", "gpu", report=report)
    assert [p.target for p in report] == ["gpu", "cpu", "cpu"]
    expected = reference.run(queries, events)
    assert composites.to_dicts() == expected and expected
    assert dead == run_checked(queries, events, "reference")[1]
