"""The wheel's packages under the project's own names: `services/` installs as `cep_service`,
`accel/` as `cep_accel`, `bench/` as `cep_service.bench` (the benchmarks are `cep bench`
commands, not a package of their own). Everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

FOLDERS = {"cep_core": "cep_core", "cep_service": "services", "cep_accel": "accel",
           "cep_service.bench": "bench"}


def packages(name: str, folder: str) -> list[str]:
    """The folder's packages, data folders too (the console's files, the schemas), as
    setuptools wants every folder of package data listed."""
    found = find_namespace_packages(folder, exclude=["__pycache__", "*.__pycache__"])
    return [name] + [f"{name}.{sub}" for sub in found]


setup(packages=[p for name, folder in FOLDERS.items() for p in packages(name, folder)],
      package_dir=FOLDERS)
