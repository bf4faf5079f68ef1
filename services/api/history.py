"""The queries over time (GET /api/history): per live query, a point every `every_s` at
most of its composites/s, partial matches and state bytes, kept `keep_s` (the console's
small charts). A point is taken when the API works out the queries' states (each read of
GET /api/queries, the console's refresh), so the history covers the time someone looked;
nothing is loaded for it alone."""

from __future__ import annotations

import time
from collections import deque

SERIES = ("composites_per_s", "partial_matches", "state_bytes")


class History:
    def __init__(self, keep_s: float = 600, every_s: float = 1.0):
        self.keep_s, self.every_s = keep_s, every_s
        self.points: dict[str, deque] = {}  # query -> (t, *SERIES)

    def add(self, states: dict[str, dict], now: float | None = None) -> None:
        """A point per query of `states` (name -> state), unless one was taken less than
        `every_s` ago; queries no longer live are forgotten."""
        now = time.time() if now is None else now
        for name in set(self.points) - set(states):
            del self.points[name]
        for name, state in states.items():
            points = self.points.setdefault(name, deque())
            if points and now - points[-1][0] < self.every_s:
                continue
            points.append((round(now, 3), *(state.get(s) for s in SERIES)))
            while points and now - points[0][0] > self.keep_s:
                points.popleft()

    def since(self, t: float) -> dict[str, dict]:
        """Per query, its points after time `t` as columns: {"t": [...], series: [...]}."""
        out = {}
        for name, points in self.points.items():
            newer = [p for p in points if p[0] > t]
            out[name] = {"t": [p[0] for p in newer],
                         **{s: [p[1 + i] for p in newer] for i, s in enumerate(SERIES)}}
        return out
