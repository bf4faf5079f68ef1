"""Kernels loaded from numba's on-disk cache (`cep_core.engine.cache_load`): a process whose
kernels are cached runs its first examples without numba's full registry refresh (no
numba.np.linalg, one of the modules it imports) and finds what the reference interpreter
finds; whatever must compile still gets the refresh (a numba typed Dict made from Python
compiles, cache or not: the rfid example's engine makes one)."""

import os
import subprocess
import sys
from pathlib import Path

import orjson

from tests.test_examples import FILES

ROOT = Path(__file__).resolve().parent.parent

# Every example: MATCH, SEQ (both SEQ engines) and WINDOW kernels.
SCRIPT = """
import sys
import orjson

from tests.test_examples import FILES
from cep_core.checker import load_queries
from cep_core.event_reader import read_table
from cep_core.runner import run_checked
from tests.test_examples import FILES, data_for

found = {}
for path in FILES:
    queries = load_queries(path)
    table, _ = read_table(data_for(path), queries[0].schema)
    jit, rejected = run_checked(queries, table, "jit")
    reference, rejected_reference = run_checked(queries, table, "reference")
    found[path.name] = [jit.to_dicts() == reference.to_dicts(),
                        rejected == rejected_reference, len(jit),
                        "numba.np.linalg" in sys.modules]
print(orjson.dumps(found).decode())
"""


def run_in_home(script: str, home: Path):
    """What `script` prints last (JSON), run in a fresh process whose CEP_HOME is `home`
    (its kernel cache there)."""
    env = {**os.environ, "CEP_HOME": str(home)}
    env.pop("CEP_KERNEL_CACHE", None)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout.splitlines()[-1])


def run_examples(home: Path) -> dict:
    return run_in_home(SCRIPT, home)


def test_cached_kernels_load_without_the_registry_refresh(tmp_path):
    compiled = run_examples(tmp_path)  # an empty kernel cache: numba compiles
    assert all(refreshed for *_, refreshed in compiled.values())
    loaded = run_examples(tmp_path)
    assert not loaded[FILES[0].name][3]
    for name, (same, same_rejected, count, _) in loaded.items():
        assert same and same_rejected and count, name
        assert compiled[name][:3] == loaded[name][:3]
