"""Simple events as the reference interpreters and the offline runner see them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    """One simple event: its sequence number, event time and attributes (time included)."""

    seq: int
    ts: int
    attrs: dict[str, Any] = field(hash=False)

    def __getitem__(self, name: str) -> Any:
        return self.attrs[name]

    def to_json(self) -> dict[str, Any]:
        """The event as it appears inside a composite event: `seq` plus its attributes."""
        return {"seq": self.seq, **self.attrs}


@dataclass(frozen=True)
class Punctuation:
    """Event time has reached `ts`: windows and pending matches that end before it close."""

    ts: int
