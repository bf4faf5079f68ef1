"""Cached kernels that call numba's own jitted helpers (`np.empty`'s implementation in
numba.np.arrayobj) load in a fresh process without importing the module that defines them
(`cache_load` rebuilds their environments from a stand-in), and find what the reference
interpreter finds."""

from pathlib import Path

from tests.test_kernel_cache_load import run_in_home

SCRIPT = """
import sys
import orjson

from cep_core.checker import load_queries
from cep_core.event_reader import read_table
from cep_core.runner import run_checked
from tests.test_examples import EXAMPLES, data_for

path = EXAMPLES / "stocks.cep"
queries = load_queries(path)
table, _ = read_table(data_for(path), queries[0].schema)
jit, rejected = run_checked(queries, table, "jit")
imported = "numba.np.arrayobj" in sys.modules
reference, rejected_reference = run_checked(queries, table, "reference")
print(orjson.dumps([jit.to_dicts() == reference.to_dicts(), rejected == rejected_reference,
                    len(jit), imported]).decode())
"""


def run_stocks(home: Path) -> list:
    return run_in_home(SCRIPT, home)


def test_cached_kernels_load_without_importing_numba_array_module(tmp_path):
    same, same_rejected, count, imported = run_stocks(tmp_path)  # compiles
    assert same and same_rejected and count and imported
    same, same_rejected, loaded_count, imported = run_stocks(tmp_path)
    assert same and same_rejected and loaded_count == count
    assert not imported
