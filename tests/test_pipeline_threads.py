"""The in-process pipeline (services/stream/pipeline.py) imports the engines' modules before
it starts its threads: threads that check queries and make engines at once, each reaching
numba and the compilers by another first import, then all succeed. Without that, such a
start failed about one run in ten with `_DeadlockError` or "partially initialized module
'numba.core.caching'" (Python's per-module import locks). Each run is a fresh interpreter
(nothing imported yet); the engines are made over a kernel cache of the test's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import importlib, json, sys, threading, traceback
from pathlib import Path

from cep_service.stream.control import split_query_file
from cep_service.stream.kafka import KafkaSettings, Topics
from cep_service.stream.pipeline import LocalPipeline

fresh = "numba" not in sys.modules
# made (not started: no broker) before any thread, as every user of the pipeline does
LocalPipeline(KafkaSettings("127.0.0.1:9"), Topics("trades", source="s", prefix="p"),
              workers=2)
ROOT = Path(sys.argv[1])
texts = [text for name in ("finance.cep", "rfid.cep", "fire.cep", "ticks.cep")
         for _, text in split_query_file((ROOT / "examples" / name).read_text())]
# first imports as the threads of a pipeline make them: the cache loader, a compiler, an
# engine, the kernels, numba's cache module, the factory
entries = ["cep_core.engine.cache_load:install", "cep_core.compiler.match",
           "cep_core.engine.match", "cep_core.engine.window", "cep_core.compiler.seq_cdp",
           "cep_core.engine.seq_aip", "numba.core.caching", "cep_core.kernels.window_kernels",
           "cep_core.stream_engines", "cep_core.engine_factory"]
errors = []
barrier = threading.Barrier(len(entries) + len(texts))


def first_import(entry):
    try:
        barrier.wait()
        module, _, function = entry.partition(":")
        found = importlib.import_module(module)
        if function:
            getattr(found, function)()
    except BaseException:
        errors.append(traceback.format_exc())


def engines(text):
    try:
        barrier.wait()
        from cep_core.batch import StringDictionary
        from cep_core.checker import load_query_text
        from cep_core.stream_engines import StreamEngines
        queries = load_query_text(text)
        made = StreamEngines(queries, StringDictionary())
        assert not made.failed, made.failed
    except BaseException:
        errors.append(traceback.format_exc())


threads = [threading.Thread(target=first_import, args=(e,)) for e in entries] + \
    [threading.Thread(target=engines, args=(t,)) for t in texts]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps({"fresh": fresh, "threads": len(threads), "errors": errors}))
'''


@pytest.mark.parametrize("run", range(3))
def test_threads_making_engines_at_once_in_a_fresh_process(tmp_path, run):
    env = {**os.environ, "CEP_KERNEL_CACHE": os.environ.get("CEP_KERNEL_CACHE")
           or str(tmp_path / "kernels")}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["fresh"]  # nothing of numba before the pipeline was made
    assert result["threads"] > 15
    assert result["errors"] == [], "\n".join(result["errors"])[-3000:]
