"""Optional features and the extra that installs each (pyproject's optional-dependencies):
a command whose extra is missing stops with the pip command that adds it."""

from __future__ import annotations

import importlib
from types import ModuleType

from cep_service.errors import MissingExtra


def require(module: str, extra: str, feature: str) -> ModuleType:
    """The imported module, or MissingExtra naming `pip install 'cep-service[extra]'`."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(f"{feature} needs {module}, which is not installed: "
                           f"pip install 'cep-service[{extra}]'") from None
