"""The pipeline view's parts without a broker: what the coordinator says it withholds
(services/stream/metrics.py `withheld`, read off a Merger fed frames), the figures a
service's Prometheus endpoint gives (services/api/pipeline.py), the view assembled from a
status view and those figures, its graph in Graphviz's language, and the queries' history
(services/api/history.py)."""

from __future__ import annotations

import orjson

from cep_service.api.history import History
from cep_service.api.pipeline import endpoint_figures, graph_dot, look, pipeline, process_figures
from cep_service.stream import frames
from cep_service.stream.merge import Merger
from cep_service.stream.kafka import Topics
from cep_service.stream.metrics import Metrics, withheld

MATCH = """QUERY m FROM trades INTO tops PARTITION BY symbol
PATTERN ( . up ) DEFINE up AS price > Last(price) EMIT symbol = symbol;"""
WINDOW = """QUERY w INTO stats SELECT symbol, count(*) AS n
FROM trades [RANGE 10 seconds SLIDE 5 seconds] GROUP BY symbol;"""
COUNTED = """QUERY c INTO counted SELECT symbol, count(*) AS n
FROM trades [ROWS 10 SLIDE 5] GROUP BY symbol;"""


def _matches(part, upto, ts, composites=()):
    return frames.Frame(frames.MATCHES, {"part": part, "upto": upto, "ts": ts},
                        orjson.dumps(list(composites)) if composites else b"")


def merger_with(*texts) -> Merger:
    merger = Merger(3, "trades")
    queries = [{"name": t.split()[1], "text": t, "index": i} for i, t in enumerate(texts)]
    for part in range(3):
        merger.feed(frames.json_frame(frames.CONTROL, {"op": "set", "queries": queries},
                                      part=part, at=0))
    return merger


def test_withheld_names_the_partitions_a_match_waits_for():
    merger = merger_with(MATCH)
    merger.feed(_matches(0, 20, 1000, [{"query": "m", "key": "A", "seq": 12, "start_seq": 11}]))
    merger.feed(_matches(1, 8, 900))
    merger.feed(_matches(2, 30, 1100))
    assert merger.release() == []
    assert withheld(merger) == [("tops", 1, 12, "partition 1")]
    merger.feed(_matches(1, 15, 950))
    assert [c["seq"] for _, c in merger.release()] == [12]
    assert withheld(merger) == []


def test_withheld_by_a_time_window_waits_for_stream_time_or_the_end():
    merger = merger_with(WINDOW, COUNTED)
    composite = {"query": "w", "key": "A", "seq": 5, "start_seq": 1, "window_end": 10_000}
    counted = {"query": "c", "key": "A", "seq": 6, "start_seq": 1, "window_end": 10}
    for part in range(3):
        merger.feed(_matches(part, 9, 2000, [composite, counted] if part == 0 else ()))
    assert merger.release() == []
    assert sorted(withheld(merger)) == [("counted", 1, 6, "end of input"),
                                        ("stats", 1, 5, "stream time")]


def test_the_coordinators_figures_read_back_from_its_endpoint_text():
    from prometheus_client import generate_latest

    merger = merger_with(MATCH)
    merger.feed(_matches(0, 20, 1000, [{"query": "m", "key": "A", "seq": 12, "start_seq": 11}]))
    merger.feed(_matches(1, 8, 900))
    metrics = Metrics("coordinator")
    metrics.identify("coordinator@host:1")
    metrics.checkpointed(4)
    metrics.observe_merger(merger)
    found = process_figures(endpoint_figures(generate_latest(metrics.registry).decode()),
                            None, 0.0)
    assert (found["service"], found["role"]) == ("coordinator@host:1", "coordinator")
    assert found["checkpoint_generation"] == 4 and found["checkpoint_time"] > 0
    assert found["merged"]["seq"] == {0: 20, 1: 8, 2: -1}
    assert found["merged"]["time"] == {0: 1000, 1: 900}
    assert found["withheld"] == [{"output": "tops", "waits_for": "partition 1,2", "seq": 12,
                                  "count": 1}]


def _figures(service, role, **given):
    return {"service": service, "role": role, "events_in_per_s": None,
            "events_out_per_s": None, "lag": 0, "checkpoint_time": None,
            "checkpoint_generation": None, "partition_lag": {},
            "merged": {"seq": {}, "time": {}, "frame": {}}, "withheld": [], **given}


def test_the_view_ranks_processes_by_role_and_keeps_to_its_stream():
    topics = Topics("trades", prefix="t")
    view = {"worker@h:2": {"role": "worker", "partitions": {1: {}}},
            "splitter@h:1": {"role": "splitter", "partitions": {}},
            "worker@h:3": {"role": "worker", "partitions": {0: {}}},
            "coordinator@h:4": {"role": "coordinator", "partitions": {}},
            "chained@h:5": {"role": "chained", "partitions": {}}}
    processes = {
        "splitter@h:1": _figures("splitter@h:1", "splitter", events_in_per_s=100.0),
        "worker@h:2": _figures("worker@h:2", "worker",
                               partition_lag={(topics.keyed, 1): 7, ("other", 1): 99}),
        "coordinator@h:4": _figures(
            "coordinator@h:4", "coordinator", checkpoint_time=90.0, checkpoint_generation=3,
            merged={"seq": {0: 5, 1: 4}, "time": {0: 50, 1: 40}, "frame": {0: 99.0, 1: 98.0}},
            withheld=[{"output": "tops", "waits_for": "partition 1", "seq": 5, "count": 2}]),
        "splitter@h:9": _figures("splitter@h:9", "splitter", events_in_per_s=1e6),  # another
    }
    found = pipeline("trades", topics, view, processes, {"composites_per_s": 3.0, "tails": 1},
                     "broker:9092", now=100.0)
    assert [p["id"] for p in found["processes"]] == [
        "broker", "splitter@h:1", "worker@h:2", "worker@h:3", "coordinator@h:4",
        "chained@h:5", "api"]
    assert found["processes"][0]["rate"] == 100.0  # this stream's splitter only
    assert found["processes"][4]["checkpoint_s_ago"] == 10.0
    assert {(e["source"], e["target"]) for e in found["edges"]} == {
        ("broker", "splitter@h:1"), ("splitter@h:1", "worker@h:2"),
        ("splitter@h:1", "worker@h:3"), ("worker@h:2", "coordinator@h:4"),
        ("worker@h:3", "coordinator@h:4"), ("coordinator@h:4", "chained@h:5"),
        ("chained@h:5", "api")}
    assert found["partitions"] == [
        {"partition": 0, "worker": "worker@h:3", "lag": None, "seq": 5, "event_time": 50,
         "last_frame_s_ago": 1.0},
        {"partition": 1, "worker": "worker@h:2", "lag": 7, "seq": 4, "event_time": 40,
         "last_frame_s_ago": 2.0}]
    assert found["withheld"][0]["says"] == \
        "2 composite events for tops from seq 5 wait for partition 1 (at seq 4)"
    dot = graph_dot(found)
    assert dot.count('id="node-') == 7 and '"chained\\n5\\n' in dot


def test_a_chained_process_is_one_node_with_its_stages_and_its_cut():
    """Its endpoint names the status topic's splitter, worker and coordinator records it
    writes (cep_stage_service) and counts each stage's events: the view folds them into
    one node of role chained, with each stage's rates, the cut's checkpoint (generation,
    time, how long it took) and the keyed partitions it holds."""
    from prometheus_client import generate_latest

    topics = Topics("trades", prefix="t")
    counts = {"routing": (1000.0, 1000.0), "partitions": (1000.0, 40.0),
              "merge": (40.0, 30.0)}
    metrics = Metrics("splitter")
    metrics.stages("splitter@h:5", {"routing": ["splitter@h:5"],
                                    "partitions": ["worker@h:5#1"],
                                    "merge": ["coordinator@h:5#2"]}, lambda: counts)
    metrics.events_in.inc(1000)
    metrics.checkpointed(7, took_s=0.0125)
    merger = merger_with(MATCH)
    merger.feed(_matches(0, 20, 1000))
    metrics.observe_merger(merger)
    first = process_figures(endpoint_figures(generate_latest(metrics.registry).decode()),
                            None, 0.0)
    assert (first["service"], first["role"]) == ("splitter@h:5", "chained")
    assert first["members"] == {"splitter@h:5": "routing", "worker@h:5#1": "partitions",
                                "coordinator@h:5#2": "merge"}
    assert first["stages"] == counts and first["checkpoint_ms"] == 12.5
    counts = {"routing": (3000.0, 3000.0), "partitions": (3000.0, 140.0),
              "merge": (140.0, 90.0)}
    metrics.events_in.inc(2000)
    found = process_figures(endpoint_figures(generate_latest(metrics.registry).decode()),
                            look(first, 100.0), 102.0)
    assert found["events_in_per_s"] == 1000.0
    assert found["stages_per_s"] == {"routing": (1000.0, 1000.0),
                                     "partitions": (1000.0, 50.0), "merge": (50.0, 30.0)}
    view = {"splitter@h:5": {"role": "splitter", "partitions": {}},
            "worker@h:5#1": {"role": "worker", "partitions": {0: {}, 1: {}}},
            "coordinator@h:5#2": {"role": "coordinator", "partitions": {}}}
    now = found["checkpoint_time"] + 3
    shown = pipeline("trades", topics, view, {"splitter@h:5": found},
                     {"composites_per_s": 30.0, "tails": 0}, "broker:9092", now=now)
    assert [(p["id"], p["role"]) for p in shown["processes"]] == [
        ("broker", "broker"), ("splitter@h:5", "chained"), ("api", "api")]
    chained = shown["processes"][1]
    assert shown["processes"][0]["rate"] == chained["rate"] == 1000.0
    assert chained["partitions"] == [0, 1]
    assert chained["services"] == ["splitter@h:5", "coordinator@h:5#2", "worker@h:5#1"]
    assert [(s["stage"], s["events_in_per_s"], s["events_out_per_s"], s["services"])
            for s in chained["stages"]] == [
        ("routing", 1000.0, 1000.0, ["splitter@h:5"]),
        ("partitions", 1000.0, 50.0, ["worker@h:5#1"]),
        ("merge", 50.0, 30.0, ["coordinator@h:5#2"])]
    assert (chained["checkpoint_generation"], chained["checkpoint_s_ago"],
            chained["checkpoint_ms"]) == (7, 3.0, 12.5)
    assert [(p["partition"], p["worker"], p["seq"]) for p in shown["partitions"]] == [
        (0, "splitter@h:5", 20), (1, "splitter@h:5", -1), (2, None, -1)]
    assert {(e["source"], e["target"], e["label"]) for e in shown["edges"]} == {
        ("broker", "splitter@h:5", "source"), ("splitter@h:5", "api", "INTO")}
    dot = graph_dot(shown)
    # the process a box around its three stages, the edges to and from its ends
    assert 'subgraph cluster_n1' in dot and 'id="node-1"' in dot
    assert [f'id="node-1-{j}"' in dot for j in range(4)] == [True, True, True, False]
    assert "n0 -> n1s0" in dot and "n1s2 -> n2" in dot and 'n1s0 -> n1s1 [label="keyed"]' in dot


def test_history_keeps_a_point_a_second_and_forgets_removed_queries():
    history = History(keep_s=10, every_s=1)
    history.add({"a": {"composites_per_s": 1.0, "partial_matches": 2}}, now=100.0)
    history.add({"a": {"composites_per_s": 9.0}}, now=100.5)  # too soon: no point
    history.add({"a": {"composites_per_s": 3.0, "state_bytes": 64},
                 "b": {"composites_per_s": 0.0}}, now=101.0)
    assert history.since(0)["a"] == {"t": [100.0, 101.0], "composites_per_s": [1.0, 3.0],
                                     "partial_matches": [2, None], "state_bytes": [None, 64]}
    assert history.since(100.0)["a"]["t"] == [101.0]
    history.add({"b": {"composites_per_s": 1.0}}, now=112.0)
    assert set(history.since(0)) == {"b"} and history.since(0)["b"]["t"] == [112.0]


def test_the_endpoints_refuse_unknown_and_malformed_streams(kafka_bootstrap):
    import json
    import urllib.error
    import urllib.request
    import uuid

    from cep_service.api.app import ApiConfig, ApiThread
    from cep_service.stream.kafka import KafkaSettings

    def get(path):
        try:
            with urllib.request.urlopen(api.url + path, timeout=60) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    config = ApiConfig(KafkaSettings(kafka_bootstrap), topic_prefix=uuid.uuid4().hex[:8])
    with ApiThread(config) as api:
        assert get("/api/pipeline") == (200, {"pipelines": []})  # no live query
        assert get("/api/pipeline?stream=nope") == (404, {"error": "no stream 'nope'"})
        status, body = get("/api/pipeline?stream=bad%20name")
        assert status == 400 and "stream" in body["error"]
        status, body = get("/api/pipeline?stream=trades")  # a schema file's stream
        assert status == 200 and [p["stream"] for p in body["pipelines"]] == ["trades"]
        assert [p["role"] for p in body["pipelines"][0]["processes"]] == ["broker", "api"]
        assert get("/api/history?since=0") == (200, {"queries": {}})
        assert get("/api/history?since=-1")[0] == 400


def test_the_chained_pipeline_serves_its_cores_figures(kafka_bootstrap):
    """One process runs every role: its one endpoint serves the merge (each keyed
    partition's seq and stream time) and the queries' partial matches and state bytes."""
    import uuid
    from pathlib import Path

    from prometheus_client import generate_latest

    from cep_service.stream.kafka import KafkaSettings
    from cep_service.stream.pipeline import LocalPipeline, wait_progressing
    from tests.stream_harness import file_records, produce_to_end, topics_with_queries

    root = Path(__file__).resolve().parent.parent
    settings = KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)
    run = uuid.uuid4().hex[:8]
    _, topics, _ = topics_with_queries(settings, root / "examples" / "finance.cep",
                                       f"src.view.{run}", f"view{run}", partitions=2)
    records = file_records(root / "examples" / "data" / "trades.jsonl")
    with LocalPipeline(settings, topics, partitions=2, chained=True) as pipeline:
        produce_to_end(settings, pipeline, topics.source, records)

        def figures():
            text = generate_latest(pipeline.metrics[0].registry).decode()
            return process_figures(endpoint_figures(text), None, 0.0), text

        last = len(records) - 1  # the end of input's seq
        wait_progressing(lambda: figures()[0]["merged"]["seq"] == {0: last, 1: last},
                         pipeline.progress, "the merged seqs at the end of input", stall_s=60)
        found, text = figures()
    assert found["merged"]["time"] and found["withheld"] == []
    # one process, its stages named and counted: every event of the input went through
    assert found["role"] == "chained" and sorted(found["members"].values()) == [
        "merge", "partitions", "routing"]
    assert found["stages"]["routing"][0] == len(records)  # out: an event per route
    assert found["stages"]["routing"][1] == found["stages"]["partitions"][0] >= len(records)
    assert found["stages"]["merge"][0] == found["stages"]["partitions"][1] > 0
    partial = endpoint_figures(text)["cep_partial_matches"]
    assert [labels["query"] for labels, _ in partial] == ["mshape"]
    state = {labels["query"]: value for labels, value in
             endpoint_figures(text)["cep_engine_state"] if labels["measure"] == "state_bytes"}
    assert state["mshape"] > 0
