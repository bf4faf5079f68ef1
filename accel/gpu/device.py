"""Which CUDA target numba gives this process: a real device, the CUDA simulator, or none.

`numba.cuda` picks the simulator when it is first imported with `NUMBA_ENABLE_CUDASIM=1`;
nothing here imports it before it is needed, so `use_simulator_if_no_gpu()` can still turn
the simulator on for a process without a GPU (as `cep gpu verify` does).
"""

from __future__ import annotations

# Deferred imports: numba and numba.cuda (its driver probe) load when a GPU is first asked for,
# so the GPU commands and CPU placements that import this module do not pay for them.

import ctypes.util
import os
import sys
from enum import StrEnum
from typing import Any


class CudaTarget(StrEnum):
    """What numba.cuda runs kernels on here."""

    DEVICE = "device"  # a real GPU
    SIMULATOR = "simulator"  # numba's CUDA simulator (tests)
    NONE = "none"  # neither


def cuda() -> Any:
    from numba import cuda as module
    return module


def simulated() -> bool:
    from numba.core import config
    # numba.core.config sets its options with globals()[name] = value: mypy does not see them
    return bool(config.ENABLE_CUDASIM)  # type: ignore[attr-defined]


def usable() -> bool:
    """Kernels can run: a real device, or the simulator."""
    try:
        return bool(cuda().is_available())
    except Exception:  # a broken driver reads as no device
        return False


def real_gpu() -> bool:
    return usable() and not simulated()


def target() -> CudaTarget:
    if not usable():
        return CudaTarget.NONE
    return CudaTarget.SIMULATOR if simulated() else CudaTarget.DEVICE


def name() -> str:
    if target() is CudaTarget.DEVICE:
        device = cuda().get_current_device()
        label = device.name
        return label.decode() if isinstance(label, bytes) else str(label)
    return "CUDA simulator (numba, no GPU)" if target() is CudaTarget.SIMULATOR else "no GPU"


def free_memory() -> int | None:
    """Free device memory in bytes; None where it is not a constraint (the simulator)."""
    if target() is not CudaTarget.DEVICE:
        return None
    return int(cuda().current_context().get_memory_info().free)


def use_simulator_if_no_gpu() -> CudaTarget:
    """Turn numba's CUDA simulator on when no CUDA driver is installed and numba.cuda is
    not imported yet; returns target()."""
    if "numba.cuda" not in sys.modules and "NUMBA_ENABLE_CUDASIM" not in os.environ \
            and ctypes.util.find_library("cuda") is None:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        from numba.core import config
        config.reload_config()
    return target()
