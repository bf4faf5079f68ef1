"""The compiler and the engines meet only in the runtime kernels: no module of
`cep_core.compiler` imports `cep_core.engine` or back, and `cep_core.kernels` imports
neither (every import statement counts, in a function or not)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CEP_CORE = Path(__file__).resolve().parent.parent / "cep_core"


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement of the file names (`from cep_core import engine`
    names `cep_core.engine`; relative imports are resolved)."""
    package = ".".join(path.relative_to(CEP_CORE.parent).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def package_imports(package: str) -> dict[str, set[str]]:
    return {str(path.relative_to(CEP_CORE.parent)): imported_modules(path)
            for path in sorted((CEP_CORE / package).rglob("*.py"))}


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("package,forbidden", [
    ("compiler", ("cep_core.engine",)),
    ("engine", ("cep_core.compiler",)),
    ("kernels", ("cep_core.compiler", "cep_core.engine")),
])
def test_package_does_not_import(package, forbidden):
    imports = package_imports(package)
    assert imports, f"no modules found in cep_core/{package}"
    wrong = {path: sorted(m for m in modules if any(within(m, f) for f in forbidden))
             for path, modules in imports.items()}
    assert not {path: m for path, m in wrong.items() if m}


def test_the_check_sees_imports_in_functions_and_relative_ones(monkeypatch):
    source = CEP_CORE / "compiler" / "probe.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: (
        "def f():\n    from ..engine import match\n    import cep_core.engine.seq\n"))
    assert {"cep_core.engine", "cep_core.engine.match", "cep_core.engine.seq"} <= \
        imported_modules(source)
