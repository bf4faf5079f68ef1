"""Composite events: how they are keyed and put in deterministic order.

A composite event is a JSON object: {"query", "key", "seq", "start_seq", ...}. SEQ adds
"events" (variable -> bound event, a list for Kleene variables); WINDOW adds "window_start"
and "window_end"; EMIT and SELECT items add their fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from cep_core.ast import Attr
from cep_core.events import Event


def partition_key(attrs: Sequence[Attr], event: Event) -> Any:
    """The value of PARTITION BY / GROUP BY for an event: None, one value, or a list."""
    if not attrs:
        return None
    if len(attrs) == 1:
        return event.attrs[attrs[0].name]
    return [event.attrs[a.name] for a in attrs]


def constituent_seqs(composite: dict[str, Any]) -> list[int]:
    """The seqs of the simple events a composite event is made of, in pattern order
    (SEQ: the bound events; others: the first event's seq)."""
    events = composite.get("events")
    if events is None:
        return [composite["start_seq"]]
    seqs: list[int] = []
    for bound in events.values():
        if isinstance(bound, list):
            seqs.extend(e["seq"] for e in bound)
        else:
            seqs.append(bound["seq"])
    return seqs


def sort_key(composite: dict[str, Any], query_index: int) -> tuple[int, int, list[int], int, bytes]:
    """Deterministic output order: seq of the last event, the query's place in its file,
    the constituent events' seqs, then window end and key for windows."""
    return (composite["seq"], query_index, constituent_seqs(composite),
            composite.get("window_end", 0), orjson.dumps(composite.get("key")))
