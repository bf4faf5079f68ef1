"""The repository's code folders and the names they install and import under (setup.py maps
them): the wheel owns its names, so no generic `services`, `accel` or `bench` lands in a
user's site-packages."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"cep_core": "cep_core", "services": "cep_service", "accel": "cep_accel",
            "bench": "cep_service.bench"}


def module_name(path: Path) -> str:
    """The name a file of the repository imports under (`services/cli/main.py` is
    `cep_service.cli.main`, a package's `__init__.py` the package)."""
    parts = list(path.resolve().relative_to(ROOT).with_suffix("").parts)
    parts[0] = PACKAGES.get(parts[0], parts[0])
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
