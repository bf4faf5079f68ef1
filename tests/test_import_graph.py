"""The packages' layers hold: each package imports only the layers below it (the core no
accelerator, no service; the CLI and the benchmarks at the top), and inside the core the
compiler and the engines meet only in the runtime kernels: no module of `cep_core.compiler`
imports `cep_core.engine` or back, and `cep_core.kernels` imports neither. Every import
statement counts, in a function or not."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.layout import PACKAGES, ROOT, module_name

CEP_CORE = ROOT / "cep_core"
OLD_NAMES = ("services", "accel", "bench")

# A package may import the packages of lower layers (and its own), never a higher one or
# another of its own layer. A package of services/ is its own unit.
LAYERS = {
    "cep_core": 0,                                     # the language and the engines
    "cep_service.errors": 1,
    "cep_service.extras": 2,
    "cep_service.stream": 3,                           # the Kafka service
    "cep_service.api": 4, "cep_service.backfill": 4,   # beside each other, on the service
    "cep_service.spark_stream": 5,                     # the backfill's engines, streaming
    "cep_accel": 6,                                    # accelerators
    "cep_service.cli": 7,                              # the command line
    "cep_service.bench": 8,                            # benchmarks run the CLI too
}
# Upward imports still there, each with the reason (the test fails when one is gone).
KNOWN_UPWARD = {
    ("cep_service.cli", "cep_service.bench"):
        "`cep bench ...` commands import bench's modules when they run",
}


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement of the file names (`from cep_core import engine`
    names `cep_core.engine`; relative imports are resolved)."""
    parts = list(path.relative_to(ROOT).parts[:-1])
    package = ".".join([PACKAGES.get(parts[0], parts[0]), *parts[1:]]) if parts else ""
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


def unit_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] not in ("cep_core", "cep_service", "cep_accel"):
        return None
    return ".".join(parts[:2]) if parts[0] == "cep_service" and len(parts) > 1 else parts[0]


def module_of(path: str) -> str:
    return module_name(ROOT / path)


def project_imports() -> dict[str, set[str]]:
    """module file -> the project's modules it imports."""
    found = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            found[str(path.relative_to(ROOT))] = {
                m for m in imported_modules(path) if unit_of(m) not in (None, "cep_service")}
    return found


def upward_imports() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = {}
    for path, modules in project_imports().items():
        importer = unit_of(module_of(path))
        for module in modules:
            imported = unit_of(module)
            if imported != importer and LAYERS[imported] >= LAYERS[importer]:
                edges.setdefault((importer, imported), []).append(f"{path}: {module}")
    return edges


def test_every_package_has_a_layer():
    units = {unit_of(module_of(path)) for path in project_imports()}
    units.discard("cep_service")  # services/__init__.py, empty
    assert units - set(LAYERS) == set(), "give the new package a layer in LAYERS"


def test_packages_import_only_lower_layers():
    wrong = {edge: sites for edge, sites in upward_imports().items() if edge not in KNOWN_UPWARD}
    assert not wrong


def test_every_known_upward_import_is_still_there():
    assert set(KNOWN_UPWARD) <= set(upward_imports()), "remove what no longer happens"


def test_the_core_imports_no_accelerator_and_no_service():
    imports = {path: modules for path, modules in project_imports().items()
               if path.startswith("cep_core/")}
    assert imports
    assert not {path: sorted(m for m in modules if unit_of(m) != "cep_core")
                for path, modules in imports.items()
                if any(unit_of(m) != "cep_core" for m in modules)}


def test_nothing_imports_the_folders_names():
    """`services`, `accel` and `bench` are folders of the repository, not names the wheel
    installs: an import of one works only in a checkout (and loads a second copy)."""
    files = [p for top in (*PACKAGES, "tests", "docker")
             for p in sorted((ROOT / top).rglob("*.py"))]
    wrong = {str(p.relative_to(ROOT)): sorted(m for m in imported_modules(p)
                                               if m.split(".")[0] in OLD_NAMES)
             for p in files}
    assert not {path: modules for path, modules in wrong.items() if modules}
