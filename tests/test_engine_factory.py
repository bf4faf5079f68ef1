"""The one engine factory (`cep_core.engine_factory.create_engine`): every caller gets its
engines there, placement included; the CPU path never loads the GPU side."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from cep_core.batch import StringDictionary
from cep_core.checker import load_queries
from cep_core.engine.match import MatchEngine
from cep_core.engine_factory import Placement, create_engine
from cep_core.stream_engines import StreamEngines

ROOT = Path(__file__).resolve().parent.parent
ENGINE_CLASSES = {"MatchEngine", "SeqEngine", "SeqAipEngine", "WindowEngine",
                  "GpuMatchEngine", "GpuSeqEngine"}
FACTORIES = {"cep_core/engine_factory.py", "accel/gpu/policy.py"}


@pytest.fixture(scope="module")
def finance():
    return load_queries(ROOT / "examples" / "finance.cep")  # MATCH mshape, WINDOW activity


def test_cpu_placement_is_recorded_on_the_engine(finance):
    engine = create_engine(finance[0], StringDictionary())
    assert isinstance(engine, MatchEngine)
    assert engine.placement == Placement("mshape", "cpu", "placement cpu")


def test_unknown_placement_is_refused_even_without_an_engine_to_place(finance):
    with pytest.raises(ValueError, match="placement must be one of cpu, gpu, auto, got 'tpu'"):
        create_engine(finance[0], StringDictionary(), placement="tpu")
    with pytest.raises(ValueError, match="placement must be one of"):
        StreamEngines(finance[1:], StringDictionary(), placement="tpu")  # WINDOW only


def test_stream_engines_report_where_each_query_went(finance):
    report: list = []
    StreamEngines(finance, StringDictionary(), placement="cpu", report=report)
    assert [p.line() for p in report] == [
        "mshape: cpu: placement cpu",
        "activity: cpu: WINDOW queries run on the CPU (shared panes)"]
    unplaced: list = []
    StreamEngines(finance, StringDictionary(), report=unplaced)
    assert unplaced == []


def test_cpu_path_imports_no_gpu_module():
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from cep_core.batch import StringDictionary\n"
        "from cep_core.checker import load_queries\n"
        "from cep_core.runner import new_engines\n"
        "from cep_core.stream_engines import StreamEngines\n"
        "for name in ('finance', 'rfid'):\n"
        "    queries = load_queries(Path('examples') / f'{name}.cep')\n"
        "    new_engines(queries)\n"
        "    new_engines(queries, 'cpu', [])\n"
        "    StreamEngines([], StringDictionary()).add(queries[0])\n"
        "print(sorted(m for m in sys.modules if m.startswith(('accel', 'numba.cuda'))))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def engine_constructions(path: Path) -> list[str]:
    """Names of engine classes the module calls (constructs)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else None
            if name in ENGINE_CLASSES:
                found.append(name)
    return found


def test_only_the_factory_constructs_engines():
    """The product (not tests or benchmarks, which measure one engine on purpose) makes
    engines through `create_engine` only."""
    constructing = {str(path.relative_to(ROOT)): engine_constructions(path)
                    for package in ("cep_core", "services", "accel")
                    for path in sorted((ROOT / package).rglob("*.py"))}
    assert {path for path, names in constructing.items() if names} == FACTORIES


def test_the_gpu_placement_policy_comes_from_its_entry_point_and_a_missing_one_is_named():
    from cep_accel.gpu import policy
    from cep_core.placement import PlacementUnavailable, placement_policy

    assert placement_policy("gpu") is policy
    with pytest.raises(PlacementUnavailable, match="no placement policy 'tpu' is installed"):
        placement_policy("tpu")
