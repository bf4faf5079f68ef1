"""Hybrid placement (Cugola & Margara's conclusion): complex rules with large windows on
the GPU, simple ones on CPU cores.

`place(checked, placement)` decides where one query runs and says why;
`create_placed_engine(checked, strings, placement=..., **options)` builds that engine (the
GPU engine, or `cep_core.engine_factory.create_engine`'s CPU engine); `run(...)` is
`cep_core.stream_engines.run` with placement and a report of where each query went.

- `cpu`: every query on the CPU engines.
- `gpu`: every query the GPU engine supports on the GPU (the CUDA simulator counts, so
  tests can force it), the rest on the CPU with the reason.
- `auto`: on a real GPU, SEQ queries whose estimated cost, window size (the plan's horizon,
  in time units) times columns (positive steps plus window aggregates), is at least
  `gpu_cost_threshold` (default 100,000), and MATCH queries when the caller expects at
  least `gpu_min_keys` partition keys (default 10,000; option `expected_keys`: one GPU
  thread per key, so few keys leave the GPU idle); the rest, and everything without a real
  GPU, on the CPU. The simulator is never chosen automatically.

Device memory: the GPU engine compares its columns with the device's free memory (or the
`device_memory_budget` option) and keeps them in host memory when they do not fit.
"""

from __future__ import annotations

# Deferred imports: the GPU kernels and engines (numba.cuda) load only when a query is placed on or
# checked for the GPU; a CPU placement never imports them.

from collections.abc import Iterable
from dataclasses import dataclass

from accel.gpu import device
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import CheckedQuery
from cep_core.compiler.seq_plan import SeqPlan
from cep_core.engine.base import Engine
from cep_core.engine_factory import create_engine
from cep_core.events import Event, Punctuation
from cep_core.stream_engines import StreamEngines, run_engines

PLACEMENTS = ("cpu", "gpu", "auto")
DEFAULT_COST_THRESHOLD = 100_000
DEFAULT_MIN_KEYS = 10_000  # MATCH: keys (GPU threads) per batch worth a launch; a guess


@dataclass(frozen=True)
class Placement:
    query: str
    target: str  # "gpu" or "cpu"
    reason: str
    cost: float | None = None

    def line(self) -> str:
        cost = "" if self.cost is None else f" (cost {self.cost:,.0f})"
        return f"{self.query}: {self.target}{cost}: {self.reason}"


def estimated_cost(checked: CheckedQuery) -> float | None:
    """Window size x columns for a SEQ query (inf without a window); None otherwise."""
    if checked.query.kind != "seq":
        return None
    plan = SeqPlan(checked)
    columns = len(plan.items) + len(plan.window_aggregates)
    return float("inf") if plan.horizon is None else float(plan.horizon * columns)


def place(checked: CheckedQuery, placement: str = "auto",
          gpu_cost_threshold: float = DEFAULT_COST_THRESHOLD,
          expected_keys: int | None = None,
          gpu_min_keys: int = DEFAULT_MIN_KEYS) -> Placement:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement is one of {', '.join(PLACEMENTS)}, not {placement!r}")
    name = checked.name
    if placement == "cpu":
        return Placement(name, "cpu", "placement cpu")
    kind = checked.query.kind
    if kind == "match":
        return _place_match(checked, placement, expected_keys, gpu_min_keys)
    if kind != "seq":
        return Placement(name, "cpu", f"{kind.upper()} queries run on the CPU engines "
                                      "(no GPU kernel for them yet)")
    from accel.gpu.seq_support import unsupported_reason
    reason = unsupported_reason(SeqPlan(checked))
    cost = estimated_cost(checked)
    if reason is not None:
        return Placement(name, "cpu", reason, cost)
    target = device.target()
    if target == "none":
        return Placement(name, "cpu", "no CUDA device (and the CUDA simulator is off)", cost)
    if placement == "gpu":
        return Placement(name, "gpu", f"placement gpu ({device.name()})", cost)
    if target != "device":
        return Placement(name, "cpu", "auto: no real GPU (the simulator is for tests: "
                                      "--placement gpu forces it)", cost)
    if cost < gpu_cost_threshold:
        return Placement(name, "cpu", f"auto: cost below {gpu_cost_threshold:,.0f}", cost)
    return Placement(name, "gpu", f"auto: cost at least {gpu_cost_threshold:,.0f} "
                                  f"({device.name()})", cost)


def _place_match(checked: CheckedQuery, placement: str, expected_keys: int | None,
                 gpu_min_keys: int) -> Placement:
    """MATCH: the batched per-key kernel (`accel.gpu.match_engine`) where it applies."""
    from accel.gpu.match_kernels import unsupported_reason
    name = checked.name
    reason = unsupported_reason(checked)
    if reason is not None:
        return Placement(name, "cpu", f"MATCH: {reason}")
    target = device.target()
    if target == "none":
        return Placement(name, "cpu", "MATCH: no CUDA device (and the CUDA simulator is off)")
    if placement == "gpu":
        return Placement(name, "gpu", f"placement gpu, MATCH per-key kernel ({device.name()})")
    if target != "device":
        return Placement(name, "cpu", "MATCH: auto: no real GPU (the simulator is for tests: "
                                      "--placement gpu forces it)")
    if expected_keys is None:
        return Placement(name, "cpu", "MATCH: auto: key count unknown (the option "
                                      "expected_keys places it on the GPU from "
                                      f"{gpu_min_keys:,} keys)")
    if expected_keys < gpu_min_keys:
        return Placement(name, "cpu", f"MATCH: auto: {expected_keys:,} expected keys, below "
                                      f"{gpu_min_keys:,} (one GPU thread per key)")
    return Placement(name, "gpu", f"MATCH: auto: {expected_keys:,} expected keys, at least "
                                  f"{gpu_min_keys:,} ({device.name()})")


def create_placed_engine(checked: CheckedQuery, strings: StringDictionary,
                         placement: str = "auto",
                         gpu_cost_threshold: float = DEFAULT_COST_THRESHOLD,
                         report: list | None = None, **options) -> Engine:
    """The engine `place` chooses; its Placement is appended to `report` and kept as the
    engine's `placement` attribute."""
    where = place(checked, placement, gpu_cost_threshold,
                  expected_keys=options.get("expected_keys"),
                  gpu_min_keys=options.get("gpu_min_keys", DEFAULT_MIN_KEYS))
    if where.target == "gpu" and checked.query.kind == "match":
        from accel.gpu.match_engine import GpuMatchEngine
        engine = GpuMatchEngine(checked, strings, **options)
    elif where.target == "gpu":
        from accel.gpu.seq_engine import GpuSeqEngine
        engine = GpuSeqEngine(checked, strings, **options)
    else:
        engine = create_engine(checked, strings, **options)
    engine.placement = where
    if report is not None:
        report.append(where)
    return engine


def placed_engines(queries: list[CheckedQuery], strings: StringDictionary,
                   placement: str = "auto", report: list | None = None,
                   **options) -> StreamEngines:
    """`StreamEngines` whose MATCH and SEQ engines are placed (WINDOW queries keep their
    shared CPU query set)."""
    windows = [q for q in queries if q.query.kind == "window"]
    engines = StreamEngines(windows, strings, **options)
    engines.queries = {q.name: q for q in queries}
    engines.engines = [create_placed_engine(q, strings, placement, report=report, **options)
                       for q in queries if q.query.kind != "window"]
    if report is not None:
        report.extend(Placement(q.name, "cpu", "WINDOW queries run on the CPU (shared panes)")
                      for q in windows)
    return engines


def run(queries: list[CheckedQuery], stream: Iterable[Event | Punctuation],
        placement: str = "auto", batch_size: int = 65536, flush: bool = True,
        rejected: list | None = None, report: list | None = None, **options) -> list[dict]:
    """`cep_core.stream_engines.run` with placement: composite events in deterministic order."""
    if not queries:
        return []
    strings = StringDictionary()
    return run_engines(placed_engines(queries, strings, placement, report, **options),
                       BatchEncoder(queries[0].schema, strings), stream, batch_size, flush,
                       rejected).to_dicts()
