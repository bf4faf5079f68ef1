"""Where a query's engine runs: the placements a caller may ask for and the record of each
decision (`Placement`), shared by `cep_core.engine_factory` (the CPU) and
`accel.gpu.policy` (the GPU policy for "gpu" and "auto")."""

from __future__ import annotations

from dataclasses import dataclass

PLACEMENTS = ("cpu", "gpu", "auto")


@dataclass(frozen=True)
class Placement:
    """Where one query runs ("cpu" or "gpu") and why; `cost` is the GPU policy's estimate."""

    query: str
    target: str
    reason: str
    cost: float | None = None

    def line(self) -> str:
        cost = "" if self.cost is None else f" (cost {self.cost:,.0f})"
        return f"{self.query}: {self.target}{cost}: {self.reason}"


def check_placement(placement: str) -> None:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
