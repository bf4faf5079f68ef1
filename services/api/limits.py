"""What bounds the API's work under load (docs/api.md, "Under load").

- `Limits`: requests in flight per kind (`read`, `check`, `change`, `tail`, `replay`); one
  more than a kind's limit is answered 429 with Retry-After at once, never queued. The
  counters (in flight, peak, refused) are what the tests read.
- `SingleFlight`: what a read needs from the broker (the control topic's live set, a
  stream's status view, the INTO topics' high-watermarks, the services' metrics) is loaded
  on a small fixed pool of threads, at most one load per key at a time, and kept: younger
  than `max_age_s` it is answered as it is; older, it is still answered (up to `stale_s`)
  while one load renews it in the background; older still, or never loaded, the request
  waits for the load. So the broker sees one read a key per `max_age_s` whatever the
  load, and a read waits for the broker only when nothing recent enough is kept.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable
from concurrent.futures import Executor
from enum import StrEnum
from typing import Any

from cep_core.errors import Category
from cep_service.api.errors import Refused

RETRY_AFTER_S = 1


class LimitKind(StrEnum):
    """What a request takes a slot of; the values name the limits (CEP_API_MAX_<KIND>S, the
    metrics' keys)."""

    READ = "read"
    CHECK = "check"
    CHANGE = "change"
    TAIL = "tail"
    REPLAY = "replay"


KINDS = tuple(LimitKind)


class Limits:
    """In-flight counters per kind, each bounded by `limits[kind]`. Used from the event
    loop and the checking threads (the counters' updates are single bytecode-level
    operations under the GIL, guarded where they test and set)."""

    def __init__(self, limits: dict[str, int] | dict[LimitKind, int]):
        self.limits = {LimitKind(kind): value for kind, value in limits.items()}
        self.in_flight: Counter[LimitKind] = Counter()
        self.peak: Counter[LimitKind] = Counter()
        self.refused: Counter[LimitKind] = Counter()
        self.admitted: Counter[LimitKind] = Counter()
        self._lock = threading.Lock()

    def enter(self, kind: LimitKind) -> None:
        """Take a slot of `kind`, or raise Refused 429."""
        with self._lock:
            limit = self.limits[kind]
            if self.in_flight[kind] >= limit:
                self.refused[kind] += 1
                raise Refused(Category.ADMISSION, {
                    "error": f"{limit} {kind} requests are in flight already: retry after "
                             f"{RETRY_AFTER_S} s"}, {"Retry-After": str(RETRY_AFTER_S)})
            self.in_flight[kind] += 1
            self.admitted[kind] += 1
            self.peak[kind] = max(self.peak[kind], self.in_flight[kind])

    def leave(self, kind: LimitKind) -> None:
        with self._lock:
            self.in_flight[kind] -= 1

    def stats(self) -> dict[str, dict[str, int]]:
        return {kind.value: {"limit": self.limits[kind], "in_flight": self.in_flight[kind],
                       "peak": self.peak[kind], "admitted": self.admitted[kind],
                       "refused": self.refused[kind]} for kind in self.limits}


class SingleFlight:
    """Values loaded on `executor`, one load per key at a time, kept `max_age_s`. Used
    from the event loop only."""

    def __init__(self, executor: Executor, max_age_s: float, stale_s: float = 30.0):
        self.executor, self.max_age_s = executor, max_age_s
        self.stale_s = max(stale_s, max_age_s)
        self._values: dict[Hashable, tuple[float, Any]] = {}  # key -> (loaded at, value)
        self._loading: dict[Hashable, asyncio.Future[Any]] = {}  # key -> the load in flight
        self.loads: Counter[Hashable] = Counter()  # loads started per key (tests, the benchmark)

    async def get(self, key: Hashable, load: Callable[[], Any],
                  max_age_s: float | None = None) -> Any:
        """The value of `key`: a kept one younger than `max_age_s` (default: the
        instance's); a kept one younger than `stale_s` while a load renews it; else the
        load's (`load()` on the executor, one per key at a time)."""
        max_age = self.max_age_s if max_age_s is None else max_age_s
        kept = self._values.get(key)
        age = math.inf if kept is None else time.monotonic() - kept[0]
        if kept is not None and age <= max_age:
            return kept[1]
        future = self._loading.get(key)
        if future is None:
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(self.executor, load)
            self._loading[key] = future
            self.loads[key] += 1
            future.add_done_callback(lambda done: self._loaded(key, done))
        if kept is not None and age <= self.stale_s and max_age_s is None:
            return kept[1]
        # a client that goes away cancels its wait, not the load the others wait on
        return await asyncio.shield(future)

    def _loaded(self, key: Hashable, future: asyncio.Future[Any]) -> None:
        self._loading.pop(key, None)
        if not future.cancelled() and future.exception() is None:
            self._values[key] = (time.monotonic(), future.result())

    def forget(self, key: Hashable | None = None) -> None:
        """Drop the kept value of `key` (every key: None); a load in flight stays."""
        if key is None:
            self._values.clear()
        else:
            self._values.pop(key, None)
