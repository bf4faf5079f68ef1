"""Loading kernels from numba's on-disk cache without first readying its whole compiler.

numba's `Cache.load_overload` refreshes the CPU target context before loading: it imports
every typing and lowering registry (arrays, linalg, random, typed containers, ...), about
0.1 s of CPU, a large part of a short `cep run`. Loading machine code from the cache needs
none of it, only the symbols that code links against: numba's C helpers (set up with the
context), the NRT runtime and the string hash secret. `install()` makes CPU cache loads
ready just those; compiling (a cache miss, a new signature) still refreshes the context
itself (numba's `CompilerBase`), so what is compiled and what runs are unchanged.
"""

from __future__ import annotations

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

    def load_overload(self, sig, target_context):
        if not isinstance(target_context, CPUContext):
            return original(self, sig, target_context)
        _ready_symbols(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)
        return None  # the guard swallowed an I/O error: numba compiles instead

    load_overload.__doc__ = original.__doc__
    cache.load_overload = load_overload
    _installed = True


def _ready_symbols(target_context) -> None:
    """What `refresh` sets up that cached machine code links against (every other symbol
    numba's code calls is added when the context is made)."""
    from numba.core.runtime import rtsys

    rtsys.initialize(target_context)  # NRT_* (idempotent)
    import numba.cpython.hashing  # noqa: F401  (adds _numba_hashsecret_* on import)
