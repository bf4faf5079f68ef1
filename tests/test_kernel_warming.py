"""Kernels compile off the data path (cep_core/kernel_warmer.py): after a warm-up in a child
process, a fresh process running the same queries on real events compiles none of the
project's kernels (numba only loads them from the kernel cache); and a running pipeline
holds a query added live until its kernels are warm, then applies it at the seq it has
reached, with the output `cep run` gives from that seq."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest

from cep_core import reference
from cep_core.checker import load_queries, load_query_text
from cep_core.event_io import read_events
from cep_core.kernel_warmer import KernelWarmer, synthetic_events
from cep_core.schema import SchemaRegistry
from cep_service.stream.control import split_query_file
from cep_service.stream.kafka import KafkaSettings, Topics, produce, produce_end, read_all
from cep_service.stream.pipeline import LocalPipeline, create_topics, wait_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

MISSES = """
import gc, json, sys
from numba.core.registry import CPUDispatcher
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_queries
from cep_core.event_io import read_events
from cep_core.stream_engines import StreamEngines, run_engines
queries = load_queries(sys.argv[1])
events, _ = read_events(sys.argv[2], queries[0].schema)
strings = StringDictionary()
engines = StreamEngines(queries, strings)
run_engines(engines, BatchEncoder(queries[0].schema, strings), events)
StreamEngines(queries, strings).restore(engines.snapshot())
found = [(d.py_func.__module__, d.py_func.__name__, sum(d.stats.cache_misses.values()))
         for d in gc.get_objects() if isinstance(d, CPUDispatcher)]
print(json.dumps([f for f in found if f[2] and not f[0].startswith("numba.")]))
"""


def test_synthetic_events_cover_every_event_type():
    schema = SchemaRegistry().get("rfid")
    events = synthetic_events(schema, 8)
    assert {e.attrs["type"] for e in events} == set(schema.types)
    assert [e.ts for e in events] == sorted(e.ts for e in events)


@pytest.mark.parametrize("case", [("finance.cep", "trades.jsonl"),
                                  ("stocks.cep", "stocks.jsonl")])
def test_after_warming_a_new_process_compiles_no_kernel(case, tmp_path, monkeypatch):
    query_file, events_file = EXAMPLES / case[0], EXAMPLES / "data" / case[1]
    monkeypatch.setenv("CEP_KERNEL_CACHE", str(tmp_path / "kernels"))
    warmer = KernelWarmer()
    try:
        done = warmer.submit(query_file.read_text()).result(timeout=600)
    finally:
        warmer.close()
    assert done["failed"] == {}
    assert done["queries"] == [q.name for q in load_queries(query_file)]
    ran = subprocess.run([sys.executable, "-c", MISSES, str(query_file), str(events_file)],
                         env={**os.environ, "CEP_KERNEL_CACHE": str(tmp_path / "kernels")},
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == []


def cep(broker, topics: Topics, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KAFKA_BOOTSTRAP": broker.bootstrap, "CEP_TOPIC_PREFIX": topics.prefix,
           "CEP_STREAM": topics.stream}
    return subprocess.run([sys.executable, "-m", "cep_service.cli.main", *args, "--timeout", "300"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)


def test_a_live_add_waits_for_its_kernels_then_starts_where_the_stream_is(
        kafka_bootstrap, tmp_path):
    broker = KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)
    run = uuid.uuid4().hex[:8]
    topics = Topics("trades", source=f"src.trades.{run}", prefix=f"t{run}")
    texts = dict(split_query_file((EXAMPLES / "finance.cep").read_text()))
    activity = texts["activity"].replace("INTO trade_stats", f"INTO stats_{run}")
    mshape = texts["mshape"].replace("INTO double_tops", f"INTO tops_{run}")
    create_topics(broker, topics, 2, [f"stats_{run}", f"tops_{run}"])
    (tmp_path / "activity.cep").write_text(activity)
    (tmp_path / "mshape.cep").write_text(mshape)
    lines = [line for line in (EXAMPLES / "data" / "trades.jsonl").read_bytes().splitlines()
             if line.strip()]
    half = len(lines) // 2
    with LocalPipeline(broker, topics, workers=1, partitions=2) as pipeline:
        assert pipeline.splitter.warmer is not None  # the default
        wait_for(lambda: pipeline.splitter.started, 120, "the splitter")
        added = cep(broker, topics, "query", "add", str(tmp_path / "activity.cep"))
        assert added.returncode == 0, added.stdout + added.stderr
        assert "add applied from seq 0" in added.stdout, added.stdout
        producer = broker.producer()
        for line in lines[:half]:
            produce(producer, topics.source, line)
        producer.flush(30)
        wait_for(lambda: pipeline.splitter.position >= half, 120, "the first half stamped")
        added = cep(broker, topics, "query", "add", str(tmp_path / "mshape.cep"))
        assert added.returncode == 0, added.stdout + added.stderr
        start = int(re.search(r"add applied from seq (\d+)", added.stdout).group(1))
        assert start >= half
        assert not pipeline.splitter.held and pipeline.splitter.warming is None
        for line in lines[half:]:
            produce(producer, topics.source, line)
        produce_end(producer, topics.source)
        producer.flush(30)
        wait_for(lambda: pipeline.coordinator.merger.ended, 300, "end of input released")

    queries = {q.name: q for q in load_query_text(activity + "\n" + mshape)}
    events, _ = read_events(EXAMPLES / "data" / "trades.jsonl", queries["mshape"].schema)
    got = {name: [orjson.loads(m.value()) for m in read_all(broker, q.query.output)]
           for name, q in queries.items()}
    assert got["activity"] == reference.run([queries["activity"]], events)
    later = [e for e in events if e.seq >= start]
    assert got["mshape"] == reference.run([queries["mshape"]], later)
