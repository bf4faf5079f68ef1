"""A bounded atheris (libFuzzer, coverage-guided) run of each harness in tests/fuzz/.

Longer runs: see tests/fuzz/fuzz_targets.py."""

import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).parent / "fuzz" / "fuzz_targets.py"
SEEDS = {"events": [b'{"kind":"A","n":1,"x":1.5,"ok":true,"ts":5}', b'{"kind":"C"}\n[1]'],
         "queries": [p.read_bytes() for p in
                     sorted((Path(__file__).parent.parent / "examples").glob("*.cep"))]}


# libFuzzer stops at 2 GB of the process's peak RSS (getrusage), and Linux keeps a process's
# peak across exec: a harness started straight from a test worker that has grown to 2.4 GB
# reads as out of memory before its first input. A process started from a small one (this
# short Python) starts its count afresh, so the limit measures the harness alone.
FRESH_PROCESS = [sys.executable, "-c", "import subprocess, sys; "
                 "sys.exit(subprocess.call(sys.argv[1:]))"]


@pytest.mark.parametrize("target", ["events", "queries"])
def test_atheris_finds_no_crash(target, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, seed in enumerate(SEEDS[target]):
        (corpus / f"seed{i}").write_bytes(seed)
    result = subprocess.run(
        [*FRESH_PROCESS, sys.executable, str(HARNESS), target, "-runs=500", "-timeout=10",
         "-seed=1", f"-artifact_prefix={tmp_path}/", str(corpus)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Done 500 runs" in result.stderr
    assert not list(tmp_path.glob("crash-*"))
