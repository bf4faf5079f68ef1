"""The wheel's packages under the project's own names: `services/` installs as `cep_service`,
`accel/` as `cep_accel`, `bench/` as `cep_service.bench` (the benchmarks are `cep bench`
commands, not a package of their own). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

FOLDERS = {"cep_core": "cep_core", "cep_service": "services", "cep_accel": "accel",
           "cep_service.bench": "bench"}


def packages(name: str, folder: str) -> list[str]:
    return [name] + [f"{name}.{sub}" for sub in find_packages(folder)]


setup(packages=[p for name, folder in FOLDERS.items() for p in packages(name, folder)],
      package_dir=FOLDERS)
