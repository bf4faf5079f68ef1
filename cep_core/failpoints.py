"""Fault injection for tests of containment: make one query's engine fail on purpose.

`CEP_FAILPOINTS` names where, as `QUERY:STAGE[@SEQ]` items separated by `;`. STAGE is
`compile`, `process`, `punctuate`, `flush`, `snapshot` or `restore`; `@SEQ` (process only)
fails the first batch that holds an event at or after that seq. For example
`CEP_FAILPOINTS="overheat:process@1200;activity:snapshot"`. Unset (the default), `hit`
costs one dict look-up. Every process that runs engines reads it when it first asks
(`StreamEngines`, so `cep run`, the Python API, the workers and the backfill alike).
"""

from __future__ import annotations

import functools
import os

STAGES = ("compile", "process", "punctuate", "flush", "snapshot", "restore")


class InjectedFault(RuntimeError):
    """A failure asked for by CEP_FAILPOINTS."""


@functools.cache
def _points() -> dict[tuple[str, str], int | None]:
    return parse(os.environ.get("CEP_FAILPOINTS", ""))


def parse(text: str) -> dict[tuple[str, str], int | None]:
    points: dict[tuple[str, str], int | None] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        query, _, rest = item.partition(":")
        stage, _, seq = rest.partition("@")
        if not query or stage not in STAGES:
            raise ValueError(f"CEP_FAILPOINTS item {item!r}: QUERY:STAGE[@SEQ] with STAGE one "
                             f"of {', '.join(STAGES)}")
        points[(query, stage)] = int(seq) if seq else None
    return points


def hit(query: str, stage: str, last_seq: int | None = None) -> None:
    """Raise InjectedFault where CEP_FAILPOINTS asks for one (`last_seq`: the batch's
    last event seq, for `process`)."""
    points = _points()
    if not points or (query, stage) not in points:
        return
    at = points[(query, stage)]
    if at is None or (last_seq is not None and last_seq >= at):
        raise InjectedFault(f"injected fault (CEP_FAILPOINTS) in {stage} of query {query!r}"
                            + (f" at seq {at}" if at is not None else ""))


def reset() -> None:
    """Read CEP_FAILPOINTS again (tests that change it)."""
    _points.cache_clear()
