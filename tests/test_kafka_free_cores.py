"""The stream's cores are Kafka-free in their imports too: the routing core, the partition
core, the merge and the in-memory pipeline import nothing of confluent_kafka (nor Faust),
so a process without a Kafka client runs a whole pipeline. Each is imported in a fresh
interpreter where importing confluent_kafka fails, and the pipeline run there gives the
reference interpreter's composite events."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import confluent_kafka
import pytest

from cep_core import reference
from cep_core.checker import load_queries
from cep_core.event_io import read_events
from cep_service.stream.control import split_query_file
from cep_service.stream.topics import OFFSET_BEGINNING

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CORES = ["cep_service.stream.routing", "cep_service.stream.partition", "cep_service.stream.merge",
         "cep_service.stream.memory_pipeline", "cep_service.stream.topics",
         "cep_service.stream.status", "cep_service.stream.splitter_order"]

# Run in the child: importing a blocked package raises ImportError, as where it is missing.
BLOCK = """
import importlib.abc, sys
BLOCKED = ("confluent_kafka", "faust", "mode")
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, Blocked())
"""


def run_child(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", BLOCK + code], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_block_works():
    out = run_child("""
try:
    import confluent_kafka
except ImportError:
    print("blocked")
""")
    assert out.strip() == "blocked"
    with pytest.raises(AssertionError, match="blocked in this test"):
        run_child("import cep_service.stream.kafka")


@pytest.mark.parametrize("module", CORES)
def test_core_imports_without_kafka(module):
    out = run_child(f"""
import {module}, sys
print(sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
""")
    assert out.strip() == "[]"


def test_memory_pipeline_runs_without_kafka():
    query_file, events_file = EXAMPLES / "rfid.cep", EXAMPLES / "data/rfid.jsonl"
    queries = load_queries(query_file)
    events, _ = read_events(events_file, queries[0].schema)
    found = reference.run(queries, events)
    expected = {q.query.output: [c for c in found if c["query"] == q.name] for q in queries}
    assert sum(map(len, expected.values())) > 0
    given = json.dumps({"stream": queries[0].schema.stream, "events": str(events_file),
                        "queries": split_query_file(query_file.read_text())})
    out = run_child(f"""
import json
from pathlib import Path
from cep_core.control_message import ControlMessage
from cep_service.stream.memory_pipeline import MemoryPipeline
given = json.loads({given!r})
pipeline = MemoryPipeline(given["stream"], partitions=3)
for name, text in given["queries"]:
    pipeline.control(ControlMessage("add", name, text))
lines = [l for l in Path(given["events"]).read_bytes().splitlines() if l.strip()]
for at in range(0, len(lines), 50):
    pipeline.send(lines[at:at + 50])
pipeline.end()
assert pipeline.merger.ended
print(json.dumps(pipeline.outputs))
""")
    outputs = json.loads(out)
    for output, composites in expected.items():
        assert outputs.get(output, []) == json.loads(json.dumps(composites)), output


def test_offset_beginning_is_kafkas():
    assert OFFSET_BEGINNING == confluent_kafka.OFFSET_BEGINNING
