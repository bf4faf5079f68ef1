"""Compiled SEQ queries: `compile_cdp(checked)` and `compile_aip(checked)` give a
`SeqProgram` (the query's plan and its loaded kernel), built once per checked query and
shared by its engines (`cep_core.engine.seq.SeqEngine`, `cep_core.engine.seq_aip`). A
kernel is shared by every query whose generated source is the same."""

from __future__ import annotations

from dataclasses import dataclass

from cep_core.checked import CheckedQuery
from cep_core.compiler.programs import once_per_query
from cep_core.compiler.seq_aip import AipGenerator, AipKernel, AipUnsupported
from cep_core.compiler.seq_cdp import CdpKernel
from cep_core.compiler.seq_plan import SeqPlan

__all__ = ["AipUnsupported", "CdpUnsupported", "SeqProgram", "compile_aip", "compile_cdp"]


class CdpUnsupported(ValueError):
    """The query needs runs (skip-till-next-match, strict contiguity): not a CDP query."""


@dataclass(frozen=True, eq=False)
class SeqProgram:
    checked: CheckedQuery
    plan: SeqPlan
    kernel: CdpKernel | AipKernel


_cdp_kernels: dict[str, CdpKernel] = {}
_aip_kernels: dict[str, AipKernel] = {}


@once_per_query
def compile_cdp(checked: CheckedQuery) -> SeqProgram:
    plan = SeqPlan(checked)
    if plan.uses_runs:
        raise CdpUnsupported(f"USING {plan.strategy.value} (runs)")
    kernel = CdpKernel(plan)
    return SeqProgram(checked, plan, _cdp_kernels.setdefault(kernel.source, kernel))


@once_per_query
def compile_aip(checked: CheckedQuery) -> SeqProgram:
    """Raises AipUnsupported for what the AIP kernel does not evaluate."""
    plan = SeqPlan(checked)
    source = AipGenerator(plan).source()
    kernel = _aip_kernels.get(source)
    if kernel is None:
        kernel = _aip_kernels[source] = AipKernel(plan)
    return SeqProgram(checked, plan, kernel)
