"""Generated kernel modules keep their bytecode beside them (`cep_core.compiler.modules`),
so a later process loads it instead of compiling the source, even where Python writes no
bytecode itself (PYTHONDONTWRITEBYTECODE): the .pyc is there, valid for the source, and
rewritten when the source is newer."""

import importlib.util
import os
import subprocess
import sys
import uuid
from pathlib import Path

from cep_core.compiler import modules

ROOT = Path(__file__).resolve().parent.parent


def _pyc_matches(source: Path) -> bool:
    """What the import system checks: the header's source mtime and size."""
    header = Path(importlib.util.cache_from_source(str(source))).read_bytes()[:16]
    stat = source.stat()
    return (header[:4] == importlib.util.MAGIC_NUMBER
            and int.from_bytes(header[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(header[12:16], "little") == stat.st_size & 0xFFFFFFFF)


def test_a_generated_module_gets_valid_bytecode(tmp_path, monkeypatch):
    monkeypatch.setenv("CEP_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    body = f"VALUE = {uuid.uuid4().int}\n"
    module = modules.load_module(body)
    source = Path(module.__file__)
    assert source.parent == tmp_path
    assert _pyc_matches(source)

    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 2 * 10**9))
    modules._write_bytecode(source)
    assert _pyc_matches(source)


def test_a_later_process_does_not_compile_the_source(tmp_path):
    body = f"VALUE = {uuid.uuid4().int}\n"
    script = f"""
import importlib._bootstrap_external as bootstrap
import sys
compiled = []
original = bootstrap.SourceLoader.source_to_code
def source_to_code(self, data, path, *, _optimize=-1):
    compiled.append(path)
    return original(self, data, path, _optimize=_optimize)
bootstrap.SourceLoader.source_to_code = source_to_code
from cep_core.compiler.modules import load_module
module = load_module({body!r})
print(sum("cep_kernel_" in p for p in compiled), module.VALUE)
"""
    env = {**os.environ, "CEP_KERNEL_CACHE": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    runs = [subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                           capture_output=True, text=True, check=True).stdout.split()
            for _ in range(2)]
    value = body.split("= ")[1].strip()
    assert runs[0] == ["1", value]  # the first compiles it
    assert runs[1] == ["0", value]
