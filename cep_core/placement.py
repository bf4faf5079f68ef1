"""Where a query's engine runs: the placements a caller may ask for, the record of each
decision (`Placement`), and the policy that decides "gpu" and "auto".

The core does not import the accelerators: a package offers a placement policy under the
entry point group `cep_service.placement_policies` (this project's `gpu`: `cep_accel.gpu.policy`,
see pyproject.toml), a module with `place(checked, placement, cost_threshold, ...)` and
`gpu_engine(checked, strings, **options)`, and `placement_policy()` loads it on first use."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib.metadata import entry_points
from types import ModuleType

from cep_core.choices import one_of



class Target(StrEnum):
    """Where a caller asks queries to run (cpu, gpu, or auto: the policy decides), and
    where one runs (cpu or gpu)."""

    CPU = "cpu"
    GPU = "gpu"
    AUTO = "auto"


PLACEMENTS = tuple(Target)


class Algorithm(StrEnum):
    """How a SEQ query is evaluated: `auto` lets the planner pick (create_engine), `cdp`
    and `aip` force column-based delayed processing or incremental automata."""

    AUTO = "auto"
    CDP = "cdp"
    AIP = "aip"

    @classmethod
    def of(cls, name: str) -> Algorithm:
        """The algorithm of a name; ValueError names the algorithms."""
        return one_of(cls, name, "SEQ algorithm")


@dataclass(frozen=True)
class Placement:
    """Where one query runs (cpu or gpu) and why; `cost` is the GPU policy's estimate."""

    query: str
    target: Target  # (given as text, made a Target)
    reason: str
    cost: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", Target(self.target))

    def line(self) -> str:
        cost = "" if self.cost is None else f" (cost {self.cost:,.0f})"
        return f"{self.query}: {self.target}{cost}: {self.reason}"


def check_placement(placement: str) -> Target:
    """The Target a placement names; ValueError names the placements."""
    return one_of(Target, placement, "placement")


POLICY_GROUP = "cep_service.placement_policies"


class PlacementUnavailable(RuntimeError):
    """No installed package offers the policy for placements other than "cpu"."""


@cache
def placement_policy(name: str = "gpu") -> ModuleType:
    """The policy module registered as `name` in POLICY_GROUP (loaded once)."""
    found = entry_points(group=POLICY_GROUP, name=name)
    if not found:
        raise PlacementUnavailable(
            f"no placement policy {name!r} is installed (entry point group {POLICY_GROUP}); "
            "reinstall cep-service (pip install -e . in a checkout) or use placement cpu")
    policy: ModuleType = next(iter(found)).load()
    return policy
