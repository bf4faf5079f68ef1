"""Where the product writes on the user's machine: one root for caches and state.

`CEP_HOME`, when set, holds everything (`$CEP_HOME/cache`, `$CEP_HOME/state`). Otherwise
the XDG folders: `$XDG_CACHE_HOME/cep` (default `~/.cache/cep`) for what can be rebuilt
(compiled kernels, the parser) and `$XDG_STATE_HOME/cep` (default `~/.local/state/cep`) for
what a running service keeps (Faust's data folder, demo logs). Every folder is created
with its parents on first use; one that cannot be created is a `HomeError` naming it.
"""

from __future__ import annotations

import os
from pathlib import Path


class HomeError(OSError):
    """A folder of the product's could not be created (the message says which and why)."""


def _root(kind: str, xdg_variable: str, default: str) -> Path:
    home = os.environ.get("CEP_HOME")
    if home:
        return Path(home).expanduser() / kind
    base = os.environ.get(xdg_variable)
    return (Path(base) if base else Path.home() / default) / "cep"


def _made(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HomeError(f"cannot create {path}: {e.strerror or e}; set CEP_HOME to a "
                        f"writable folder") from None
    return path


def cache_dir(*parts: str) -> Path:
    """A folder under the cache root (created)."""
    return _made(_root("cache", "XDG_CACHE_HOME", ".cache").joinpath(*parts))


def state_dir(*parts: str) -> Path:
    """A folder under the state root (created)."""
    return _made(_root("state", "XDG_STATE_HOME", ".local/state").joinpath(*parts))


def kernel_cache_dir() -> Path:
    """Generated kernel modules and numba's cache of them: `$CEP_KERNEL_CACHE`, else
    `cache_dir("kernels")`."""
    named = os.environ.get("CEP_KERNEL_CACHE")
    return _made(Path(named).expanduser()) if named else cache_dir("kernels")
