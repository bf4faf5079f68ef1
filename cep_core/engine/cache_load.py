"""Loading kernels from numba's on-disk cache without first readying its whole compiler.

numba's `Cache.load_overload` refreshes the CPU target context before loading: it imports
every typing and lowering registry (arrays, linalg, random, typed containers, ...), about
0.1 s of CPU, a large part of a short `cep run`. Loading machine code from the cache needs
none of it, only the symbols that code links against: numba's C helpers (set up with the
context), the NRT runtime and the string hash secret. `install()` makes CPU cache loads
ready just those, and rebuilds the environments of cached numba library functions
(`np.empty`'s implementation, `min`, ...) without importing the numba modules that define
them (numba.np.arrayobj imports numba.cpython.charseq: ~0.03 s); compiled code reads an
environment's globals only in object mode, which these never are. Compiling (a cache
miss, a new signature) still refreshes the context itself (numba's `CompilerBase`), so
what is compiled and what runs are unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from numba.core.base import BaseContext
    from numba.core.typing.templates import Signature

# Deferred imports: numba's caching, CPU target and runtime modules load when `install()` first runs
# (a jit run), so importing the stream engines does not pay for them.

_installed = False


def install() -> None:
    """Use the light cache load from now on in this process (idempotent). Leaves numba as
    it is where its cache class no longer has the methods this relies on."""
    global _installed
    if _installed:
        return
    from numba.core import caching
    from numba.core.cpu import CPUContext

    cache = caching.Cache
    original = cache.load_overload
    if not all(hasattr(cache, name) for name in
               ("_load_overload", "_guard_against_spurious_io_errors")):
        _installed = True
        return

    # numba's caching and environment internals are unannotated: their calls are ignored.
    def load_overload(self: caching.Cache, sig: Signature, target_context: BaseContext
                      ) -> object:
        if not isinstance(target_context, CPUContext):
            return original(self, sig, target_context)  # type: ignore[no-untyped-call]
        _ready_symbols(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)  # type: ignore[no-untyped-call]
        return None  # the guard swallowed an I/O error: numba compiles instead

    load_overload.__doc__ = original.__doc__
    cache.load_overload = load_overload  # type: ignore[method-assign]  # patching numba's class
    _install_light_environments()
    _installed = True


def ready() -> None:
    """`install()`, and now rather than at a kernel's first call, so a caller can do it
    while another thread reads the events: the symbols cached code links against (~0.02 s
    of CPU: numba compiles its NRT helpers), numba's extension entry points (its first
    compile or cache load scans every installed distribution's metadata for them: ~0.02 s)
    and `numpy.ma` (numba's typing of an array argument asks whether it is a masked array,
    which imports `numpy.ma`: ~0.02 s)."""
    import numpy.ma  # noqa: F401
    from numba.core import entrypoints
    from numba.core.registry import cpu_target

    install()
    _ready_symbols(cpu_target.target_context)
    entrypoints.init_all()  # type: ignore[no-untyped-call]


def _ready_symbols(target_context: BaseContext) -> None:
    """What `refresh` sets up that cached machine code links against (every other symbol
    numba's code calls is added when the context is made)."""
    from numba.core.runtime import rtsys

    rtsys.initialize(target_context)  # NRT_* (idempotent)
    import numba.cpython.hashing  # noqa: F401  (adds _numba_hashsecret_* on import)


def _install_light_environments() -> None:
    """Cached code's pickled environments name the module whose globals they hold and
    unpickle through `environment._rebuild_env`, which imports it: for a numba module not
    imported yet, a stand-in dict with its `__name__` (enough to pickle it again)."""
    import sys

    from numba.core import environment

    rebuild = environment._rebuild_env

    def rebuild_env(modname: str, consts: list[object], env_name: str) -> object:
        if (environment.lookup_environment(env_name) is not None  # type: ignore[no-untyped-call]
                or modname in sys.modules or not modname.startswith("numba.")):
            return rebuild(modname, consts, env_name)  # type: ignore[no-untyped-call]
        env = environment.Environment({"__name__": modname})
        env.consts[:] = consts
        env.env_name = env_name
        environment.Environment._memo[env_name] = env
        return env

    environment._rebuild_env = rebuild_env
