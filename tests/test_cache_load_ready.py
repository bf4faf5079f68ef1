"""`cache_load.ready()` does, in a fresh process, the one-off work a jitted kernel's first
call would otherwise do inside `cep run`'s engine time: numba's NRT symbols, its extension
entry points and `numpy.ma` (numba's typing of every array argument touches it)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import sys
from numba.core import entrypoints
before = ["numpy.ma" in sys.modules, entrypoints._already_initialized]
from cep_core.engine import cache_load
cache_load.ready()
print(before, ["numpy.ma" in sys.modules, entrypoints._already_initialized])
"""


def test_ready_imports_numpy_ma_and_scans_entry_points():
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[False,", "False]", "[True,", "True]"]
