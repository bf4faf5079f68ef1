"""Hybrid placement as a library: the GPU policy (`cep_accel.gpu.policy`: `place`,
`estimated_cost`, `gpu_engine`) that `cep_core.engine_factory.create_engine` asks for
placement "gpu" or "auto", and `run`, `cep_core.stream_engines.run` with placement."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cep_accel.gpu.policy import (DEFAULT_COST_THRESHOLD, DEFAULT_MIN_KEYS, estimated_cost,
                                  gpu_engine, place)
from cep_core import stream_engines
from cep_core.checked import CheckedQuery
from cep_core.events import Event, Punctuation
from cep_core.placement import PLACEMENTS, Placement

__all__ = ["DEFAULT_COST_THRESHOLD", "DEFAULT_MIN_KEYS", "PLACEMENTS", "Placement",
           "estimated_cost", "gpu_engine", "place", "run"]


def run(queries: list[CheckedQuery], stream: Iterable[Event | Punctuation],
        placement: str = "auto", batch_size: int = 65536, flush: bool = True,
        rejected: list | None = None, report: list | None = None, failures: list | None = None,
        **options: Any) -> list[dict]:
    """`cep_core.stream_engines.run` with placement: composite events in deterministic order."""
    return stream_engines.run(queries, stream, batch_size, flush, rejected, failures,
                              placement=placement, report=report, **options)
