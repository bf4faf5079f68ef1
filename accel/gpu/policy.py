"""Hybrid placement (Cugola & Margara's conclusion): complex rules with large windows on
the GPU, simple ones on CPU cores.

The GPU side of `cep_core.engine_factory.create_engine`, the one engine factory: for
placement "gpu" or "auto" it asks `place(checked, placement)` where one query runs and why,
and `gpu_engine` for the GPU engine when the answer is the GPU (`cep_accel.gpu.placement` is the
library's face: these and `run`).

- `cpu`: every query on the CPU engines.
- `gpu`: every query the GPU engine supports on the GPU (the CUDA simulator counts, so
  tests can force it), the rest on the CPU with the reason (WINDOW and MATCH_RECOGNIZE
  queries always: no GPU kernel runs them).
- `auto`: on a real GPU, SEQ queries whose estimated cost, window size (the plan's horizon,
  in time units) times columns (positive steps plus window aggregates), is at least
  `gpu_cost_threshold` (default 100,000), and MATCH queries when the caller expects at
  least `gpu_min_keys` partition keys (default 1,000,000; option `expected_keys`: one GPU
  thread per key, so few keys leave the GPU idle); the rest, and everything without a real
  GPU, on the CPU. The simulator is never chosen automatically.

Device memory: the GPU engine compares its columns with the device's free memory (or the
`device_memory_budget` option) and keeps them in host memory when they do not fit.
"""

from __future__ import annotations

# Deferred imports: the GPU kernels and engines (numba.cuda) load only when a query is
# checked for or placed on the GPU.

from typing import TYPE_CHECKING, Any

from cep_accel.gpu import device
from cep_accel.gpu.device import CudaTarget
from cep_core.ast import Policy, QueryKind
from cep_core.batch import StringDictionary
from cep_core.checked import CheckedQuery
from cep_core.engine.base import Engine
from cep_core.placement import Placement, Target, check_placement

if TYPE_CHECKING:
    from cep_core.compiler.seq_plan import SeqPlan

DEFAULT_COST_THRESHOLD = 100_000
# MATCH: keys (GPU threads) per batch worth a launch. On an H200 the CPU jit was faster at
# every key count measured, 10 to 205,237 (docs/gpu.md, "On a real GPU"): past those.
DEFAULT_MIN_KEYS = 1_000_000


def estimated_cost(checked: CheckedQuery) -> float | None:
    """Window size x columns for a SEQ query (inf without a window); None otherwise."""
    if checked.query.kind is not QueryKind.SEQ:
        return None
    from cep_core.compiler.seq_plan import SeqPlan
    return _cost(SeqPlan(checked))


def _cost(plan: SeqPlan) -> float:
    columns = len(plan.items) + len(plan.window_aggregates)
    return float("inf") if plan.horizon is None else float(plan.horizon * columns)


def place(checked: CheckedQuery, placement: str = "auto",
          gpu_cost_threshold: float | None = None,
          expected_keys: int | None = None,
          gpu_min_keys: int | None = None) -> Placement:
    """Where the query runs and why (None: the default threshold and key count)."""
    placement = check_placement(placement)
    if gpu_cost_threshold is None:
        gpu_cost_threshold = DEFAULT_COST_THRESHOLD
    if gpu_min_keys is None:
        gpu_min_keys = DEFAULT_MIN_KEYS
    name = checked.name
    if placement is Target.CPU:
        return Placement(name, Target.CPU, "placement cpu")
    kind = checked.query.kind
    if kind is QueryKind.MATCH:
        return _place_match(checked, placement, expected_keys, gpu_min_keys)
    if kind is QueryKind.RECOGNIZE:
        return Placement(name, Target.CPU, "MATCH_RECOGNIZE queries run on the CPU (no GPU kernel "
                                      "for Flink's automaton)")
    if kind is not QueryKind.SEQ:
        return Placement(name, Target.CPU, f"{kind.upper()} queries run on the CPU engines "
                                      "(no GPU kernel for them yet)")
    from cep_accel.gpu.seq_support import unsupported_reason
    from cep_core.compiler.seq_plan import SeqPlan
    plan = SeqPlan(checked)
    reason = unsupported_reason(plan)
    cost = _cost(plan)
    if reason is not None:
        return Placement(name, Target.CPU, reason, cost)
    target = device.target()
    if target is CudaTarget.NONE:
        return Placement(name, Target.CPU, "no CUDA device (and the CUDA simulator is off)", cost)
    if placement is Target.GPU:
        return Placement(name, Target.GPU, f"placement gpu ({device.name()})", cost)
    if target is not CudaTarget.DEVICE:
        return Placement(name, Target.CPU, "auto: no real GPU (the simulator is for tests: "
                                      "--placement gpu forces it)", cost)
    if any(item.step.policy in (None, Policy.EACH) for item in plan.items[:-1]):
        return Placement(name, Target.CPU, "auto: an EACH step (every match is built on the host: "
                                      "the CPU engines were 3-12x faster on an H200)", cost)
    if cost < gpu_cost_threshold:
        return Placement(name, Target.CPU, f"auto: cost below {gpu_cost_threshold:,.0f}", cost)
    return Placement(name, Target.GPU, f"auto: cost at least {gpu_cost_threshold:,.0f} "
                                  f"({device.name()})", cost)


def _place_match(checked: CheckedQuery, placement: str, expected_keys: int | None,
                 gpu_min_keys: int) -> Placement:
    """MATCH: the batched per-key kernel (`cep_accel.gpu.match_engine`) where it applies."""
    from cep_accel.gpu.match_kernels import unsupported_reason
    name = checked.name
    reason = unsupported_reason(checked)
    if reason is not None:
        return Placement(name, Target.CPU, f"MATCH: {reason}")
    target = device.target()
    if target is CudaTarget.NONE:
        return Placement(name, Target.CPU, "MATCH: no CUDA device (and the CUDA simulator is off)")
    if placement is Target.GPU:
        return Placement(name, Target.GPU, f"placement gpu, MATCH per-key kernel ({device.name()})")
    if target is not CudaTarget.DEVICE:
        return Placement(name, Target.CPU, "MATCH: auto: no real GPU (the simulator is for tests: "
                                      "--placement gpu forces it)")
    if expected_keys is None:
        return Placement(name, Target.CPU, "MATCH: auto: key count unknown (the option "
                                      "expected_keys places it on the GPU from "
                                      f"{gpu_min_keys:,} keys)")
    if expected_keys < gpu_min_keys:
        return Placement(name, Target.CPU, f"MATCH: auto: {expected_keys:,} expected keys, below "
                                      f"{gpu_min_keys:,} (one GPU thread per key)")
    return Placement(name, Target.GPU, f"MATCH: auto: {expected_keys:,} expected keys, at least "
                                  f"{gpu_min_keys:,} ({device.name()})")


def gpu_engine(checked: CheckedQuery, strings: StringDictionary, **options: Any) -> Engine:
    """The GPU engine for a query `place` put on the GPU."""
    if checked.query.kind is QueryKind.MATCH:
        from cep_accel.gpu.match_engine import GpuMatchEngine
        return GpuMatchEngine(checked, strings, **options)
    from cep_accel.gpu.seq_engine import GpuSeqEngine
    return GpuSeqEngine(checked, strings, **options)

