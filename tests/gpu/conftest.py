"""The GPU tests run the kernels on numba's CUDA simulator, in this pytest process.

`numba.cuda` chooses the simulator when it is *first imported* with NUMBA_ENABLE_CUDASIM=1
(numba reads its config at `import numba`, so the config is reloaded too). No other test
module imports `numba.cuda` (the CPU engines use `numba.njit` only, and `cep_accel.gpu` imports
`numba.cuda` lazily), and this folder sorts before `tests/test_*.py`, so this conftest runs
first in `make test` as well as alone. With CEP_GPU_DEVICE=1 the tests run on a real GPU
instead (at full size). If `numba.cuda` was imported already and is not the target asked
for, collection fails loudly rather than testing the wrong thing.
"""

from __future__ import annotations

import os
import sys

REAL = os.environ.get("CEP_GPU_DEVICE") == "1"

if not REAL and "numba.cuda" not in sys.modules:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    from numba.core import config

    config.reload_config()

from cep_accel.gpu import device  # noqa: E402

TARGET = device.target()
if TARGET is not (device.CudaTarget.DEVICE if REAL else device.CudaTarget.SIMULATOR):
    raise RuntimeError(f"GPU tests need the {'real GPU' if REAL else 'CUDA simulator'}, "
                       f"numba.cuda gives {TARGET!r} (imported before tests/gpu/conftest.py?)")

# Stream sizes: tiny under the simulator (it runs every GPU thread in Python).
SCALE = 20 if REAL else 1
